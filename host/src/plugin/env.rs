//! The env plugin: one per process, through which every parameter the library reads is
//! resolved ([`crate::params::resolve`] asks [`get`]), as NCCL's env plugins
//! (`NCCL_ENV_PLUGIN`, NCCL 2.28+).
//!
//! * Found as the other kinds are ([`super::discovery`]): `NCCL_ENV_PLUGIN` unset tries
//!   `librustccl-env.so` then `libnccl-env.so`; `none` disables; a path or a library file name
//!   is tried as given, a bare name also as `librustccl-env-<name>.so` and
//!   `libnccl-env-<name>.so`. `NCCL_ENV_PLUGIN` is read from the process environment, never
//!   through a plugin (it names the plugin).
//! * A library may export rustccl's table (`rustccl_env_v1`) or NCCL's C tables
//!   (`ncclEnvPlugin_v2`, `_v1`, adapted by [`super::c_env`]); rustccl's is tried first, then
//!   NCCL's newest first.
//! * Loaded once per process, by the first parameter lookup, before any parameter is read —
//!   the log level included: the lookup of `NCCL_DEBUG` is normally the first. So what the
//!   loader and the plugin's `init` log is kept ([`crate::log::capture`]) and logged once the
//!   level is known. One INFO line says which plugin is used (name, ABI and version, path,
//!   why) or that none is; a plugin the user named that cannot be used is a warning, and the
//!   process environment is used instead (as when `init` fails).
//! * [`get`] asks the plugin for each lookup (the plugin decides; `None` is "unset"). An error
//!   from the plugin is a warning (once per name) and the variable counts as unset.
//! * The plugin's `finalize` runs once at process exit (an `atexit` hook, as NCCL registers
//!   one); lookups after it read the process environment.
//!
//! This module, and what it uses (`discovery`, `library`, `elf_check`, `c_abi`), read no
//! parameter through [`crate::params`]: the loader runs inside the first lookup. A lookup
//! that the loading thread makes anyway gets [`Answer::NoPlugin`].

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::std_types::RStr;
use rustccl_plugin_api::env::{Env, EnvV1, EnvV1Client, LibraryVersion};
use rustccl_plugin_api::export::{self, PluginKind};

use super::c_env::CEnv;
use super::library::PluginLibrary;
use super::{Plugin, Skipped};

/// rustccl env ABI versions this host understands, newest first (NCCL's C ones:
/// [`super::c_env::C_ENV_ABI_VERSIONS`]).
pub const ENV_ABI_VERSIONS: &[u32] = &[1];

pub type EnvPlugin = Plugin<dyn Env>;

/// Which family of tables an env plugin was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvAbi {
    /// `rustccl_env_vN`.
    Rustccl,
    /// NCCL's `ncclEnvPlugin_vN`.
    NcclC,
}

impl EnvAbi {
    pub fn label(self) -> &'static str {
        match self {
            EnvAbi::Rustccl => "rustccl env ABI",
            EnvAbi::NcclC => "NCCL C env ABI",
        }
    }
}

/// An env plugin found in a library, and the family of its table.
pub struct LoadedEnv {
    pub plugin: EnvPlugin,
    pub abi: EnvAbi,
}

/// Finds the env table a library exports: rustccl's, else NCCL's C tables (v2, then v1).
pub fn from_library(lib: &Arc<PluginLibrary>) -> Result<LoadedEnv, String> {
    if let Some(t) = export::find::<EnvV1>(&lib.lib, PluginKind::Env, 1)? {
        let api: Arc<dyn Env> = Arc::new(EnvV1Client { table: t });
        let plugin = Plugin::loaded(api, t.name.as_str(), 1, lib);
        return Ok(LoadedEnv { plugin, abi: EnvAbi::Rustccl });
    }
    match CEnv::from_library(lib) {
        Ok(Some(e)) => {
            let (name, version) = (e.name.clone(), e.version);
            Ok(LoadedEnv { plugin: Plugin::loaded(Arc::new(e), &name, version, lib), abi: EnvAbi::NcclC })
        }
        Ok(None) => Err("it exports no env plugin (rustccl_env_v1, ncclEnvPlugin_v2, ncclEnvPlugin_v1)".into()),
        Err(why) => Err(format!("its NCCL C env tables are unusable: {why}")),
    }
}

/// The version an env plugin's `init` is told: the one `ncclGetVersion` reports.
pub fn library_version() -> LibraryVersion {
    let code = crate::version::NCCL_VERSION_CODE;
    let part = |v: i32| v.clamp(0, 255) as u8;
    LibraryVersion { major: part(code / 10000), minor: part(code / 100 % 100), patch: part(code % 100), suffix: RStr::from_str("") }
}

/// The plugin in use.
struct Active {
    plugin: EnvPlugin,
    abi: EnvAbi,
    /// Set once `finalize` ran; held across each call so that none runs after it.
    finalized: Mutex<bool>,
    /// Names whose lookup failed, warned about once each.
    warned: Mutex<HashSet<String>>,
}

static ACTIVE: OnceLock<Option<Active>> = OnceLock::new();

thread_local! {
    /// Set on the thread that is loading the plugin.
    static LOADING: Cell<bool> = const { Cell::new(false) };
}

/// What the env plugin says about a parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// No env plugin is in use (none asked for or found, its `init` failed, it was finalized,
    /// or the loader itself is asking): the process environment decides.
    NoPlugin,
    /// The plugin's answer; `None`: unset.
    Plugin { plugin: &'static str, value: Option<String> },
}

/// The env plugin's answer for `name`, loading the plugin at the first call.
pub fn get(name: &str) -> Answer {
    if LOADING.with(Cell::get) {
        return Answer::NoPlugin;
    }
    let Some(active) = active() else { return Answer::NoPlugin };
    let finalized = active.finalized.lock().unwrap_or_else(|p| p.into_inner());
    if *finalized {
        return Answer::NoPlugin;
    }
    let value = match active.plugin.api.get_env(name) {
        Ok(v) => v,
        Err(e) => {
            let first = active.warned.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string());
            if first {
                // Kept until the log level is known, when this comes before it.
                let ((), lines) = crate::log::capture(|| {
                    tracing::warn!(target: "ENV", "ENV/Plugin: {} could not resolve {name}: {}; {name} is taken as unset", active.plugin.name, e.message)
                });
                crate::log::emit_when_ready(lines);
            }
            None
        }
    };
    Answer::Plugin { plugin: &active.plugin.name, value }
}

/// The plugin in use, if any (loading it at the first call): its name, ABI family and version.
pub fn in_use() -> Option<(&'static str, EnvAbi, u32)> {
    active().map(|a| (a.plugin.name.as_str(), a.abi, a.plugin.abi_version))
}

fn active() -> Option<&'static Active> {
    ACTIVE
        .get_or_init(|| {
            LOADING.with(|l| l.set(true));
            let (active, lines) = crate::log::capture(load);
            LOADING.with(|l| l.set(false));
            crate::log::emit_when_ready(lines);
            if active.is_some() {
                // SAFETY: registers a function without arguments that only touches statics;
                // atexit has no other precondition.
                if unsafe { libc::atexit(finalize_at_exit) } != 0 {
                    tracing::warn!(target: "ENV", "ENV/Plugin: cannot register the exit hook; the plugin's finalize will not run");
                }
            }
            active
        })
        .as_ref()
}

/// Finds, loads and initialises the env plugin; logs which one (or none) and why.
fn load() -> Option<Active> {
    // As NCCL: the plugin's own variable comes from the process environment.
    let value = std::env::var(PluginKind::Env.env_var()).ok().filter(|v| !v.trim().is_empty());
    if let Some(v) = &value {
        tracing::info!(target: "ENV", "{}={v} set by environment", PluginKind::Env.env_var());
    }
    let search = super::search_with(PluginKind::Env, value, None, from_library);
    if search.disabled {
        tracing::info!(target: "ENV", "ENV/Plugin: none in use (NCCL_ENV_PLUGIN=none); parameters come from the process environment");
        return None;
    }
    let mut skipped = search.skipped;
    let mut chosen = None;
    for found in search.found {
        let LoadedEnv { plugin, abi } = found.plugin;
        match plugin.api.init(library_version(), super::logger()) {
            Ok(()) => {
                tracing::info!(
                    target: "ENV",
                    "ENV/Plugin: using {} ({} v{}) from {}: {}",
                    plugin.name, abi.label(), plugin.abi_version, plugin.origin, found.why
                );
                chosen = Some(Active { plugin, abi, finalized: Mutex::new(false), warned: Mutex::new(HashSet::new()) });
                break;
            }
            Err(e) => skipped.push(Skipped {
                what: format!("{} ({})", plugin.name, plugin.origin),
                why: format!("init failed: {}", e.message),
                explicit: found.explicit,
            }),
        }
    }
    super::log_skipped(PluginKind::Env, &search.not_found, &skipped);
    if chosen.is_none() {
        tracing::info!(target: "ENV", "ENV/Plugin: none in use; parameters come from the process environment");
    }
    chosen
}

/// The exit hook: the plugin's `finalize`, once; later lookups read the process environment.
extern "C" fn finalize_at_exit() {
    let Some(Some(active)) = ACTIVE.get() else { return };
    let mut finalized = active.finalized.lock().unwrap_or_else(|p| p.into_inner());
    if std::mem::replace(&mut *finalized, true) {
        return;
    }
    if let Err(e) = active.plugin.api.finalize() {
        tracing::warn!(target: "ENV", "ENV/Plugin: {} finalize failed: {}", active.plugin.name, e.message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_is_told_the_reported_version() {
        let v = library_version();
        let code = crate::version::NCCL_VERSION_CODE;
        assert_eq!(crate::version::nccl_version(v.major.into(), v.minor.into(), v.patch.into()), code);
        assert_eq!(v.suffix.as_str(), "");
    }

    #[test]
    fn the_loading_thread_reads_the_environment() {
        LOADING.with(|l| l.set(true));
        assert_eq!(get("NCCL_PROTO"), Answer::NoPlugin);
        LOADING.with(|l| l.set(false));
    }
}

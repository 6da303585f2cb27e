//! Plugins: discovery of plugin libraries ([`discovery`]), a check of each file before the
//! dynamic loader gets it ([`elf_check`]), opening them once per process ([`library`]),
//! choosing each communicator's network ([`net`], in NCCL's order: [`net_order`]), tuner and profiler, and the process's env
//! plugin ([`mod@env`]), through which every parameter is resolved.
//!
//! The core sees one interface per kind — the `Net`, `Tuner`, `Profiler` and `Env` traits of
//! `rustccl-plugin-api` — whether the plugin is built in, a Rust library of any supported ABI
//! version (adapted by the version's client type), or, in a later issue, a C library built for
//! NCCL's ABI.

pub mod c_abi;
pub mod c_env;
pub mod c_net;
pub mod c_tuner;
pub mod c_profiler;
pub mod discovery;
pub mod elf_check;
pub mod env;
pub mod library;
pub mod net;
pub mod net_order;
pub mod profiler;
pub mod profiler_events;
pub mod tuner;

use std::sync::Arc;

use abi_stable::std_types::RStr;
use rustccl_plugin_api::export::PluginKind;
use rustccl_plugin_api::{log_level, subsys, LogFn, PluginError};

use crate::error::{Error, ResultCode};
use crate::params;
use discovery::Request;
use library::{OpenError, PluginLibrary};

/// The plugins one communicator uses, released together at destroy.
#[derive(Debug)]
pub struct CommPlugins {
    pub net: net::NetInstance,
    pub tuner: Option<tuner::TunerInstance>,
    pub profiler: Option<Arc<profiler::ProfilerInstance>>,
}

impl CommPlugins {
    /// Chooses every plugin for a communicator: the network (required), then the tuner and
    /// the profiler (optional; they may come from the network plugin's library).
    pub fn select(
        info: &profiler::CommInfo,
        config: &crate::config::ResolvedConfig,
    ) -> crate::error::Result<CommPlugins> {
        let net = net::select(info.comm_id, config.net_name.as_deref(), config.traffic_class)?;
        let lib = net.plugin.library.clone();
        let tuner = tuner::select(info.comm_id, info.nranks, info.nnodes, lib.as_ref());
        let profiler = profiler::select(info, lib.as_ref());
        Ok(CommPlugins { net, tuner, profiler })
    }

    /// The communicator's observer: its profiler, if it has one.
    pub fn observer(&self) -> Option<Arc<dyn crate::observe::Observer>> {
        self.profiler.clone().map(|p| p as Arc<dyn crate::observe::Observer>)
    }
}

/// A plugin of any kind (`T` is `dyn Net`, `dyn Tuner` or `dyn Profiler`), built in or loaded.
pub struct Plugin<T: ?Sized> {
    pub api: Arc<T>,
    pub name: String,
    /// The ABI version of its table (built-ins: the current one).
    pub abi_version: u32,
    /// "built in" or the library's path.
    pub origin: String,
    /// Keeps the library loaded while the plugin is in use.
    pub library: Option<Arc<PluginLibrary>>,
}

impl<T: ?Sized> Plugin<T> {
    pub fn builtin(api: Arc<T>, name: &str, abi_version: u32) -> Plugin<T> {
        Plugin { api, name: name.to_string(), abi_version, origin: "built in".into(), library: None }
    }

    pub fn loaded(api: Arc<T>, name: &str, abi_version: u32, lib: &Arc<PluginLibrary>) -> Plugin<T> {
        Plugin { api, name: name.to_string(), abi_version, origin: lib.path.clone(), library: Some(Arc::clone(lib)) }
    }
}

impl<T: ?Sized> std::fmt::Debug for Plugin<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plugin({} v{} from {})", self.name, self.abi_version, self.origin)
    }
}

/// A candidate passed over, and why.
pub struct Skipped {
    pub what: String,
    pub why: String,
    /// The user named it: its failure is a warning, not a note.
    pub explicit: bool,
}

/// A plugin found in a library, with the reason it was a candidate.
pub struct Found<P> {
    pub plugin: P,
    pub explicit: bool,
    pub why: String,
}

/// The outcome of searching for a kind's plugin libraries.
pub struct Search<P> {
    pub found: Vec<Found<P>>,
    pub skipped: Vec<Skipped>,
    pub not_found: Vec<String>,
    /// The variable said `none`.
    pub disabled: bool,
}

/// Opens the libraries the kind's variable names (or the default names) and reads their
/// tables with `load`. When the variable is unset and no library of the kind's own names
/// exists, the net plugin's library (`also_in`) is searched too, as NCCL does for tuners and
/// profilers.
pub fn search<P>(
    kind: PluginKind,
    also_in: Option<&Arc<PluginLibrary>>,
    load: impl Fn(&Arc<PluginLibrary>) -> Result<P, String>,
) -> Search<P> {
    search_with(kind, params::env_str(kind.env_var()), also_in, load)
}

/// [`search`] given the variable's value (`None`: unset), for the env plugin, whose variable
/// is read from the process environment before any parameter can be.
pub fn search_with<P>(
    kind: PluginKind,
    env: Option<String>,
    also_in: Option<&Arc<PluginLibrary>>,
    load: impl Fn(&Arc<PluginLibrary>) -> Result<P, String>,
) -> Search<P> {
    let mut out = Search { found: Vec::new(), skipped: Vec::new(), not_found: Vec::new(), disabled: false };
    let why = match &env {
        Some(v) => format!("{}={v}", kind.env_var()),
        None => format!("{} unset, found under its default name", kind.env_var()),
    };
    let cands = match discovery::candidates(kind, env.as_deref()) {
        Request::Disabled => {
            out.disabled = true;
            return out;
        }
        Request::Candidates(c) => c,
    };
    for cand in cands {
        let mut found = false;
        for file in &cand.files {
            match library::open(file) {
                Err(OpenError::NotFound) => {
                    out.not_found.push(file.clone());
                    continue;
                }
                Err(OpenError::Failed(msg)) => {
                    out.skipped.push(Skipped { what: file.clone(), why: msg, explicit: cand.explicit })
                }
                Ok(lib) => match load(&lib) {
                    Ok(plugin) => out.found.push(Found { plugin, explicit: cand.explicit, why: why.clone() }),
                    Err(why) => out.skipped.push(Skipped { what: lib.path.clone(), why, explicit: cand.explicit }),
                },
            }
            found = true;
            break;
        }
        if !found && cand.explicit {
            out.skipped.push(Skipped {
                what: cand.request.clone(),
                why: format!("no such library (tried {})", cand.files.join(", ")),
                explicit: true,
            });
        }
    }
    if env.is_none() && out.found.is_empty() {
        if let Some(lib) = also_in {
            if let Ok(plugin) = load(lib) {
                out.found.push(Found { plugin, explicit: false, why: format!("found in the net plugin's library {}", lib.path) });
            }
        }
    }
    out
}

/// Logs what a search passed over: one line for the default names that do not exist, one
/// line per candidate that failed (a warning when the user named it).
pub fn log_skipped(kind: PluginKind, not_found: &[String], skipped: &[Skipped]) {
    let label = kind.name().to_uppercase();
    if !not_found.is_empty() {
        tracing::info!(target: "PLUGIN", "{label}/Plugin: could not find: {}", not_found.join(", "));
    }
    for s in skipped {
        if s.explicit {
            tracing::warn!(target: "PLUGIN", "{label}/Plugin: skipped {}: {}", s.what, s.why);
        } else {
            tracing::info!(target: "PLUGIN", "{label}/Plugin: skipped {}: {}", s.what, s.why);
        }
    }
}

thread_local! {
    /// The messages plugins logged on this thread inside [`probe_quietly`], held back.
    static HELD: std::cell::RefCell<Option<Vec<(i32, u64, String)>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `probe` (a plugin's `init` and `devices`, on this thread) holding back what plugins
/// log on this thread meanwhile; then logs it, with its warnings as INFO unless `usable` says
/// the probe found the plugin usable. For a network nobody asked for (the IB transport on a
/// machine without RDMA, [`net_order`]): its failure is the usual case, said in one INFO line
/// by the loader, while a transport that is used keeps its warnings.
pub fn probe_quietly<R>(probe: impl FnOnce() -> R, usable: impl FnOnce(&R) -> bool) -> R {
    /// Stops the holding back when dropped, also if `probe` unwinds.
    struct Holding;
    impl Drop for Holding {
        fn drop(&mut self) {
            HELD.with(|h| h.borrow_mut().take());
        }
    }
    HELD.with(|h| *h.borrow_mut() = Some(Vec::new()));
    let holding = Holding;
    let r = probe();
    let held = HELD.with(|h| h.borrow_mut().take()).unwrap_or_default();
    drop(holding);
    let keep = usable(&r);
    for (level, flags, text) in held {
        let level = if keep { level } else { level.max(log_level::INFO) };
        host_log(level, flags, RStr::from_str(&text));
    }
    r
}

/// The logger given to plugins: their messages go through rustccl's log (held back inside
/// [`probe_quietly`]).
pub extern "C" fn host_log(level: i32, flags: u64, message: RStr<'_>) {
    // try_with: a plugin may log from a thread whose thread-locals are being destroyed.
    let held = HELD.try_with(|h| match h.borrow_mut().as_mut() {
        Some(v) => {
            v.push((level, flags, message.as_str().to_string()));
            true
        }
        None => false,
    });
    if held == Ok(true) {
        return;
    }
    let target_is = |bit: u64| flags & bit != 0;
    let msg = message.as_str();
    macro_rules! emit {
        ($lvl:ident) => {
            if target_is(subsys::NET) {
                tracing::$lvl!(target: "NET", "{msg}")
            } else if target_is(subsys::TUNING) {
                tracing::$lvl!(target: "TUNING", "{msg}")
            } else if target_is(subsys::PROFILE) {
                tracing::$lvl!(target: "PROFILE", "{msg}")
            } else if target_is(subsys::ENV) {
                tracing::$lvl!(target: "ENV", "{msg}")
            } else {
                tracing::$lvl!(target: "PLUGIN", "{msg}")
            }
        };
    }
    match level {
        l if l <= log_level::WARN => emit!(warn),
        log_level::INFO => emit!(info),
        _ => emit!(trace),
    }
}

pub fn logger() -> LogFn {
    LogFn { log: host_log }
}

impl From<PluginError> for Error {
    fn from(e: PluginError) -> Error {
        let code = ResultCode::from_i32(e.code)
            .filter(|c| !matches!(c, ResultCode::Success | ResultCode::InProgress))
            .unwrap_or(ResultCode::InternalError);
        Error::new(code, e.message.to_string())
    }
}

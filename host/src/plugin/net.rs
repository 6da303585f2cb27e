//! Choosing a communicator's network plugin.
//!
//! Candidates come from `NCCL_NET_PLUGIN` ([`discovery`](super::discovery)); the built-in
//! Socket plugin is always the last one. For each, in order: open the library, find its
//! newest supported table (rustccl's own first, then NCCL's C tables `ncclNetPlugin_v12` down
//! to `_v6`, adapted by [`super::c_net`]), `init` it for this communicator, check it has
//! devices, and check its name against `NCCL_NET` / `config.netName` when one is asked for. The
//! first that passes is used; one INFO line says which, which ABI, from where, and why; each
//! candidate that failed gets one line saying why.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::net::{Net, NetCommConfig, NetV1, NetV1Client};
use rustccl_plugin_api::PluginHandle;

use super::c_net::{self, CNet};
use super::library::{self, PluginLibrary};
use super::{Plugin, Skipped};
use crate::error::{Error, Result};

/// Net ABI versions this host understands, newest first.
pub const NET_ABI_VERSIONS: &[u32] = &[1];

/// A net plugin, built in or loaded.
pub type NetPlugin = Plugin<dyn Net>;

/// Which ABI a net plugin's table follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetAbi {
    /// rustccl's own (`rustccl_net_vN`).
    Rustccl(u32),
    /// NCCL's C table (`ncclNetPlugin_vN`).
    NcclC(u32),
}

impl std::fmt::Display for NetAbi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetAbi::Rustccl(v) => write!(f, "rustccl net ABI v{v}"),
            NetAbi::NcclC(v) => write!(f, "NCCL C net ABI v{v}"),
        }
    }
}

/// A net plugin read from a library, with the ABI of its table.
pub struct LoadedNet {
    pub plugin: NetPlugin,
    pub abi: NetAbi,
}

/// A net plugin initialised for one communicator; finalized when dropped.
#[derive(Debug)]
pub struct NetInstance {
    pub plugin: Arc<NetPlugin>,
    pub abi: NetAbi,
    pub ctx: PluginHandle,
    pub devices: i32,
}

impl Drop for NetInstance {
    fn drop(&mut self) {
        if let Err(e) = self.plugin.api.finalize(self.ctx) {
            tracing::warn!(target: "NET", "NET/{}: finalize failed: {}", self.plugin.name, e.message);
        }
    }
}

/// The built-in Socket plugin (one instance per process, like a loaded library's).
pub fn builtin_socket() -> NetPlugin {
    static SOCKET: std::sync::OnceLock<Arc<rustccl_net_socket::SocketNet>> = std::sync::OnceLock::new();
    let socket: Arc<dyn Net> = SOCKET.get_or_init(|| Arc::new(rustccl_net_socket::SocketNet::with_lookup(crate::params::env_str))).clone();
    Plugin::builtin(socket, "Socket", NET_ABI_VERSIONS[0])
}

/// Finds the newest net table a library exports: rustccl's, else NCCL's C tables newest first.
pub fn from_library(lib: &Arc<PluginLibrary>) -> std::result::Result<LoadedNet, String> {
    if let Some(t) = export::find::<NetV1>(&lib.lib, PluginKind::Net, 1)? {
        let plugin: NetPlugin = Plugin::loaded(Arc::new(NetV1Client { table: t }), t.name.as_str(), 1, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::Rustccl(1) });
    }
    note_collnet(lib);
    if let Some(c) = CNet::load(lib)? {
        let (name, v) = (c.name().to_string(), c.version());
        let plugin: NetPlugin = Plugin::loaded(Arc::new(c), &name, v, lib);
        return Ok(LoadedNet { plugin, abi: NetAbi::NcclC(v) });
    }
    let newer = library::nccl_c_symbols(lib, "ncclNetPlugin_v", c_net::NEWEST + 1..=c_net::NEWEST + 20);
    if !newer.is_empty() {
        return Err(format!(
            "it exports only {}, newer than the NCCL C net ABIs this rustccl knows (v{}..v{}); use a plugin build \
             that also exports an older table",
            newer.join(", "),
            c_net::OLDEST,
            c_net::NEWEST
        ));
    }
    Err(format!(
        "it exports no rustccl net plugin (symbols {}) nor an NCCL C net table (ncclNetPlugin_v{}..v{})",
        NET_ABI_VERSIONS.iter().map(|&v| export::symbol_name(PluginKind::Net, v)).collect::<Vec<_>>().join(", "),
        c_net::NEWEST,
        c_net::OLDEST
    ))
}

/// One INFO line per library (and process) that exports NCCL's CollNet, which rustccl does not
/// use; the library's net table still loads.
fn note_collnet(lib: &PluginLibrary) {
    static NOTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let collnet = library::nccl_c_symbols(lib, "ncclCollNetPlugin_v", 2..=c_net::NEWEST + 20);
    if collnet.is_empty() {
        return;
    }
    let mut noted = NOTED.lock().unwrap_or_else(|p| p.into_inner());
    if !noted.contains(&lib.path) {
        noted.push(lib.path.clone());
        tracing::info!(
            target: "NET",
            "NET/Plugin: {} also exports CollNet ({}); CollNet is not supported by rustccl, only its net table is used",
            lib.path,
            collnet.join(", ")
        );
    }
}

/// Chooses and initialises the network for a communicator. `want` is `config.netName` or
/// `NCCL_NET` (already merged by the config).
pub fn select(comm_id: u64, want: Option<&str>, traffic_class: Option<i32>) -> Result<NetInstance> {
    let search = super::search(PluginKind::Net, None, from_library);
    let mut skipped = search.skipped;
    let builtin_why = if search.disabled {
        "external plugins disabled (NCCL_NET_PLUGIN=none)"
    } else {
        "the built-in fallback"
    };
    let mut plugins: Vec<(NetPlugin, NetAbi, bool, String)> =
        search.found.into_iter().map(|f| (f.plugin.plugin, f.plugin.abi, f.explicit, f.why)).collect();
    plugins.push((builtin_socket(), NetAbi::Rustccl(NET_ABI_VERSIONS[0]), false, builtin_why.to_string()));

    let config = NetCommConfig { traffic_class: traffic_class.unwrap_or(-1) };
    let mut chosen = None;
    for (plugin, abi, explicit, why) in plugins {
        let what = format!("{} ({})", plugin.name, plugin.origin);
        if let Some(w) = want {
            if !plugin.name.eq_ignore_ascii_case(w) {
                skipped.push(Skipped { what, why: format!("its name is not \"{w}\" (NCCL_NET / netName)"), explicit: false });
                continue;
            }
        }
        let ctx = match plugin.api.init(comm_id, &config, super::logger()) {
            Ok(ctx) => ctx,
            Err(e) => {
                skipped.push(Skipped { what, why: format!("init failed: {}", e.message), explicit });
                continue;
            }
        };
        match plugin.api.devices(ctx) {
            Ok(n) if n > 0 => {
                chosen = Some((NetInstance { plugin: Arc::new(plugin), abi, ctx, devices: n }, why));
                break;
            }
            Ok(_) => skipped.push(Skipped { what, why: "it has no devices".into(), explicit }),
            Err(e) => skipped.push(Skipped { what, why: format!("listing devices failed: {}", e.message), explicit }),
        }
        let _ = plugin.api.finalize(ctx);
    }
    super::log_skipped(PluginKind::Net, &search.not_found, &skipped);
    match chosen {
        Some((inst, why)) => {
            tracing::info!(
                target: "NET",
                "NET/Plugin: using {} ({}) from {}, {} device(s): {why}",
                inst.plugin.name, inst.abi, inst.plugin.origin, inst.devices
            );
            Ok(inst)
        }
        None => {
            let reasons: Vec<String> = skipped.iter().map(|s| format!("{}: {}", s.what, s.why)).collect();
            Err(Error::invalid_usage(match want {
                Some(w) => format!("no network plugin named \"{w}\" could be used ({})", reasons.join("; ")),
                None => format!("no network plugin could be used ({})", reasons.join("; ")),
            }))
        }
    }
}

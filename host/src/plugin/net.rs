//! Choosing a communicator's network plugin.
//!
//! Candidates come from `NCCL_NET_PLUGIN` ([`discovery`](super::discovery)); the built-in
//! Socket plugin is always the last one. For each, in order: open the library, find its
//! newest supported table, `init` it for this communicator, check it has devices, and check
//! its name against `NCCL_NET` / `config.netName` when one is asked for. The first that passes
//! is used; one INFO line says which, which ABI version, from where, and why; each candidate
//! that failed gets one line saying why.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::net::{Net, NetCommConfig, NetV1, NetV1Client};
use rustccl_plugin_api::PluginHandle;

use super::library::{self, PluginLibrary};
use super::{Plugin, Skipped};
use crate::error::{Error, Result};

/// Net ABI versions this host understands, newest first.
pub const NET_ABI_VERSIONS: &[u32] = &[1];

/// A net plugin, built in or loaded.
pub type NetPlugin = Plugin<dyn Net>;

/// A net plugin initialised for one communicator; finalized when dropped.
#[derive(Debug)]
pub struct NetInstance {
    pub plugin: Arc<NetPlugin>,
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
    let socket: Arc<dyn Net> = SOCKET.get_or_init(|| Arc::new(rustccl_net_socket::SocketNet::new())).clone();
    Plugin::builtin(socket, "Socket", NET_ABI_VERSIONS[0])
}

/// Finds the newest net table a library exports.
pub fn from_library(lib: &Arc<PluginLibrary>) -> std::result::Result<NetPlugin, String> {
    if let Some(t) = export::find::<NetV1>(&lib.lib, PluginKind::Net, 1)? {
        return Ok(Plugin::loaded(Arc::new(NetV1Client { table: t }), t.name.as_str(), 1, lib));
    }
    let c = library::nccl_c_symbols(lib, "ncclNetPlugin_v", 6..=11);
    if !c.is_empty() {
        return Err(format!(
            "it exports NCCL's C net ABI ({}), which this rustccl cannot load yet",
            c.join(", ")
        ));
    }
    Err(format!(
        "it exports no rustccl net plugin (symbols {})",
        NET_ABI_VERSIONS.iter().map(|&v| export::symbol_name(PluginKind::Net, v)).collect::<Vec<_>>().join(", ")
    ))
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
    let mut plugins: Vec<(NetPlugin, bool, String)> =
        search.found.into_iter().map(|f| (f.plugin, f.explicit, f.why)).collect();
    plugins.push((builtin_socket(), false, builtin_why.to_string()));

    let config = NetCommConfig { traffic_class: traffic_class.unwrap_or(-1) };
    let mut chosen = None;
    for (plugin, explicit, why) in plugins {
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
                chosen = Some((NetInstance { plugin: Arc::new(plugin), ctx, devices: n }, why));
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
                "NET/Plugin: using {} (rustccl net ABI v{}) from {}, {} device(s): {why}",
                inst.plugin.name, inst.plugin.abi_version, inst.plugin.origin, inst.devices
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

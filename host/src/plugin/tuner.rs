//! Choosing a communicator's tuner: from `NCCL_TUNER_PLUGIN`, or under the default names, or
//! inside the net plugin's library. A tuner is optional: when none loads or its `init` fails,
//! the communicator uses the built-in cost model and the log says why.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::tuner::{Tuner, TunerV1, TunerV1Client, TunerV2, TunerV2Client};
use rustccl_plugin_api::PluginHandle;

use super::library::{self, PluginLibrary};
use super::{Plugin, Skipped};

/// Tuner ABI versions this host understands, newest first.
pub const TUNER_ABI_VERSIONS: &[u32] = &[2, 1];

pub type TunerPlugin = Plugin<dyn Tuner>;

/// A tuner initialised for one communicator; finalized when dropped.
#[derive(Debug)]
pub struct TunerInstance {
    pub plugin: Arc<TunerPlugin>,
    pub ctx: PluginHandle,
}

impl Drop for TunerInstance {
    fn drop(&mut self) {
        if let Err(e) = self.plugin.api.finalize(self.ctx) {
            tracing::warn!(target: "TUNING", "TUNER/{}: finalize failed: {}", self.plugin.name, e.message);
        }
    }
}

/// Finds the newest tuner table a library exports, adapting older versions.
pub fn from_library(lib: &Arc<PluginLibrary>) -> Result<TunerPlugin, String> {
    if let Some(t) = export::find::<TunerV2>(&lib.lib, PluginKind::Tuner, 2)? {
        return Ok(Plugin::loaded(Arc::new(TunerV2Client { table: t }), t.name.as_str(), 2, lib));
    }
    if let Some(t) = export::find::<TunerV1>(&lib.lib, PluginKind::Tuner, 1)? {
        return Ok(Plugin::loaded(Arc::new(TunerV1Client { table: t }), t.name.as_str(), 1, lib));
    }
    let c = library::nccl_c_symbols(lib, "ncclTunerPlugin_v", 2..=5);
    if !c.is_empty() {
        return Err(format!("it exports NCCL's C tuner ABI ({}), which this rustccl cannot load yet", c.join(", ")));
    }
    Err("it exports no rustccl tuner (rustccl_tuner_v2, rustccl_tuner_v1)".into())
}

/// Loads and initialises the tuner for a communicator, if there is one.
pub fn select(comm_id: u64, nranks: usize, nnodes: usize, net_library: Option<&Arc<PluginLibrary>>) -> Option<TunerInstance> {
    let search = super::search(PluginKind::Tuner, net_library, from_library);
    let mut skipped = search.skipped;
    let mut chosen = None;
    for found in search.found {
        let plugin = found.plugin;
        match plugin.api.init(comm_id, nranks, nnodes, super::logger()) {
            Ok(ctx) => {
                tracing::info!(
                    target: "TUNING",
                    "TUNER/Plugin: using {} (rustccl tuner ABI v{}) from {}: {}",
                    plugin.name, plugin.abi_version, plugin.origin, found.why
                );
                chosen = Some(TunerInstance { plugin: Arc::new(plugin), ctx });
                break;
            }
            Err(e) => skipped.push(Skipped {
                what: format!("{} ({})", plugin.name, plugin.origin),
                why: format!("init failed: {}", e.message),
                explicit: found.explicit,
            }),
        }
    }
    super::log_skipped(PluginKind::Tuner, &search.not_found, &skipped);
    if chosen.is_none() {
        tracing::info!(target: "TUNING", "TUNER/Plugin: none in use; the built-in cost model decides");
    }
    chosen
}

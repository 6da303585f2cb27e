//! Choosing a communicator's tuner: from `NCCL_TUNER_PLUGIN`, or under the default names, or
//! inside the net plugin's library. A tuner is optional: when none loads or its `init` fails,
//! the communicator uses the built-in cost model and the log says why.
//!
//! A library may export rustccl's tables (`rustccl_tuner_v2`, `_v1`) or NCCL's C tables
//! (`ncclTunerPlugin_v6` … `_v2`, adapted by [`super::c_tuner`]); rustccl's are tried first,
//! then NCCL's newest first, and the first found is used.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::tuner::{Tuner, TunerV1, TunerV1Client, TunerV2, TunerV2Client};
use rustccl_plugin_api::PluginHandle;

use super::c_tuner::CTuner;
use super::library::PluginLibrary;
use super::{Plugin, Skipped};

/// rustccl tuner ABI versions this host understands, newest first (NCCL's C ones:
/// [`super::c_tuner::C_TUNER_ABI_VERSIONS`]).
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

/// Which family of tables a tuner was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunerAbi {
    /// `rustccl_tuner_vN`.
    Rustccl,
    /// NCCL's `ncclTunerPlugin_vN`.
    NcclC,
}

impl TunerAbi {
    pub fn label(self) -> &'static str {
        match self {
            TunerAbi::Rustccl => "rustccl tuner ABI",
            TunerAbi::NcclC => "NCCL C tuner ABI",
        }
    }
}

/// A tuner found in a library, and the family of its table.
pub struct LoadedTuner {
    pub plugin: TunerPlugin,
    pub abi: TunerAbi,
}

/// Finds the tuner table a library exports: rustccl's (newest first), else NCCL's C tables
/// (v6 down to v2), adapting older versions.
pub fn from_library(lib: &Arc<PluginLibrary>) -> Result<LoadedTuner, String> {
    let rust = |plugin| LoadedTuner { plugin, abi: TunerAbi::Rustccl };
    if let Some(t) = export::find::<TunerV2>(&lib.lib, PluginKind::Tuner, 2)? {
        return Ok(rust(Plugin::loaded(Arc::new(TunerV2Client { table: t }), t.name.as_str(), 2, lib)));
    }
    if let Some(t) = export::find::<TunerV1>(&lib.lib, PluginKind::Tuner, 1)? {
        return Ok(rust(Plugin::loaded(Arc::new(TunerV1Client { table: t }), t.name.as_str(), 1, lib)));
    }
    match CTuner::from_library(lib) {
        Ok(Some(t)) => {
            let (name, version) = (t.name.clone(), t.version);
            Ok(LoadedTuner { plugin: Plugin::loaded(Arc::new(t), &name, version, lib), abi: TunerAbi::NcclC })
        }
        Ok(None) => Err(
            "it exports no tuner (rustccl_tuner_v2, rustccl_tuner_v1, ncclTunerPlugin_v6 ... ncclTunerPlugin_v2)".into(),
        ),
        Err(why) => Err(format!("its NCCL C tuner tables are unusable: {why}")),
    }
}

/// Loads and initialises the tuner for a communicator, if there is one.
pub fn select(comm_id: u64, nranks: usize, nnodes: usize, net_library: Option<&Arc<PluginLibrary>>) -> Option<TunerInstance> {
    let search = super::search(PluginKind::Tuner, net_library, from_library);
    let mut skipped = search.skipped;
    let mut chosen = None;
    for found in search.found {
        let LoadedTuner { plugin, abi } = found.plugin;
        match plugin.api.init(comm_id, nranks, nnodes, super::logger()) {
            Ok(ctx) => {
                tracing::info!(
                    target: "TUNING",
                    "TUNER/Plugin: using {} ({} v{}) from {}: {}",
                    plugin.name, abi.label(), plugin.abi_version, plugin.origin, found.why
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

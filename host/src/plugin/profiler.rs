//! Choosing a communicator's profiler: from `NCCL_PROFILER_PLUGIN`, or under the default
//! names, or inside the net plugin's library. Optional, like the tuner; its `init` says which
//! events it wants.

use std::sync::Arc;

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::profiler::{Profiler, ProfilerV1, ProfilerV1Client};
use rustccl_plugin_api::PluginHandle;

use super::library::{self, PluginLibrary};
use super::{Plugin, Skipped};

pub type ProfilerPlugin = Plugin<dyn Profiler>;

/// A profiler initialised for one communicator; finalized when dropped.
#[derive(Debug)]
pub struct ProfilerInstance {
    pub plugin: Arc<ProfilerPlugin>,
    pub ctx: PluginHandle,
    /// The event types the profiler asked for.
    pub mask: u32,
}

impl Drop for ProfilerInstance {
    fn drop(&mut self) {
        if let Err(e) = self.plugin.api.finalize(self.ctx) {
            tracing::warn!(target: "PROFILE", "PROFILER/{}: finalize failed: {}", self.plugin.name, e.message);
        }
    }
}

pub fn from_library(lib: &Arc<PluginLibrary>) -> Result<ProfilerPlugin, String> {
    if let Some(t) = export::find::<ProfilerV1>(&lib.lib, PluginKind::Profiler, 1)? {
        return Ok(Plugin::loaded(Arc::new(ProfilerV1Client { table: t }), t.name.as_str(), 1, lib));
    }
    let c = library::nccl_c_symbols(lib, "ncclProfiler_v", 1..=5);
    if !c.is_empty() {
        return Err(format!("it exports NCCL's C profiler ABI ({}), which this rustccl cannot load yet", c.join(", ")));
    }
    Err("it exports no rustccl profiler (rustccl_profiler_v1)".into())
}

/// What a profiler is told about the communicator at init.
pub struct CommInfo<'a> {
    pub comm_id: u64,
    pub name: &'a str,
    pub nnodes: usize,
    pub nranks: usize,
    pub rank: usize,
}

/// Loads and initialises the profiler for a communicator, if there is one.
pub fn select(info: &CommInfo, net_library: Option<&Arc<PluginLibrary>>) -> Option<ProfilerInstance> {
    let search = super::search(PluginKind::Profiler, net_library, from_library);
    let mut skipped = search.skipped;
    let mut chosen = None;
    for found in search.found {
        let plugin = found.plugin;
        match plugin.api.init(info.comm_id, info.name, info.nnodes, info.nranks, info.rank, super::logger()) {
            Ok((ctx, mask)) => {
                tracing::info!(
                    target: "PROFILE",
                    "PROFILER/Plugin: using {} (rustccl profiler ABI v{}) from {}, event mask {mask:#x}: {}",
                    plugin.name, plugin.abi_version, plugin.origin, found.why
                );
                chosen = Some(ProfilerInstance { plugin: Arc::new(plugin), ctx, mask });
                break;
            }
            Err(e) => skipped.push(Skipped {
                what: format!("{} ({})", plugin.name, plugin.origin),
                why: format!("init failed: {}", e.message),
                explicit: found.explicit,
            }),
        }
    }
    super::log_skipped(PluginKind::Profiler, &search.not_found, &skipped);
    chosen
}

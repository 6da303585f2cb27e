//! Choosing a communicator's profiler: from `NCCL_PROFILER_PLUGIN`, or under the default
//! names, or inside the net plugin's library. Optional, like the tuner; its `init` says which
//! events it wants. A library may export rustccl's table (`rustccl_profiler_v3`, `_v2` or `_v1`) or
//! NCCL's C tables (`ncclProfiler_v7` … `ncclProfiler_v1`, adapted by [`super::c_profiler`]);
//! the newest rustccl table wins, then the newest C version.
//!
//! The events themselves are made by [`super::profiler_events`], from what the core tells a
//! communicator's observer ([`crate::observe::Observer`], which [`ProfilerInstance`] is).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

use rustccl_plugin_api::export::{self, PluginKind};
use rustccl_plugin_api::profiler::{Profiler, ProfilerV3, ProfilerV3Client};
use rustccl_plugin_api::profiler_v1::{ProfilerV1, ProfilerV1Client};
use rustccl_plugin_api::profiler_v2::{ProfilerV2, ProfilerV2Client};
use rustccl_plugin_api::PluginHandle;

use super::library::PluginLibrary;
use super::{Plugin, Skipped};

pub type ProfilerPlugin = Plugin<dyn Profiler>;

/// A profiler initialised for one communicator; finalized when the last holder (the
/// communicator's plugins, or an event still running) drops it.
#[derive(Debug)]
pub struct ProfilerInstance {
    pub plugin: Arc<ProfilerPlugin>,
    pub ctx: PluginHandle,
    /// The event types the profiler asked for.
    pub mask: u32,
    /// The communicator's rank (every event's `rank`).
    pub rank: i32,
    /// Per collective function: how many were started (the Coll events' `seq_number`).
    pub(crate) seq: [AtomicU64; 8],
    /// Itself, for the events it starts as an observer (each holds the instance, so that
    /// finalize comes after the last event stopped).
    me: Weak<ProfilerInstance>,
    /// While it lives, the core's observer hooks run ([`crate::observe::any_active`]).
    _active: crate::observe::Active,
}

impl ProfilerInstance {
    fn new(plugin: ProfilerPlugin, ctx: PluginHandle, mask: u32, rank: i32) -> Arc<ProfilerInstance> {
        Arc::new_cyclic(|me| ProfilerInstance {
            plugin: Arc::new(plugin),
            ctx,
            mask,
            rank,
            seq: Default::default(),
            me: me.clone(),
            _active: crate::observe::Active::register(),
        })
    }

    /// The instance as its events hold it (`None` while it is being dropped).
    pub(super) fn arc(&self) -> Option<Arc<ProfilerInstance>> {
        self.me.upgrade()
    }

    /// Whether the profiler wants events of any of the `types` bits.
    #[inline]
    pub fn wants(&self, types: u32) -> bool {
        self.mask & types != 0
    }
}

impl Drop for ProfilerInstance {
    fn drop(&mut self) {
        if let Err(e) = self.plugin.api.finalize(self.ctx) {
            tracing::warn!(target: "PROFILE", "PROFILER/{}: finalize failed: {}", self.plugin.name, e.message);
        }
    }
}

/// Which family of tables a profiler was loaded from (for the log line).
pub const RUST_ABI: &str = "rustccl profiler ABI";
pub const C_ABI: &str = "NCCL C profiler ABI";

/// The profiler a library exports, and the family of its table ([`RUST_ABI`] or [`C_ABI`]).
pub fn from_library(lib: &Arc<PluginLibrary>) -> Result<(ProfilerPlugin, &'static str), String> {
    if let Some(t) = export::find::<ProfilerV3>(&lib.lib, PluginKind::Profiler, 3)? {
        return Ok((Plugin::loaded(Arc::new(ProfilerV3Client { table: t }), t.name.as_str(), 3, lib), RUST_ABI));
    }
    if let Some(t) = export::find::<ProfilerV2>(&lib.lib, PluginKind::Profiler, 2)? {
        return Ok((Plugin::loaded(Arc::new(ProfilerV2Client { table: t }), t.name.as_str(), 2, lib), RUST_ABI));
    }
    if let Some(t) = export::find::<ProfilerV1>(&lib.lib, PluginKind::Profiler, 1)? {
        return Ok((Plugin::loaded(Arc::new(ProfilerV1Client { table: t }), t.name.as_str(), 1, lib), RUST_ABI));
    }
    if let Some(found) = super::c_profiler::find(lib)? {
        return Ok((found, C_ABI));
    }
    Err("it exports no rustccl profiler (rustccl_profiler_v3 … v1) and no NCCL C profiler (ncclProfiler_v7 … v1)".into())
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
///
/// As NCCL does, a profiler whose `init` fails is passed over for this communicator (no
/// finalize: it has no context to end), and one whose `init` succeeds with context 0 (C:
/// NULL) is switched off for it: no instance, so no event and no finalize, and no other
/// candidate is tried in its place.
pub fn select(info: &CommInfo, net_library: Option<&Arc<PluginLibrary>>) -> Option<Arc<ProfilerInstance>> {
    let search = super::search(PluginKind::Profiler, net_library, from_library);
    let mut skipped = search.skipped;
    let mut chosen = None;
    for found in search.found {
        let (plugin, family) = found.plugin;
        let abi = format!("{family} v{}", plugin.abi_version);
        match plugin.api.init(info.comm_id, info.name, info.nnodes, info.nranks, info.rank, super::logger()) {
            Ok((ctx, _)) if ctx.id == 0 => {
                // NCCL's rule (src/plugin/profiler.cc): a profiler that returns success with a
                // NULL context has switched itself off for this communicator (NVIDIA's
                // Inspector does so when it is disabled): it gets no event and no finalize.
                tracing::info!(
                    target: "PROFILE",
                    "PROFILER/Plugin: {} ({}) from {} returned no context for comm {:016x} rank {}: it switched itself off for this communicator (no events, no finalize)",
                    plugin.name,
                    abi,
                    plugin.origin,
                    info.comm_id,
                    info.rank
                );
                break;
            }
            Ok((ctx, mask)) => {
                tracing::info!(
                    target: "PROFILE",
                    "PROFILER/Plugin: using {} ({}) from {}, event mask {mask:#x}: {}",
                    plugin.name,
                    abi,
                    plugin.origin,
                    found.why
                );
                chosen = Some(ProfilerInstance::new(plugin, ctx, mask, info.rank as i32));
                break;
            }
            Err(e) => skipped.push(Skipped {
                what: format!("{} ({}, {})", plugin.name, abi, plugin.origin),
                why: format!("init failed: {}", e.message),
                explicit: found.explicit,
            }),
        }
    }
    super::log_skipped(PluginKind::Profiler, &search.not_found, &skipped);
    chosen
}

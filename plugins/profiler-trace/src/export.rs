//! The plugin's exported table: the process-wide [`TraceProfiler`] ([`instance`]) exported
//! from the `cdylib` as `rustccl_profiler_v3` (and as `rustccl_profiler_v2` and `_v1`, for
//! hosts that know only those) under the name [`PLUGIN_NAME`].

use rustccl_plugin_api::profiler::{Profiler, ProfilerProvider};

use crate::profiler::TraceProfiler;

/// Name of the exported profiler.
pub const PLUGIN_NAME: &str = "trace";

/// The instance the exported table uses.
pub fn instance() -> &'static TraceProfiler {
    static INSTANCE: std::sync::OnceLock<TraceProfiler> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(TraceProfiler::new)
}

/// Gives the exported table [`instance`].
pub struct Provider;

impl ProfilerProvider for Provider {
    fn get() -> &'static dyn Profiler {
        instance()
    }
}

rustccl_plugin_api::export_profiler!(v3, PLUGIN_NAME, provider = Provider);
rustccl_plugin_api::export_profiler!(v2, PLUGIN_NAME, provider = Provider);
rustccl_plugin_api::export_profiler!(v1, PLUGIN_NAME, provider = Provider);

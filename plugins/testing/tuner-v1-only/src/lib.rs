//! Exists for loader tests: a tuner named `old-tuner` that exports only the v1 table
//! (`rustccl_tuner_v1`), as a plugin built against an older rustccl would, so the host can
//! show it still loads one. Observable effect: `get_coll_info` sets the Ring/Simple cost to
//! 0.0 when that entry is usable (and leaves the channel count alone).

use rustccl_plugin_api::tuner::Tuner;
use rustccl_plugin_api::{subsys, Algorithm, CollType, CostTable, HandleRegistry, LogFn, PluginError, PluginHandle, Protocol};

/// The tuner; its state per communicator is its size.
#[derive(Default)]
pub struct OldTuner {
    contexts: HandleRegistry<(usize, usize)>,
}

impl Tuner for OldTuner {
    fn init(&self, _comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError> {
        log.info(subsys::TUNING, &format!("old-tuner: init for {nranks} ranks on {nnodes} nodes"));
        Ok(self.contexts.insert((nranks, nnodes)))
    }

    fn get_coll_info(
        &self,
        ctx: PluginHandle,
        _coll: CollType,
        _nbytes: usize,
        _num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        _n_channels: &mut i32,
    ) -> Result<(), PluginError> {
        self.contexts
            .with(ctx, |_| ())
            .ok_or_else(|| PluginError::invalid_argument(format!("old-tuner: unknown context {}", ctx.id)))?;
        costs.set(Algorithm::Ring, Protocol::Simple, 0.0);
        Ok(())
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        self.contexts
            .remove(ctx)
            .map(drop)
            .ok_or_else(|| PluginError::invalid_argument(format!("old-tuner: unknown context {}", ctx.id)))
    }
}

rustccl_plugin_api::export_tuner_v1!("old-tuner", OldTuner, OldTuner::default());

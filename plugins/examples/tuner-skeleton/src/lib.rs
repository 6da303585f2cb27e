//! A minimal tuner plugin, "tuner-skeleton", to copy and grow into your own. Build it
//! (`cargo build --release -p rustccl-example-tuner-skeleton`) and run any rustccl program with
//! `NCCL_TUNER_PLUGIN=target/release/librustccl_example_tuner_skeleton.so`.
//!
//! How a tuner works (the trait `rustccl_plugin_api::tuner::Tuner` says it in full): before
//! each collective the host fills a cost table, the predicted time of every (algorithm,
//! protocol) pair, and asks the tuner; the tuner may lower entries (the host then takes the
//! cheapest usable one) and may set the number of channels. Entries the host marked unusable
//! stay unusable: `CostTable::set` refuses to change them.
//!
//! The rule here, to show the mechanism: all-reduces of up to [`MAX_BYTES`] run as Tree with
//! the Simple protocol on [`CHANNELS`] channels; for everything else the host decides. A real
//! tuner would read a table measured on its cluster (see `plugins/tuner-default`, which
//! loads one that `rustccl-bench --tune` writes).

use rustccl_plugin_api::tuner::Tuner;
use rustccl_plugin_api::{subsys, Algorithm, CollType, CostTable, HandleRegistry, LogFn, PluginError, PluginHandle, Protocol};

/// The largest all-reduce (bytes) this tuner decides.
pub const MAX_BYTES: usize = 64 << 10;
/// The channels it asks for.
pub const CHANNELS: i32 = 2;

/// What the tuner keeps per communicator: its size, for the log.
#[derive(Default)]
pub struct SkeletonTuner {
    contexts: HandleRegistry<(usize, usize)>,
}

impl Tuner for SkeletonTuner {
    fn init(&self, _comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError> {
        log.info(subsys::TUNING, &format!("tuner-skeleton: init for {nranks} ranks on {nnodes} nodes"));
        Ok(self.contexts.insert((nranks, nnodes)))
    }

    fn get_coll_info(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        _num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<(), PluginError> {
        if self.contexts.with(ctx, |_| ()).is_none() {
            return Err(PluginError::invalid_argument(format!("tuner-skeleton: unknown context {}", ctx.id)));
        }
        // `set` returns false when the host marked the pair unusable (e.g. Tree on one
        // node of some backends): then leave everything to the host.
        if coll == CollType::AllReduce && nbytes <= MAX_BYTES && costs.set(Algorithm::Tree, Protocol::Simple, 0.0) {
            *n_channels = CHANNELS;
        }
        Ok(())
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        self.contexts
            .remove(ctx)
            .map(drop)
            .ok_or_else(|| PluginError::invalid_argument(format!("tuner-skeleton: unknown context {}", ctx.id)))
    }
}

// Exports the table `rustccl_tuner_v2` (add `export_tuner!(v1, ...)` too to load in hosts
// that only know v1).
rustccl_plugin_api::export_tuner!(v2, "tuner-skeleton", SkeletonTuner, SkeletonTuner::default());

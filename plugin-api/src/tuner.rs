//! The tuner plugin ABI, in two versions, with the semantics of NCCL's tuner: for each
//! collective the host fills a table of predicted times per (algorithm, protocol) pair
//! ([`CostTable`]) and the tuner may lower entries (the host then picks the cheapest usable
//! one) and may set the channel count; v2 may also choose the chunk size.
//!
//! A plugin implements the safe trait [`Tuner`] (current semantics, v2) and exports it with
//! [`export_tuner!`](crate::export_tuner)`(v2, ...)` and, to stay loadable by hosts that only
//! know v1, also with `export_tuner!(v1, ...)` (one library may export both;
//! `export_tuner_v1!` / `export_tuner_v2!` are the same). The host gets a `&dyn Tuner` back
//! through [`TunerV2Client`] or [`TunerV1Client`]; the v1 client adapts an old table to the
//! current trait (see there).
//!
//! | version | symbol | differences |
//! |---|---|---|
//! | 1 | `rustccl_tuner_v1` | `init(nranks, nnodes, log)`; `get_coll_info` without `num_pipe_ops`; no `get_chunk_size` |
//! | 2 | `rustccl_tuner_v2` | `init` gets the communicator id; `get_coll_info` gets `num_pipe_ops`; `get_chunk_size` |
//!
//! Rules (as NCCL's): an entry of the cost table that is not usable ([`is_usable_cost`]:
//! negative, infinite or NaN, e.g. [`crate::ALGO_PROTO_IGNORE`]) must stay as it is — use
//! [`CostTable::set`], which refuses to overwrite one. Leaving `*n_channels` unchanged means
//! "the host decides". An error from `get_coll_info` or `get_chunk_size` means "use the
//! host's default choice for this call"; an error from `init` disables the tuner for that
//! communicator. The table crosses the ABI as an `RSliceMut<f32>` plus `n_algo` and
//! `n_proto` (row-major, `costs[algo * n_proto + proto]`).
//!
//! [`is_usable_cost`]: crate::is_usable_cost

use abi_stable::std_types::{ROption, RSliceMut, RStr};
use abi_stable::StableAbi;

use crate::{call_guarded, Algorithm, CollType, CostTable, LogFn, PResult, PluginError, PluginHandle};

/// The `num_pipe_ops` a v1 table's `get_coll_info` is taken to mean (one operation, not
/// part of a pipelined group), as the v1 shim passes it to [`Tuner::get_coll_info`].
pub const V1_NUM_PIPE_OPS: i32 = 1;

/// The `comm_id` a v1 table's `init` passes to [`Tuner::init`] (v1 has none).
pub const V1_COMM_ID: u64 = 0;

/// The tuner plugin interface (v2 semantics). `ctx` is the handle `init` returned.
pub trait Tuner: Send + Sync {
    /// Starts the tuner for one communicator of `nranks` ranks on `nnodes` nodes; returns its
    /// context. `comm_id` is the communicator's unique id (0 when unknown: a v1 plugin).
    fn init(&self, comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError>;
    /// Called for each collective of `nbytes` bytes, one of `num_pipe_ops` operations
    /// pipelined together: may lower usable entries of `costs` and may set `*n_channels`.
    fn get_coll_info(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<(), PluginError>;
    /// The chunk size (bytes) for a collective once the host chose `algo`, `proto` and
    /// `n_channels`; `Ok(None)`: the host decides (the host clamps what it gets).
    fn get_chunk_size(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        algo: Algorithm,
        proto: crate::Protocol,
        n_channels: i32,
    ) -> Result<Option<usize>, PluginError> {
        let _ = (ctx, coll, nbytes, algo, proto, n_channels);
        Ok(None)
    }
    /// Ends the communicator's context.
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError>;
}

/// The exported table of tuner ABI v1 (`rustccl_tuner_v1`).
#[repr(C)]
#[derive(StableAbi)]
pub struct TunerV1 {
    /// The plugin's name, for log lines.
    pub name: RStr<'static>,
    pub init: extern "C" fn(nranks: usize, nnodes: usize, log: LogFn) -> PResult<PluginHandle>,
    /// `costs` holds `n_algo * n_proto` entries, row-major.
    pub get_coll_info: extern "C" fn(
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        costs: RSliceMut<'_, f32>,
        n_algo: usize,
        n_proto: usize,
        n_channels: &mut i32,
    ) -> PResult<()>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

/// The exported table of tuner ABI v2 (`rustccl_tuner_v2`).
#[repr(C)]
#[derive(StableAbi)]
pub struct TunerV2 {
    /// The plugin's name, for log lines.
    pub name: RStr<'static>,
    pub init: extern "C" fn(comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> PResult<PluginHandle>,
    /// `costs` holds `n_algo * n_proto` entries, row-major.
    pub get_coll_info: extern "C" fn(
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        num_pipe_ops: i32,
        costs: RSliceMut<'_, f32>,
        n_algo: usize,
        n_proto: usize,
        n_channels: &mut i32,
    ) -> PResult<()>,
    /// `RNone`: the host decides.
    pub get_chunk_size: extern "C" fn(
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        algo: Algorithm,
        proto: crate::Protocol,
        n_channels: i32,
    ) -> PResult<ROption<usize>>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

/// Where the exported shims find the plugin's instance.
pub trait TunerProvider: 'static {
    fn get() -> &'static dyn Tuner;
}

fn cost_table<'a>(costs: RSliceMut<'a, f32>, n_algo: usize, n_proto: usize) -> Result<CostTable<'a>, PluginError> {
    CostTable::new(costs.into_mut_slice(), n_algo, n_proto).map_err(PluginError::invalid_argument)
}

extern "C" fn v1_init_shim<P: TunerProvider>(nranks: usize, nnodes: usize, log: LogFn) -> PResult<PluginHandle> {
    call_guarded(|| P::get().init(V1_COMM_ID, nranks, nnodes, log))
}
extern "C" fn v1_get_coll_info_shim<P: TunerProvider>(
    ctx: PluginHandle,
    coll: CollType,
    nbytes: usize,
    costs: RSliceMut<'_, f32>,
    n_algo: usize,
    n_proto: usize,
    n_channels: &mut i32,
) -> PResult<()> {
    call_guarded(|| {
        let mut table = cost_table(costs, n_algo, n_proto)?;
        P::get().get_coll_info(ctx, coll, nbytes, V1_NUM_PIPE_OPS, &mut table, n_channels)
    })
}
extern "C" fn v2_init_shim<P: TunerProvider>(comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> PResult<PluginHandle> {
    call_guarded(|| P::get().init(comm_id, nranks, nnodes, log))
}
#[allow(clippy::too_many_arguments)]
extern "C" fn v2_get_coll_info_shim<P: TunerProvider>(
    ctx: PluginHandle,
    coll: CollType,
    nbytes: usize,
    num_pipe_ops: i32,
    costs: RSliceMut<'_, f32>,
    n_algo: usize,
    n_proto: usize,
    n_channels: &mut i32,
) -> PResult<()> {
    call_guarded(|| {
        let mut table = cost_table(costs, n_algo, n_proto)?;
        P::get().get_coll_info(ctx, coll, nbytes, num_pipe_ops, &mut table, n_channels)
    })
}
extern "C" fn v2_get_chunk_size_shim<P: TunerProvider>(
    ctx: PluginHandle,
    coll: CollType,
    nbytes: usize,
    algo: Algorithm,
    proto: crate::Protocol,
    n_channels: i32,
) -> PResult<ROption<usize>> {
    call_guarded(|| P::get().get_chunk_size(ctx, coll, nbytes, algo, proto, n_channels).map(ROption::from))
}
extern "C" fn finalize_shim<P: TunerProvider>(ctx: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().finalize(ctx))
}

impl TunerV1 {
    /// The v1 table whose functions call `P::get()` (`comm_id` given as [`V1_COMM_ID`],
    /// `num_pipe_ops` as [`V1_NUM_PIPE_OPS`]).
    pub const fn table<P: TunerProvider>(name: &'static str) -> TunerV1 {
        TunerV1 {
            name: RStr::from_str(name),
            init: v1_init_shim::<P>,
            get_coll_info: v1_get_coll_info_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

impl TunerV2 {
    /// The v2 table whose functions call `P::get()`.
    pub const fn table<P: TunerProvider>(name: &'static str) -> TunerV2 {
        TunerV2 {
            name: RStr::from_str(name),
            init: v2_init_shim::<P>,
            get_coll_info: v2_get_coll_info_shim::<P>,
            get_chunk_size: v2_get_chunk_size_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

/// Exports a tuner from a cdylib at ABI version `v1` (symbol `rustccl_tuner_v1`, table
/// [`TunerV1`]) or `v2` (`rustccl_tuner_v2`, [`TunerV2`]).
///
/// `export_tuner!(v2, "name", Type, constructor_expr);` makes its own instance of `Type`
/// (built on first use). To share one instance between the v1 and v2 exports, implement
/// [`TunerProvider`] yourself and write `export_tuner!(v2, "name", provider = MyProvider);`
/// and `export_tuner!(v1, "name", provider = MyProvider);`; otherwise each export has its own
/// instance. [`export_tuner_v1!`](crate::export_tuner_v1) and
/// [`export_tuner_v2!`](crate::export_tuner_v2) are the same without the version argument.
#[macro_export]
macro_rules! export_tuner {
    (v1, $($rest:tt)*) => {
        $crate::export_tuner!(@table TunerV1, rustccl_tuner_v1, $($rest)*);
    };
    (v2, $($rest:tt)*) => {
        $crate::export_tuner!(@table TunerV2, rustccl_tuner_v2, $($rest)*);
    };
    (@table $table:ident, $symbol:ident, $name:expr, provider = $provider:path) => {
        const _: () = {
            static TABLE: $crate::tuner::$table = $crate::tuner::$table::table::<$provider>($name);
            #[no_mangle]
            #[used]
            #[allow(non_upper_case_globals)]
            pub static $symbol: $crate::export::PluginExport<$crate::tuner::$table> =
                $crate::export::PluginExport::new(&TABLE);
        };
    };
    (@table $table:ident, $symbol:ident, $name:expr, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            struct Provider;
            impl $crate::tuner::TunerProvider for Provider {
                fn get() -> &'static dyn $crate::tuner::Tuner {
                    INSTANCE.get_or_init(|| $ctor)
                }
            }
            $crate::export_tuner!(@table $table, $symbol, $name, provider = Provider);
        };
    };
}

/// [`export_tuner!`](crate::export_tuner)`(v1, ...)`: exports a tuner as ABI v1
/// (`rustccl_tuner_v1`): `export_tuner_v1!("name", Type, constructor_expr);` or
/// `export_tuner_v1!("name", provider = MyProvider);`.
#[macro_export]
macro_rules! export_tuner_v1 {
    ($($args:tt)*) => { $crate::export_tuner!(v1, $($args)*); };
}

/// [`export_tuner!`](crate::export_tuner)`(v2, ...)`: exports a tuner as ABI v2
/// (`rustccl_tuner_v2`), in the same two forms as [`export_tuner_v1!`](crate::export_tuner_v1).
#[macro_export]
macro_rules! export_tuner_v2 {
    ($($args:tt)*) => { $crate::export_tuner!(v2, $($args)*); };
}

fn into<T>(r: PResult<T>) -> Result<T, PluginError> {
    r.into_result()
}

/// A loaded library's v1 table, seen through the [`Tuner`] trait. Adapts: `comm_id` and
/// `num_pipe_ops` are not passed on, and `get_chunk_size` is always `Ok(None)` (the host
/// decides) without calling the plugin.
pub struct TunerV1Client {
    pub table: &'static TunerV1,
}

impl TunerV1Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

impl Tuner for TunerV1Client {
    fn init(&self, _comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError> {
        into((self.table.init)(nranks, nnodes, log))
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
        let (n_algo, n_proto) = (costs.n_algo(), costs.n_proto());
        let slice = RSliceMut::from_mut_slice(costs.as_mut_slice());
        into((self.table.get_coll_info)(ctx, coll, nbytes, slice, n_algo, n_proto, n_channels))
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.finalize)(ctx))
    }
}

/// A loaded library's v2 table, seen through the [`Tuner`] trait.
pub struct TunerV2Client {
    pub table: &'static TunerV2,
}

impl TunerV2Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

impl Tuner for TunerV2Client {
    fn init(&self, comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError> {
        into((self.table.init)(comm_id, nranks, nnodes, log))
    }
    fn get_coll_info(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<(), PluginError> {
        let (n_algo, n_proto) = (costs.n_algo(), costs.n_proto());
        let slice = RSliceMut::from_mut_slice(costs.as_mut_slice());
        into((self.table.get_coll_info)(ctx, coll, nbytes, num_pipe_ops, slice, n_algo, n_proto, n_channels))
    }
    fn get_chunk_size(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        algo: Algorithm,
        proto: crate::Protocol,
        n_channels: i32,
    ) -> Result<Option<usize>, PluginError> {
        into((self.table.get_chunk_size)(ctx, coll, nbytes, algo, proto, n_channels)).map(ROption::into_option)
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.finalize)(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HandleRegistry, Protocol};

    /// What the test tuner saw at init and at its last get_coll_info.
    #[derive(Debug, Default, Clone, PartialEq)]
    struct Seen {
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        num_pipe_ops: i32,
    }

    /// Sets Tree/LL128 to 0 and channels to 3; chunk size = nbytes / n_channels; panics for
    /// Reduce.
    struct TestTuner {
        states: HandleRegistry<Seen>,
    }

    impl Tuner for TestTuner {
        fn init(&self, comm_id: u64, nranks: usize, nnodes: usize, log: LogFn) -> Result<PluginHandle, PluginError> {
            log.info(crate::subsys::TUNING, "test tuner init");
            Ok(self.states.insert(Seen { comm_id, nranks, nnodes, num_pipe_ops: 0 }))
        }
        fn get_coll_info(
            &self,
            ctx: PluginHandle,
            coll: CollType,
            _nbytes: usize,
            num_pipe_ops: i32,
            costs: &mut CostTable<'_>,
            n_channels: &mut i32,
        ) -> Result<(), PluginError> {
            assert!(coll != CollType::Reduce, "reduce is not supported");
            self.states
                .with(ctx, |s| s.num_pipe_ops = num_pipe_ops)
                .ok_or_else(|| PluginError::invalid_argument("unknown ctx"))?;
            costs.set(Algorithm::Tree, Protocol::Ll128, 0.0);
            *n_channels = 3;
            Ok(())
        }
        fn get_chunk_size(
            &self,
            _ctx: PluginHandle,
            _coll: CollType,
            nbytes: usize,
            _algo: Algorithm,
            _proto: Protocol,
            n_channels: i32,
        ) -> Result<Option<usize>, PluginError> {
            Ok(Some(nbytes / n_channels as usize))
        }
        fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
            self.states.remove(ctx).map(drop).ok_or_else(|| PluginError::invalid_argument("unknown ctx"))
        }
    }

    static TUNER: TestTuner = TestTuner { states: HandleRegistry::new() };
    struct Provider;
    impl TunerProvider for Provider {
        fn get() -> &'static dyn Tuner {
            &TUNER
        }
    }
    static V1: TunerV1 = TunerV1::table::<Provider>("test");
    static V2: TunerV2 = TunerV2::table::<Provider>("test");

    // Both forms of the macro expand, for both versions (the symbols they export are not
    // nameable from here; the plugins' dlopen tests look them up).
    crate::export_tuner_v1!("macro-test", provider = Provider);
    crate::export_tuner!(v2, "macro-test", TestTuner, TestTuner { states: HandleRegistry::new() });

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}
    const LOG: LogFn = LogFn { log: quiet };

    fn run(t: &dyn Tuner, ctx: PluginHandle, coll: CollType) -> Result<(Vec<f32>, i32), PluginError> {
        let mut raw = vec![5.0f32; 7 * 3];
        raw[Algorithm::Tree.index() * 3 + Protocol::Ll.index()] = crate::ALGO_PROTO_IGNORE;
        let mut table = CostTable::new(&mut raw, 7, 3).unwrap();
        let mut ch = -1;
        t.get_coll_info(ctx, coll, 1 << 20, 4, &mut table, &mut ch)?;
        Ok((raw, ch))
    }

    #[test]
    fn v2_client_passes_everything() {
        let client = TunerV2Client { table: &V2 };
        assert_eq!(client.name(), "test");
        let ctx = client.init(77, 8, 2, LOG).unwrap();
        let (raw, ch) = run(&client, ctx, CollType::AllReduce).unwrap();
        assert_eq!(ch, 3);
        assert_eq!(raw[Algorithm::Tree.index() * 3 + Protocol::Ll128.index()], 0.0);
        assert_eq!(raw[0], crate::ALGO_PROTO_IGNORE);
        let seen = TUNER.states.with(ctx, |s| s.clone()).unwrap();
        assert_eq!(seen, Seen { comm_id: 77, nranks: 8, nnodes: 2, num_pipe_ops: 4 });
        assert_eq!(
            client.get_chunk_size(ctx, CollType::AllReduce, 1 << 20, Algorithm::Ring, Protocol::Simple, 4),
            Ok(Some(1 << 18))
        );
        client.finalize(ctx).unwrap();
        let err = client.finalize(ctx).unwrap_err();
        assert_eq!(err.code, PluginError::INVALID_ARGUMENT);
    }

    #[test]
    fn v1_client_adapts() {
        let client = TunerV1Client { table: &V1 };
        let ctx = client.init(77, 4, 1, LOG).unwrap();
        let (raw, ch) = run(&client, ctx, CollType::AllGather).unwrap();
        assert_eq!(ch, 3);
        assert_eq!(raw[Algorithm::Tree.index() * 3 + Protocol::Ll128.index()], 0.0);
        let seen = TUNER.states.with(ctx, |s| s.clone()).unwrap();
        assert_eq!(seen, Seen { comm_id: V1_COMM_ID, nranks: 4, nnodes: 1, num_pipe_ops: V1_NUM_PIPE_OPS });
        // v1 has no get_chunk_size: the host decides.
        assert_eq!(
            client.get_chunk_size(ctx, CollType::AllGather, 1 << 20, Algorithm::Ring, Protocol::Simple, 4),
            Ok(None)
        );
        client.finalize(ctx).unwrap();
    }

    #[test]
    fn panics_and_bad_tables_are_errors() {
        let client = TunerV2Client { table: &V2 };
        let ctx = client.init(1, 2, 1, LOG).unwrap();
        let err = run(&client, ctx, CollType::Reduce).unwrap_err();
        assert_eq!(err.code, PluginError::INTERNAL);
        assert!(err.message.contains("reduce is not supported"), "{err}");
        // A table whose length does not match n_algo x n_proto is refused by the shim.
        let mut raw = vec![1.0f32; 5];
        let mut ch = -1;
        let r = (V2.get_coll_info)(ctx, CollType::AllReduce, 1, 1, RSliceMut::from_mut_slice(&mut raw), 7, 3, &mut ch);
        let err = r.into_result().unwrap_err();
        assert_eq!(err.code, PluginError::INVALID_ARGUMENT);
        assert!(err.message.contains("expected 7 algorithms x 3 protocols"), "{err}");
        assert_eq!((raw, ch), (vec![1.0; 5], -1));
        client.finalize(ctx).unwrap();
    }

    #[test]
    fn exports_carry_their_layout() {
        use crate::export::{PluginExport, EXPORT_MAGIC};
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        static E1: PluginExport<TunerV1> = PluginExport::new(&V1);
        static E2: PluginExport<TunerV2> = PluginExport::new(&V2);
        assert_eq!(E2.magic, EXPORT_MAGIC);
        check_layout_compatibility(<TunerV2 as StableAbi>::LAYOUT, E2.layout).unwrap();
        check_layout_compatibility(<TunerV1 as StableAbi>::LAYOUT, E1.layout).unwrap();
        // v1 and v2 tables are not interchangeable.
        assert!(check_layout_compatibility(<TunerV2 as StableAbi>::LAYOUT, E1.layout).is_err());
        assert!(check_layout_compatibility(<TunerV1 as StableAbi>::LAYOUT, E2.layout).is_err());
    }
}

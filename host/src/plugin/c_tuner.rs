//! NCCL's C tuner plugins (`ncclTunerPlugin_v2` … `ncclTunerPlugin_v6`), seen through the
//! core's [`Tuner`] trait.
//!
//! Each version's exported table is declared here as `#[repr(C)]` (layouts from NCCL's
//! `src/include/plugin/tuner/tuner_vN.h`), and [`CTuner`] adapts whichever one a library
//! exports:
//!
//! | version | `init` | `getCollInfo` | other |
//! |---|---|---|---|
//! | 2 | `(nRanks, nNodes, logger, &ctx)` | returns `algorithm`, `protocol`, `nChannels`; gets `collNetSupport`, `nvlsSupport` | `destroy` |
//! | 3 | as v2 | edits the cost table | `destroy` |
//! | 4 | as v2 | as v3 plus `regBuff` | `destroy` |
//! | 5 | `(&ctx, commId, nRanks, nNodes, logger, nvlDomainInfo, constants)` | as v4 | `finalize` |
//! | 6 | as v5 | as v4 | `finalize`, optional `getChunkSize` |
//!
//! What the adapter does for the older shapes (as NCCL's own adapters do):
//! * v2: the pair it returns becomes the cheapest entry (cost 0) when that entry is usable;
//!   `collNetSupport` / `nvlsSupport` are read off the table (usable CollNet-chain entry;
//!   usable NVLS or NVLS-tree entry).
//! * v2–v4 get no communicator id; v2–v5 no chunk-size call (the host decides).
//! * The cost table crosses as NCCL passes it: the address of a contiguous
//!   `float[numAlgo][numProto]` array cast to `float**` (NCCL's own example tuner casts it
//!   back to `float (*)[numProto]`; it is not an array of row pointers). `numAlgo` = 7 and
//!   `numProto` = 3, with NCCL's ids, which are also rustccl's.
//! * `regBuff` (v4+) is 0: the planner does not register user buffers for a collective.
//! * v5+ `init` gets an `ncclNvlDomainInfo_v5_t` filled from the communicator (one domain per
//!   node; ranks per node from `nRanks / nNodes`) and an `ncclTunerConstants_v5_t` holding
//!   NCCL's default figures. rustccl's cost model has its own per-backend figures and does
//!   not read these: a tuner's edits to them are ignored, and an INFO line says so.
//! * An entry the host marked unusable (negative, e.g. `NCCL_ALGO_PROTO_IGNORE`) is put back
//!   if the tuner overwrote it: the host cannot run what it disabled.
//! * An error from `getCollInfo` / `getChunkSize` means "the host's default for this call";
//!   from `init` it disables the tuner for that communicator (the loader says so).
//! * `getChunkSize` (v6) is optional: NULL means the host decides. It is called with
//!   `*chunkSize` = 0 (the core's trait does not pass its own figure); a value left at 0
//!   means "the host decides", any other is the tuner's choice (the host clamps it).

use std::ffi::{c_char, c_int, c_void};

use rustccl_plugin_api::tuner::Tuner;
use rustccl_plugin_api::{
    is_usable_cost, Algorithm, CollType, CostTable, HandleRegistry, LogFn, PluginError, PluginHandle, Protocol,
};

use super::c_abi::{self, NcclDebugLogger};
use super::library::PluginLibrary;

/// NCCL's table dimensions (`NCCL_NUM_ALGORITHMS`, `NCCL_NUM_PROTOCOLS`).
pub const NCCL_NUM_ALGORITHMS: usize = 7;
pub const NCCL_NUM_PROTOCOLS: usize = 3;
/// Link kinds of `hwLatencies` (NVLink, PCI, network), compute-capability classes (Volta,
/// Ampere, Hopper, Blackwell) and node-count scales (1, 2, 4 nodes) of the v5 constants.
pub const NCCL_NUM_HW_LINKS: usize = 3;
pub const NCCL_NUM_COMPCAPS: usize = 4;
pub const NCCL_NUM_TUNING_SCALES: usize = 3;

/// C tuner ABI versions this host loads, newest first.
pub const C_TUNER_ABI_VERSIONS: &[u32] = &[6, 5, 4, 3, 2];

type Ctx = *mut c_void;
type InitOld = unsafe extern "C" fn(n_ranks: usize, n_nodes: usize, log: NcclDebugLogger, ctx: *mut Ctx) -> c_int;
type InitV5 = unsafe extern "C" fn(
    ctx: *mut Ctx,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: NcclDebugLogger,
    nvl: *mut NvlDomainInfoV5,
    constants: *mut TunerConstantsV5,
) -> c_int;
type CollInfoV2 = unsafe extern "C" fn(
    ctx: Ctx,
    coll: c_int,
    n_bytes: usize,
    coll_net_support: c_int,
    nvls_support: c_int,
    num_pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> c_int;
type CollInfoV3 = unsafe extern "C" fn(
    ctx: Ctx,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> c_int;
type CollInfoV4 = unsafe extern "C" fn(
    ctx: Ctx,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> c_int;
type Finalize = unsafe extern "C" fn(ctx: Ctx) -> c_int;
type ChunkSizeV6 = unsafe extern "C" fn(
    ctx: Ctx,
    coll: c_int,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> c_int;

/// `ncclTuner_v2_t` (exported as `ncclTunerPlugin_v2`).
#[repr(C)]
pub struct NcclTunerV2 {
    pub name: *const c_char,
    pub init: Option<InitOld>,
    pub get_coll_info: Option<CollInfoV2>,
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
pub struct NcclTunerV3 {
    pub name: *const c_char,
    pub init: Option<InitOld>,
    pub get_coll_info: Option<CollInfoV3>,
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct NcclTunerV4 {
    pub name: *const c_char,
    pub init: Option<InitOld>,
    pub get_coll_info: Option<CollInfoV4>,
    pub destroy: Option<Finalize>,
}

/// `ncclTuner_v5_t`.
#[repr(C)]
pub struct NcclTunerV5 {
    pub name: *const c_char,
    pub init: Option<InitV5>,
    pub get_coll_info: Option<CollInfoV4>,
    pub finalize: Option<Finalize>,
}

/// `ncclTuner_v6_t`: v5 plus the optional `getChunkSize`.
#[repr(C)]
pub struct NcclTunerV6 {
    pub name: *const c_char,
    pub init: Option<InitV5>,
    pub get_coll_info: Option<CollInfoV4>,
    pub finalize: Option<Finalize>,
    pub get_chunk_size: Option<ChunkSizeV6>,
}

/// `ncclNvlDomainInfo_v5_t` (also v6's).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlDomainInfoV5 {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

type PerCompCap = [[f64; NCCL_NUM_TUNING_SCALES]; NCCL_NUM_COMPCAPS];

/// `ncclTunerConstants_v5_t` (also v6's): the figures of NCCL's alpha-beta model.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunerConstantsV5 {
    pub base_latencies: [[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS],
    pub hw_latencies: [[[f64; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS]; NCCL_NUM_HW_LINKS],
    pub ll_max_bws: PerCompCap,
    pub per_ch_max_ring_ll128_bws: PerCompCap,
    pub per_ch_max_tree_ll128_bws: PerCompCap,
    pub per_ch_max_tree_bws: PerCompCap,
    pub per_ch_max_nvls_tree_bws: PerCompCap,
}

impl TunerConstantsV5 {
    /// NCCL's default figures (microseconds; GB/s), rows in NCCL's algorithm order (Tree,
    /// Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT) and protocol order (LL,
    /// LL128, Simple). Handed to a tuner for reference: rustccl's cost model does not read
    /// them.
    pub fn nccl_defaults() -> TunerConstantsV5 {
        const Z: [f64; 3] = [0.0; 3];
        TunerConstantsV5 {
            base_latencies: [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4], Z, Z, Z, Z, [8.0, 8.0, 8.0]],
            hw_latencies: [
                [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0.0, 0.0, 3.7], [0.0, 0.0, 2.8], [0.0, 0.0, 25.0], [0.0, 0.0, 25.0], [0.0, 0.0, 4.0]],
                [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0.0, 0.0, 3.7], [0.0, 0.0, 2.8], Z, Z, [0.0, 0.0, 4.0]],
                [[5.0, 8.5, 14.0], [2.7, 4.0, 14.0], [0.0, 0.0, 31.0], [0.0, 0.0, 30.0], [0.0, 0.0, 18.0], [0.0, 0.0, 20.9], [0.0, 0.0, 14.0]],
            ],
            ll_max_bws: [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]],
            per_ch_max_ring_ll128_bws: [[20.0; 3], [20.0; 3], [36.7; 3], [40.0; 3]],
            per_ch_max_tree_ll128_bws: [[20.0; 3], [20.0; 3], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]],
            per_ch_max_tree_bws: [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]],
            per_ch_max_nvls_tree_bws: [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]],
        }
    }
}

/// The domain info a v5+ tuner gets: one NVLink domain per node, ranks spread evenly.
pub fn nvl_domain_info(nranks: usize, nnodes: usize) -> NvlDomainInfoV5 {
    let nodes = nnodes.max(1);
    let clamp = |v: usize| v.min(c_int::MAX as usize) as c_int;
    NvlDomainInfoV5 {
        n_nvl_domains: clamp(nodes),
        min_ranks_per_nvl_domain: clamp(nranks / nodes),
        max_ranks_per_nvl_domain: clamp(nranks.div_ceil(nodes)),
    }
}

/// The version-specific table a [`CTuner`] calls.
#[derive(Clone, Copy)]
enum Table {
    V2 { init: InitOld, coll_info: CollInfoV2, finalize: Finalize },
    V3 { init: InitOld, coll_info: CollInfoV3, finalize: Finalize },
    V4 { init: InitOld, coll_info: CollInfoV4, finalize: Finalize },
    V5 { init: InitV5, coll_info: CollInfoV4, finalize: Finalize, chunk: Option<ChunkSizeV6> },
}

/// A plugin's context pointer (NULL is allowed: a tuner without state), with what v5+'s
/// init was given by address. NCCL passes `&comm->nvlDomainInfo` and `&comm->tunerConstants`,
/// alive as long as the communicator, so a tuner may keep the pointers: they stay here until
/// after the context's finalize. (The cost table of `getCollInfo` is the call's, as NCCL's.)
struct CtxPtr {
    ctx: Ctx,
    _given: Option<Box<(NvlDomainInfoV5, TunerConstantsV5)>>,
}
// SAFETY: the pointer is only handed back to the plugin that made it; NCCL, too, calls a
// tuner from whichever thread runs the communicator.
unsafe impl Send for CtxPtr {}

/// A C tuner table seen through the core's [`Tuner`] trait.
pub struct CTuner {
    pub name: String,
    pub version: u32,
    table: Table,
    contexts: HandleRegistry<CtxPtr>,
}

impl std::fmt::Debug for CTuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CTuner({} v{})", self.name, self.version)
    }
}

fn need<F>(f: Option<F>, symbol: &str, member: &str) -> Result<F, String> {
    c_abi::required(f, symbol, member, "tuner")
}

impl CTuner {
    /// The newest C tuner table `lib` exports (v6 first), checked for NULL mandatory members.
    /// `Ok(None)`: it exports none. A table with a NULL name or mandatory member is refused
    /// and an older one tried; the error lists every refusal.
    pub fn from_library(lib: &PluginLibrary) -> Result<Option<CTuner>, String> {
        c_abi::newest_table(C_TUNER_ABI_VERSIONS, |v| Self::version(lib, v))
    }

    fn version(lib: &PluginLibrary, v: u32) -> Result<Option<CTuner>, String> {
        let symbol = format!("ncclTunerPlugin_v{v}");
        let s = symbol.as_str();
        macro_rules! table {
            ($ty:ty) => {
                // SAFETY: `$ty` is the layout NCCL defines for `ncclTunerPlugin_v{v}`.
                match unsafe { c_abi::find_table::<$ty>(lib, s) } {
                    Some(t) => t,
                    None => return Ok(None),
                }
            };
        }
        let (name, table) = match v {
            2 => {
                let t = table!(NcclTunerV2);
                let table = Table::V2 {
                    init: need(t.init, s, "init")?,
                    coll_info: need(t.get_coll_info, s, "getCollInfo")?,
                    finalize: need(t.destroy, s, "destroy")?,
                };
                (c_abi::table_name(t.name, s)?, table)
            }
            3 => {
                let t = table!(NcclTunerV3);
                let table = Table::V3 {
                    init: need(t.init, s, "init")?,
                    coll_info: need(t.get_coll_info, s, "getCollInfo")?,
                    finalize: need(t.destroy, s, "destroy")?,
                };
                (c_abi::table_name(t.name, s)?, table)
            }
            4 => {
                let t = table!(NcclTunerV4);
                let table = Table::V4 {
                    init: need(t.init, s, "init")?,
                    coll_info: need(t.get_coll_info, s, "getCollInfo")?,
                    finalize: need(t.destroy, s, "destroy")?,
                };
                (c_abi::table_name(t.name, s)?, table)
            }
            5 => {
                let t = table!(NcclTunerV5);
                let table = Table::V5 {
                    init: need(t.init, s, "init")?,
                    coll_info: need(t.get_coll_info, s, "getCollInfo")?,
                    finalize: need(t.finalize, s, "finalize")?,
                    chunk: None,
                };
                (c_abi::table_name(t.name, s)?, table)
            }
            6 => {
                let t = table!(NcclTunerV6);
                let table = Table::V5 {
                    init: need(t.init, s, "init")?,
                    coll_info: need(t.get_coll_info, s, "getCollInfo")?,
                    finalize: need(t.finalize, s, "finalize")?,
                    chunk: t.get_chunk_size,
                };
                (c_abi::table_name(t.name, s)?, table)
            }
            _ => return Ok(None),
        };
        Ok(Some(CTuner { name, version: v, table, contexts: HandleRegistry::new() }))
    }

    fn ctx(&self, h: PluginHandle) -> Result<Ctx, PluginError> {
        self.contexts.with(h, |c| c.ctx).ok_or_else(|| self.unknown(h))
    }

    fn unknown(&self, h: PluginHandle) -> PluginError {
        PluginError::invalid_argument(format!("C tuner {}: unknown context {}", self.name, h.id))
    }

    fn what(&self, call: &str) -> String {
        format!("{} (NCCL C tuner v{}) {call}", self.name, self.version)
    }
}

/// NCCL's "no choice" for the v2 outputs (`NCCL_ALGO_UNDEF`, `NCCL_PROTO_UNDEF`).
const UNDEF: c_int = -1;

impl Tuner for CTuner {
    fn init(&self, comm_id: u64, nranks: usize, nnodes: usize, _log: LogFn) -> Result<PluginHandle, PluginError> {
        let mut ctx: Ctx = std::ptr::null_mut();
        let mut given = None;
        let log = c_abi::logger();
        let code = match self.table {
            Table::V2 { init, .. } | Table::V3 { init, .. } | Table::V4 { init, .. } => {
                // SAFETY: a mandatory member of the plugin's table, called with its
                // documented arguments; `ctx` outlives the call.
                unsafe { init(nranks, nnodes, log, &mut ctx) }
            }
            Table::V5 { init, .. } => {
                let defaults = TunerConstantsV5::nccl_defaults();
                let (nvl, constants) = &mut **given.insert(Box::new((nvl_domain_info(nranks, nnodes), defaults)));
                // SAFETY: as above; both structs are boxed, kept with the context until after
                // its finalize.
                let code = unsafe { init(&mut ctx, comm_id, nranks, nnodes, log, nvl, constants) };
                if code == c_abi::result::SUCCESS && *constants != defaults {
                    tracing::info!(
                        target: "TUNING",
                        "TUNER/Plugin: {} changed ncclTunerConstants at init; rustccl's cost model has its own figures and ignores them (the tuner's getCollInfo still applies)",
                        self.name
                    );
                }
                code
            }
        };
        c_abi::check(code, &self.what("init"))?;
        Ok(self.contexts.insert(CtxPtr { ctx, _given: given }))
    }

    fn get_coll_info(
        &self,
        h: PluginHandle,
        coll: CollType,
        nbytes: usize,
        num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<(), PluginError> {
        let ctx = self.ctx(h)?;
        if costs.n_algo() != NCCL_NUM_ALGORITHMS || costs.n_proto() != NCCL_NUM_PROTOCOLS {
            return Err(PluginError::invalid_argument(format!(
                "{}: the cost table is {}x{}, NCCL's tuner ABI has {NCCL_NUM_ALGORITHMS}x{NCCL_NUM_PROTOCOLS}",
                self.what("getCollInfo"),
                costs.n_algo(),
                costs.n_proto()
            )));
        }
        let coll_id = coll.index() as c_int;
        let what = self.what("getCollInfo");
        if let Table::V2 { coll_info, .. } = self.table {
            let usable = |a: Algorithm, p: Protocol| costs.get(a, p).is_some_and(is_usable_cost);
            let coll_net = usable(Algorithm::CollNetChain, Protocol::Simple) as c_int;
            let nvls = (usable(Algorithm::Nvls, Protocol::Simple) || usable(Algorithm::NvlsTree, Protocol::Simple)) as c_int;
            let (mut algo, mut proto, mut ch) = (UNDEF, UNDEF, *n_channels);
            // SAFETY: a mandatory member; every pointer is to a local alive for the call.
            let code = unsafe { coll_info(ctx, coll_id, nbytes, coll_net, nvls, num_pipe_ops, &mut algo, &mut proto, &mut ch) };
            c_abi::check(code, &what)?;
            let pick = usize::try_from(algo).ok().and_then(Algorithm::from_index).zip(usize::try_from(proto).ok().and_then(Protocol::from_index));
            if let Some((a, p)) = pick {
                costs.set(a, p, 0.0);
            }
            *n_channels = ch;
            return Ok(());
        }
        // v3+: the tuner edits the table in place; entries the host disabled are restored.
        let before: Vec<f32> = costs.as_slice().to_vec();
        let table = costs.as_mut_slice().as_mut_ptr() as *mut *mut f32;
        let (na, np) = (NCCL_NUM_ALGORITHMS as c_int, NCCL_NUM_PROTOCOLS as c_int);
        let mut ch = *n_channels;
        let code = match self.table {
            // SAFETY: a mandatory member; `table` is the address of a contiguous
            // float[7][3] array (as NCCL passes it), alive and exclusively ours for the call.
            Table::V3 { coll_info, .. } => unsafe { coll_info(ctx, coll_id, nbytes, num_pipe_ops, table, na, np, &mut ch) },
            // SAFETY: as above; regBuff 0 (no registered user buffer).
            Table::V4 { coll_info, .. } | Table::V5 { coll_info, .. } => unsafe {
                coll_info(ctx, coll_id, nbytes, num_pipe_ops, table, na, np, 0, &mut ch)
            },
            Table::V2 { .. } => unreachable!("handled above"),
        };
        let slice = costs.as_mut_slice();
        let mut restored = 0;
        for (now, was) in slice.iter_mut().zip(&before) {
            if !is_usable_cost(*was) && now.to_bits() != was.to_bits() {
                *now = *was;
                restored += 1;
            }
        }
        if restored > 0 {
            tracing::trace!(target: "TUNING", "{what}: put back {restored} cost entries the host had disabled");
        }
        if code != c_abi::result::SUCCESS {
            slice.copy_from_slice(&before);
        }
        c_abi::check(code, &what)?;
        *n_channels = ch;
        Ok(())
    }

    fn get_chunk_size(
        &self,
        h: PluginHandle,
        coll: CollType,
        nbytes: usize,
        algo: Algorithm,
        proto: Protocol,
        n_channels: i32,
    ) -> Result<Option<usize>, PluginError> {
        let Table::V5 { chunk: Some(chunk), .. } = self.table else { return Ok(None) };
        let ctx = self.ctx(h)?;
        let mut size = 0usize;
        // SAFETY: the optional member is non-NULL here; `size` outlives the call.
        let code = unsafe {
            chunk(ctx, coll.index() as c_int, nbytes, algo.index() as c_int, proto.index() as c_int, n_channels, &mut size)
        };
        c_abi::check(code, &self.what("getChunkSize"))?;
        Ok((size > 0).then_some(size))
    }

    fn finalize(&self, h: PluginHandle) -> Result<(), PluginError> {
        let kept = self.contexts.remove(h).ok_or_else(|| self.unknown(h))?;
        let finalize = match self.table {
            Table::V2 { finalize, .. } | Table::V3 { finalize, .. } | Table::V4 { finalize, .. } | Table::V5 { finalize, .. } => finalize,
        };
        // SAFETY: a mandatory member, given the context its init made, once; what its init
        // was given by address is still alive (`kept`, dropped after the call).
        let code = unsafe { finalize(kept.ctx) };
        drop(kept);
        c_abi::check(code, &self.what("finalize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nccl_headers() {
        use std::mem::{offset_of, size_of};
        let p = size_of::<usize>();
        assert_eq!(size_of::<NcclTunerV2>(), 4 * p);
        assert_eq!(size_of::<NcclTunerV5>(), 4 * p);
        assert_eq!(size_of::<NcclTunerV6>(), 5 * p);
        assert_eq!(offset_of!(NcclTunerV6, get_chunk_size), 4 * p);
        assert_eq!(size_of::<NvlDomainInfoV5>(), 12);
        // 21 + 63 doubles, then five 4x3 tables.
        assert_eq!(size_of::<TunerConstantsV5>(), (21 + 63 + 5 * 12) * 8);
        assert_eq!(offset_of!(TunerConstantsV5, ll_max_bws), (21 + 63) * 8);
    }

    #[test]
    fn domain_info_spreads_ranks_over_nodes() {
        assert_eq!(nvl_domain_info(8, 2), NvlDomainInfoV5 { n_nvl_domains: 2, min_ranks_per_nvl_domain: 4, max_ranks_per_nvl_domain: 4 });
        assert_eq!(nvl_domain_info(5, 2), NvlDomainInfoV5 { n_nvl_domains: 2, min_ranks_per_nvl_domain: 2, max_ranks_per_nvl_domain: 3 });
        assert_eq!(nvl_domain_info(3, 0).n_nvl_domains, 1);
    }

    #[test]
    fn defaults_are_nccl_figures() {
        let c = TunerConstantsV5::nccl_defaults();
        assert_eq!(c.base_latencies[Algorithm::Ring.index()][Protocol::Simple.index()], 8.4);
        assert_eq!(c.hw_latencies[2][Algorithm::Tree.index()][Protocol::Ll.index()], 5.0);
        assert_eq!(c.per_ch_max_tree_bws[2][1], 41.4);
    }
}

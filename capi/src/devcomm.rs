//! Device communicators (NCCL 2.28's device API, the LSA subset; `include/nccl_device.h`):
//! `ncclDevCommCreate` gives every rank a block of resource memory (the LSA barrier of the
//! device communicator, then the resource requirements in list order), registered as a window
//! so each rank reaches every LSA peer's copy at `resourceFlatBase + peer × stride`. Kernels
//! (and host C++, on the host backend) use it through the header's inline functions; the
//! library only lays it out, makes it, and frees it. Requirements for hardware rustccl does
//! not drive are refused before anything is allocated, with NCCL 2.28's codes for a system
//! without it (`refuse_missing_hardware`): multimem (NVLS) and GIN.
//!
//! Each device communicator names a record of this library (`internal`), kept in a live set
//! so a destroyed, copied-after-destroy or foreign one is an error, not a crash.

use std::collections::HashSet;
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::window::Window;
use rustccl::Error;

use crate::handles::{self, CommHandle};
use crate::NcclTeam;

/// `NCCL_API_MAGIC`: what `NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER` writes, and what a device
/// communicator carries.
const API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_VERSION_CODE` of nccl.h (written into each device communicator).
const VERSION_CODE: c_uint = rustccl::version::NCCL_VERSION_CODE as c_uint;
/// The smallest requirements layout with a `size` field (2.29.2's: up to `ginCounterCount`).
/// Later headers add fields at the end: 2.29.7 (88 bytes), 2.30 (96), 2.31–2.32.3 (120).
const MIN_REQS_SIZE: usize = 72;
/// Resources are aligned to this at least (the barriers' 32-bit words, and room for vectors).
const MIN_ALIGN: usize = 16;
/// Resource memory is allocated in pages.
const PAGE: usize = 4096;
/// Longest requirements list walked (a longer one is taken for a cycle).
const MAX_LIST: usize = 1 << 16;

/// `ncclDevResourceRequirements`.
#[repr(C)]
pub struct DevResourceRequirements {
    next: *mut DevResourceRequirements,
    buffer_size: usize,
    buffer_align: usize,
    out_buffer_handle: *mut u32,
    gin_signal_count: c_int,
    gin_counter_count: c_int,
    out_gin_signal_start: *mut u32,
    out_gin_counter_start: *mut u32,
}

/// `ncclTeamRequirements`.
#[repr(C)]
pub struct TeamRequirements {
    next: *mut TeamRequirements,
    team: NcclTeam,
    multimem: u8,
    out_multimem_handle: *mut c_void,
}

/// `ncclDevCommRequirements` (NCCL 2.32.3's layout, 2.31's; C `bool`s read as bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DevCommRequirements {
    size: usize,
    magic: c_uint,
    version: c_uint,
    resource_requirements_list: *mut DevResourceRequirements,
    team_requirements_list: *mut TeamRequirements,
    lsa_multimem: u8,
    barrier_count: c_int,
    lsa_barrier_count: c_int,
    rail_gin_barrier_count: c_int,
    lsa_lla2a_block_count: c_int,
    lsa_lla2a_slot_count: c_int,
    gin_force_enable: u8,
    gin_context_count: c_int,
    gin_signal_count: c_int,
    gin_counter_count: c_int,
    gin_connection_type: c_int,
    gin_exclusive_contexts: u8,
    gin_queue_depth: c_int,
    gin_traffic_class: c_int,
    world_gin_barrier_count: c_int,
    gin_strong_signals_required: u8,
    gin_va_signals_required: u8,
    // 2.31
    gin_custom_stride: c_int,
    gin_type: c_int,
    use_runtime_version: u8,
    cft_caps: c_int,
    cft_barrier_count: c_int,
}

impl DevCommRequirements {
    /// `NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER`: what fields past a caller's `size` are.
    fn initializer() -> DevCommRequirements {
        DevCommRequirements {
            size: std::mem::size_of::<DevCommRequirements>(),
            magic: API_MAGIC,
            version: VERSION_CODE,
            resource_requirements_list: std::ptr::null_mut(),
            team_requirements_list: std::ptr::null_mut(),
            lsa_multimem: 0,
            barrier_count: 0,
            lsa_barrier_count: 0,
            rail_gin_barrier_count: 0,
            lsa_lla2a_block_count: 0,
            lsa_lla2a_slot_count: 0,
            gin_force_enable: 0,
            gin_context_count: 4,
            gin_signal_count: 0,
            gin_counter_count: 0,
            gin_connection_type: 0,
            gin_exclusive_contexts: 0,
            gin_queue_depth: 0,
            gin_traffic_class: c_int::MIN,
            world_gin_barrier_count: 0,
            gin_strong_signals_required: 1,
            gin_va_signals_required: 1,
            gin_custom_stride: 1,
            gin_type: 0,
            use_runtime_version: 0,
            cft_caps: 0,
            cft_barrier_count: 0,
        }
    }
}

/// `ncclLsaBarrierHandle`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct LsaBarrierHandle {
    buf_handle: u32,
    n_barriers: c_int,
}

/// `ncclDevComm` (rustccl's layout; see nccl_device.h).
#[repr(C)]
pub struct DevComm {
    magic: c_uint,
    version: c_uint,
    rank: c_int,
    n_ranks: c_int,
    lsa_rank: c_int,
    lsa_size: c_int,
    resource_flat_base: u64,
    stride: u64,
    resource_bytes: u64,
    lsa_barrier: LsaBarrierHandle,
    abort_flag: u64,
    internal: u64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<DevResourceRequirements>() == 56);
const _: () = assert!(std::mem::size_of::<TeamRequirements>() == 32);
const _: () = assert!(std::mem::size_of::<DevCommRequirements>() == 120);
const _: () = assert!(std::mem::offset_of!(DevCommRequirements, gin_custom_stride) == 96);
const _: () = assert!(std::mem::offset_of!(DevCommRequirements, cft_caps) == 108);
const _: () = assert!(std::mem::size_of::<DevComm>() == 136);

/// What a device communicator's `internal` names.
struct Record {
    /// The communicator's handle (a token, never reused).
    comm: usize,
    window: Window,
    mem: DevicePtr,
    backend: Arc<dyn DeviceBackend>,
}

/// Live records, by address.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Bytes of `n` barriers over `ranks` ranks: an epoch each, and an inbox per rank each.
fn barrier_bytes(n: c_int, ranks: c_int) -> Option<usize> {
    let (n, ranks) = (usize::try_from(n).ok()?, usize::try_from(ranks).ok()?);
    n.checked_mul(ranks.checked_add(1)?)?.checked_mul(4)
}

/// `ncclLsaBarrierCreateRequirement`.
pub fn lsa_barrier_requirement(
    team: NcclTeam, n: c_int, out_handle: *mut LsaBarrierHandle, out_req: *mut DevResourceRequirements,
) -> Result<(), Error> {
    if out_handle.is_null() || out_req.is_null() {
        return Err(Error::invalid_argument("outHandle or outReq is NULL"));
    }
    if n <= 0 {
        return Err(Error::invalid_argument(format!("nBarriers is {n}: ask for at least one barrier")));
    }
    if team.n_ranks <= 0 {
        return Err(Error::invalid_argument(format!(
            "team has {} ranks: pass a team from ncclTeamLsa or ncclTeamWorld",
            team.n_ranks
        )));
    }
    let bytes = barrier_bytes(n, team.n_ranks)
        .filter(|b| *b <= u32::MAX as usize)
        .ok_or_else(|| Error::invalid_argument(format!("{n} barriers over {} ranks need over 4 GiB", team.n_ranks)))?;
    // SAFETY: checked non-null; the caller's struct of this layout (nccl_device.h).
    let buf_handle = unsafe {
        (*out_handle).n_barriers = n;
        std::ptr::addr_of_mut!((*out_handle).buf_handle)
    };
    // SAFETY: checked non-null.
    unsafe { write_requirement(out_req, bytes, buf_handle) };
    Ok(())
}

/// `ncclLLA2AHandle` (NCCL 2.30).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct LlA2aHandle {
    buf_handle: u32,
    n_slots: u32,
}

/// Bytes of an LL all-to-all buffer of `blocks` blocks of `slots` slots: per block a header
/// line and two halves of `slots` 16-byte lines (see nccl_device.h's `ncclLLA2AHandle`).
fn lla2a_bytes(blocks: c_int, slots: c_int) -> Option<usize> {
    let (blocks, slots) = (usize::try_from(blocks).ok()?, usize::try_from(slots).ok()?);
    slots.checked_mul(2)?.checked_add(1)?.checked_mul(blocks)?.checked_mul(16)
}

/// `ncclLLA2ACreateRequirement`: `nBlocks` blocks of `nSlots` slots, as NCCL 2.30 sizes them
/// (the sessions live in nccl_device.h). The handle's `bufHandle` is written by
/// `ncclDevCommCreate`, whose zeroed memory starts every block at its first epoch.
pub fn lla2a_requirement(
    blocks: c_int, slots: c_int, out_handle: *mut LlA2aHandle, out_req: *mut DevResourceRequirements,
) -> Result<(), Error> {
    if out_handle.is_null() || out_req.is_null() {
        return Err(Error::invalid_argument("outHandle or outReq is NULL"));
    }
    if blocks <= 0 || slots <= 0 {
        return Err(Error::invalid_argument(format!(
            "nBlocks {blocks} and nSlots {slots}: both must be at least 1 (nSlots from \
             ncclLLA2ACalcSlots)"
        )));
    }
    let bytes = lla2a_bytes(blocks, slots).filter(|b| *b <= u32::MAX as usize).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{blocks} blocks of {slots} slots need over 4 GiB of resource memory per rank"
        ))
    })?;
    // SAFETY: checked non-null; the caller's struct of this layout (nccl_device.h).
    let buf_handle = unsafe {
        out_handle.write(LlA2aHandle { buf_handle: 0, n_slots: slots as u32 });
        std::ptr::addr_of_mut!((*out_handle).buf_handle)
    };
    // SAFETY: checked non-null.
    unsafe { write_requirement(out_req, bytes, buf_handle) };
    Ok(())
}

/// A requirement of `bytes` bytes (aligned to [`MIN_ALIGN`], no GIN) whose offset
/// `ncclDevCommCreate` writes to `*buf_handle`.
///
/// # Safety
/// `out_req` is non-null and writable (the caller's `ncclDevResourceRequirements_t`).
unsafe fn write_requirement(out_req: *mut DevResourceRequirements, bytes: usize, buf_handle: *mut u32) {
    // SAFETY: the function's contract.
    unsafe {
        out_req.write(DevResourceRequirements {
            next: std::ptr::null_mut(),
            buffer_size: bytes,
            buffer_align: MIN_ALIGN,
            out_buffer_handle: buf_handle,
            gin_signal_count: 0,
            gin_counter_count: 0,
            out_gin_signal_start: std::ptr::null_mut(),
            out_gin_counter_start: std::ptr::null_mut(),
        })
    };
}

/// Writes a requirement for `bytes` of resource memory aligned to `align`, whose handle
/// `ncclDevCommCreate` stores at `out_buffer_handle` (no GIN signals or counters): what the
/// barrier requirements of other kinds (`crate::cft_api`) hand out.
///
/// # Safety
/// `out_req` is non-null and points to an `ncclDevResourceRequirements_t`.
pub(crate) unsafe fn write_memory_requirement(out_req: *mut DevResourceRequirements, bytes: usize, align: usize, out_buffer_handle: *mut u32) {
    let req = DevResourceRequirements { buffer_size: bytes, buffer_align: align, out_buffer_handle, ..DevResourceRequirements::none() };
    // SAFETY: the caller's contract.
    unsafe { out_req.write(req) };
}

impl DevResourceRequirements {
    /// All zeroes and NULLs, as NCCL's requirement calls start from.
    fn none() -> Self {
        DevResourceRequirements {
            next: std::ptr::null_mut(),
            buffer_size: 0,
            buffer_align: 0,
            out_buffer_handle: std::ptr::null_mut(),
            gin_signal_count: 0,
            gin_counter_count: 0,
            out_gin_signal_start: std::ptr::null_mut(),
            out_gin_counter_start: std::ptr::null_mut(),
        }
    }
}

/// The caller's requirements: `size` bytes of them, the initializer's values past that.
///
/// # Safety
/// `reqs` is non-null and points to at least its own `size` bytes (the caller's contract).
unsafe fn read_requirements(reqs: *const DevCommRequirements) -> Result<DevCommRequirements, Error> {
    // SAFETY: every layout of the struct starts with its size (the caller's contract).
    let size = unsafe { (reqs as *const usize).read_unaligned() };
    if size < MIN_REQS_SIZE {
        return Err(Error::invalid_argument(format!(
            "reqs->size is {size}, smaller than any ncclDevCommRequirements_t with a size ({MIN_REQS_SIZE} bytes): \
             initialize it with NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER"
        )));
    }
    let mut r = DevCommRequirements::initializer();
    let n = size.min(std::mem::size_of::<DevCommRequirements>());
    // SAFETY: the caller's struct holds `size` ≥ `n` bytes; `r` holds `n` bytes; every byte
    // pattern is a valid value of each field (integers and raw pointers; bools read as u8).
    unsafe { std::ptr::copy_nonoverlapping(reqs as *const u8, std::ptr::addr_of_mut!(r) as *mut u8, n) };
    if r.magic != API_MAGIC {
        return Err(Error::invalid_usage(format!(
            "reqs->magic is {:#x}, not NCCL_API_MAGIC: initialize ncclDevCommRequirements_t with \
             NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER",
            r.magic
        )));
    }
    crate::cft_api::refuse_cft_requirements(r.cft_caps, r.cft_barrier_count)?;
    if r.use_runtime_version != 0 {
        // NCCL then lays the device communicator out as its own version does; rustccl's has one
        // layout, of `devCommRuntimeVersionSize` bytes, so nothing changes.
        tracing::debug!(target: "INIT", "ncclDevCommCreate: useRuntimeVersion (one ncclDevComm layout, {} bytes)", std::mem::size_of::<DevComm>());
    }
    Ok(r)
}

/// NCCL's answer where the system has no NVLS multicast (`symTeamObtain`: "Multicast support
/// requested for team but none available on system."): `ncclInvalidArgument`.
fn no_multimem(asked: &str) -> Error {
    Error::invalid_argument(format!(
        "{asked} asks for multimem, which needs NVLink SHARP multicast (NVLS) hardware: rustccl drives none \
         (ncclCommQueryProperties reports multimemSupport false); leave lsaMultimem and the team requirements' \
         multimem false and use unicast LSA pointers and barriers"
    ))
}

/// NCCL's answer where the system has no GIN-capable network (`ncclGinConnectOnce`: "GIN not
/// supported."): `ncclInvalidUsage`.
pub(crate) fn no_gin(asked: &str) -> Error {
    Error::invalid_usage(format!(
        "{asked} asks for GIN (GPU-initiated networking), which needs a GIN-capable network device (a NIC NCCL's GIN \
         plugin drives): rustccl drives none (ncclCommQueryProperties reports ginType NCCL_GIN_TYPE_NONE); \
         leave the gin* fields, GIN barrier counts and resource GIN signals and counters at 0, and use LSA barriers"
    ))
}

/// Checks the counts (`lsaLLA2ABlockCount` / `lsaLLA2ASlotCount` are not read: NCCL ignores
/// them too, its LL all-to-all takes a resource requirement, `lla2a_requirement`), then refuses what needs
/// hardware rustccl does not drive, in NCCL 2.28.9's order (`ncclDevrCommCreateInternal`): GIN
/// first (`ncclInvalidUsage`), then multimem on the LSA team and on each team requirement
/// (`ncclInvalidArgument`). Runs before anything is allocated, so a refusal makes no memory
/// and no multicast object.
///
/// # Safety
/// `teams` and `resources` are nodes of the caller's lists (readable).
unsafe fn refuse_missing_hardware(
    r: &DevCommRequirements, teams: &[*mut TeamRequirements], resources: &[*mut DevResourceRequirements],
    lsa_world: bool,
) -> Result<(), Error> {
    let counts = [
        ("barrierCount", r.barrier_count),
        ("lsaBarrierCount", r.lsa_barrier_count),
        ("railGinBarrierCount", r.rail_gin_barrier_count),
        ("ginSignalCount", r.gin_signal_count),
        ("ginCounterCount", r.gin_counter_count),
        ("worldGinBarrierCount", r.world_gin_barrier_count),
    ];
    if let Some((name, v)) = counts.iter().find(|(_, v)| *v < 0) {
        return Err(Error::invalid_argument(format!("reqs->{name} is {v}: counts cannot be negative")));
    }
    let gin = [
        ("ginForceEnable", r.gin_force_enable != 0),
        ("ginSignalCount", r.gin_signal_count > 0),
        ("ginCounterCount", r.gin_counter_count > 0),
        ("ginConnectionType", r.gin_connection_type != 0),
        ("railGinBarrierCount", r.rail_gin_barrier_count > 0),
        ("worldGinBarrierCount", r.world_gin_barrier_count > 0),
    ];
    if let Some((name, _)) = gin.iter().find(|(_, asked)| *asked) {
        return Err(no_gin(&format!("reqs->{name}")));
    }
    if r.barrier_count > 0 && !lsa_world {
        return Err(no_gin(
            "reqs->barrierCount (world barriers, where the LSA team is not every rank; use lsaBarrierCount instead)",
        ));
    }
    for (i, &x) in resources.iter().enumerate() {
        // SAFETY: a node of the caller's list (the function's contract).
        let x = unsafe { &*x };
        if x.gin_signal_count != 0 || x.gin_counter_count != 0 {
            return Err(no_gin(&format!("resource requirement {i} (ginSignalCount, ginCounterCount)")));
        }
    }
    if r.lsa_multimem != 0 {
        return Err(no_multimem("reqs->lsaMultimem"));
    }
    // SAFETY: nodes of the caller's list (the function's contract).
    if let Some(i) = teams.iter().position(|t| unsafe { (**t).multimem } != 0) {
        return Err(no_multimem(&format!("team requirement {i}")));
    }
    Ok(())
}

/// Places resources one after another in the resource memory.
struct Layout {
    end: usize,
}

impl Layout {
    /// Offset of `bytes` aligned to `align` (a power of two, at least [`MIN_ALIGN`]).
    fn place(&mut self, bytes: usize, align: usize) -> Result<usize, Error> {
        let at = self.end.checked_next_multiple_of(align);
        let end = at.and_then(|a| a.checked_add(bytes)).filter(|e| *e <= u32::MAX as usize);
        let (Some(at), Some(end)) = (at, end) else {
            return Err(Error::invalid_argument("the resource requirements add up to over 4 GiB per rank"));
        };
        self.end = end;
        Ok(at)
    }
}

/// Walks a C list through `next`, refusing a cycle (or an absurdly long list).
///
/// # Safety
/// Each node is a valid, readable node of the caller's list.
unsafe fn walk<T>(head: *mut T, next: impl Fn(&T) -> *mut T, what: &str) -> Result<Vec<*mut T>, Error> {
    let mut nodes = Vec::new();
    let mut p = head;
    while !p.is_null() {
        if nodes.len() == MAX_LIST {
            return Err(Error::invalid_argument(format!("{what} has over {MAX_LIST} entries (a cycle?)")));
        }
        nodes.push(p);
        // SAFETY: a node of the caller's list (the contract above).
        p = next(unsafe { &*p });
    }
    Ok(nodes)
}

/// `ncclDevCommCreate` (collective).
///
/// # Safety
/// `reqs` and `out` are NULL or valid for their structs, and the lists in `reqs` are valid.
pub unsafe fn create(comm: CommHandle, reqs: *const DevCommRequirements, out: *mut DevComm) -> Result<(), Error> {
    let c = handles::get(comm, "ncclDevCommCreate")?;
    if reqs.is_null() {
        return Err(Error::invalid_argument(
            "reqs is NULL: pass an ncclDevCommRequirements_t initialized with NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER",
        ));
    }
    if out.is_null() {
        return Err(Error::invalid_argument("outDevComm is NULL"));
    }
    // SAFETY: checked non-null; the caller's struct.
    let r = unsafe { read_requirements(reqs)? };
    let lsa_world = crate::mem_api::lsa_is_world(&c.comm);
    // SAFETY: the caller's lists (the function's contract).
    let teams = unsafe { walk(r.team_requirements_list, |t| t.next, "teamRequirementsList")? };
    // SAFETY: the caller's list.
    let resources = unsafe { walk(r.resource_requirements_list, |x| x.next, "resourceRequirementsList")? };
    // SAFETY: nodes of the caller's lists, just walked.
    unsafe { refuse_missing_hardware(&r, &teams, &resources, lsa_world)? };
    let (rank, nranks) = (c.comm.user_rank()?, c.comm.count()?);
    let (lsa_rank, lsa_size) = if lsa_world { (rank, nranks) } else { (0, 1) };

    // The device communicator's own LSA barrier, then the list in order.
    let mut layout = Layout { end: 0 };
    let n_barriers = r.lsa_barrier_count.max(if lsa_world { r.barrier_count } else { 0 });
    let barrier_at = if n_barriers > 0 {
        let bytes = barrier_bytes(n_barriers, lsa_size)
            .ok_or_else(|| Error::invalid_argument(format!("{n_barriers} LSA barriers need over 4 GiB per rank")))?;
        layout.place(bytes, MIN_ALIGN)?
    } else {
        0
    };
    let mut placed = Vec::with_capacity(resources.len());
    for (i, &x) in resources.iter().enumerate() {
        // SAFETY: a node of the caller's list.
        let x = unsafe { &*x };
        let align = x.buffer_align.max(MIN_ALIGN);
        if !align.is_power_of_two() {
            return Err(Error::invalid_argument(format!(
                "resource requirement {i}: bufferAlign {} is not a power of two",
                x.buffer_align
            )));
        }
        placed.push(layout.place(x.buffer_size, align)?);
    }
    let bytes = layout.end.max(1).next_multiple_of(PAGE);

    // Every rank's resource memory, zeroed before any peer can reach it (registration is
    // collective, so no rank returns before every rank zeroed its own).
    let backend = c.comm.backend().clone();
    let device = usize::try_from(c.comm.device()?).map_err(|_| Error::internal("the communicator's device is negative"))?;
    let mem = backend.window_memory_or_err("the device communicator's resource memory")?.alloc_symmetric(device, bytes)?;
    let zeroed = backend.memset(mem, 0, bytes, Stream::DEFAULT).and_then(|_| backend.synchronize(Stream::DEFAULT));
    let window = match zeroed.and_then(|_| c.comm.window_register(mem, bytes, 0)) {
        Ok(w) => w,
        Err(e) => {
            let _ = backend.free(mem);
            return Err(e.context("making the device communicator's resource memory"));
        }
    };
    let base = match usize::try_from(rank - lsa_rank).map_err(|_| Error::internal("LSA rank above world rank")) {
        Ok(r0) => window.peer_ptr(r0, 0),
        Err(e) => Err(e),
    };
    let base = match base {
        Ok(b) => b,
        Err(e) => {
            let _ = c.comm.window_deregister(&window);
            let _ = backend.free(mem);
            return Err(e);
        }
    };
    let stride = window.stride();
    let record = Box::into_raw(Box::new(Record { comm: comm as usize, window, mem, backend }));
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashSet::new).insert(record as usize);

    for (&x, at) in resources.iter().zip(placed) {
        // SAFETY: nodes of the caller's list; their output pointers are NULL or the caller's.
        unsafe {
            if !(*x).out_buffer_handle.is_null() {
                *(*x).out_buffer_handle = at as u32;
            }
            if !(*x).out_gin_signal_start.is_null() {
                *(*x).out_gin_signal_start = 0;
            }
            if !(*x).out_gin_counter_start.is_null() {
                *(*x).out_gin_counter_start = 0;
            }
        }
    }
    let dev = DevComm {
        magic: API_MAGIC,
        version: VERSION_CODE,
        rank,
        n_ranks: nranks,
        lsa_rank,
        lsa_size,
        resource_flat_base: base.0,
        stride,
        resource_bytes: bytes as u64,
        lsa_barrier: LsaBarrierHandle { buf_handle: barrier_at as u32, n_barriers },
        abort_flag: 0,
        internal: record as u64,
        reserved: [0; 8],
    };
    // SAFETY: checked non-null; the caller's ncclDevComm_t.
    unsafe { out.write(dev) };
    Ok(())
}

/// `ncclDevCommDestroy` (local): deregisters the resource memory's window and frees it.
///
/// # Safety
/// `dev` is NULL or a readable `ncclDevComm_t`.
pub unsafe fn destroy(comm: CommHandle, dev: *const DevComm) -> Result<(), Error> {
    if dev.is_null() {
        return Err(Error::invalid_argument("devComm is NULL"));
    }
    // SAFETY: checked non-null; the caller's struct (read whatever it holds, then checked).
    let internal = unsafe { std::ptr::addr_of!((*dev).internal).read_unaligned() } as usize;
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    if !live.as_ref().is_some_and(|l| l.contains(&internal)) {
        return Err(Error::invalid_argument(
            "devComm is not a live device communicator of this library (destroyed already, or not made by \
             ncclDevCommCreate)",
        ));
    }
    // SAFETY: a live record (we hold the set's lock, so it is not freed meanwhile).
    let owner = unsafe { (*(internal as *const Record)).comm };
    if owner != comm as usize {
        return Err(Error::invalid_argument(format!(
            "devComm was made on communicator {:p}, not {comm:p}: destroy it with the communicator it was made on",
            owner as *const c_void
        )));
    }
    let c = handles::get(comm, "ncclDevCommDestroy");
    live.as_mut().map(|l| l.remove(&internal));
    drop(live);
    // SAFETY: a record from `create`, just retired from the live set (so freed once).
    let rec = unsafe { Box::from_raw(internal as *mut Record) };
    match c {
        Ok(c) => {
            let deregistered = c.comm.window_deregister(&rec.window);
            let freed = rec.backend.free(rec.mem);
            deregistered.and(freed)
        }
        Err(_) => {
            // The communicator went first and released its windows: only the memory is left.
            let _ = rec.backend.free(rec.mem);
            Err(Error::invalid_argument(format!(
                "comm {comm:p} was destroyed before this device communicator (its memory is freed now): destroy \
                 device communicators before their communicator"
            )))
        }
    }
}

/// NCCL 2.31's `ncclCommProperties` (nccl_device/core.h; 2.32.3 keeps it), rustccl's answers
/// in it. NCCL 2.32 reports CFT support past `devCommRuntimeVersionSize`; rustccl writes
/// nothing there, so a 2.32 caller keeps its initializer's zeroes: no CFT, rustccl's answer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommProperties {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub n_ranks: c_int,
    pub cuda_dev: c_int,
    pub nvml_dev: c_int,
    pub device_api_support: bool,
    pub multimem_support: bool,
    pub gin_type: c_int,
    pub n_lsa_teams: c_int,
    pub host_rma_support: bool,
    pub railed_gin_type: c_int,
    // 2.31
    pub comm_hash: u64,
    pub gin_min_stride: c_int,
    pub gin_connection_type: c_int,
    pub gin_support: [bool; 64],
    pub dev_comm_runtime_version_size: usize,
}

const _: () = assert!(std::mem::size_of::<CommProperties>() == 144);
const _: () = assert!(std::mem::offset_of!(CommProperties, comm_hash) == 56);
const _: () = assert!(std::mem::offset_of!(CommProperties, gin_support) == 72);
const _: () = assert!(std::mem::offset_of!(CommProperties, dev_comm_runtime_version_size) == 136);

/// `ncclCommQueryProperties`: the communicator's rank, size and device, and what of the
/// device API it offers (LSA device communicators where the LSA team is every rank; no
/// multimem, no GIN; the host one-sided calls where they reach every rank). Only the caller's
/// `size` bytes are written, so a struct from a 2.29/2.30 header gets its own fields; `size`
/// and `magic` come from `NCCL_COMM_PROPERTIES_INITIALIZER`.
///
/// # Safety
/// `props` is NULL or points to at least its own `size` bytes.
pub unsafe fn query_properties(comm: CommHandle, props: *mut CommProperties) -> Result<(), Error> {
    let c = handles::get(comm, "ncclCommQueryProperties")?;
    if props.is_null() {
        return Err(Error::invalid_argument("props is NULL"));
    }
    // SAFETY: non-null; every layout starts with its size and magic (the caller's contract).
    let (size, magic) = unsafe {
        ((props as *const usize).read_unaligned(), std::ptr::addr_of!((*props).magic).read_unaligned())
    };
    // As NCCL (and as ncclDevCommCreate's requirements): a wrong magic is invalid usage.
    if magic != API_MAGIC {
        return Err(Error::invalid_usage(format!(
            "props->magic is {magic:#x}, not NCCL_API_MAGIC: initialize ncclCommProperties_t with \
             NCCL_COMM_PROPERTIES_INITIALIZER"
        )));
    }
    // size, magic, version, then at least rank and nRanks.
    const MIN: usize = 24;
    if size < MIN {
        return Err(Error::invalid_argument(format!(
            "props->size is {size}, smaller than any ncclCommProperties_t ({MIN} bytes): initialize it with \
             NCCL_COMM_PROPERTIES_INITIALIZER"
        )));
    }
    let lsa_world = crate::mem_api::lsa_is_world(&c.comm);
    let p = CommProperties {
        size,
        magic,
        version: VERSION_CODE,
        rank: c.comm.user_rank()?,
        n_ranks: c.comm.count()?,
        cuda_dev: c.comm.device()?,
        nvml_dev: c.comm.device()?,
        device_api_support: lsa_world,
        multimem_support: false,
        gin_type: GIN_TYPE_NONE,
        n_lsa_teams: if lsa_world { 1 } else { c.comm.count()? },
        host_rma_support: host_rma_support(&c.comm, lsa_world),
        railed_gin_type: GIN_TYPE_NONE,
        // Named by the unique id (or the parent and color): the same on every rank.
        comm_hash: c.comm.hash(),
        // NCCL says 1 or the ranks per host where GIN connects; no GIN here.
        gin_min_stride: 0,
        gin_connection_type: GIN_CONNECTION_NONE,
        gin_support: [false; 64],
        // What ncclDevCommCreate writes, with or without useRuntimeVersion: rustccl's
        // ncclDevComm has one layout. Programs for NCCL >= 2.31 allocate the device
        // communicator with this size (DeepEP: malloc(props.devCommRuntimeVersionSize)).
        dev_comm_runtime_version_size: std::mem::size_of::<DevComm>(),
    };
    let n = size.min(std::mem::size_of::<CommProperties>());
    // SAFETY: the caller's struct holds `size` ≥ `n` bytes.
    unsafe { std::ptr::copy_nonoverlapping(std::ptr::addr_of!(p) as *const u8, props as *mut u8, n) };
    Ok(())
}

/// `NCCL_GIN_TYPE_NONE` and `NCCL_GIN_CONNECTION_NONE`: no GIN backend, no GIN connections.
const GIN_TYPE_NONE: c_int = 0;
const GIN_CONNECTION_NONE: c_int = 0;

/// `hostRmaSupport`: whether NCCL's host one-sided calls (`ncclPutSignal`, `ncclSignal`,
/// `ncclWaitSignal`) work on this communicator. rustccl runs them between the ranks of one host
/// (`coll/one_sided.rs`) on the host backend and on GPU backends with symmetric kernels (CUDA;
/// not HIP), so: where the LSA team is every rank and the backend is one of those.
fn host_rma_support(comm: &rustccl::Communicator, lsa_world: bool) -> bool {
    lsa_world && (comm.backend().kind() == rustccl::backend::BackendKind::Host || comm.backend().symmetric_kernels().is_some())
}

//! The `nccl*Config` collectives of NCCL 2.31 / 2.32: the plain collective with an
//! `ncclCollConfig_t`, whose options the core applies to the call
//! ([`rustccl::coll::options`]).
//!
//! The config is checked first, as NCCL checks it and before the communicator is looked at:
//! `size` at least 2.31's 64 bytes, `magic`, `forceAlgSelection` 0 or 1, `CTAPolicy` unset or
//! a combination of the `NCCL_CTA_POLICY_*` bits; then the algorithm selection for this
//! collective. A refused config is `ncclInvalidArgument` with a message for
//! `ncclGetLastError`, enqueues nothing, and leaves the caller's group as it was (NCCL refuses
//! it before its enqueue, so the group's other operations still run). A NULL config is the
//! plain call.
//!
//! What each field does here:
//! - `minCTAs` / `maxCTAs`: the channels the planner uses, within the communicator's limits;
//! - `algSelection` / `forceAlgSelection`: the (algorithm, protocol) pairs the planner may
//!   choose among; RING (every collective) and TREE (AllReduce) are rustccl's, the other names
//!   of NCCL (CollNet, NVLS, PAT, the symmetric kernels) are known but not selectable, so a
//!   forced selection of only those is refused, as one NCCL cannot honour is;
//! - `userProfilerTag`: kept with the operation's tasks and handed to profiler plugins on
//!   the call's CollApi and Coll events (NCCL's C profiler v7 `userTag`, rustccl's profiler
//!   ABI v3 `user_tag`; older versions have no field for it);
//! - `launchCompletionEvent`: on a GPU, recorded on the call's stream right after the
//!   operation is launched (after the outermost `ncclGroupEnd` inside a group), so it
//!   completes when the operation has; under stream capture as an external event record, a
//!   node of the graph that records it at each replay. The caller's `cudaEvent_t` is not one
//!   the backend made (`ForeignEvents::record_foreign_event`). Refused, before anything is
//!   enqueued, on the host backend, which has no CUDA events (its operations have completed
//!   when the call or group returns), on the HIP backend (not yet), and on non-blocking
//!   communicators, whose launches happen in the background;
//! - `nvlsCTAs`, `cgaClusterSize`, `CTAPolicy`, `ext`: accepted and not honoured (no NVLS, no
//!   thread-block clusters, no zero-CTA path in rustccl's planner), said once per process at
//!   INFO.

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustccl::backend::{BackendKind, DeviceBackend, Event, Stream};
use rustccl::coll::options::{self, CollOptions};
use rustccl::config::{CONFIG_MAGIC, UNDEF_INT};
use rustccl::spec::Collective;
use rustccl::{Error, ResultCode};

use crate::coll_api::{ncclAllGather, ncclAllReduce, ncclAlltoAll, ncclBroadcast, ncclGather, ncclReduce, ncclReduceScatter, ncclScatter};
use crate::handles::{self, CommHandle};
use crate::{guard_comm, nccl_api, NcclCollConfig, NcclResult, COLL_CONFIG_MIN_SIZE};

/// `NCCL_CTA_POLICY_DEFAULT | NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO`.
const CTA_POLICY_ALL: c_int = 0x3;

/// A caller's config, checked.
struct Checked {
    options: CollOptions,
    event: *mut c_void,
}

/// Says once per process that `field` is accepted and not honoured.
fn not_honoured(flag: &AtomicBool, field: &str, why: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::info!(target: "COLL", "ncclCollConfig_t.{field} is accepted but not honoured: {why} (said once)");
    }
}

/// Reads and checks `config` for `coll` (the call `what`); `None` for a NULL config.
///
/// # Safety
/// `config` is NULL or points to at least `config.size` readable bytes.
unsafe fn check(config: *const NcclCollConfig, coll: Collective, what: &str) -> Result<Option<Checked>, Error> {
    if config.is_null() {
        return Ok(None);
    }
    // SAFETY: every config starts with its size.
    let size = unsafe { std::ptr::read_unaligned(config as *const usize) };
    if size < COLL_CONFIG_MIN_SIZE {
        return Err(Error::invalid_argument(format!(
            "{what}: ncclCollConfig_t.size is {size}, less than the {COLL_CONFIG_MIN_SIZE} bytes of the smallest one: initialise it with NCCL_COLLCONFIG_INITIALIZER"
        )));
    }
    let mut c = NcclCollConfig::default();
    // A newer caller's longer struct: the fields this library knows; an older one's: its own.
    let n = size.min(std::mem::size_of::<NcclCollConfig>());
    // SAFETY: the caller's struct has `size` bytes; at most that many are copied.
    unsafe { std::ptr::copy_nonoverlapping(config as *const u8, &mut c as *mut NcclCollConfig as *mut u8, n) };
    if c.magic != CONFIG_MAGIC {
        return Err(Error::invalid_argument(format!(
            "{what}: ncclCollConfig_t.magic is {:#x}, expected {CONFIG_MAGIC:#x}: initialise it with NCCL_COLLCONFIG_INITIALIZER",
            c.magic
        )));
    }
    if c.force_alg_selection != 0 && c.force_alg_selection != 1 {
        return Err(Error::invalid_argument(format!("{what}: ncclCollConfig_t.forceAlgSelection is {}; it must be 0 or 1", c.force_alg_selection)));
    }
    if c.cta_policy != UNDEF_INT && !(0..=CTA_POLICY_ALL).contains(&c.cta_policy) {
        return Err(Error::invalid_argument(format!(
            "{what}: ncclCollConfig_t.CTAPolicy is {}; it must be unset or a combination of NCCL_CTA_POLICY_* (0 to {CTA_POLICY_ALL})",
            c.cta_policy
        )));
    }
    let mut options = CollOptions {
        min_channels: (c.min_ctas > 0).then_some(c.min_ctas as u32),
        max_channels: (c.max_ctas > 0).then_some(c.max_ctas as u32),
        pairs: None,
        profiler_tag: c.user_profiler_tag,
    };
    if !c.alg_selection.is_null() {
        // SAFETY: a non-null selection is a NUL-terminated string, as C requires.
        let sel = unsafe { CStr::from_ptr(c.alg_selection) }.to_string_lossy();
        options.select(&sel, c.force_alg_selection == 1, coll, what)?;
    }
    static NVLS: AtomicBool = AtomicBool::new(false);
    static CGA: AtomicBool = AtomicBool::new(false);
    static POLICY: AtomicBool = AtomicBool::new(false);
    static EXT: AtomicBool = AtomicBool::new(false);
    if c.nvls_ctas != UNDEF_INT {
        not_honoured(&NVLS, "nvlsCTAs", "rustccl has no NVLink SHARP channels");
    }
    if c.cga_cluster_size != UNDEF_INT {
        not_honoured(&CGA, "cgaClusterSize", "rustccl's kernels do not launch in thread-block clusters");
    }
    if c.cta_policy != UNDEF_INT {
        not_honoured(&POLICY, "CTAPolicy", "rustccl's planner has no efficiency or zero-CTA policy");
    }
    if !c.ext.is_null() {
        not_honoured(&EXT, "ext", "rustccl defines no vendor extension options");
    }
    let event = if size >= std::mem::size_of::<NcclCollConfig>() { c.launch_completion_event } else { std::ptr::null_mut() };
    Ok(Some(Checked { options, event }))
}

/// An event to record once the group it was given in has been enqueued.
struct Deferred {
    backend: Arc<dyn DeviceBackend>,
    event: Event,
    stream: Stream,
}

thread_local! {
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

fn record(d: &Deferred) -> Result<(), Error> {
    d.backend.foreign_events_or_err("ncclCollConfig_t.launchCompletionEvent")?.record_foreign_event(d.event, d.stream).map_err(|e| e.context("recording ncclCollConfig_t.launchCompletionEvent"))
}

/// The outermost group of this thread ended (`ok`: its operations were enqueued): records
/// the launch events its `nccl*Config` calls gave, or forgets them.
pub(crate) fn group_ended(ok: bool) -> Result<(), Error> {
    let pending = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    if !ok {
        return Ok(());
    }
    pending.iter().try_for_each(record)
}

/// Runs a `nccl*Config` call: checks `config`, then runs `plain` (the plain collective) with
/// its options, then records its launch event.
fn configured(what: &str, comm: CommHandle, config: *const NcclCollConfig, coll: Collective, s: *mut c_void, plain: impl FnOnce() -> NcclResult) -> NcclResult {
    let mut checked = None;
    let r = guard_comm(what, comm, || {
        // SAFETY: the caller's config is NULL or a whole ncclCollConfig_t of its size.
        let Some(c) = (unsafe { check(config, coll, what) })? else { return Ok(()) };
        if !c.event.is_null() {
            let cc = handles::get(comm, what)?;
            if cc.comm.backend().kind() == BackendKind::Host {
                return Err(Error::invalid_argument(format!(
                    "{what}: ncclCollConfig_t.launchCompletionEvent must be NULL on the host backend, which has no CUDA events (an operation has completed when its call, or its group's end, returns)"
                )));
            }
            // A backend that cannot record a caller's event (HIP for now) refuses before
            // anything is launched.
            cc.comm.backend().foreign_events_or_err(&format!("{what}: ncclCollConfig_t.launchCompletionEvent (pass NULL)"))?;
            if !cc.comm.config().blocking {
                return Err(Error::invalid_usage(format!(
                    "{what}: ncclCollConfig_t.launchCompletionEvent is not supported on a non-blocking communicator (its launches happen in the background); pass NULL"
                )));
            }
        }
        checked = Some(c);
        Ok(())
    });
    if r != ResultCode::Success as NcclResult {
        return r;
    }
    let Some(c) = checked else { return plain() };
    let r = options::scoped(c.options, plain);
    if r != ResultCode::Success as NcclResult || c.event.is_null() {
        return r;
    }
    guard_comm(what, comm, || {
        let cc = handles::get(comm, what)?;
        let d = Deferred { backend: Arc::clone(cc.comm.backend()), event: Event(c.event as u64), stream: Stream(s as u64) };
        if rustccl::coll::group_depth() > 0 {
            DEFERRED.with(|p| p.borrow_mut().push(d));
            return Ok(());
        }
        record(&d)
    })
}

nccl_api! {
    fn ncclAllReduceConfig / pncclAllReduceConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, red: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        // SAFETY (each call below): the caller's contract is the plain call's.
        configured("ncclAllReduceConfig", comm, config, Collective::AllReduce, s, || unsafe { ncclAllReduce(send, recv, count, datatype, red, comm, s) })
    }

    fn ncclBroadcastConfig / pncclBroadcastConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclBroadcastConfig", comm, config, Collective::Broadcast, s, || unsafe { ncclBroadcast(send, recv, count, datatype, root, comm, s) })
    }

    fn ncclReduceConfig / pncclReduceConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, red: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclReduceConfig", comm, config, Collective::Reduce, s, || unsafe { ncclReduce(send, recv, count, datatype, red, root, comm, s) })
    }

    fn ncclAllGatherConfig / pncclAllGatherConfig(
        send: *const c_void, recv: *mut c_void, sendcount: usize, datatype: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclAllGatherConfig", comm, config, Collective::AllGather, s, || unsafe { ncclAllGather(send, recv, sendcount, datatype, comm, s) })
    }

    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        send: *const c_void, recv: *mut c_void, recvcount: usize, datatype: c_int, red: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclReduceScatterConfig", comm, config, Collective::ReduceScatter, s, || unsafe { ncclReduceScatter(send, recv, recvcount, datatype, red, comm, s) })
    }

    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclAlltoAllConfig", comm, config, Collective::AlltoAll, s, || unsafe { ncclAlltoAll(send, recv, count, datatype, comm, s) })
    }

    fn ncclGatherConfig / pncclGatherConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclGatherConfig", comm, config, Collective::Gather, s, || unsafe { ncclGather(send, recv, count, datatype, root, comm, s) })
    }

    fn ncclScatterConfig / pncclScatterConfig(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
        config: *const NcclCollConfig,
    ) -> NcclResult {
        configured("ncclScatterConfig", comm, config, Collective::Scatter, s, || unsafe { ncclScatter(send, recv, count, datatype, root, comm, s) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_struct_has_nccl_2_32s_layout() {
        assert_eq!(std::mem::size_of::<NcclCollConfig>(), 72);
        assert_eq!(std::mem::offset_of!(NcclCollConfig, ext), 16);
        assert_eq!(std::mem::offset_of!(NcclCollConfig, alg_selection), 40);
        assert_eq!(std::mem::offset_of!(NcclCollConfig, user_profiler_tag), 56);
        assert_eq!(std::mem::offset_of!(NcclCollConfig, launch_completion_event), 64);
        assert_eq!(COLL_CONFIG_MIN_SIZE, 64);
    }

    #[test]
    fn configs_are_checked_in_nccls_order() {
        let c = |f: &dyn Fn(&mut NcclCollConfig)| {
            let mut cfg = NcclCollConfig::default();
            f(&mut cfg);
            // SAFETY: a whole config on the stack.
            unsafe { check(&cfg, Collective::AllReduce, "t") }.err().map(|e| (e.code, e.message))
        };
        assert_eq!(c(&|_| {}), None);
        let (code, msg) = c(&|x| x.size = 63).unwrap();
        assert_eq!(code, ResultCode::InvalidArgument);
        assert!(msg.contains("size is 63"), "{msg}");
        assert!(c(&|x| x.size = 64).is_none(), "2.31's size is accepted");
        assert!(c(&|x| x.magic = 0).unwrap().1.contains("magic"));
        assert!(c(&|x| x.force_alg_selection = 2).unwrap().1.contains("forceAlgSelection"));
        assert!(c(&|x| x.cta_policy = 4).unwrap().1.contains("CTAPolicy"));
        assert!(c(&|x| x.cta_policy = 3).is_none());
        assert!(c(&|x| x.alg_selection = c"bogus".as_ptr()).unwrap().1.contains("malformed"));
        assert!(c(&|x| x.alg_selection = c"ring".as_ptr()).is_none());
        // SAFETY: NULL is the plain call.
        assert!(unsafe { check(std::ptr::null(), Collective::AllReduce, "t") }.unwrap().is_none());
    }
}

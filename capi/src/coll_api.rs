//! Collectives, point-to-point, groups and reduction operators.

use std::os::raw::{c_int, c_void};

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::{DataType, RedOp};
use rustccl::coll::checked_bytes as bytes;
use rustccl::spec::Collective;
use rustccl::{Error, ReduceOp, Scalar};

use crate::handles::{self, CComm, CommHandle, UserOp};
use crate::{buffers, guard, guard_comm, guard_op, nccl_api, NcclResult, NcclSimInfo, SIM_INFO_MAGIC};

/// `ncclScalarResidence_t`.
const SCALAR_DEVICE: c_int = 0;
const SCALAR_HOST_IMMEDIATE: c_int = 1;

fn dtype(v: c_int, what: &str) -> Result<DataType, Error> {
    DataType::from_i32(v).ok_or_else(|| Error::invalid_argument(format!("{what}: invalid data type {v}")))
}

/// The operator `v` for an operation on `t`: a built-in one, or a PreMulSum made on this
/// communicator for `t`.
fn op(c: &CComm, v: c_int, t: DataType, what: &str) -> Result<ReduceOp, Error> {
    Ok(match RedOp::from_i32(v) {
        Some(RedOp::Sum) => ReduceOp::Sum,
        Some(RedOp::Prod) => ReduceOp::Prod,
        Some(RedOp::Max) => ReduceOp::Max,
        Some(RedOp::Min) => ReduceOp::Min,
        Some(RedOp::Avg) => ReduceOp::Avg,
        _ => {
            let user = *c.ops.lock().unwrap_or_else(|p| p.into_inner()).get(&v).ok_or_else(|| {
                Error::invalid_argument(format!("{what}: invalid reduction operator {v} (not built in, and not made by ncclRedOpCreatePreMulSum on this communicator)"))
            })?;
            if user.dtype != t {
                return Err(Error::invalid_argument(format!(
                    "{what}: reduction operator {v} was made by ncclRedOpCreatePreMulSum for {}, not for this operation's {t}",
                    user.dtype
                )));
            }
            user.op
        }
    })
}

fn ptr(p: *const c_void) -> DevicePtr {
    DevicePtr(p as u64)
}

fn stream(s: *mut c_void) -> Stream {
    Stream(s as u64)
}

/// Registers the operation's buffers (host backend), runs `f`, and ends the registrations of
/// operations that have completed.
fn with_buffers(c: &CComm, ranges: &[(*const c_void, usize)], f: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    let ranges: Vec<(usize, usize)> = ranges.iter().map(|&(p, b)| (p as usize, b)).collect();
    with_ranges(c, ranges, f)
}

/// As [`with_buffers`], with the scalar of a device-resident PreMulSum operator too.
fn with_op_buffers(
    c: &CComm,
    o: ReduceOp,
    t: DataType,
    ranges: &[(*const c_void, usize)],
    f: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let mut ranges: Vec<(usize, usize)> = ranges.iter().map(|&(p, b)| (p as usize, b)).collect();
    if let ReduceOp::PreMulSum(Scalar::Device(p)) = o {
        ranges.push((p.0 as usize, t.size()));
    }
    with_ranges(c, ranges, f)
}

/// The (send, receive) bytes of `coll`'s buffers on this rank ([`rustccl::spec::CollSpec`]),
/// after checking that the largest can exist. Asks the communicator for its size only where
/// the buffers depend on it, and for this rank only where a root decides them.
fn extents(c: &CComm, what: &str, coll: Collective, count: usize, t: DataType, root: c_int) -> Result<(usize, usize), Error> {
    let spec = coll.spec();
    let n = if spec.has_rank_blocks() { c.comm.count()? as usize } else { 1 };
    bytes(what, count, t, spec.count_multiple(n))?;
    // A negative root matches no rank (the core refuses it).
    let (me, root) = if spec.rooted { (c.comm.user_rank()? as usize, usize::try_from(root).unwrap_or(usize::MAX)) } else { (0, 0) };
    Ok(spec.extent_bytes(count, t.size(), n, me, root))
}

fn with_ranges(c: &CComm, ranges: Vec<(usize, usize)>, f: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    let r = buffers::prepare(c.comm.backend(), &ranges).and_then(|_| f());
    buffers::finish();
    r
}

nccl_api! {
    fn ncclAllReduce / pncclAllReduce(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, red: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclAllReduce", comm, || {
            let c = handles::get(comm, "ncclAllReduce")?;
            let t = dtype(datatype, "ncclAllReduce")?;
            let o = op(&c, red, t, "ncclAllReduce")?;
            let (sb, rb) = extents(&c, "ncclAllReduce", Collective::AllReduce, count, t, 0)?;
            with_op_buffers(&c, o, t, &[(send, sb), (recv, rb)], || c.comm.all_reduce(ptr(send), ptr(recv), count, t, o, stream(s)))
        })
    }

    fn ncclBroadcast / pncclBroadcast(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclBroadcast", comm, || {
            let c = handles::get(comm, "ncclBroadcast")?;
            let t = dtype(datatype, "ncclBroadcast")?;
            let (sb, rb) = extents(&c, "ncclBroadcast", Collective::Broadcast, count, t, root)?;
            with_buffers(&c, &[(send, sb), (recv, rb)], || c.comm.broadcast(ptr(send), ptr(recv), count, t, root, stream(s)))
        })
    }

    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void) -> NcclResult {
        // SAFETY: same contract as ncclBroadcast, in place.
        unsafe { ncclBroadcast(buff, buff, count, datatype, root, comm, s) }
    }

    fn ncclReduce / pncclReduce(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, red: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclReduce", comm, || {
            let c = handles::get(comm, "ncclReduce")?;
            let t = dtype(datatype, "ncclReduce")?;
            let o = op(&c, red, t, "ncclReduce")?;
            let (sb, rb) = extents(&c, "ncclReduce", Collective::Reduce, count, t, root)?;
            with_op_buffers(&c, o, t, &[(send, sb), (recv, rb)], || c.comm.reduce(ptr(send), ptr(recv), count, t, o, root, stream(s)))
        })
    }

    fn ncclAllGather / pncclAllGather(
        send: *const c_void, recv: *mut c_void, sendcount: usize, datatype: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclAllGather", comm, || {
            let c = handles::get(comm, "ncclAllGather")?;
            let t = dtype(datatype, "ncclAllGather")?;
            let (sb, rb) = extents(&c, "ncclAllGather", Collective::AllGather, sendcount, t, 0)?;
            with_buffers(&c, &[(send, sb), (recv, rb)], || c.comm.all_gather(ptr(send), ptr(recv), sendcount, t, stream(s)))
        })
    }

    fn ncclReduceScatter / pncclReduceScatter(
        send: *const c_void, recv: *mut c_void, recvcount: usize, datatype: c_int, red: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclReduceScatter", comm, || {
            let c = handles::get(comm, "ncclReduceScatter")?;
            let t = dtype(datatype, "ncclReduceScatter")?;
            let o = op(&c, red, t, "ncclReduceScatter")?;
            let (sb, rb) = extents(&c, "ncclReduceScatter", Collective::ReduceScatter, recvcount, t, 0)?;
            with_op_buffers(&c, o, t, &[(send, sb), (recv, rb)], || c.comm.reduce_scatter(ptr(send), ptr(recv), recvcount, t, o, stream(s)))
        })
    }

    fn ncclAlltoAll / pncclAlltoAll(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclAlltoAll", comm, || {
            let c = handles::get(comm, "ncclAlltoAll")?;
            let t = dtype(datatype, "ncclAlltoAll")?;
            let (sb, rb) = extents(&c, "ncclAlltoAll", Collective::AlltoAll, count, t, 0)?;
            with_buffers(&c, &[(send, sb), (recv, rb)], || c.comm.all_to_all(ptr(send), ptr(recv), count, t, stream(s)))
        })
    }

    fn ncclGather / pncclGather(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclGather", comm, || {
            let c = handles::get(comm, "ncclGather")?;
            let t = dtype(datatype, "ncclGather")?;
            let (sb, rb) = extents(&c, "ncclGather", Collective::Gather, count, t, root)?;
            with_buffers(&c, &[(send, sb), (recv, rb)], || c.comm.gather(ptr(send), ptr(recv), count, t, root, stream(s)))
        })
    }

    fn ncclScatter / pncclScatter(
        send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: CommHandle, s: *mut c_void,
    ) -> NcclResult {
        guard_op("ncclScatter", comm, || {
            let c = handles::get(comm, "ncclScatter")?;
            let t = dtype(datatype, "ncclScatter")?;
            let (sb, rb) = extents(&c, "ncclScatter", Collective::Scatter, count, t, root)?;
            with_buffers(&c, &[(send, sb), (recv, rb)], || c.comm.scatter(ptr(send), ptr(recv), count, t, root, stream(s)))
        })
    }

    fn ncclSend / pncclSend(send: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: CommHandle, s: *mut c_void) -> NcclResult {
        guard_op("ncclSend", comm, || {
            let c = handles::get(comm, "ncclSend")?;
            let t = dtype(datatype, "ncclSend")?;
            let (b, _) = extents(&c, "ncclSend", Collective::Send, count, t, 0)?;
            with_buffers(&c, &[(send, b)], || c.comm.send(ptr(send), count, t, peer, stream(s)))
        })
    }

    fn ncclRecv / pncclRecv(recv: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: CommHandle, s: *mut c_void) -> NcclResult {
        guard_op("ncclRecv", comm, || {
            let c = handles::get(comm, "ncclRecv")?;
            let t = dtype(datatype, "ncclRecv")?;
            let (_, b) = extents(&c, "ncclRecv", Collective::Recv, count, t, 0)?;
            with_buffers(&c, &[(recv, b)], || c.comm.recv(ptr(recv), count, t, peer, stream(s)))
        })
    }

    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        guard("ncclGroupStart", || {
            buffers::enter_group();
            rustccl::group_start();
            Ok(())
        })
    }

    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        guard("ncclGroupEnd", || {
            // Window registrations queued in the group run first, as NCCL's group end does.
            let registered = if rustccl::coll::group_depth() == 1 { crate::windows::run_deferred() } else { Ok(()) };
            let r = rustccl::group_end().and(registered);
            // The launch events of the group's nccl*Config calls, once it is enqueued.
            let r = if rustccl::coll::group_depth() == 0 { crate::coll_config::group_ended(r.is_ok()).and(r) } else { r };
            if !matches!(&r, Err(e) if e.kind == rustccl::error::ErrorKind::GroupUnbalanced) {
                buffers::leave_group();
            }
            buffers::finish();
            r
        })
    }

    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(info: *mut NcclSimInfo) -> NcclResult {
        guard("ncclGroupSimulateEnd", || {
            if !info.is_null() {
                // SAFETY: checked non-null; the magic is read before anything is written.
                let magic = unsafe { (*info).magic };
                if magic != SIM_INFO_MAGIC {
                    return Err(Error::invalid_argument("simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER (bad magic)"));
                }
            }
            let registered = if rustccl::coll::group_depth() == 1 { crate::windows::run_deferred() } else { Ok(()) };
            let t = rustccl::group_simulate_end();
            if rustccl::coll::group_depth() == 0 {
                let _ = crate::coll_config::group_ended(false);
            }
            registered?;
            buffers::leave_group();
            buffers::finish();
            let t = t?;
            if !info.is_null() {
                // SAFETY: checked above.
                unsafe { (*info).estimated_time = t };
            }
            Ok(())
        })
    }

    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        out: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: CommHandle,
    ) -> NcclResult {
        guard_comm("ncclRedOpCreatePreMulSum", comm, || {
            let c = handles::get(comm, "ncclRedOpCreatePreMulSum")?;
            if out.is_null() || scalar.is_null() {
                return Err(Error::invalid_argument("op or scalar is NULL"));
            }
            let t = dtype(datatype, "ncclRedOpCreatePreMulSum")?;
            let read_now = || {
                // SAFETY: the caller's scalar holds one element of `t`.
                let bytes = unsafe { std::slice::from_raw_parts(scalar as *const u8, t.size()) };
                rustccl::reduce::decode_scalar(t, bytes)
            };
            // A device scalar is read when each operation using the operator is planned (on the
            // host backend it is host memory, registered for that operation like the buffers).
            let value = match residence {
                SCALAR_HOST_IMMEDIATE => Scalar::Host(read_now()),
                SCALAR_DEVICE => Scalar::Device(DevicePtr(scalar as u64)),
                r => return Err(Error::invalid_argument(format!("invalid scalar residence {r}"))),
            };
            let mut ops = c.ops.lock().unwrap_or_else(|p| p.into_inner());
            let id = (5..i32::MAX).find(|v| !ops.contains_key(v)).ok_or_else(|| Error::internal("no operator numbers left"))?;
            ops.insert(id, UserOp { op: ReduceOp::PreMulSum(value), dtype: t });
            // SAFETY: checked non-null.
            unsafe { *out = id };
            Ok(())
        })
    }

    fn ncclRedOpDestroy / pncclRedOpDestroy(red: c_int, comm: CommHandle) -> NcclResult {
        guard_comm("ncclRedOpDestroy", comm, || {
            let c = handles::get(comm, "ncclRedOpDestroy")?;
            if (0..5).contains(&red) {
                return Err(Error::invalid_argument(format!("operator {red} is built in and cannot be destroyed")));
            }
            let removed = c.ops.lock().unwrap_or_else(|p| p.into_inner()).remove(&red);
            removed.map(|_| ()).ok_or_else(|| {
                Error::invalid_argument(format!("operator {red} was not made by ncclRedOpCreatePreMulSum on this communicator"))
            })
        })
    }
}

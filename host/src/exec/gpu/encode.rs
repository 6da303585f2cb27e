//! Program images: the planner's work for one device launch, encoded as the interpreter
//! (`kernels/src/device/exec.cu`) reads it — work items, steps, operation contexts and
//! connections — and the split of a run into launches whose reductions share one kernel.
//!
//! What changes from call to call of an operation — its buffers and its PreMulSum scalar —
//! goes in the kernel parameter (`calls`: `ExecArgs::calls`) for the first
//! `EXEC_ARG_CTXS` contexts, not in the image: their image contexts hold zeros there. So the
//! image of a collective depends only on its shape and its connections, and one image serves
//! every call of that shape, whatever its buffers (a group of more operations keeps the
//! values of the others in its image).

use std::collections::HashMap;

use rustccl_kernels::exec::{self as k, ExecArgs, ExecCall, ExecConn, ExecCtx, ExecItem, ExecStep};
use rustccl_kernels::DeviceOp;
use rustccl_plugin_api::Protocol;

use super::super::Links;
use crate::backend::DevicePtr;
use crate::error::{Error, Result};
use crate::program::Link;
use crate::transport::{p2p_protocol_slots, Dir, Kind, GPU_LL128_SLOT_BYTES, GPU_LL_SLOT_BYTES};
use crate::types::DataType;
use crate::work::{OpCtx, Work};

/// One launch's worth of a run: the tasks (contexts) it covers and the kernel it needs.
pub(crate) struct Segment {
    pub ctxs: std::ops::Range<usize>,
    pub op: DeviceOp,
    pub dtype: DataType,
}

/// Splits the run's tasks, in order, into launches whose reductions share one kernel.
pub(crate) fn segments(run: &Work) -> Vec<Segment> {
    let mut reduces = vec![false; run.ctxs.len()];
    for item in &run.items {
        for (ci, s) in &item.steps {
            reduces[*ci] |= s.reduce;
        }
    }
    let mut out: Vec<Segment> = Vec::new();
    let mut start = 0;
    let mut kernel: Option<(DeviceOp, DataType)> = None;
    for (ci, ctx) in run.ctxs.iter().enumerate() {
        if !reduces[ci] {
            continue;
        }
        let r = &ctx.reducer;
        let want = (super::ops::coll_device_op(r.op, r.dtype).0, r.dtype);
        match kernel {
            None => kernel = Some(want),
            Some(have) if have == want => {}
            Some((op, dtype)) => {
                out.push(Segment { ctxs: start..ci, op, dtype });
                start = ci;
                kernel = Some(want);
            }
        }
    }
    let (op, dtype) = kernel.unwrap_or((DeviceOp::Sum, DataType::Uint8));
    out.push(Segment { ctxs: start..run.ctxs.len(), op, dtype });
    out
}

fn proto_code(p: Protocol) -> u8 {
    match p {
        Protocol::Ll => k::PROTO_LL,
        Protocol::Ll128 => k::PROTO_LL128,
        Protocol::Simple => k::PROTO_SIMPLE,
    }
}

/// A program image and what its launch needs besides.
pub(crate) struct Encoded {
    pub bytes: Vec<u8>,
    /// Offsets of items, contexts, connections and steps in `bytes`.
    pub offsets: [usize; 4],
    pub nitems: u32,
    pub nconns: u32,
    pub blocks: u32,
    pub slots: Vec<DevicePtr>,
    /// The kernel entry point for the protocols of its steps.
    pub entry: k::ExecEntry,
}

impl Encoded {
    /// The kernel parameter of this image at `base` in device memory, with the control block
    /// at `control` and the per-call values `calls` (from [`calls`]).
    pub fn args(&self, base: DevicePtr, control: DevicePtr, calls: &(u32, [ExecCall; k::EXEC_ARG_CTXS])) -> ExecArgs {
        let at = |i: usize| base.0 + self.offsets[i] as u64;
        ExecArgs {
            items: at(0),
            ctxs: at(1),
            conns: at(2),
            steps: at(3),
            control: control.0,
            nitems: self.nitems,
            nconns: self.nconns,
            ncalls: calls.0,
            pad: 0,
            calls: calls.1,
        }
    }
}

/// The per-call values of one operation: its buffers and scalar as the kernel reads them.
fn call_of(c: &OpCtx) -> ExecCall {
    let (_, scalar, _) = super::ops::coll_device_op(c.reducer.op, c.reducer.dtype);
    ExecCall { src: c.src as u64, dst: c.dst as u64, scalar, scalar_ptr: c.scalar_at as u64, dst_remote: c.dst_remote as u64 }
}

/// The kernel parameter's per-call values of `run`: those of its first `EXEC_ARG_CTXS`
/// contexts, and how many that is.
pub(crate) fn calls(run: &Work) -> (u32, [ExecCall; k::EXEC_ARG_CTXS]) {
    let mut out = [ExecCall::default(); k::EXEC_ARG_CTXS];
    for (o, c) in out.iter_mut().zip(&run.ctxs) {
        *o = call_of(c);
    }
    (run.ctxs.len().min(k::EXEC_ARG_CTXS) as u32, out)
}

fn append<T: Copy>(bytes: &mut Vec<u8>, items: &[T]) -> usize {
    while !bytes.len().is_multiple_of(32) {
        bytes.push(0);
    }
    let at = bytes.len();
    bytes.extend_from_slice(k::as_bytes(items));
    at
}

/// Steps below this size never go zero-copy (`RUSTCCL_DIRECT_MIN_BYTES` in `exec.cu`: the
/// sender does not read the receiver's post for them), so runs that start with one are not
/// posted either (a post costs the receiver two system fences).
pub(crate) const DIRECT_MIN_BYTES: usize = 64 << 10;

/// The peer of a step that may be a zero-copy receive (the kernel's `plain_recv` over P2P):
/// a point-to-point receive into `dst` and nothing else, over a P2P connection.
fn direct_receive_peer(s: &crate::program::Step, links: &Links) -> Option<u32> {
    let plain = s.send.is_empty() && s.src.is_none() && !s.reduce && !s.post && s.dst.is_some();
    match s.recv.as_slice() {
        [l] if plain
            && matches!(l.purpose, crate::program::Purpose::P2p(_))
            && links.get(&(*l, Dir::Recv)).is_some_and(|c| c.kind == Kind::P2p) =>
        {
            Some(l.peer)
        }
        _ => None,
    }
}

/// The receives of `run` whose sender may write straight into their buffer (zero-copy, if the
/// buffer is registered and the peer maps it): `(context, peer)` for every point-to-point
/// receive of Simple steps over P2P connections alone.
pub(crate) fn direct_receives(run: &Work, links: &Links) -> Vec<(usize, u32)> {
    // Per context: Some(Some(peer)) every step so far is a candidate from `peer`; Some(None)
    // some step is not.
    let mut of: Vec<Option<Option<u32>>> = vec![None; run.ctxs.len()];
    for item in &run.items {
        for (ci, s) in &item.steps {
            let peer = direct_receive_peer(s, links).filter(|_| run.ctxs[*ci].proto == Protocol::Simple);
            of[*ci] = match (of[*ci], peer) {
                (None, p) => Some(p),
                (Some(Some(a)), Some(b)) if a == b => Some(Some(a)),
                _ => Some(None),
            };
        }
    }
    of.iter().enumerate().filter_map(|(ci, p)| p.flatten().map(|peer| (ci, peer))).collect()
}

/// Encodes the steps of the tasks in `ctxs` (None when they have no step).
pub(crate) fn encode(run: &Work, links: &Links, ctxs: std::ops::Range<usize>) -> Result<Option<Encoded>> {
    let mut conns: Vec<ExecConn> = Vec::new();
    let mut slots = Vec::new();
    let mut index: HashMap<(Link, Dir), u8> = HashMap::new();
    let mut conn_of = |link: Link, dir: Dir| -> Result<u8> {
        if let Some(&i) = index.get(&(link, dir)) {
            return Ok(i);
        }
        if conns.len() >= k::EXEC_MAX_CONNS {
            return Err(Error::invalid_usage(format!(
                "this group needs more than {} connections on one device; split it into smaller groups",
                k::EXEC_MAX_CONNS
            )));
        }
        let c = links.get(&(link, dir)).ok_or_else(|| Error::internal("a link was not connected"))?;
        let mut conn = ExecConn {
            slots: c.fifo.slot_addr(0),
            header: c.fifo.device_header(),
            slot_bytes: c.fifo.slot_bytes() as u32,
            simple_steps: c.fifo.steps() as u32,
            flags: if dir == Dir::Send { k::CONN_SEND } else { 0 },
            ..ExecConn::default()
        };
        if c.kind == Kind::P2p {
            conn.flags |= k::CONN_LINES_WHOLE | k::CONN_DIRECT;
            (conn.ll_slots, conn.ll128_slots) = p2p_protocol_slots(conn.slots);
            conn.ll_slot_bytes = GPU_LL_SLOT_BYTES as u32;
            conn.ll128_slot_bytes = GPU_LL128_SLOT_BYTES as u32;
        }
        if conn.header == 0 {
            return Err(Error::internal(format!("the connection with rank {} has no device mapping", link.peer)));
        }
        conns.push(conn);
        slots.push(DevicePtr(c.fifo.slot_addr(0)));
        let i = (conns.len() - 1) as u8;
        index.insert((link, dir), i);
        Ok(i)
    };
    let mut items: Vec<ExecItem> = Vec::new();
    let mut steps: Vec<ExecStep> = Vec::new();
    let mut protocols = 0u8;
    for item in &run.items {
        let first = steps.len();
        // The run of zero-copy receive candidates the last step belongs to: (its first step's
        // index, its context).
        let mut run_of: Option<(usize, usize)> = None;
        for (ci, s) in item.steps.iter().filter(|(ci, _)| ctxs.contains(ci)) {
            if s.recv.len() > k::EXEC_MAX_PEERS || s.send.len() > k::EXEC_MAX_PEERS {
                return Err(Error::internal("a step with more than two peers on one side"));
            }
            let ctx = &run.ctxs[*ci];
            let mut e = ExecStep {
                src: s.src.unwrap_or(0) as u64,
                dst: s.dst.unwrap_or(0) as u64,
                bytes: u32::try_from(s.bytes).map_err(|_| Error::internal("a step over 4 GiB"))?,
                ctx: u16::try_from(*ci).map_err(|_| Error::invalid_usage("more than 65535 operations in one group"))?,
                flags: 0,
                proto: if s.recv.is_empty() && s.send.is_empty() { k::PROTO_SIMPLE } else { proto_code(ctx.proto) },
                nrecv: s.recv.len() as u8,
                nsend: s.send.len() as u8,
                ..ExecStep::default()
            };
            for (flag, on) in [
                (k::STEP_SRC, s.src.is_some()),
                (k::STEP_DST, s.dst.is_some()),
                (k::STEP_REDUCE, s.reduce),
                (k::STEP_POST, s.post),
                (k::STEP_SRC_IN_DST, s.src_in_dst),
            ] {
                if on {
                    e.flags |= flag;
                }
            }
            for (j, l) in s.recv.iter().enumerate() {
                e.recv[j] = conn_of(*l, Dir::Recv)?;
            }
            for (j, l) in s.send.iter().enumerate() {
                e.send[j] = conn_of(*l, Dir::Send)?;
            }
            protocols |= 1 << e.proto;
            // Plain receives of one point-to-point operation over P2P (Simple) form runs the
            // kernel posts for zero-copy (STEP_DIRECT_START on the first, `run` its length).
            let direct = e.proto == k::PROTO_SIMPLE && direct_receive_peer(s, links).is_some();
            run_of = match run_of {
                Some((start, c)) if direct && c == *ci && steps[start].run < u16::MAX => {
                    steps[start].run += 1;
                    Some((start, c))
                }
                _ if direct && s.bytes < DIRECT_MIN_BYTES => None,
                _ if direct => {
                    e.flags |= k::STEP_DIRECT_START;
                    e.run = 1;
                    Some((steps.len(), *ci))
                }
                _ => None,
            };
            steps.push(e);
        }
        if steps.len() > first {
            items.push(ExecItem { first: first as u32, count: (steps.len() - first) as u32 });
        }
    }
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() > k::EXEC_MAX_BLOCKS * k::EXEC_MAX_ITEMS_PER_BLOCK {
        return Err(Error::invalid_usage(format!(
            "this group has {} independent streams of work on one device (at most {}); split it into smaller groups",
            items.len(),
            k::EXEC_MAX_BLOCKS * k::EXEC_MAX_ITEMS_PER_BLOCK
        )));
    }
    let exec_ctxs: Vec<ExecCtx> = run
        .ctxs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (_, _, divisor) = super::ops::coll_device_op(c.reducer.op, c.reducer.dtype);
            // The first contexts' per-call values travel in the kernel parameter (`calls`).
            let call = if i < k::EXEC_ARG_CTXS { ExecCall::default() } else { call_of(c) };
            ExecCtx {
                src: call.src,
                dst: call.dst,
                scalar: call.scalar,
                divisor,
                sig: c.sig.0,
                scalar_ptr: call.scalar_ptr,
                dst_remote: call.dst_remote,
            }
        })
        .collect();
    let mut bytes = Vec::new();
    let o_items = append(&mut bytes, &items);
    let o_ctxs = append(&mut bytes, &exec_ctxs);
    let o_conns = append(&mut bytes, &conns);
    let o_steps = append(&mut bytes, &steps);
    Ok(Some(Encoded {
        bytes,
        offsets: [o_items, o_ctxs, o_conns, o_steps],
        nitems: items.len() as u32,
        nconns: conns.len() as u32,
        blocks: items.len().min(k::EXEC_MAX_BLOCKS) as u32,
        slots,
        entry: k::ExecEntry::for_protocols(protocols),
    }))
}


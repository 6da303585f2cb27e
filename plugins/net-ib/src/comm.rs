//! One established connection and its data path (NCCL's CTS protocol):
//!
//! * **receive** (`irecv`): post one zero-length receive per QP (each will take the
//!   completion of a write-with-immediate), then RDMA-write a [`CtsEntry`] (buffer address,
//!   size, rkey, tag) into the sender's FIFO slot for this receive;
//! * **send** (`isend`): queue the message; on each call, look at the FIFO slot of the oldest
//!   queued send **in local memory** (no verbs call) and, once the receiver's entry is there
//!   and the tag matches, RDMA_WRITE_WITH_IMM the message straight into the receive buffer,
//!   split over the QPs ([`crate::split`]), the immediate carrying the message size;
//! * **test** polls the CQ: a request is done when each QP has completed its part; the
//!   receiver reads the size from the immediate. An error completion fails the connection
//!   (every request on it then fails), and so does EOF on the out-of-band socket: a dead peer
//!   is an error, never a wait without end.
//!
//! A connection is used by one thread at a time in practice; a mutex makes it safe anyway.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use rustccl_plugin_api::PluginError;

use crate::device::IbDevice;
use crate::fifo::{slot_offset, CtsEntry, Fifo, CTS_BYTES};
use crate::mr_cache::MrCache;
use crate::oob::{conn_info, peer_gone, Pipe};
use crate::qp::{Endpoint, MAX_INFLIGHT};
use crate::settings::QpSettings;
use crate::split::{split, uses_adaptive_routing};
use crate::verbs::types::*;
use crate::verbs::Mr;
use crate::wire::PROTO_MAGIC;

/// `wr_id` of the receiver's CTS writes (request ids are never 0).
const CTS_WR_ID: u64 = 0;

/// Which end of the connection this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Send,
    Recv,
}

/// The IB completion status names (`ibv_wc_status_str`), for error messages.
pub fn wc_status_name(status: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or("unknown status")
}

/// A request's progress.
struct Request {
    /// Completions still expected (one per QP).
    remaining: usize,
    /// Sent size, or received size once known.
    size: usize,
}

/// A send waiting for its CTS.
struct QueuedSend {
    req: u64,
    seq: u64,
    data: usize,
    size: usize,
    tag: i32,
    lkey: u32,
}

/// A registration of the connection's cache. Memory in the first page of the address
/// space is never mapped (an empty buffer's dangling pointer lands there): it gets no MR
/// and covers nothing, so it serves 0-byte transfers only (which name no memory).
pub struct Registration {
    pub mr: Option<Mr>,
    pub start: usize,
    pub len: usize,
}

impl Registration {
    pub fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::lkey)
    }

    pub fn rkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::rkey)
    }
}

/// The part of connection setup that `connect` and `accept` leave to the connection (see
/// [`crate::oob`]), so that neither waits for the other side's next call: a rank may
/// finish `connect` before its peer calls `accept`. The rest happens in
/// `isend`/`irecv`/`test`.
pub enum Setup {
    /// Sender: reading the acceptor's info; then the QPs go to RTS.
    Exchange { dev: IbDevice, qp: QpSettings },
    /// Sender: writing the "ready" byte.
    Ready,
    /// Receiver: writing its info, then reading the sender's "ready" byte. Until it comes,
    /// CTS writes wait (the sender's QPs may not take them yet).
    AwaitReady,
}

/// The connection's mutable state. Field order is drop order: the QPs go before the FIFO's
/// registration and memory, so no peer write lands after the memory is freed.
struct State {
    ep: Endpoint,
    fifo_mr: Mr,
    fifo: Fifo,
    /// Registrations of the caller's buffers.
    cache: MrCache<Registration>,
    requests: HashMap<u64, Request>,
    /// Sender: sends whose CTS has not come yet, oldest first.
    queued: VecDeque<QueuedSend>,
    /// Receiver: receives (by sequence number) whose CTS waits for the end of setup.
    deferred_cts: VecDeque<u64>,
    /// Sequence numbers of the next send / receive.
    next_seq: u64,
    /// Receiver: the sender's FIFO.
    remote_fifo: (u64, u32),
    /// The first error; every later call reports it.
    failed: Option<PluginError>,
    /// Setup still to finish (sender only).
    setup: Option<Setup>,
    oob: Pipe,
}

/// An established connection.
pub struct Comm {
    pub direction: Direction,
    /// The context (`init`) that made it.
    pub ctx: u64,
    /// Device name, for messages.
    pub device: String,
    nqps: usize,
    /// Sender: messages above this size post the adaptive-routing way (`None`: never).
    ar_threshold: Option<usize>,
    state: Mutex<State>,
}

/// What setup hands over to make a [`Comm`].
pub struct Parts {
    pub ep: Endpoint,
    /// Sender: the FIFO the receiver writes; receiver: the staging copy it writes from.
    pub fifo: Fifo,
    pub fifo_mr: Mr,
    pub oob: Pipe,
    pub setup: Option<Setup>,
}

/// Registers `fifo` on `ep`'s PD for remote writes (sender) or as a local source (receiver).
pub fn register_fifo(ep: &Endpoint, fifo: &Fifo) -> Result<Mr, PluginError> {
    // SAFETY: the FIFO's heap block outlives the registration (both live in the same
    // connection state, the registration dropped first), and the device may write it.
    unsafe {
        ep.pd.reg_mr(
            fifo.addr() as *mut c_void,
            fifo.bytes(),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        )
    }
}

impl Comm {
    /// A connection; `remote_fifo` is the sender's FIFO (address, rkey) on the receiving
    /// side, unused on the sending side.
    pub fn new(
        direction: Direction,
        ctx: u64,
        device: String,
        parts: Parts,
        remote_fifo: (u64, u32),
    ) -> Comm {
        let nqps = parts.ep.qps.len();
        Comm {
            direction,
            ctx,
            device,
            nqps,
            ar_threshold: None,
            state: Mutex::new(State {
                ep: parts.ep,
                fifo_mr: parts.fifo_mr,
                fifo: parts.fifo,
                cache: MrCache::new(page_size()),
                requests: HashMap::new(),
                queued: VecDeque::new(),
                deferred_cts: VecDeque::new(),
                next_seq: 0,
                remote_fifo,
                failed: None,
                setup: parts.setup,
                oob: parts.oob,
            }),
        }
    }

    /// Sets the adaptive-routing threshold of a sender (see
    /// [`crate::split::adaptive_routing_threshold`]).
    pub fn with_adaptive_routing(mut self, threshold: Option<usize>) -> Comm {
        self.ar_threshold = threshold;
        self
    }

    /// Wraps the connection and starts its setup helper: a thread that advances the setup
    /// left to the connection ([`Setup`]) until it is done, the connection fails or is
    /// dropped. Without it, setup would move only when the application calls this side,
    /// and a receiver that waits on its peer's send (and not on its own receive) would
    /// never send its CTS. If the thread cannot start, calls still advance setup.
    pub fn start(self) -> Arc<Comm> {
        let comm = Arc::new(self);
        let weak = Arc::downgrade(&comm);
        let _ = std::thread::Builder::new()
            .name("rustccl-ib-setup".into())
            .spawn(move || loop {
                let Some(c) = weak.upgrade() else { return };
                let fd = {
                    let mut st = c.lock();
                    c.progress(&mut st);
                    if st.setup.is_none() || st.failed.is_some() {
                        return;
                    }
                    st.oob.sock.as_raw_fd()
                };
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; `fd` stays open while `c` (which owns the
                // socket) is held here.
                unsafe { libc::poll(&mut pfd, 1, 10) };
            });
        comm
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `data..data + size` (through the cache); returns the cache entry id and
    /// the keys.
    pub fn reg_mr(
        &self,
        data: usize,
        size: usize,
    ) -> Result<(u64, Arc<Registration>), PluginError> {
        let mut st = self.lock();
        let pd = Arc::clone(&st.ep.pd);
        st.cache.acquire(data, size, |start, len| {
            if start == 0 {
                return Ok(Registration {
                    mr: None,
                    start: 0,
                    len: 0,
                });
            }
            // SAFETY: the caller registered memory of this process, which must stay mapped
            // until deregistration (the net ABI's contract for regMr).
            let mr = unsafe {
                pd.reg_mr(
                    start as *mut c_void,
                    len,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                )
            }?;
            Ok(Registration {
                mr: Some(mr),
                start,
                len,
            })
        })
    }

    /// Drops a reference taken by [`Comm::reg_mr`].
    pub fn dereg_mr(&self, entry: u64) -> bool {
        self.lock().cache.release(entry)
    }

    /// References the cache holds on `entry` (for tests and logs).
    pub fn mr_refs(&self, entry: u64) -> usize {
        self.lock().cache.refs(entry)
    }

    fn check_usable(&self, st: &State) -> Result<(), PluginError> {
        match &st.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The connection's QPs (address, number) and CQ address: how the async-event thread
    /// ([`crate::async_events`]) recognises the objects an event names.
    pub fn verbs_objects(&self) -> (Vec<(usize, u32)>, usize) {
        let st = self.lock();
        let qps = st.ep.qps.iter().map(|q| (q.as_ptr() as usize, q.qp_num()));
        (qps.collect(), st.ep.cq.as_ptr() as usize)
    }

    /// Fails connections from outside their calls (the async-event thread): each reports
    /// its error from then on (unless it had failed already), and its peer sees the
    /// out-of-band socket close. All are locked first, so a connection that is both hit and
    /// the peer of another hit one reports its own error, not the loss of its peer.
    pub fn fail_together(targets: &[(Arc<Comm>, PluginError)]) {
        let mut order: Vec<&(Arc<Comm>, PluginError)> = targets.iter().collect();
        order.sort_by_key(|(c, _)| Arc::as_ptr(c) as usize); // one lock order everywhere
        let mut states: Vec<MutexGuard<'_, State>> =
            order.iter().map(|(c, _)| c.lock()).collect();
        for ((c, e), st) in order.iter().zip(states.iter_mut()) {
            c.fail(st, e.clone());
        }
    }

    /// Queues a send; `Ok(false)`: too many requests in flight, call again.
    pub fn isend(
        &self,
        req: u64,
        data: usize,
        size: usize,
        tag: i32,
        lkey: u32,
    ) -> Result<bool, PluginError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        if st.requests.len() >= MAX_INFLIGHT {
            self.progress(&mut st);
            return Ok(false);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.queued.push_back(QueuedSend {
            req,
            seq,
            data,
            size,
            tag,
            lkey,
        });
        st.requests.insert(
            req,
            Request {
                remaining: self.nqps,
                size,
            },
        );
        self.progress(&mut st);
        Ok(true)
    }

    /// Posts a receive into `data..data + size` (registered with `rkey`); `Ok(false)`: too
    /// many requests in flight, call again.
    pub fn irecv(
        &self,
        req: u64,
        data: usize,
        size: usize,
        tag: i32,
        rkey: u32,
    ) -> Result<bool, PluginError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        if st.requests.len() >= MAX_INFLIGHT {
            self.progress(&mut st);
            return Ok(false);
        }
        let seq = st.next_seq;
        for qp in &st.ep.qps {
            let mut wr = ibv_recv_wr {
                wr_id: req,
                next: std::ptr::null_mut(),
                sg_list: std::ptr::null_mut(),
                num_sge: 0,
            };
            // SAFETY: a zero-SGE receive names no memory; the QP is live.
            if let Err(e) = unsafe { qp.post_recv(&mut wr) } {
                return Err(self.fail(&mut st, e));
            }
        }
        let entry = CtsEntry {
            addr: data as u64,
            size: size as u64,
            rkeys: [rkey, 0, 0, 0],
            tag,
            nreqs: 1,
            ..CtsEntry::default()
        };
        st.fifo.fill(seq, entry);
        if st.setup.is_some() {
            st.deferred_cts.push_back(seq);
        } else if let Err(e) = Self::post_cts(&mut st, seq) {
            return Err(self.fail(&mut st, e));
        }
        st.next_seq += 1;
        st.requests.insert(
            req,
            Request {
                remaining: self.nqps,
                size: 0,
            },
        );
        Ok(true)
    }

    /// RDMA-writes the staged CTS of receive `seq` into the sender's FIFO.
    fn post_cts(st: &mut State, seq: u64) -> Result<(), PluginError> {
        let src = st.fifo.addr().wrapping_add(crate::fifo::slot_of(seq));
        let (remote, remote_rkey) = st.remote_fifo;
        let mut sge = ibv_sge {
            addr: src as u64,
            length: CTS_BYTES as u32,
            lkey: st.fifo_mr.lkey(),
        };
        let mut wr = send_wr(
            CTS_WR_ID,
            IBV_WR_RDMA_WRITE,
            &mut sge,
            remote + slot_offset(seq),
            remote_rkey,
            0,
        );
        // SAFETY: the SGE names the staging FIFO's slot, registered for the connection's
        // life and not refilled before the sender has read it (fewer than FIFO_SLOTS
        // receives in flight); the remote address is the sender's FIFO slot.
        unsafe { st.ep.qps[0].post_send(&mut wr) }
    }

    /// Whether request `req` is done (`Some(size)`); an error if the connection failed
    /// before it completed. A finished or failed request is forgotten.
    pub fn test(&self, req: u64) -> Result<Option<usize>, PluginError> {
        let mut st = self.lock();
        self.progress(&mut st);
        match st.requests.get(&req) {
            None => Err(PluginError::invalid_argument(format!(
                "unknown request {req:#x}"
            ))),
            Some(r) if r.remaining == 0 => {
                let size = r.size;
                st.requests.remove(&req);
                Ok(Some(size))
            }
            Some(_) => match st.failed.clone() {
                Some(e) => {
                    st.requests.remove(&req);
                    Err(e)
                }
                None => Ok(None),
            },
        }
    }

    /// Records the connection's first error and returns it. The out-of-band socket is shut
    /// down, so the peer's side fails too (it sees EOF) instead of waiting for a CTS or
    /// data that will never come.
    fn fail(&self, st: &mut State, e: PluginError) -> PluginError {
        if st.failed.is_none() {
            let _ = st.oob.sock.shutdown(std::net::Shutdown::Both);
        }
        st.failed.get_or_insert(e).clone()
    }

    /// Advances the sender's setup (see [`Setup`]).
    fn advance_setup(&self, st: &mut State) -> Result<(), PluginError> {
        let lost = |e: std::io::Error| {
            PluginError::remote(format!(
                "NET/IB : connection setup on {} failed: {e}",
                self.device
            ))
        };
        loop {
            match st.setup.take() {
                None => return Ok(()),
                Some(Setup::Exchange { dev, qp }) => {
                    let Some(bytes) = st.oob.progress().map_err(lost)? else {
                        st.setup = Some(Setup::Exchange { dev, qp });
                        return Ok(());
                    };
                    let peer = conn_info(bytes).map_err(|e| {
                        PluginError::remote(format!(
                            "NET/IB : bad connection info from the peer of {}: {e}",
                            self.device
                        ))
                    })?;
                    if peer.magic != PROTO_MAGIC {
                        return Err(PluginError::remote(format!(
                            "NET/IB : the listener that {} connected to answered with a foreign protocol",
                            self.device
                        )));
                    }
                    st.ep.connect(&dev, &peer, &qp)?;
                    st.oob.next(vec![1], 0);
                    st.setup = Some(Setup::Ready);
                }
                Some(Setup::Ready) => {
                    if st.oob.progress().map_err(lost)?.is_none() {
                        st.setup = Some(Setup::Ready);
                    }
                    return Ok(());
                }
                Some(Setup::AwaitReady) => {
                    if st.oob.progress().map_err(lost)?.is_none() {
                        st.setup = Some(Setup::AwaitReady);
                        return Ok(());
                    }
                    while let Some(seq) = st.deferred_cts.pop_front() {
                        Self::post_cts(st, seq)?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Polls the CQ, starts sends whose CTS arrived, and checks the peer.
    fn progress(&self, st: &mut State) {
        if st.failed.is_some() {
            return;
        }
        if let Err(e) = self.advance_setup(st) {
            self.fail(st, e);
            return;
        }
        let mut wc = [ibv_wc::default(); 16];
        loop {
            let n = match st.ep.cq.poll(&mut wc) {
                Ok(n) => n,
                Err(e) => {
                    self.fail(st, e);
                    return;
                }
            };
            for c in &wc[..n] {
                if c.status != IBV_WC_SUCCESS {
                    let what = if c.wr_id == CTS_WR_ID {
                        "clear-to-send write"
                    } else {
                        "transfer"
                    };
                    let e = PluginError::remote(format!(
                        "NET/IB : {} {what} failed on {}: {} (status {}, vendor error {:#x}); the peer may have died or the fabric lost the connection",
                        match self.direction { Direction::Send => "send", Direction::Recv => "receive" },
                        self.device,
                        wc_status_name(c.status),
                        c.status,
                        c.vendor_err
                    ));
                    self.fail(st, e);
                    return;
                }
                if c.wr_id == CTS_WR_ID {
                    continue;
                }
                if let Some(r) = st.requests.get_mut(&c.wr_id) {
                    r.remaining = r.remaining.saturating_sub(1);
                    if c.opcode == IBV_WC_RECV_RDMA_WITH_IMM {
                        r.size = u32::from_be(c.imm_data) as usize;
                    }
                }
            }
            if n < wc.len() {
                break;
            }
        }
        if self.direction == Direction::Send {
            if let Err(e) = self.start_sends(st) {
                self.fail(st, e);
                return;
            }
        }
        let waiting = st.requests.values().any(|r| r.remaining > 0);
        if waiting && st.setup.is_none() {
            if let Some(why) = peer_gone(&st.oob.sock) {
                let e = PluginError::remote(format!(
                    "NET/IB : connection on {} lost: {why}",
                    self.device
                ));
                self.fail(st, e);
            }
        }
    }

    /// Posts the data of every queued send whose CTS is in the FIFO, oldest first.
    fn start_sends(&self, st: &mut State) -> Result<(), PluginError> {
        while let Some(q) = st.queued.front() {
            let Some(cts) = st.fifo.posted(q.seq) else {
                break;
            };
            if cts.tag != q.tag {
                return Err(PluginError::invalid_usage(format!(
                    "NET/IB : send with tag {} met a receive with tag {} on {}; sends and receives must be posted in the same order with the same tags",
                    q.tag, cts.tag, self.device
                )));
            }
            if q.size as u64 > cts.size {
                return Err(PluginError::invalid_usage(format!(
                    "NET/IB : message of {} bytes is larger than the receive buffer of {} bytes on {}",
                    q.size, cts.size, self.device
                )));
            }
            let ar = uses_adaptive_routing(self.ar_threshold, q.size);
            let imm = (q.size as u32).to_be();
            for (qp, part) in st.ep.qps.iter().zip(split(q.size, self.nqps)) {
                let remote = cts.addr + part.offset as u64;
                let mut sge = ibv_sge {
                    addr: (q.data + part.offset) as u64,
                    length: part.len as u32,
                    lkey: q.lkey,
                };
                // The write-with-immediate that completes this QP's part: carrying the part
                // itself, or (adaptive routing, or an empty part) no bytes.
                let carries_data = part.len > 0 && !ar;
                let mut last = send_wr(
                    q.req,
                    IBV_WR_RDMA_WRITE_WITH_IMM,
                    &mut sge,
                    remote,
                    cts.rkeys[0],
                    imm,
                );
                if !carries_data {
                    last.num_sge = 0;
                    last.sg_list = std::ptr::null_mut();
                }
                let mut sge_data = sge;
                let mut data =
                    send_wr(q.req, IBV_WR_RDMA_WRITE, &mut sge_data, remote, cts.rkeys[0], 0);
                data.send_flags = 0; // unsignaled: `last` completes the part
                data.next = &mut last;
                let first = if ar && part.len > 0 {
                    &mut data
                } else {
                    &mut last
                };
                // SAFETY: the SGEs name the caller's registered buffer (isend's contract
                // keeps it valid until completion); the remote range is inside the receive
                // buffer the CTS announced (size checked above); the chain lives on this
                // stack frame during the call.
                unsafe { qp.post_send(first) }?;
            }
            st.queued.pop_front();
        }
        Ok(())
    }
}

/// A signaled send WR of one SGE.
fn send_wr(
    wr_id: u64,
    opcode: u32,
    sge: &mut ibv_sge,
    remote_addr: u64,
    rkey: u32,
    imm_be: u32,
) -> ibv_send_wr {
    ibv_send_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: IBV_SEND_SIGNALED,
        imm_data: imm_be,
        wr: ibv_send_wr_wr {
            rdma: ibv_send_wr_rdma { remote_addr, rkey },
        },
        qp_type: 0,
        _bind_mw_tso: [0; 6],
    }
}

/// The system's page size (registrations are made of whole pages).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names() {
        assert_eq!(wc_status_name(0), "success");
        assert_eq!(wc_status_name(5), "Work Request Flushed Error");
        assert_eq!(wc_status_name(12), "transport retry counter exceeded");
        assert_eq!(wc_status_name(99), "unknown status");
    }
}

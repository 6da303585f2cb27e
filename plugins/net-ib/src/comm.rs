//! One established connection and its data path (NCCL's CTS protocol):
//!
//! * **receive** (`irecv`, 1 to [`MAX_RECVS`] tagged buffers): post one zero-length receive
//!   per QP (each will take the completion of a write-with-immediate), then RDMA-write one
//!   [`CtsEntry`] per buffer (address, size, rkey, tag) into the sender's FIFO row for this
//!   receive, in one write ([`crate::fifo`]);
//! * **send** (`isend`): queue the message; on each call, look at the next FIFO row **in
//!   local memory** (no verbs call). Once the receiver's whole row is there, a row of `n`
//!   entries takes the next `n` queued sends (it waits until `n` are queued), each matched
//!   by tag to a distinct entry, and posts them as one bundle, per QP: the data writes of
//!   every send's part on that QP ([`crate::split`]), for `n > 1` the write of the `n` sizes
//!   into the receiver's size records (QP 0), and one write-with-immediate that completes
//!   the bundle on that QP. For `n = 1` the immediate carries the size and, without adaptive
//!   routing, the data itself, as before multi-receive;
//! * on a merged device ([`crate::merge`]) a registration has an MR on each physical device's
//!   PD: a CTS entry carries the receive buffer's rkey for each of the receiver's devices,
//!   and each QP's writes go with the lkey of its local device and the rkey of its peer's;
//! * **test** polls the CQs (one per physical device): a request is done when each QP has completed its part (the sends
//!   of a bundle all complete with its completions); the receiver reads the size from the
//!   immediate, or for `n > 1` the sizes from its size records. An error completion fails
//!   the connection (every request on it then fails), and so does EOF on the out-of-band
//!   socket: a dead peer is an error, never a wait without end.
//!
//! A connection is used by one thread at a time in practice; a mutex makes it safe anyway.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use rustccl_plugin_api::PluginError;

use crate::fifo::{
    row_offset, sizes_offset, CtsEntry, Fifo, CTS_BYTES, MAX_DEVS_PER_NIC, MAX_RECVS,
};
use crate::flush::Flush;
use crate::mr_cache::MrCache;
use crate::oob::{conn_info, peer_gone, Pipe};
use crate::qp::{Endpoint, MAX_INFLIGHT};
use crate::settings::QpSettings;
use crate::split::{split, uses_adaptive_routing, Part};
use crate::verbs::types::*;
use crate::verbs::{Mr, Pd, Qp};
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
    /// What `test` reports: the sent size, or the size received into each buffer once
    /// known.
    sizes: Vec<usize>,
    /// Receiver: the receive's sequence number, whose row of size records holds the sizes
    /// of a multi-receive.
    seq: u64,
    /// Sender: the other sends of the bundle this request leads (its work requests carry
    /// this request's id); they complete with it.
    followers: Vec<u64>,
}

/// A send waiting for its CTS.
struct QueuedSend {
    req: u64,
    data: usize,
    size: usize,
    tag: i32,
    /// The send buffer's lkey on each local physical device.
    lkeys: [u32; MAX_DEVS_PER_NIC],
}

/// One buffer of a receive, with the rkeys of its registration (one per physical device).
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    pub addr: usize,
    pub size: usize,
    pub tag: i32,
    pub rkeys: [u32; MAX_DEVS_PER_NIC],
}

/// A registration of the connection's cache: one MR per physical device of the connection
/// (a merged device registers the memory on each member's PD). Memory in the first page of
/// the address space is never mapped (an empty buffer's dangling pointer lands there): it
/// gets no MR and covers nothing, so it serves 0-byte transfers only (which name no memory).
pub struct Registration {
    /// By member; empty for the first page.
    pub mrs: Vec<Mr>,
    pub start: usize,
    pub len: usize,
}

impl Registration {
    /// The first member's lkey (the only one of a plain device).
    pub fn lkey(&self) -> u32 {
        self.lkeys()[0]
    }

    /// The first member's rkey.
    pub fn rkey(&self) -> u32 {
        self.rkeys()[0]
    }

    /// The lkey on each member (0 past the last).
    pub fn lkeys(&self) -> [u32; MAX_DEVS_PER_NIC] {
        let mut keys = [0; MAX_DEVS_PER_NIC];
        for (k, mr) in keys.iter_mut().zip(&self.mrs) {
            *k = mr.lkey();
        }
        keys
    }

    /// The rkey on each member (0 past the last), as a CTS entry carries them.
    pub fn rkeys(&self) -> [u32; MAX_DEVS_PER_NIC] {
        let mut keys = [0; MAX_DEVS_PER_NIC];
        for (k, mr) in keys.iter_mut().zip(&self.mrs) {
            *k = mr.rkey();
        }
        keys
    }
}

/// The part of connection setup that `connect` and `accept` leave to the connection (see
/// [`crate::oob`]), so that neither waits for the other side's next call: a rank may
/// finish `connect` before its peer calls `accept`. The rest happens in
/// `isend`/`irecv`/`test`.
pub enum Setup {
    /// Sender: reading the acceptor's info; then the QPs go to RTS.
    Exchange { qp: QpSettings },
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
    /// Receiver: receives (sequence number, buffers) whose CTS waits for the end of setup.
    deferred_cts: VecDeque<(u64, usize)>,
    /// Sequence number of the next receive (receiver) / of the next FIFO row to consume
    /// (sender).
    next_seq: u64,
    /// The peer's inbox (address, rkey), the region this side RDMA-writes into: the
    /// sender's FIFO (receiver side), the receiver's size records (sender side, learned
    /// during setup).
    remote_inbox: (u64, u32),
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
    /// The device offers dma-buf registration ([`crate::dmabuf`]).
    pub dmabuf: bool,
    /// Receiver on a device with GPU memory, flush not disabled: the loopback QP of
    /// `iflush` ([`crate::flush`]).
    pub flush: Option<Flush>,
    state: Mutex<State>,
}

/// What setup hands over to make a [`Comm`].
pub struct Parts {
    pub ep: Endpoint,
    /// Sender: the FIFO the receiver writes and the staging of the sizes it writes;
    /// receiver: the staging of its CTS writes and the size records the sender writes.
    pub fifo: Fifo,
    pub fifo_mr: Mr,
    pub oob: Pipe,
    pub setup: Option<Setup>,
}

/// Registers `fifo` on the PD of `ep`'s first physical device (that of QP 0, which carries
/// the CTS and size-record writes) for remote writes (into the inbox) and as a local source
/// (of CTS rows or size records).
pub fn register_fifo(ep: &Endpoint, fifo: &Fifo) -> Result<Mr, PluginError> {
    // SAFETY: the FIFO's heap block outlives the registration (both live in the same
    // connection state, the registration dropped first), and the device may write it.
    unsafe {
        ep.pds[0].reg_mr(
            fifo.addr() as *mut c_void,
            fifo.bytes(),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        )
    }
}

impl Comm {
    /// A connection; `remote_inbox` is the sender's FIFO (address, rkey) on the receiving
    /// side, unknown yet (learned during setup) on the sending side.
    pub fn new(
        direction: Direction,
        ctx: u64,
        device: String,
        parts: Parts,
        remote_inbox: (u64, u32),
    ) -> Comm {
        let nqps = parts.ep.qps.len();
        Comm {
            direction,
            ctx,
            device,
            nqps,
            ar_threshold: None,
            dmabuf: false,
            flush: None,
            state: Mutex::new(State {
                ep: parts.ep,
                fifo_mr: parts.fifo_mr,
                fifo: parts.fifo,
                cache: MrCache::new(page_size()),
                requests: HashMap::new(),
                queued: VecDeque::new(),
                deferred_cts: VecDeque::new(),
                next_seq: 0,
                remote_inbox,
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

    /// Sets what the connection offers for GPU memory: dma-buf registration, and (receiver)
    /// the flush QP.
    pub fn with_gpu(mut self, dmabuf: bool, flush: Option<Flush>) -> Comm {
        self.dmabuf = dmabuf;
        self.flush = flush;
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

    /// Registers `data..data + size` (through the cache) on every physical device's PD;
    /// returns the cache entry id and the keys.
    pub fn reg_mr(
        &self,
        data: usize,
        size: usize,
    ) -> Result<(u64, Arc<Registration>), PluginError> {
        let mut st = self.lock();
        let pds = st.ep.pds.clone();
        st.cache.acquire(data, size, |start, len| {
            if start == 0 {
                return Ok(Registration {
                    mrs: Vec::new(),
                    start: 0,
                    len: 0,
                });
            }
            let mrs = pds
                .iter()
                .map(|pd| {
                    // SAFETY: the caller registered memory of this process, which must stay
                    // mapped until deregistration (the net ABI's contract for regMr).
                    unsafe {
                        pd.reg_mr(
                            start as *mut c_void,
                            len,
                            IBV_ACCESS_LOCAL_WRITE
                                | IBV_ACCESS_REMOTE_WRITE
                                | IBV_ACCESS_REMOTE_READ,
                        )
                    }
                })
                .collect::<Result<Vec<Mr>, PluginError>>()?;
            Ok(Registration { mrs, start, len })
        })
    }

    /// Runs `f` on the connection's PDs (one per physical device) and registration cache,
    /// for registrations made elsewhere ([`crate::dmabuf::register`]); [`Comm::dereg_mr`]
    /// releases them.
    pub fn with_cache<T>(&self, f: impl FnOnce(&[Arc<Pd>], &mut MrCache<Registration>) -> T) -> T {
        let mut st = self.lock();
        let pds = st.ep.pds.clone();
        f(&pds, &mut st.cache)
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

    /// The connection's QPs (address, number) and CQ address on its physical device
    /// `member`: how the async-event thread ([`crate::async_events`]) recognises the objects
    /// an event names.
    pub fn verbs_objects(&self, member: usize) -> (Vec<(usize, u32)>, usize) {
        let st = self.lock();
        let qps = (st.ep.qps.iter().zip(&st.ep.qp_members))
            .filter(|&(_, &m)| m == member)
            .map(|(q, _)| (q.as_ptr() as usize, q.qp_num()));
        (qps.collect(), st.ep.cqs[member].as_ptr() as usize)
    }

    /// Fails connections from outside their calls (the async-event thread): each reports
    /// its error from then on (unless it had failed already), and its peer sees the
    /// out-of-band socket close. All are locked first, so a connection that is both hit and
    /// the peer of another hit one reports its own error, not the loss of its peer.
    pub fn fail_together(targets: &[(Arc<Comm>, PluginError)]) {
        let mut order: Vec<&(Arc<Comm>, PluginError)> = targets.iter().collect();
        order.sort_by_key(|(c, _)| Arc::as_ptr(c) as usize); // one lock order everywhere
                                                             // A connection on several physical devices of one context (a merged dual-port NIC)
                                                             // may be named more than once: it is locked, and fails, once.
        order.dedup_by_key(|(c, _)| Arc::as_ptr(c) as usize);
        let mut states: Vec<MutexGuard<'_, State>> = order.iter().map(|(c, _)| c.lock()).collect();
        for ((c, e), st) in order.iter().zip(states.iter_mut()) {
            c.fail(st, e.clone());
        }
    }

    /// Queues a send; `Ok(false)`: too many requests in flight, call again.
    /// Queues a send of `data..data + size` (registered with `lkeys`, one per physical
    /// device); `Ok(false)`: too many requests in flight, call again.
    pub fn isend(
        &self,
        req: u64,
        data: usize,
        size: usize,
        tag: i32,
        lkeys: [u32; MAX_DEVS_PER_NIC],
    ) -> Result<bool, PluginError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        if st.requests.len() >= MAX_INFLIGHT {
            self.progress(&mut st);
            return Ok(false);
        }
        st.queued.push_back(QueuedSend {
            req,
            data,
            size,
            tag,
            lkeys,
        });
        st.requests.insert(
            req,
            Request {
                remaining: self.nqps,
                sizes: vec![size],
                seq: 0,
                followers: Vec::new(),
            },
        );
        self.progress(&mut st);
        Ok(true)
    }

    /// Posts a receive into `bufs` (1 to [`MAX_RECVS`], checked by the caller, each
    /// registered with its rkey); `Ok(false)`: too many requests in flight, call again.
    pub fn irecv(&self, req: u64, bufs: &[RecvBuf]) -> Result<bool, PluginError> {
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
        let entries: Vec<CtsEntry> = bufs
            .iter()
            .map(|b| CtsEntry {
                addr: b.addr as u64,
                size: b.size as u64,
                rkeys: b.rkeys,
                tag: b.tag,
                ..CtsEntry::default()
            })
            .collect();
        st.fifo.fill(seq, &entries);
        if st.setup.is_some() {
            st.deferred_cts.push_back((seq, bufs.len()));
        } else if let Err(e) = Self::post_cts(&mut st, seq, bufs.len()) {
            return Err(self.fail(&mut st, e));
        }
        st.next_seq += 1;
        st.requests.insert(
            req,
            Request {
                remaining: self.nqps,
                sizes: vec![0; bufs.len()],
                seq,
                followers: Vec::new(),
            },
        );
        Ok(true)
    }

    /// RDMA-writes the `n` staged CTS entries of receive `seq` into the sender's FIFO row.
    fn post_cts(st: &mut State, seq: u64, n: usize) -> Result<(), PluginError> {
        let (remote, remote_rkey) = st.remote_inbox;
        let mut sge = ibv_sge {
            addr: st.fifo.entries_addr() + row_offset(seq),
            length: (n * CTS_BYTES) as u32,
            lkey: st.fifo_mr.lkey(),
        };
        let mut wr = send_wr(
            CTS_WR_ID,
            IBV_WR_RDMA_WRITE,
            &mut sge,
            remote + row_offset(seq),
            remote_rkey,
            0,
        );
        // SAFETY: the SGE names the staging FIFO's row, registered for the connection's
        // life and not refilled before the sender has read it (rows are consumed in order,
        // at most FIFO_ROWS receives in flight: see crate::fifo); the remote address is the
        // sender's FIFO row.
        unsafe { st.ep.qps[0].post_send(&mut wr) }
    }

    /// Whether request `req` is done (`Some(sizes)`: the sent size, or the size received
    /// into each buffer); an error if the connection failed before it completed. A finished
    /// or failed request is forgotten.
    pub fn test(&self, req: u64) -> Result<Option<Vec<usize>>, PluginError> {
        let mut st = self.lock();
        self.progress(&mut st);
        match st.requests.get(&req) {
            None => Err(PluginError::invalid_argument(format!(
                "unknown request {req:#x}"
            ))),
            Some(r) if r.remaining == 0 => {
                let r = st.requests.remove(&req).expect("just seen");
                if self.direction == Direction::Recv && r.sizes.len() > 1 {
                    // The sender wrote them before the write-with-immediate of QP 0, whose
                    // completion is in.
                    return Ok(Some(st.fifo.sizes(r.seq, r.sizes.len())));
                }
                Ok(Some(r.sizes))
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
                Some(Setup::Exchange { qp }) => {
                    let Some(bytes) = st.oob.progress().map_err(lost)? else {
                        st.setup = Some(Setup::Exchange { qp });
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
                    st.ep.connect(&peer, &qp)?;
                    st.remote_inbox = (peer.inbox_addr, peer.inbox_rkey);
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
                    while let Some((seq, n)) = st.deferred_cts.pop_front() {
                        Self::post_cts(st, seq, n)?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Polls the CQs, starts sends whose CTS arrived, and checks the peer.
    fn progress(&self, st: &mut State) {
        if st.failed.is_some() {
            return;
        }
        if let Err(e) = self.advance_setup(st) {
            self.fail(st, e);
            return;
        }
        let mut wc = [ibv_wc::default(); 16];
        let mut member = 0;
        while member < st.ep.cqs.len() {
            let n = match st.ep.cqs[member].poll(&mut wc) {
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
                let Some(r) = st.requests.get_mut(&c.wr_id) else {
                    continue;
                };
                r.remaining = r.remaining.saturating_sub(1);
                if c.opcode == IBV_WC_RECV_RDMA_WITH_IMM && r.sizes.len() == 1 {
                    r.sizes[0] = u32::from_be(c.imm_data) as usize;
                }
                if r.remaining == 0 {
                    for f in std::mem::take(&mut r.followers) {
                        if let Some(f) = st.requests.get_mut(&f) {
                            f.remaining = 0;
                        }
                    }
                }
            }
            if n < wc.len() {
                member += 1;
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

    /// Posts the queued sends whose CTS rows are in the FIFO, row by row in order: a row of
    /// `n` entries takes the next `n` queued sends, once that many are queued.
    fn start_sends(&self, st: &mut State) -> Result<(), PluginError> {
        loop {
            let row = st
                .fifo
                .posted(st.next_seq)
                .map_err(|e| PluginError::remote(format!("NET/IB : {e} on {}", self.device)))?;
            let Some(row) = row else {
                return Ok(());
            };
            // entry_of[i]: the entry that queued send i fills. Matching runs on what is
            // queued so far, so a send that fits no entry fails now, not when the rest come.
            let mut entry_of = Vec::with_capacity(row.len());
            let mut taken = [false; MAX_RECVS];
            for q in st.queued.iter().take(row.len()) {
                let Some(e) = (0..row.len()).find(|&e| !taken[e] && row[e].tag == q.tag) else {
                    let tags: Vec<i32> = row.iter().map(|e| e.tag).collect();
                    return Err(PluginError::invalid_usage(format!(
                        "NET/IB : send with tag {} matches no free buffer of the receive it meets (tags {tags:?}) on {}; sends and receives must be posted in the same order with the same tags",
                        q.tag, self.device
                    )));
                };
                if q.size as u64 > row[e].size {
                    return Err(PluginError::invalid_usage(format!(
                        "NET/IB : message of {} bytes (tag {}) is larger than the receive buffer of {} bytes on {}",
                        q.size, q.tag, row[e].size, self.device
                    )));
                }
                taken[e] = true;
                entry_of.push(e);
            }
            if entry_of.len() < row.len() {
                return Ok(());
            }
            let sends: Vec<QueuedSend> = st.queued.drain(..row.len()).collect();
            let seq = st.next_seq;
            self.post_bundle(st, seq, &row, &sends, &entry_of)?;
            let lead = sends[0].req;
            let followers: Vec<u64> = sends[1..].iter().map(|q| q.req).collect();
            if let Some(r) = st.requests.get_mut(&lead) {
                r.followers = followers;
            }
            st.next_seq += 1;
        }
    }

    /// Posts the bundle of FIFO row `seq`: `sends[i]` into the buffer of `row[entry_of[i]]`.
    /// Every work request carries the first send's id (the bundle's lead).
    fn post_bundle(
        &self,
        st: &mut State,
        seq: u64,
        row: &[CtsEntry],
        sends: &[QueuedSend],
        entry_of: &[usize],
    ) -> Result<(), PluginError> {
        let n = row.len();
        let lead = sends[0].req;
        // A multi-receive always posts the adaptive-routing way: its sends target several
        // buffers, so only a final 0-byte write-with-immediate can complete them all (NCCL
        // does the same; its threshold applies to single receives only).
        let ar = n > 1 || uses_adaptive_routing(self.ar_threshold, sends[0].size);
        let imm = if n == 1 {
            (sends[0].size as u32).to_be()
        } else {
            0
        };
        let sizes = (n > 1).then(|| {
            let mut sizes = [0u32; MAX_RECVS];
            for (q, &e) in sends.iter().zip(entry_of) {
                sizes[e] = q.size as u32;
            }
            let (addr, len) = st.fifo.stage_sizes(seq, &sizes[..n]);
            ibv_sge {
                addr,
                length: len as u32,
                lkey: st.fifo_mr.lkey(),
            }
        });
        let parts: Vec<Vec<Part>> = sends.iter().map(|q| split(q.size, self.nqps)).collect();
        for (qi, qp) in st.ep.qps.iter().enumerate() {
            // This QP's keys: the lkey on its device, the rkey on its peer's device.
            let (local, remote) = (st.ep.qp_members[qi], st.ep.remote_members[qi]);
            let mut chain = Vec::with_capacity(MAX_RECVS + 2);
            for ((q, &e), parts) in sends.iter().zip(entry_of).zip(&parts) {
                let part = parts[qi];
                if part.len == 0 {
                    continue;
                }
                chain.push(ChainWr {
                    opcode: IBV_WR_RDMA_WRITE,
                    sge: Some(ibv_sge {
                        addr: (q.data + part.offset) as u64,
                        length: part.len as u32,
                        lkey: q.lkeys[local],
                    }),
                    remote: row[e].addr + part.offset as u64,
                    rkey: row[e].rkeys[remote],
                    imm_be: 0,
                });
            }
            if let (0, Some(sge)) = (qi, sizes) {
                let (records, rkey) = st.remote_inbox;
                chain.push(ChainWr {
                    opcode: IBV_WR_RDMA_WRITE,
                    sge: Some(sge),
                    remote: records + sizes_offset(seq),
                    rkey,
                    imm_be: 0,
                });
            }
            // The write-with-immediate that completes this QP's share of the bundle: a
            // single receive's part itself, or (adaptive routing, multi-receive, or an
            // empty part) no bytes after the plain writes.
            match chain.last_mut() {
                Some(last) if !ar => {
                    last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                    last.imm_be = imm;
                }
                _ => chain.push(ChainWr {
                    opcode: IBV_WR_RDMA_WRITE_WITH_IMM,
                    sge: None,
                    remote: row[0].addr,
                    rkey: row[0].rkeys[remote],
                    imm_be: imm,
                }),
            }
            // SAFETY: the SGEs name the callers' registered buffers (isend's contract keeps
            // them valid until completion) and the FIFO's size staging (registered, not
            // restaged before this row completed: see crate::fifo); each remote range is
            // inside the receive buffer its CTS entry announced (sizes checked by the
            // caller) or the receiver's size-record row.
            unsafe { post_chain(qp, lead, &chain) }?;
        }
        Ok(())
    }
}

/// One work request of a chain, before the chain is linked.
struct ChainWr {
    opcode: u32,
    /// `None`: no bytes (a 0-byte write-with-immediate).
    sge: Option<ibv_sge>,
    remote: u64,
    rkey: u32,
    imm_be: u32,
}

/// Posts `chain` on `qp` as one linked list of work requests with `wr_id`, only the last
/// signaled (its completion retires the ones before it).
///
/// # Safety
/// As [`Qp::post_send`]: every SGE and remote range must be valid for the transfer.
unsafe fn post_chain(qp: &Qp, wr_id: u64, chain: &[ChainWr]) -> Result<(), PluginError> {
    let mut sges: Vec<ibv_sge> = chain
        .iter()
        .map(|w| {
            w.sge.unwrap_or(ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            })
        })
        .collect();
    let mut wrs: Vec<ibv_send_wr> = chain
        .iter()
        .zip(sges.iter_mut())
        .map(|(w, sge)| {
            let mut wr = send_wr(wr_id, w.opcode, sge, w.remote, w.rkey, w.imm_be);
            if w.sge.is_none() {
                wr.num_sge = 0;
                wr.sg_list = std::ptr::null_mut();
            }
            wr.send_flags = 0;
            wr
        })
        .collect();
    let Some(last) = wrs.last_mut() else {
        return Ok(());
    };
    last.send_flags = IBV_SEND_SIGNALED;
    let p = wrs.as_mut_ptr();
    for i in 1..wrs.len() {
        // SAFETY: i - 1 and i are inside `wrs`, which is not resized while the chain is
        // posted.
        unsafe { (*p.add(i - 1)).next = p.add(i) };
    }
    // SAFETY: the chain lives on this frame during the call; the caller's promise on the
    // memory it names.
    unsafe { qp.post_send(&mut *p) }
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

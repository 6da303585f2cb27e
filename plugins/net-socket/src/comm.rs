//! One established connection, seen from either end: its requests, the message framing on
//! the control socket, and the hand-off of chunks to the helper threads.
//!
//! **Sending** a message (`post_send`): a [`Header`] (sequence number, size, tag, first
//! socket) is queued on the control socket and written as far as the socket takes it
//! (non-blocking; helper thread 0 writes the rest), and the message's chunks
//! ([`stripe_from`]) go to the helper threads at once. The send is complete when its header
//! is written and every chunk is in the kernel.
//!
//! **Receiving** (`post_recv`): receives wait in posting order. Each header that arrives on
//! the control socket goes to the oldest waiting receive (helper thread 0 reads headers, and
//! so do `post_recv` and `test`, whichever comes first); then the message's chunks go to the
//! helper threads, to be read into the buffer. A message larger than the buffer fails that
//! receive, and its chunks are read and dropped so that the following messages still line
//! up. The receive is complete when every chunk is in.
//!
//! Both sides rotate the first socket of each message over the data sockets; the header says
//! where the message starts, so the two sides never have to agree by counting.
//!
//! Failures: a control-socket error, or a data-socket error reported by a helper thread,
//! fails the connection and every pending request with it (code "remote", naming the peer).
//! On the receiving side the control socket closing is not an error by itself: it is one
//! only for receives that still wait for a header. The sending side never reads anything
//! from its control socket, so there the end of the stream means the receiver is gone.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::poll::PollFlags;
use rustccl_plugin_api::net::{RecvBuffer, MAX_REQUESTS};
use rustccl_plugin_api::{LogFn, PluginError};
use socket2::Socket;

use crate::connect::{set_liveness, Established, SEND_FLAGS};
use crate::striping::{stripe_from, Reassembly, DEFAULT_MIN_CHUNK};
use crate::wire::{Header, HEADER_BYTES};
use crate::sealing::{seal_chunks, BufferPool, RECORD_PLAIN};
use crate::worker::{Action, Control, Dispatch, Link, Pool, Task, Transfer, Workers};

/// Which end of the connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Send,
    Recv,
}

/// A posted request.
enum Op {
    Send {
        size: usize,
        header_end: u64,
        transfer: Arc<Transfer>,
    },
    /// A receive whose message has not been announced yet.
    Waiting { buf: RecvBuffer },
    Recv {
        size: usize,
        transfer: Arc<Transfer>,
    },
    /// A receive that failed on its own (message too large); reported by the next `test`.
    Failed(PluginError),
}

struct State {
    ops: HashMap<u64, Op>,
    /// Sender: header bytes not yet written to the control socket.
    outbox: VecDeque<u8>,
    /// Sender: header bytes written so far, and queued so far (running totals).
    ctrl_written: u64,
    ctrl_queued: u64,
    /// Receiver: receives waiting for a header, oldest first.
    waiting: VecDeque<u64>,
    /// Receiver: bytes of a header not complete yet.
    inbuf: Vec<u8>,
    /// Receiver: the control socket reached end of stream.
    ctrl_closed: bool,
    /// Sequence number of the next message (sent or expected).
    next_seq: u64,
    /// Sender: data socket the next message starts on.
    next_socket: usize,
    /// Set by `close`: nothing works any more.
    closed: bool,
    /// Encrypted sender: seals each header into a record before it joins `outbox`.
    seal: Option<rustccl_securewire::Sealer>,
    /// Encrypted receiver: opens the header records (each [`ctrl_record`] bytes).
    open: Option<rustccl_securewire::Opener>,
}

/// Bytes of one header on the control socket: the header, or its record when encrypted.
fn ctrl_record(encrypted: bool) -> usize {
    if encrypted {
        rustccl_securewire::RECORD_HEADER_BYTES + HEADER_BYTES + rustccl_securewire::TAG_BYTES
    } else {
        HEADER_BYTES
    }
}

/// One end of a connection.
pub struct Comm {
    pub dir: Direction,
    /// The handle of the context that made it (for `finalize`).
    pub ctx: u64,
    shared: Arc<Shared>,
    pool: Mutex<Pool>,
}

/// What the connection's owner and its helper thread 0 share.
struct Shared {
    dir: Direction,
    peer: SocketAddr,
    nsocks: usize,
    ctrl: Socket,
    link: Arc<Link>,
    dispatch: Dispatch,
    state: Mutex<State>,
    /// Encrypted sender: each data socket's sealer. `post_send` seals a message's chunks
    /// under this lock (never under `state`'s, which helper thread 0 takes), so that the
    /// sealing overlaps the helper threads' writes of earlier messages, and records reach
    /// each socket in the order of their nonces ([`crate::sealing`]).
    sealers: Option<Mutex<Vec<rustccl_securewire::Sealer>>>,
    /// Encrypted sender: the record buffers.
    buffers: Arc<BufferPool>,
}

impl Comm {
    /// Takes over an established connection and starts its helper threads; with `liveness`,
    /// a peer silent for that long fails the connection ([`set_liveness`]).
    pub fn new(
        dir: Direction,
        ctx: u64,
        est: Established,
        log: LogFn,
        liveness: Option<Duration>,
    ) -> io::Result<Comm> {
        est.ctrl.set_nonblocking(true)?;
        if let Some(limit) = liveness {
            for sock in std::iter::once(&est.ctrl).chain(&est.data) {
                set_liveness(sock, limit)?;
            }
        }
        let link = Link::new(est.peer, log);
        let nsocks = est.data.len();
        // Encrypted: each socket's key in the one direction the connection carries data.
        let label = |i: usize| crate::connect::socket_label(i as u32);
        let sealers = est
            .keys
            .as_ref()
            .filter(|_| dir == Direction::Send)
            .map(|k| Mutex::new((0..nsocks).map(|i| k.sealer(&label(i))).collect()));
        let openers = est.keys.as_ref().filter(|_| dir == Direction::Recv).map(|k| {
            (0..nsocks)
                .map(|i| k.opener(&label(i), RECORD_PLAIN))
                .collect()
        });
        let ctrl_label = crate::connect::socket_label(crate::wire::CONTROL_SOCKET);
        let seal = est
            .keys
            .as_ref()
            .filter(|_| dir == Direction::Send)
            .map(|k| k.sealer(&ctrl_label));
        let open = est
            .keys
            .as_ref()
            .filter(|_| dir == Direction::Recv)
            .map(|k| k.opener(&ctrl_label, HEADER_BYTES));
        let (dispatch, workers) = Workers::prepare(link.clone(), est.data, est.nthreads, openers)?;
        let shared = Arc::new(Shared {
            dir,
            peer: est.peer,
            nsocks,
            ctrl: est.ctrl,
            link,
            dispatch,
            state: Mutex::new(State {
                ops: HashMap::new(),
                outbox: VecDeque::new(),
                ctrl_written: 0,
                ctrl_queued: 0,
                waiting: VecDeque::new(),
                inbuf: Vec::with_capacity(HEADER_BYTES),
                ctrl_closed: false,
                next_seq: 0,
                next_socket: 0,
                closed: false,
                seal,
                open,
            }),
            sealers,
            buffers: Arc::default(),
        });
        let pool = workers.start(Some(shared.clone()))?;
        Ok(Comm {
            dir,
            ctx,
            shared,
            pool: Mutex::new(pool),
        })
    }

    pub fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    /// Posts a send as request `id`. `Ok(false)`: [`MAX_REQUESTS`] are pending, try later.
    ///
    /// # Safety
    /// `data..data + size` must stay valid and unchanged until the request completes or
    /// the connection is closed.
    pub unsafe fn post_send(
        &self,
        id: u64,
        data: usize,
        size: usize,
        tag: i32,
    ) -> Result<bool, PluginError> {
        self.shared.post_send(id, data, size, tag)
    }

    /// Posts a receive into `buf` as request `id`. `Ok(false)`: [`MAX_REQUESTS`] are
    /// pending, try later.
    ///
    /// # Safety
    /// The buffer must stay valid and untouched until the request completes or the
    /// connection is closed.
    pub unsafe fn post_recv(&self, id: u64, buf: RecvBuffer) -> Result<bool, PluginError> {
        self.shared.post_recv(id, buf)
    }

    /// Whether request `id` is done: `Ok(Some(size))` (and the request is forgotten),
    /// `Ok(None)` while in flight, or its error (and the request is forgotten).
    pub fn test(&self, id: u64) -> Result<Option<usize>, PluginError> {
        self.shared.test(id)
    }

    /// Stops the helper threads (waiting for them), forgets every pending request and closes
    /// the data sockets. Safe to call more than once; the control socket closes on drop.
    pub fn close(&self) {
        let mut st = self.shared.lock();
        st.closed = true;
        st.ops.clear();
        st.waiting.clear();
        drop(st);
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).stop();
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.close();
    }
}

impl Control for Shared {
    fn progress(&self, readable: bool) -> Option<PollFlags> {
        let mut st = self.lock();
        if st.closed || self.link.error().is_some() {
            return None;
        }
        match self.dir {
            Direction::Send => {
                self.flush_headers(&mut st);
                if readable {
                    self.watch_for_hangup();
                }
                let mut events = PollFlags::POLLIN;
                if !st.outbox.is_empty() {
                    events |= PollFlags::POLLOUT;
                }
                (self.link.error().is_none()).then_some(events)
            }
            Direction::Recv => {
                self.read_headers(&mut st);
                (!st.waiting.is_empty() && !st.ctrl_closed && self.link.error().is_none())
                    .then_some(PollFlags::POLLIN)
            }
        }
    }

    fn socket(&self) -> &Socket {
        &self.ctrl
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn submit(&self, tasks: Vec<Task>) {
        if !tasks.is_empty() {
            self.dispatch.submit(tasks);
        }
    }

    /// The connection's failure as a plugin error, if it failed.
    fn failure(&self, st: &State) -> Option<PluginError> {
        if st.closed {
            return Some(PluginError::invalid_usage(format!(
                "the connection to {} is closed",
                self.peer
            )));
        }
        self.link
            .error()
            .map(|why| PluginError::remote(why.to_string()))
    }

    /// See [`Comm::post_send`] (whose caller vouches for the buffer).
    fn post_send(&self, id: u64, data: usize, size: usize, tag: i32) -> Result<bool, PluginError> {
        // Encrypted: held until the message's records are handed to the helper threads.
        let mut sealers = self
            .sealers
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
        let mut st = self.lock();
        if let Some(e) = self.failure(&st) {
            return Err(e);
        }
        if st.ops.len() >= MAX_REQUESTS {
            return Ok(false);
        }
        let first = st.next_socket;
        let chunks = stripe_from(size, self.nsocks, DEFAULT_MIN_CHUNK, first)
            .map_err(|e| PluginError::internal(e.to_string()))?;
        st.next_socket = (first + chunks.len()) % self.nsocks;
        let header = Header {
            seq: st.next_seq,
            size: size as u64,
            tag,
            first_socket: first as u32,
        };
        st.next_seq += 1;
        match st.seal.as_mut() {
            Some(sealer) => {
                let mut record = Vec::with_capacity(ctrl_record(true));
                sealer
                    .seal_into(&header.encode(), &mut record)
                    .map_err(|e| {
                        PluginError::remote(format!("connection to {}: {e}", self.peer))
                    })?;
                st.ctrl_queued += record.len() as u64;
                st.outbox.extend(record);
            }
            None => {
                st.outbox.extend(header.encode());
                st.ctrl_queued += HEADER_BYTES as u64;
            }
        }
        let header_end = st.ctrl_queued;
        let plan = Reassembly::new_from(size, self.nsocks, DEFAULT_MIN_CHUNK, first)
            .map_err(|e| PluginError::internal(e.to_string()))?;
        let transfer = Transfer::new(plan);
        st.ops.insert(
            id,
            Op::Send {
                size,
                header_end,
                transfer: transfer.clone(),
            },
        );
        self.flush_headers(&mut st);
        if !st.outbox.is_empty() {
            self.dispatch.wake_control();
        }
        let sealed = match sealers.as_deref_mut() {
            None => None,
            Some(sealers) => {
                drop(st);
                // SAFETY: the caller of `isend` vouches that `data..data + size` is valid and
                // unchanged until the request completes; it is only read here.
                let message = unsafe { std::slice::from_raw_parts(data as *const u8, size) };
                match seal_chunks(sealers, &chunks, message, &self.buffers) {
                    Ok(sealed) => Some(sealed),
                    Err(e) => {
                        let why = format!("peer {}: {e}", self.peer);
                        self.link.fail(why.clone());
                        return Err(PluginError::remote(why));
                    }
                }
            }
        };
        let mut sealed = sealed.map(Vec::into_iter);
        let tasks = chunks
            .into_iter()
            .map(|chunk| Task {
                action: Action::Send,
                chunk,
                base: data,
                transfer: transfer.clone(),
                moved: 0,
                sealed: sealed.as_mut().and_then(Iterator::next),
            })
            .collect();
        self.submit(tasks);
        Ok(true)
    }

    /// See [`Comm::post_recv`] (whose caller vouches for the buffer).
    fn post_recv(&self, id: u64, buf: RecvBuffer) -> Result<bool, PluginError> {
        let mut st = self.lock();
        if let Some(e) = self.failure(&st) {
            return Err(e);
        }
        if st.ops.len() >= MAX_REQUESTS {
            return Ok(false);
        }
        st.ops.insert(id, Op::Waiting { buf });
        st.waiting.push_back(id);
        self.read_headers(&mut st);
        if !st.waiting.is_empty() {
            self.dispatch.wake_control();
        }
        Ok(true)
    }

    fn test(&self, id: u64) -> Result<Option<usize>, PluginError> {
        let mut st = self.lock();
        if st.closed {
            return Err(self.failure(&st).expect("closed"));
        }
        match self.dir {
            Direction::Send => self.flush_headers(&mut st),
            Direction::Recv => self.read_headers(&mut st),
        }
        let failure = self.failure(&st);
        let done = match st.ops.get(&id) {
            None => {
                return Err(PluginError::invalid_argument(format!(
                    "request {id:#x} is not pending on the connection to {}",
                    self.peer
                )))
            }
            Some(Op::Send {
                size,
                header_end,
                transfer,
            }) => (st.ctrl_written >= *header_end && transfer.is_complete()).then_some(Ok(*size)),
            Some(Op::Recv { size, transfer }) => transfer.is_complete().then_some(Ok(*size)),
            Some(Op::Failed(e)) => Some(Err(e.clone())),
            Some(Op::Waiting { .. }) if st.ctrl_closed && failure.is_none() => {
                Some(Err(PluginError::remote(format!(
                "peer {} closed the connection before sending the message this receive waits for",
                self.peer
            ))))
            }
            Some(Op::Waiting { .. }) => None,
        };
        match (done, failure) {
            (Some(result), _) => {
                st.ops.remove(&id);
                st.waiting.retain(|w| *w != id);
                result.map(Some)
            }
            (None, Some(e)) => {
                st.ops.remove(&id);
                st.waiting.retain(|w| *w != id);
                Err(e)
            }
            (None, None) => Ok(None),
        }
    }

    /// Sender: writes queued header bytes as far as the control socket takes them.
    fn flush_headers(&self, st: &mut State) {
        while !st.outbox.is_empty() {
            let (front, _) = st.outbox.as_slices();
            match self.ctrl.send_with_flags(front, SEND_FLAGS) {
                Ok(n) => {
                    st.outbox.drain(..n);
                    st.ctrl_written += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.link.fail(format!(
                        "peer {} connection failed: {e} (control socket)",
                        self.peer
                    ));
                    return;
                }
            }
        }
    }

    /// Sender: the receiver never writes to the control socket, so anything readable there
    /// (end of stream, reset) means it is gone.
    fn watch_for_hangup(&self) {
        let mut byte = [0u8; 1];
        match (&self.ctrl).read(&mut byte) {
            // The receiver hung up: normal teardown unless a send is still waiting, which
            // then fails with this reason.
            Ok(0) => self
                .link
                .fail_quietly(format!("peer {} closed the connection", self.peer)),
            Ok(_) => self.link.fail(format!(
                "peer {} wrote to the control socket of a send connection",
                self.peer
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => self.link.fail(format!(
                "peer {} connection failed: {e} (control socket)",
                self.peer
            )),
        }
    }

    /// Receiver: reads the headers that have arrived and matches them to waiting receives
    /// (never reads further than the receives posted so far need).
    fn read_headers(&self, st: &mut State) {
        while !st.waiting.is_empty() && !st.ctrl_closed && self.link.error().is_none() {
            let got = st.inbuf.len();
            let want = ctrl_record(st.open.is_some());
            let mut bytes = [0u8; 64];
            match (&self.ctrl).read(&mut bytes[..want - got]) {
                Ok(0) => st.ctrl_closed = true,
                Ok(n) => {
                    st.inbuf.extend_from_slice(&bytes[..n]);
                    if st.inbuf.len() < want {
                        continue;
                    }
                    let mut record = std::mem::take(&mut st.inbuf);
                    let plain = match st.open.as_mut() {
                        None => Ok(&record[..]),
                        Some(opener) => {
                            let (head, body) =
                                record.split_at_mut(rustccl_securewire::RECORD_HEADER_BYTES);
                            opener
                                .open_in_place(head.try_into().expect("4 bytes"), body)
                                .map(|p| &*p)
                        }
                    };
                    match plain.map(<[u8; HEADER_BYTES]>::try_from) {
                        Ok(Ok(bytes)) => self.start_receive(st, Header::decode(&bytes)),
                        Ok(Err(_)) => self.link.fail(format!(
                            "peer {}: a control record of the wrong size",
                            self.peer
                        )),
                        Err(e) => self.link.fail(format!(
                            "peer {}: control socket: {e}; the connection is dropped",
                            self.peer
                        )),
                    }
                    record.clear();
                    st.inbuf = record;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.link.fail(format!(
                    "peer {} connection failed: {e} (control socket)",
                    self.peer
                )),
            }
        }
    }

    /// Gives the message `header` announces to the oldest waiting receive. A header that
    /// makes no sense fails the connection (the receive stays, to report that failure).
    fn start_receive(&self, st: &mut State, header: Header) {
        let bad = |why: String| format!("peer {} sent a bad message header: {why}", self.peer);
        if header.seq != st.next_seq {
            return self.link.fail(bad(format!(
                "sequence number {} where {} was due",
                header.seq, st.next_seq
            )));
        }
        let first = header.first_socket as usize;
        if first >= self.nsocks || header.size > isize::MAX as u64 {
            return self.link.fail(bad(format!(
                "size {} starting on socket {first} of {}",
                header.size, self.nsocks
            )));
        }
        st.next_seq += 1;
        let id = st.waiting.pop_front().expect("a receive waits");
        let Some(Op::Waiting { buf }) = st.ops.remove(&id) else {
            unreachable!("waiting receives are Op::Waiting")
        };
        let size = header.size as usize;
        let fits = size <= buf.size;
        let chunks = stripe_from(size, self.nsocks, DEFAULT_MIN_CHUNK, first).expect("nsocks > 0");
        let transfer = Transfer::new(
            Reassembly::new_from(size, self.nsocks, DEFAULT_MIN_CHUNK, first).expect("nsocks > 0"),
        );
        let action = if fits { Action::Recv } else { Action::Discard };
        let tasks = chunks
            .into_iter()
            .map(|chunk| Task {
                action,
                chunk,
                base: buf.data,
                transfer: transfer.clone(),
                moved: 0,
                sealed: None,
            })
            .collect();
        self.submit(tasks);
        let op = if fits {
            Op::Recv { size, transfer }
        } else {
            Op::Failed(PluginError::invalid_usage(format!(
                "message {} from {} (tag {}) is {size} bytes, larger than the {}-byte receive buffer (tag {})",
                header.seq, self.peer, header.tag, buf.size, buf.tag
            )))
        };
        st.ops.insert(id, op);
    }
}

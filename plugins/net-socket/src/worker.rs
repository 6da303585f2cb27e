//! The helper threads that move a connection's bytes.
//!
//! A connection has `nthreads` helper threads; data socket `i` belongs to thread
//! `i % nthreads`, so consecutive sockets (which carry the chunks of one message) are driven
//! by different threads. A thread keeps, for each of its sockets, a FIFO of [`Task`]s (one
//! chunk each: send it, receive it into a buffer, or receive and drop it) in the order the
//! connection posted them, and works on the head of every FIFO with non-blocking I/O, round
//! robin; when no socket can move it sleeps in `poll(2)` on its sockets and on a wake-up
//! socket that [`Dispatch::submit`] and [`Pool::stop`] write to.
//!
//! Thread 0 also looks after the connection's control socket ([`Control`]): it writes
//! queued message headers and reads arriving ones, so that a connection moves even while its
//! owner tests only other requests (or none).
//!
//! A finished chunk is reported to its message's [`Transfer`]. A socket error or an early
//! end of stream fails the whole connection ([`Link::fail`]): the thread stops, and the
//! connection turns every pending request into that error.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use rustccl_plugin_api::{subsys, LogFn};
use socket2::Socket;

use crate::connect::SEND_FLAGS;
use crate::striping::{Chunk, Reassembly};

/// Which chunks of one message are done (on either side), shared by the helper threads that
/// carry them and the connection that waits for them.
#[derive(Debug)]
pub struct Transfer {
    chunks: Mutex<Reassembly>,
}

impl Transfer {
    pub fn new(plan: Reassembly) -> Arc<Transfer> {
        Arc::new(Transfer {
            chunks: Mutex::new(plan),
        })
    }

    pub fn is_complete(&self) -> bool {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_complete()
    }

    fn chunk_done(&self, chunk: Chunk) -> Result<(), String> {
        let mut plan = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        plan.accept(chunk).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// What one task does with its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Write the chunk from the message buffer.
    Send,
    /// Read the chunk into the message buffer.
    Recv,
    /// Read the chunk and drop it (its receive failed; the stream must stay in step).
    Discard,
}

/// One chunk to move over one data socket.
#[derive(Debug)]
pub struct Task {
    pub action: Action,
    /// `chunk.socket` is the connection's data socket index.
    pub chunk: Chunk,
    /// Address of the message's first byte (unused for [`Action::Discard`]).
    pub base: usize,
    pub transfer: Arc<Transfer>,
    /// Bytes of the chunk moved so far (of `sealed`'s bytes, when it has them).
    pub moved: usize,
    /// Encrypted send: the chunk's records, sealed by the thread that posted the send; the
    /// task writes these bytes instead of the chunk's.
    pub sealed: Option<Sealed>,
}

/// A chunk's records ([`crate::sealing`]): `len` bytes at `start` in `bytes`. The task holds
/// the buffer, so it stays valid until the task is done or dropped, whatever happens to the
/// request.
#[derive(Debug)]
pub struct Sealed {
    pub bytes: Arc<crate::sealing::SealedBuf>,
    pub start: usize,
    pub len: usize,
}

impl Task {
    /// The address and length of the bytes a send task writes.
    fn send_region(&self) -> (usize, usize) {
        match &self.sealed {
            Some(s) => (s.bytes.as_ptr() as usize + s.start, s.len),
            None => (self.base + self.chunk.offset, self.chunk.len),
        }
    }
}

/// State shared by a connection and its helper threads.
#[derive(Debug)]
pub struct Link {
    pub peer: SocketAddr,
    stop: AtomicBool,
    error: OnceLock<String>,
    log: LogFn,
}

impl Link {
    pub fn new(peer: SocketAddr, log: LogFn) -> Arc<Link> {
        Arc::new(Link {
            peer,
            stop: AtomicBool::new(false),
            error: OnceLock::new(),
            log,
        })
    }

    /// Why the connection failed, if it did.
    pub fn error(&self) -> Option<&str> {
        self.error.get().map(String::as_str)
    }

    /// Records the connection's failure; the first reason wins and is logged as a warning
    /// (unless the connection is being closed by its owner).
    pub fn fail(&self, why: String) {
        let message = format!("NET/Socket : {why}");
        if self.error.set(why).is_ok() && !self.stopping() {
            self.log.warn(subsys::NET, &message);
        }
    }

    /// Like [`fail`](Self::fail), but an INFO line: for an ending that is normal when no
    /// request is waiting (the peer closed its side, e.g. its communicator was destroyed). A
    /// request posted later still fails with this reason.
    pub fn fail_quietly(&self, why: String) {
        let message = format!("NET/Socket : {why}");
        if self.error.set(why).is_ok() && !self.stopping() {
            self.log.info(subsys::NET, &message);
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// A connection's control socket, as helper thread 0 sees it.
pub trait Control: Send + Sync {
    /// Moves what the control socket allows now, without blocking; returns what to wait for
    /// on it next (`None`: nothing). `readable`: the last `poll` saw input (or a hang-up)
    /// on the control socket.
    fn progress(&self, readable: bool) -> Option<PollFlags>;
    fn socket(&self) -> &Socket;
}

/// The connection's side of one helper thread.
struct Inbox {
    tasks: Mutex<VecDeque<Task>>,
    wake: UnixStream,
}

impl Inbox {
    fn wake(&self) {
        // A full wake-up socket already holds a wake-up: nothing is lost by dropping this one.
        let _ = (&self.wake).write(&[1]);
    }
}

/// Hands tasks to a connection's helper threads.
#[derive(Clone)]
pub struct Dispatch {
    inboxes: Vec<Arc<Inbox>>,
}

impl Dispatch {
    /// Hands tasks to the threads that own their sockets; each socket's tasks are carried
    /// out in the order given.
    pub fn submit(&self, tasks: Vec<Task>) {
        let n = self.inboxes.len();
        let mut woken = vec![false; n];
        for task in tasks {
            let t = task.chunk.socket % n;
            self.inboxes[t]
                .tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(task);
            woken[t] = true;
        }
        for (inbox, woken) in self.inboxes.iter().zip(woken) {
            if woken {
                inbox.wake();
            }
        }
    }

    /// Wakes thread 0 so that it looks at the control socket again (the connection has
    /// something new for it: a receive waiting for a header, or a header left to write).
    pub fn wake_control(&self) {
        self.inboxes[0].wake();
    }

    fn wake_all(&self) {
        for inbox in &self.inboxes {
            inbox.wake();
        }
    }
}

/// A connection's helper threads, made but not started (see [`Workers::start`]).
pub struct Workers {
    link: Arc<Link>,
    dispatch: Dispatch,
    workers: Vec<Worker>,
}

impl Workers {
    /// Prepares `nthreads` threads for the data sockets `data` (socket `i` on thread
    /// `i % nthreads`), and the [`Dispatch`] that feeds them.
    /// With `openers` (one per data socket), the sockets bring sealed records, which the
    /// threads read apart and open (the receiving end of an encrypted connection; its sending
    /// end writes records like any bytes, see [`Sealed`]).
    pub fn prepare(
        link: Arc<Link>,
        data: Vec<Socket>,
        nthreads: usize,
        openers: Option<Vec<rustccl_securewire::Opener>>,
    ) -> io::Result<(Dispatch, Workers)> {
        let nthreads = nthreads.clamp(1, data.len().max(1));
        let mut owned: Vec<Vec<(usize, Socket)>> = (0..nthreads).map(|_| Vec::new()).collect();
        let mut crypt: Vec<Vec<Option<Framing>>> = (0..nthreads).map(|_| Vec::new()).collect();
        let mut openers = openers.map(Vec::into_iter);
        for (i, sock) in data.into_iter().enumerate() {
            sock.set_nonblocking(true)?;
            owned[i % nthreads].push((i, sock));
            crypt[i % nthreads].push(openers.as_mut().and_then(Iterator::next).map(Framing::new));
        }
        let mut crypt = crypt.into_iter();
        let mut inboxes = Vec::new();
        let mut workers = Vec::new();
        for sockets in owned {
            let (wake_tx, wake_rx) = UnixStream::pair()?;
            wake_tx.set_nonblocking(true)?;
            wake_rx.set_nonblocking(true)?;
            let inbox = Arc::new(Inbox {
                tasks: Mutex::new(VecDeque::new()),
                wake: wake_tx,
            });
            inboxes.push(inbox.clone());
            workers.push(Worker {
                link: link.clone(),
                inbox,
                wake: wake_rx,
                queues: sockets.iter().map(|_| VecDeque::new()).collect(),
                crypto: crypt.next().expect("one per thread"),
                sockets,
                control: None,
                scratch: Vec::new(),
                flip: test_flip_offset(),
                written: 0,
            });
        }
        let dispatch = Dispatch { inboxes };
        Ok((
            dispatch.clone(),
            Workers {
                link,
                dispatch,
                workers,
            },
        ))
    }

    /// Starts the threads; thread 0 also drives `control`.
    pub fn start(mut self, control: Option<Arc<dyn Control>>) -> io::Result<Pool> {
        self.workers[0].control = control;
        let mut pool = Pool {
            link: self.link,
            dispatch: self.dispatch,
            threads: Vec::new(),
        };
        for (t, worker) in self.workers.into_iter().enumerate() {
            match std::thread::Builder::new()
                .name(format!("rccl-sock-{t}"))
                .spawn(move || worker.run())
            {
                Ok(handle) => pool.threads.push(handle),
                Err(e) => {
                    pool.stop();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }
}

/// A connection's running helper threads.
pub struct Pool {
    link: Arc<Link>,
    dispatch: Dispatch,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Stops the threads and waits for them; they close their sockets and drop their tasks.
    /// Prompt: the threads only ever wait in `poll`, which the wake-up interrupts.
    pub fn stop(&mut self) {
        self.link.stop.store(true, Ordering::Release);
        self.dispatch.wake_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Longest sleep in `poll` (a safety net: wake-ups and socket events end it sooner).
const POLL_TIMEOUT_MS: u16 = 1000;

/// Largest piece dropped per read when discarding.
const SCRATCH_BYTES: usize = 1 << 20;
const _: () = assert!(crate::sealing::RECORD_PLAIN <= SCRATCH_BYTES, "a discarded record is opened in scratch");

/// One helper thread.
struct Worker {
    link: Arc<Link>,
    inbox: Arc<Inbox>,
    wake: UnixStream,
    /// (connection's socket index, socket)
    sockets: Vec<(usize, Socket)>,
    /// Pending tasks of each socket, same order as `sockets`.
    queues: Vec<VecDeque<Task>>,
    /// Each socket's record framing when it receives an encrypted stream, same order.
    crypto: Vec<Option<Framing>>,
    /// Thread 0: the connection's control socket.
    control: Option<Arc<dyn Control>>,
    scratch: Vec<u8>,
    /// Test hook ([`FLIP_VAR`]): the offset in data socket 0's outgoing stream of the byte to
    /// change as it leaves; `written`: that stream's bytes written so far.
    flip: Option<u64>,
    written: u64,
}

/// A test hook: with `RUSTCCL_TEST_FLIP_DATA_BYTE=<n>`, every send connection of the process
/// changes (xor 1) the byte at offset `n` of its data socket 0's stream as it writes it, as
/// an attacker on the wire would, so that tests can check that a byte altered in flight
/// fails the operation (encrypted: on every rank, never wrong data). Read once; never set
/// outside tests.
pub const FLIP_VAR: &str = "RUSTCCL_TEST_FLIP_DATA_BYTE";

fn test_flip_offset() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| std::env::var(FLIP_VAR).ok().and_then(|v| v.trim().parse().ok()))
}

/// What one non-blocking pass over a socket did.
struct Pass {
    progressed: bool,
    /// The poll events to wait for, when work is left.
    wait_for: Option<PollFlags>,
}

impl Worker {
    fn run(mut self) {
        let mut control_readable = true;
        while !self.link.stopping() {
            self.take_new_tasks();
            let mut progressed = false;
            let mut waits = Vec::new();
            for s in 0..self.sockets.len() {
                match self.pass(s) {
                    Ok(pass) => {
                        progressed |= pass.progressed;
                        if let Some(events) = pass.wait_for {
                            waits.push((s, events));
                        }
                    }
                    Err(why) => {
                        self.link.fail(why);
                        return;
                    }
                }
            }
            let control_wait = self
                .control
                .as_ref()
                .and_then(|c| c.progress(control_readable));
            control_readable = false;
            if !progressed {
                control_readable = self.sleep(&waits, control_wait);
            }
        }
    }

    fn take_new_tasks(&mut self) {
        let mut inbox = self.inbox.tasks.lock().unwrap_or_else(|p| p.into_inner());
        for task in inbox.drain(..) {
            let local = self
                .sockets
                .iter()
                .position(|(i, _)| *i == task.chunk.socket)
                .expect("tasks are routed to the thread that owns their socket");
            self.queues[local].push_back(task);
        }
    }

    /// Moves as many bytes as socket `s` takes right now, task after task.
    fn pass(&mut self, s: usize) -> Result<Pass, String> {
        if self.crypto[s].is_some() {
            return self.pass_framed(s);
        }
        let mut progressed = false;
        while let Some(task) = self.queues[s].front_mut() {
            let sock = &self.sockets[s].1;
            let left = task.chunk.len - task.moved;
            let (send_at, send_len) = task.send_region();
            let result = match task.action {
                Action::Send => {
                    // SAFETY: the task's bytes lie inside the buffer given to `isend`, which
                    // the caller keeps valid and unchanged until the request completes or the
                    // connection is closed (closing joins this thread first), or inside the
                    // sealed records the task itself holds.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            (send_at + task.moved) as *const u8,
                            send_len - task.moved,
                        )
                    };
                    match self.flip.filter(|_| self.sockets[s].0 == 0) {
                        None => sock.send_with_flags(bytes, SEND_FLAGS),
                        Some(at) => {
                            let (result, flipped) = send_flipping(sock, bytes, self.written, at);
                            if let Ok(n) = result {
                                self.written += n as u64;
                                if flipped {
                                    self.flip = None;
                                }
                            }
                            result
                        }
                    }
                }
                Action::Recv => {
                    // SAFETY: the task's bytes lie inside the buffer given to `irecv` (the
                    // message fits in it), which the caller keeps valid and untouched until
                    // the request completes or the connection is closed; the chunks of one
                    // message do not overlap, so no other thread writes these bytes.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(
                            (task.base + task.chunk.offset + task.moved) as *mut u8,
                            left,
                        )
                    };
                    (&*sock).read(bytes).and_then(eof_is_error)
                }
                Action::Discard => {
                    if self.scratch.is_empty() {
                        self.scratch = vec![0; SCRATCH_BYTES];
                    }
                    let n = left.min(self.scratch.len());
                    (&*sock).read(&mut self.scratch[..n]).and_then(eof_is_error)
                }
            };
            let end = match task.action {
                Action::Send => send_len,
                Action::Recv | Action::Discard => task.chunk.len,
            };
            match step(result, task.action, self.link.peer, self.sockets[s].0)? {
                Step::Moved(n) => {
                    progressed = true;
                    task.moved += n;
                    if task.moved == end {
                        self.finish_front(s)?;
                    }
                }
                Step::Wait(events) => {
                    return Ok(Pass {
                        progressed,
                        wait_for: Some(events),
                    })
                }
                Step::Again => {}
            }
        }
        Ok(Pass {
            progressed,
            wait_for: None,
        })
    }

    /// Pops socket `s`'s front task, whose chunk has moved, and tells its transfer.
    fn finish_front(&mut self, s: usize) -> Result<(), String> {
        let task = self.queues[s].pop_front().expect("the task just worked on");
        task.transfer
            .chunk_done(task.chunk)
            .map_err(|e| format!("internal error on connection to {}: {e}", self.link.peer))
    }

    /// [`pass`](Self::pass) on a socket that receives an encrypted stream: reads each
    /// record's length prefix, then its ciphertext straight into the task's buffer (no
    /// copy; into scratch when discarding), then its tag, and opens the record there (a
    /// record that fails authentication fails the connection, never giving wrong data). A
    /// sender's record never spans two chunks and both sides cut messages into the same
    /// chunks in the same order ([`crate::sealing`]), so a record longer than what is left of
    /// its chunk was altered in flight: it fails the connection too.
    fn pass_framed(&mut self, s: usize) -> Result<Pass, String> {
        let mut progressed = false;
        let peer = self.link.peer;
        let index = self.sockets[s].0;
        while let Some(task) = self.queues[s].front_mut() {
            let sock = &self.sockets[s].1;
            let left = task.chunk.len - task.moved;
            let f = self.crypto[s].as_mut().expect("a framed socket");
            let result: io::Result<usize> = if f.hgot < f.head.len() {
                (&*sock).read(&mut f.head[f.hgot..]).and_then(eof_is_error).map(|k| {
                    f.hgot += k;
                    0
                })
            } else {
                let clen = match f.clen {
                    Some(c) => c,
                    None => {
                        let body = f.opener.body_len(f.head).map_err(|e| tampered(peer, index, e))?;
                        let c = body - TAG_BYTES;
                        if c == 0 || c > left {
                            return Err(tampered(
                                peer,
                                index,
                                rustccl_securewire::Error {
                                    kind: rustccl_securewire::ErrorKind::Tampered,
                                    message: format!(
                                        "a record of {c} bytes where {left} bytes of the chunk are left (altered in flight?)"
                                    ),
                                },
                            ));
                        }
                        f.clen = Some(c);
                        c
                    }
                };
                if f.cgot < clen {
                    if task.action == Action::Recv {
                        // SAFETY: as in `pass`: `clen <= left`, so these bytes lie inside the
                        // buffer given to `irecv`, which no other thread writes. They hold
                        // ciphertext until this thread opens the record (below); a record
                        // that fails authentication fails the connection and the receive.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(
                                (task.base + task.chunk.offset + task.moved) as *mut u8,
                                clen,
                            )
                        };
                        (&*sock).read(&mut dst[f.cgot..])
                    } else {
                        // A whole record fits (RECORD_PLAIN <= SCRATCH_BYTES): it is opened
                        // there too, which keeps the stream's nonces in step.
                        if self.scratch.is_empty() {
                            self.scratch = vec![0; SCRATCH_BYTES];
                        }
                        (&*sock).read(&mut self.scratch[f.cgot..clen])
                    }
                    .and_then(eof_is_error)
                    .map(|k| {
                        f.cgot += k;
                        0
                    })
                } else {
                    (&*sock).read(&mut f.tag[f.tgot..]).and_then(eof_is_error).map(|k| {
                        f.tgot += k;
                        if f.tgot < TAG_BYTES {
                            return Ok(0);
                        }
                        let start = task.chunk.offset + task.moved;
                        let (head, tag) = (f.head, f.tag);
                        (f.hgot, f.clen, f.cgot, f.tgot) = (0, None, 0, 0);
                        let dst = if task.action == Action::Recv {
                            // SAFETY: as above: the record's bytes lie in the task's part of
                            // the receive buffer, which only this thread writes.
                            unsafe { std::slice::from_raw_parts_mut((task.base + start) as *mut u8, clen) }
                        } else {
                            &mut self.scratch[..clen]
                        };
                        f.opener.open_detached(head, dst, tag).map_err(|e| {
                            io::Error::new(io::ErrorKind::InvalidData, tampered(peer, index, e))
                        })?;
                        Ok(clen)
                    }).and_then(|r| r)
                }
            };
            match step(result, task.action, peer, index)? {
                Step::Moved(n) => {
                    progressed = true;
                    task.moved += n;
                    if task.moved == task.chunk.len {
                        self.finish_front(s)?;
                    }
                }
                Step::Wait(events) => {
                    return Ok(Pass {
                        progressed,
                        wait_for: Some(events),
                    })
                }
                Step::Again => {}
            }
        }
        Ok(Pass {
            progressed,
            wait_for: None,
        })
    }

    /// Waits until a socket in `waits` (or the control socket, for `control_wait`) is
    /// ready, a wake-up comes, or the timeout passes. Returns whether the control socket has
    /// input (or an error or hang-up) to look at.
    fn sleep(&mut self, waits: &[(usize, PollFlags)], control_wait: Option<PollFlags>) -> bool {
        let mut fds = Vec::with_capacity(waits.len() + 2);
        fds.push(PollFd::new(self.wake.as_fd(), PollFlags::POLLIN));
        for &(s, events) in waits {
            fds.push(PollFd::new(self.sockets[s].1.as_fd(), events));
        }
        if let (Some(control), Some(events)) = (&self.control, control_wait) {
            fds.push(PollFd::new(control.socket().as_fd(), events));
        }
        // Errors (EINTR) just end the sleep early; the loop runs again.
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(POLL_TIMEOUT_MS));
        let woken = fds[0].revents().is_some_and(|r| !r.is_empty());
        let readable = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
        let control_readable = control_wait.is_some()
            && fds
                .last()
                .and_then(|f| f.revents())
                .is_some_and(|r| r.intersects(readable));
        drop(fds);
        if woken {
            let mut sink = [0u8; 64];
            while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
        }
        control_readable
    }
}

use rustccl_securewire::TAG_BYTES;

/// A socket that receives an encrypted stream: its opener, and where it is in the record
/// it reads: its length prefix (`hgot` bytes of `head`), its ciphertext (`cgot` of `clen`
/// bytes, once the prefix is in), its tag (`tgot` bytes).
pub struct Framing {
    opener: rustccl_securewire::Opener,
    head: [u8; rustccl_securewire::RECORD_HEADER_BYTES],
    hgot: usize,
    clen: Option<usize>,
    cgot: usize,
    tag: [u8; TAG_BYTES],
    tgot: usize,
}

impl Framing {
    fn new(opener: rustccl_securewire::Opener) -> Framing {
        Framing {
            opener,
            head: [0; rustccl_securewire::RECORD_HEADER_BYTES],
            hgot: 0,
            clen: None,
            cgot: 0,
            tag: [0; TAG_BYTES],
            tgot: 0,
        }
    }
}

/// What one read or write on a data socket means for a pass.
enum Step {
    /// Bytes moved for the front task.
    Moved(usize),
    /// The socket is not ready: wait for these events.
    Wait(PollFlags),
    /// Interrupted: try again.
    Again,
}

/// Reads a data socket's read or write `result` for a task of `action`: bytes moved, a wait,
/// or the error that ends the connection (a record that failed authentication says so
/// itself).
fn step(
    result: io::Result<usize>,
    action: Action,
    peer: std::net::SocketAddr,
    index: usize,
) -> Result<Step, String> {
    match result {
        Ok(n) => Ok(Step::Moved(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Step::Wait(match action {
            Action::Send => PollFlags::POLLOUT,
            Action::Recv | Action::Discard => PollFlags::POLLIN,
        })),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Step::Again),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(e.to_string()),
        Err(e) => {
            let what = if e.kind() == io::ErrorKind::UnexpectedEof {
                "closed the connection".to_string()
            } else {
                format!("connection failed: {e}")
            };
            Err(format!("peer {peer} {what} (data socket {index})"))
        }
    }
}

fn tampered(peer: std::net::SocketAddr, index: usize, e: rustccl_securewire::Error) -> String {
    format!("peer {peer}: data socket {index}: {e}; the connection is dropped")
}

/// The test hook's write ([`FLIP_VAR`]): `bytes` start at offset `written` of the stream; the
/// byte at offset `at` goes out changed. Returns the write's result and whether it wrote the
/// changed byte.
fn send_flipping(sock: &Socket, bytes: &[u8], written: u64, at: u64) -> (io::Result<usize>, bool) {
    let end = written + bytes.len() as u64;
    if at < written || at >= end {
        return (sock.send_with_flags(bytes, SEND_FLAGS), false);
    }
    if at > written {
        let upto = (at - written) as usize;
        return (sock.send_with_flags(&bytes[..upto], SEND_FLAGS), false);
    }
    let result = sock.send_with_flags(&[bytes[0] ^ 1], SEND_FLAGS);
    let flipped = matches!(result, Ok(1));
    (result, flipped)
}

/// A read of 0 bytes into a non-empty buffer is the peer closing the stream.
fn eof_is_error(n: usize) -> io::Result<usize> {
    if n == 0 {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "end of stream",
        ))
    } else {
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::striping::{stripe, DEFAULT_MIN_CHUNK};
    use std::time::{Duration, Instant};

    extern "C" fn quiet(_: i32, _: u64, _: abi_stable::std_types::RStr<'_>) {}

    /// `n` connected socket pairs over loopback.
    fn socket_pairs(n: usize) -> (Vec<Socket>, Vec<Socket>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            a.push(Socket::from(c));
            b.push(Socket::from(s));
        }
        (a, b)
    }

    fn wait(t: &Transfer, link: &Link) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !t.is_complete() {
            assert!(link.error().is_none(), "{:?}", link.error());
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn tasks(
        action: Action,
        base: usize,
        size: usize,
        nsocks: usize,
        t: &Arc<Transfer>,
    ) -> Vec<Task> {
        stripe(size, nsocks, DEFAULT_MIN_CHUNK)
            .unwrap()
            .into_iter()
            .map(|chunk| Task {
                action,
                chunk,
                base,
                transfer: t.clone(),
                moved: 0,
                sealed: None,
            })
            .collect()
    }

    #[test]
    fn pools_move_a_striped_message_and_discard_one() {
        let nsocks = 5;
        let (a, b) = socket_pairs(nsocks);
        let peer = "127.0.0.1:1".parse().unwrap();
        let log = LogFn { log: quiet };
        let (la, lb) = (Link::new(peer, log), Link::new(peer, log));
        let (send, workers) = Workers::prepare(la.clone(), a, 2, None).unwrap();
        let mut sender = workers.start(None).unwrap();
        let (recv, workers) = Workers::prepare(lb.clone(), b, 3, None).unwrap();
        let mut receiver = workers.start(None).unwrap();
        let size = 3 * DEFAULT_MIN_CHUNK * nsocks + 17;
        let src: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; size];
        for round in 0..2 {
            let plan = || Reassembly::new(size, nsocks, DEFAULT_MIN_CHUNK).unwrap();
            let (ts, tr) = (Transfer::new(plan()), Transfer::new(plan()));
            let recv_action = if round == 0 {
                Action::Discard
            } else {
                Action::Recv
            };
            recv.submit(tasks(
                recv_action,
                dst.as_mut_ptr() as usize,
                size,
                nsocks,
                &tr,
            ));
            send.submit(tasks(
                Action::Send,
                src.as_ptr() as usize,
                size,
                nsocks,
                &ts,
            ));
            wait(&ts, &la);
            wait(&tr, &lb);
            if round == 0 {
                assert!(
                    dst.iter().all(|&b| b == 0),
                    "discarded bytes are not written"
                );
            }
        }
        assert!(dst == src);
        sender.stop();
        // The receiver sees the sender's sockets close when it expects more bytes.
        let tr = Transfer::new(Reassembly::new(10, nsocks, DEFAULT_MIN_CHUNK).unwrap());
        recv.submit(tasks(
            Action::Recv,
            dst.as_mut_ptr() as usize,
            10,
            nsocks,
            &tr,
        ));
        let deadline = Instant::now() + Duration::from_secs(10);
        while lb.error().is_none() {
            assert!(Instant::now() < deadline, "no error after the peer closed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            lb.error().unwrap().contains("closed the connection"),
            "{:?}",
            lb.error()
        );
        receiver.stop();
    }
}

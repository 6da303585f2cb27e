//! Passing file descriptors between processes of one host, for memory that is shared by fd (CUDA
//! VMM POSIX-fd handles from `cuMemExportToShareableHandle`). Only bytes travel through rustccl's
//! own channels, so the exporting process [`offer`]s the fd and sends the fixed-size [`Ticket`]
//! it gets; an importer turns the ticket back into a new fd with [`fetch`].
//!
//! The first offer of a process starts its server thread ("rustccl-fdpass"), which listens on the
//! abstract Unix stream socket `rustccl-fd-{pid}-{nonce:016x}` (Linux; the nonce is random per
//! process, so a reused pid never reaches a stranger's socket). A fetch connects, sends the
//! offer's id and its random 64-bit key (16 bytes), and gets one status byte back: 1 with a dup of
//! the fd attached as SCM_RIGHTS, or 0 (no fd) when the offer is unknown, withdrawn or the key is
//! wrong. The server answers only processes of its own user (SO_PEERCRED; a root server answers
//! anyone) and gives each connection 2 s to send its request. A ticket of this very process is
//! served from the table directly, without the socket. The server keeps its copy of an offered
//! fd open until [`withdraw`].
//!
//! Ticket layout, little-endian ([`Ticket::SIZE`] bytes):
//!
//! | bytes  | field                                  |
//! |--------|----------------------------------------|
//! | 0..4   | pid of the offering process (u32)      |
//! | 4..8   | zero                                   |
//! | 8..16  | the process's socket nonce (u64)       |
//! | 16..24 | offer id (u64)                         |
//! | 24..32 | offer key (u64)                        |

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::time::TimeVal;

use crate::error::{Error, Result};

/// How long the server waits for a connected process's request (and to send its answer).
const SERVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a fetch waits to connect, and then for the answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// A request: offer id and key, little-endian.
const REQUEST: usize = 16;
/// Answer status: the fd is attached.
const STATUS_OK: u8 = 1;
/// Answer status: unknown or withdrawn offer, or a wrong key; no fd.
const STATUS_UNKNOWN: u8 = 0;

/// What an importer needs to fetch an offered fd: the owner's socket name and a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The offering process.
    pid: u32,
    /// The offering process's random socket nonce.
    nonce: u64,
    /// The offer's sequential id in that process.
    id: u64,
    /// The offer's random key: a fetch must present it.
    key: u64,
}

impl Ticket {
    /// The size of the serialised form (see the module docs for its layout).
    pub const SIZE: usize = 32;

    /// The serialised form, little-endian.
    pub fn to_bytes(&self) -> [u8; Ticket::SIZE] {
        let mut b = [0u8; Ticket::SIZE];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Reads a ticket made by [`Ticket::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<Ticket> {
        if b.len() != Ticket::SIZE {
            return Err(Error::invalid_argument(format!(
                "an fd-passing ticket is {} bytes, but {} bytes were given: the message does not hold a ticket \
                 (corrupted, or sent by a different rustccl version?)",
                Ticket::SIZE,
                b.len()
            )));
        }
        let u64_at = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(v)
        };
        let pid = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        Ok(Ticket { pid, nonce: u64_at(8), id: u64_at(16), key: u64_at(24) })
    }
}

/// One offered fd: the server's copy, and the key a fetch must present.
struct Offer {
    key: u64,
    fd: OwnedFd,
}

type Table = Mutex<HashMap<u64, Offer>>;

/// This process's fd-passing server: its socket name's parts and its offers.
struct Server {
    pid: u32,
    nonce: u64,
    next_id: AtomicU64,
    offers: Arc<Table>,
}

/// The server, started by the first offer (a failure to start is kept, and returned by every offer).
static SERVER: OnceLock<Result<Server>> = OnceLock::new();

/// Offers `fd` (the server keeps it open; a dup of it is sent per fetch) until withdrawn. Starts
/// the process's server thread on first use.
pub fn offer(fd: OwnedFd) -> Result<Ticket> {
    let server = server()?;
    let key = random_u64("the key of an fd offer")?;
    let id = server.next_id.fetch_add(1, Ordering::Relaxed);
    lock(&server.offers).insert(id, Offer { key, fd });
    Ok(Ticket { pid: server.pid, nonce: server.nonce, id, key })
}

/// Stops offering (closes the server's copy). Unknown ids are ignored (returns false).
pub fn withdraw(t: &Ticket) -> bool {
    let Some(server) = ours(t) else { return false };
    let removed = {
        let mut offers = lock(&server.offers);
        match offers.get(&t.id) {
            Some(o) if o.key == t.key => offers.remove(&t.id),
            _ => None,
        }
    };
    removed.is_some()
}

/// Gets a new fd for the ticket: from this process's own table directly when the ticket is ours
/// (no socket), else by connecting to the owner's socket.
pub fn fetch(t: &Ticket) -> Result<OwnedFd> {
    let Some(server) = ours(t) else { return fetch_remote(t) };
    let offers = lock(&server.offers);
    match offers.get(&t.id) {
        Some(o) if o.key == t.key => o.fd.try_clone().map_err(|e| {
            Error::io(format!("cannot duplicate the fd of this process's offer {} (too many open files?)", t.id), &e)
        }),
        _ => Err(no_longer_offered(t)),
    }
}

/// The server, started if it is not yet; refuses in a child forked after it started.
fn server() -> Result<&'static Server> {
    let server = SERVER.get_or_init(start_server).as_ref().map_err(Clone::clone)?;
    if server.pid != std::process::id() {
        return Err(Error::invalid_usage(format!(
            "process {} cannot offer memory to other processes: it was forked from process {} after that one \
             started passing memory handles, and a forked child has no server; start worker processes with \
             spawn, not fork",
            std::process::id(),
            server.pid
        )));
    }
    Ok(server)
}

/// This process's server, if `t` is one of its tickets.
fn ours(t: &Ticket) -> Option<&'static Server> {
    match SERVER.get() {
        Some(Ok(s)) if s.pid == t.pid && s.nonce == t.nonce && s.pid == std::process::id() => Some(s),
        _ => None,
    }
}

fn lock(offers: &Table) -> MutexGuard<'_, HashMap<u64, Offer>> {
    offers.lock().unwrap_or_else(PoisonError::into_inner)
}

fn random_u64(what: &str) -> Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| Error::system(format!("no randomness for {what}: {e}")))?;
    Ok(u64::from_ne_bytes(b))
}

/// The abstract socket name (without its leading NUL) of process `pid`'s server.
fn socket_name(pid: u32, nonce: u64) -> String {
    format!("rustccl-fd-{pid}-{nonce:016x}")
}

fn no_longer_offered(t: &Ticket) -> Error {
    Error::remote(format!(
        "process {} no longer offers this memory (freed?): its offer {} is unknown, withdrawn, or the ticket's key \
         is wrong; the exporting rank must keep the memory allocated until every importer has mapped it",
        t.pid, t.id
    ))
}

fn start_server() -> Result<Server> {
    let pid = std::process::id();
    let nonce = random_u64("the name of the fd-passing socket")?;
    let name = socket_name(pid, nonce);
    let listener = SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| UnixListener::bind_addr(&addr))
        .map_err(|e| {
            Error::io(
                format!("cannot listen on the abstract Unix socket @{name} (to pass memory handles to other ranks)"),
                &e,
            )
        })?;
    let offers = Arc::new(Mutex::new(HashMap::new()));
    let table = Arc::clone(&offers);
    std::thread::Builder::new()
        .name("rustccl-fdpass".into())
        .spawn(move || serve(&listener, &table))
        .map_err(|e| Error::io("cannot start the fd-passing thread (rustccl-fdpass)", &e))?;
    Ok(Server { pid, nonce, next_id: AtomicU64::new(1), offers })
}

/// The server thread: answers one connection after another, for the life of the process.
fn serve(listener: &UnixListener, offers: &Table) {
    let euid = nix::unistd::geteuid().as_raw();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(&stream, offers, euid) {
                    tracing::warn!(target: "INIT", "fd passing: {e}");
                }
            }
            Err(e) => {
                tracing::warn!(target: "INIT", "fd passing: cannot accept a connection ({e}); retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Answers one connection: checks the peer's user, reads its request, sends the status and,
/// when the offer is there and the key is right, a dup of its fd.
fn answer(stream: &UnixStream, offers: &Table, euid: u32) -> std::result::Result<(), String> {
    let cred = socket::getsockopt(stream, sockopt::PeerCredentials)
        .map_err(|e| format!("cannot read the credentials of a connecting process ({e}); not answering it"))?;
    let peer = cred.pid();
    if euid != 0 && cred.uid() != euid {
        return Err(format!(
            "refused to hand memory to process {peer} of user {} (this process runs as user {euid}); run all ranks \
             of a host as one user",
            cred.uid()
        ));
    }
    stream
        .set_read_timeout(Some(SERVE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(SERVE_TIMEOUT)))
        .map_err(|e| format!("cannot set a timeout on the connection from process {peer} ({e}); not answering it"))?;
    let mut request = [0u8; REQUEST];
    let mut reader = stream;
    reader.read_exact(&mut request).map_err(|e| {
        format!("process {peer} connected but sent no complete request within {SERVE_TIMEOUT:?} ({e}); dropped it")
    })?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&request[0..8]);
    let id = u64::from_le_bytes(word);
    word.copy_from_slice(&request[8..16]);
    let key = u64::from_le_bytes(word);
    let dup = match lock(offers).get(&id) {
        Some(o) if o.key == key => Some(o.fd.try_clone().map_err(|e| {
            format!("cannot duplicate the fd of offer {id} for process {peer} ({e}; too many open files?); no answer")
        })?),
        _ => None,
    };
    let status = [if dup.is_some() { STATUS_OK } else { STATUS_UNKNOWN }];
    let raw: Vec<RawFd> = dup.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage> = if raw.is_empty() { Vec::new() } else { vec![ControlMessage::ScmRights(&raw)] };
    let iov = [IoSlice::new(&status)];
    loop {
        match socket::sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("cannot answer process {peer} about offer {id} ({e}); it gave up or exited?")),
        }
    }
    if dup.is_none() {
        tracing::debug!(target: "INIT", "fd passing: process {peer} asked for offer {id}, not offered (or wrong key)");
    }
    Ok(())
}

/// Fetches through the owner's socket (also what [`fetch`] does for tickets of other processes).
fn fetch_remote(t: &Ticket) -> Result<OwnedFd> {
    let name = socket_name(t.pid, t.nonce);
    let unreachable = |what: &str, e: Errno| {
        let why = if e == Errno::EAGAIN { format!("no answer within {FETCH_TIMEOUT:?}") } else { e.to_string() };
        Error::remote(format!(
            "cannot get memory from process {}: {what} its fd-passing socket @{name} failed ({why}); the process that \
             exported the memory is gone or unreachable (did it exit or crash? ranks of one host must share a network \
             namespace)",
            t.pid
        ))
    };
    let fd = socket::socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| Error::system(format!("cannot create a Unix socket to get memory from process {}: {e}", t.pid)))?;
    // SO_SNDTIMEO also bounds a Unix stream connect that waits for room in a full backlog.
    let timeout = TimeVal::new(FETCH_TIMEOUT.as_secs() as _, 0);
    socket::setsockopt(&fd, sockopt::SendTimeout, &timeout)
        .and_then(|()| socket::setsockopt(&fd, sockopt::ReceiveTimeout, &timeout))
        .map_err(|e| Error::system(format!("cannot set a timeout on the socket to process {}: {e}", t.pid)))?;
    let addr = UnixAddr::new_abstract(name.as_bytes())
        .map_err(|e| Error::internal(format!("cannot make the socket address @{name}: {e}")))?;
    loop {
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(unreachable("connecting to", e)),
        }
    }
    let mut request = [0u8; REQUEST];
    request[0..8].copy_from_slice(&t.id.to_le_bytes());
    request[8..16].copy_from_slice(&t.key.to_le_bytes());
    loop {
        match socket::send(fd.as_raw_fd(), &request, MsgFlags::MSG_NOSIGNAL) {
            Ok(REQUEST) => break,
            Ok(n) => {
                return Err(Error::system(format!("sent only {n} of {REQUEST} request bytes to process {}", t.pid)));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(unreachable("sending the request through", e)),
        }
    }
    let mut status = [0u8; 1];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (bytes, truncated, fds) = loop {
        let mut iov = [IoSliceMut::new(&mut status)];
        match socket::recvmsg::<()>(fd.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds = Vec::new();
                let cmsgs = msg.cmsgs().map_err(|e| {
                    Error::system(format!("cannot read the control message from process {}: {e}", t.pid))
                })?;
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        for r in raw {
                            // SAFETY: SCM_RIGHTS just installed `r` in this process's fd table and
                            // nothing else refers to it, so this OwnedFd is its one owner.
                            fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                        }
                    }
                }
                break (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC), fds);
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(unreachable("waiting for the answer on", e)),
        }
    };
    if truncated {
        return Err(Error::system(format!(
            "the answer of process {} carried more file descriptors than expected (truncated); not using it",
            t.pid
        )));
    }
    match (bytes, status[0]) {
        (0, _) => Err(Error::remote(format!(
            "process {} closed the connection without answering: it runs as another user (all ranks of a host must \
             run as one user), or could not duplicate the memory's fd (see its log)",
            t.pid
        ))),
        (_, STATUS_OK) => fds.into_iter().next().ok_or_else(|| {
            Error::internal(format!("process {} said it sent the memory's fd, but none arrived", t.pid))
        }),
        (_, STATUS_UNKNOWN) => Err(no_longer_offered(t)),
        (_, s) => Err(Error::internal(format!(
            "process {} answered with unknown status {s} (a different rustccl version?)",
            t.pid
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode;
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use std::fs::File;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::FileExt;
    use std::process::{Command, Stdio};
    use std::sync::mpsc;
    use std::time::Instant;

    const CHILD_ENV: &str = "RUSTCCL_FDPASS_CHILD";

    /// A memfd holding `content`, and a second handle to the same file.
    fn memfd(content: &[u8]) -> (OwnedFd, File) {
        let fd = memfd_create(c"rustccl-fdpass-test", MemFdCreateFlag::MFD_CLOEXEC).expect("memfd_create");
        let file = File::from(fd.try_clone().expect("dup"));
        file.write_all_at(content, 0).expect("write the memfd");
        (fd, file)
    }

    fn read_at0(file: &File, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, 0).expect("read the fetched fd");
        buf
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    fn assert_remote<T: std::fmt::Debug>(r: Result<T>, what: &str) -> Error {
        let e = r.expect_err(what);
        assert_eq!(e.code, ResultCode::RemoteError, "{what}: {e}");
        e
    }

    #[test]
    fn ticket_round_trips() {
        let t = Ticket { pid: 0x0102_0304, nonce: 0x1112_1314_1516_1718, id: 7, key: 0xdead_beef_0bad_f00d };
        let b = t.to_bytes();
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(&b[16..24], &7u64.to_le_bytes());
        assert_eq!(&b[24..32], &0xdead_beef_0bad_f00du64.to_le_bytes());
        assert_eq!(Ticket::from_bytes(&b).expect("from_bytes"), t);
        for len in [0, Ticket::SIZE - 1, Ticket::SIZE + 1] {
            let e = Ticket::from_bytes(&vec![0u8; len]).expect_err("wrong length");
            assert_eq!(e.code, ResultCode::InvalidArgument);
        }
    }

    #[test]
    fn offer_fetch_withdraw_in_process() {
        let content = b"rustccl fdpass in-process content";
        let (fd, mine) = memfd(content);
        let t = offer(fd).expect("offer");
        assert_eq!(t.pid, std::process::id());
        let t2 = Ticket::from_bytes(&t.to_bytes()).expect("from_bytes");

        // Directly from the table: the same file (write through one, read through the other).
        let direct = File::from(fetch(&t2).expect("fetch in-process"));
        assert_eq!(read_at0(&direct, content.len()), content);
        direct.write_all_at(b"RUSTCCL", 0).expect("write through the fetched fd");
        assert_eq!(&read_at0(&mine, 7), b"RUSTCCL");

        // Through this process's own socket: the server path.
        let served = File::from(fetch_remote(&t2).expect("fetch through the socket"));
        assert_eq!(read_at0(&served, content.len()), read_at0(&mine, content.len()));
        mine.write_all_at(b"again", 0).expect("write through the original");
        assert_eq!(&read_at0(&served, 5), b"again");

        let wrong = Ticket { key: t.key ^ 1, ..t };
        assert_remote(fetch(&wrong), "fetch with a wrong key");
        assert_remote(fetch_remote(&wrong), "fetch through the socket with a wrong key");
        assert!(!withdraw(&wrong), "withdraw with a wrong key");
        assert!(!withdraw(&Ticket { id: u64::MAX, ..t }), "withdraw of an unknown id");

        assert!(withdraw(&t), "withdraw");
        assert!(!withdraw(&t), "second withdraw");
        let e = assert_remote(fetch(&t), "fetch after withdraw");
        assert!(e.message.contains("no longer offers"), "{e}");
        assert_remote(fetch_remote(&t), "fetch through the socket after withdraw");
        // What was fetched before stays usable.
        assert_eq!(&read_at0(&direct, 5), b"again");
    }

    #[test]
    fn fetch_from_nobody_fails_fast() {
        let t = Ticket { pid: std::process::id(), nonce: random_u64("test").expect("random"), id: 1, key: 1 };
        let start = Instant::now();
        let e = assert_remote(fetch(&t), "fetch from a socket nobody listens on");
        assert!(e.message.contains("gone or unreachable"), "{e}");
        assert!(start.elapsed() < FETCH_TIMEOUT, "took {:?}", start.elapsed());
    }

    /// Run by `fetch_from_another_process` in a child process; does nothing otherwise.
    #[test]
    fn child_helper() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let marker = format!("rustccl-fdpass-child-{}", std::process::id());
        let (fd, _file) = memfd(marker.as_bytes());
        let t = offer(fd).expect("offer in the child");
        let (fd, _file) = memfd(b"withdrawn");
        let w = offer(fd).expect("second offer in the child");
        assert!(withdraw(&w));
        let mut out = std::io::stdout().lock();
        writeln!(out, "TICKET {}", hex(&t.to_bytes())).expect("stdout");
        writeln!(out, "WITHDRAWN {}", hex(&w.to_bytes())).expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        let mut rest = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut rest);
    }

    #[test]
    fn fetch_from_another_process() {
        let path = module_path!();
        let name = format!("{}::child_helper", path.split_once("::").map_or(path, |(_, rest)| rest));
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
            .args(["--exact", &name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let (mut ticket, mut withdrawn) = (None, None);
        while ticket.is_none() || withdrawn.is_none() {
            let line = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => line,
                Err(e) => {
                    let _ = child.kill();
                    panic!("the child gave no tickets ({e})");
                }
            };
            // The harness's "test ... " may precede the child's output on its line.
            if let Some((_, h)) = line.split_once("TICKET ") {
                ticket = Some(Ticket::from_bytes(&unhex(h)).expect("child ticket"));
            } else if let Some((_, h)) = line.split_once("WITHDRAWN ") {
                withdrawn = Some(Ticket::from_bytes(&unhex(h)).expect("child ticket"));
            }
        }
        let (t, w) = (ticket.expect("ticket"), withdrawn.expect("ticket"));
        assert_eq!(t.pid, child.id());
        let marker = format!("rustccl-fdpass-child-{}", child.id());

        let got = File::from(fetch(&t).expect("fetch from the child"));
        assert_eq!(read_at0(&got, marker.len()), marker.as_bytes());
        let e = assert_remote(fetch(&w), "fetch of a withdrawn offer");
        assert!(e.message.contains("no longer offers"), "{e}");
        assert_remote(fetch(&Ticket { key: t.key ^ 0x8000, ..t }), "fetch with a wrong key");
        assert!(!withdraw(&t), "withdraw of another process's ticket");

        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the child did not exit after its stdin closed");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "child: {status}");

        let start = Instant::now();
        let e = assert_remote(fetch(&t), "fetch after the child exited");
        assert!(e.message.contains("gone or unreachable"), "{e}");
        assert!(start.elapsed() < FETCH_TIMEOUT + Duration::from_secs(5), "took {:?}", start.elapsed());
        // The memory outlives its exporter while an fd refers to it.
        assert_eq!(read_at0(&got, marker.len()), marker.as_bytes());
    }
}

//! Setting up a connection without blocking: the connecting side's [`Dialer`] and the
//! listening side's [`Acceptor`]. Each call advances them as far as the sockets allow and
//! returns; the caller calls again until the connection is [`Established`].
//!
//! A connection is one control socket plus `nsocks` data sockets, all TCP to the listener.
//! Each socket first sends a [`Hello`] naming the listener (its random magic, from the
//! handle), the connection (a random id the dialer picks) and its place in the connection.
//! The acceptor groups arriving sockets by connection id and hands out a connection once all
//! of its sockets are there; sockets with a wrong magic (stale or foreign) are closed.
//! The dialer is done when every socket is connected and has written its hello: it does not
//! wait for the acceptor, so one thread may finish `connect` before it starts `accept`.
//!
//! With an encryption key (the context's: the host's, given at init through net ABI v3, or
//! [`rustccl_securewire::process_key`], set in-process by the host from
//! `NCCL_ENCRYPTION_PSK`/`_FILE` or `ncclSetEncryption`), each hello has the
//! secure magic and is followed by the dialer's 32 fresh random bytes and the socket's key
//! confirmation. Both sides derive the connection's keys from the key and (listen magic,
//! connection id, random bytes): one per socket, in the one direction data flows (dialer to
//! acceptor). As the dialer does not wait, the acceptor alone judges: it refuses a socket
//! whose confirmation does not match (another key), a plain hello when it has a key, a
//! secure one when it has none, and random bytes it has seen before on this listener (a
//! replayed connection). The bootstrap, encrypted with the same key, has already refused a
//! rank with another key before any transport connects; these checks are the second line.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::Duration;

use std::collections::HashSet;
use std::sync::Arc;

use rustccl_securewire::{self as sw, Keys, Psk};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::striping::{SocketConfig, MAX_SOCKETS, MAX_THREADS};
use crate::wire::{Hello, CONTROL_SOCKET, HELLO_BYTES, SECURE_EXTRA_BYTES};

/// A connection whose sockets are all there.
#[derive(Debug)]
pub struct Established {
    /// The other side's address (of its control socket).
    pub peer: SocketAddr,
    pub ctrl: Socket,
    /// Data sockets, by index.
    pub data: Vec<Socket>,
    /// Helper threads the sending side drives the data sockets with (the receiver uses as many).
    pub nthreads: usize,
    /// The connection's keys, when it is encrypted.
    pub keys: Option<Arc<Keys>>,
}

/// The label of socket `socket`'s keys ([`CONTROL_SOCKET`] or a data socket index).
pub fn socket_label(socket: u32) -> String {
    if socket == CONTROL_SOCKET {
        "ctrl".into()
    } else {
        format!("data {socket}")
    }
}

/// The connection's keys: from the key, the listener's magic, the connection id and the
/// dialer's random bytes.
fn connection_keys(psk: &Psk, listen_magic: u64, conn_id: u64, nonce: &[u8]) -> Keys {
    Keys::derive(
        psk,
        &[
            &listen_magic.to_le_bytes()[..],
            &conn_id.to_le_bytes(),
            nonce,
        ]
        .concat(),
    )
}

/// `send` flags: never raise SIGPIPE in the host process when the peer is gone.
pub const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;

/// A fresh non-blocking TCP socket with Nagle off, for `addr`'s family.
fn tcp_socket(addr: &SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    Ok(sock)
}

/// Bounds how long the peer of an established connection may stay silent
/// (`RUSTCCL_SOCKET_TIMEOUT_MS`): data the kernel sent and the peer has not acknowledged for
/// `limit` fails the socket (`TCP_USER_TIMEOUT`), and so do keepalive probes that go
/// unanswered for `limit` (sent after a second of silence, every second), which covers
/// sockets that only receive. A failed socket fails its connection, and the connection's
/// failure fails the operations that use it, so a partitioned network becomes an error on
/// every rank instead of a wait without end.
///
/// The trade-off: a network that stalls for longer than `limit` (a switch reboot, a long
/// congestion episode) now breaks the communicator, where TCP alone would have waited
/// (its retransmissions give up only after many minutes). A peer process that is merely
/// slow, stopped or descheduled still answers at the TCP level and is not affected.
pub fn set_liveness(sock: &Socket, limit: Duration) -> io::Result<()> {
    sock.set_tcp_user_timeout(Some(limit))?;
    let second = Duration::from_secs(1);
    sock.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(second)
            .with_interval(second)
            .with_retries(limit.as_secs().clamp(1, 127) as u32),
    )
}

/// Sets the IP traffic class (`NCCL_IB_TC`-like, from the communicator config); -1: leave it.
fn set_traffic_class(sock: &Socket, peer: &SocketAddr, traffic_class: i32) -> io::Result<()> {
    if traffic_class < 0 {
        return Ok(());
    }
    match peer {
        SocketAddr::V4(_) => sock.set_tos_v4(traffic_class as u32),
        SocketAddr::V6(_) => sock.set_tclass_v6(traffic_class as u32),
    }
}

/// A socket being connected.
struct Outgoing {
    sock: Socket,
    /// The hello, and with encryption what follows it.
    hello: Vec<u8>,
    sent: usize,
    connected: bool,
}

impl Outgoing {
    /// Advances; `Ok(true)` once connected and the hello is written.
    fn progress(&mut self) -> io::Result<bool> {
        if !self.connected {
            if let Some(e) = self.sock.take_error()? {
                return Err(e);
            }
            match self.sock.peer_addr() {
                Ok(_) => self.connected = true,
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        while self.sent < self.hello.len() {
            match self
                .sock
                .send_with_flags(&self.hello[self.sent..], SEND_FLAGS)
            {
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// The connecting side of one connection.
pub struct Dialer {
    peer: SocketAddr,
    /// The control socket, then the data sockets in order.
    sockets: Vec<Outgoing>,
    nthreads: usize,
    keys: Option<Arc<Keys>>,
}

impl Dialer {
    /// Starts connecting every socket to `peer` (non-blocking).
    pub fn start(
        peer: SocketAddr,
        listen_magic: u64,
        config: SocketConfig,
        traffic_class: i32,
        key: Option<Arc<Psk>>,
    ) -> io::Result<Dialer> {
        let nsocks = config.nsocks();
        let conn_id = random_u64()?;
        let secure = match key {
            Some(psk) => {
                let nonce: [u8; 32] = sw::random().map_err(|e| io::Error::other(e.message))?;
                Some((
                    nonce,
                    Arc::new(connection_keys(&psk, listen_magic, conn_id, &nonce)),
                ))
            }
            None => None,
        };
        let mut sockets = Vec::with_capacity(nsocks + 1);
        for i in 0..=nsocks {
            let sock = tcp_socket(&peer)?;
            set_traffic_class(&sock, &peer, traffic_class)?;
            match sock.connect(&SockAddr::from(peer)) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            let hello = Hello {
                listen_magic,
                conn_id,
                socket: if i == 0 {
                    CONTROL_SOCKET
                } else {
                    (i - 1) as u32
                },
                nsocks: nsocks as u16,
                nthreads: config.nthreads as u16,
                secure: secure.is_some(),
            };
            let mut bytes = hello.encode().to_vec();
            if let Some((nonce, keys)) = &secure {
                bytes.extend_from_slice(nonce);
                bytes.extend_from_slice(&keys.confirmation(&socket_label(hello.socket)));
            }
            sockets.push(Outgoing {
                sock,
                hello: bytes,
                sent: 0,
                connected: false,
            });
        }
        Ok(Dialer {
            peer,
            sockets,
            nthreads: config.nthreads,
            keys: secure.map(|(_, k)| k),
        })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Advances every socket; `Ok(true)` when all are connected and have sent their hello.
    pub fn progress(&mut self) -> io::Result<bool> {
        let mut done = true;
        for s in &mut self.sockets {
            done &= s.progress()?;
        }
        Ok(done)
    }

    /// The connection, once [`Dialer::progress`] said it is done.
    pub fn finish(self) -> Established {
        let mut sockets = self.sockets.into_iter().map(|s| s.sock);
        let ctrl = sockets.next().expect("the control socket");
        Established {
            peer: self.peer,
            ctrl,
            data: sockets.collect(),
            nthreads: self.nthreads,
            keys: self.keys,
        }
    }
}

/// A random number from the operating system (listen magics, connection ids).
pub fn random_u64() -> io::Result<u64> {
    getrandom::u64().map_err(|e| io::Error::other(format!("getrandom failed: {e}")))
}

/// An accepted socket whose hello is not complete yet.
struct Arriving {
    sock: Socket,
    peer: SocketAddr,
    /// The hello and, for an encrypted connection, what follows it.
    hello: [u8; HELLO_BYTES + SECURE_EXTRA_BYTES],
    got: usize,
}

/// The sockets of one connection that have arrived so far.
struct Group {
    nsocks: usize,
    nthreads: usize,
    ctrl: Option<(Socket, SocketAddr)>,
    data: Vec<Option<Socket>>,
    /// Encrypted: the dialer's random bytes and the keys.
    secure: Option<([u8; 32], Arc<Keys>)>,
}

impl Group {
    fn is_complete(&self) -> bool {
        self.ctrl.is_some() && self.data.iter().all(Option::is_some)
    }
}

/// The listening side: a bound, listening socket and the connections forming on it.
pub struct Acceptor {
    listener: Socket,
    addr: SocketAddr,
    magic: u64,
    arriving: Vec<Arriving>,
    groups: HashMap<u64, Group>,
    /// The process's key when the listener was made.
    key: Option<Arc<Psk>>,
    /// The dialers' random bytes seen on this listener: a connection that repeats them is a
    /// replay.
    seen: HashSet<[u8; 32]>,
}

impl Acceptor {
    /// Listens on `ip` (an ephemeral port) with a fresh random magic.
    /// With `key`, it accepts only connections encrypted with it.
    pub fn bind(ip: std::net::IpAddr, key: Option<Arc<Psk>>) -> io::Result<Acceptor> {
        let want = SocketAddr::new(ip, 0);
        let listener = tcp_socket(&want)?;
        listener.bind(&SockAddr::from(want))?;
        // The kernel caps the backlog at net.core.somaxconn; every socket of a connection
        // waits there until `accept` is called.
        listener.listen(16384)?;
        let addr = listener
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("listening socket has no IP address"))?;
        Ok(Acceptor {
            listener,
            addr,
            magic: random_u64()?,
            arriving: Vec::new(),
            groups: HashMap::new(),
            key,
            seen: HashSet::new(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn magic(&self) -> u64 {
        self.magic
    }

    /// Accepts what has arrived and reads hellos; returns a connection once all of its
    /// sockets are there. Refused sockets are closed and described through `warn`.
    pub fn progress(&mut self, warn: &mut dyn FnMut(String)) -> io::Result<Option<Established>> {
        loop {
            match self.listener.accept() {
                Ok((sock, from)) => {
                    let peer = from
                        .as_socket()
                        .ok_or_else(|| io::Error::other("accepted a non-IP socket"))?;
                    sock.set_nonblocking(true)?;
                    sock.set_tcp_nodelay(true)?;
                    self.arriving.push(Arriving {
                        sock,
                        peer,
                        hello: [0; HELLO_BYTES + SECURE_EXTRA_BYTES],
                        got: 0,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        let mut i = 0;
        while i < self.arriving.len() {
            match read_hello(&mut self.arriving[i]) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let a = self.arriving.swap_remove(i);
                    if let Err(why) = self.place(a.sock, a.peer, &a.hello) {
                        warn(format!(
                            "NET/Socket : refused a connection from {}: {why}",
                            a.peer
                        ));
                    }
                }
                Err(e) => {
                    let a = self.arriving.swap_remove(i);
                    warn(format!(
                        "NET/Socket : dropped a connection from {} before its hello: {e}",
                        a.peer
                    ));
                }
            }
        }
        let complete = self
            .groups
            .iter()
            .find(|(_, g)| g.is_complete())
            .map(|(id, _)| *id);
        Ok(complete.map(|id| {
            let g = self.groups.remove(&id).expect("the group just found");
            let (ctrl, peer) = g.ctrl.expect("complete");
            Established {
                peer,
                ctrl,
                data: g.data.into_iter().map(|s| s.expect("complete")).collect(),
                nthreads: g.nthreads,
                keys: g.secure.map(|(_, k)| k),
            }
        }))
    }

    /// Puts a socket with a complete hello into its connection's group.
    fn place(&mut self, sock: Socket, peer: SocketAddr, bytes: &[u8]) -> Result<(), String> {
        let head: &[u8; HELLO_BYTES] = bytes[..HELLO_BYTES].try_into().expect("a hello");
        let hello = Hello::decode(head).ok_or("it is not a rustccl socket-plugin connection")?;
        if hello.listen_magic != self.magic {
            return Err("it was meant for another listener (stale or foreign handle)".into());
        }
        let secure = match (&self.key, hello.secure) {
            (None, false) => None,
            (Some(_), false) => {
                return Err("it is not encrypted: the peer runs without an encryption key, and this process has one; give every rank the same key".into())
            }
            (None, true) => {
                return Err("it is encrypted: the peer has an encryption key and this process has none; give every rank the same key".into())
            }
            (Some(psk), true) => {
                let extra = &bytes[HELLO_BYTES..HELLO_BYTES + SECURE_EXTRA_BYTES];
                let nonce: [u8; 32] = extra[..32].try_into().expect("32 bytes");
                let keys = connection_keys(psk, hello.listen_magic, hello.conn_id, &nonce);
                if keys.confirmation(&socket_label(hello.socket))[..] != extra[32..] {
                    return Err("its key confirmation does not match: the peer's encryption key differs from this process's".into());
                }
                Some((nonce, Arc::new(keys)))
            }
        };
        let nsocks = hello.nsocks as usize;
        let nthreads = hello.nthreads as usize;
        if !(1..=MAX_SOCKETS).contains(&nsocks) || !(1..=MAX_THREADS).contains(&nthreads) {
            return Err(format!("bad hello: {nsocks} sockets, {nthreads} threads"));
        }
        if !self.groups.contains_key(&hello.conn_id) {
            if let Some((nonce, _)) = &secure {
                if !self.seen.insert(*nonce) {
                    return Err(
                        "it repeats the random bytes of an earlier connection (a replay)".into(),
                    );
                }
            }
        }
        let group = self.groups.entry(hello.conn_id).or_insert_with(|| Group {
            nsocks,
            nthreads,
            ctrl: None,
            data: (0..nsocks).map(|_| None).collect(),
            secure: secure.clone(),
        });
        if group.nsocks != nsocks || group.nthreads != nthreads {
            return Err("its hello disagrees with the rest of its connection".into());
        }
        if group.secure.as_ref().map(|(n, _)| n) != secure.as_ref().map(|(n, _)| n) {
            return Err("its random bytes differ from the rest of its connection".into());
        }
        let slot_taken = if hello.socket == CONTROL_SOCKET {
            group.ctrl.replace((sock, peer)).is_some()
        } else {
            match group.data.get_mut(hello.socket as usize) {
                Some(slot) => slot.replace(sock).is_some(),
                None => {
                    return Err(format!(
                        "bad hello: data socket {} of {nsocks}",
                        hello.socket
                    ))
                }
            }
        };
        if slot_taken {
            return Err(format!(
                "socket {} of its connection arrived twice",
                hello.socket
            ));
        }
        Ok(())
    }
}

/// Reads what has arrived of a hello; `Ok(true)` when complete.
fn read_hello(a: &mut Arriving) -> io::Result<bool> {
    loop {
        // A secure hello announces the bytes that follow it.
        let want = if a.got >= HELLO_BYTES
            && a.hello[..8] == crate::wire::PROTO_MAGIC_SECURE.to_le_bytes()
        {
            HELLO_BYTES + SECURE_EXTRA_BYTES
        } else {
            HELLO_BYTES
        };
        if a.got >= want {
            return Ok(true);
        }
        match (&a.sock).read(&mut a.hello[a.got..want]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed")),
            Ok(n) => a.got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::{Duration, Instant};

    fn until<T>(mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn dial_then_accept_groups_sockets_and_refuses_strangers() {
        let mut acceptor = Acceptor::bind("127.0.0.1".parse().unwrap(), None).unwrap();
        let mut warnings = Vec::new();
        // A stranger with a wrong magic, and one that is not ours at all.
        let config = SocketConfig {
            nthreads: 2,
            nsocks_per_thread: 2,
            liveness: None,
        };
        let mut stale = Dialer::start(acceptor.addr(), acceptor.magic() ^ 1, config, -1, None).unwrap();
        until(|| stale.progress().unwrap().then_some(()));
        let mut junk = std::net::TcpStream::connect(acceptor.addr()).unwrap();
        junk.write_all(&[7u8; HELLO_BYTES]).unwrap();

        let mut dialer = Dialer::start(acceptor.addr(), acceptor.magic(), config, -1, None).unwrap();
        until(|| dialer.progress().unwrap().then_some(()));
        let sent = dialer.finish();
        let got = until(|| acceptor.progress(&mut |w| warnings.push(w)).unwrap());
        assert_eq!((got.data.len(), got.nthreads), (4, 2));
        assert_eq!(
            got.peer,
            sent.ctrl.local_addr().unwrap().as_socket().unwrap()
        );
        for (s, r) in sent.data.iter().zip(&got.data) {
            assert_eq!(
                s.local_addr().unwrap().as_socket(),
                r.peer_addr().unwrap().as_socket()
            );
        }
        until(|| {
            (warnings.len() >= 6).then_some(()).or_else(|| {
                acceptor.progress(&mut |w| warnings.push(w)).unwrap();
                None
            })
        });
        assert_eq!(
            warnings
                .iter()
                .filter(|w| w.contains("stale or foreign"))
                .count(),
            5,
            "{warnings:?}"
        );
        assert_eq!(
            warnings
                .iter()
                .filter(|w| w.contains("not a rustccl"))
                .count(),
            1,
            "{warnings:?}"
        );
        assert!(acceptor.groups.is_empty());
    }

    #[test]
    fn dialing_a_closed_port_fails() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mut d = Dialer::start(port, 1, SocketConfig::default(), -1, None).unwrap();
        let err = until(|| d.progress().err());
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    }
}

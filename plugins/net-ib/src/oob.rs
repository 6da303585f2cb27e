//! The out-of-band (OOB) TCP socket of a connection: connection setup without blocking,
//! then a watch on the peer. NCCL's IB transport sets connections up the same way:
//!
//! 1. the connector opens a TCP connection to the listener's address (from the handle) and
//!    writes its [`ConnInfo`] (starting with the listen's magic);
//! 2. the acceptor reads it, brings its QPs to RTS towards the connector's, and writes its
//!    own info;
//! 3. the connector reads that, brings its QPs to RTS, and writes one "ready" byte; the
//!    acceptor's connection exists once that byte is there, so the receiver never writes a
//!    CTS into a QP that is not yet ready to take it.
//!
//! Each step is a [`Pipe`]: bytes to write and a number of bytes to read, advanced as far as
//! the socket allows on each call. After setup nothing more is sent: the socket stays open
//! so that a peer that dies is seen as EOF ([`peer_gone`]), which an idle receiver would
//! otherwise never learn from verbs.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::wire::{ConnInfo, CONN_INFO_BYTES};

/// A socket with bytes to write and bytes to read, advanced without blocking.
pub struct Pipe {
    pub sock: TcpStream,
    out: Vec<u8>,
    sent: usize,
    inbuf: Vec<u8>,
    got: usize,
}

impl Pipe {
    pub fn new(sock: TcpStream, out: Vec<u8>, want: usize) -> Pipe {
        Pipe {
            sock,
            out,
            sent: 0,
            inbuf: vec![0; want],
            got: 0,
        }
    }

    /// Sets the next step on the same socket.
    pub fn next(&mut self, out: Vec<u8>, want: usize) {
        self.out = out;
        self.sent = 0;
        self.inbuf = vec![0; want];
        self.got = 0;
    }

    /// Writes and reads what it can; `Ok(Some(bytes read))` once all is written and read.
    /// EOF before the read is complete is an error.
    pub fn progress(&mut self) -> io::Result<Option<&[u8]>> {
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        while self.got < self.inbuf.len() {
            match self.sock.read(&mut self.inbuf[self.got..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during setup",
                    ))
                }
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Some(&self.inbuf))
    }
}

/// Starts a non-blocking TCP connection to `addr` (Nagle off).
pub fn start_connect(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    sock.set_tcp_nodelay(true)?;
    match sock.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(sock)
}

/// Whether a connection started by [`start_connect`] is up: `Ok(false)` while in progress.
pub fn connected(sock: &Socket) -> io::Result<bool> {
    if let Some(e) = sock.take_error()? {
        return Err(e);
    }
    match sock.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A listener on `addr` (port 0: any), non-blocking.
pub fn listen(addr: std::net::IpAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(SocketAddr::new(addr, 0))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The next incoming connection, if any, non-blocking with Nagle off.
pub fn accept_one(l: &TcpListener) -> io::Result<Option<TcpStream>> {
    match l.accept() {
        Ok((s, _)) => {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            Ok(Some(s))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Decodes a [`ConnInfo`] read by a [`Pipe`].
pub fn conn_info(bytes: &[u8]) -> Result<ConnInfo, String> {
    let b: &[u8; CONN_INFO_BYTES] = bytes
        .try_into()
        .map_err(|_| format!("connection info of {} bytes", bytes.len()))?;
    ConnInfo::decode(b)
}

/// Whether the peer of an established connection is gone: EOF or a socket error. Nothing
/// is sent after setup, so any readable byte is a protocol error too.
pub fn peer_gone(sock: &TcpStream) -> Option<String> {
    let mut b = [0u8; 1];
    match sock.peek(&mut b) {
        Ok(0) => {
            Some("the peer closed its connection (process exited or connection closed)".into())
        }
        Ok(_) => Some("the peer sent unexpected bytes on the out-of-band socket".into()),
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            None
        }
        Err(e) => Some(format!("the out-of-band socket failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_exchange_and_eof_is_seen() {
        let l = listen("127.0.0.1".parse().unwrap()).unwrap();
        let c = start_connect(l.local_addr().unwrap()).unwrap();
        let a = loop {
            if let Some(a) = accept_one(&l).unwrap() {
                break a;
            }
        };
        while !connected(&c).unwrap() {}
        let mut dial = Pipe::new(c.into(), b"hello".to_vec(), 3);
        let mut acc = Pipe::new(a, b"abc".to_vec(), 5);
        let (mut d, mut x) = (None, None);
        while d.is_none() || x.is_none() {
            if d.is_none() {
                d = dial.progress().unwrap().map(<[u8]>::to_vec);
            }
            if x.is_none() {
                x = acc.progress().unwrap().map(<[u8]>::to_vec);
            }
        }
        assert_eq!(d.unwrap(), b"abc");
        assert_eq!(x.unwrap(), b"hello");
        assert_eq!(peer_gone(&acc.sock), None);
        drop(dial);
        let t = std::time::Instant::now();
        while peer_gone(&acc.sock).is_none() {
            assert!(t.elapsed().as_secs() < 5, "EOF not seen");
        }
        acc.next(Vec::new(), 1);
        assert!(acc.progress().is_err(), "EOF during setup is an error");
    }
}

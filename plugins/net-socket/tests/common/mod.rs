//! Helpers shared by the integration tests: a connected pair over loopback, registered
//! buffers, and waiting for requests with a deadline (a hang fails the test instead).

#![allow(dead_code)]

use std::time::{Duration, Instant};

use rustccl_net_socket::{silent_log, SocketConfig, SocketNet, SocketSettings};
use rustccl_plugin_api::net::{Net, NetCommConfig, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

pub const QUIET: LogFn = LogFn { log: silent_log };

/// How long any one wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A plugin on loopback with `nthreads` × `nsocks_per_thread` data sockets per connection.
pub fn loopback_net(nthreads: usize, nsocks_per_thread: usize) -> SocketNet {
    SocketNet::with_settings(SocketSettings::loopback(SocketConfig {
        nthreads,
        nsocks_per_thread,
        liveness: None,
    }))
}

/// One connection of `net` to itself.
pub struct Pair {
    pub ctx: PluginHandle,
    pub listen: PluginHandle,
    pub send: PluginHandle,
    pub recv: PluginHandle,
}

/// Listens, then connects until done, then accepts until done, all from this thread (the
/// connecting side must not wait for the accepting side).
pub fn connect_pair(net: &dyn Net) -> Pair {
    let ctx = net.init(7, &NetCommConfig::default(), QUIET).unwrap();
    assert!(net.devices(ctx).unwrap() >= 1);
    let (handle, listen) = net.listen(ctx, 0).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let send = loop {
        if let Some(s) = net.connect(ctx, 0, &handle).unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "connect did not finish");
        std::thread::yield_now();
    };
    let recv = loop {
        if let Some(r) = net.accept(listen).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "accept did not finish");
        std::thread::yield_now();
    };
    Pair {
        ctx,
        listen,
        send,
        recv,
    }
}

/// Tests `req` until it completes or fails (or the deadline passes: a panic).
pub fn wait(net: &dyn Net, req: PluginHandle) -> Result<usize, PluginError> {
    let deadline = Instant::now() + DEADLINE;
    let mut sizes = [usize::MAX];
    loop {
        if net.test(req, &mut sizes)? {
            return Ok(sizes[0]);
        }
        assert!(
            Instant::now() < deadline,
            "request {req:?} did not complete"
        );
        std::thread::yield_now();
    }
}

/// Bytes with a pattern that depends on `seed`, so that a misplaced message shows.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn reg(net: &dyn Net, comm: PluginHandle, buf: &[u8]) -> PluginHandle {
    net.reg_mr(comm, buf.as_ptr() as usize, buf.len(), PTR_HOST)
        .unwrap()
}

pub fn isend(
    net: &dyn Net,
    comm: PluginHandle,
    buf: &[u8],
    tag: i32,
    mr: PluginHandle,
) -> PluginHandle {
    // SAFETY: every test keeps `buf` alive and unchanged until the request is complete or
    // the connection closed.
    unsafe { net.isend(comm, buf.as_ptr() as usize, buf.len(), tag, mr) }
        .unwrap()
        .expect("room for a send")
}

pub fn irecv(
    net: &dyn Net,
    comm: PluginHandle,
    buf: &mut [u8],
    tag: i32,
    mr: PluginHandle,
) -> PluginHandle {
    let rb = RecvBuffer {
        data: buf.as_mut_ptr() as usize,
        size: buf.len(),
        tag,
        mr,
    };
    // SAFETY: as for `isend`.
    unsafe { net.irecv(comm, &[rb]) }
        .unwrap()
        .expect("room for a receive")
}

/// Sends `src` and receives it into a buffer of `recv_len` bytes; returns the buffer and the
/// size `test` reported.
pub fn round_trip(net: &dyn Net, p: &Pair, src: &[u8], recv_len: usize) -> (Vec<u8>, usize) {
    let mut dst = vec![0xeeu8; recv_len];
    let (smr, rmr) = (reg(net, p.send, src), reg(net, p.recv, &dst));
    let r = irecv(net, p.recv, &mut dst, 3, rmr);
    let s = isend(net, p.send, src, 3, smr);
    assert_eq!(wait(net, s).unwrap(), src.len());
    let got = wait(net, r).unwrap();
    net.dereg_mr(p.send, smr).unwrap();
    net.dereg_mr(p.recv, rmr).unwrap();
    (dst, got)
}

pub fn close_pair(net: &dyn Net, p: Pair) {
    net.close_send(p.send).unwrap();
    net.close_recv(p.recv).unwrap();
    net.close_listen(p.listen).unwrap();
    net.finalize(p.ctx).unwrap();
}

/// Threads of this process now.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

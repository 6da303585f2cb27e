//! Loopback throughput of the socket plugin: one connection, messages of `SIZE_MIB` (default
//! 256) sent back to back, `ITERS` (default 8) times, for a few thread × socket layouts.
//!
//! `cargo run --release -p rustccl-net-socket --example loopback_bw [SIZE_MIB] [ITERS]`

use std::time::{Duration, Instant};

use rustccl_net_socket::{silent_log, SocketConfig, SocketNet, SocketSettings};
use rustccl_plugin_api::net::{Net, NetCommConfig, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{LogFn, PluginHandle};

fn wait(net: &dyn Net, req: PluginHandle) -> usize {
    let mut sizes = [0];
    let deadline = Instant::now() + Duration::from_secs(120);
    while !net.test(req, &mut sizes).expect("test") {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::yield_now();
    }
    sizes[0]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size_mib: usize = args.next().map_or(256, |a| a.parse().expect("SIZE_MIB"));
    let iters: usize = args.next().map_or(8, |a| a.parse().expect("ITERS"));
    let size = size_mib << 20;
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    for (nthreads, nsocks_per_thread) in [(1, 1), (1, 2), (2, 1), (2, 2), (1, 4), (4, 1), (2, 4)] {
        let net = SocketNet::with_settings(SocketSettings::loopback(SocketConfig {
            nthreads,
            nsocks_per_thread,
            liveness: None,
        }));
        let ctx = net
            .init(1, &NetCommConfig::default(), LogFn { log: silent_log })
            .unwrap();
        let (handle, listen) = net.listen(ctx, 0).unwrap();
        let send = loop {
            if let Some(s) = net.connect(ctx, 0, &handle).unwrap() {
                break s;
            }
        };
        let recv = loop {
            if let Some(r) = net.accept(listen).unwrap() {
                break r;
            }
        };
        let smr = net
            .reg_mr(send, src.as_ptr() as usize, size, PTR_HOST)
            .unwrap();
        let rmr = net
            .reg_mr(recv, dst.as_mut_ptr() as usize, size, PTR_HOST)
            .unwrap();
        let rb = RecvBuffer {
            data: dst.as_mut_ptr() as usize,
            size,
            tag: 0,
            mr: rmr,
        };
        let mut best = f64::MAX;
        let mut worst = 0f64;
        let started = Instant::now();
        for _ in 0..iters {
            let t = Instant::now();
            // SAFETY: both buffers outlive the requests, which are waited for below.
            let (r, s) = unsafe {
                (
                    net.irecv(recv, &[rb]).unwrap().unwrap(),
                    net.isend(send, src.as_ptr() as usize, size, 0, smr)
                        .unwrap()
                        .unwrap(),
                )
            };
            assert_eq!(wait(&net, s), size);
            assert_eq!(wait(&net, r), size);
            best = best.min(t.elapsed().as_secs_f64());
            worst = worst.max(t.elapsed().as_secs_f64());
        }
        let avg = started.elapsed().as_secs_f64() / iters as f64;
        println!(
            "{nthreads} threads x {nsocks_per_thread} sockets: {:.2} GB/s average, {:.2} best, {:.2} worst ({} x {size_mib} MiB)",
            size as f64 / avg / 1e9,
            size as f64 / best / 1e9,
            size as f64 / worst / 1e9,
            iters
        );
        net.close_send(send).unwrap();
        net.close_recv(recv).unwrap();
        net.close_listen(listen).unwrap();
        net.finalize(ctx).unwrap();
    }
    assert!(dst.iter().all(|&b| b == 0x5a));
}

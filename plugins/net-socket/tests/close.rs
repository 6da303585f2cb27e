//! Closing connections with requests in flight frees everything: no helper thread is left.
//! (Its own test binary, so that no other test's threads disturb the count.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustccl_plugin_api::net::Net;

#[test]
fn closing_with_requests_in_flight_leaves_no_threads() {
    let before = thread_count();
    let net = loopback_net(4, 2);
    for round in 0..3 {
        let p = connect_pair(&net);
        assert!(thread_count() >= before + 8, "4 helper threads per side");
        let srcs: Vec<Vec<u8>> = (0..8).map(|i| pattern(16 << 20, i)).collect();
        let mut dsts: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 16 << 20]).collect();
        for (i, src) in srcs.iter().enumerate() {
            let mr = reg(&net, p.send, src);
            isend(&net, p.send, src, i as i32, mr);
        }
        // The first round posts receives too (data moving when the close comes); the others
        // leave the senders blocked on full sockets.
        if round == 0 {
            for dst in dsts.iter_mut() {
                let mr = reg(&net, p.recv, dst);
                irecv(&net, p.recv, dst, 0, mr);
            }
        }
        // Close in either order, while requests are pending.
        if round == 1 {
            net.close_recv(p.recv).unwrap();
            net.close_send(p.send).unwrap();
        } else {
            net.close_send(p.send).unwrap();
            net.close_recv(p.recv).unwrap();
        }
        net.close_listen(p.listen).unwrap();
        net.finalize(p.ctx).unwrap();
        // Buffers may go now: the helper threads are gone.
        drop(srcs);
        drop(dsts);
        assert_eq!(net.open_connections(), 0);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while thread_count() != before {
        assert!(
            Instant::now() < deadline,
            "threads left: {} before, {} now",
            before,
            thread_count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

//! The data path on the verbs stand-in, beyond the conformance suite: the 256-slot CTS FIFO
//! wrapping around (600 messages on one connection, 32 in flight), sizes that are not
//! multiples of 128 split over 3 QPs, the adaptive-routing posting, registrations sharing
//! cached pages, and an injected error completion turning into an error from `test` on both
//! sides (no hang).
//! Each case runs in a child process with its own environment and a time limit; all are
//! skipped, with the reason printed, when the stand-in cannot be built (see `common`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustccl_plugin_api::net::{Net, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::PluginHandle;

fn byte(msg: usize, i: usize) -> u8 {
    (msg * 31 + i * 7) as u8
}

/// Sends `count` messages of `size(i)` bytes, `window` in flight, each checked.
fn stream(p: &Pair, count: usize, window: usize, size: impl Fn(usize) -> usize) {
    let max = (0..count).map(&size).max().unwrap_or(0);
    let mut src = vec![0u8; max * window];
    let mut dst = vec![0u8; max * window];
    let smr = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize, src.len(), PTR_HOST)
        .unwrap();
    let rmr = p
        .net
        .reg_mr(p.recv, dst.as_ptr() as usize, dst.len(), PTR_HOST)
        .unwrap();
    let mut msg = 0;
    while msg < count {
        let batch: Vec<usize> = (msg..count.min(msg + window)).collect();
        let mut reqs = Vec::new();
        for (slot, &m) in batch.iter().enumerate() {
            let len = size(m);
            let s = &mut src[slot * max..slot * max + len];
            for (i, b) in s.iter_mut().enumerate() {
                *b = byte(m, i);
            }
            let rb = [RecvBuffer {
                data: dst[slot * max..].as_mut_ptr() as usize,
                size: max,
                tag: m as i32,
                mr: rmr,
            }];
            // SAFETY: the buffers outlive the requests (waited for below).
            let r = unsafe { p.net.irecv(p.recv, &rb) }
                .unwrap()
                .expect("a receive slot");
            // SAFETY: as above.
            let s = unsafe { p.net.isend(p.send, s.as_ptr() as usize, len, m as i32, smr) }
                .unwrap()
                .expect("a send slot");
            reqs.push((m, len, s, r));
        }
        for (slot, (m, len, s, r)) in reqs.into_iter().enumerate() {
            wait(&p.net, s).unwrap_or_else(|e| panic!("send {m}: {e}"));
            let got = wait(&p.net, r).unwrap_or_else(|e| panic!("receive {m}: {e}"));
            assert_eq!(got, len, "message {m}: received size");
            let d = &dst[slot * max..slot * max + len];
            if let Some(at) = (0..len).find(|&i| d[i] != byte(m, i)) {
                panic!("message {m} ({len} bytes) corrupted at byte {at}");
            }
        }
        msg += batch.len();
    }
    p.net.dereg_mr(p.send, smr).unwrap();
    p.net.dereg_mr(p.recv, rmr).unwrap();
}

#[test]
fn fifo_wraps_and_messages_split_over_three_qps() {
    run("fifo_child", &[("NCCL_IB_QPS_PER_CONNECTION", "3")]);
}

#[test]
fn fifo_child() {
    if !is_role("fifo_child") {
        return;
    }
    let p = connect();
    // 600 messages (the FIFO's 256 slots wrap twice), sizes 0..~70 KB, most not multiples
    // of 128, so the 3 QPs get uneven parts and some get none.
    stream(&p, 600, 32, |m| (m * 997) % 70_001);
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

#[test]
fn adaptive_routing_posts_writes_then_a_zero_byte_immediate() {
    // Forced on (RoCE's default is off) with a low threshold: messages above 1000 bytes go
    // as plain writes plus a 0-byte write-with-immediate per QP, smaller ones as before.
    run(
        "ar_child",
        &[
            ("NCCL_IB_QPS_PER_CONNECTION", "2"),
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_AR_THRESHOLD", "1000"),
        ],
    );
}

#[test]
fn ar_child() {
    if !is_role("ar_child") {
        return;
    }
    let p = connect();
    stream(&p, 300, 16, |m| {
        [0, 1, 999, 1000, 1001, 4097, 65_537, 300_001][m % 8]
    });
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

#[test]
fn registrations_are_shared_and_counted() {
    run("mr_child", &[]);
}

#[test]
fn mr_child() {
    if !is_role("mr_child") {
        return;
    }
    let p = connect();
    let src = vec![5u8; 10_000];
    let mut dst = vec![0u8; 10_000];
    // Two registrations of the same pages (one cached MR, two references): deregistering
    // the first leaves the second usable. (The counts themselves are checked by
    // mr_cache's unit tests; each handle also holds its MR, so this is about the plugin's
    // handle bookkeeping: the right handle goes, the other stays.)
    let a = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize, src.len(), PTR_HOST)
        .unwrap();
    let b = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize + 100, 500, PTR_HOST)
        .unwrap();
    let rmr = p
        .net
        .reg_mr(p.recv, dst.as_ptr() as usize, dst.len(), PTR_HOST)
        .unwrap();
    p.net.dereg_mr(p.send, a).unwrap();
    assert!(
        p.net.dereg_mr(p.send, a).is_err(),
        "a handle deregisters once"
    );
    let rb = [RecvBuffer {
        data: dst.as_mut_ptr() as usize,
        size: dst.len(),
        tag: 1,
        mr: rmr,
    }];
    // SAFETY: buffers outlive the requests.
    let r = unsafe { p.net.irecv(p.recv, &rb) }.unwrap().unwrap();
    // SAFETY: as above.
    let s = unsafe { p.net.isend(p.send, src.as_ptr() as usize + 100, 500, 1, b) }
        .unwrap()
        .unwrap();
    wait(&p.net, s).expect("send through the shared registration");
    assert_eq!(wait(&p.net, r).unwrap(), 500);
    assert!(dst[..500].iter().all(|&x| x == 5));
    // Past the registered pages: refused before any verbs call.
    // SAFETY: refused without touching memory.
    let e = unsafe { p.net.isend(p.send, src.as_ptr() as usize, 20_000, 1, b) }.unwrap_err();
    assert!(e.message.contains("outside its registration"), "{e}");
    p.net.dereg_mr(p.send, b).unwrap();
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

#[test]
fn an_error_completion_fails_the_request() {
    // The stand-in fails every send WR after the first 6 of the process (CTS writes and
    // data writes alike) with IBV_WC_RETRY_EXC_ERR, as a fabric that lost the path would.
    run("error_child", &[("IBV_DOUBLE_FAIL_AFTER", "6")]);
}

#[test]
fn error_child() {
    if !is_role("error_child") {
        return;
    }
    let p = connect();
    let src = vec![1u8; 4096];
    let mut dst = vec![0u8; 4096];
    let smr = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize, src.len(), PTR_HOST)
        .unwrap();
    let rmr = p
        .net
        .reg_mr(p.recv, dst.as_ptr() as usize, dst.len(), PTR_HOST)
        .unwrap();
    let mut errors = Vec::new();
    for m in 0..10 {
        let rb = [RecvBuffer {
            data: dst.as_mut_ptr() as usize,
            size: dst.len(),
            tag: 0,
            mr: rmr,
        }];
        // SAFETY: buffers outlive the requests (or the connections are closed first).
        let r = unsafe { p.net.irecv(p.recv, &rb) };
        // SAFETY: as above.
        let s = unsafe { p.net.isend(p.send, src.as_ptr() as usize, 4096, 0, smr) };
        // Test both requests in turn, as NCCL's proxy does, until each is done or failed.
        let mut pending: Vec<(&str, PluginHandle)> = Vec::new();
        for (what, posted) in [("receive", r), ("send", s)] {
            match posted {
                Ok(h) => pending.push((what, h.expect("a request slot"))),
                Err(e) => errors.push(format!("{what} {m} (post): {e}")),
            }
        }
        let start = Instant::now();
        while !pending.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "message {m}: {pending:?} neither completed nor failed (hang)"
            );
            pending.retain(|&(what, h)| match p.net.test(h, &mut [0]) {
                Ok(done) => !done,
                Err(e) => {
                    errors.push(format!("{what} {m}: {e}"));
                    false
                }
            });
        }
        if !errors.is_empty() {
            break;
        }
    }
    println!("errors: {errors:#?}");
    assert!(
        !errors.is_empty(),
        "an injected error completion must fail a request"
    );
    // The side whose work request failed names the completion status; the other side,
    // waiting on it, fails too (through the out-of-band socket) instead of hanging.
    assert!(
        errors
            .iter()
            .any(|e| e.contains("transport retry counter exceeded")),
        "{errors:?}"
    );
    assert_eq!(
        errors.len(),
        2,
        "both the receive and the send fail: {errors:?}"
    );
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

//! The data path on the verbs stand-in, beyond the conformance suite: the 32-row CTS FIFO
//! wrapping around (600 messages on one connection, 32 in flight), sizes that are not
//! multiples of 128 split over 3 QPs, the adaptive-routing posting, multi-receive (8 tagged
//! buffers per receive, sends in another order, the FIFO wrapping; under reordered data
//! placement; a send whose tag fits no buffer), registrations sharing cached pages, and an
//! injected error completion turning into an error from `test` on both sides (no hang).
//! Each case runs in a child process with its own environment and a time limit; all are
//! skipped, with the reason printed, when the stand-in cannot be built (see `common`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use rustccl_plugin_api::net::{Net, RecvBuffer, PTR_HOST};
use rustccl_net_ib::IbNet;
use rustccl_plugin_api::{PluginError, PluginHandle};

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
    // 600 messages (the FIFO's 32 rows wrap 18 times), sizes 0..~70 KB, most not multiples
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

/// Polls until done; all the sizes the request reports (`n` buffers).
fn wait_sizes(net: &IbNet, req: PluginHandle, n: usize) -> Result<Vec<usize>, PluginError> {
    let mut sizes = vec![usize::MAX; n];
    let start = Instant::now();
    while !net.test(req, &mut sizes)? {
        assert!(start.elapsed() < Duration::from_secs(30), "test hang");
        std::thread::yield_now();
    }
    Ok(sizes)
}

/// Byte `i` of the message with tag `tag`.
fn tagged_byte(tag: i32, i: usize) -> u8 {
    (tag as usize * 131 + i * 13 + (i >> 8)) as u8
}

/// What receive buffers hold where no byte was received.
const UNTOUCHED: u8 = 0xee;

/// Receives `rounds` multi-receives, `window` of them in flight; receive `r` has
/// `bufs(r)` buffers of `cap` bytes with distinct tags, buffer `b` getting `size(r, b)`
/// bytes. Each receive's sends are posted in an order other than its buffers' (reversed,
/// rotated by `r`). Checks every reported size and every byte of every buffer, including
/// that nothing was written past a message's end.
fn multi_stream(
    p: &Pair,
    rounds: usize,
    window: usize,
    cap: usize,
    bufs: impl Fn(usize) -> usize,
    size: impl Fn(usize, usize) -> usize,
) {
    const MAX: usize = 8;
    let tag = |r: usize, b: usize| (r * MAX + b) as i32;
    let mut src = vec![0u8; window * MAX * cap];
    let mut dst = vec![UNTOUCHED; window * MAX * cap];
    let smr = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize, src.len(), PTR_HOST)
        .unwrap();
    let rmr = p
        .net
        .reg_mr(p.recv, dst.as_ptr() as usize, dst.len(), PTR_HOST)
        .unwrap();
    let at = |slot: usize, b: usize| (slot * MAX + b) * cap;
    let mut r0 = 0;
    while r0 < rounds {
        let batch: Vec<usize> = (r0..rounds.min(r0 + window)).collect();
        let mut posted = Vec::new();
        for (slot, &r) in batch.iter().enumerate() {
            let n = bufs(r);
            dst[at(slot, 0)..at(slot + 1, 0)].fill(UNTOUCHED);
            let rb: Vec<RecvBuffer> = (0..n)
                .map(|b| RecvBuffer {
                    data: dst[at(slot, b)..].as_mut_ptr() as usize,
                    size: cap,
                    tag: tag(r, b),
                    mr: rmr,
                })
                .collect();
            // SAFETY: the buffers outlive the requests (waited for below).
            let recv = unsafe { p.net.irecv(p.recv, &rb) }
                .unwrap_or_else(|e| panic!("receive {r} of {n} buffers: {e}"))
                .expect("a receive slot");
            let mut sends = Vec::new();
            for i in (0..n).rev() {
                let b = (i + r) % n;
                let len = size(r, b);
                let s = &mut src[at(slot, b)..at(slot, b) + len];
                for (k, x) in s.iter_mut().enumerate() {
                    *x = tagged_byte(tag(r, b), k);
                }
                // SAFETY: as above.
                let h = unsafe {
                    p.net
                        .isend(p.send, s.as_ptr() as usize, len, tag(r, b), smr)
                }
                .unwrap_or_else(|e| panic!("send {r}/{b}: {e}"))
                .expect("a send slot");
                sends.push((b, len, h));
            }
            posted.push((slot, r, n, recv, sends));
        }
        for (slot, r, n, recv, sends) in posted {
            for (b, len, h) in sends {
                let sent = wait_sizes(&p.net, h, 1).unwrap_or_else(|e| panic!("send {r}/{b}: {e}"));
                assert_eq!(sent, [len], "send {r}/{b}: reported size");
            }
            let got = wait_sizes(&p.net, recv, n).unwrap_or_else(|e| panic!("receive {r}: {e}"));
            let want: Vec<usize> = (0..n).map(|b| size(r, b)).collect();
            assert_eq!(got, want, "receive {r}: sizes per buffer");
            for (b, &len) in want.iter().enumerate() {
                let d = &dst[at(slot, b)..at(slot, b) + cap];
                if let Some(k) = (0..len).find(|&k| d[k] != tagged_byte(tag(r, b), k)) {
                    panic!("receive {r} buffer {b} ({len} bytes) corrupted at byte {k}");
                }
                if let Some(k) = (len..cap).find(|&k| d[k] != UNTOUCHED) {
                    panic!(
                        "receive {r} buffer {b} ({len} bytes) written past its end, at byte {k}"
                    );
                }
            }
        }
        r0 += batch.len();
    }
    p.net.dereg_mr(p.send, smr).unwrap();
    p.net.dereg_mr(p.recv, rmr).unwrap();
}

#[test]
fn multi_receive_of_eight_tagged_buffers_over_three_qps() {
    run("multi_child", &[("NCCL_IB_QPS_PER_CONNECTION", "3")]);
}

#[test]
fn multi_child() {
    if !is_role("multi_child") {
        return;
    }
    let p = connect();
    // 200 receives (the 32-row FIFO wraps 6 times), 3 in flight (24 sends): mostly 8
    // buffers, some 1 to 7; sizes up to ~9 KB, most not multiples of 128, some 0 (the 3 QPs
    // get uneven parts, some none).
    multi_stream(
        &p,
        200,
        3,
        9000,
        |r| [8, 8, 3, 8, 1, 8, 5, 2, 8, 7][r % 10],
        |r, b| {
            if (r + b) % 7 == 3 {
                0
            } else {
                (r * 7919 + b * 1_237) % 9000
            }
        },
    );
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

#[test]
fn multi_receive_under_reordered_placement() {
    // The stand-in places plain writes late and in reverse order (at the next write with
    // immediate, or within 2 ms): the data and the size records of a bundle land only
    // before its write-with-immediate, and the CTS rows in the sender's memory late.
    run(
        "reorder_child",
        &[
            ("NCCL_IB_QPS_PER_CONNECTION", "2"),
            ("IBV_DOUBLE_REORDER", "1"),
        ],
    );
}

#[test]
fn reorder_child() {
    if !is_role("reorder_child") {
        return;
    }
    let p = connect();
    // Bundles of 2; the sizes differ from round to round, so a size record read before the
    // sender's write landed (a stale one, 32 rounds old) is seen.
    multi_stream(
        &p,
        100,
        2,
        5000,
        |_| 2,
        |r, b| (r * 37 + b * 1001 + 1) % 5000,
    );
    p.net.close_send(p.send).unwrap();
    p.net.close_recv(p.recv).unwrap();
}

#[test]
fn a_send_whose_tag_fits_no_buffer_fails() {
    run("bad_tag_child", &[]);
}

#[test]
fn bad_tag_child() {
    if !is_role("bad_tag_child") {
        return;
    }
    let p = connect();
    let src = vec![3u8; 1000];
    let mut dst = vec![0u8; 2000];
    let smr = p
        .net
        .reg_mr(p.send, src.as_ptr() as usize, src.len(), PTR_HOST)
        .unwrap();
    let rmr = p
        .net
        .reg_mr(p.recv, dst.as_ptr() as usize, dst.len(), PTR_HOST)
        .unwrap();
    let base = dst.as_mut_ptr() as usize;
    let buf = |b: usize, tag: i32| RecvBuffer {
        data: base + b * 1000,
        size: 1000,
        tag,
        mr: rmr,
    };
    // More buffers than max_recvs, or none: refused, naming the limit.
    for n in [0, 9] {
        let rb: Vec<RecvBuffer> = (0..n).map(|_| buf(0, 1)).collect();
        // SAFETY: refused before any buffer is used.
        let e = unsafe { p.net.irecv(p.recv, &rb) }.unwrap_err();
        assert!(e.message.contains("max_recvs = 8"), "{n} buffers: {e}");
    }
    // Tags 1 and 2 received; 1 and 9 sent.
    // SAFETY: the buffers outlive the requests (the connections are closed first).
    let r = unsafe { p.net.irecv(p.recv, &[buf(0, 1), buf(1, 2)]) }
        .unwrap()
        .unwrap();
    let mut errors = Vec::new();
    let mut pending = vec![("receive", r)];
    for tag in [1, 9] {
        // SAFETY: as above.
        match unsafe { p.net.isend(p.send, src.as_ptr() as usize, 1000, tag, smr) } {
            Ok(h) => pending.push(("send", h.expect("a send slot"))),
            Err(e) => errors.push(format!("send tag {tag} (post): {e}")),
        }
    }
    let start = Instant::now();
    while !pending.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{pending:?} neither completed nor failed (hang)"
        );
        pending.retain(|&(what, h)| match p.net.test(h, &mut [0, 0]) {
            Ok(done) => {
                assert!(!done, "{what} completed though a send's tag fits no buffer");
                true
            }
            Err(e) => {
                errors.push(format!("{what}: {e}"));
                false
            }
        });
    }
    println!("errors: {errors:#?}");
    assert!(
        errors.iter().any(|e| e.contains(
            "send with tag 9 matches no free buffer of the receive it meets (tags [1, 2])"
        )),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("receive:")),
        "the receiver fails too (the sender shut the connection): {errors:?}"
    );
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

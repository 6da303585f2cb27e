//! The data path on the verbs stand-in, beyond the conformance suite: the 32-row CTS FIFO
//! wrapping around (600 messages on one connection, 32 in flight), sizes that are not
//! multiples of 128 split over 3 QPs, the adaptive-routing posting, multi-receive (8 tagged
//! buffers per receive, sends in another order, the FIFO wrapping; under reordered data
//! placement; a send whose tag fits no buffer), registrations sharing cached pages, and an
//! injected error completion turning into an error from `test` on both sides (no hang).
//! Each case runs in a child process with its own environment and a time limit; all are
//! skipped, with the reason printed, when the stand-in cannot be built (see `common`).

mod common;

use std::time::Instant;

use common::*;
use rustccl_plugin_api::net::{Net, RecvBuffer};
use rustccl_plugin_api::PluginHandle;

#[test]
fn fifo_wraps_and_messages_split_over_three_qps() {
    in_child(
        "fifo_wraps_and_messages_split_over_three_qps",
        &[("NCCL_IB_QPS_PER_CONNECTION", "3")],
        || {
            let p = Pair::connect();
            // 600 messages (the FIFO's 32 rows wrap 18 times), sizes 0..~70 KB, most not
            // multiples of 128, so the 3 QPs get uneven parts and some get none.
            p.stream(600, 32, |m| (m * 997) % 70_001);
            p.close();
        },
    );
}

#[test]
fn adaptive_routing_posts_writes_then_a_zero_byte_immediate() {
    // Forced on (RoCE's default is off) with a low threshold: messages above 1000 bytes go
    // as plain writes plus a 0-byte write-with-immediate per QP, smaller ones as before.
    let env = [
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
        ("NCCL_IB_AR_THRESHOLD", "1000"),
    ];
    in_child(
        "adaptive_routing_posts_writes_then_a_zero_byte_immediate",
        &env,
        || {
            let p = Pair::connect();
            p.stream(300, 16, |m| {
                [0, 1, 999, 1000, 1001, 4097, 65_537, 300_001][m % 8]
            });
            p.close();
        },
    );
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
    let smr = p.reg(p.send, &src);
    let rmr = p.reg(p.recv, &dst);
    let at = |slot: usize, b: usize| (slot * MAX + b) * cap;
    for first in (0..rounds).step_by(window) {
        let mut posted = Vec::new();
        for (slot, r) in (first..rounds.min(first + window)).enumerate() {
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
                let sent = p
                    .wait_sizes(h, 1)
                    .unwrap_or_else(|e| panic!("send {r}/{b}: {e}"));
                assert_eq!(sent, [len], "send {r}/{b}: reported size");
            }
            let got = p
                .wait_sizes(recv, n)
                .unwrap_or_else(|e| panic!("receive {r}: {e}"));
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
    }
    p.net.dereg_mr(p.send, smr).unwrap();
    p.net.dereg_mr(p.recv, rmr).unwrap();
}

#[test]
fn multi_receive_of_eight_tagged_buffers_over_three_qps() {
    in_child(
        "multi_receive_of_eight_tagged_buffers_over_three_qps",
        &[("NCCL_IB_QPS_PER_CONNECTION", "3")],
        || {
            let p = Pair::connect();
            // 200 receives (the 32-row FIFO wraps 6 times), 3 in flight (24 sends): mostly
            // 8 buffers, some 1 to 7; sizes up to ~9 KB, most not multiples of 128, some 0
            // (the 3 QPs get uneven parts, some none).
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
            p.close();
        },
    );
}

#[test]
fn multi_receive_under_reordered_placement() {
    // The stand-in places plain writes late and in reverse order (at the next write with
    // immediate, or within 2 ms): the data and the size records of a bundle land only
    // before its write-with-immediate, and the CTS rows in the sender's memory late.
    let env = [
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("IBV_DOUBLE_REORDER", "1"),
    ];
    in_child("multi_receive_under_reordered_placement", &env, || {
        let p = Pair::connect();
        // Bundles of 2; the sizes differ from round to round, so a size record read before
        // the sender's write landed (a stale one, 32 rounds old) is seen.
        multi_stream(
            &p,
            100,
            2,
            5000,
            |_| 2,
            |r, b| (r * 37 + b * 1001 + 1) % 5000,
        );
        p.close();
    });
}

/// Tests each of `pending` (what it is, the request) in turn, as NCCL's proxy does, until
/// each is done or has failed; a hang past [`REQUEST_LIMIT`] panics. Returns what completed
/// and, for what failed, `"{what}: {error}"`.
fn settle(p: &Pair, mut pending: Vec<(String, PluginHandle)>) -> (Vec<String>, Vec<String>) {
    let (mut completed, mut errors) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while !pending.is_empty() {
        assert!(
            start.elapsed() < REQUEST_LIMIT,
            "{pending:?} neither completed nor failed (hang)"
        );
        pending.retain(|(what, h)| match p.net.test(*h, &mut [0; 8]) {
            Ok(false) => true,
            Ok(true) => {
                completed.push(what.clone());
                false
            }
            Err(e) => {
                errors.push(format!("{what}: {e}"));
                false
            }
        });
    }
    (completed, errors)
}

#[test]
fn a_send_whose_tag_fits_no_buffer_fails() {
    in_child("a_send_whose_tag_fits_no_buffer_fails", &[], || {
        let p = Pair::connect();
        let src = vec![3u8; 1000];
        let mut dst = vec![0u8; 2000];
        let smr = p.reg(p.send, &src);
        let rmr = p.reg(p.recv, &dst);
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
        let mut pending = vec![("receive".to_string(), r)];
        for tag in [1, 9] {
            // SAFETY: as above.
            match unsafe { p.net.isend(p.send, src.as_ptr() as usize, 1000, tag, smr) } {
                Ok(h) => pending.push(("send".to_string(), h.expect("a send slot"))),
                Err(e) => errors.push(format!("send tag {tag} (post): {e}")),
            }
        }
        let (completed, failed) = settle(&p, pending);
        assert!(
            completed.is_empty(),
            "{completed:?} completed though a send's tag fits no buffer"
        );
        errors.extend(failed);
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
        p.close();
    });
}

#[test]
fn registrations_are_shared_and_counted() {
    in_child("registrations_are_shared_and_counted", &[], || {
        let p = Pair::connect();
        let src = vec![5u8; 10_000];
        let mut dst = vec![0u8; 10_000];
        // Two registrations of the same pages (one cached MR, two references):
        // deregistering the first leaves the second usable. (The counts themselves are
        // checked by mr_cache's unit tests; each handle also holds its MR, so this is about
        // the plugin's handle bookkeeping: the right handle goes, the other stays.)
        let a = p.reg(p.send, &src);
        let b = p.reg(p.send, &src[100..600]);
        let rmr = p.reg(p.recv, &dst);
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
        p.wait(s).expect("send through the shared registration");
        assert_eq!(p.wait(r).unwrap(), 500);
        assert!(dst[..500].iter().all(|&x| x == 5));
        // Past the registered pages: refused before any verbs call.
        // SAFETY: refused without touching memory.
        let e = unsafe { p.net.isend(p.send, src.as_ptr() as usize, 20_000, 1, b) }.unwrap_err();
        assert!(e.message.contains("outside its registration"), "{e}");
        p.net.dereg_mr(p.send, b).unwrap();
        p.close();
    });
}

#[test]
fn an_error_completion_fails_the_request() {
    // The stand-in fails every send WR after the first 6 of the process (CTS writes and
    // data writes alike) with IBV_WC_RETRY_EXC_ERR, as a fabric that lost the path would.
    in_child(
        "an_error_completion_fails_the_request",
        &[("IBV_DOUBLE_FAIL_AFTER", "6")],
        || {
            let p = Pair::connect();
            let src = vec![1u8; 4096];
            let mut dst = vec![0u8; 4096];
            let smr = p.reg(p.send, &src);
            let rmr = p.reg(p.recv, &dst);
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
                let mut pending = Vec::new();
                for (what, posted) in [("receive", r), ("send", s)] {
                    match posted {
                        Ok(h) => pending.push((format!("{what} {m}"), h.expect("a request slot"))),
                        Err(e) => errors.push(format!("{what} {m} (post): {e}")),
                    }
                }
                errors.extend(settle(&p, pending).1);
                if !errors.is_empty() {
                    break;
                }
            }
            println!("errors: {errors:#?}");
            assert!(
                !errors.is_empty(),
                "an injected error completion must fail a request"
            );
            // The side whose work request failed names the completion status; the other
            // side, waiting on it, fails too (through the out-of-band socket) instead of
            // hanging.
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
            p.close();
        },
    );
}

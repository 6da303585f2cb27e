//! Each fault the verbs stand-in can inject, against the plugin: a clear error, no hang, no
//! crash; or, where the fault is one that RDMA recovers from, every byte right.
//!
//! | fault (stand-in knob) | expected | test |
//! |---|---|---|
//! | receiver not ready (`IBV_DOUBLE_RNR`) | rnr_retry 7 retries: bytes right | [`receiver_not_ready_is_retried_and_the_bytes_arrive`] |
//! | slow peer (`IBV_DOUBLE_DELAY_US`) | slower, bytes right, no false "peer lost" | [`a_slow_peer_only_delays`] |
//! | reordered placement (`IBV_DOUBLE_REORDER`), 4 QPs | bytes right | [`reordered_placement_over_four_qps_keeps_the_bytes`] |
//! | async events (`IBV_DOUBLE_ASYNC_EVENT`) | fatal ones fail the connections they concern with the event's name; `port_active` is logged | `async_*` |
//! | error completion (`IBV_DOUBLE_FAIL_AFTER`) | both sides fail | `datapath.rs`: `an_error_completion_fails_the_request` |
//! | peer killed mid-transfer | an error within the bound | `conformance.rs` (the conformance suite) |
//!
//! Each case runs in a child process (this binary again) with its own environment and a time
//! limit ([`common::CHILD_LIMIT`]; each request has [`common::REQUEST_LIMIT`]), so
//! a hang fails the test. Skipped, with the reason printed, where the stand-in cannot be
//! built (see `common`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use rustccl_plugin_api::net::{Net, RecvBuffer};
use rustccl_plugin_api::PluginError;

#[test]
fn receiver_not_ready_is_retried_and_the_bytes_arrive() {
    // The first 40 writes-with-immediate find "no receive" once (an RNR NAK); the plugin's
    // rnr_retry 7 retries after min_rnr_timer, so each still lands, in order.
    let env = [
        ("IBV_DOUBLE_RNR", "40"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ];
    let child = || {
        let p = Pair::connect();
        p.stream(60, 8, |m| (m * 7919) % 50_000);
        p.close();
    };
    let Some(out) = in_child(
        "receiver_not_ready_is_retried_and_the_bytes_arrive",
        &env,
        child,
    ) else {
        return;
    };
    assert!(
        out.contains("IBV_DOUBLE_RNR: all 40 receiver-not-ready NAKs given"),
        "the stand-in did not inject the NAKs:\n{out}"
    );
}

#[test]
fn a_slow_peer_only_delays() {
    in_child(
        "a_slow_peer_only_delays",
        &[("IBV_DOUBLE_DELAY_US", "20000")],
        || {
            let p = Pair::connect();
            let start = Instant::now();
            // Each message needs at least its data write applied by the (slow) responder:
            // 20 ms.
            p.stream(10, 4, |m| 3000 * m + 1);
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(200),
                "10 messages through a responder that waits 20 ms per request took {took:?}: the delay was not applied"
            );
            p.close();
        },
    );
}

#[test]
fn reordered_placement_over_four_qps_keeps_the_bytes() {
    // Adaptive routing forced on with a low threshold, so most messages go as plain writes
    // (which the stand-in places late and in reverse order) then a 0-byte write-with-immediate
    // per QP; the clear-to-send entries are plain writes too.
    let env = [
        ("IBV_DOUBLE_REORDER", "1"),
        ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
        ("NCCL_IB_AR_THRESHOLD", "1000"),
    ];
    let child = || {
        let p = Pair::connect();
        p.stream(200, 16, |m| (m * 7_777) % 200_001);
        p.close();
    };
    let Some(out) = in_child(
        "reordered_placement_over_four_qps_keeps_the_bytes",
        &env,
        child,
    ) else {
        return;
    };
    assert!(
        out.contains("IBV_DOUBLE_REORDER:") && out.contains("placed in reverse order"),
        "the stand-in reordered nothing:\n{out}"
    );
}

/// Runs [`async_child`] for stand-in event `kind` (with `env` besides); returns the child's
/// output.
fn async_case(kind: &str, env: &[(&str, &str)]) -> Option<String> {
    // A trigger file of this case's own: the cases run in parallel threads of one process.
    static CASES: AtomicUsize = AtomicUsize::new(0);
    let trigger = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "async-trigger-{kind}-{}-{}",
        std::process::id(),
        CASES.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&trigger);
    let trigger_var = trigger.display().to_string();
    let mut vars = vec![
        ("IBV_DOUBLE_ASYNC_EVENT", kind),
        ("IBV_DOUBLE_ASYNC_TRIGGER", &trigger_var),
    ];
    vars.extend_from_slice(env);
    let out = run("async_child", &vars);
    let _ = std::fs::remove_file(&trigger);
    out
}

/// The plugin's WARN line for a fatal event that failed `n` connections.
fn assert_logged_fatal(out: &str, event: &str, n: usize) {
    let line = format!("plugin WARN: NET/IB : dbl_0: async event {event} (");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&line) && l.ends_with(&format!(": {n} connection(s) failed"))),
        "no WARN line for {event} failing {n} connection(s):\n{out}"
    );
}

/// The async-event case of fatal event `kind`, which must fail `n` connections.
fn async_fatal(kind: &str, n: usize) {
    if let Some(out) = async_case(kind, &[]) {
        assert_logged_fatal(&out, &format!("IBV_EVENT_{}", kind.to_uppercase()), n);
    }
}

#[test]
fn async_device_fatal_fails_every_connection_on_the_device() {
    async_fatal("device_fatal", 2);
}

#[test]
fn async_port_error_fails_every_connection_on_the_port() {
    async_fatal("port_err", 2);
}

#[test]
fn async_qp_fatal_fails_the_connection_owning_the_qp() {
    async_fatal("qp_fatal", 1);
}

#[test]
fn async_cq_error_fails_the_connection_owning_the_cq() {
    async_fatal("cq_err", 1);
}

#[test]
fn async_port_active_is_logged_and_changes_nothing() {
    if let Some(out) = async_case("port_active", &[]) {
        assert!(
            out.contains(
                "plugin INFO: NET/IB : dbl_0: async event IBV_EVENT_PORT_ACTIVE (port active)"
            ),
            "no INFO line for IBV_EVENT_PORT_ACTIVE:\n{out}"
        );
    }
}

/// An error from the async-event thread: a system error naming the device, the port and the
/// event, and what to check.
fn assert_names_event(side: &str, e: &PluginError, event: &str) {
    assert_eq!(e.code, PluginError::SYSTEM, "{side}: {e}");
    for part in [
        "NET/IB : the connection on dbl_0 port 1 failed: the device reported ",
        event,
        "; check the NIC and its link (ibv_devinfo)",
    ] {
        assert!(e.message.contains(part), "{side}: {e:?} lacks {part:?}");
    }
}

/// One connection pair; a receive waits for its data when the event is raised. A fatal event
/// fails that receive and the next send, each with a clear error (the QP and CQ kinds hit the
/// sender's objects: its QPs are the lowest-numbered, created first by `connect`; the
/// receiver then fails as its peer, through the out-of-band socket). `port_active` changes
/// nothing: the transfer completes. Closing the connections afterwards must not hang (a QP's
/// destroy waits until its events are acknowledged).
#[test]
fn async_child() {
    if !is_role("async_child") {
        return;
    }
    let kind = std::env::var("IBV_DOUBLE_ASYNC_EVENT").expect("the kind");
    let trigger = PathBuf::from(std::env::var("IBV_DOUBLE_ASYNC_TRIGGER").expect("the trigger"));
    let event = format!("IBV_EVENT_{}", kind.to_uppercase());
    let p = Pair::connect();
    p.stream(4, 2, |m| 1000 * m + 1); // the pair works

    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let smr = p.reg(p.send, &src);
    let rmr = p.reg(p.recv, &dst);
    let rb = [RecvBuffer {
        data: dst.as_mut_ptr() as usize,
        size: dst.len(),
        tag: 9,
        mr: rmr,
    }];
    // SAFETY: the buffers outlive the requests (waited for, or failed, below).
    let r = unsafe { p.net.irecv(p.recv, &rb) }.unwrap().unwrap();

    std::fs::write(&trigger, b"").expect("create the trigger file");
    let raised = Instant::now();
    while trigger.exists() {
        assert!(
            raised.elapsed() < Duration::from_secs(5),
            "the stand-in did not raise {event} (its trigger file stays)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // SAFETY: the buffers outlive the request (waited for, or failed, below).
    let send = || unsafe {
        p.net
            .isend(p.send, src.as_ptr() as usize, src.len(), 9, smr)
    };
    if kind == "port_active" {
        assert!(
            wait_logged(&format!("async event {event}"), Duration::from_secs(5)),
            "the plugin did not log {event}"
        );
        p.wait(send().unwrap().expect("a send slot"))
            .expect("the send completes");
        assert_eq!(p.wait(r).expect("the receive completes"), 4096);
        assert!(dst.iter().all(|&b| b == 7), "the bytes arrived");
    } else {
        let recv_err = p.wait(r).expect_err("the receive fails after the event");
        let send_err = match send() {
            Err(e) => e,
            Ok(Some(s)) => p.wait(s).expect_err("the send fails after the event"),
            Ok(None) => panic!("no send slot"),
        };
        println!("send: {send_err}\nreceive: {recv_err}");
        assert_names_event("send", &send_err, &event);
        if kind == "device_fatal" || kind == "port_err" {
            assert_names_event("receive", &recv_err, &event);
        } else {
            assert_eq!(recv_err.code, PluginError::REMOTE, "{recv_err}");
            assert!(
                recv_err
                    .message
                    .contains("lost: the peer closed its connection"),
                "the receiver fails as the peer of the failed sender: {recv_err}"
            );
        }
    }
    p.net.dereg_mr(p.send, smr).unwrap();
    p.net.dereg_mr(p.recv, rmr).unwrap();
    p.close();
}

/// The stand-in's dual-port device is one merged device, so each connection is on two ports
/// of one device context and is watched once per port: a fatal device event fails each of
/// the two connections once (a connection named twice must not be locked twice), with the
/// same errors as on a plain device.
#[test]
fn async_device_fatal_fails_a_merged_connection_once() {
    if let Some(out) = async_case("device_fatal", &[("IBV_DOUBLE_PORTS", "2")]) {
        assert!(
            out.contains("[0]dbl_0:1+dbl_0:2/RoCE"),
            "a merged device:\n{out}"
        );
        assert_logged_fatal(&out, "IBV_EVENT_DEVICE_FATAL", 2);
    }
}

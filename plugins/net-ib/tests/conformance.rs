//! The IB plugin, loaded as a library, passes the net conformance suite (every check,
//! 0 B to 1 GiB, multi-receive, the peer killed mid-transfer included) on the userspace
//! verbs stand-in (`verbs-double/`, a replacement libibverbs.so.1 chosen with
//! `NCCL_IBVERBS_LIB`), with one and with four QPs per connection (messages split over QPs
//! at 128-byte boundaries), and on a merged device: the stand-in's dual-port device
//! (`IBV_DOUBLE_PORTS=2`), whose two ports are one device, with two QPs per port.
//!
//! The stand-in is built here with `make` into Cargo's temporary directory. The test is
//! skipped, with the reason printed, only when a C compiler or `make` is missing or the
//! stand-in's sources are not there (`RUSTCCL_VERBS_DOUBLE_DIR` names another copy).
//!
//! The suite runs in a child process (this test binary again, `suite_child`, started by
//! `common::run_within`), so its environment is its own and a hang is killed at [`LIMIT`];
//! the "peer killed" check's peer is a third process (`peer_child`).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::*;

use rustccl_net_conformance::{
    check_peer_killed, handle_from_hex, load, run_sending_peer, Env, CHECKS,
};

/// The whole suite's time limit (it takes about 15 s on a busy 2-core machine).
const LIMIT: Duration = Duration::from_secs(240);
const PLUGIN: &str = "RUSTCCL_IB_CONFORMANCE_PLUGIN";
const HANDLE: &str = "RUSTCCL_IB_CONFORMANCE_HANDLE";

/// Runs the suite in a child with `qps` QPs per connection and the stand-in's `ports` ports
/// per device; returns its output (`None`: skipped).
fn run_suite(qps: u32, ports: u32) -> Option<String> {
    run_within(
        "suite_child",
        &[
            (PLUGIN, &plugin_path().display().to_string()),
            ("NCCL_IB_QPS_PER_CONNECTION", &qps.to_string()),
            ("IBV_DOUBLE_PORTS", &ports.to_string()),
        ],
        LIMIT,
    )
}

#[test]
fn ib_plugin_passes_the_conformance_suite_on_the_verbs_stand_in() {
    for (qps, ports) in [(1, 1), (4, 1), (2, 2)] {
        println!("--- {qps} QP(s) per connection, {ports} port(s) ---");
        let Some(out) = run_suite(qps, ports) else {
            return;
        };
        assert!(out.contains("# net plugin IB"), "{out}");
        if ports == 2 {
            assert!(
                out.contains("# device 0: dbl_0+dbl_0 at 200000 Mbit/s"),
                "the suite runs on the merged device:\n{out}"
            );
        }
        // Every check of the suite passes (9: make_vdevice's since net ABI v2, and the
        // multi-receive, run here since the plugin's max_recvs is 8).
        assert!(
            out.contains("9 passed, 0 failed") && out.contains("PASS peer killed mid-transfer"),
            "conformance failures with {qps} QP(s):\n{out}"
        );
        assert!(
            out.contains("PASS multi-receive") && !out.contains("# multi-receive not tried"),
            "the multi-receive check did not run with {qps} QP(s):\n{out}"
        );
    }
}

/// Child role: the suite, as `rustccl-net-conformance` runs it.
#[test]
fn suite_child() {
    if !is_role("suite_child") {
        return;
    }
    let plugin = std::env::var(PLUGIN).expect("plugin path");
    let loaded = load(&plugin).expect("load the plugin");
    println!(
        "# net plugin {} ({}) from {plugin}",
        loaded.name, loaded.abi
    );
    let env = Env::new(&*loaded.net, 1 << 30).expect("init");
    let props = loaded.net.properties(env.ctx, env.dev).expect("properties");
    println!(
        "# device {}: {} at {} Mbit/s",
        env.dev, props.name, props.speed_mbps
    );
    let (mut passed, mut failed) = (0, 0);
    let mut report = |name: &str, r: Result<(), String>| match r {
        Ok(()) => {
            passed += 1;
            println!("PASS {name}");
        }
        Err(e) => {
            failed += 1;
            println!("FAIL {name}: {e}");
        }
    };
    for (name, check) in CHECKS {
        report(name, check(&env));
    }
    let peer: std::cell::RefCell<Option<std::process::Child>> = std::cell::RefCell::new(None);
    let r = check_peer_killed(
        &env,
        &mut |handle| {
            let mut c = child(
                "peer_child",
                &[
                    (ROLE, "peer".into()),
                    (PLUGIN, plugin.clone()),
                    (HANDLE, handle.to_string()),
                ],
            )
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the peer: {e}"))?;
            let lines = BufReader::new(c.stdout.take().unwrap()).lines();
            *peer.borrow_mut() = Some(c);
            for line in lines {
                // libtest may print "test peer_child ... " before it on the same line.
                if line
                    .map_err(|e| e.to_string())?
                    .trim_end()
                    .ends_with("CONNECTED")
                {
                    return Ok(());
                }
            }
            Err("the peer exited before connecting".into())
        },
        &mut || {
            if let Some(c) = peer.borrow_mut().as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        },
    );
    report("peer killed mid-transfer", r);
    println!("{passed} passed, {failed} failed");
}

/// Child role: the sending peer of the "peer killed" check (runs until killed).
#[test]
fn peer_child() {
    if !is_role("peer") {
        return;
    }
    let loaded = load(&std::env::var(PLUGIN).expect("plugin path")).expect("load the plugin");
    let env = Env::new(&*loaded.net, 0).expect("init");
    let handle = handle_from_hex(&std::env::var(HANDLE).expect("handle")).expect("a handle");
    if let Err(e) = run_sending_peer(&env, &handle) {
        panic!("peer: {e}");
    }
}

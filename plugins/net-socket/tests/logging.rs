//! What the plugin logs through the host's logger: one info line per init (devices),
//! listen and connect, warnings on failures, nothing per message.
//! (Its own test binary: the log sink is process-wide.)

mod common;

use std::sync::Mutex;

use abi_stable::std_types::RStr;
use common::*;
use rustccl_plugin_api::net::{Net, NetCommConfig};
use rustccl_plugin_api::{log_level, LogFn};

static LINES: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

extern "C" fn record(level: i32, _subsys: u64, message: RStr<'_>) {
    LINES
        .lock()
        .unwrap()
        .push((level, message.as_str().to_string()));
}

fn take() -> Vec<(i32, String)> {
    std::mem::take(&mut *LINES.lock().unwrap())
}

#[test]
fn logs_setup_and_failures_only() {
    let net = loopback_net(1, 2);
    let log = LogFn { log: record };
    let ctx = net.init(3, &NetCommConfig::default(), log).unwrap();
    let lines = take();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].0, log_level::INFO);
    assert!(
        lines[0].1.contains("[0]lo:127.0.0.1") && lines[0].1.contains("1 threads x 2 sockets"),
        "{lines:?}"
    );

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
    let lines = take();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|(level, _)| *level == log_level::INFO));
    assert!(
        lines[0].1.contains("listening on dev 0 (lo) at 127.0.0.1:"),
        "{lines:?}"
    );
    assert!(
        lines[1].1.contains("connecting to 127.0.0.1:")
            && lines[1].1.contains("dev 0 (lo) with 2 data sockets"),
        "{lines:?}"
    );

    // Messages log nothing.
    let p = Pair {
        ctx,
        listen,
        send,
        recv,
    };
    for n in [0, 10, 1 << 20] {
        let src = pattern(n, 1);
        assert_eq!(round_trip(&net, &p, &src, n).1, n);
    }
    assert_eq!(take(), vec![]);

    // A peer that goes away is a warning (from the helper thread that saw it).
    let src = pattern(64 << 20, 2);
    let mr = reg(&net, p.send, &src);
    let s = isend(&net, p.send, &src, 0, mr);
    net.close_recv(p.recv).unwrap();
    assert!(wait(&net, s).is_err());
    let lines = take();
    assert_eq!(lines.len(), 1, "one warning per failed connection: {lines:?}");
    assert_eq!(lines[0].0, log_level::WARN);
    assert!(lines[0].1.contains("peer 127.0.0.1:"), "{lines:?}");
    net.close_send(p.send).unwrap();
    net.finalize(ctx).unwrap();
}

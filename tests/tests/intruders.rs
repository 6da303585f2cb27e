//! Connections that do not belong: a wrong secret, garbage, a truncated message, a malformed
//! message and a silent connection reach the root while real ranks start. Each is refused
//! and logged; the real ranks complete.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use rustccl::bootstrap::wire::{Cancel, Conn, Kind};
use rustccl_tests::*;

#[test]
fn intruders_are_dropped_and_logged_and_real_ranks_complete() {
    // The root runs in this process; its log goes to a file this test reads afterwards.
    let log = std::env::temp_dir().join(format!("rustccl-intruders-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    std::env::set_var("NCCL_DEBUG_FILE", &log);
    std::env::set_var("NCCL_DEBUG", "WARN");
    let id = new_id();
    let root = id.root_addr();
    let cancel = Cancel::after(Duration::from_secs(10), "intruder");

    // 1. Knows the protocol but not the secret.
    let mut wrong = Conn::connect(root, 1 << 20, &cancel).unwrap();
    wrong.prove(&[0x55; 16], &cancel).unwrap();
    // 2. Garbage bytes.
    let mut garbage = TcpStream::connect(root).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\nthis is not rustccl").unwrap();
    // 3. Right secret, then half a frame and close.
    let mut truncated = Conn::connect(root, 1 << 20, &cancel).unwrap();
    truncated.prove(&id.secret(), &cancel).unwrap();
    let mut raw = TcpStream::connect(root).unwrap();
    drop(raw.write_all(b"RCF1"));
    // 4. Right secret, then a message that is not JSON.
    let mut malformed = Conn::connect(root, 1 << 20, &cancel).unwrap();
    malformed.prove(&id.secret(), &cancel).unwrap();
    malformed.send(Kind::Control, &[b"{not json"], &cancel).unwrap();
    // 5. A connection that says nothing at all stays open meanwhile.
    let _silent = TcpStream::connect(root).unwrap();

    let ranks: Vec<i32> = (0..3).collect();
    let procs = spawn("init-barrier", 3, &ranks, &ids_arg(&[id]), &[]);
    // Truncated frame: a header promising 100 bytes, then 5, then the connection closes.
    let mut header = Vec::from(&b"RCF1"[..]);
    header.extend_from_slice(&(Kind::Control as u32).to_le_bytes());
    header.extend_from_slice(&100u64.to_le_bytes());
    header.extend_from_slice(b"{\"Reg");
    let mut stream = truncated.into_stream();
    stream.write_all(&header).unwrap();
    drop(stream);
    drop(garbage);
    drop(raw);

    let out = finish_all(procs, Duration::from_secs(120));
    assert_all_ok(&out);
    drop(wrong);

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for expected in [
        "does not know the unique id's secret",
        "not a rustccl frame",
        "closed in the middle of a message",
        "malformed message",
    ] {
        assert!(text.contains(expected), "log lacks {expected:?}:\n{text}");
    }
    assert!(text.lines().all(|l| l.contains(" NCCL ")), "NCCL-style prefixes:\n{text}");
    let _ = std::fs::remove_file(&log);
}

//! Helpers of the tests that run on the verbs stand-in: building it, running this test
//! binary again as a child process in a given role with its own environment and a time
//! limit, and (in a child) a connected send/receive pair of the plugin in one process, with
//! a checked stream of messages over it.
#![allow(dead_code)]

pub mod pair;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustccl_net_ib::IbNet;
use rustccl_plugin_api::net::{Net, NetCommConfig, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

/// The variable that tells a child which role (test) it plays.
pub const ROLE: &str = "RUSTCCL_IB_TEST_ROLE";

/// Building the stand-in: shared with rustccl-tests, whose `src/verbs_double.rs` this is.
#[path = "../../../../tests/src/verbs_double.rs"]
mod verbs_double;

/// Where the stand-in's sources are in this checkout.
fn default_sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("verbs-double")
}

/// The stand-in's sources, if present.
pub fn double_sources() -> Option<PathBuf> {
    verbs_double::sources(&default_sources())
}

/// Builds the stand-in (once per test binary); `Err(reason)` to skip.
pub fn build_double() -> Result<PathBuf, String> {
    verbs_double::build(
        &default_sources(),
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("verbs-double"),
    )
}

/// This package's cdylib, which Cargo builds before the integration tests.
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!(
        "{}rustccl_net_ib{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [Some(deps.join(&file)), deps.parent().map(|p| p.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

/// This test binary running only `test` (a child role), with `env`.
pub fn child(test: &str, env: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test executable path"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Waits for `c` (stdout and stderr piped) at most `limit`, killing it past that; returns
/// its status (`None`: killed) and its output.
pub fn wait_with_limit(mut c: Child, limit: Duration) -> (Option<ExitStatus>, String) {
    let mut stdout = c.stdout.take().expect("piped stdout");
    let mut stderr = c.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("wait for the child") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status,
        format!("{}\n{}", out.join().unwrap(), err.join().unwrap()),
    )
}

/// Whether this process plays `role`.
pub fn is_role(role: &str) -> bool {
    std::env::var(ROLE).as_deref() == Ok(role)
}

/// How long a role of [`run`] may take.
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// The plugin's log: warnings and INFO lines on stderr (children's output is captured).
pub extern "C" fn log(level: i32, _subsys: u64, message: abi_stable::std_types::RStr<'_>) {
    if level <= rustccl_plugin_api::log_level::INFO {
        eprintln!("plugin: {}", message.as_str());
    }
}

/// Runs `role` in a child with the stand-in and `env`; returns its output, asserting it
/// passed within the limit. `None`: skipped.
pub fn run(role: &str, env: &[(&str, &str)]) -> Option<String> {
    let lib = match build_double() {
        Ok(lib) => lib,
        Err(why) => {
            println!("SKIPPED: {why}");
            return None;
        }
    };
    let mut vars = vec![
        (ROLE, role.to_string()),
        ("NCCL_IBVERBS_LIB", lib.display().to_string()),
        ("NCCL_SOCKET_IFNAME", "lo".to_string()),
    ];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let c = child(role, &vars)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let (status, out) = wait_with_limit(c, CHILD_LIMIT);
    println!("{out}");
    assert!(
        status.is_some(),
        "{role} ran past {CHILD_LIMIT:?} (hang):\n{out}"
    );
    assert!(status.unwrap().success(), "{role} failed:\n{out}");
    assert!(
        out.contains("test result: ok. 1 passed"),
        "{role} did not run:\n{out}"
    );
    Some(out)
}

/// A send and a receive connection of one plugin instance, to each other.
pub struct Pair {
    pub net: IbNet,
    pub ctx: PluginHandle,
    pub send: PluginHandle,
    pub recv: PluginHandle,
}

/// A context of `net`.
pub fn init(net: &IbNet) -> PluginHandle {
    net.init(1, &NetCommConfig::default(), LogFn { log })
        .expect("init")
}

/// Connects a [`Pair`] on device 0 (the plugin reads the process's environment).
pub fn connect() -> Pair {
    let net = IbNet::new();
    let ctx = init(&net);
    assert!(net.devices(ctx).unwrap() >= 1, "the stand-in's device");
    connect_devices(net, ctx, 0, 0)
}

/// Connects a [`Pair`] from device `send_dev` to a listener on device `recv_dev`.
pub fn connect_devices(net: IbNet, ctx: PluginHandle, send_dev: i32, recv_dev: i32) -> Pair {
    let (handle, listen) = net.listen(ctx, recv_dev).expect("listen");
    let (mut send, mut recv) = (None, None);
    let start = Instant::now();
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = net.connect(ctx, send_dev, &handle).expect("connect");
        }
        if recv.is_none() {
            recv = net.accept(listen).expect("accept");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "connect/accept hang"
        );
    }
    Pair {
        net,
        ctx,
        send: send.unwrap(),
        recv: recv.unwrap(),
    }
}

/// Polls until done; the result of the last `test`.
pub fn wait(net: &IbNet, req: PluginHandle) -> Result<usize, PluginError> {
    let mut sizes = [usize::MAX];
    let start = Instant::now();
    while !net.test(req, &mut sizes)? {
        assert!(start.elapsed() < Duration::from_secs(30), "test hang");
        std::thread::yield_now();
    }
    Ok(sizes[0])
}

pub fn byte(msg: usize, i: usize) -> u8 {
    (msg * 31 + i * 7) as u8
}

/// Sends `count` messages of `size(i)` bytes, `window` in flight, each checked.
pub fn stream(p: &Pair, count: usize, window: usize, size: impl Fn(usize) -> usize) {
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

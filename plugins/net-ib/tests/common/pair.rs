//! A connected send/receive pair of the plugin in one child process, and transfers over it
//! with every byte checked: the frame of the tests that run the plugin on the stand-in with
//! one environment per child (`tests/faults.rs`).

use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustccl_net_ib::IbNet;
use rustccl_plugin_api::net::{Net, NetCommConfig, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{log_level, LogFn, PluginError, PluginHandle};

use super::{build_double, child, wait_with_limit, ROLE};

/// A child's time limit: past it the child is killed and the test fails (a hang).
pub const CHILD_LIMIT: Duration = Duration::from_secs(120);
/// How long one request may take before the child calls it a hang.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// Every line the plugin logged in this process.
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The plugin's log, every level: on stderr (the parent reads it back) and kept for
/// [`wait_logged`].
pub extern "C" fn log_all(level: i32, _subsys: u64, message: abi_stable::std_types::RStr<'_>) {
    let tag = if level <= log_level::WARN {
        "WARN"
    } else {
        "INFO"
    };
    let line = format!("plugin {tag}: {}", message.as_str());
    eprintln!("{line}");
    LOGGED.lock().unwrap_or_else(|p| p.into_inner()).push(line);
}

/// Waits until the plugin has logged a line containing `text`; false after `limit`.
pub fn wait_logged(text: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if LOGGED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.contains(text))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Runs test `role` (a function of the calling test binary that starts with
/// `if !is_role(role) { return; }`) in a child with the stand-in and `env`; returns its output
/// (stdout and stderr), asserting that it passed within [`CHILD_LIMIT`]. `None`: skipped, the
/// stand-in cannot be built here (the reason is printed).
pub fn run_role(role: &str, env: &[(&str, &str)]) -> Option<String> {
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

/// One plugin instance with a connected pair on device 0.
pub struct Pair {
    pub net: IbNet,
    pub send: PluginHandle,
    pub recv: PluginHandle,
}

impl Pair {
    pub fn connect() -> Pair {
        let net = IbNet::new();
        let ctx = net
            .init(1, &NetCommConfig::default(), LogFn { log: log_all })
            .expect("init");
        assert!(net.devices(ctx).unwrap() >= 1, "the stand-in's device");
        let (handle, listen) = net.listen(ctx, 0).expect("listen");
        let (mut send, mut recv) = (None, None);
        let start = Instant::now();
        while send.is_none() || recv.is_none() {
            if send.is_none() {
                send = net.connect(ctx, 0, &handle).expect("connect");
            }
            if recv.is_none() {
                recv = net.accept(listen).expect("accept");
            }
            assert!(start.elapsed() < REQUEST_LIMIT, "connect/accept hang");
        }
        Pair {
            net,
            send: send.unwrap(),
            recv: recv.unwrap(),
        }
    }

    /// Polls `req` until it is done (its size) or fails; a hang past [`REQUEST_LIMIT`]
    /// panics.
    pub fn wait(&self, req: PluginHandle) -> Result<usize, PluginError> {
        let mut sizes = [usize::MAX];
        let start = Instant::now();
        while !self.net.test(req, &mut sizes)? {
            assert!(start.elapsed() < REQUEST_LIMIT, "request {req:?} hangs");
            std::thread::yield_now();
        }
        Ok(sizes[0])
    }

    pub fn reg(&self, comm: PluginHandle, buf: &[u8]) -> PluginHandle {
        self.net
            .reg_mr(comm, buf.as_ptr() as usize, buf.len(), PTR_HOST)
            .expect("reg_mr")
    }

    /// Sends `count` messages of `size(i)` bytes, `window` in flight, and checks each one's
    /// size and every byte at the receiver.
    pub fn stream(&self, count: usize, window: usize, size: impl Fn(usize) -> usize) {
        let byte = |msg: usize, i: usize| (msg * 31 + i * 7) as u8;
        let max = (0..count).map(&size).max().unwrap_or(0).max(1);
        let mut src = vec![0u8; max * window];
        let mut dst = vec![0u8; max * window];
        let smr = self.reg(self.send, &src);
        let rmr = self.reg(self.recv, &dst);
        for first in (0..count).step_by(window) {
            let batch = first..count.min(first + window);
            let mut reqs = Vec::new();
            for (slot, m) in batch.enumerate() {
                let len = size(m);
                let s = &mut src[slot * max..slot * max + len];
                for (i, b) in s.iter_mut().enumerate() {
                    *b = byte(m, i);
                }
                dst[slot * max..(slot + 1) * max].fill(0);
                let rb = [RecvBuffer {
                    data: dst[slot * max..].as_mut_ptr() as usize,
                    size: max,
                    tag: m as i32,
                    mr: rmr,
                }];
                // SAFETY: the buffers outlive the requests (waited for below).
                let r = unsafe { self.net.irecv(self.recv, &rb) }
                    .unwrap()
                    .expect("a receive slot");
                // SAFETY: as above.
                let s = unsafe {
                    self.net
                        .isend(self.send, s.as_ptr() as usize, len, m as i32, smr)
                }
                .unwrap()
                .expect("a send slot");
                reqs.push((m, len, s, r));
            }
            for (slot, (m, len, s, r)) in reqs.into_iter().enumerate() {
                self.wait(s).unwrap_or_else(|e| panic!("send {m}: {e}"));
                let got = self.wait(r).unwrap_or_else(|e| panic!("receive {m}: {e}"));
                assert_eq!(got, len, "message {m}: received size");
                let d = &dst[slot * max..slot * max + len];
                if let Some(at) = (0..len).find(|&i| d[i] != byte(m, i)) {
                    panic!("message {m} ({len} bytes) corrupted at byte {at}");
                }
            }
        }
        self.net.dereg_mr(self.send, smr).unwrap();
        self.net.dereg_mr(self.recv, rmr).unwrap();
    }

    pub fn close(self) {
        self.net.close_send(self.send).unwrap();
        self.net.close_recv(self.recv).unwrap();
    }
}

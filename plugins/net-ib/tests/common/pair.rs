//! The plugin in a child process (see [`super::in_child`]): a context, a connected
//! send/receive pair of one plugin instance, waiting for requests within a time limit, and
//! transfers over the pair with every byte checked.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustccl_net_ib::IbNet;
use rustccl_plugin_api::net::{Net, NetCommConfig, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{log_level, LogFn, PluginError, PluginHandle};

/// How long one request (or a connection's setup) may take before the child calls it a hang.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// Every line the plugin logged in this process.
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The plugin's log, every level: on stderr as `plugin WARN: …` or `plugin INFO: …` (the
/// parent reads the child's output back) and kept for [`wait_logged`].
pub extern "C" fn log(level: i32, _subsys: u64, message: abi_stable::std_types::RStr<'_>) {
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

/// A plugin instance (it reads this process's environment) and a context of it, logging
/// through [`log`].
pub fn init() -> (IbNet, PluginHandle) {
    let net = IbNet::new();
    let ctx = net
        .init(1, &NetCommConfig::default(), LogFn { log })
        .expect("init");
    (net, ctx)
}

/// Byte `i` of message `msg` of [`Pair::stream`].
fn byte(msg: usize, i: usize) -> u8 {
    (msg * 31 + i * 7) as u8
}

/// A send and a receive connection of one plugin instance, to each other.
pub struct Pair {
    pub net: IbNet,
    pub ctx: PluginHandle,
    pub send: PluginHandle,
    pub recv: PluginHandle,
}

impl Pair {
    /// A new instance's pair on device 0.
    pub fn connect() -> Pair {
        let (net, ctx) = init();
        assert!(net.devices(ctx).unwrap() >= 1, "the stand-in's device");
        Pair::connect_devices(net, ctx, 0, 0)
    }

    /// A pair of `net` in context `ctx`, from device `send_dev` to a listener on device
    /// `recv_dev`.
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
            assert!(start.elapsed() < REQUEST_LIMIT, "connect/accept hang");
        }
        Pair {
            net,
            ctx,
            send: send.unwrap(),
            recv: recv.unwrap(),
        }
    }

    /// Polls `req` until it is done or fails; `test` writes the sizes into `sizes`. A hang
    /// past [`REQUEST_LIMIT`] panics.
    pub fn poll(&self, req: PluginHandle, sizes: &mut [usize]) -> Result<(), PluginError> {
        let start = Instant::now();
        while !self.net.test(req, sizes)? {
            assert!(start.elapsed() < REQUEST_LIMIT, "request {req:?} hangs");
            std::thread::yield_now();
        }
        Ok(())
    }

    /// [`Pair::poll`] of a request of one buffer: its size.
    pub fn wait(&self, req: PluginHandle) -> Result<usize, PluginError> {
        Ok(self.wait_sizes(req, 1)?[0])
    }

    /// [`Pair::poll`] of a request of `n` buffers: the size of each.
    pub fn wait_sizes(&self, req: PluginHandle, n: usize) -> Result<Vec<usize>, PluginError> {
        let mut sizes = vec![usize::MAX; n];
        self.poll(req, &mut sizes)?;
        Ok(sizes)
    }

    /// Registers host memory `buf` with connection `comm`.
    pub fn reg(&self, comm: PluginHandle, buf: &[u8]) -> PluginHandle {
        self.net
            .reg_mr(comm, buf.as_ptr() as usize, buf.len(), PTR_HOST)
            .expect("reg_mr")
    }

    /// Sends `count` messages of `size(i)` bytes, `window` in flight, and checks each one's
    /// size and every byte at the receiver.
    pub fn stream(&self, count: usize, window: usize, size: impl Fn(usize) -> usize) {
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

    /// Closes both connections, each of which must close cleanly.
    pub fn close(&self) {
        self.net.close_send(self.send).unwrap();
        self.net.close_recv(self.recv).unwrap();
    }
}

//! The net plugin conformance suite. It loads a plugin library through the host's own loader
//! (so any table the host can use: rustccl's net ABI, or NCCL's C `ncclNetPlugin_v6`..`_v12`
//! through the host's C adapter), sees it through the `Net` trait, and checks the
//! rules every network must keep: messages of every size from 0 B to 1 GiB arrive intact and
//! in order, tags, a receive larger than the message, 32 outstanding requests per connection,
//! closing with requests in flight, stale handles refused, a peer killed mid-transfer
//! turning into an error instead of a hang, when the plugin's `max_recvs` is above 1 a
//! multi-receive (tagged buffers filled by sends posted in another order, each buffer's size
//! reported), and, when the plugin offers `make_vdevice` (rustccl net ABI v2), a virtual device
//! fusing devices 0 and 1 described as NCCL describes one (names joined with `+`, speeds
//! summed) and carrying data.
//!
//! Run it as `rustccl-net-conformance <plugin.so> [--max-size BYTES]`.

use std::time::{Duration, Instant};

use abi_stable::std_types::RStr;
use std::sync::Arc;

use rustccl::plugin::{library, net as host_net};
use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{LogFn, PluginHandle};

/// How long any single step may take before the suite calls it a hang.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

extern "C" fn quiet_log(level: i32, _subsys: u64, message: RStr<'_>) {
    if level <= rustccl_plugin_api::log_level::WARN {
        eprintln!("plugin: {}", message.as_str());
    }
}

/// A plugin under test, loaded from its library.
pub struct Loaded {
    pub net: Arc<dyn Net>,
    pub name: String,
    /// The ABI of the table used, e.g. "NCCL C net ABI v11".
    pub abi: String,
    /// Keeps the library loaded.
    _plugin: host_net::NetPlugin,
}

/// Loads the newest net table `path` exports, as the host would.
pub fn load(path: &str) -> Result<Loaded, String> {
    let lib = library::open(path).map_err(|e| match e {
        library::OpenError::NotFound => format!("cannot load {path}: no such file"),
        library::OpenError::Failed(m) => format!("cannot load {path}: {m}"),
    })?;
    let found = host_net::from_library(&lib).map_err(|e| format!("{path}: {e}"))?;
    Ok(Loaded {
        net: Arc::clone(&found.plugin.api),
        name: found.plugin.name.clone(),
        abi: found.abi.to_string(),
        _plugin: found.plugin,
    })
}

/// One communicator's view of the plugin: its context and the device used.
pub struct Env<'a> {
    pub net: &'a dyn Net,
    pub ctx: PluginHandle,
    pub dev: i32,
    pub max_size: usize,
}

impl<'a> Env<'a> {
    pub fn new(net: &'a dyn Net, max_size: usize) -> Result<Env<'a>, String> {
        let ctx = net.init(0x5eed, &NetCommConfig::default(), LogFn { log: quiet_log }).map_err(|e| format!("init: {e}"))?;
        let n = net.devices(ctx).map_err(|e| format!("devices: {e}"))?;
        if n < 1 {
            return Err(format!("devices() = {n}"));
        }
        Ok(Env { net, ctx, dev: 0, max_size })
    }
}

/// A connected pair (send side, receive side), both in this process.
pub struct Pair {
    pub send: PluginHandle,
    pub recv: PluginHandle,
    listen: PluginHandle,
}

fn deadline_check(start: Instant, what: &str) -> Result<(), String> {
    if start.elapsed() > STEP_TIMEOUT {
        Err(format!("{what}: no progress in {STEP_TIMEOUT:?} (hang)"))
    } else {
        Ok(())
    }
}

/// Listens, then drives connect and accept until both sides exist.
pub fn connect_pair(env: &Env) -> Result<Pair, String> {
    let (handle, listen) = env.net.listen(env.ctx, env.dev).map_err(|e| format!("listen: {e}"))?;
    let (mut send, mut recv) = (None, None);
    let start = Instant::now();
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = env.net.connect(env.ctx, env.dev, &handle).map_err(|e| format!("connect: {e}"))?;
        }
        if recv.is_none() {
            recv = env.net.accept(listen).map_err(|e| format!("accept: {e}"))?;
        }
        deadline_check(start, "connect/accept")?;
        std::thread::yield_now();
    }
    Ok(Pair { send: send.unwrap(), recv: recv.unwrap(), listen })
}

impl Pair {
    pub fn close(self, env: &Env) -> Result<(), String> {
        env.net.close_send(self.send).map_err(|e| format!("close_send: {e}"))?;
        env.net.close_recv(self.recv).map_err(|e| format!("close_recv: {e}"))?;
        env.net.close_listen(self.listen).map_err(|e| format!("close_listen: {e}"))
    }
}

/// Polls `request` until done; returns the sizes it reports.
pub fn wait(env: &Env, request: PluginHandle, nbufs: usize) -> Result<Vec<usize>, String> {
    let mut sizes = vec![0usize; nbufs.max(1)];
    let start = Instant::now();
    loop {
        if env.net.test(request, &mut sizes).map_err(|e| format!("test: {e}"))? {
            return Ok(sizes);
        }
        deadline_check(start, "test")?;
        std::thread::yield_now();
    }
}

/// Posts with retry while the plugin says "not now".
fn post(mut f: impl FnMut() -> Result<Option<PluginHandle>, String>) -> Result<PluginHandle, String> {
    let start = Instant::now();
    loop {
        if let Some(r) = f()? {
            return Ok(r);
        }
        deadline_check(start, "post")?;
        std::thread::yield_now();
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn reg(env: &Env, comm: PluginHandle, buf: &[u8]) -> Result<PluginHandle, String> {
    env.net.reg_mr(comm, buf.as_ptr() as usize, buf.len().max(1), PTR_HOST).map_err(|e| format!("reg_mr: {e}"))
}

fn isend(env: &Env, pair: &Pair, buf: &[u8], tag: i32, mr: PluginHandle) -> Result<PluginHandle, String> {
    // SAFETY: every buffer passed here outlives the completion of its request (the checks wait
    // for each request, or close the connection, before dropping buffers).
    post(|| unsafe { env.net.isend(pair.send, buf.as_ptr() as usize, buf.len(), tag, mr) }.map_err(|e| format!("isend: {e}")))
}

fn irecv(env: &Env, pair: &Pair, buf: &mut [u8], tag: i32, mr: PluginHandle) -> Result<PluginHandle, String> {
    let b = [RecvBuffer { data: buf.as_mut_ptr() as usize, size: buf.len(), tag, mr }];
    // SAFETY: as for isend.
    post(|| unsafe { env.net.irecv(pair.recv, &b) }.map_err(|e| format!("irecv: {e}")))
}

/// One message of `size` bytes; checks content and reported size.
fn round_trip(env: &Env, pair: &Pair, size: usize, recv_extra: usize, seed: u64) -> Result<(), String> {
    let src = pattern(size, seed);
    let mut dst = vec![0u8; size + recv_extra];
    let smr = reg(env, pair.send, &src)?;
    let rmr = reg(env, pair.recv, &dst)?;
    let r = irecv(env, pair, &mut dst, 7, rmr)?;
    let s = isend(env, pair, &src, 7, smr)?;
    let sent = wait(env, s, 1)?;
    let got = wait(env, r, 1)?;
    env.net.dereg_mr(pair.send, smr).map_err(|e| format!("dereg_mr: {e}"))?;
    env.net.dereg_mr(pair.recv, rmr).map_err(|e| format!("dereg_mr: {e}"))?;
    if got[0] != size {
        return Err(format!("{size}-byte message: receive reported {} bytes", got[0]));
    }
    if sent[0] != size && sent[0] != 0 {
        return Err(format!("{size}-byte message: send reported {} bytes", sent[0]));
    }
    if dst[..size] != src[..] {
        let at = dst.iter().zip(&src).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("{size}-byte message arrived corrupted (first difference at byte {at})"));
    }
    Ok(())
}

/// Sizes from 0 B to `max_size`.
pub fn check_sizes(env: &Env) -> Result<(), String> {
    let pair = connect_pair(env)?;
    let mut sizes = vec![0, 1, 7, 4096, 65535, 65537, 1 << 20, (8 << 20) + 3, 64 << 20, 256 << 20, 1 << 30];
    sizes.retain(|&s| s <= env.max_size);
    for (i, &size) in sizes.iter().enumerate() {
        round_trip(env, &pair, size, 0, i as u64)?;
    }
    pair.close(env)
}

/// A receive buffer larger than the message gets the message and its real size.
pub fn check_larger_receive(env: &Env) -> Result<(), String> {
    let pair = connect_pair(env)?;
    round_trip(env, &pair, 1000, 5000, 3)?;
    round_trip(env, &pair, 0, 64, 4)?;
    pair.close(env)
}

/// Messages posted in order arrive in order, each with its tag.
pub fn check_ordering_and_tags(env: &Env) -> Result<(), String> {
    let pair = connect_pair(env)?;
    let n = 16;
    let srcs: Vec<Vec<u8>> = (0..n).map(|i| pattern(100 + i * 37, i as u64 + 10)).collect();
    let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 2000]).collect();
    let smrs: Vec<_> = srcs.iter().map(|b| reg(env, pair.send, b)).collect::<Result<_, _>>()?;
    let rmrs: Vec<_> = dsts.iter().map(|b| reg(env, pair.recv, b)).collect::<Result<_, _>>()?;
    let mut rreqs = Vec::new();
    for (i, d) in dsts.iter_mut().enumerate() {
        rreqs.push(irecv(env, &pair, d, i as i32, rmrs[i])?);
    }
    let mut sreqs = Vec::new();
    for (i, s) in srcs.iter().enumerate() {
        sreqs.push(isend(env, &pair, s, i as i32, smrs[i])?);
    }
    for r in sreqs {
        wait(env, r, 1)?;
    }
    for (i, r) in rreqs.into_iter().enumerate() {
        let got = wait(env, r, 1)?[0];
        if got != srcs[i].len() || dsts[i][..got] != srcs[i][..] {
            return Err(format!("message {i} arrived out of order or corrupted ({got} bytes)"));
        }
    }
    pair.close(env)
}

/// 32 sends and 32 receives outstanding at once.
pub fn check_outstanding(env: &Env) -> Result<(), String> {
    let pair = connect_pair(env)?;
    let n = rustccl_plugin_api::net::MAX_REQUESTS;
    let srcs: Vec<Vec<u8>> = (0..n).map(|i| pattern(70_000 + i, i as u64)).collect();
    let mut dsts: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; 70_000 + i]).collect();
    let smrs: Vec<_> = srcs.iter().map(|b| reg(env, pair.send, b)).collect::<Result<_, _>>()?;
    let rmrs: Vec<_> = dsts.iter().map(|b| reg(env, pair.recv, b)).collect::<Result<_, _>>()?;
    let sreqs: Vec<_> = srcs.iter().zip(&smrs).map(|(s, &m)| isend(env, &pair, s, 1, m)).collect::<Result<_, _>>()?;
    let mut rreqs = Vec::new();
    for (d, &m) in dsts.iter_mut().zip(&rmrs) {
        rreqs.push(irecv(env, &pair, d, 1, m)?);
    }
    for r in sreqs {
        wait(env, r, 1)?;
    }
    for (i, r) in rreqs.into_iter().enumerate() {
        wait(env, r, 1)?;
        if dsts[i] != srcs[i] {
            return Err(format!("outstanding message {i} corrupted"));
        }
    }
    pair.close(env)
}

/// Closing connections with requests in flight returns promptly, and the plugin still works.
pub fn check_close_in_flight(env: &Env) -> Result<(), String> {
    let pair = connect_pair(env)?;
    let mut dst = vec![0u8; 1 << 20];
    let rmr = reg(env, pair.recv, &dst)?;
    let _pending = irecv(env, &pair, &mut dst, 1, rmr)?;
    let big = pattern(32 << 20, 9);
    let smr = reg(env, pair.send, &big)?;
    let _sending = isend(env, &pair, &big, 2, smr)?;
    let start = Instant::now();
    pair.close(env)?;
    if start.elapsed() > Duration::from_secs(10) {
        return Err(format!("closing with requests in flight took {:?}", start.elapsed()));
    }
    drop(dst);
    let pair = connect_pair(env)?;
    round_trip(env, &pair, 12345, 0, 5)?;
    pair.close(env)
}

/// Handles that are unknown or already used are errors, not crashes.
pub fn check_stale_handles(env: &Env) -> Result<(), String> {
    let bogus = PluginHandle { id: 0xdead_beef_0000 };
    let mut sizes = [0usize; 1];
    if env.net.test(bogus, &mut sizes).is_ok() {
        return Err("test() of an unknown request succeeded".into());
    }
    let pair = connect_pair(env)?;
    let src = pattern(10, 1);
    let mut dst = vec![0u8; 10];
    let smr = reg(env, pair.send, &src)?;
    let rmr = reg(env, pair.recv, &dst)?;
    let r = irecv(env, &pair, &mut dst, 0, rmr)?;
    let s = isend(env, &pair, &src, 0, smr)?;
    wait(env, s, 1)?;
    wait(env, r, 1)?;
    if env.net.test(r, &mut sizes).is_ok() {
        return Err("test() of a completed (freed) request succeeded".into());
    }
    let (send, recv) = (pair.send, pair.recv);
    pair.close(env)?;
    // SAFETY: the buffer outlives the call; the plugin must refuse the closed connection.
    if unsafe { env.net.isend(send, src.as_ptr() as usize, 10, 0, smr) }.is_ok() {
        return Err("isend on a closed connection succeeded".into());
    }
    if env.net.close_recv(recv).is_ok() {
        return Err("closing a connection twice succeeded".into());
    }
    Ok(())
}

/// When the device's `max_recvs` is above 1: receives of `max_recvs` (at most 8) buffers, then
/// of 2, each buffer with its own tag, filled by sends posted in the reverse order of the
/// buffers (a multi-receive matches sends to buffers by tag); sizes of 0 B and not multiples of
/// 128 among them; every buffer's reported size and bytes checked, and the bytes past each
/// message untouched. With `max_recvs` 1 the check is skipped with a `#` line.
pub fn check_multi_receive(env: &Env) -> Result<(), String> {
    let max = env.net.properties(env.ctx, env.dev).map_err(|e| format!("properties: {e}"))?.max_recvs as usize;
    if max <= 1 {
        println!("# multi-receive not tried: max_recvs is {max}");
        return Ok(());
    }
    const CAP: usize = 70_000;
    const UNTOUCHED: u8 = 0xee;
    let pair = connect_pair(env)?;
    let mut round = 0u64;
    for n in [max.min(8), 2] {
        for _ in 0..3 {
            round += 1;
            let sizes: Vec<usize> = (0..n).map(|b| [0, 1, 129, 4097, 65_537, 1000, 7, 70_000][(b + round as usize) % 8]).collect();
            let srcs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(b, &len)| pattern(len, round * 100 + b as u64)).collect();
            let mut dsts: Vec<Vec<u8>> = (0..n).map(|_| vec![UNTOUCHED; CAP]).collect();
            let smrs: Vec<_> = srcs.iter().map(|b| reg(env, pair.send, b)).collect::<Result<_, _>>()?;
            let rmrs: Vec<_> = dsts.iter().map(|b| reg(env, pair.recv, b)).collect::<Result<_, _>>()?;
            let tag = |b: usize| 1000 + b as i32;
            let bufs: Vec<RecvBuffer> =
                dsts.iter_mut().zip(&rmrs).enumerate().map(|(b, (d, &mr))| RecvBuffer { data: d.as_mut_ptr() as usize, size: CAP, tag: tag(b), mr }).collect();
            // SAFETY: the buffers outlive the request (waited for below).
            let r = post(|| unsafe { env.net.irecv(pair.recv, &bufs) }.map_err(|e| format!("irecv of {n} buffers: {e}")))?;
            let sends: Vec<_> = (0..n).rev().map(|b| isend(env, &pair, &srcs[b], tag(b), smrs[b])).collect::<Result<_, _>>()?;
            for s in sends {
                wait(env, s, 1)?;
            }
            let got = wait(env, r, n)?;
            if got != sizes {
                return Err(format!("a receive of {n} buffers reported sizes {got:?}, sent {sizes:?}"));
            }
            for (b, (d, s)) in dsts.iter().zip(&srcs).enumerate() {
                if d[..s.len()] != s[..] {
                    let at = d.iter().zip(s).position(|(x, y)| x != y).unwrap_or(0);
                    return Err(format!("buffer {b} of a {n}-buffer receive ({} bytes) arrived corrupted (first difference at byte {at})", s.len()));
                }
                if let Some(at) = d[s.len()..].iter().position(|&x| x != UNTOUCHED) {
                    return Err(format!("buffer {b} of a {n}-buffer receive was written past its {}-byte message (at byte {})", s.len(), s.len() + at));
                }
            }
            for (comm, mrs) in [(pair.send, smrs), (pair.recv, rmrs)] {
                for mr in mrs {
                    env.net.dereg_mr(comm, mr).map_err(|e| format!("dereg_mr: {e}"))?;
                }
            }
        }
    }
    pair.close(env)
}

/// What [`try_make_vdevice`] found.
#[derive(Debug, PartialEq)]
pub enum VDeviceOutcome {
    /// `make_vdevice` of devices 0 and 1 failed: the plugin does not fuse devices (the error).
    NotOffered(String),
    /// Fewer than two devices: nothing to fuse.
    TooFewDevices(i32),
    /// The virtual device made, with its properties.
    Merged { index: i32, props: NetProperties },
}

/// Asks for a virtual device of devices 0 and 1. Requests no plugin may grant (no device, a
/// device that does not exist, a device twice) must be errors whether or not the plugin fuses
/// devices. When the plugin makes the device: `devices` counts one more, the new index is one
/// of them, its name is the members' joined with `+` and its speed their sum, the physical
/// devices are unchanged, and a message crosses a connection on it.
pub fn try_make_vdevice(env: &Env) -> Result<VDeviceOutcome, String> {
    let (net, ctx) = (env.net, env.ctx);
    let n = net.devices(ctx).map_err(|e| format!("devices: {e}"))?;
    // `make_vdevice` names physical devices, which may be more than `devices()` counts (a
    // plugin that merged its NICs at init): only an index past any device is surely absent.
    for bad in [vec![], vec![i32::MAX], vec![-1], vec![0, 0]] {
        match net.make_vdevice(ctx, &bad) {
            Ok(v) => return Err(format!("make_vdevice({bad:?}) with {n} devices made device {v} instead of failing")),
            Err(e) if e.message.contains("panicked") => return Err(format!("make_vdevice({bad:?}): {e}")),
            Err(_) => {}
        }
    }
    if n < 2 {
        return Ok(VDeviceOutcome::TooFewDevices(n));
    }
    let props = |d: i32| net.properties(ctx, d).map_err(|e| format!("properties of device {d}: {e}"));
    let (p0, p1) = (props(0)?, props(1)?);
    let index = match net.make_vdevice(ctx, &[0, 1]) {
        Ok(v) => v,
        Err(e) => return Ok(VDeviceOutcome::NotOffered(e.to_string())),
    };
    let after = net.devices(ctx).map_err(|e| format!("devices: {e}"))?;
    if after != n + 1 || !(0..after).contains(&index) {
        return Err(format!("make_vdevice([0, 1]) returned device {index}; devices() went from {n} to {after} (expected one more)"));
    }
    let pv = props(index)?;
    let name = format!("{}+{}", p0.name, p1.name);
    if pv.name.as_str() != name {
        return Err(format!("the virtual device is named \"{}\", expected \"{name}\" (the members' names joined with '+')", pv.name));
    }
    let speed = p0.speed_mbps.saturating_add(p1.speed_mbps);
    if pv.speed_mbps != speed {
        return Err(format!("the virtual device's speed is {} Mbit/s, expected {speed} (the members' sum)", pv.speed_mbps));
    }
    if props(0)? != p0 || props(1)? != p1 {
        return Err("making a virtual device changed the properties of its physical devices".into());
    }
    let venv = Env { net, ctx, dev: index, max_size: env.max_size };
    let pair = connect_pair(&venv)?;
    round_trip(&venv, &pair, 65537.min(env.max_size), 0, 21)?;
    pair.close(&venv)?;
    Ok(VDeviceOutcome::Merged { index, props: pv })
}

/// [`try_make_vdevice`] as a check; what it found is one `#` line.
pub fn check_make_vdevice(env: &Env) -> Result<(), String> {
    match try_make_vdevice(env)? {
        VDeviceOutcome::NotOffered(why) => println!("# make_vdevice not offered: {why}"),
        VDeviceOutcome::TooFewDevices(n) => println!("# make_vdevice not tried: {n} device(s)"),
        VDeviceOutcome::Merged { index, props } => {
            println!("# make_vdevice: device {index} '{}' at {} Mbit/s", props.name, props.speed_mbps)
        }
    }
    Ok(())
}

/// A check: name and function.
pub type Check = (&'static str, fn(&Env) -> Result<(), String>);

/// Every in-process check.
pub const CHECKS: &[Check] = &[
    ("sizes 0 B to max", check_sizes),
    ("receive larger than message", check_larger_receive),
    ("ordering and tags", check_ordering_and_tags),
    ("32 outstanding requests", check_outstanding),
    ("close with requests in flight", check_close_in_flight),
    ("stale handles", check_stale_handles),
    ("multi-receive", check_multi_receive),
    ("make_vdevice (merged devices)", check_make_vdevice),
];

/// Encodes a handle for the command line.
pub fn handle_to_hex(h: &NetHandle) -> String {
    h.bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn handle_from_hex(s: &str) -> Option<NetHandle> {
    if s.len() != 2 * rustccl_plugin_api::net::NET_HANDLE_BYTES {
        return None;
    }
    let mut h = NetHandle::default();
    for (i, b) in h.bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(h)
}

/// The peer side of the "killed mid-transfer" check: connects to `handle` and sends 4 MiB
/// messages until it is killed.
pub fn run_sending_peer(env: &Env, handle: &NetHandle) -> Result<(), String> {
    let send = post(|| env.net.connect(env.ctx, env.dev, handle).map_err(|e| format!("connect: {e}")))?;
    let buf = pattern(4 << 20, 1);
    let mr = env.net.reg_mr(send, buf.as_ptr() as usize, buf.len(), PTR_HOST).map_err(|e| e.to_string())?;
    println!("CONNECTED");
    loop {
        // SAFETY: `buf` lives until the process is killed.
        let r = post(|| unsafe { env.net.isend(send, buf.as_ptr() as usize, buf.len(), 0, mr) }.map_err(|e| e.to_string()))?;
        wait(env, r, 1)?;
    }
}

/// The receiving side of the "killed mid-transfer" check: accepts the peer started by
/// `start_peer(handle_hex)`, receives until `kill()` is called after the first message, and
/// expects an error (not a hang) from the next test.
pub fn check_peer_killed(
    env: &Env,
    start_peer: &mut dyn FnMut(&str) -> Result<(), String>,
    kill: &mut dyn FnMut(),
) -> Result<(), String> {
    let (handle, listen) = env.net.listen(env.ctx, env.dev).map_err(|e| format!("listen: {e}"))?;
    start_peer(&handle_to_hex(&handle))?;
    let recv = post(|| env.net.accept(listen).map_err(|e| format!("accept: {e}")))?;
    let mut dst = vec![0u8; 4 << 20];
    let mr = reg(env, recv, &dst)?;
    let b = [RecvBuffer { data: dst.as_mut_ptr() as usize, size: dst.len(), tag: 0, mr }];
    // SAFETY: `dst` outlives the request (the connection is closed before it is dropped).
    let first = post(|| unsafe { env.net.irecv(recv, &b) }.map_err(|e| format!("irecv: {e}")))?;
    wait(env, first, 1)?;
    kill();
    let start = Instant::now();
    let result = loop {
        // SAFETY: as above.
        let r = match post(|| unsafe { env.net.irecv(recv, &b) }.map_err(|e| format!("irecv: {e}"))) {
            Ok(r) => r,
            Err(_) => break Ok(()),
        };
        let mut sizes = [0usize; 1];
        let outcome = loop {
            match env.net.test(r, &mut sizes) {
                Ok(true) => break Ok(true),
                Ok(false) if start.elapsed() > Duration::from_secs(20) => {
                    break Err("a receive from a killed peer neither completed nor failed within 20 s (hang)".to_string())
                }
                Ok(false) => std::thread::yield_now(),
                Err(_) => break Ok(false),
            }
        };
        match outcome {
            // Data already in flight before the kill may still arrive; keep receiving.
            Ok(true) if start.elapsed() < Duration::from_secs(20) => continue,
            Ok(true) => break Err("receives kept completing 20 s after the peer was killed".into()),
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let _ = env.net.close_recv(recv);
    let _ = env.net.close_listen(listen);
    drop(dst);
    result
}

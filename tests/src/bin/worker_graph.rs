//! `coll-graph`: CUDA graph capture of device collectives, and many replays of the graph.
//!
//! Every rank makes its own non-default stream, runs the collectives once uncaptured (the
//! warm-up: connections are made on first use), then captures them into a graph on that
//! stream (`CU_STREAM_CAPTURE_MODE_GLOBAL`, the strictest mode) and instantiates it:
//! * AllReduce, float32 sum, 1048583 elements (over 4 MiB, an odd tail);
//! * AllReduce, float32 PreMulSum with the scalar in device memory (`ncclScalarDevice`), 1001
//!   elements: each iteration writes a new scalar (1, 2 or 3, per rank), which a replay must
//!   read then, not at capture;
//! * one group of AllGather (65537 float32 per rank) and, between ranks 0 and 1, a send and a
//!   receive each way (300001 float32, over one FIFO slot).
//!
//! Then for `GRAPH_ITERS` (20) iterations: fresh inputs (small integers as float32, so any
//! order of summation is exact; derived from `COLL_SEED`, the iteration and the rank, so every
//! rank computes the expected result of all ranks by itself) are copied in outside the graph,
//! the outputs are poisoned (0xFF bytes, guard bytes after each output included), the graph is
//! launched, the stream synchronised, and every output compared bit for bit with the host's
//! reference (the guard bytes must still be poison, the inputs unchanged). The same number of
//! uncaptured iterations follow (checked the same way, and timed for comparison), then one more
//! replay, which must still be right after the uncaptured calls in between.
//!
//! Output: `INFO` lines (graph size, timings), `MISMATCH` lines (at most 20), and a final
//! `RESULT graph: <n> checks, <m> failures`; the exit status is non-zero on any failure. A
//! CUDA or library error is an `ERROR` line and exit status 1. A watchdog ends the process
//! with an `ERROR ... timed out` line when a step hangs (a capture the library does not
//! support may block instead of failing), before the harness's own timeout kills it silently.

use std::ffi::CStr;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use rustccl::backend::{DevicePtr, DeviceBackend, Stream};
use rustccl::types::DataType;
use rustccl::{group_end, group_start, CommConfig, Communicator, Error, ReduceOp, ResultCode, UniqueId};

use crate::worker_coll::{mix, test_device, Rng};

const F32: DataType = DataType::Float32;
/// Element counts: the large and the small AllReduce, AllGather per rank, send/recv.
const AR_BIG: usize = 1_048_583;
const AR_SMALL: usize = 1001;
const AG: usize = 65_537;
const P2P: usize = 300_001;
/// Poison bytes checked after each output.
const GUARD: usize = 64;
const POISON: u8 = 0xFF;
/// Inputs are integers in `-BOUND..=BOUND`: sums over any number of ranks a test runs stay
/// far below 2^24, so float32 sums are exact in any order.
const BOUND: i64 = 100;
/// Most mismatch lines printed.
const MAX_REPORTS: usize = 20;
/// The driver entry points used here beyond those the backend checks when it loads.
const GRAPH_SYMBOLS: [&str; 8] = [
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphGetNodes",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuStreamIsCapturing",
];

// ---- CUDA helpers -----------------------------------------------------------------------------

/// `Ok` for `CUDA_SUCCESS`, else an error naming the call and the driver's error.
pub(crate) fn cu(r: sys::CUresult, what: &str) -> Result<(), Error> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text = |f: unsafe fn(sys::CUresult, *mut *const std::ffi::c_char) -> sys::CUresult| {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the driver is loaded; `p` receives a static string or stays null.
        let ok = unsafe { f(r, &mut p) } == sys::CUresult::CUDA_SUCCESS && !p.is_null();
        // SAFETY: on success `p` is a NUL-terminated static string.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let name = text(sys::cuGetErrorName).unwrap_or_else(|| "unknown CUresult".into());
    let desc = text(sys::cuGetErrorString).unwrap_or_default();
    Err(Error::cuda(format!("{what} failed: {name} ({}): {desc}", r as u32)))
}

pub(crate) fn raw(s: Stream) -> sys::CUstream {
    s.as_raw() as usize as sys::CUstream
}

/// Makes `stream`'s context current on this thread for the test's own graph calls (the
/// driver's graph API works on the current context; the backend's calls then find it current).
pub(crate) fn make_context_current(stream: Stream) -> Result<(), Error> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a live stream; writes one handle.
    cu(unsafe { sys::cuStreamGetCtx(raw(stream), &mut ctx) }, "cuStreamGetCtx")?;
    // SAFETY: the stream's (primary) context, alive for the process.
    cu(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// Fails cleanly (instead of cudarc panicking on first call) when the driver lacks a graph
/// entry point. The cuda backend has already loaded the driver library when this runs.
pub(crate) fn check_symbols() -> Result<(), Error> {
    // SAFETY: the library is loaded already (the backend loaded it), so this finds it.
    let lib = unsafe { sys::culib() };
    for name in GRAPH_SYMBOLS {
        // SAFETY: only the symbol's presence is checked; the pointer is not used.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(Error::cuda(format!("the CUDA driver lacks {name}: CUDA graphs cannot be tested")));
        }
    }
    Ok(())
}

/// A captured, instantiated graph; destroyed on drop (errors then ignored: `destroy` is the
/// checked way).
pub(crate) struct Graph {
    pub(crate) graph: sys::CUgraph,
    pub(crate) exec: sys::CUgraphExec,
}

impl Graph {
    pub(crate) fn destroy(mut self) -> Result<(), Error> {
        let (g, e) = (std::mem::replace(&mut self.graph, std::ptr::null_mut()), std::mem::replace(&mut self.exec, std::ptr::null_mut()));
        // SAFETY: handles made by cuGraphInstantiateWithFlags / cuStreamEndCapture, not yet
        // destroyed (nulled above, so Drop does nothing); no launch of them is in flight (the
        // stream was synchronised).
        if !e.is_null() {
            cu(unsafe { sys::cuGraphExecDestroy(e) }, "cuGraphExecDestroy")?;
        }
        if !g.is_null() {
            cu(unsafe { sys::cuGraphDestroy(g) }, "cuGraphDestroy")?;
        }
        Ok(())
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: as in `destroy`; on an error path, best effort.
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

// ---- Watchdog -----------------------------------------------------------------------------------

/// Ends the process with an ERROR line when a step takes longer than its limit: a hang (a
/// capture the library cannot do, a peer that died mid-collective) becomes a clear failure.
#[derive(Clone)]
struct Watchdog(Arc<Mutex<Option<(String, Instant, Duration)>>>);

impl Watchdog {
    fn start(rank: i32) -> Watchdog {
        let w = Watchdog(Arc::new(Mutex::new(None)));
        let state = Arc::clone(&w.0);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            let guard = state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((what, since, limit)) = &*guard {
                if since.elapsed() > *limit {
                    println!(
                        "ERROR {:?} rank {rank} coll-graph: {what} did not finish in {} s (hang?); giving up",
                        ResultCode::InternalError,
                        limit.as_secs()
                    );
                    let _ = std::io::stdout().flush();
                    // SAFETY: ends the process at once, without running exit handlers that
                    // could block on the hung work.
                    unsafe { libc::_exit(3) };
                }
            }
        });
        w
    }

    /// The step now running, and how long it may take.
    fn step(&self, what: impl Into<String>, limit: Duration) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((what.into(), Instant::now(), limit));
    }
}

// ---- The test ---------------------------------------------------------------------------------

/// Which buffer a piece of input data belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    ArBig = 1,
    ArSmall = 2,
    Ag = 3,
    P2p = 4,
}

/// Rank `r`'s input `which` in iteration `it`: `count` small integers as float32.
fn input(seed: u64, it: u64, r: usize, which: Which, count: usize) -> Vec<f32> {
    let mut rng = Rng::new(mix(&[seed, it, r as u64, which as u64, 0x6a09]));
    (0..count).map(|_| rng.sym(BOUND) as f32).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// What an output allocation must hold: `data`, then poison guard bytes.
fn with_guard(mut data: Vec<u8>) -> Vec<u8> {
    data.extend_from_slice(&[POISON; GUARD]);
    data
}

struct Buf {
    ptr: DevicePtr,
    /// Bytes, the guard included for outputs.
    len: usize,
}

struct Test<'a> {
    comm: &'a Communicator,
    be: Arc<dyn DeviceBackend>,
    stream: Stream,
    seed: u64,
    n: usize,
    me: usize,
    /// The send/recv peer (ranks 0 and 1 only).
    peer: Option<usize>,
    ar_big: (Buf, Buf),
    ar_small: (Buf, Buf),
    ag: (Buf, Buf),
    p2p: (Buf, Buf),
    /// The small AllReduce's PreMulSum scalar (one float32 in device memory).
    scalar: Buf,
    dog: Watchdog,
    limit: Duration,
}

/// One output to check: its name, buffer, and expected contents.
struct Expect<'b> {
    what: String,
    buf: &'b Buf,
    want: Vec<u8>,
}

enum How<'g> {
    Uncaptured,
    Graph(&'g Graph),
}

impl Test<'_> {
    fn alloc(be: &Arc<dyn DeviceBackend>, dev: usize, len: usize) -> Result<Buf, Error> {
        Ok(Buf { ptr: be.alloc(dev, len)?, len })
    }

    fn free(&self) -> Result<(), Error> {
        for (a, b) in [&self.ar_big, &self.ar_small, &self.ag, &self.p2p] {
            self.be.free(a.ptr)?;
            self.be.free(b.ptr)?;
        }
        self.be.free(self.scalar.ptr)?;
        Ok(())
    }

    /// Enqueues the collectives on the test's stream (captured or not).
    fn enqueue(&self) -> Result<(), Error> {
        let (c, s) = (self.comm, self.stream);
        c.all_reduce(self.ar_big.0.ptr, self.ar_big.1.ptr, AR_BIG, F32, ReduceOp::Sum, s).map_err(|e| e.context("all_reduce 1048583"))?;
        let premul = ReduceOp::PreMulSum(rustccl::Scalar::Device(self.scalar.ptr));
        c.all_reduce(self.ar_small.0.ptr, self.ar_small.1.ptr, AR_SMALL, F32, premul, s).map_err(|e| e.context("all_reduce 1001"))?;
        group_start();
        let calls = (|| {
            c.all_gather(self.ag.0.ptr, self.ag.1.ptr, AG, F32, s).map_err(|e| e.context("all_gather"))?;
            if let Some(p) = self.peer {
                c.send(self.p2p.0.ptr, P2P, F32, p as i32, s).map_err(|e| e.context("send"))?;
                c.recv(self.p2p.1.ptr, P2P, F32, p as i32, s).map_err(|e| e.context("recv"))?;
            }
            Ok(())
        })();
        let end = group_end().map_err(|e| e.context("group_end (all_gather, send, recv)"));
        calls.and(end)
    }

    /// Copies iteration `it`'s inputs in, poisons the outputs (both complete on return), and
    /// returns what every buffer must hold afterwards.
    fn prepare(&self, it: u64) -> Result<Vec<Expect<'_>>, Error> {
        let (n, me, seed) = (self.n, self.me, self.seed);
        let mut expect = Vec::new();
        // AllReduce: the sum over all ranks' inputs (exact in i64, then exactly float32).
        // The small one multiplies each rank's input by its scalar of this iteration first.
        let scalar_of = |r: usize| ((it as usize + r) % 3 + 1) as i64;
        self.be.copy_to_device(self.scalar.ptr, &(scalar_of(me) as f32).to_ne_bytes(), self.stream)?;
        for (which, count, bufs) in [(Which::ArBig, AR_BIG, &self.ar_big), (Which::ArSmall, AR_SMALL, &self.ar_small)] {
            let mut sum = vec![0i64; count];
            let mut mine = Vec::new();
            for r in 0..n {
                let x = input(seed, it, r, which, count);
                let k = if which == Which::ArSmall { scalar_of(r) } else { 1 };
                for (s, v) in sum.iter_mut().zip(&x) {
                    *s += *v as i64 * k;
                }
                if r == me {
                    mine = x;
                }
            }
            let mine = bytes(&mine);
            self.be.copy_to_device(bufs.0.ptr, &mine, self.stream)?;
            expect.push(Expect { what: format!("all_reduce {count} input (must be unchanged)"), buf: &bufs.0, want: mine });
            let want: Vec<f32> = sum.iter().map(|&s| s as f32).collect();
            expect.push(Expect { what: format!("all_reduce {count} output"), buf: &bufs.1, want: with_guard(bytes(&want)) });
        }
        // AllGather: every rank's input, in rank order.
        let mut all = Vec::with_capacity(n * AG * 4);
        for r in 0..n {
            let x = bytes(&input(seed, it, r, Which::Ag, AG));
            if r == me {
                self.be.copy_to_device(self.ag.0.ptr, &x, self.stream)?;
                expect.push(Expect { what: "all_gather input (must be unchanged)".into(), buf: &self.ag.0, want: x.clone() });
            }
            all.extend_from_slice(&x);
        }
        expect.push(Expect { what: "all_gather output".into(), buf: &self.ag.1, want: with_guard(all) });
        // Send/recv: the peer's data arrives.
        if let Some(p) = self.peer {
            let x = bytes(&input(seed, it, me, Which::P2p, P2P));
            self.be.copy_to_device(self.p2p.0.ptr, &x, self.stream)?;
            expect.push(Expect { what: "send buffer (must be unchanged)".into(), buf: &self.p2p.0, want: x });
            let want = with_guard(bytes(&input(seed, it, p, Which::P2p, P2P)));
            expect.push(Expect { what: format!("recv from rank {p}"), buf: &self.p2p.1, want });
        }
        // Poison every output, guard included.
        for (_, out) in [&self.ar_big, &self.ar_small, &self.ag, &self.p2p] {
            self.be.copy_to_device(out.ptr, &vec![POISON; out.len], self.stream)?;
        }
        Ok(expect)
    }

    /// One iteration: inputs, launch (the graph, or the calls), synchronise, check. Returns
    /// the time of the launch and synchronisation, the number of checks and the problems.
    fn iteration(&self, it: u64, how: How<'_>) -> Result<(Duration, usize, Vec<String>), Error> {
        let label = match how {
            How::Uncaptured => "uncaptured",
            How::Graph(_) => "graph",
        };
        self.dog.step(format!("iteration {it} ({label}): preparing inputs"), self.limit);
        let expect = self.prepare(it)?;
        // Start together, so the time measured is the collectives', not a wait for the peer.
        self.comm.barrier()?;
        self.dog.step(format!("iteration {it} ({label}): launch and synchronize"), self.limit);
        let t0 = Instant::now();
        match how {
            How::Uncaptured => self.enqueue()?,
            // SAFETY: a live graph instance; every buffer it uses is allocated until the end.
            How::Graph(g) => cu(unsafe { sys::cuGraphLaunch(g.exec, raw(self.stream)) }, "cuGraphLaunch")?,
        }
        // SAFETY: the test's live stream.
        cu(unsafe { sys::cuStreamSynchronize(raw(self.stream)) }, "cuStreamSynchronize after the launch")?;
        let took = t0.elapsed();
        if self.comm.async_error() != ResultCode::Success {
            let e = self.comm.async_error_detail().unwrap_or_else(|| Error::internal("asynchronous error"));
            return Err(e.context(format!("iteration {it} ({label}): communicator error")));
        }
        self.dog.step(format!("iteration {it} ({label}): checking"), self.limit);
        let mut problems = Vec::new();
        for e in &expect {
            let mut got = vec![0u8; e.want.len()];
            self.be.copy_from_device(&mut got, e.buf.ptr, self.stream)?;
            if let Some(p) = compare(&got, &e.want) {
                problems.push(format!("rank {} iteration {it} ({label}) {}: {p}", self.me, e.what));
            }
        }
        Ok((took, expect.len(), problems))
    }

    /// Captures the collectives into a graph and instantiates it.
    fn capture(&self) -> Result<Graph, Error> {
        let s = raw(self.stream);
        self.dog.step("stream capture of the collectives", self.limit);
        // SAFETY: the test's live stream, not capturing.
        cu(
            unsafe { sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) },
            "cuStreamBeginCapture (global mode)",
        )?;
        let calls = self.enqueue();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above (whatever the calls did); writes one handle.
        let end = unsafe { sys::cuStreamEndCapture(s, &mut graph) };
        let mut g = Graph { graph, exec: std::ptr::null_mut() };
        calls.map_err(|e| e.context("a collective failed while its stream was being captured (CUDA graph capture unsupported?)"))?;
        cu(end, "cuStreamEndCapture (the capture was invalidated by something not allowed while capturing)")?;
        if g.graph.is_null() {
            return Err(Error::internal("cuStreamEndCapture returned no graph"));
        }
        let mut nodes = 0usize;
        // SAFETY: a live graph; with a null array only the count is written.
        cu(unsafe { sys::cuGraphGetNodes(g.graph, std::ptr::null_mut(), &mut nodes) }, "cuGraphGetNodes")?;
        if nodes == 0 {
            return Err(Error::internal(
                "the captured graph is empty: the collectives ran (or were dropped) instead of being captured",
            ));
        }
        // SAFETY: a live graph; writes one handle.
        cu(unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) }, "cuGraphInstantiateWithFlags")?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: writes one enum.
        cu(unsafe { sys::cuStreamIsCapturing(s, &mut status) }, "cuStreamIsCapturing")?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(Error::internal("the stream is still capturing after cuStreamEndCapture"));
        }
        println!("INFO graph: rank {} captured {nodes} nodes", self.me);
        Ok(g)
    }
}

/// `None` when equal, else where and how the bytes differ (as float32 elements).
fn compare(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    let elems = |b: &[u8], i: usize| -> String {
        let w = b.get(i * 4..i * 4 + 4).map(|x| f32::from_le_bytes(x.try_into().unwrap()));
        match w {
            Some(v) => format!("{v} ({:#010x})", v.to_bits()),
            None => "-".into(),
        }
    };
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let bad = got.chunks(4).zip(want.chunks(4)).filter(|(a, b)| a != b).count();
    let i = first / 4;
    Some(format!("{bad} of {} elements (guard included) differ; first at element {i} (byte {first}): got {} want {}", want.len().div_ceil(4), elems(got, i), elems(want, i)))
}

fn env_num<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// `coll-graph`: see the module documentation. Environment: `COLL_SEED` (data seed, default
/// 1), `GRAPH_ITERS` (replays, default 20), `GRAPH_STEP_TIMEOUT_S` (the watchdog's limit per
/// step after the warm-up, default 60; init and warm-up get 150 s each).
pub fn graph(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let dog = Watchdog::start(rank);
    let slow = Duration::from_secs(150);
    let limit = Duration::from_secs(env_num("GRAPH_STEP_TIMEOUT_S", 60u64).max(1));
    let iters: u64 = env_num("GRAPH_ITERS", 20u64).max(1);
    let seed: u64 = env_num("COLL_SEED", 1u64);
    if nranks < 2 {
        return Err(Error::invalid_argument("coll-graph needs at least 2 ranks (send/recv between ranks 0 and 1)"));
    }
    dog.step("communicator init", slow);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let be = comm.backend().clone();
    if !be.capabilities().cuda_handles {
        return Err(Error::invalid_usage(format!(
            "coll-graph captures CUDA graphs: it needs the cuda backend (RUSTCCL_BACKEND=cuda), not {}",
            be.kind().name()
        )));
    }
    check_symbols()?;
    let dev = comm.device()? as usize;
    let stream = be.create_stream(dev)?;
    make_context_current(stream)?;

    let (n, me) = (nranks as usize, rank as usize);
    let pair = |count: usize, out: usize| -> Result<(Buf, Buf), Error> {
        Ok((Test::alloc(&be, dev, count * 4)?, Test::alloc(&be, dev, out * 4 + GUARD)?))
    };
    let mut t = Test {
        comm: &comm,
        be: be.clone(),
        stream,
        seed,
        n,
        me,
        peer: (me < 2).then_some(1 - me),
        ar_big: pair(AR_BIG, AR_BIG)?,
        ar_small: pair(AR_SMALL, AR_SMALL)?,
        ag: pair(AG, AG * n)?,
        p2p: pair(P2P, P2P)?,
        scalar: Test::alloc(&be, dev, 4)?,
        dog: dog.clone(),
        limit,
    };

    let mut checks = 0usize;
    let mut failures = 0usize;
    let mut reports = 0usize;
    let mut tally = |c: usize, problems: Vec<String>| {
        checks += c;
        failures += problems.len();
        for p in problems {
            if reports < MAX_REPORTS {
                println!("MISMATCH {p}");
                reports += 1;
            }
        }
    };

    // Warm-up, uncaptured: connections are made here (iteration 0), and it must be right too.
    let t_warm = Instant::now();
    t.limit = slow;
    let (_, c, p) = t.iteration(0, How::Uncaptured).map_err(|e| e.context("warm-up (uncaptured)"))?;
    tally(c, p);
    t.limit = limit;
    let warm = t_warm.elapsed();

    let g = t.capture()?;
    t.comm.barrier()?;

    // Replays with fresh inputs.
    let mut graph_time = Duration::ZERO;
    for it in 1..=iters {
        let (took, c, p) = t.iteration(it, How::Graph(&g))?;
        graph_time += took;
        tally(c, p);
    }
    // The same number of uncaptured iterations, for the time comparison (checked as well).
    let mut direct_time = Duration::ZERO;
    for it in iters + 1..=2 * iters {
        let (took, c, p) = t.iteration(it, How::Uncaptured)?;
        direct_time += took;
        tally(c, p);
    }
    // The graph again, after uncaptured calls of the same communicator.
    let (_, c, p) = t.iteration(2 * iters + 1, How::Graph(&g))?;
    tally(c, p);

    t.dog.step("cleanup", limit);
    g.destroy()?;
    t.free()?;
    be.destroy_stream(stream)?;
    comm.destroy()?;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / iters as f64;
    println!(
        "INFO graph timing: rank {me} graph launch+sync {:.1} us/iteration, uncaptured calls+sync {:.1} us/iteration ({} iterations each; warm-up {:.2} s)",
        per(graph_time),
        per(direct_time),
        iters,
        warm.as_secs_f64()
    );
    t.dog.step("exit", limit);
    println!("RESULT graph: {checks} checks, {failures} failures");
    if failures > 0 {
        let _ = std::io::stdout().flush();
        std::process::exit(1);
    }
    Ok(())
}

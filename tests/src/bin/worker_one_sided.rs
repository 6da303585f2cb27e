//! One-sided operations on symmetric windows (`Communicator::put_signal`, `signal`,
//! `wait_signal`; NCCL 2.29's `ncclPutSignal` & co.), one rank per process, on the host
//! backend or a GPU (`RUSTCCL_BACKEND=cuda`: the window is device memory, read and written
//! through the backend's copies; every operation is enqueued on a stream of the rank's own).
//!
//! - `one-sided`: every rank registers one symmetric window (a source part, then a part per
//!   round that the left neighbour puts into), poisoned before the first round. Rounds of a
//!   ring: each rank writes fresh random bytes (seeded by the run's id, its rank and the
//!   round) into its source part, puts them as two blocks into its right neighbour's window,
//!   then waits for 2 signals from its left one (the expected counts run on from round to
//!   round, as NCCL's) and checks the bytes against its left neighbour's random bytes. Then
//!   signals without data to every peer, waited for in one call on every peer; then the bad
//!   arguments (each an error of the right code, the communicator still usable after them: a
//!   last ring round passes). `RESULT one-sided ok <rounds>`.
//! - `one-sided-group`: the same ring inside groups (`group_start`/`group_end`): the puts, a
//!   signal without data and the wait for 3 signals in one group; then a group holding a put,
//!   an all_reduce and the wait (the one-sided calls run first, in call order, then the
//!   all_reduce; both results checked); then a group with a refused call, which runs nothing
//!   and ends with that error; then a last plain round. `RESULT one-sided-group ok <rounds>`.
//! - `one-sided-graph` (CUDA only): a round's two puts and the wait captured into a CUDA graph
//!   (`cuStreamBeginCapture`, global mode) on the rank's stream, then replayed `GRAPH_REPLAYS`
//!   times: before each replay the rank writes fresh random bytes into its source part and
//!   poisons its receive part, the ranks meet at a barrier, and after it the received bytes
//!   must be the left neighbour's of that replay (the wait's expected count, kept on the device,
//!   runs on from replay to replay). An uncaptured round before (the warm-up) and after. `RESULT one-sided-graph ok
//!   <replays>`.
//! - `one-sided-death`: the last rank is SIGKILLed while the others wait for its signal: they
//!   get an error within seconds, not a hang (on a GPU the wait's kernel ends and the failure
//!   is the communicator's asynchronous error). `RESULT one-sided-death ok <ms> <code>`.

use std::sync::Arc;

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::window::signals::WaitSignalDesc;
use rustccl::window::{Window, WIN_COLL_SYMMETRIC, WIN_DEFAULT};
use rustccl::{CommConfig, Communicator, Error, ReduceOp, ResultCode, UniqueId};

/// Ring rounds.
const ROUNDS: usize = 5;
/// Bytes of one put (two per round).
const BLOCK: usize = 48 << 10;
/// Where the receive parts start in the window (the source part comes first).
const RECV_AT: usize = 2 * BLOCK;
/// Receive parts: one per round of `one-sided` and `one-sided-group`, with room to spare.
const PARTS: usize = ROUNDS + 4;
/// The window: the source part and the receive parts.
const WINDOW: usize = RECV_AT + PARTS * 2 * BLOCK;
/// What every receive part holds before a put reaches it.
const POISON: u8 = 0xa5;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {}", what())))
    }
}

/// `n` random bytes, the same for every rank that asks with the same `seed` (splitmix64).
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// One rank's communicator, its window and where it runs its operations.
struct Ring {
    comm: Communicator,
    b: Arc<dyn DeviceBackend>,
    mem: DevicePtr,
    w: Window,
    stream: Stream,
    /// Fresh for every run (the ranks' shared id): the random bytes differ from run to run.
    run_seed: u64,
    n: usize,
    me: usize,
}

impl Ring {
    fn new(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<Ring, Error> {
        let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
        let b = Arc::clone(comm.backend());
        let dev = comm.device()? as usize;
        let mem = b.window_memory_or_err("one-sided test")?.alloc_symmetric(dev, WINDOW)?;
        let w = comm.window_register(mem, WINDOW, WIN_COLL_SYMMETRIC)?;
        let stream = b.create_stream(dev)?;
        b.memset(mem, POISON, WINDOW, stream)?;
        b.synchronize(stream)?;
        // Every window is poisoned before any put reaches it.
        comm.barrier()?;
        let run_seed = ids.first().map_or(0, |id| id.hash());
        Ok(Ring { comm, b, mem, w, stream, run_seed, n: nranks as usize, me: rank as usize })
    }

    fn right(&self) -> usize {
        (self.me + 1) % self.n
    }

    fn left(&self) -> usize {
        (self.me + self.n - 1) % self.n
    }

    /// Rank `rank`'s bytes of round `round` (two blocks).
    fn data(&self, rank: usize, round: usize) -> Vec<u8> {
        random_bytes(self.run_seed ^ ((rank as u64) << 40) ^ ((round as u64 + 1) << 8), 2 * BLOCK)
    }

    /// Where round `round`'s receive part starts in the window.
    fn part(round: usize) -> usize {
        RECV_AT + round * 2 * BLOCK
    }

    /// This rank's round-`round` bytes into its source part (in stream order).
    fn write_source(&self, round: usize) -> Result<(), Error> {
        self.b.copy_to_device(self.mem, &self.data(self.me, round), self.stream)
    }

    /// The two puts of round `round` to the right neighbour (the second at `BLOCK` into the
    /// round's part).
    fn puts(&self, round: usize) -> Result<(), Error> {
        for blk in 0..2 {
            let src = DevicePtr(self.w.user_ptr().0 + (blk * BLOCK) as u64);
            self.comm.put_signal(src, BLOCK / 4, DataType::Float32, self.right() as i32, &self.w, Self::part(round) + blk * BLOCK, 0, 0, self.stream)?;
        }
        Ok(())
    }

    fn wait_left(&self, signals: i32) -> Result<(), Error> {
        self.comm.wait_signal(&[WaitSignalDesc { op_cnt: signals, peer: self.left() as i32, sig_idx: 0, ctx: 0 }], self.stream)
    }

    /// After the wait (in stream order): the left neighbour's bytes of `round` arrived whole
    /// in the round's part, over the poison.
    fn check_received(&self, round: usize) -> Result<(), Error> {
        self.b.synchronize(self.stream)?;
        let mut got = vec![0u8; 2 * BLOCK];
        self.b.copy_from_device(&mut got, DevicePtr(self.mem.0 + Self::part(round) as u64), self.stream)?;
        let want = self.data(self.left(), round);
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let poisoned = got.iter().filter(|&&x| x == POISON).count();
            return Err(Error::internal(format!(
                "round {round}: byte {i} from rank {} is {:#x}, not {:#x} ({poisoned} of {} bytes still hold the poison)",
                self.left(),
                got[i],
                want[i],
                got.len()
            )));
        }
        Ok(())
    }

    /// One plain ring round: source, two puts, the wait for two signals, the check.
    fn round(&self, round: usize) -> Result<(), Error> {
        self.write_source(round)?;
        self.puts(round)?;
        self.wait_left(2)?;
        self.check_received(round)
    }

    /// Signals without data to every peer, waited for in one call (the same peer twice adds
    /// up).
    fn signals_to_all(&self) -> Result<(), Error> {
        for peer in (0..self.n).filter(|&p| p != self.me) {
            self.comm.signal(peer as i32, 0, 0, self.stream)?;
            self.comm.signal(peer as i32, 0, 0, self.stream)?;
        }
        let mut descs: Vec<WaitSignalDesc> =
            (0..self.n).filter(|&p| p != self.me).map(|p| WaitSignalDesc { op_cnt: 1, peer: p as i32, sig_idx: 0, ctx: 0 }).collect();
        descs.extend(descs.clone());
        self.comm.wait_signal(&descs, self.stream)?;
        self.b.synchronize(self.stream)
    }

    fn finish(self) -> Result<(), Error> {
        self.b.synchronize(self.stream)?;
        self.comm.barrier()?;
        self.comm.window_deregister(&self.w)?;
        self.b.destroy_stream(self.stream)?;
        self.b.free(self.mem)?;
        self.comm.destroy()
    }
}

/// `r` failed with `code`.
fn refused(what: &str, code: ResultCode, r: Result<(), Error>) -> Result<(), Error> {
    match r {
        Ok(()) => Err(Error::internal(format!("{what}: accepted"))),
        Err(e) => check(e.code == code, || format!("{what}: {e} (wanted {code:?})")),
    }
}

pub fn one_sided(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let ring = Ring::new(nranks, rank, ids)?;
    let (comm, b, w, n, s) = (&ring.comm, &ring.b, &ring.w, ring.n, ring.stream);
    for round in 0..ROUNDS {
        ring.round(round)?;
    }
    ring.signals_to_all()?;

    // Bad arguments: errors, and nothing sent.
    let src = w.user_ptr();
    let inv = ResultCode::InvalidArgument;
    let recv = Ring::part(ROUNDS);
    refused("a peer out of range", inv, comm.put_signal(src, 4, DataType::Uint8, n as i32, w, recv, 0, 0, s))?;
    refused("a negative peer", inv, comm.signal(-1, 0, 0, s))?;
    refused("a put past the window's end", inv, comm.put_signal(src, 8, DataType::Uint8, 0, w, WINDOW - 4, 0, 0, s))?;
    refused("a source past the window's end", inv, comm.put_signal(DevicePtr(src.0 + (WINDOW - 4) as u64), 8, DataType::Uint8, 0, w, 0, 0, 0, s))?;
    refused("signal index 1", inv, comm.signal(0, 1, 0, s))?;
    refused("context 1", inv, comm.put_signal(src, 4, DataType::Uint8, 0, w, recv, 0, 1, s))?;
    refused("opCnt 0", inv, comm.wait_signal(&[WaitSignalDesc { op_cnt: 0, peer: 0, sig_idx: 0, ctx: 0 }], s))?;
    refused("a wait on a peer out of range", inv, comm.wait_signal(&[WaitSignalDesc { op_cnt: 1, peer: n as i32, sig_idx: 0, ctx: 0 }], s))?;
    refused("no descriptors", inv, comm.wait_signal(&[], s))?;
    // A source outside symmetric windows: a window without NCCL_WIN_COLL_SYMMETRIC, plain memory.
    let dev = comm.device()? as usize;
    let plain_mem = b.window_memory_or_err("one-sided test")?.alloc_symmetric(dev, 1 << 20)?;
    let plain = comm.window_register(plain_mem, 1 << 20, WIN_DEFAULT)?;
    refused("a source in a window that is not symmetric", inv, comm.put_signal(plain_mem, 4, DataType::Uint8, 0, &plain, 0, 0, 0, s))?;
    let heap = b.alloc(dev, 4096)?;
    refused("a source in plain memory", inv, comm.put_signal(heap, 4, DataType::Uint8, 0, w, recv, 0, 0, s))?;
    // A window no longer registered.
    comm.window_deregister(&plain)?;
    refused("a deregistered peer window", inv, comm.put_signal(src, 4, DataType::Uint8, 0, &plain, 0, 0, 0, s))?;

    // Still usable: a last round (the bad calls sent nothing, so the counts still match).
    ring.round(ROUNDS)?;
    b.free(heap)?;
    b.free(plain_mem)?;
    ring.finish()?;
    println!("RESULT one-sided ok {}", ROUNDS + 1);
    Ok(())
}

pub fn group(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let ring = Ring::new(nranks, rank, ids)?;
    let (comm, b, n, s) = (&ring.comm, &ring.b, ring.n, ring.stream);
    // Rounds in groups: two puts and a signal without data, then the wait for all three.
    for round in 0..ROUNDS {
        ring.write_source(round)?;
        rustccl::group_start();
        let called = ring.puts(round).and_then(|_| comm.signal(ring.right() as i32, 0, 0, s)).and_then(|_| ring.wait_left(3));
        let ended = rustccl::group_end();
        called.and(ended)?;
        ring.check_received(round)?;
    }
    // A put, an all_reduce and the wait in one group: the one-sided calls run at the group's
    // end before the all_reduce, in call order (as NCCL schedules them).
    let round = ROUNDS;
    let dev = comm.device()? as usize;
    let (send, recv) = (b.alloc(dev, 4 * 256)?, b.alloc(dev, 4 * 256)?);
    let mine: Vec<u8> = (0..256).flat_map(|_| (rank as f32 + 1.0).to_le_bytes()).collect();
    b.copy_to_device(send, &mine, s)?;
    ring.write_source(round)?;
    rustccl::group_start();
    let called = ring.puts(round).and_then(|_| comm.all_reduce(send, recv, 256, DataType::Float32, ReduceOp::Sum, s)).and_then(|_| ring.wait_left(2));
    let ended = rustccl::group_end();
    called.and(ended)?;
    ring.check_received(round)?;
    let mut sum = vec![0u8; 4 * 256];
    b.copy_from_device(&mut sum, recv, s)?;
    let want = (n * (n + 1) / 2) as f32;
    let got = f32::from_le_bytes(sum[..4].try_into().expect("4 bytes"));
    check(sum.chunks(4).all(|c| c == want.to_le_bytes()), || format!("the all_reduce in the group gave {got}, not {want}"))?;
    // A refused call cancels its group: nothing of it runs, its end reports the error.
    rustccl::group_start();
    let first = comm.signal(ring.right() as i32, 0, 0, s);
    let bad = comm.signal(n as i32, 0, 0, s);
    let ended = rustccl::group_end();
    first?;
    refused("a bad signal in a group", ResultCode::InvalidArgument, bad)?;
    refused("the end of a group with a refused call", ResultCode::InvalidArgument, ended)?;
    // The cancelled signal never went: a last plain round still counts 2 (a stray signal
    // could let its wait pass before the second block arrived).
    ring.round(ROUNDS + 1)?;
    b.free(send)?;
    b.free(recv)?;
    ring.finish()?;
    println!("RESULT one-sided-group ok {}", ROUNDS + 2);
    Ok(())
}

/// Replays of the captured round (`one-sided-graph`).
const GRAPH_REPLAYS: usize = 8;

pub fn graph(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use crate::worker_graph::{check_symbols, cu, make_context_current, raw, Graph};
    use cudarc::driver::sys;
    let ring = Ring::new(nranks, rank, ids)?;
    let (comm, b, s) = (&ring.comm, &ring.b, ring.stream);
    if !b.capabilities().cuda_handles {
        return Err(Error::invalid_usage(format!(
            "one-sided-graph captures CUDA graphs: it needs the cuda backend (RUSTCCL_BACKEND=cuda), not {}",
            b.kind().name()
        )));
    }
    check_symbols()?;
    make_context_current(s)?;
    // A warm-up round uncaptured (the first device work makes the control block and loads the
    // kernels: allocations a capture in global mode does not allow).
    ring.round(ROUNDS + 1)?;
    // The captured round writes into part 0; the data of replay k is the "round" k's.
    let part = Ring::part(0);
    // SAFETY: the rank's live stream, not capturing.
    cu(unsafe { sys::cuStreamBeginCapture_v2(raw(s), sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) }, "cuStreamBeginCapture")?;
    let calls = ring.puts(0).and_then(|_| ring.wait_left(2));
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above, whatever the calls did; writes one handle.
    let end = unsafe { sys::cuStreamEndCapture(raw(s), &mut graph) };
    let mut g = Graph { graph, exec: std::ptr::null_mut() };
    calls.map_err(|e| e.context("a one-sided call failed while its stream was captured"))?;
    cu(end, "cuStreamEndCapture (the capture was invalidated)")?;
    check(!g.graph.is_null(), || "cuStreamEndCapture returned no graph".into())?;
    // SAFETY: a live graph; writes one handle.
    cu(unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) }, "cuGraphInstantiateWithFlags")?;
    for replay in 0..GRAPH_REPLAYS {
        ring.write_source(replay)?;
        b.memset(DevicePtr(ring.mem.0 + part as u64), POISON, 2 * BLOCK, s)?;
        b.synchronize(s)?;
        // Every rank's receive part is poisoned before any replay's put reaches it, and every
        // rank checked the last replay's bytes before they are overwritten.
        comm.barrier()?;
        // SAFETY: a live executable graph, launched on the rank's live stream.
        cu(unsafe { sys::cuGraphLaunch(g.exec, raw(s)) }, "cuGraphLaunch")?;
        let mut got = vec![0u8; 2 * BLOCK];
        b.synchronize(s)?;
        b.copy_from_device(&mut got, DevicePtr(ring.mem.0 + part as u64), s)?;
        let want = ring.data(ring.left(), replay);
        check(got == want, || {
            let i = (0..got.len()).find(|&i| got[i] != want[i]).unwrap_or(0);
            format!("replay {replay}: byte {i} from rank {} is {:#x}, not {:#x}", ring.left(), got[i], want[i])
        })?;
        comm.barrier()?;
    }
    g.destroy()?;
    // Uncaptured calls go on counting after the replays.
    ring.round(1)?;
    ring.finish()?;
    println!("RESULT one-sided-graph ok {GRAPH_REPLAYS}");
    Ok(())
}

pub fn death(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let ring = Ring::new(nranks, rank, ids)?;
    let (comm, b) = (&ring.comm, &ring.b);
    let victim = nranks - 1;
    comm.barrier()?;
    crate::worker_windows::die_or_guard(rank, victim, "one-sided-death")?;
    let t0 = std::time::Instant::now();
    // On the host backend the wait itself fails; on a GPU it is enqueued, its kernel ends
    // once the watchdog aborts it, and the failure is the asynchronous error.
    let r = comm.wait_signal(&[WaitSignalDesc { op_cnt: 1, peer: victim, sig_idx: 0, ctx: 0 }], ring.stream).and_then(|_| b.synchronize(ring.stream));
    while r.is_ok() && comm.async_error() == ResultCode::Success && t0.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let ms = t0.elapsed().as_millis();
    let e = match r {
        Err(e) => e,
        Ok(()) => comm.async_error_detail().ok_or_else(|| Error::internal("the wait for a dead peer's signal succeeded"))?,
    };
    eprintln!("rank {rank}: the wait ended after {ms} ms: {e}");
    let _ = comm.abort();
    println!("RESULT one-sided-death ok {ms} {:?}", e.code);
    Ok(())
}

//! One-sided operations on symmetric windows (`Communicator::put_signal`, `signal`,
//! `wait_signal`; NCCL 2.29's `ncclPutSignal` & co.), one rank per process on the host backend.
//!
//! - `one-sided`: every rank registers one symmetric window (a source part, then a part per
//!   round that the left neighbour puts into). Rounds of a ring: each rank puts two blocks of
//!   its round's pattern into its right neighbour's window, then waits for 2 signals from its
//!   left one (the expected counts run on from round to round, as NCCL's) and checks the bytes.
//!   Then signals without data to every peer, waited for in one call on every peer; then the
//!   bad arguments (each an error of the right code, the communicator still usable after them:
//!   a last ring round passes). `RESULT one-sided ok <rounds>`.
//! - `one-sided-death`: the last rank is SIGKILLed while the others wait for its signal: they
//!   get an error within seconds, not a hang. `RESULT one-sided-death ok <ms> <code>`.

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::window::signals::WaitSignalDesc;
use rustccl::window::{Window, WIN_COLL_SYMMETRIC, WIN_DEFAULT};
use rustccl::{CommConfig, Communicator, Error, ResultCode, UniqueId};

/// Ring rounds.
const ROUNDS: usize = 5;
/// Bytes of one put (two per round).
const BLOCK: usize = 48 << 10;
/// Where the receive parts start in the window (the source part comes first).
const RECV_AT: usize = 2 * BLOCK;
/// The window: the source part and one receive part per round, plus a last round's.
const WINDOW: usize = RECV_AT + (ROUNDS + 1) * 2 * BLOCK;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {}", what())))
    }
}

/// The byte `i` of rank `rank`'s block `block` of round `round`.
fn pattern(rank: usize, round: usize, block: usize, i: usize) -> u8 {
    (rank * 131 + round * 31 + block * 7 + i * 13 + i / 251) as u8
}

/// The window's bytes (host memory on the host backend).
fn bytes(w: &Window) -> &[u8] {
    // SAFETY: the window's own buffer, `size()` bytes of host memory (host backend), alive
    // while the window is registered; its receive parts are read after the signals that
    // follow the peers' puts.
    unsafe { std::slice::from_raw_parts(w.user_ptr().0 as *const u8, w.size()) }
}

/// Writes `data` at `at` bytes into the window's own buffer (its source part).
fn write(w: &Window, at: usize, data: &[u8]) {
    assert!(at + data.len() <= w.size());
    // SAFETY: inside the window's own buffer (checked), host memory alive while the window is
    // registered; only this rank writes its source part.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (w.user_ptr().0 as *mut u8).add(at), data.len()) };
}

fn setup(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(Communicator, DevicePtr, Window), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let b = std::sync::Arc::clone(comm.backend());
    let mem = b.window_memory_or_err("one-sided test")?.alloc_symmetric(comm.device()? as usize, WINDOW)?;
    let w = comm.window_register(mem, WINDOW, WIN_COLL_SYMMETRIC)?;
    Ok((comm, mem, w))
}

/// One ring round: two puts to the right (the second at `BLOCK` into the round's part), two
/// signals waited for from the left, the left's bytes checked.
fn ring_round(comm: &Communicator, w: &Window, round: usize, n: usize, me: usize) -> Result<(), Error> {
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for blk in 0..2 {
        let data: Vec<u8> = (0..BLOCK).map(|i| pattern(me, round, blk, i)).collect();
        write(w, blk * BLOCK, &data);
    }
    let at = RECV_AT + round * 2 * BLOCK;
    for blk in 0..2 {
        let src = DevicePtr(w.user_ptr().0 + (blk * BLOCK) as u64);
        comm.put_signal(src, BLOCK / 4, DataType::Float32, right as i32, w, at + blk * BLOCK, 0, 0, Stream::DEFAULT)?;
    }
    comm.wait_signal(&[WaitSignalDesc { op_cnt: 2, peer: left as i32, sig_idx: 0, ctx: 0 }], Stream::DEFAULT)?;
    let got = &bytes(w)[at..at + 2 * BLOCK];
    for (i, x) in got.iter().enumerate() {
        let want = pattern(left, round, i / BLOCK, i % BLOCK);
        check(*x == want, || format!("round {round}: byte {i} from rank {left} is {x}, not {want}"))?;
    }
    Ok(())
}

/// `f` fails with `code`.
fn refused(what: &str, code: ResultCode, r: Result<(), Error>) -> Result<(), Error> {
    match r {
        Ok(()) => Err(Error::internal(format!("{what}: accepted"))),
        Err(e) => check(e.code == code, || format!("{what}: {e} (wanted {code:?})")),
    }
}

pub fn one_sided(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let (comm, mem, w) = setup(nranks, rank, ids)?;
    let b = std::sync::Arc::clone(comm.backend());
    let (n, me) = (nranks as usize, rank as usize);
    for round in 0..ROUNDS {
        ring_round(&comm, &w, round, n, me)?;
    }
    // Signals without data to every peer, waited for in one call (the same peer twice adds up).
    for peer in (0..n).filter(|&p| p != me) {
        comm.signal(peer as i32, 0, 0, Stream::DEFAULT)?;
        comm.signal(peer as i32, 0, 0, Stream::DEFAULT)?;
    }
    let mut descs: Vec<WaitSignalDesc> = (0..n).filter(|&p| p != me).map(|p| WaitSignalDesc { op_cnt: 1, peer: p as i32, sig_idx: 0, ctx: 0 }).collect();
    descs.extend(descs.clone());
    comm.wait_signal(&descs, Stream::DEFAULT)?;

    // Bad arguments: errors, and nothing sent.
    let src = w.user_ptr();
    let inv = ResultCode::InvalidArgument;
    refused("a peer out of range", inv, comm.put_signal(src, 4, DataType::Uint8, n as i32, &w, RECV_AT, 0, 0, Stream::DEFAULT))?;
    refused("a negative peer", inv, comm.signal(-1, 0, 0, Stream::DEFAULT))?;
    refused("a put past the window's end", inv, comm.put_signal(src, 8, DataType::Uint8, 0, &w, WINDOW - 4, 0, 0, Stream::DEFAULT))?;
    refused("a source past the window's end", inv, comm.put_signal(DevicePtr(src.0 + (WINDOW - 4) as u64), 8, DataType::Uint8, 0, &w, 0, 0, 0, Stream::DEFAULT))?;
    refused("signal index 1", inv, comm.signal(0, 1, 0, Stream::DEFAULT))?;
    refused("context 1", inv, comm.put_signal(src, 4, DataType::Uint8, 0, &w, RECV_AT, 0, 1, Stream::DEFAULT))?;
    refused("opCnt 0", inv, comm.wait_signal(&[WaitSignalDesc { op_cnt: 0, peer: 0, sig_idx: 0, ctx: 0 }], Stream::DEFAULT))?;
    refused("a wait on a peer out of range", inv, comm.wait_signal(&[WaitSignalDesc { op_cnt: 1, peer: n as i32, sig_idx: 0, ctx: 0 }], Stream::DEFAULT))?;
    refused("no descriptors", inv, comm.wait_signal(&[], Stream::DEFAULT))?;
    // A source outside symmetric windows: a window without NCCL_WIN_COLL_SYMMETRIC, plain memory.
    let plain_mem = b.window_memory_or_err("one-sided test")?.alloc_symmetric(comm.device()? as usize, 1 << 20)?;
    let plain = comm.window_register(plain_mem, 1 << 20, WIN_DEFAULT)?;
    refused("a source in a window that is not symmetric", inv, comm.put_signal(plain_mem, 4, DataType::Uint8, 0, &plain, 0, 0, 0, Stream::DEFAULT))?;
    let heap = b.alloc(comm.device()? as usize, 4096)?;
    refused("a source in plain memory", inv, comm.put_signal(heap, 4, DataType::Uint8, 0, &w, RECV_AT, 0, 0, Stream::DEFAULT))?;
    // A window no longer registered.
    comm.window_deregister(&plain)?;
    refused("a deregistered peer window", inv, comm.put_signal(src, 4, DataType::Uint8, 0, &plain, 0, 0, 0, Stream::DEFAULT))?;
    // Inside a group: refused (not written yet).
    rustccl::group_start();
    let in_group = comm.signal(0, 0, 0, Stream::DEFAULT);
    let _ = rustccl::group_end();
    refused("a signal inside a group", ResultCode::InvalidUsage, in_group)?;

    // Still usable: a last round (the bad calls sent nothing, so the counts still match).
    ring_round(&comm, &w, ROUNDS, n, me)?;
    comm.barrier()?;
    comm.window_deregister(&w)?;
    b.free(heap)?;
    b.free(plain_mem)?;
    b.free(mem)?;
    comm.destroy()?;
    println!("RESULT one-sided ok {}", ROUNDS + 1);
    Ok(())
}

pub fn death(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let (comm, _mem, _w) = setup(nranks, rank, ids)?;
    let victim = nranks - 1;
    comm.barrier()?;
    crate::worker_windows::die_or_guard(rank, victim, "one-sided-death")?;
    let t0 = std::time::Instant::now();
    let r = comm.wait_signal(&[WaitSignalDesc { op_cnt: 1, peer: victim, sig_idx: 0, ctx: 0 }], Stream::DEFAULT);
    let ms = t0.elapsed().as_millis();
    let e = match r {
        Ok(()) => return Err(Error::internal("the wait for a dead peer's signal succeeded")),
        Err(e) => e,
    };
    eprintln!("rank {rank}: the wait ended after {ms} ms: {e}");
    let _ = comm.abort();
    println!("RESULT one-sided-death ok {ms} {:?}", e.code);
    Ok(())
}

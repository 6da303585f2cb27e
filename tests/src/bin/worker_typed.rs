//! Scenarios of the typed API (`rustccl::typed`), one rank per process on the host backend.
//!
//! - `typed-colls`: every collective and its in-place variant (AllReduce with each operator
//!   including Avg and PreMulSum, Broadcast, Reduce, AllGather, ReduceScatter, AlltoAll,
//!   Gather, Scatter, and a Send/Recv ring in a group) on host slices and on `DeviceBuffer`s,
//!   over several element types (f32, f64, i32, u8, i64, bf16, f16, fp8 e4m3/e5m2), with
//!   non-zero roots; every result checked element by element against values computed here.
//!   `RESULT typed-colls checked <n>`.
//! - `typed-errors`: on every rank, calls with wrong lengths, roots and peers return their
//!   typed error at once; the next (correct) collective then gives the right answer, so
//!   nothing of the refused calls was enqueued. `RESULT typed-errors ok`.
//! - `typed-nonblocking`: a non-blocking init polled to completion, then operations on the
//!   non-blocking communicator on `DeviceBuffer`s polled with `Pending::poll`, a group, and
//!   the communicator dropped (finalized) with nothing left to wait for.
//!   `RESULT typed-nonblocking ok`.

use rustccl::typed::prelude::*;
use rustccl::typed::{Error, PendingInit};
use rustccl::UniqueId;

type R<T = ()> = Result<T, Error>;

const S: &Stream = &Stream::DEFAULT;

fn check(cond: bool, what: impl FnOnce() -> String) -> R {
    if cond {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Internal, format!("check failed: {}", what())))
    }
}

fn init(nranks: i32, rank: i32, ids: &[UniqueId]) -> R<Comm> {
    Comm::init(nranks as u32, &ids[0], Rank::new(rank as u32))
}

/// Rank `r`'s input element `i`: small integers below `m` (sums of a few stay exact in the
/// type: `m` is 2 for fp8, whose sums of up to 4 ranks are then exact).
fn input(r: u32, i: usize, m: usize) -> f64 {
    ((r as usize * 3 + i * 5) % m) as f64
}

/// Checks `got` against `want` (as f64).
fn same<T: Copy + std::fmt::Debug>(what: &str, got: &[T], want: &[f64], to: impl Fn(T) -> f64) -> R {
    check(got.len() == want.len(), || format!("{what}: {} elements, expected {}", got.len(), want.len()))?;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        check(to(*g) == *w, || format!("{what}: element {i} is {g:?}, expected {w}"))?;
    }
    Ok(())
}

macro_rules! typed_round {
    ($comm:expr, $t:ty, $m:expr, $from:expr, $to:expr, $checked:expr) => {{
        let comm: &Comm = $comm;
        let input = |r: u32, i: usize| input(r, i, $m);
        let from = $from;
        let to = $to;
        let (n, me) = (comm.size(), comm.rank().get());
        let name = stringify!($t);
        let len = 5usize;
        let mine: Vec<$t> = (0..len).map(|i| from(input(me, i))).collect();
        let sum: Vec<f64> = (0..len).map(|i| (0..n).map(|r| input(r, i)).sum()).collect();
        let max: Vec<f64> = (0..len).map(|i| (0..n).map(|r| input(r, i)).fold(f64::MIN, f64::max)).collect();

        // AllReduce: out of place on host slices, in place on a DeviceBuffer.
        let mut out = vec![from(0.0); len];
        comm.all_reduce(&mine, &mut out, Op::Sum, S)?.wait()?;
        same(&format!("{name} all_reduce sum"), &out, &sum, to)?;
        let mut dev = comm.buffer_from(&mine)?;
        comm.all_reduce_in_place(&mut dev, Op::Max, S)?.wait()?;
        same(&format!("{name} all_reduce_in_place max (DeviceBuffer)"), &dev.to_vec()?, &max, to)?;

        // Broadcast from the last rank; in place from rank 0.
        let root = Rank::new(n - 1);
        let src: Vec<$t> = if me == root.get() { mine.clone() } else { Vec::new() };
        let mut b = vec![from(0.0); len];
        comm.broadcast(&src, &mut b, root, S)?.wait()?;
        same(&format!("{name} broadcast"), &b, &(0..len).map(|i| input(n - 1, i)).collect::<Vec<_>>(), to)?;
        let mut b = mine.clone();
        comm.broadcast_in_place(&mut b, Rank::new(0), S)?.wait()?;
        same(&format!("{name} broadcast_in_place"), &b, &(0..len).map(|i| input(0, i)).collect::<Vec<_>>(), to)?;

        // Reduce to rank 1 (empty receive buffers elsewhere); in place to rank 0.
        let root = Rank::new(1 % n);
        let mut red = if me == root.get() { vec![from(0.0); len] } else { Vec::new() };
        comm.reduce(&mine, &mut red, Op::Sum, root, S)?.wait()?;
        if me == root.get() {
            same(&format!("{name} reduce"), &red, &sum, to)?;
        }
        let mut red = comm.buffer_from(&mine)?;
        comm.reduce_in_place(&mut red, Op::Max, Rank::new(0), S)?.wait()?;
        if me == 0 {
            same(&format!("{name} reduce_in_place"), &red.to_vec()?, &max, to)?;
        }

        // AllGather, and in place (this rank's block is its input).
        let gathered: Vec<f64> = (0..n).flat_map(|r| (0..len).map(move |i| input(r, i))).collect();
        let mut g = vec![from(0.0); len * n as usize];
        comm.all_gather(&mine, &mut g, S)?.wait()?;
        same(&format!("{name} all_gather"), &g, &gathered, to)?;
        let mut g = vec![from(0.0); len * n as usize];
        g[me as usize * len..(me as usize + 1) * len].copy_from_slice(&mine);
        let mut gd = comm.buffer_from(&g)?;
        comm.all_gather_in_place(&mut gd, S)?.wait()?;
        same(&format!("{name} all_gather_in_place"), &gd.to_vec()?, &gathered, to)?;

        // ReduceScatter of n blocks (block b of rank r is input(r + b, i)); and in place.
        let big: Vec<$t> = (0..n as usize * len).map(|k| from(input(me + (k / len) as u32, k % len))).collect();
        let part: Vec<f64> = (0..len).map(|i| (0..n).map(|r| input(r + me, i)).sum()).collect();
        let mut rs = vec![from(0.0); len];
        comm.reduce_scatter(&big, &mut rs, Op::Sum, S)?.wait()?;
        same(&format!("{name} reduce_scatter"), &rs, &part, to)?;
        let mut rsi = big.clone();
        comm.reduce_scatter_in_place(&mut rsi, Op::Sum, S)?.wait()?;
        same(&format!("{name} reduce_scatter_in_place"), &rsi[me as usize * len..(me as usize + 1) * len], &part, to)?;

        // AlltoAll: block p of rank r's send (input(r * n + p, i)) lands in block r of p's.
        let a2a_in: Vec<$t> = (0..n as usize * len).map(|k| from(input(me * n + (k / len) as u32, k % len))).collect();
        let a2a_want: Vec<f64> = (0..n as usize * len).map(|k| input((k / len) as u32 * n + me, k % len)).collect();
        let mut a2a = vec![from(0.0); n as usize * len];
        comm.all_to_all(&a2a_in, &mut a2a, S)?.wait()?;
        same(&format!("{name} all_to_all"), &a2a, &a2a_want, to)?;

        // Gather to the last rank and scatter from it.
        let root = Rank::new(n - 1);
        let mut ga = if me == root.get() { vec![from(0.0); len * n as usize] } else { Vec::new() };
        comm.gather(&mine, &mut ga, root, S)?.wait()?;
        if me == root.get() {
            same(&format!("{name} gather"), &ga, &gathered, to)?;
        }
        let sc_src: Vec<$t> = if me == root.get() { (0..n as usize * len).map(|k| from(input((k / len) as u32, k % len))).collect() } else { Vec::new() };
        let mut sc = vec![from(0.0); len];
        comm.scatter(&sc_src, &mut sc, root, S)?.wait()?;
        same(&format!("{name} scatter"), &sc, &(0..len).map(|i| input(me, i)).collect::<Vec<_>>(), to)?;
        $checked += 14;
    }};
}

pub fn colls(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), rustccl::Error> {
    let comm = init(nranks, rank, ids)?;
    let mut checked = 0usize;
    typed_round!(&comm, f32, 7, |x: f64| x as f32, |v: f32| v as f64, checked);
    typed_round!(&comm, f64, 7, |x: f64| x, |v: f64| v, checked);
    typed_round!(&comm, i32, 7, |x: f64| x as i32, |v: i32| v as f64, checked);
    typed_round!(&comm, i64, 7, |x: f64| x as i64, |v: i64| v as f64, checked);
    typed_round!(&comm, u8, 7, |x: f64| x as u8, |v: u8| v as f64, checked);
    typed_round!(&comm, bf16, 7, bf16::from_f64, bf16::to_f64, checked);
    typed_round!(&comm, f16, 7, f16::from_f64, f16::to_f64, checked);
    typed_round!(&comm, F8E4M3, 2, F8E4M3::from_f64, |v: F8E4M3| v.to_f64(), checked);
    typed_round!(&comm, F8E5M2, 2, F8E5M2::from_f64, |v: F8E5M2| v.to_f64(), checked);

    // Avg and PreMulSum (each rank its own scalar: rank r multiplies by r + 1).
    let (n, me) = (comm.size(), comm.rank().get());
    let mut avg = vec![(me * 2) as f32; 3];
    comm.all_reduce_in_place(&mut avg, Op::Avg, S)?.wait()?;
    same("f32 avg", &avg, &[(n - 1) as f64; 3], |v| v as f64)?;
    let mut pre = vec![2i32; 3];
    comm.all_reduce_in_place(&mut pre, Op::PreMulSum(me as i32 + 1), S)?.wait()?;
    let want = (1..=n).map(|k| 2 * k).sum::<u32>() as f64;
    same("i32 premulsum", &pre, &[want; 3], |v| v as f64)?;

    // A ring of sends and receives in one group: rank r sends its rank to r + 1.
    let next = Rank::new((me + 1) % n);
    let prev = Rank::new((me + n - 1) % n);
    let (out, mut got) = ([me as u64; 4], [u64::MAX; 4]);
    let mut dev_got = comm.alloc::<u64>(4)?;
    comm.group(|g| {
        g.send(&out, next, S)?;
        g.recv(&mut got, prev, S)?;
        g.send(&out, next, S)?;
        g.recv(&mut dev_got, prev, S)
    })?;
    same("send/recv ring", &got, &[prev.get() as f64; 4], |v| v as f64)?;
    same("send/recv ring (DeviceBuffer)", &dev_got.to_vec()?, &[prev.get() as f64; 4], |v| v as f64)?;
    checked += 4;
    comm.finalize()?;
    println!("RESULT typed-colls checked {checked}");
    Ok(())
}

pub fn errors(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), rustccl::Error> {
    let comm = init(nranks, rank, ids)?;
    let n = comm.size();
    let expect = |r: R<Pending<'_>>, kind: ErrorKind, what: &str| -> R {
        match r {
            Err(e) if e.kind() == kind => Ok(()),
            Err(e) => Err(Error::new(ErrorKind::Internal, format!("{what}: {e}, expected {kind:?}"))),
            Ok(_) => Err(Error::new(ErrorKind::Internal, format!("{what}: accepted, expected {kind:?}"))),
        }
    };
    let mut short = vec![0.0f32; 3];
    expect(comm.all_reduce(&[1.0f32; 4], &mut short, Op::Sum, S), ErrorKind::Length, "all_reduce lengths")?;
    expect(comm.all_gather(&[1.0f32; 2], &mut short, S), ErrorKind::Length, "all_gather lengths")?;
    expect(comm.reduce_scatter(&[1.0f32; 5], &mut short, Op::Sum, S), ErrorKind::Length, "reduce_scatter lengths")?;
    expect(comm.all_to_all(&[1.0f32; 3], &mut short, S), ErrorKind::Length, "all_to_all lengths (3 is not a multiple)")
        .or_else(|e| if n == 3 || n == 1 { Ok(()) } else { Err(e) })?;
    expect(comm.broadcast_in_place(&mut short, Rank::new(n), S), ErrorKind::Rank, "broadcast root")?;
    expect(comm.send(&[1u8], Rank::new(n + 5), S), ErrorKind::Rank, "send peer")?;
    let mut dead = [0u8; 1];
    let e = comm.group(|g| {
        g.all_reduce_in_place(&mut dead, Op::Sum, S)?;
        g.all_reduce(&[1.0f32; 4], &mut short, Op::Sum, S)
    });
    check(e.as_ref().is_err_and(|e| e.kind() == ErrorKind::Length), || format!("group with a bad length: {e:?}"))?;
    // Had anything above been enqueued, this would mismatch or hang.
    let mut x = vec![comm.rank().get() as i64; 6];
    comm.all_reduce_in_place(&mut x, Op::Sum, S)?.wait()?;
    same("all_reduce after refusals", &x, &[(0..n).sum::<u32>() as f64; 6], |v| v as f64)?;
    check(dead == [0], || "the cancelled group ran".into())?;
    drop(comm);
    println!("RESULT typed-errors ok");
    Ok(())
}

pub fn nonblocking(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), rustccl::Error> {
    let mut init: PendingInit = Comm::init_nonblocking(nranks as u32, &ids[0], Rank::new(rank as u32), 0, &Default::default())?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while init.poll().is_none() {
        check(std::time::Instant::now() < deadline, || "the non-blocking init never finished".into())?;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let comm = init.wait()?;
    let (n, me) = (comm.size(), comm.rank().get());
    // Three operations queued in a row, each on the previous one's result.
    let mut a = comm.buffer_from(&[me as i32 + 1; 1000])?;
    let mut p = comm.all_reduce_in_place(&mut a, Op::Sum, S)?;
    let result = loop {
        if let Some(r) = p.poll() {
            break r;
        }
        std::thread::yield_now();
    };
    result?;
    drop(p);
    comm.all_reduce_in_place(&mut a, Op::Sum, S)?.wait()?;
    std::mem::forget(comm.all_reduce_in_place(&mut a, Op::Sum, S)?); // a leaked Pending: `a` still waits
    let s = (1..=n).sum::<u32>() as f64 * (n as f64) * (n as f64);
    same("three queued all-reduces", &a.to_vec()?, &[s; 1000], |v| v as f64)?;
    let mut g = comm.alloc::<f64>(n as usize)?;
    let mine = [me as f64];
    comm.group(|gr| gr.all_gather(&mine, &mut g, S))?;
    same("group all_gather", &g.to_vec()?, &(0..n).map(|r| r as f64).collect::<Vec<_>>(), |v| v)?;
    let mut host = [me as u8; 3];
    comm.all_reduce_in_place(&mut host, Op::Max, S)?.wait()?;
    same("host slices on a non-blocking communicator", &host, &[(n - 1) as f64; 3], |v| v as f64)?;
    drop(comm);
    println!("RESULT typed-nonblocking ok");
    Ok(())
}

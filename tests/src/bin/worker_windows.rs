//! Symmetric memory windows (`rustccl::window`), one rank per process on the host backend.
//!
//! - `windows`: every rank allocates shareable memory (as `ncclMemAlloc`), registers two
//!   windows in it (one 4096 bytes in), writes its rank into them, and after a barrier reads
//!   every peer's values through the peers' pointers and writes into its right neighbour's
//!   window; after a second barrier each rank finds its left neighbour's writes in its own
//!   buffer. Then 1000 register/deregister cycles must leave as many mappings as before, and
//!   bad registrations (misaligned, not shareable, past the end, bad flags) are errors on
//!   every rank with nothing left registered. `RESULT windows ok <cycles>`.

use rustccl::backend::{DeviceBackend, DevicePtr, Stream};
use rustccl::window::{WIN_COLL_SYMMETRIC, WIN_DEFAULT};
use rustccl::{CommConfig, Communicator, Error, ResultCode, UniqueId};

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {}", what())))
    }
}

/// Mappings of rustccl's shared memory files in /proc/self/maps (each window maps every
/// rank's file): what the cycles must not make grow. (All lines would also count the memory
/// allocator's own arenas.) On a GPU: the device's used memory.
fn mappings(b: &dyn DeviceBackend, device: usize) -> usize {
    if let Ok(Some((free, total))) = b.memory_info(device) {
        return total - free;
    }
    std::fs::read_to_string("/proc/self/maps").map_or(0, |s| s.lines().filter(|l| l.contains("/rustccl-")).count())
}

/// Reads 8 bytes at `p` (a window's address: host memory on the host backend, device memory
/// read by a copy elsewhere).
fn read_u64(b: &dyn DeviceBackend, p: DevicePtr) -> Result<u64, Error> {
    if b.capabilities().host_addressable {
        // SAFETY: `p` lies in a live window mapping (checked by the caller's window bounds).
        return Ok(unsafe { std::ptr::read_volatile(p.0 as *const u64) });
    }
    let mut out = [0u8; 8];
    b.copy_from_device(&mut out, p, Stream::DEFAULT)?;
    Ok(u64::from_le_bytes(out))
}

fn write_u64(b: &dyn DeviceBackend, p: DevicePtr, v: u64) -> Result<(), Error> {
    if b.capabilities().host_addressable {
        // SAFETY: as `read_u64`.
        unsafe { std::ptr::write_volatile(p.0 as *mut u64, v) };
        return Ok(());
    }
    b.copy_to_device(p, &v.to_le_bytes(), Stream::DEFAULT)?;
    b.synchronize(Stream::DEFAULT)
}

pub fn windows(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let b = std::sync::Arc::clone(comm.backend());
    let b: &dyn DeviceBackend = &*b;
    let dev = comm.device()? as usize;
    let (n, me) = (nranks as usize, rank as usize);
    let bytes = 3 << 20;
    let mem = b.window_memory_or_err("windows test")?.alloc_symmetric(dev, bytes)?;
    let first = comm.window_register(mem, 4096, WIN_DEFAULT)?;
    let second = comm.window_register(DevicePtr(mem.0 + 4096), 1 << 20, WIN_COLL_SYMMETRIC)?;
    check(first.user_ptr() == mem && second.size() == 1 << 20, || format!("{first:?} {second:?}"))?;
    write_u64(b, mem, 1000 + me as u64)?;
    write_u64(b, second.user_ptr(), 2000 + me as u64)?;
    comm.barrier()?;
    for peer in 0..n {
        let a = read_u64(b, first.peer_ptr(peer, 0)?)?;
        let c = read_u64(b, second.peer_ptr(peer, 0)?)?;
        check(a == 1000 + peer as u64 && c == 2000 + peer as u64, || format!("rank {peer}'s windows hold {a}, {c}"))?;
    }
    // A store through a peer's pointer lands in the peer's buffer.
    let right = (me + 1) % n;
    write_u64(b, second.peer_ptr(right, 8)?, 3000 + me as u64)?;
    comm.barrier()?;
    let left = (me + n - 1) % n;
    let got = read_u64(b, DevicePtr(second.user_ptr().0 + 8))?;
    check(got == 3000 + left as u64, || format!("rank {left}'s store arrived as {got}"))?;
    check(second.peer_ptr(n, 0).is_err() && second.peer_ptr(0, (1 << 20) + 1).is_err(), || "bad peer pointers accepted".into())?;
    comm.window_deregister(&second)?;
    comm.window_deregister(&first)?;
    check(comm.window_deregister(&first).is_err(), || "a second deregistration succeeded".into())?;

    // Cycles: nothing left behind.
    let before = mappings(b, dev);
    let cycles = 1000;
    for i in 0..cycles {
        let w = comm.window_register(DevicePtr(mem.0 + 4096 * (i % 3)), 8192, WIN_DEFAULT)?;
        if i % 100 == 0 {
            write_u64(b, w.peer_ptr((me + 1) % n, 0)?, i as u64)?;
        }
        comm.window_deregister(&w)?;
    }
    let after = mappings(b, dev);
    println!("windows: {before} before {cycles} register/deregister cycles, {after} after ({})", if b.capabilities().host_addressable { "mappings of shared memory files" } else { "bytes of device memory in use" });
    check(after <= before, || format!("{before} mappings before {cycles} cycles, {after} after"))?;
    check(comm.window_count() == 0, || format!("{} windows left", comm.window_count()))?;

    // Bad registrations fail on every rank (each learns it from the exchange), and the
    // communicator goes on.
    let plain = b.alloc(dev, 8192)?;
    let bad: [(DevicePtr, usize, u32, ResultCode); 4] = [
        (DevicePtr(mem.0 + 100), 4096, 0, ResultCode::InvalidArgument),
        (plain, 4096, 0, ResultCode::InvalidArgument),
        // (The allocation's real size: a GPU rounds it up to its granularity.)
        (mem, b.window_memory_or_err("windows test")?.symmetric_memory(mem)?.bytes + 1, 0, ResultCode::InvalidArgument),
        // (0x10: no such flag; 2, 4 and 8 are NCCL_WIN_STRICT_ORDERING, 2.32's _GIN_ONLY and
        // 2.31's _CFT_COUNTED, accepted.)
        (mem, 4096, 0x10, ResultCode::InvalidArgument),
    ];
    for (i, (p, len, flags, kind)) in bad.into_iter().enumerate() {
        // Rank 0 alone asks for the bad window; the others ask for a good one.
        let (p, len, flags) = if rank == 0 || i == 3 { (p, len, flags) } else { (mem, 4096, 0) };
        match comm.window_register(p, len, flags) {
            Ok(w) => return Err(Error::internal(format!("bad window {i} registered: {w:?}"))),
            Err(e) if rank == 0 || i == 3 => check(e.code == kind, || format!("bad window {i}: {e}"))?,
            Err(e) => check(e.code == ResultCode::RemoteError, || format!("bad window {i} on a peer: {e}"))?,
        }
    }
    check(comm.window_count() == 0, || format!("{} windows left after refusals", comm.window_count()))?;
    let w = comm.window_register(mem, 4096, WIN_DEFAULT)?;
    comm.barrier()?;
    comm.window_deregister(&w)?;

    // Deregistering windows a collective still uses waits for it: an all_reduce of 64 MiB (1
    // MiB on the host backend) on symmetric windows (a symmetric kernel on GPUs), deregistered
    // at once, still completes
    // with the right sums (no fault from an unmapped window).
    let big = if b.capabilities().host_addressable { 1 << 20 } else { 64 << 20 };
    let (src, dst) = (b.window_memory_or_err("windows test")?.alloc_symmetric(dev, big)?, b.window_memory_or_err("windows test")?.alloc_symmetric(dev, big)?);
    let stream = b.create_stream(dev)?;
    let words = big / 4;
    let input: Vec<u8> = (0..words).flat_map(|i| ((i % 1000) as u32 + me as u32).to_le_bytes()).collect();
    b.copy_to_device(src, &input, stream)?;
    let (ws, wd) = (comm.window_register(src, big, WIN_COLL_SYMMETRIC)?, comm.window_register(dst, big, WIN_COLL_SYMMETRIC)?);
    comm.all_reduce(src, dst, words, rustccl::types::DataType::Uint32, rustccl::ReduceOp::Sum, stream)?;
    comm.window_deregister(&ws)?;
    comm.window_deregister(&wd)?;
    let mut out = vec![0u8; big];
    b.copy_from_device(&mut out, dst, stream)?;
    b.synchronize(stream)?;
    let offset: u32 = (0..n as u32).sum();
    for (i, c) in out.chunks_exact(4).enumerate().step_by(4099) {
        let got = u32::from_le_bytes(c.try_into().expect("4 bytes"));
        let want = (i % 1000) as u32 * n as u32 + offset;
        check(got == want, || format!("all_reduce on windows deregistered at once: element {i} is {got}, expected {want}"))?;
    }
    b.destroy_stream(stream)?;
    comm.barrier()?;
    b.free(src)?;
    b.free(dst)?;
    // A registration left at destroy is released with the communicator.
    let _kept = comm.window_register(mem, 4096, WIN_DEFAULT)?;
    comm.destroy()?;
    b.free(mem)?;
    b.free(plain)?;
    println!("RESULT windows ok {cycles}");
    Ok(())
}

/// The victim (after every rank has left the last barrier) dies by SIGKILL, as a crash
/// would, with no goodbye to its peers; every other rank gets a guard that ends it with an
/// error line if it still runs after 40 s (a hang).
pub(crate) fn die_or_guard(rank: i32, victim: i32, what: &'static str) -> Result<(), Error> {
    if rank == victim {
        // Long enough for every rank to leave the barrier (its last messages) first.
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: ends this process at once, as a crash would (no goodbye to the peers).
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        std::thread::sleep(std::time::Duration::from_secs(60));
        return Err(Error::internal("the victim survived SIGKILL"));
    }
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(40));
        println!("ERROR InternalError rank {rank} {what}: still waiting after 40 s (hang)");
        std::process::exit(3);
    });
    Ok(())
}

/// `windows-peer-death`: 3 ranks register a window and write their rank into it; rank 2 is
/// SIGKILLed. The survivors still read its last values through their mapping (no crash), and
/// their next registration ends with `ncclRemoteError` within seconds, not a hang; then they
/// deregister and destroy. `RESULT windows-peer-death ok <ms>`.
pub fn peer_death(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let b = std::sync::Arc::clone(comm.backend());
    let b: &dyn DeviceBackend = &*b;
    let mem = b.window_memory_or_err("windows test")?.alloc_symmetric(comm.device()? as usize, 1 << 20)?;
    let w = comm.window_register(mem, 4096, WIN_DEFAULT)?;
    write_u64(b, mem, 500 + rank as u64)?;
    comm.barrier()?;
    let victim = nranks - 1;
    die_or_guard(rank, victim, "windows-peer-death")?;
    std::thread::sleep(std::time::Duration::from_millis(600));
    let seen = read_u64(b, w.peer_ptr(victim as usize, 0)?)?;
    check(seen == 500 + victim as u64, || format!("the dead rank's window holds {seen}"))?;
    let t0 = std::time::Instant::now();
    match comm.window_register(DevicePtr(mem.0 + 4096), 4096, WIN_DEFAULT) {
        Ok(w2) => return Err(Error::internal(format!("registered with a dead peer: {w2:?}"))),
        Err(e) => check(e.code == ResultCode::RemoteError, || format!("registration with a dead peer: {e}"))?,
    }
    let ms = t0.elapsed().as_millis();
    comm.window_deregister(&w)?;
    let _ = comm.abort();
    b.free(mem)?;
    println!("RESULT windows-peer-death ok {ms}");
    Ok(())
}

/// A communicator with two symmetric windows of `bytes` each (the source and destination of
/// the scenarios below).
struct TwoWindows {
    comm: Communicator,
    dev: usize,
    src: DevicePtr,
    dst: DevicePtr,
    windows: [rustccl::window::Window; 2],
}

fn two_windows(nranks: i32, rank: i32, ids: &[UniqueId], bytes: usize) -> Result<TwoWindows, Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let b = std::sync::Arc::clone(comm.backend());
    let dev = comm.device()? as usize;
    let (src, dst) = (b.window_memory_or_err("windows test")?.alloc_symmetric(dev, bytes)?, b.window_memory_or_err("windows test")?.alloc_symmetric(dev, bytes)?);
    let windows = [comm.window_register(src, bytes, WIN_COLL_SYMMETRIC)?, comm.window_register(dst, bytes, WIN_COLL_SYMMETRIC)?];
    Ok(TwoWindows { comm, dev, src, dst, windows })
}

impl TwoWindows {
    /// Deregisters the windows and aborts (a peer is dead or the communicator failed).
    fn abort(self) {
        for w in &self.windows {
            let _ = self.comm.window_deregister(w);
        }
        let _ = self.comm.abort();
    }
}

/// `windows-op-death`: 3 ranks register two symmetric windows; rank 2 is SIGKILLed while the
/// others run an all_to_all on them (the copy engines on GPUs, whose streams wait for every
/// peer's flag). The survivors' streams must go on (the watchdog releases the waits once the
/// death is known) and the failure must be reported, not hang. `RESULT windows-op-death ok <ms>`.
pub fn op_death(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let bytes = 1 << 20;
    let t = two_windows(nranks, rank, ids, bytes)?;
    let (comm, dev, src, dst) = (&t.comm, t.dev, t.src, t.dst);
    let b = std::sync::Arc::clone(comm.backend());
    let b: &dyn DeviceBackend = &*b;
    let stream = b.create_stream(dev)?;
    comm.barrier()?;
    die_or_guard(rank, nranks - 1, "windows-op-death")?;
    let t0 = std::time::Instant::now();
    let count = bytes / 4 / nranks as usize;
    let enqueued = comm.all_to_all(src, dst, count, rustccl::types::DataType::Float32, stream);
    let synced = b.synchronize(stream);
    let ms = t0.elapsed().as_millis();
    // The failure shows in the call, the stream, or the communicator's error from now on.
    let reported = enqueued.is_err() || synced.is_err() || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        comm.barrier().is_err()
    };
    check(reported, || "the dead peer went unreported".into())?;
    t.abort();
    println!("RESULT windows-op-death ok {ms}");
    Ok(())
}

/// `windows-mismatch`: every rank registers two symmetric windows; rank 0 runs an all_reduce
/// on them while the others run it on plain buffers. Rank 0 sees that a peer took the usual
/// way (`ncclInvalidUsage`, naming the cause: on the host backend in its wait, on GPUs through
/// the watchdog and the asynchronous error) and the others learn of the failure (an error): no
/// rank hangs. `RESULT windows-mismatch ok <code> ms <ms to the error> <message>`.
pub fn mismatch(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let bytes = 1 << 20;
    let t = two_windows(nranks, rank, ids, bytes)?;
    let (comm, dev, src, dst) = (&t.comm, t.dev, t.src, t.dst);
    let b = std::sync::Arc::clone(comm.backend());
    let b: &dyn DeviceBackend = &*b;
    let (psrc, pdst) = (b.alloc(dev, bytes)?, b.alloc(dev, bytes)?);
    // A rank still leaving this barrier may learn of a peer's failed all_reduce before the
    // last barrier message reaches it (they travel on different connections): that error is
    // the failure news this scenario checks for, so it counts as the operation's.
    let entered = comm.barrier();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(40));
        println!("ERROR InternalError rank {rank} windows-mismatch: still waiting after 40 s (hang)");
        std::process::exit(3);
    });
    let (s, d) = if rank == 0 { (src, dst) } else { (psrc, pdst) };
    let stream = b.create_stream(dev)?;
    let t0 = std::time::Instant::now();
    let r = entered
        .and_then(|_| comm.all_reduce(s, d, bytes / 4, rustccl::types::DataType::Float32, rustccl::ReduceOp::Sum, stream))
        .and_then(|_| b.synchronize(stream));
    // On GPUs the call returns once launched, and the watchdog stops the kernels and reports
    // through the asynchronous error.
    while r.is_ok() && comm.async_error() == ResultCode::Success && t0.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = match r {
        Err(e) => e,
        Ok(()) => match comm.async_error_detail() {
            Some(e) => e,
            None => return Err(Error::internal("an all_reduce on windows on one rank and plain buffers on another succeeded")),
        },
    };
    let ms = t0.elapsed().as_millis();
    if rank == 0 {
        check(e.code == ResultCode::InvalidUsage && e.message.contains("without symmetric windows"), || format!("rank 0: {e}"))?;
    }
    t.abort();
    println!("RESULT windows-mismatch ok {:?} ms {ms} {}", e.code, e.message.replace('\n', " "));
    Ok(())
}

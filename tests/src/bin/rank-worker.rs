//! One rank of a multi-process test: `rank-worker <scenario> <nranks> <rank> <ids>` where
//! `<ids>` is a comma-separated list of hex unique ids (or `env` to derive the id from
//! NCCL_COMM_ID). Prints `READY`/`RESULT ...` lines for the harness, checks what it can
//! itself, and on failure prints `ERROR <code> <message>` and exits with status 1.

mod worker_cache;
mod worker_coll;
mod worker_encrypt;
mod worker_env;
mod worker_faults;
mod worker_graph;
mod worker_init;
mod worker_lifecycle;
mod worker_nonblocking;
mod worker_one_rank;
mod worker_profiler;
mod worker_routes;
mod worker_shrink;
mod worker_streams;
mod worker_typed;
mod worker_windows;
mod worker_one_sided;

use std::io::BufRead;
use std::time::{Duration, Instant};

use rustccl::{CommConfig, Communicator, Error, ResultCode, ShrinkFlags, UniqueId, SPLIT_NOCOLOR};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: rank-worker <scenario> <nranks> <rank> <ids|env>");
        std::process::exit(2);
    }
    let nranks: i32 = args[2].parse().expect("nranks");
    let rank: i32 = args[3].parse().expect("rank");
    let ids: Vec<UniqueId> = if args[4] == "none" {
        Vec::new()
    } else if args[4] == "env" {
        vec![rustccl::get_unique_id().unwrap_or_else(|e| fail(e))]
    } else {
        args[4].split(',').map(|h| UniqueId::from_hex(h).unwrap_or_else(|e| fail(e))).collect()
    };
    let result = match args[1].as_str() {
        "init-barrier" => init_barrier(nranks, rank, &ids),
        "nonblocking" => nonblocking(nranks, rank, &ids),
        "split" => split(nranks, rank, &ids),
        "kill-shrink" => kill_shrink(nranks, rank, &ids),
        "split-shrink" => worker_shrink::split_then_shrink(nranks, rank, &ids),
        "net-traffic" => net_traffic(nranks, rank, &ids),
        "encrypt-pattern" => worker_encrypt::pattern(nranks, rank, &ids),
        "encrypt-sweep" => worker_encrypt::sweep(nranks, rank, &ids),
        "encrypt-checked" => worker_encrypt::checked_all_reduce(nranks, rank, &ids),
        "plugins" => plugins(nranks, rank, &ids),
        "tuned-sizes" => tuned_sizes(nranks, rank, &ids),
        "profiled" => worker_profiler::profiled(nranks, rank, &ids),
        "coll-matrix" => worker_coll::matrix(nranks, rank, &ids),
        "plan-cache" => worker_cache::plan_cache(nranks, rank, &ids),
        "coll-matrix-one-process" => worker_coll::matrix_one_process(nranks),
        "group-p2p" => worker_coll::group_p2p(nranks, rank, &ids),
        "group-two-comms" => worker_coll::group_two_comms(nranks, rank, &ids),
        "coll-graph" => worker_graph::graph(nranks, rank, &ids),
        "coll-streams" => worker_streams::streams(nranks, rank, &ids),
        "coll-peer-death" => worker_streams::peer_death(nranks, rank, &ids),
        "fault-mismatch" => worker_faults::mismatch(nranks, rank, &ids),
        "destroy-cycles" => worker_lifecycle::destroy_cycles(nranks, rank, &ids),
        "net-cut" => worker_lifecycle::net_cut(nranks, rank, &ids),
        "fault-hang" => worker_faults::hang(nranks, rank, &ids),
        "fault-report" => worker_faults::report(nranks, rank, &ids),
        "fault-abort-stuck" => worker_faults::abort_stuck(nranks, rank, &ids),
        "nb-ops" => worker_nonblocking::ops(nranks, rank, &ids),
        "nb-stuck" => worker_nonblocking::stuck(nranks, rank, &ids),
        "nb-mixed" => worker_nonblocking::mixed(nranks, rank, &ids),
        "one-rank" => worker_one_rank::one_rank(nranks, rank, &ids),
        "typed-colls" => worker_typed::colls(nranks, rank, &ids),
        "typed-errors" => worker_typed::errors(nranks, rank, &ids),
        "typed-nonblocking" => worker_typed::nonblocking(nranks, rank, &ids),
        "windows" => worker_windows::windows(nranks, rank, &ids),
        "windows-peer-death" => worker_windows::peer_death(nranks, rank, &ids),
        "windows-op-death" => worker_windows::op_death(nranks, rank, &ids),
        "windows-mismatch" => worker_windows::mismatch(nranks, rank, &ids),
        "one-sided" => worker_one_sided::one_sided(nranks, rank, &ids),
        "one-sided-death" => worker_one_sided::death(nranks, rank, &ids),
        "one-sided-group" => worker_one_sided::group(nranks, rank, &ids),
        "one-sided-graph" => worker_one_sided::graph(nranks, rank, &ids),
        "routes-group" => worker_routes::group(nranks, rank, &ids),
        "routes-nonblocking" => worker_routes::nonblocking(nranks, rank, &ids),
        "routes-disagree" => worker_routes::disagree(nranks, rank, &ids),
        "compile-kernels" => compile_kernels(),
        "latency" => latency(nranks, rank, &ids),
        "from-env" => from_env(nranks, rank),
        "init-timed" => worker_init::timed(nranks, rank, &ids),
        "init-die" => worker_init::die(nranks, rank, &ids),
        "env-params" => worker_env::params(),
        "init-only" => Communicator::init_rank_scalable(nranks, rank, &ids, 0, &CommConfig::default()).map(|c| {
            let _ = c.destroy();
        }),
        other => {
            eprintln!("unknown scenario {other}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        fail(e);
    }
}

fn fail(e: Error) -> ! {
    println!("ERROR {:?} {}", e.code, e.message);
    std::process::exit(1);
}

fn check(cond: bool, what: String) -> Result<(), Error> {
    if cond {
        Ok(())
    } else {
        Err(Error::internal(format!("check failed: {what}")))
    }
}

/// Everyone's rank arrives at everyone, in order.
fn check_allgather(comm: &Communicator, expect: &[i32], me: i32) -> Result<(), Error> {
    let all = comm.allgather_bytes(&me.to_le_bytes())?;
    let got: Vec<i32> = all.iter().map(|b| i32::from_le_bytes(b.as_slice().try_into().unwrap())).collect();
    check(got == expect, format!("allgather gave {got:?}, expected {expect:?}"))
}

fn init_barrier(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    check(comm.count()? == nranks && comm.user_rank()? == rank, "count/rank".into())?;
    comm.barrier()?;
    let expect: Vec<i32> = (0..nranks).collect();
    check_allgather(&comm, &expect, rank)?;
    // Ring of point-to-point messages.
    if nranks > 1 {
        let next = (rank + 1) % nranks;
        let prev = (rank + nranks - 1) % nranks;
        comm.send_bytes(next, 7, format!("from {rank}").as_bytes())?;
        let got = comm.recv_bytes(prev, 7)?;
        check(got == format!("from {prev}").as_bytes(), "ring message".into())?;
    }
    comm.barrier()?;
    comm.finalize()?;
    comm.destroy()?;
    println!("RESULT ok");
    Ok(())
}

fn nonblocking(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::non_blocking())?;
    let mut polls = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match comm.async_error() {
            ResultCode::InProgress => {
                polls += 1;
                check(Instant::now() < deadline, "non-blocking init never finished".into())?;
                std::thread::sleep(Duration::from_millis(1));
            }
            ResultCode::Success => break,
            code => return Err(comm.async_error_detail().unwrap_or_else(|| Error::new(code, "init failed"))),
        }
    }
    comm.barrier()?;
    comm.destroy()?;
    println!("RESULT polls {polls}");
    Ok(())
}

/// Split by colour `rank % 3` with keys reversing the order, NOCOLOR for every fifth rank,
/// then a nested split of each child in halves.
fn split(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let color = |r: i32| if r % 5 == 4 { SPLIT_NOCOLOR } else { r % 3 };
    let child = comm.split(color(rank), -rank, None)?;
    if color(rank) == SPLIT_NOCOLOR {
        check(child.is_none(), "NOCOLOR got a communicator".into())?;
        comm.barrier()?;
        comm.destroy()?;
        println!("RESULT nocolor");
        return Ok(());
    }
    let child = child.ok_or_else(|| Error::internal("no child"))?;
    // Members of my colour, ordered by key (-rank), i.e. descending rank.
    let mut members: Vec<i32> = (0..nranks).filter(|&r| color(r) == color(rank)).collect();
    members.reverse();
    let my_child_rank = members.iter().position(|&r| r == rank).unwrap() as i32;
    check(child.count()? == members.len() as i32, format!("child size {} vs {members:?}", child.count()?))?;
    check(child.user_rank()? == my_child_rank, "child rank".into())?;
    check_allgather(&child, &members, rank)?;
    // Nested: halves of the child, same key order as the child.
    let half = (my_child_rank * 2 >= members.len() as i32) as i32;
    let grandchild = child.split(half, my_child_rank, None)?.ok_or_else(|| Error::internal("no grandchild"))?;
    let gmembers: Vec<i32> =
        members.iter().enumerate().filter(|(i, _)| ((*i as i32) * 2 >= members.len() as i32) as i32 == half).map(|(_, &r)| r).collect();
    check_allgather(&grandchild, &gmembers, rank)?;
    grandchild.destroy()?;
    child.destroy()?;
    comm.barrier()?;
    comm.destroy()?;
    println!("RESULT child {my_child_rank} of {}", members.len());
    Ok(())
}

/// Init, report READY, wait for GO (the harness kills the victim in between), then expect
/// the next operation to fail with a remote error quickly, shrink without the victim, and
/// check that the shrunk communicator works.
fn kill_shrink(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let victim: i32 = std::env::var("VICTIM").ok().and_then(|v| v.parse().ok()).unwrap_or(nranks - 1);
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    comm.barrier()?;
    println!("READY");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| Error::io("stdin", &e))?;
    if rank == victim {
        // The harness kills this process; it must not get further.
        std::thread::sleep(Duration::from_secs(60));
        return Err(Error::internal("victim was not killed"));
    }
    let t0 = Instant::now();
    let err = match comm.barrier() {
        Ok(()) => return Err(Error::internal("barrier succeeded with a dead rank")),
        Err(e) => e,
    };
    let detect = t0.elapsed();
    check(err.code == ResultCode::RemoteError, format!("barrier failed with {err}"))?;
    check(comm.async_error() == ResultCode::RemoteError, "async error is not RemoteError".into())?;
    check(!comm.last_error().is_empty(), "no last error recorded".into())?;
    let child = comm.shrink(&[victim], None, ShrinkFlags::Abort)?;
    let expect: Vec<i32> = (0..nranks).filter(|&r| r != victim).collect();
    check(child.count()? == nranks - 1, "shrunk size".into())?;
    check_allgather(&child, &expect, rank)?;
    child.barrier()?;
    let t1 = Instant::now();
    comm.abort()?;
    let abort_time = t1.elapsed();
    child.destroy()?;
    println!("RESULT detect_ms {} abort_ms {} error {}", detect.as_millis(), abort_time.as_millis(), err.message);
    Ok(())
}

/// Ranks of the first half exchange messages with their partner in the second half through
/// the communicator's network plugin (both directions, 64 MiB each way, checked byte for
/// byte), after checking that the halves are on different hosts.
fn net_traffic(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use rustccl_plugin_api::net::{RecvBuffer, PTR_HOST};
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let hosts = comm.host_hashes()?;
    let half = nranks / 2;
    check(hosts[0] != hosts[half as usize], "the two halves share a host".into())?;
    let partner = (rank + half) % nranks;
    let plugins = comm.plugins()?;
    let inst = &plugins.net;
    let net = &inst.plugin.api;
    let e = |what: &str| {
        let what = what.to_string();
        move |err: rustccl_plugin_api::PluginError| Error::from(err).context(what.clone())
    };
    // Each side listens; handles cross through the bootstrap.
    let (handle, listen) = net.listen(inst.ctx, 0).map_err(e("listen"))?;
    comm.send_bytes(partner, 1, &handle.bytes)?;
    let theirs = comm.recv_bytes(partner, 1)?;
    let mut their_handle = rustccl_plugin_api::net::NetHandle::default();
    their_handle.bytes.copy_from_slice(&theirs);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut send, mut recv) = (None, None);
    while send.is_none() || recv.is_none() {
        if send.is_none() {
            send = net.connect(inst.ctx, 0, &their_handle).map_err(e("connect"))?;
        }
        if recv.is_none() {
            recv = net.accept(listen).map_err(e("accept"))?;
        }
        check(Instant::now() < deadline, "connect/accept did not finish in 30 s".into())?;
        std::thread::yield_now();
    }
    let (send, recv) = (send.unwrap(), recv.unwrap());
    let size = 64 << 20;
    let out: Vec<u8> = (0..size).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(rank as u32) as u8 >> 1).collect();
    let mut inbox = vec![0u8; size];
    let smr = net.reg_mr(send, out.as_ptr() as usize, size, PTR_HOST).map_err(e("reg_mr"))?;
    let rmr = net.reg_mr(recv, inbox.as_ptr() as usize, size, PTR_HOST).map_err(e("reg_mr"))?;
    let bufs = [RecvBuffer { data: inbox.as_mut_ptr() as usize, size, tag: 0, mr: rmr }];
    let t0 = Instant::now();
    // SAFETY: `inbox` and `out` stay alive and untouched until both requests complete below.
    let rreq = loop {
        if let Some(r) = unsafe { net.irecv(recv, &bufs) }.map_err(e("irecv"))? {
            break r;
        }
    };
    let sreq = loop {
        if let Some(r) = unsafe { net.isend(send, out.as_ptr() as usize, size, 0, smr) }.map_err(e("isend"))? {
            break r;
        }
    };
    let mut sizes = [0usize];
    for req in [sreq, rreq] {
        while !net.test(req, &mut sizes).map_err(e("test"))? {
            check(Instant::now() < deadline, "transfer did not finish in 30 s".into())?;
            std::thread::yield_now();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    check(sizes[0] == size, format!("received {} bytes", sizes[0]))?;
    let expect: Vec<u8> = (0..size).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(partner as u32) as u8 >> 1).collect();
    check(inbox == expect, "data from the other namespace arrived corrupted".into())?;
    net.dereg_mr(send, smr).map_err(e("dereg"))?;
    net.dereg_mr(recv, rmr).map_err(e("dereg"))?;
    net.close_send(send).map_err(e("close"))?;
    net.close_recv(recv).map_err(e("close"))?;
    net.close_listen(listen).map_err(e("close"))?;
    comm.barrier()?;
    comm.destroy()?;
    println!("RESULT plugin {} moved {} MiB each way in {:.3} s", inst.plugin.name, size >> 20, secs);
    Ok(())
}

/// Reports which plugins the communicator chose, and what its tuner makes of a flat cost table.
fn plugins(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use rustccl_plugin_api::{CollType, CostTable};
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &CommConfig::default())?;
    let p = comm.plugins()?;
    println!("RESULT net {} v{} {}", p.net.plugin.name, p.net.plugin.abi_version, p.net.plugin.origin);
    match &p.tuner {
        Some(t) => {
            println!("RESULT tuner {} v{} {}", t.plugin.name, t.plugin.abi_version, t.plugin.origin);
            let mut costs = vec![1.0f32; 7 * 3];
            let mut table = CostTable::new(&mut costs, 7, 3).map_err(Error::internal)?;
            let mut channels = -1;
            t.plugin.api.get_coll_info(t.ctx, CollType::AllReduce, 1 << 20, 1, &mut table, &mut channels)?;
            let (algo, proto, _) = table.best().ok_or_else(|| Error::internal("no usable entry"))?;
            println!("RESULT best {} {}", algo.name(), proto.name());
        }
        None => println!("RESULT tuner none"),
    }
    match &p.profiler {
        Some(pr) => println!("RESULT profiler {} v{} mask {:#x}", pr.plugin.name, pr.plugin.abi_version, pr.mask),
        None => println!("RESULT profiler none"),
    }
    drop(p);
    comm.destroy()?;
    Ok(())
}

/// For each size of `RUSTCCL_TEST_SIZES` (bytes, comma list): the planner's choice for a float
/// all-reduce of that size (`RESULT choice <bytes> <ALGO> <PROTO> <channels>`, as the tuner
/// and the cost model decide it), then that all-reduce run and its result checked.
fn tuned_sizes(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use rustccl::coll::plan::{choose, PlanEnv};
    use rustccl::coll::{CollKind, Task};
    use rustccl::types::DataType;
    use rustccl::ReduceOp;
    let sizes: Vec<usize> = std::env::var("RUSTCCL_TEST_SIZES")
        .map_err(|_| Error::invalid_argument("set RUSTCCL_TEST_SIZES"))?
        .split(',')
        .map(|s| s.trim().parse().map_err(|_| Error::invalid_argument(format!("bad size {s:?}"))))
        .collect::<Result<_, _>>()?;
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, worker_coll::test_device(rank), &CommConfig::default())?;
    let backend = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = backend.create_stream(device)?;
    for bytes in sizes {
        let count = bytes / 4;
        let buf = backend.alloc(device, bytes.max(4))?;
        let task = Task { kind: CollKind::AllReduce, send: buf, recv: buf, count, dtype: DataType::Float32, op: ReduceOp::Sum, stream, profile: Default::default(), options: Default::default() };
        let c = PlanEnv::with(&comm, |env| choose(env, &task))?;
        println!("RESULT choice {bytes} {} {} {}", c.algo.name(), c.proto.name(), c.channels);
        let input: Vec<u8> = (0..count).flat_map(|i| ((i % 97) as f32 + rank as f32).to_ne_bytes()).collect();
        backend.copy_to_device(buf, &input, stream)?;
        comm.all_reduce(buf, buf, count, DataType::Float32, ReduceOp::Sum, stream)?;
        let mut out = vec![0u8; count * 4];
        backend.copy_from_device(&mut out, buf, stream)?;
        backend.synchronize(stream)?;
        let n = nranks as f32;
        for (i, w) in out.chunks_exact(4).enumerate() {
            let got = f32::from_ne_bytes(w.try_into().unwrap());
            let want = (i % 97) as f32 * n + (0..nranks).sum::<i32>() as f32;
            check(got == want, format!("{bytes} B: element {i} is {got}, expected {want}"))?;
        }
        backend.free(buf)?;
    }
    comm.destroy()
}

/// Compiles (or finds in the kernel cache) every collective kernel of the cuda backend (the hip
/// backend's with RUSTCCL_BACKEND=hip) for device 0, several at once, so that later runs do
/// not pay for the compiles one by one.
fn compile_kernels() -> Result<(), Error> {
    if std::env::var("RUSTCCL_BACKEND").is_ok_and(|b| b.eq_ignore_ascii_case("hip")) {
        let backend = rustccl::backend::HipBackend::shared()?;
        let start = Instant::now();
        let n = backend.preload_exec_kernels(0)?;
        println!("RESULT compile-kernels: {n} collective kernels for {} ready in {:.1} s", backend.arch(0)?, start.elapsed().as_secs_f64());
        return Ok(());
    }
    let backend = rustccl::backend::CudaBackend::shared()?;
    let start = Instant::now();
    let n = backend.preload_exec_kernels(0)?;
    let res = backend.exec_kernel_resources();
    let regs = res.iter().map(|r| r.2);
    let (lo, hi) = (regs.clone().min().unwrap_or(0), regs.max().unwrap_or(0));
    let spilling: Vec<String> = res.iter().filter(|r| r.3 > 0).map(|r| format!("{:?}/{} {} B", r.0, r.1, r.3)).collect();
    println!(
        "RESULT compile-kernels: {n} collective kernels ready in {:.1} s; registers per thread {lo}..{hi}; local memory: {}",
        start.elapsed().as_secs_f64(),
        if spilling.is_empty() { "none".to_string() } else { spilling.join(", ") }
    );
    Ok(())
}

/// Where the time of a small all-reduce goes, in place and out of place: the host's enqueue
/// alone (calls without waiting), and calls followed by a stream synchronize. Prints `RESULT
/// latency ...` lines.
fn latency(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    use rustccl::types::DataType;
    use rustccl::ReduceOp;
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, worker_coll::test_device(rank), &CommConfig::default())?;
    let backend = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = backend.create_stream(device)?;
    let buf = backend.alloc(device, 1 << 20)?;
    let out = backend.alloc(device, 1 << 20)?;
    for (bytes, place) in [(8usize, "in place"), (4096, "in place"), (65536, "in place"), (8, "out of place"), (65536, "out of place")] {
        let count = bytes / 4;
        let dst = if place == "in place" { buf } else { out };
        let run = |n: usize, sync_each: bool| -> Result<(f64, f64), Error> {
            comm.barrier()?;
            let t = Instant::now();
            let mut enqueue = Duration::ZERO;
            for _ in 0..n {
                let e = Instant::now();
                comm.all_reduce(buf, dst, count, DataType::Float32, ReduceOp::Sum, stream)?;
                enqueue += e.elapsed();
                if sync_each {
                    backend.synchronize(stream)?;
                }
            }
            backend.synchronize(stream)?;
            Ok((t.elapsed().as_secs_f64() * 1e6 / n as f64, enqueue.as_secs_f64() * 1e6 / n as f64))
        };
        run(20, false)?;
        rustccl::profile::reset();
        let (pipelined, enq) = run(500, false)?;
        let (synced, enq_synced) = run(200, true)?;
        println!(
            "RESULT latency {bytes} B {place}: pipelined {pipelined:.1} us/call (enqueue {enq:.1}), synchronized {synced:.1} us/call (enqueue {enq_synced:.1}); stages: {}",
            rustccl::profile::report()
        );
    }
    comm.destroy()
}

/// `Communicator::from_env` with the launcher variables the test set: the rank and size must
/// be the ones the harness expects, and an all-reduce of rank+1 must give n(n+1)/2.
fn from_env(nranks: i32, rank: i32) -> Result<(), Error> {
    use rustccl::types::DataType;
    use rustccl::ReduceOp;
    let comm = Communicator::from_env()?;
    check(comm.count()? == nranks && comm.user_rank()? == rank, format!("rank {} of {}", comm.user_rank()?, comm.count()?))?;
    let backend = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = backend.create_stream(device)?;
    let count = 1000;
    let buf = backend.alloc(device, count * 4)?;
    let input: Vec<u8> = (0..count).flat_map(|_| (rank as f32 + 1.0).to_ne_bytes()).collect();
    backend.copy_to_device(buf, &input, stream)?;
    comm.all_reduce(buf, buf, count, DataType::Float32, ReduceOp::Sum, stream)?;
    let mut out = vec![0u8; count * 4];
    backend.copy_from_device(&mut out, buf, stream)?;
    backend.synchronize(stream)?;
    let want = (nranks * (nranks + 1) / 2) as f32;
    for (i, w) in out.chunks_exact(4).enumerate() {
        let got = f32::from_ne_bytes(w.try_into().unwrap());
        check(got == want, format!("element {i} is {got}, expected {want}"))?;
    }
    backend.free(buf)?;
    println!("RESULT from-env rank {rank} of {nranks} device {device} sum {want}");
    comm.destroy()
}

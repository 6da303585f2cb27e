//! Groups, and the edges of the collective API:
//! * 64 send/recv pairs per rank in one group, across all ranks (processes);
//! * several communicators in one group: a communicator, its splits and a second one from
//!   another id (processes); two and four ranks of one process driven from ONE thread in one
//!   group (`init_all`, and communicators made on threads);
//! * count 0 collectives are no-ops; 1-rank communicators copy and apply the op;
//! * bad arguments give InvalidArgument / InvalidUsage, and leave the communicator usable.

use std::sync::mpsc;
use std::time::Duration;

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{group_end, group_start, Communicator, ReduceOp, ResultCode, Scalar};
use rustccl_tests::*;

const LIMIT: Duration = Duration::from_secs(120);
const S: Stream = Stream::DEFAULT;

fn seed() -> u64 {
    if let Some(s) = std::env::var("RUSTCCL_TEST_SEED").ok().and_then(|s| s.parse().ok()) {
        return s;
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64
}

fn run_procs(scenario: &str, nranks: i32, nids: usize, env: &[(&str, &str)]) -> Vec<Outcome> {
    let seed = seed();
    let seed_s = seed.to_string();
    let mut env = env.to_vec();
    env.push(("COLL_SEED", &seed_s));
    let ids: Vec<_> = (0..nids).map(|_| new_id()).collect();
    let ranks: Vec<i32> = (0..nranks).collect();
    let out = finish_all(spawn(scenario, nranks, &ranks, &ids_arg(&ids), &env), LIMIT);
    for o in &out {
        assert!(o.ok(), "{scenario} on {nranks} ranks (RUSTCCL_TEST_SEED={seed}): rank {} failed ({:?})\nstdout:\n{}\nstderr:\n{}", o.rank, o.status, o.stdout, o.stderr);
    }
    out
}

/// Runs `f` on a thread of its own; fails the test if it does not finish in `secs` (a hang).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: did not finish in {secs} s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked (see above)"),
    }
}

fn upload(comm: &Communicator, data: &[u8]) -> DevicePtr {
    let be = comm.backend();
    let p = be.alloc(comm.device().unwrap() as usize, data.len().max(1)).unwrap();
    be.copy_to_device(p, data, S).unwrap();
    p
}

fn download(comm: &Communicator, p: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    comm.backend().copy_from_device(&mut v, p, S).unwrap();
    v
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn as_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

// ---- Processes ---------------------------------------------------------------------------------

#[test]
fn sixty_four_send_recv_pairs_in_one_group() {
    // ceil(64/n) messages to every rank (itself included) per rank: 64 sends and 64 receives
    // per rank with 8 and 4 ranks, 66 with 3; sizes 0..150001 elements of 5 types, some over
    // a FIFO slot; the same through the network transport.
    for (n, env) in [(8, vec![]), (4, vec![]), (3, vec![]), (4, vec![("NCCL_SHM_DISABLE", "1")])] {
        let out = run_procs("group-p2p", n, 1, &env);
        for o in &out {
            let r = o.results();
            assert!(r.len() == 1 && r[0].starts_with("p2p "), "{o:?}");
            let sends: usize = r[0].split_whitespace().nth(1).unwrap().parse().unwrap();
            assert!(sends >= 64, "{}", r[0]);
        }
    }
}

#[test]
fn two_communicators_in_one_group() {
    // A (first id), B = A split with reversed keys, H = A split in halves sharing A's
    // resources, C (second id): collectives and send/recv on all four in one group, then a
    // group interleaving A and C.
    for (n, env) in [(4, vec![]), (3, vec![]), (4, vec![("NCCL_SHM_DISABLE", "1")])] {
        let out = run_procs("group-two-comms", n, 2, &env);
        assert!(out.iter().all(|o| o.results() == ["two-comms ok"]), "{out:?}");
    }
}

#[test]
fn operations_on_different_streams_run_in_issue_order() {
    // AllReduce on stream A, AllReduce of its result on B, AllGather of that on A, no
    // synchronisation between them (on the host backend each completes at return; the device
    // backends order them by events: the same mode runs on the GPU machine).
    let out = run_procs("coll-streams", 3, 1, &[("STREAM_ITERS", "3")]);
    assert!(out.iter().all(|o| o.results() == ["streams: 6 checks, 0 failures"]), "{out:?}");
}

#[test]
fn one_rank_matrix_as_a_process() {
    // The whole correctness matrix on a 1-rank communicator: every collective copies, and
    // every op is applied (PreMulSum multiplies by the scalar, Avg divides by 1).
    let out = run_procs("coll-matrix", 1, 1, &[]);
    assert!(out[0].results()[0].starts_with("checked "), "{out:?}");
}

// ---- Several ranks of one process, one thread ---------------------------------------------------

#[test]
fn one_thread_drives_two_ranks_in_one_group() {
    let comms = Communicator::init_all(&[0, 1]).unwrap();
    within(60, "two ranks from one thread", move || {
        let n = 1001;
        let send: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&(0..n).map(|i| (r * 1000 + i) as f32).collect::<Vec<_>>()))).collect();
        let recv: Vec<_> = (0..2).map(|r| upload(&comms[r], &vec![0xA5; n * 4])).collect();
        group_start();
        for r in 0..2 {
            comms[r].all_reduce(send[r], recv[r], n, DataType::Float32, ReduceOp::Sum, S).unwrap();
        }
        group_end().unwrap();
        let want: Vec<f32> = (0..n).map(|i| (1000 + 2 * i) as f32).collect();
        for r in 0..2 {
            assert_eq!(as_f32(&download(&comms[r], recv[r], n * 4)), want, "rank {r}");
        }

        // A second group: Broadcast from 1, AllGather, ReduceScatter (Max), and a crossing
        // send/recv pair, on both ranks.
        let bc: Vec<_> = (0..2).map(|r| upload(&comms[r], &i32s(&vec![if r == 1 { 42 } else { -1 }; 77]))).collect();
        let ag_in: Vec<_> = (0..2).map(|r| upload(&comms[r], &i32s(&[r as i32 * 10, r as i32 * 10 + 1, r as i32 * 10 + 2]))).collect();
        let ag_out: Vec<_> = (0..2).map(|r| upload(&comms[r], &[0xA5; 24])).collect();
        let rs_in: Vec<_> = (0..2).map(|r| upload(&comms[r], &i32s(&[r as i32, 5 - r as i32, -(r as i32), 7]))).collect();
        let rs_out: Vec<_> = (0..2).map(|r| upload(&comms[r], &[0xA5; 8])).collect();
        let p_in: Vec<_> = (0..2).map(|r| upload(&comms[r], &i32s(&vec![r as i32 + 100; 200_000]))).collect();
        let p_out: Vec<_> = (0..2).map(|r| upload(&comms[r], &vec![0xA5; 800_000])).collect();
        group_start();
        for r in 0..2 {
            let c = &comms[r];
            c.broadcast(bc[r], bc[r], 77, DataType::Int32, 1, S).unwrap();
            c.all_gather(ag_in[r], ag_out[r], 3, DataType::Int32, S).unwrap();
            c.reduce_scatter(rs_in[r], rs_out[r], 2, DataType::Int32, ReduceOp::Max, S).unwrap();
            c.send(p_in[r], 200_000, DataType::Int32, 1 - r as i32, S).unwrap();
            c.recv(p_out[r], 200_000, DataType::Int32, 1 - r as i32, S).unwrap();
        }
        group_end().unwrap();
        for r in 0..2 {
            let c = &comms[r];
            assert_eq!(as_i32(&download(c, bc[r], 77 * 4)), vec![42; 77]);
            assert_eq!(as_i32(&download(c, ag_out[r], 24)), vec![0, 1, 2, 10, 11, 12]);
            let want = if r == 0 { vec![1, 5] } else { vec![0, 7] };
            assert_eq!(as_i32(&download(c, rs_out[r], 8)), want, "rank {r}");
            assert_eq!(as_i32(&download(c, p_out[r], 800_000)), vec![(1 - r) as i32 + 100; 200_000]);
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

#[test]
fn one_thread_drives_four_ranks_and_comms_made_on_threads() {
    // Four ranks of init_all, every collective kind in one group, from one thread.
    let comms = Communicator::init_all(&[0, 1, 2, 3]).unwrap();
    within(60, "four ranks from one thread", move || {
        let n = 4usize;
        let cnt = 5000;
        let ar_in: Vec<_> = (0..n).map(|r| upload(&comms[r], &i32s(&vec![r as i32 + 1; cnt]))).collect();
        let ar_out: Vec<_> = (0..n).map(|r| upload(&comms[r], &vec![0xA5; cnt * 4])).collect();
        let red: Vec<_> = (0..n).map(|r| upload(&comms[r], &f32s(&vec![r as f32 + 1.0; 9]))).collect();
        let a2a_in: Vec<_> = (0..n).map(|r| upload(&comms[r], &i32s(&(0..n as i32).map(|p| r as i32 * 10 + p).collect::<Vec<_>>()))).collect();
        let a2a_out: Vec<_> = (0..n).map(|r| upload(&comms[r], &[0xA5; 16])).collect();
        group_start();
        for r in 0..n {
            let c = &comms[r];
            c.all_reduce(ar_in[r], ar_out[r], cnt, DataType::Int32, ReduceOp::Sum, S).unwrap();
            c.reduce(red[r], red[r], 9, DataType::Float32, ReduceOp::Prod, 2, S).unwrap();
            c.all_to_all(a2a_in[r], a2a_out[r], 1, DataType::Int32, S).unwrap();
        }
        group_end().unwrap();
        for r in 0..n {
            let c = &comms[r];
            assert_eq!(as_i32(&download(c, ar_out[r], cnt * 4)), vec![10; cnt]);
            let want = if r == 2 { vec![24.0; 9] } else { vec![r as f32 + 1.0; 9] };
            assert_eq!(as_f32(&download(c, red[r], 36)), want, "reduce in place, rank {r}");
            assert_eq!(as_i32(&download(c, a2a_out[r], 16)), (0..n as i32).map(|p| p * 10 + r as i32).collect::<Vec<_>>());
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });

    // Two ranks initialised on threads of their own, then driven from this one.
    let id = new_id();
    let hs: Vec<_> = (0..2).map(|r| std::thread::spawn(move || Communicator::init_rank(2, &id, r).unwrap())).collect();
    let comms: Vec<Communicator> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    within(60, "comms made on threads, driven from one", move || {
        let send: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&[r as f32 + 1.0, 2.0, -3.0]))).collect();
        group_start();
        for r in 0..2 {
            comms[r].all_reduce(send[r], send[r], 3, DataType::Float32, ReduceOp::PreMulSum(Scalar::Host(0.5 + r as f64)), S).unwrap();
        }
        group_end().unwrap();
        // 0.5*x0 + 1.5*x1
        for r in 0..2 {
            assert_eq!(as_f32(&download(&comms[r], send[r], 12)), vec![0.5 + 3.0, 4.0, -6.0]);
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

#[test]
fn many_collectives_of_one_communicator_in_one_group() {
    // Four ranks of one process, one thread: two Broadcasts with different roots, a Reduce to
    // rank 1, a small AllReduce (the tree) and one over 4 MiB (the ring, two channels), a
    // ReduceScatter and an AllGather, all of one communicator in one group.
    let comms = Communicator::init_all(&[0, 1, 2, 3]).unwrap();
    within(60, "many collectives in one group", move || {
        let n = 4usize;
        let big = 1_100_000;
        let t = DataType::Int32;
        let ints = |c: &Communicator, v: Vec<i32>| upload(c, &i32s(&v));
        let bufs: Vec<Vec<DevicePtr>> = (0..n)
            .map(|r| {
                let c = &comms[r];
                let ri = r as i32;
                vec![
                    ints(c, vec![ri + 10; 5]),
                    ints(c, vec![ri + 20; 6]),
                    ints(c, vec![ri + 1; 7]),
                    ints(c, vec![0; 7]),
                    ints(c, vec![ri + 1; 9]),
                    ints(c, vec![0; 9]),
                    ints(c, vec![ri + 1; big]),
                    ints(c, vec![0; big]),
                    ints(c, (0..12).map(|i| i * (ri + 1)).collect()),
                    ints(c, vec![0; 3]),
                    ints(c, vec![ri; 2]),
                    ints(c, vec![0; 8]),
                ]
            })
            .collect();
        group_start();
        for r in 0..n {
            let (c, b) = (&comms[r], &bufs[r]);
            c.broadcast(b[0], b[0], 5, t, 0, S).unwrap();
            c.broadcast(b[1], b[1], 6, t, 2, S).unwrap();
            c.reduce(b[2], b[3], 7, t, ReduceOp::Sum, 1, S).unwrap();
            c.all_reduce(b[4], b[5], 9, t, ReduceOp::Prod, S).unwrap();
            c.all_reduce(b[6], b[7], big, t, ReduceOp::Sum, S).unwrap();
            c.reduce_scatter(b[8], b[9], 3, t, ReduceOp::Max, S).unwrap();
            c.all_gather(b[10], b[11], 2, t, S).unwrap();
        }
        group_end().unwrap();
        for r in 0..n {
            let (c, b) = (&comms[r], &bufs[r]);
            assert_eq!(as_i32(&download(c, b[0], 20)), vec![10; 5]);
            assert_eq!(as_i32(&download(c, b[1], 24)), vec![22; 6]);
            let want = if r == 1 { vec![10; 7] } else { vec![0; 7] };
            assert_eq!(as_i32(&download(c, b[3], 28)), want, "reduce, rank {r}");
            assert_eq!(as_i32(&download(c, b[5], 36)), vec![24; 9]);
            assert_eq!(as_i32(&download(c, b[7], big * 4)), vec![10; big]);
            assert_eq!(as_i32(&download(c, b[9], 12)), (0..3).map(|i| (r * 3 + i) as i32 * 4).collect::<Vec<_>>());
            assert_eq!(as_i32(&download(c, b[11], 32)), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

// ---- Count 0, one rank -------------------------------------------------------------------------

#[test]
fn count_zero_collectives_are_no_ops() {
    // Called on one rank of two only, outside a group: a no-op returns at once (anything else
    // would wait for the other rank). With NULL buffers, and with real buffers left untouched.
    let comms = Communicator::init_all(&[0, 1]).unwrap();
    within(60, "count 0", move || {
        let c = &comms[0];
        let p = upload(c, &[0x5A; 64]);
        for (s, r) in [(DevicePtr::NULL, DevicePtr::NULL), (p, p.offset(32))] {
            let f = DataType::Float32;
            c.all_reduce(s, r, 0, f, ReduceOp::Sum, S).unwrap();
            c.all_reduce(s, r, 0, f, ReduceOp::PreMulSum(Scalar::Host(2.0)), S).unwrap();
            c.broadcast(s, r, 0, f, 1, S).unwrap();
            c.reduce(s, r, 0, f, ReduceOp::Max, 1, S).unwrap();
            c.all_gather(s, r, 0, f, S).unwrap();
            c.reduce_scatter(s, r, 0, f, ReduceOp::Avg, S).unwrap();
            c.all_to_all(s, r, 0, f, S).unwrap();
            c.all_to_allv(s, &[0, 0], &[0, 0], r, &[0, 0], &[0, 0], f, S).unwrap();
            c.gather(s, r, 0, f, 0, S).unwrap();
            c.gather(s, r, 0, f, 1, S).unwrap();
            c.scatter(s, r, 0, f, 0, S).unwrap();
            c.scatter(s, r, 0, f, 1, S).unwrap();
        }
        assert_eq!(download(c, p, 64), vec![0x5A; 64], "a count 0 collective wrote to a buffer");
        // Inside a group, on both ranks, mixed with real work.
        let q: Vec<_> = (0..2).map(|r| upload(&comms[r], &i32s(&[r as i32 + 1; 3]))).collect();
        group_start();
        for r in 0..2 {
            comms[r].all_reduce(DevicePtr::NULL, DevicePtr::NULL, 0, DataType::Int8, ReduceOp::Sum, S).unwrap();
            comms[r].all_reduce(q[r], q[r], 3, DataType::Int32, ReduceOp::Sum, S).unwrap();
            comms[r].all_gather(DevicePtr::NULL, DevicePtr::NULL, 0, DataType::Int8, S).unwrap();
        }
        group_end().unwrap();
        for r in 0..2 {
            assert_eq!(as_i32(&download(&comms[r], q[r], 12)), vec![3; 3]);
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

#[test]
fn one_rank_communicators_copy_and_apply_the_op() {
    let comm = Communicator::init_rank(1, &new_id(), 0).unwrap();
    within(60, "one rank", move || {
        let c = &comm;
        let x = [1.5f32, -2.0, 3.25, 0.0, 7.0];
        let src = upload(c, &f32s(&x));
        let dst = upload(c, &[0xA5; 20]);
        let scalar = upload(c, &f32s(&[0.5]));
        let f = DataType::Float32;
        let cases: Vec<(ReduceOp, f32)> = vec![
            (ReduceOp::Sum, 1.0),
            (ReduceOp::Prod, 1.0),
            (ReduceOp::Min, 1.0),
            (ReduceOp::Max, 1.0),
            (ReduceOp::Avg, 1.0),
            (ReduceOp::PreMulSum(Scalar::Host(3.0)), 3.0),
            (ReduceOp::PreMulSum(Scalar::Device(scalar)), 0.5),
        ];
        let scaled = |k: f32| x.iter().map(|v| v * k).collect::<Vec<_>>();
        for (op, k) in cases {
            c.backend().memset(dst, 0xA5, 20, S).unwrap();
            c.all_reduce(src, dst, 5, f, op, S).unwrap();
            assert_eq!(as_f32(&download(c, dst, 20)), scaled(k), "all_reduce {op:?}");
            c.backend().memset(dst, 0xA5, 20, S).unwrap();
            c.reduce(src, dst, 5, f, op, 0, S).unwrap();
            assert_eq!(as_f32(&download(c, dst, 20)), scaled(k), "reduce {op:?}");
            c.backend().memset(dst, 0xA5, 20, S).unwrap();
            c.reduce_scatter(src, dst, 5, f, op, S).unwrap();
            assert_eq!(as_f32(&download(c, dst, 20)), scaled(k), "reduce_scatter {op:?}");
        }
        // In place, an integer PreMulSum and Avg.
        let isrc = upload(c, &i32s(&[5, -7, 9]));
        c.all_reduce(isrc, isrc, 3, DataType::Int32, ReduceOp::PreMulSum(Scalar::Host(-2.0)), S).unwrap();
        assert_eq!(as_i32(&download(c, isrc, 12)), vec![-10, 14, -18]);
        c.all_reduce(isrc, isrc, 3, DataType::Int32, ReduceOp::Avg, S).unwrap();
        assert_eq!(as_i32(&download(c, isrc, 12)), vec![-10, 14, -18]);
        // The data-movement collectives copy.
        type Call = Box<dyn Fn(&Communicator, DevicePtr, DevicePtr) -> rustccl::Result<()>>;
        let moves: Vec<(&str, Call)> = vec![
            ("broadcast", Box::new(|c, s, d| c.broadcast(s, d, 5, DataType::Float32, 0, S))),
            ("all_gather", Box::new(|c, s, d| c.all_gather(s, d, 5, DataType::Float32, S))),
            ("all_to_all", Box::new(|c, s, d| c.all_to_all(s, d, 5, DataType::Float32, S))),
            ("gather", Box::new(|c, s, d| c.gather(s, d, 5, DataType::Float32, 0, S))),
            ("scatter", Box::new(|c, s, d| c.scatter(s, d, 5, DataType::Float32, 0, S))),
            (
                "send/recv to self",
                Box::new(|c, s, d| {
                    group_start();
                    let a = c.send(s, 5, DataType::Float32, 0, S);
                    let b = c.recv(d, 5, DataType::Float32, 0, S);
                    a.and(b).and(group_end())
                }),
            ),
        ];
        for (name, call) in moves {
            c.backend().memset(dst, 0xA5, 20, S).unwrap();
            call(c, src, dst).unwrap();
            assert_eq!(as_f32(&download(c, dst, 20)), x.to_vec(), "{name}");
        }
        comm.destroy().unwrap();
    });
}

// ---- Bad arguments -----------------------------------------------------------------------------

#[test]
fn bad_arguments_are_refused_and_the_communicator_stays_usable() {
    use ResultCode::*;
    let comms = Communicator::init_all(&[0, 1]).unwrap();
    within(60, "bad arguments", move || {
        let c = &comms[0];
        let p = upload(c, &[0u8; 64]);
        let q = upload(c, &[0u8; 64]);
        let f = DataType::Float32;
        let null = DevicePtr::NULL;
        let expect = |what: &str, r: rustccl::Result<()>, code: ResultCode| {
            let e = r.expect_err(what);
            assert_eq!(e.code, code, "{what}: {e}");
            assert!(!e.message.is_empty(), "{what}: no message");
        };
        expect("all_reduce NULL send", c.all_reduce(null, q, 4, f, ReduceOp::Sum, S), InvalidArgument);
        expect("all_reduce NULL recv", c.all_reduce(p, null, 4, f, ReduceOp::Sum, S), InvalidArgument);
        expect("all_gather NULL recv", c.all_gather(p, null, 4, f, S), InvalidArgument);
        expect("reduce_scatter NULL send", c.reduce_scatter(null, q, 4, f, ReduceOp::Sum, S), InvalidArgument);
        expect("send NULL", c.send(null, 4, f, 1, S), InvalidArgument);
        expect("recv NULL", c.recv(null, 4, f, 1, S), InvalidArgument);
        expect("broadcast root 2", c.broadcast(p, q, 4, f, 2, S), InvalidArgument);
        expect("broadcast root -1", c.broadcast(p, q, 4, f, -1, S), InvalidArgument);
        expect("reduce root 2", c.reduce(p, q, 4, f, ReduceOp::Sum, 2, S), InvalidArgument);
        expect("gather root 3", c.gather(p, q, 4, f, 3, S), InvalidArgument);
        expect("scatter root -1", c.scatter(p, q, 4, f, -1, S), InvalidArgument);
        expect("send peer 2", c.send(p, 4, f, 2, S), InvalidArgument);
        expect("send peer -1", c.send(p, 4, f, -1, S), InvalidArgument);
        expect("recv peer 5", c.recv(q, 4, f, 5, S), InvalidArgument);
        expect("PreMulSum NULL scalar", c.all_reduce(p, q, 4, f, ReduceOp::PreMulSum(Scalar::Device(null)), S), InvalidArgument);
        expect("all_to_allv short lists", c.all_to_allv(p, &[1], &[0], q, &[1], &[0], f, S), InvalidArgument);
        expect("unknown buffer", c.all_reduce(DevicePtr(0xdead_0000), q, 4, f, ReduceOp::Sum, S), InvalidArgument);
        expect("buffer too small", c.all_reduce(p, q, 1000, f, ReduceOp::Sum, S), InvalidArgument);
        // Self send/recv that do not pair up.
        group_start();
        let a = c.send(p, 4, f, 0, S);
        expect("send to self without receive", a.and(group_end()), InvalidUsage);
        group_start();
        let a = c.recv(q, 4, f, 0, S);
        expect("receive from self without send", a.and(group_end()), InvalidUsage);
        group_start();
        let a = c.send(p, 4, f, 0, S).and(c.recv(q, 5, f, 0, S));
        expect("self send and receive of different sizes", a.and(group_end()), InvalidUsage);
        expect("group_end without group_start", group_end(), InvalidUsage);

        // Nothing was left half-done: both ranks still work together.
        let bufs: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&[r as f32 + 1.0; 4]))).collect();
        group_start();
        for r in 0..2 {
            comms[r].all_reduce(bufs[r], bufs[r], 4, f, ReduceOp::Sum, S).unwrap();
        }
        group_end().unwrap();
        for r in 0..2 {
            assert_eq!(as_f32(&download(&comms[r], bufs[r], 16)), vec![3.0; 4]);
        }
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

#[test]
fn buffers_a_rank_does_not_use_may_be_null() {
    // NCCL: Broadcast's send buffer is "only used on rank root and ignored for other ranks",
    // Reduce's receive buffer "only used on rank root"; the same goes for Gather's receive and
    // Scatter's send buffer. A non-root passing NULL there is valid usage.
    let comms = Communicator::init_all(&[0, 1]).unwrap();
    within(60, "NULL unused buffers", move || {
        let f = DataType::Float32;
        let null = DevicePtr::NULL;
        let x: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&[r as f32 + 1.0; 8]))).collect();
        let y: Vec<_> = (0..2).map(|r| upload(&comms[r], &[0xA5; 64])).collect();
        type Call = Box<dyn Fn(&Communicator, usize) -> rustccl::Result<()>>;
        let (xs, ys, y2) = (x.clone(), y.clone(), y.clone());
        let calls: Vec<(&str, Call, Vec<f32>)> = vec![
            ("broadcast, non-root send NULL", Box::new(move |c, r| c.broadcast(if r == 0 { xs[0] } else { null }, ys[r], 8, f, 0, S)), vec![1.0; 8]),
            ("reduce, non-root recv NULL", Box::new(move |c, r| c.reduce(x[r], if r == 0 { y2[0] } else { null }, 8, f, ReduceOp::Sum, 0, S)), vec![3.0; 8]),
        ];
        for (what, call, want) in calls {
            comms[0].backend().memset(y[0], 0xA5, 64, S).unwrap();
            group_start();
            // The non-root first: if it is refused, fail before the root's part is queued
            // (group_end would then run the root's part alone and wait forever).
            call(&comms[1], 1).unwrap_or_else(|e| panic!("{what}: refused: {e}"));
            call(&comms[0], 0).unwrap();
            group_end().unwrap_or_else(|e| panic!("{what}: group_end: {e}"));
            assert_eq!(as_f32(&download(&comms[0], y[0], 32)), want, "{what}");
        }
        let g: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&[r as f32 + 1.0; 2]))).collect();
        let gout = upload(&comms[0], &[0xA5; 16]);
        group_start();
        comms[1].gather(g[1], null, 2, f, 0, S).expect("gather, non-root recv NULL");
        comms[0].gather(g[0], gout, 2, f, 0, S).unwrap();
        group_end().expect("gather, non-root recv NULL");
        assert_eq!(as_f32(&download(&comms[0], gout, 16)), vec![1.0, 1.0, 2.0, 2.0]);
        let sout = upload(&comms[1], &[0xA5; 8]);
        let sout0 = upload(&comms[0], &[0xA5; 8]);
        group_start();
        comms[1].scatter(null, sout, 2, f, 0, S).expect("scatter, non-root send NULL");
        comms[0].scatter(gout, sout0, 2, f, 0, S).unwrap();
        group_end().expect("scatter, non-root send NULL");
        assert_eq!(as_f32(&download(&comms[1], sout, 8)), vec![2.0, 2.0]);
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

#[test]
fn an_error_inside_a_group_fails_the_group_and_runs_nothing() {
    // NCCL: a call that fails its argument checks inside a group records the group's error;
    // the outermost ncclGroupEnd then returns it and launches none of the group's operations
    // (group.cc: `if ((ret = ncclGroupError) != ncclSuccess) goto fail;` then groupCleanup).
    // Here rank 1's part of an AllReduce is refused, so running rank 0's part would wait
    // forever for it.
    let comms = Communicator::init_all(&[0, 1]).unwrap();
    within(30, "group with a refused call", move || {
        let f = DataType::Float32;
        let x: Vec<_> = (0..2).map(|r| upload(&comms[r], &f32s(&[r as f32 + 1.0; 4]))).collect();
        group_start();
        comms[0].all_reduce(x[0], x[0], 4, f, ReduceOp::Sum, S).unwrap();
        let refused = comms[1].all_reduce(DevicePtr::NULL, x[1], 4, f, ReduceOp::Sum, S);
        assert_eq!(refused.unwrap_err().code, ResultCode::InvalidArgument);
        let e = group_end().expect_err("group_end of a group with a refused call");
        assert_eq!(e.code, ResultCode::InvalidArgument, "{e}");
        assert_eq!(as_f32(&download(&comms[0], x[0], 16)), vec![1.0; 4], "rank 0's part ran");
        // The next group starts clean.
        group_start();
        for r in 0..2 {
            comms[r].all_reduce(x[r], x[r], 4, f, ReduceOp::Sum, S).unwrap();
        }
        group_end().unwrap();
        assert_eq!(as_f32(&download(&comms[1], x[1], 16)), vec![3.0; 4]);
        for c in comms.iter() {
            c.destroy().unwrap();
        }
    });
}

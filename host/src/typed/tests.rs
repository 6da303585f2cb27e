//! Unit tests of the typed API on the host backend, ranks as threads (the multi-process
//! tests are in `tests/tests/typed.rs`).

use super::*;
use crate::backend::{DeviceBackend, HostBackend};
use std::sync::Arc;

const S: &Stream = &Stream::DEFAULT;

fn host_env() {
    std::env::set_var("RUSTCCL_BACKEND", "host");
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
}

fn one() -> Comm {
    host_env();
    Comm::init_all(&[0]).unwrap().remove(0)
}

fn one_nonblocking() -> Comm {
    host_env();
    let id = crate::get_unique_id().unwrap();
    Comm::init_config(1, &id, Rank::new(0), 0, &crate::CommConfig::non_blocking()).unwrap()
}

#[test]
fn a_length_mismatch_is_refused_before_anything_is_enqueued() {
    // Non-blocking: anything enqueued would have queued a background job.
    let comm = one_nonblocking();
    drop(crate::comm::jobs::take_launched());
    let (send, mut recv) = ([1.0f32, 2.0, 3.0], [9.0f32; 2]);
    let e = comm.all_reduce(&send, &mut recv, Op::Sum, S).unwrap_err();
    assert_eq!((e.kind(), e.code()), (ErrorKind::Length, crate::ResultCode::InvalidArgument));
    assert!(e.message().contains("3 elements but the receive buffer 2"), "{}", e.message());
    assert!(crate::comm::jobs::take_launched().is_none(), "no job was queued");
    assert_eq!(comm.raw().async_error(), crate::ResultCode::Success);
    assert_eq!(recv, [9.0; 2]);
    assert!(comm.raw().last_error().contains("receive buffer 2"), "recorded as the last error");
    let mut gathered = [0u8; 3];
    assert_eq!(comm.all_gather(&[1u8, 2], &mut gathered, S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.reduce_scatter(&[1u8; 3], &mut [0u8; 2], Op::Sum, S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.all_to_all(&[1u8; 3], &mut [0u8; 2], S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.gather(&[1u8; 2], &mut [0u8; 3], Rank::new(0), S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.scatter(&[1u8; 3], &mut [0u8; 2], Rank::new(0), S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.broadcast(&[1u8; 3], &mut [0u8; 2], Rank::new(0), S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.reduce(&[1u8; 3], &mut [0u8; 2], Op::Sum, Rank::new(0), S).unwrap_err().kind(), ErrorKind::Length);
    assert_eq!(comm.send(&[1u8], Rank::new(1), S).unwrap_err().kind(), ErrorKind::Rank);
    assert!(crate::comm::jobs::take_launched().is_none(), "no job was queued");
    // A correct call then runs (in the background, waited for here).
    comm.all_reduce(&send, &mut [0.0f32; 3], Op::Sum, S).unwrap().wait().unwrap();
}

#[test]
fn a_refused_call_on_two_ranks_driven_by_one_thread_returns_instead_of_waiting_for_the_peer() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    // Enqueued, this blocking 2-rank operation would wait for rank 1 forever.
    let e = comms[0].all_gather(&[1i32; 2], &mut [0i32; 3], S).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Length);
    assert!(e.message().contains("2 ranks x 2"), "{}", e.message());
}

#[test]
fn every_collective_on_two_ranks_as_threads() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let me = comm.rank().get();
                let r = me as i64;
                let mut out = [0i64; 2];
                comm.all_reduce(&[r, 10 * r], &mut out, Op::Sum, S).unwrap().wait().unwrap();
                assert_eq!(out, [1, 10]);
                let mut x = [r + 1; 2];
                comm.all_reduce_in_place(&mut x, Op::PreMulSum(3), S).unwrap().wait().unwrap();
                assert_eq!(x, [9, 9]);
                let mut b = [0u8; 2];
                let root_data: &[u8] = if me == 1 { &[5, 6] } else { &[] };
                comm.broadcast(root_data, &mut b, Rank::new(1), S).unwrap().wait().unwrap();
                assert_eq!(b, [5, 6]);
                let mut red = if me == 0 { vec![0.0f64; 2] } else { vec![] };
                comm.reduce(&[r as f64, 1.0], &mut red, Op::Max, Rank::new(0), S).unwrap().wait().unwrap();
                if me == 0 {
                    assert_eq!(red, [1.0, 1.0]);
                }
                let mut g = [0u32; 4];
                comm.all_gather(&[me, me + 10], &mut g, S).unwrap().wait().unwrap();
                assert_eq!(g, [0, 10, 1, 11]);
                let mut blocks = [me * 7; 2];
                comm.all_gather_in_place(&mut blocks, S).unwrap().wait().unwrap();
                assert_eq!(blocks, [0, 7]);
                let mut rs = [0i32; 1];
                comm.reduce_scatter(&[1, 2], &mut rs, Op::Sum, S).unwrap().wait().unwrap();
                assert_eq!(rs, [2 * (me as i32 + 1)]);
                let mut a2a = [0u32; 2];
                comm.all_to_all(&[me * 10, me * 10 + 1], &mut a2a, S).unwrap().wait().unwrap();
                assert_eq!(a2a, [me, 10 + me]);
                let mut gathered = if me == 1 { vec![f16::ZERO; 2] } else { vec![] };
                comm.gather(&[f16::from_f32(me as f32)], &mut gathered, Rank::new(1), S).unwrap().wait().unwrap();
                if me == 1 {
                    assert_eq!(gathered, [f16::from_f32(0.0), f16::from_f32(1.0)]);
                }
                let mut part = [bf16::ZERO];
                let src = if me == 0 { vec![bf16::from_f32(1.5), bf16::from_f32(2.5)] } else { vec![] };
                comm.scatter(&src, &mut part, Rank::new(0), S).unwrap().wait().unwrap();
                assert_eq!(part, [bf16::from_f32(1.5 + me as f32)]);
                let mut fp8 = [F8E4M3::from_f32(1.0 + me as f32)];
                comm.all_reduce_in_place(&mut fp8, Op::Sum, S).unwrap().wait().unwrap();
                assert_eq!(fp8[0].to_f32(), 3.0);
            });
        }
    });
}

#[test]
fn a_group_runs_together_and_an_error_inside_cancels_it() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    let mut got = [[0u8; 2]; 2];
    let [g0, g1] = &mut got;
    comms[0]
        .group(|g| {
            g.send(&[1u8, 2], Rank::new(1), S)?;
            g.recv(g0, Rank::new(1), S)?;
            let g = g.on(&comms[1]);
            g.send(&[3u8, 4], Rank::new(0), S)?;
            g.recv(g1, Rank::new(0), S)
        })
        .unwrap();
    assert_eq!(got, [[3, 4], [1, 2]]);

    let (mut untouched, mut wrong) = ([0u8; 2], [0u8; 3]);
    let e = comms[0]
        .group(|g| {
            g.all_reduce_in_place(&mut untouched, Op::Sum, S)?;
            g.on(&comms[1]).all_gather(&[1u8; 2], &mut wrong, S) // wrong length
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Length);
    assert!(!crate::coll::group::in_group(), "the group was closed");
    // Nothing of it ran (had rank 0's all-reduce run alone, it would be waiting for rank 1).
    assert_eq!(untouched, [0, 0]);

    // A closure's own error cancels too.
    let e = comms[0].group(|_| -> Result<()> { Err(Error::new(ErrorKind::InvalidUsage, "changed my mind")) }).unwrap_err();
    assert_eq!(e.message(), "changed my mind");
    assert!(!crate::coll::group::in_group());
}

#[test]
fn groups_do_not_nest_nor_take_single_calls_and_a_panic_closes_them() {
    let comm = one();
    let e = comm.group(|_| comm.group(|_| Ok(()))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(e.message().contains("do not nest"), "{}", e.message());
    let mut x = [1u8];
    let e = comm.group(|_| comm.all_reduce_in_place(&mut x, Op::Sum, S).map(drop)).unwrap_err();
    assert!(e.message().contains("inside a group"), "{}", e.message());
    assert!(!crate::coll::group::in_group());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = comm.group(|g| -> Result<()> {
            g.all_reduce_in_place(&mut x, Op::Sum, S)?;
            panic!("inside the group")
        });
    }));
    assert!(caught.is_err());
    assert!(!crate::coll::group::in_group(), "the unwinding closed the group");
    comm.all_reduce_in_place(&mut x, Op::Sum, S).unwrap().wait().unwrap();
}

#[test]
fn memory_of_another_backend_or_device_is_refused_before_enqueue() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    let other: Arc<dyn DeviceBackend> = Arc::new(HostBackend::with_devices(1));
    let foreign = DeviceBuffer::<f32>::zeroed(&other, 0, 4).unwrap();
    let mut out = comms[0].alloc::<f32>(4).unwrap();
    let e = comms[0].all_reduce(&foreign, &mut out, Op::Sum, S).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory);
    assert!(e.message().contains("another instance of the host backend") && e.message().contains("allocate it with this communicator"), "{}", e.message());
    let mut on_device_1 = comms[1].alloc::<f32>(4).unwrap();
    let e = comms[0].all_reduce_in_place(&mut on_device_1, Op::Sum, S).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory);
    let stream_of_1 = comms[1].stream().unwrap();
    let e = comms[0].all_reduce_in_place(&mut out, Op::Sum, &stream_of_1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn device_buffers_and_non_blocking_operations_poll_and_wait() {
    let comm = one_nonblocking();
    let send = comm.buffer_from(&[1.0f64, 2.0]).unwrap();
    let mut recv = comm.alloc::<f64>(2).unwrap();
    let mut p = comm.all_reduce(&send, &mut recv, Op::Sum, S).unwrap();
    let r = loop {
        if let Some(r) = p.poll() {
            break r;
        }
        std::thread::yield_now();
    };
    r.unwrap();
    drop(p);
    assert_eq!(recv.to_vec().unwrap(), [1.0, 2.0]);
    // A leaked Pending: the buffer still waits for its operation before it is read or freed.
    let mut again = comm.buffer_from(&[4i32; 3]).unwrap();
    std::mem::forget(comm.all_reduce_in_place(&mut again, Op::Sum, S).unwrap());
    assert_eq!(again.to_vec().unwrap(), [4; 3]);
    // Host slices on a non-blocking communicator complete within the call.
    let mut host = [2u8; 2];
    let p = comm.all_reduce_in_place(&mut host, Op::Sum, S).unwrap();
    assert!(p.is_ready());
    p.wait().unwrap();
    // Groups too.
    let mut a = [1u8; 2];
    comm.group(|g| g.all_reduce_in_place(&mut a, Op::Max, S)).unwrap();
    comm.wait_idle().unwrap();
}

#[test]
fn overlapping_host_slices_in_one_group() {
    let comm = one();
    let data = vec![3u32; 8];
    let mut outs = [[0u32; 8], [0u32; 8]];
    let [o1, o2] = &mut outs;
    comm.group(|g| {
        g.all_reduce(&data[..6], &mut o1[..6], Op::Sum, S)?;
        g.all_reduce(&data[2..], &mut o2[2..], Op::Sum, S)
    })
    .unwrap();
    assert_eq!(outs[0][..6], [3; 6]);
    assert_eq!(outs[1][2..], [3; 6]);
}

#[test]
fn lifecycle_abort_revoke_split_and_dropped_init() {
    let comm = one();
    let child = comm.split(Some(1), 0, None).unwrap().unwrap();
    let mut x = [1i32];
    child.all_reduce_in_place(&mut x, Op::Sum, S).unwrap().wait().unwrap();
    comm.revoke().unwrap();
    let e = comm.all_reduce_in_place(&mut x, Op::Sum, S).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Revoked);
    let shrunk = comm.shrink(&[], crate::ShrinkFlags::Default, None).unwrap();
    shrunk.all_reduce_in_place(&mut x, Op::Sum, S).unwrap().wait().unwrap();
    shrunk.finalize().unwrap();
    drop(comm); // revoked: finalized and destroyed anyway
    child.abort_handle().abort();
    drop(child); // aborted from a handle: nothing more to do
    // A non-blocking init dropped before it is waited for is aborted (and does not hang).
    let init = Comm::init_nonblocking(2, &crate::get_unique_id().unwrap(), Rank::new(0), 0, &Default::default()).unwrap();
    assert!(!init.is_ready(), "rank 1 never comes");
    drop(init);
}

#[cfg(feature = "cudarc")]
#[test]
fn cudarc_buffers_and_streams_are_accepted_on_cuda() {
    use ::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
    // Type-checks the cudarc path; runs only where a CUDA device is present.
    fn all_reduce_on(comm: &Comm, stream: &Arc<CudaStream>, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
        let mut out = stream.alloc_zeros::<f32>(y.len()).map_err(|e| Error::new(ErrorKind::Device, e.to_string()))?;
        comm.all_reduce(y, &mut out, Op::Sum, stream)?.wait()?;
        comm.all_reduce_in_place(x, Op::PreMulSum(2.0), stream)?.wait()?;
        let (head, mut out_head) = (y.slice(0..1), out.slice_mut(0..1));
        comm.group(|g| g.all_gather(&head, &mut out_head, stream))
    }
    // On a GPU machine, alone (other tests here set RUSTCCL_BACKEND=host):
    // RUSTCCL_TEST_CUDA=1 RUSTCCL_BACKEND=cuda cargo test --release --features cudarc --lib cudarc_
    if std::env::var("RUSTCCL_TEST_CUDA").as_deref() != Ok("1") {
        println!("SKIPPED: RUSTCCL_TEST_CUDA is not 1 (the cudarc path type-checked)");
        return;
    }
    assert_eq!(std::env::var("RUSTCCL_BACKEND").as_deref(), Ok("cuda"), "run with RUSTCCL_BACKEND=cuda");
    let comm = Comm::init_all(&[0]).unwrap().remove(0);
    let stream = CudaContext::new(0).unwrap().default_stream();
    let mut x = stream.clone_htod(&[1.0f32; 16]).unwrap();
    let y = stream.clone_htod(&[3.0f32; 16]).unwrap();
    all_reduce_on(&comm, &stream, &mut x, &y).unwrap();
    assert_eq!(stream.clone_dtoh(&x).unwrap(), [2.0; 16]);
    let e = comm.all_reduce_in_place(&mut [1.0f32][..], Op::Sum, &stream).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Memory, "host slices on a CUDA communicator");
}

#[test]
fn a_group_of_configured_collectives_on_two_ranks_as_threads() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    let ring = CollConfig::new().algorithms("ring").max_channels(1).profiler_tag(9);
    let tree = CollConfig::new().algorithms("TREE").profiler_tag(5);
    std::thread::scope(|s| {
        for comm in comms {
            let (ring, tree) = (&ring, &tree);
            s.spawn(move || {
                let me = comm.rank().get();
                let (mut sum, mut g, mut b, mut a2a, mut rs, mut part) = ([0i64; 2], [0u32; 4], [0u8; 1], [0u32; 2], [0i32; 1], [0u32; 1]);
                let mut red = if me == 0 { vec![0.0f32; 1] } else { vec![] };
                let mut gathered = if me == 1 { vec![0u32; 2] } else { vec![] };
                let root_data: &[u8] = if me == 0 { &[8] } else { &[] };
                let scatter_src = if me == 0 { vec![40u32, 41] } else { vec![] };
                let (ar, ag, red_in, rs_in) = ([me as i64, 1], [me, me + 10], [1.5f32], [1, 2]);
                let (a2a_in, gather_in) = ([me * 10, me * 10 + 1], [me + 20]);
                let (tagged, none) = (CollConfig::new().profiler_tag(1), CollConfig::new());
                comm.group(|grp| {
                    grp.all_reduce_with(&ar, &mut sum, Op::Sum, S, tree)?;
                    grp.all_gather_with(&ag, &mut g, S, ring)?;
                    grp.broadcast_with(root_data, &mut b, Rank::new(0), S, ring)?;
                    grp.reduce_with(&red_in, &mut red, Op::Sum, Rank::new(0), S, ring)?;
                    grp.reduce_scatter_with(&rs_in, &mut rs, Op::Sum, S, ring)?;
                    grp.all_to_all_with(&a2a_in, &mut a2a, S, &tagged)?;
                    grp.gather_with(&gather_in, &mut gathered, Rank::new(1), S, &none)?;
                    grp.scatter_with(&scatter_src, &mut part, Rank::new(0), S, &none)
                })
                .unwrap();
                assert_eq!((sum, g, b, a2a, rs, part), ([1, 2], [0, 10, 1, 11], [8], [me, 10 + me], [2 * (me as i32 + 1)], [40 + me]));
                if me == 0 {
                    assert_eq!(red, [3.0]);
                } else {
                    assert_eq!(gathered, [20, 21]);
                }

                // A config the call cannot honour is refused inside the group, before anything
                // is queued; the group then ends with that error.
                let (mut g2, mine) = ([7u32; 4], [me, me]);
                let e = comm.group(|grp| grp.all_gather_with(&mine, &mut g2, S, tree)).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                assert!(e.message().contains("names no algorithm that AllGather has"), "{}", e.message());
                assert_eq!(g2, [7; 4]);
                // The communicator still works.
                comm.all_reduce(&[1i64, 1], &mut sum, Op::Sum, S).unwrap().wait().unwrap();
                assert_eq!(sum, [2, 2]);
            });
        }
    });
}

#[test]
fn every_collective_with_a_config_on_two_ranks_as_threads() {
    host_env();
    let comms = Comm::init_all(&[0, 1]).unwrap();
    let ring = CollConfig::new().algorithms("ring").max_channels(1).profiler_tag(9);
    let tree = CollConfig::new().algorithms("TREE_SIMPLE").min_channels(2);
    let plain = CollConfig::new().profiler_tag(3);
    std::thread::scope(|s| {
        for comm in comms {
            let (ring, tree, plain) = (&ring, &tree, &plain);
            s.spawn(move || {
                let me = comm.rank().get();
                let r = me as i64;
                let mut out = [0i64; 2];
                comm.all_reduce_with(&[r, 10 * r], &mut out, Op::Sum, S, tree).unwrap().wait().unwrap();
                assert_eq!(out, [1, 10]);
                comm.all_reduce_with(&[r, 1], &mut out, Op::Max, S, ring).unwrap().wait().unwrap();
                assert_eq!(out, [1, 1]);
                let mut b = [0u8; 2];
                let root_data: &[u8] = if me == 1 { &[5, 6] } else { &[] };
                comm.broadcast_with(root_data, &mut b, Rank::new(1), S, ring).unwrap().wait().unwrap();
                assert_eq!(b, [5, 6]);
                let mut red = if me == 0 { vec![0.0f64; 2] } else { vec![] };
                comm.reduce_with(&[r as f64, 1.0], &mut red, Op::Sum, Rank::new(0), S, ring).unwrap().wait().unwrap();
                if me == 0 {
                    assert_eq!(red, [1.0, 2.0]);
                }
                let mut g = [0u32; 4];
                comm.all_gather_with(&[me, me + 10], &mut g, S, ring).unwrap().wait().unwrap();
                assert_eq!(g, [0, 10, 1, 11]);
                let mut rs = [0i32; 1];
                comm.reduce_scatter_with(&[1, 2], &mut rs, Op::Sum, S, ring).unwrap().wait().unwrap();
                assert_eq!(rs, [2 * (me as i32 + 1)]);
                let mut a2a = [0u32; 2];
                comm.all_to_all_with(&[me * 10, me * 10 + 1], &mut a2a, S, plain).unwrap().wait().unwrap();
                assert_eq!(a2a, [me, 10 + me]);
                let mut gathered = if me == 1 { vec![0u32; 2] } else { vec![] };
                comm.gather_with(&[me], &mut gathered, Rank::new(1), S, plain).unwrap().wait().unwrap();
                if me == 1 {
                    assert_eq!(gathered, [0, 1]);
                }
                let mut part = [0u32];
                let src = if me == 0 { vec![4u32, 5] } else { vec![] };
                comm.scatter_with(&src, &mut part, Rank::new(0), S, plain).unwrap().wait().unwrap();
                assert_eq!(part, [4 + me]);

                // A selection the call cannot honour: refused before anything is enqueued,
                // recorded as the last error; with fall_back the call runs.
                let mut g2 = [7u32; 4];
                let e = comm.all_gather_with(&[me, me], &mut g2, S, tree).unwrap_err();
                assert_eq!((e.kind(), e.code()), (ErrorKind::InvalidArgument, crate::ResultCode::InvalidArgument));
                assert!(e.message().contains("names no algorithm that AllGather has"), "{}", e.message());
                assert!(comm.raw().last_error().contains("AllGather"), "recorded as the last error");
                assert_eq!(g2, [7; 4]);
                let e = comm.all_to_all_with(&[me, me], &mut a2a, S, ring).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                let e = comm.all_reduce_with(&[r], &mut out[..1], Op::Sum, S, &CollConfig::new().algorithms("RING+TREE")).unwrap_err();
                assert!(e.message().contains("selects nothing"), "{}", e.message());
                comm.all_gather_with(&[me, me], &mut g2, S, &tree.clone().fall_back(true)).unwrap().wait().unwrap();
                assert_eq!(g2, [0, 0, 1, 1]);
            });
        }
    });
}

#[test]
fn a_config_reaches_the_tasks_of_the_call() {
    use crate::coll::options::{self, CollOptions};
    let cfg = CollConfig::new().algorithms("tree").max_channels(3).profiler_tag(11);
    let o = cfg.options(crate::spec::Collective::AllReduce, "AllReduce").unwrap();
    assert_eq!((o.max_channels, o.profiler_tag), (Some(3), 11));
    assert!(o.allows(rustccl_plugin_api::Algorithm::Tree, rustccl_plugin_api::Protocol::Ll));
    assert!(!o.allows(rustccl_plugin_api::Algorithm::Ring, rustccl_plugin_api::Protocol::Simple));
    assert_eq!(options::scoped(o, options::current), o);
    assert_eq!(CollConfig::new().options(crate::spec::Collective::Gather, "Gather").unwrap(), CollOptions::default());
}

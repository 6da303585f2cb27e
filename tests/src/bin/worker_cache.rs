//! The plan cache scenario (`plan-cache`): single collectives whose plans the host backend
//! caches by shape, each called several times and interleaved with calls that differ from a
//! cached one in one thing only (count, type, operator, PreMulSum scalar, root, buffers, in
//! place or not); every result is checked, so a call served a stale plan (or a stale buffer,
//! scalar or reducer) shows as a wrong value. Prints `RESULT checked N calls`.

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{CommConfig, Communicator, Error, ReduceOp, Scalar, UniqueId};

const S: Stream = Stream::DEFAULT;

/// The value rank `r` contributes at element `i` of call `call` (small integers: exact in f32).
fn input(call: usize, r: usize, i: usize) -> i64 {
    ((call * 7 + r * 3 + i) % 13) as i64 + 1
}

fn encode(dtype: DataType, vals: &[i64]) -> Vec<u8> {
    match dtype {
        DataType::Float32 => vals.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        DataType::Int32 => vals.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        DataType::Float64 => vals.iter().flat_map(|&v| (v as f64).to_le_bytes()).collect(),
        other => panic!("plan-cache: no encoding for {other}"),
    }
}

pub fn plan_cache(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, crate::worker_coll::test_device(rank), &CommConfig::default())?;
    let be = std::sync::Arc::clone(comm.backend());
    let dev = comm.device()? as usize;
    let (n, me) = (nranks as usize, rank as usize);
    let a = be.alloc(dev, 1 << 20)?;
    let b = be.alloc(dev, 1 << 20)?;
    let scalar_buf = be.alloc(dev, 64)?;
    let mut call = 0usize;
    let mut checked = 0usize;
    // Runs one collective: fills the send buffer with this call's input, poisons the receive
    // buffer, runs `f`, and compares `len` elements at `recv` with `want`.
    let mut check = |what: &str, dtype: DataType, send: DevicePtr, send_len: usize, recv: DevicePtr, want: &dyn Fn(usize, usize) -> Option<i64>, len: usize, f: &dyn Fn(DevicePtr, DevicePtr) -> Result<(), Error>| -> Result<(), Error> {
        call += 1;
        let e = dtype.size();
        if send != recv {
            be.copy_to_device(recv, &vec![0xa5u8; len * e], S)?;
        }
        let mine: Vec<i64> = (0..send_len).map(|i| input(call, me, i)).collect();
        be.copy_to_device(send, &encode(dtype, &mine), S)?;
        f(send, recv)?;
        be.synchronize(S)?;
        let mut got = vec![0u8; len * e];
        be.copy_from_device(&mut got, recv, S)?;
        for i in 0..len {
            let Some(w) = want(call, i) else { continue };
            let expect = encode(dtype, &[w]);
            if got[i * e..(i + 1) * e] != expect[..] {
                return Err(Error::internal(format!(
                    "plan-cache: {what} (call {call}, {dtype}) element {i}: got bytes {:?}, expected {w} ({expect:?})",
                    &got[i * e..(i + 1) * e]
                )));
            }
        }
        checked += 1;
        Ok(())
    };
    let sum = |call: usize, i: usize| (0..n).map(|r| input(call, r, i)).sum::<i64>();
    let max = |call: usize, i: usize| (0..n).map(|r| input(call, r, i)).max().unwrap();
    for round in 0..3 {
        // The same shape again and again (the cache's hits), out of place and in place, and at
        // other addresses.
        for (send, recv) in [(a, b), (b, b), (a.offset(64), b.offset(4096)), (a, a)] {
            check("AllReduce sum", DataType::Float32, send, 4, recv, &|c, i| Some(sum(c, i)), 4, &|s, r| {
                comm.all_reduce(s, r, 4, DataType::Float32, ReduceOp::Sum, S)
            })?;
        }
        // One thing different each time: count, type (same bytes), operator, scalar.
        for count in [5usize, 4, 4096, 3] {
            check("AllReduce count", DataType::Float32, a, count, b, &|c, i| Some(sum(c, i)), count, &|s, r| {
                comm.all_reduce(s, r, count, DataType::Float32, ReduceOp::Sum, S)
            })?;
        }
        check("AllReduce int32", DataType::Int32, a, 4, b, &|c, i| Some(sum(c, i)), 4, &|s, r| comm.all_reduce(s, r, 4, DataType::Int32, ReduceOp::Sum, S))?;
        check("AllReduce f64", DataType::Float64, a, 2, b, &|c, i| Some(sum(c, i)), 2, &|s, r| comm.all_reduce(s, r, 2, DataType::Float64, ReduceOp::Sum, S))?;
        check("AllReduce max", DataType::Float32, a, 4, b, &|c, i| Some(max(c, i)), 4, &|s, r| comm.all_reduce(s, r, 4, DataType::Float32, ReduceOp::Max, S))?;
        for k in [2.0f64, 3.0, 2.0] {
            check("AllReduce premulsum", DataType::Float32, a, 4, b, &|c, i| Some(k as i64 * sum(c, i)), 4, &|s, r| {
                comm.all_reduce(s, r, 4, DataType::Float32, ReduceOp::PreMulSum(Scalar::Host(k)), S)
            })?;
        }
        for k in [4.0f32, 5.0] {
            be.copy_to_device(scalar_buf, &k.to_le_bytes(), S)?;
            check("AllReduce premulsum device", DataType::Float32, a, 4, b, &|c, i| Some(k as i64 * sum(c, i)), 4, &|s, r| {
                comm.all_reduce(s, r, 4, DataType::Float32, ReduceOp::PreMulSum(Scalar::Device(scalar_buf)), S)
            })?;
        }
        // Roots: the same shape with each root in turn.
        for root in (0..n).chain([0]) {
            check("Broadcast", DataType::Float32, a, 4, b, &|c, i| Some(input(c, root, i)), 4, &|s, r| comm.broadcast(s, r, 4, DataType::Float32, root as i32, S))?;
            check("Reduce", DataType::Float32, a, 4, b, &|c, i| (me == root).then(|| sum(c, i)), 4, &|s, r| {
                comm.reduce(s, r, 4, DataType::Float32, ReduceOp::Sum, root as i32, S)
            })?;
        }
        for count in [2usize, 3, 2] {
            check("AllGather", DataType::Float32, a, count, b, &|c, i| Some(input(c, i / count, i % count)), count * n, &|s, r| {
                comm.all_gather(s, r, count, DataType::Float32, S)
            })?;
            check("ReduceScatter", DataType::Float32, a, count * n, b, &|c, i| Some(sum(c, me * count + i)), count, &|s, r| {
                comm.reduce_scatter(s, r, count, DataType::Float32, ReduceOp::Sum, S)
            })?;
        }
        // In place, and large enough for the host backend's single copies
        // (`exec::host::single_copy`) at their default thresholds; broadcasts from a root that
        // moves each round, out of place and in place.
        for count in [3usize, 70_000, 70_000 / 4] {
            let at = b.offset((me * count * 4) as _);
            check("AllGather in place", DataType::Float32, at, count, b, &|c, i| Some(input(c, i / count, i % count)), count * n, &|s, r| {
                comm.all_gather(s, r, count, DataType::Float32, S)
            })?;
            check("AllGather", DataType::Float32, a, count, b, &|c, i| Some(input(c, i / count, i % count)), count * n, &|s, r| {
                comm.all_gather(s, r, count, DataType::Float32, S)
            })?;
            let root = round % n;
            for (send, recv) in [(a, b), (b, b)] {
                check("Broadcast large", DataType::Float32, send, count, recv, &|c, i| Some(input(c, root, i)), count, &|s, r| {
                    comm.broadcast(s, r, count, DataType::Float32, root as i32, S)
                })?;
            }
        }
    }
    let single_copies = comm.single_copy_calls();
    comm.destroy()?;
    println!("RESULT checked {checked} calls");
    println!("RESULT single_copies {single_copies}");
    Ok(())
}

//! Scenario `profiled`: a few operations for a profiler plugin to see — an all-reduce and a
//! broadcast outside a group, and a group with an all-reduce and a send/receive ring — each
//! checked, then the communicator destroyed (the profiler is finalized). The communicator is
//! named by `RUSTCCL_TEST_COMM_NAME` if set; with `RUSTCCL_TEST_PROFILED_SMALL` set, a small
//! all-reduce outside a group comes last.

use rustccl::backend::{DevicePtr, Stream};
use rustccl::types::DataType;
use rustccl::{group_end, group_start, CommConfig, Communicator, Error, ReduceOp, UniqueId};

const S: Stream = Stream::DEFAULT;

fn upload(comm: &Communicator, data: &[i32]) -> Result<DevicePtr, Error> {
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    let be = comm.backend();
    let p = be.alloc(comm.device()? as usize, bytes.len().max(1))?;
    be.copy_to_device(p, &bytes, S)?;
    Ok(p)
}

fn download(comm: &Communicator, p: DevicePtr, n: usize) -> Result<Vec<i32>, Error> {
    let mut v = vec![0u8; n * 4];
    comm.backend().copy_from_device(&mut v, p, S)?;
    Ok(v.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
}

fn expect(what: &str, got: Vec<i32>, want: Vec<i32>) -> Result<(), Error> {
    if got != want {
        return Err(Error::internal(format!("{what}: got {:?}… want {:?}…", &got[..4.min(got.len())], &want[..4.min(want.len())])));
    }
    Ok(())
}

pub fn profiled(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    // RUSTCCL_TEST_COMM_NAME: the config's comm name (a profiler gets it at init).
    let config = CommConfig { comm_name: std::env::var("RUSTCCL_TEST_COMM_NAME").ok(), ..CommConfig::default() };
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, 0, &config)?;
    let (n, me) = (nranks as usize, rank as usize);
    let cnt = 300_000usize; // several slots of 512 KiB on the network
    let input: Vec<i32> = (0..cnt as i32).map(|i| i % 17 + me as i32).collect();
    let sum: Vec<i32> = (0..cnt as i32).map(|i| (i % 17) * n as i32 + (n * (n - 1) / 2) as i32).collect();
    let a_in = upload(&comm, &input)?;
    let a_out = upload(&comm, &vec![0; cnt])?;
    comm.all_reduce(a_in, a_out, cnt, DataType::Int32, ReduceOp::Sum, S)?;
    expect("all_reduce", download(&comm, a_out, cnt)?, sum.clone())?;
    let b = upload(&comm, &if me == 0 { (0..cnt as i32).collect() } else { vec![0; cnt] })?;
    comm.broadcast(b, b, cnt, DataType::Int32, 0, S)?;
    expect("broadcast", download(&comm, b, cnt)?, (0..cnt as i32).collect())?;
    let s_in = upload(&comm, &vec![me as i32 * 7 + 1; cnt])?;
    let s_out = upload(&comm, &vec![0; cnt])?;
    let g_out = upload(&comm, &vec![0; cnt])?;
    group_start();
    let calls = (|| {
        comm.all_reduce(a_in, g_out, cnt, DataType::Int32, ReduceOp::Sum, S)?;
        comm.send(s_in, cnt, DataType::Int32, ((me + 1) % n) as i32, S)?;
        comm.recv(s_out, cnt, DataType::Int32, ((me + n - 1) % n) as i32, S)
    })();
    calls.and(group_end())?;
    expect("group all_reduce", download(&comm, g_out, cnt)?, sum.clone())?;
    expect("recv", download(&comm, s_out, cnt)?, vec![((me + n - 1) % n) as i32 * 7 + 1; cnt])?;
    if std::env::var("RUSTCCL_TEST_PROFILED_SMALL").is_ok() {
        // A small all-reduce outside a group (the host backend's board, where it is used).
        comm.all_reduce(a_in, g_out, 64, DataType::Int32, ReduceOp::Sum, S)?;
        expect("small all_reduce", download(&comm, g_out, 64)?, sum[..64].to_vec())?;
    }
    comm.destroy()?;
    println!("RESULT profiled ok");
    Ok(())
}

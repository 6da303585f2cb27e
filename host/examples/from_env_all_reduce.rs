//! An all-reduce between processes that a cluster launcher started: each process builds its
//! communicator with `Communicator::from_env()` (torchrun's, Slurm's or Open MPI's variables,
//! and a rendezvous address; see `rustccl::comm::from_env`), sums a buffer over every rank and
//! checks the result.
//!
//! With torchrun (any program, not only Python, with `--no-python`):
//!
//! ```text
//! cargo build --release --example from_env_all_reduce
//! RUSTCCL_BACKEND=host torchrun --nproc-per-node 4 --no-python target/release/examples/from_env_all_reduce
//! ```
//!
//! By hand, the variables torchrun would set (2 processes on this machine):
//!
//! ```text
//! for r in 0 1; do
//!   RUSTCCL_BACKEND=host RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
//!     target/release/examples/from_env_all_reduce &
//! done; wait
//! ```
//!
//! Under Slurm: `srun -n 8 env MASTER_ADDR=<first node> MASTER_PORT=29500 ./from_env_all_reduce`
//! (Slurm does not tell a process where rank 0 runs, so the address has to be given).
//!
//! On GPUs each process takes GPU `LOCAL_RANK % <GPUs>`; `RUSTCCL_BACKEND=host` runs on host
//! memory. Prints one line per rank and exits with status 1, and the error, on failure.

use rustccl::types::DataType;
use rustccl::{Communicator, ReduceOp};

/// Elements summed (floats).
const COUNT: usize = 1 << 16;

fn main() {
    if let Err(e) = run() {
        eprintln!("from_env_all_reduce: {e}");
        std::process::exit(1);
    }
}

fn run() -> rustccl::Result<()> {
    let comm = Communicator::from_env()?;
    let (rank, nranks) = (comm.user_rank()?, comm.count()?);
    let backend = std::sync::Arc::clone(comm.backend());
    let device = comm.device()? as usize;
    let stream = backend.create_stream(device)?;
    let bytes = COUNT * 4;
    let buf = backend.alloc(device, bytes)?;

    // Element i of rank r holds i + r: the sum over ranks is n*i + n(n-1)/2.
    let input: Vec<u8> = (0..COUNT).flat_map(|i| ((i % 1000) as f32 + rank as f32).to_ne_bytes()).collect();
    backend.copy_to_device(buf, &input, stream)?;
    comm.all_reduce(buf, buf, COUNT, DataType::Float32, ReduceOp::Sum, stream)?;
    let mut out = vec![0u8; bytes];
    backend.copy_from_device(&mut out, buf, stream)?;
    backend.synchronize(stream)?;

    let n = nranks as f32;
    let offset = (nranks * (nranks - 1) / 2) as f32;
    let wrong = out
        .chunks_exact(4)
        .enumerate()
        .filter(|(i, w)| f32::from_ne_bytes((*w).try_into().unwrap()) != (i % 1000) as f32 * n + offset)
        .count();
    backend.free(buf)?;
    backend.destroy_stream(stream)?;
    comm.destroy()?;
    if wrong > 0 {
        return Err(rustccl::Error::internal(format!("rank {rank}: {wrong} of {COUNT} elements are wrong")));
    }
    println!("rank {rank} of {nranks} on {} device {device}: all_reduce of {COUNT} floats ok", backend.kind());
    Ok(())
}

//! `tests/gpu/sym_nccl_header.c` (collectives on symmetric-memory windows, written against
//! NCCL's `nccl.h` alone; the GPU script builds it with `-DWITH_CUDA` against NVIDIA's header)
//! built without CUDA against rustccl's `nccl.h` and the `libnccl.so` this package builds, and
//! run as 2 and 3 processes on the host backend. The ranks get their unique id as on the GPU
//! machine: each calls `ncclGetUniqueId` with `NCCL_COMM_ID=127.0.0.1:<port>` set.

#[allow(dead_code)]
mod common;

use std::path::Path;
use std::time::Duration;

/// A port nothing listens on now (rank 0 listens there at init).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn c_program_against_nccl_h_alone_runs_collectives_on_windows_on_the_host_backend() {
    let exe = common::build_source("sym_nccl_header", Path::new("tests/gpu/sym_nccl_header.c"));
    for n in [2, 3] {
        let comm_id = format!("127.0.0.1:{}", free_port());
        let children = common::spawn_ranks(&exe, n, &[("NCCL_COMM_ID", comm_id)]);
        let what = format!("sym_nccl_header with {n} ranks");
        common::expect_clean_by(children, Duration::from_secs(180), &what, |rank, out| {
            out.contains(&format!("RESULT sym_nccl_header rank {rank} ok ")) && !out.contains("FAIL")
        });
    }
}

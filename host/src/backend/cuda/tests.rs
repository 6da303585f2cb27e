//! Tests that need no GPU: the pieces of the CUDA backend that are plain computation, and the
//! refusal without a driver. The GPU tests are in `host/tests/cuda_backend.rs`.

use super::*;
use crate::types::DataType;

/// Without a driver the backend is a clear error; with one (the GPU machine) it starts.
#[test]
fn backend_without_a_driver_is_a_clear_error() {
    match CudaBackend::new() {
        Ok(b) => assert_eq!(b.kind(), BackendKind::Cuda),
        Err(e) => {
            assert_eq!(e.code, crate::error::ResultCode::UnhandledCudaError);
            assert!(e.message.contains("CUDA driver") || e.message.contains("cuInit"), "{}", e.message);
        }
    }
}

/// Compiles the collective interpreter for a spread of operators and types when NVRTC can be
/// found (no GPU needed); skipped, with the reason printed, where it cannot (as on CI).
#[test]
fn exec_kernel_compiles_with_nvrtc_when_present() {
    if let Err(e) = nvrtc::Nvrtc::get() {
        eprintln!("skipped: {}", e.message);
        return;
    }
    use rustccl_kernels::DeviceOp::*;
    for (op, dtype) in [
        (Sum, DataType::Uint8),
        (Sum, DataType::Float32),
        (Prod, DataType::Float64),
        (Min, DataType::Float16),
        (Max, DataType::Float8e4m3),
        (PreMulSum, DataType::Bfloat16),
        (SumPostDiv, DataType::Int32),
    ] {
        let bytes = module::compile_exec_only(90, op, dtype).unwrap_or_else(|e| panic!("{op:?} {dtype}: {}", e.message));
        assert!(bytes > 10_000, "{op:?} {dtype}: {bytes}");
    }
}

/// The generated ABI header asserts the Rust layout to NVRTC: a C struct that drifted from
/// its Rust twin (here `RustcclExecStep::ctx` declared wider than `ExecStep::ctx`) does not
/// compile. Skipped where NVRTC cannot be found (as on CI, where the kernels crate's tests
/// check the header's layout instead).
#[test]
fn exec_kernel_with_a_drifted_abi_header_does_not_compile_with_nvrtc() {
    if let Err(e) = nvrtc::Nvrtc::get() {
        eprintln!("skipped: {}", e.message);
        return;
    }
    let abi = rustccl_kernels::exec::ABI_HEADER;
    let good: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    let drifted_text = rustccl_kernels::source(abi).unwrap().replace("  unsigned short ctx;\n", "  u32 ctx;\n");
    assert_ne!(drifted_text, rustccl_kernels::source(abi).unwrap());
    let drifted: Vec<(&str, &str)> =
        good.iter().map(|&(n, t)| (n, if n == abi { drifted_text.as_str() } else { t })).collect();
    let e = module::compile_exec_with_headers(90, rustccl_kernels::DeviceOp::Sum, DataType::Uint8, &drifted)
        .expect_err("a drifted struct must not compile");
    assert!(
        e.message.contains("RustcclExecStep::ctx: size differs from rustccl_kernels::exec::ExecStep::ctx"),
        "{}",
        e.message
    );
    assert!(e.message.contains("RustcclExecStep::flags: offset differs"), "{}", e.message);
}

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

/// Environment variable: `1` makes a missing NVRTC a failure of the tests that compile the
/// device code, instead of a skip (CI sets it after installing NVRTC from PyPI).
const REQUIRE_NVRTC_ENV: &str = "RUSTCCL_REQUIRE_NVRTC";

/// Whether NVRTC can be loaded; if not, prints why the test is skipped and returns false, or
/// fails the test when [`REQUIRE_NVRTC_ENV`] is `1`.
fn nvrtc_or_skip() -> bool {
    let Err(e) = nvrtc::Nvrtc::get() else {
        return true;
    };
    if std::env::var(REQUIRE_NVRTC_ENV).as_deref() == Ok("1") {
        panic!(
            "{REQUIRE_NVRTC_ENV}=1 but NVRTC cannot be loaded: {}\n\
             To install it without a CUDA toolkit (no GPU needed), from PyPI:\n  \
             pip download --no-deps -d DIR nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96\n  \
             cd DIR && for w in *.whl; do python3 -m zipfile -e \"$w\" .; done\n\
             then set {}=DIR/nvidia/cu13/lib (the headers are found in DIR/nvidia/cu13/include, or \
             set {}); .ci/run does this.",
            e.message,
            nvrtc::NVRTC_PATH_ENV,
            nvrtc::CUDA_INCLUDE_ENV,
        );
    }
    eprintln!("skipped: {} (set {REQUIRE_NVRTC_ENV}=1 to make this a failure)", e.message);
    false
}

/// Compiles the collective interpreter for sm_90 (the H200) with NVRTC (no GPU needed) for
/// every operator and every element type with its own code path, and holds ptxas to the
/// interpreter's design: every entry point ([`rustccl_kernels::exec::ExecEntry`]) compiled, no
/// register spills, no stack frame, no local memory in any function. Prints the registers per
/// thread of each entry point. Skipped, with the reason printed, where NVRTC cannot be found,
/// unless `RUSTCCL_REQUIRE_NVRTC=1` (CI).
#[test]
fn exec_kernel_compiles_with_nvrtc_without_spills() {
    if !nvrtc_or_skip() {
        return;
    }
    use rustccl_kernels::DeviceOp::*;
    // (operator, type, kernel knobs: -D options of an experiment to hold to the same rule).
    let pairs: [(_, _, &[&str]); 7] = [
        (Sum, DataType::Uint8, &[]),
        (Sum, DataType::Float32, &[]),
        (Prod, DataType::Float64, &[]),
        (Min, DataType::Float16, &[]),
        (Max, DataType::Float8e4m3, &[]),
        (PreMulSum, DataType::Bfloat16, &[]),
        (SumPostDiv, DataType::Int32, &[]),
    ];
    for op in rustccl_kernels::DeviceOp::ALL {
        assert!(pairs.iter().any(|p| p.0 == op), "{op:?} is not compiled here");
    }
    // One compile is ~30 s of one core: two at a time where there are two cores.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let cache = crate::backend::rtc::test_kernel_cache();
    let hits = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(op, dtype, extra)) = pairs.get(i) else { break };
                        let start = std::time::Instant::now();
                        let c = module::compile_exec_report(90, op, dtype, extra, cache.as_ref()).map(|(c, hit)| {
                            hits.fetch_add(usize::from(hit), std::sync::atomic::Ordering::Relaxed);
                            c
                        });
                        done.push((i, c, start.elapsed()));
                    }
                    done
                })
            })
            .collect();
        let mut all: Vec<_> = handles.into_iter().flat_map(|h| h.join().expect("compile thread")).collect();
        all.sort_by_key(|r| r.0);
        all
    });
    let mut failures = Vec::new();
    for (i, result, time) in results {
        let (op, dtype, extra) = pairs[i];
        let what = format!("{}/{dtype}{}", op.suffix(), extra.iter().map(|d| format!(" {d}")).collect::<String>());
        let c = match result {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{what}: {}", e.message));
                continue;
            }
        };
        assert_eq!(c.arch, "sm_90", "{what}: NVRTC should build a CUBIN for sm_90");
        assert!(c.image_bytes > 10_000, "{what}: {} bytes", c.image_bytes);
        for entry in rustccl_kernels::exec::ExecEntry::ALL {
            if c.entry(entry).is_none() {
                failures.push(format!("{what}: no ptxas report for the entry point {} in the log:\n{}", entry.name(), c.log));
            }
        }
        for k in rustccl_kernels::symmetric::SymKernel::ALL {
            if !c.functions.iter().any(|f| f.entry && f.name == k.name()) {
                failures.push(format!("{what}: no ptxas report for the symmetric kernel {} in the log:\n{}", k.name(), c.log));
            }
        }
        for k in c.functions.iter().filter(|f| f.entry) {
            eprintln!(
                "{what} sm_90 {}: {} registers per thread, {} bytes stack frame, {}/{} bytes spill stores/loads ({:.1} s)",
                k.name,
                k.registers.map_or("?".to_string(), |r| r.to_string()),
                k.stack_frame,
                k.spill_stores,
                k.spill_loads,
                time.as_secs_f64()
            );
            assert!(k.registers.is_some(), "{what}: no register count for {} in:\n{}", k.name, c.log);
        }
        for f in &c.functions {
            if !f.no_local_memory() {
                failures.push(format!(
                    "{what}: {} uses local memory ({} bytes stack frame, {} bytes spill stores, {} bytes spill \
                     loads, {} bytes cumulative stack, {} bytes lmem); ptxas said:\n{}",
                    f.name, f.stack_frame, f.spill_stores, f.spill_loads, f.cumulative_stack, f.lmem, c.log
                ));
            }
        }
    }
    if let Some(cache) = &cache {
        eprintln!("{} of {} compiles read from {} (the same sources, options and NVRTC compiled before)", hits.into_inner(), pairs.len(), cache.dir().display());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The generated ABI header asserts the Rust layout to NVRTC: a C struct that drifted from
/// its Rust twin (here `RustcclExecStep::ctx` declared wider than `ExecStep::ctx`) does not
/// compile. Skipped where NVRTC cannot be found (as on CI, where the kernels crate's tests
/// check the header's layout instead).
#[test]
fn exec_kernel_with_a_drifted_abi_header_does_not_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
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

/// The device API's user kernels (`tests/gpu/devcomm_kernel.cu`: the LSA barrier;
/// `tests/gpu/lla2a_kernel.cu`: the LL all-to-all, its templates instantiated here) compile
/// with NVRTC against `capi/include/nccl_device.h` (no CUDA header: the header declares what it
/// needs under NVRTC), to CUBIN for sm_90 and for the oldest architecture NVRTC knows, so
/// ptxas checks the header's inline PTX without a GPU (the GPU scripts run the kernels).
/// Skipped where NVRTC cannot be found, unless `RUSTCCL_REQUIRE_NVRTC=1` (CI).
#[test]
fn user_kernels_on_nccl_device_h_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    let nvrtc = nvrtc::Nvrtc::get().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_else(|e| panic!("reading {p}: {e}"));
    let header = read("capi/include/nccl_device.h");
    let lla2a_instances: String = ["ctaKernel", "warpKernel"]
        .iter()
        .flat_map(|k| {
            ["uint32_t", "unsigned long long", "Big"].map(|t| {
                format!(
                    "template __global__ void {k}<{t}>(ncclDevComm, ncclLLA2AHandle, uint32_t, uint32_t, int, Counters*);\n"
                )
            })
        })
        .collect();
    let oldest = *nvrtc.archs.first().expect("NVRTC knows no architecture");
    for (file, extra) in [("tests/gpu/devcomm_kernel.cu", String::new()), ("tests/gpu/lla2a_kernel.cu", lla2a_instances)] {
        let text = read(file) + &extra;
        for cc in [90, oldest] {
            let target = nvrtc.target_for(cc).unwrap_or_else(|| panic!("NVRTC cannot compile for sm_{cc}"));
            let options = [format!("--gpu-architecture={}", target.arch), "--std=c++17".to_string()];
            let out = nvrtc.compile_with_log((file, &text), &[("nccl_device.h", &header)], &options, target.cubin);
            match out {
                Ok(c) => assert!(!c.image.is_empty(), "{file} for {}: empty image", target.arch),
                Err(e) => panic!("{file} does not compile for {} against nccl_device.h: {}", target.arch, e.message),
            }
        }
    }
}

/// The one-sided kernels (`one_sided.cu`: the signal's release add, the wait's acquire loads
/// and abort polling) compile with NVRTC for sm_90, both entry points, without local memory.
/// Skipped where NVRTC cannot be found, unless `RUSTCCL_REQUIRE_NVRTC=1`.
#[test]
fn one_sided_kernels_compile_with_nvrtc() {
    if !nvrtc_or_skip() {
        return;
    }
    let c = module::compile_one_sided_report(90).unwrap_or_else(|e| panic!("one_sided.cu: {}", e.message));
    assert_eq!(c.arch, "sm_90");
    for k in [rustccl_kernels::one_sided::SIGNAL_KERNEL, rustccl_kernels::one_sided::WAIT_KERNEL] {
        let f = c.functions.iter().find(|f| f.entry && f.name == k).unwrap_or_else(|| panic!("no ptxas report for {k} in:\n{}", c.log));
        assert!(f.no_local_memory(), "{k} uses local memory:\n{}", c.log);
        eprintln!("{k} sm_90: {:?} registers per thread", f.registers);
    }
}

//! The device code of `rustccl-kernels` built for AMD GPUs: the same sources as the CUDA
//! backend's (`exec.cu`, one compilation per operator and type; the symmetric kernels are in
//! it), compiled by hipRTC for a `gfx*` target and cached on disk with the same
//! [`KernelCache`], keyed the same way (the sources, the target, the runtime version, every
//! option including hipRTC's version).
//!
//! fp8 is left out (`RUSTCCL_HAVE_FP8=0`: ROCm's OCP/FNUZ choice is a later step), so the
//! fp8 types have no interpreter here.

use std::time::Instant;

use rustccl_kernels::{DeviceOp, KernelCache, Lookup};

use super::rtc::HipRtc;
use crate::error::{Error, Result};
use crate::types::DataType;

/// The compile options for `arch`, besides the unit's defines.
fn base_options(arch: &str) -> Vec<String> {
    vec![
        format!("--offload-arch={arch}"),
        "-O3".to_string(),
        "-std=c++17".to_string(),
        // Keep a * b + c two roundings, as the host reference computes it (NVRTC's
        // --fmad=false).
        "-ffp-contract=off".to_string(),
        "-DRUSTCCL_HAVE_FP8=0".to_string(),
    ]
    .into_iter()
    .chain(crate::params::env_str("RUSTCCL_KERNEL_DEFINES").unwrap_or_default().split_whitespace().map(str::to_string))
    .collect()
}

/// Every option of the interpreter for `op` on `dtype` for `arch` (the base ones, then its
/// defines); an error for the types HIP does not build.
fn exec_options(arch: &str, op: DeviceOp, dtype: DataType) -> Result<Vec<String>> {
    if !has_exec(dtype) {
        return Err(Error::invalid_argument(format!("{dtype} has no collective kernel on AMD GPUs yet (fp8 is not built for HIP)")));
    }
    let defines = rustccl_kernels::exec::exec_defines(op, dtype as i32)
        .ok_or_else(|| Error::internal(format!("no collective kernel for {op:?} on {dtype}")))?;
    let mut options = base_options(arch);
    options.extend(defines);
    Ok(options)
}

/// `exec.cu` compiled by `rtc` with `options`: a non-empty code object and the log.
fn compile_unit(rtc: &HipRtc, options: &[String]) -> Result<(Vec<u8>, String)> {
    let unit_name = rustccl_kernels::exec::EXEC_SOURCE;
    let unit = rustccl_kernels::source(unit_name).expect("every unit is embedded");
    let headers: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    let (code, log) = rtc.compile((unit_name, unit), &headers, options)?;
    if code.is_empty() {
        return Err(Error::system("hipRTC returned an empty code object"));
    }
    Ok((code, log))
}

/// Whether the collective interpreter exists for `dtype` on AMD GPUs (every type but fp8).
pub fn has_exec(dtype: DataType) -> bool {
    !matches!(dtype, DataType::Float8e4m3 | DataType::Float8e5m2)
}

/// A compiled interpreter and what its compile said.
pub struct HipCompile {
    pub code: Vec<u8>,
    pub log: String,
    /// From the disk cache, not compiled.
    pub cached: bool,
}

/// The AMD code object of the collective interpreter for `op` on `dtype`, for target `arch`
/// (e.g. `gfx90a`) under HIP runtime version `runtime_version` (0 when compiling without a
/// runtime): the disk cache's, else hipRTC's (stored in the cache).
pub fn compile_exec(arch: &str, runtime_version: u32, op: DeviceOp, dtype: DataType) -> Result<HipCompile> {
    compile_exec_with(arch, runtime_version, op, dtype, crate::backend::rtc::kernel_cache())
}

/// [`compile_exec`] with `cache` (None: always compile, and store nothing).
fn compile_exec_with(arch: &str, runtime_version: u32, op: DeviceOp, dtype: DataType, cache: Option<KernelCache>) -> Result<HipCompile> {
    let options = exec_options(arch, op, dtype)?;
    let rtc = HipRtc::get()?;
    let start = Instant::now();
    let tags = [format!("hiprtc-{}.{}", rtc.version.0, rtc.version.1), format!("unit-{}", rustccl_kernels::exec::EXEC_SOURCE)];
    let key = crate::backend::rtc::cache_key(arch, runtime_version, &options, &tags);
    let what = format!("HIP collective kernel {}/{dtype} for {arch}", op.suffix());
    if let Some(cache) = &cache {
        match cache.lookup(&key) {
            Lookup::Hit(code) => {
                tracing::info!(target: "INIT", "{what}: kernel cache hit {} ({} bytes), no compile", cache.path_for(&key).display(), code.len());
                return Ok(HipCompile { code, log: String::new(), cached: true });
            }
            Lookup::Miss => {}
            Lookup::Corrupt(why) => tracing::warn!(target: "INIT", "kernel cache entry {} is damaged ({why}); recompiling", cache.path_for(&key).display()),
        }
    }
    let (code, log) = compile_unit(rtc, &options).map_err(|e| e.context(what.clone()))?;
    tracing::info!(target: "INIT", "{what}: compiled by hipRTC {}.{} in {:.1} s ({} bytes)", rtc.version.0, rtc.version.1, start.elapsed().as_secs_f64(), code.len());
    if let Some(cache) = &cache {
        if let Err(e) = cache.store(&key, &code) {
            tracing::warn!(target: "INIT", "{what}: not stored in the kernel cache: {e}");
        }
    }
    Ok(HipCompile { code, log, cached: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set to 1 where hipRTC must be found (CI installs Debian's ROCm packages): the test then
    /// fails instead of saying it skipped.
    const REQUIRE_ENV: &str = "RUSTCCL_TEST_REQUIRE_HIPRTC";

    fn hiprtc() -> Option<&'static HipRtc> {
        match HipRtc::get() {
            Ok(r) => Some(r),
            Err(e) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => panic!("{REQUIRE_ENV}=1 but {}", e.message),
            Err(e) => {
                eprintln!("SKIPPED (no hipRTC here; {REQUIRE_ENV}=1 makes this a failure): {}", e.message);
                None
            }
        }
    }

    /// Every collective interpreter (each operator on each type it supports, fp8 aside) compiles
    /// through hipRTC for gfx90a (MI200), with no GPU: a change that breaks AMD compilation
    /// fails here. The targets in `RUSTCCL_HIP_TEST_ARCHS` (space-separated) replace gfx90a.
    #[test]
    fn hiprtc_compiles_every_interpreter_for_amd_targets() {
        let Some(rtc) = hiprtc() else { return };
        let archs = std::env::var("RUSTCCL_HIP_TEST_ARCHS").unwrap_or_else(|_| "gfx90a".to_string());
        // Every operator on every type is 50 compiles of ~30 s each on two cores.
        // RUSTCCL_HIP_TEST_UNITS: `one` (the default: float32 sum, for test runs where hipRTC
        // happens to be installed), `cover` (CI: every type once, with sum or its first
        // operator, and every operator once, on float32, SumPostDiv, integers only, on int32:
        // together every line of the sources that a type or operator selects), `all`.
        let set = std::env::var("RUSTCCL_HIP_TEST_UNITS").unwrap_or_else(|_| "one".to_string());
        let all = set == "all";
        let mut units: Vec<(String, DeviceOp, DataType)> = Vec::new();
        for arch in archs.split_whitespace() {
            for dtype in DataType::ALL.into_iter().filter(|&d| has_exec(d)) {
                for op in DeviceOp::ALL.into_iter().filter(|op| op.supports(dtype as i32)) {
                    let first_op_of_type = !units.iter().any(|(a, _, d)| a == arch && *d == dtype);
                    let int_only = op == DeviceOp::SumPostDiv && dtype == DataType::Int32;
                    if all || first_op_of_type || dtype == DataType::Float32 || int_only {
                        units.push((arch.to_string(), op, dtype));
                    }
                }
            }
        }
        assert!(units.len() >= 15, "{} units", units.len());
        if set == "one" {
            units.retain(|(_, op, d)| *op == DeviceOp::Sum && *d == DataType::Float32);
        }
        // For quick runs while porting: only the first N units.
        if let Some(n) = std::env::var("RUSTCCL_HIP_TEST_LIMIT").ok().and_then(|v| v.parse().ok()) {
            units.truncate(n);
        }
        // Two at a time (CI has two cores); every failure is reported, not only the first.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failures = std::sync::Mutex::new(Vec::new());
        let cache = crate::backend::rtc::test_kernel_cache();
        let hits = std::sync::atomic::AtomicUsize::new(0);
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((arch, op, dtype)) = units.get(i) else { break };
                    let compiled = compile_exec_with(arch, 0, *op, *dtype, cache.clone()).map(|h| {
                        hits.fetch_add(usize::from(h.cached), std::sync::atomic::Ordering::Relaxed);
                        h.code
                    });
                    match compiled {
                        Ok(code) => assert!(code.len() > 1000, "{arch} {op:?} {dtype}: {} bytes", code.len()),
                        Err(e) => failures.lock().unwrap().push(format!("{arch} {op:?} {dtype}: {}", e.message)),
                    }
                });
            }
        });
        let failures = failures.into_inner().unwrap();
        assert!(failures.is_empty(), "{} of {} failed; the first:\n{}", failures.len(), units.len(), failures[0]);
        eprintln!(
            "hipRTC {}.{} ({}): {} interpreters compiled for {archs} in {:.0} s ({} of them read from the test kernel cache: compiled before with the same sources, options and hipRTC)",
            rtc.version.0,
            rtc.version.1,
            rtc.path.display(),
            units.len(),
            start.elapsed().as_secs_f64(),
            hits.into_inner()
        );
    }
}

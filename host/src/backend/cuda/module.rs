//! The device code of `rustccl-kernels`, compiled by NVRTC for each architecture in use,
//! cached on disk ([`KernelCache`], keyed by the sources, the architecture, the driver version
//! and the compile options including NVRTC's version), and loaded once per context with
//! `cuModuleLoadData`.
//!
//! The first process on a machine pays the compile (about a second or two); every later one
//! finds the CUBIN in the cache, and loading it takes milliseconds. Each compile and each
//! cache hit is logged at INFO level (subsystem INIT).

use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use rustccl_kernels::{CacheKey, DeviceOp, KernelCache, Lookup, REDUCE_SOURCE};

use super::driver::{check, Ctx, CtxGuard};
use super::nvrtc::{self, Nvrtc};
use crate::error::{Error, Result};
use crate::types::DataType;

/// How the code for one architecture was obtained (see [`super::CudaBackend::kernel_info`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// `sm_XY` (a CUBIN) or `compute_XY` (PTX).
    pub arch: String,
    /// Whether it came from the on-disk cache (no compile).
    pub from_cache: bool,
    /// The time the compile or the cache read took in this process.
    pub time: Duration,
    /// The cache file, when there is a cache.
    pub cache_path: Option<PathBuf>,
    /// The size of the CUBIN or PTX.
    pub bytes: usize,
}

/// A compiled blob and how it was obtained.
struct Blob {
    image: Vec<u8>,
    info: KernelInfo,
}

/// A `CUfunction`, shareable.
#[derive(Clone, Copy)]
pub(crate) struct Func(pub sys::CUfunction);
// SAFETY: a CUfunction is a driver handle usable from any thread.
unsafe impl Send for Func {}
// SAFETY: as above.
unsafe impl Sync for Func {}

/// The module loaded in one context, and the functions looked up so far.
pub(crate) struct Loaded {
    module: sys::CUmodule,
    functions: Mutex<HashMap<(DeviceOp, DataType), Func>>,
    pub(crate) info: KernelInfo,
}
// SAFETY: a CUmodule is a driver handle usable from any thread; the map is behind a mutex.
unsafe impl Send for Loaded {}
// SAFETY: as above.
unsafe impl Sync for Loaded {}

impl Loaded {
    /// The reduce kernel for `op` on `dtype` (looked up once).
    pub(crate) fn reduce_function(&self, op: DeviceOp, dtype: DataType) -> Result<Func> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = functions.get(&(op, dtype)) {
            return Ok(*f);
        }
        let name = rustccl_kernels::reduce_kernel_name(op, dtype as i32)
            .ok_or_else(|| Error::internal(format!("no reduce kernel for {op:?} on {dtype}")))?;
        let cname = CString::new(name.clone()).expect("kernel names have no NUL");
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded (and never unloaded); writes one handle.
        check(
            unsafe { sys::cuModuleGetFunction(&mut f, self.module, cname.as_ptr()) },
            &format!("cuModuleGetFunction({name})"),
        )?;
        functions.insert((op, dtype), Func(f));
        Ok(Func(f))
    }
}

/// The kernels of every architecture and context in use.
#[derive(Default)]
pub(crate) struct Kernels {
    /// By architecture (compute capability, e.g. 90).
    blobs: Mutex<HashMap<i32, Arc<Blob>>>,
    /// By context.
    loaded: Mutex<HashMap<usize, Arc<Loaded>>>,
    /// The collective interpreter, by (context, operator, type): compiled on first use of
    /// each pair (one compile per architecture, then the disk cache), loaded once per context.
    exec: Mutex<HashMap<(usize, DeviceOp, DataType), ExecFunc>>,
}

/// The interpreter of one (operator, type) in one context (its module stays loaded).
#[derive(Clone, Copy)]
pub(crate) struct ExecFunc {
    pub func: Func,
}

/// The compile options, besides the architecture and include directories.
fn base_options(have_fp8: bool) -> Vec<String> {
    vec![
        "--std=c++17".to_string(),
        // Keep a * b + c two roundings, as the host reference computes it.
        "--fmad=false".to_string(),
        format!("-DRUSTCCL_HAVE_FP8={}", u8::from(have_fp8)),
    ]
}

impl Kernels {
    /// The module for context `ctx` (a context of a device of compute capability `cc`),
    /// compiling or reading the cache and loading it on first use.
    pub(crate) fn get(&self, ctx: Ctx, cc: i32, driver_version: i32) -> Result<Arc<Loaded>> {
        if let Some(l) = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&ctx.key()) {
            return Ok(l.clone());
        }
        let blob = self.blob(cc, driver_version)?;
        let _g = CtxGuard::enter(ctx)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = loaded.get(&ctx.key()) {
            return Ok(l.clone());
        }
        let start = Instant::now();
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a CUBIN, or NUL-terminated PTX, that outlives the call.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, blob.image.as_ptr() as *const std::ffi::c_void) },
            &format!("cuModuleLoadData({} kernels, {} bytes)", blob.info.arch, blob.image.len()),
        )?;
        tracing::info!(
            target: "INIT",
            "CUDA kernels for {} loaded in {:.1} ms",
            blob.info.arch,
            start.elapsed().as_secs_f64() * 1e3
        );
        let l = Arc::new(Loaded { module, functions: Mutex::new(HashMap::new()), info: blob.info.clone() });
        loaded.insert(ctx.key(), l.clone());
        Ok(l)
    }

    /// The collective interpreter for `op` on `dtype` in context `ctx`.
    pub(crate) fn exec(&self, ctx: Ctx, cc: i32, driver_version: i32, op: DeviceOp, dtype: DataType) -> Result<ExecFunc> {
        let key = (ctx.key(), op, dtype);
        if let Some(f) = self.exec.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(*f);
        }
        // Compiled without the lock, so that several pairs compile at once (a pair compiled
        // twice by racing threads is stored once).
        let defines = exec_defines(op, dtype)?;
        let what = format!("collective kernel {}/{}", op.suffix(), dtype);
        let unit = Unit { name: rustccl_kernels::exec::EXEC_SOURCE, defines: &defines, what: &what };
        let blob = compile_or_load(cc, driver_version, &unit)?;
        let _g = CtxGuard::enter(ctx)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a CUBIN, or NUL-terminated PTX, that outlives the call.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, blob.image.as_ptr() as *const std::ffi::c_void) },
            &format!("cuModuleLoadData({what})"),
        )?;
        let name = CString::new(rustccl_kernels::exec::EXEC_KERNEL).expect("no NUL");
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module was just loaded and is never unloaded; writes one handle.
        check(unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) }, "cuModuleGetFunction(rustccl_exec)")?;
        let e = ExecFunc { func: Func(f) };
        Ok(*self.exec.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(e))
    }

    /// How the kernels loaded in `ctx` were obtained; None when none are loaded there.
    pub(crate) fn loaded_info(&self, ctx: Ctx) -> Option<KernelInfo> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&ctx.key()).map(|l| l.info.clone())
    }

    /// The compiled code for compute capability `cc`: this process's copy, else the disk
    /// cache's, else NVRTC's (stored in the cache).
    fn blob(&self, cc: i32, driver_version: i32) -> Result<Arc<Blob>> {
        // One compile per architecture at a time: held across the compile on purpose.
        let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = blobs.get(&cc) {
            return Ok(b.clone());
        }
        let b = Arc::new(compile_or_load(cc, driver_version, &REDUCE_UNIT)?);
        blobs.insert(cc, b.clone());
        Ok(b)
    }
}

/// A compilation unit among the kernel sources, with its extra options.
struct Unit<'a> {
    name: &'a str,
    defines: &'a [String],
    /// What the log calls it.
    what: &'a str,
}

const REDUCE_UNIT: Unit<'static> = Unit { name: REDUCE_SOURCE, defines: &[], what: "kernels" };

/// The `-D` options of the collective interpreter for `op` on `dtype`.
fn exec_defines(op: DeviceOp, dtype: DataType) -> Result<Vec<String>> {
    rustccl_kernels::exec::exec_defines(op, dtype as i32)
        .ok_or_else(|| Error::internal(format!("no collective kernel for {op:?} on {dtype}")))
}

/// What NVRTC builds `unit` for compute capability `cc` as, and every option of the compile
/// (the base ones, the architecture, the unit's defines, the include directories).
fn target_and_options(nvrtc: &Nvrtc, cc: i32, unit: &Unit) -> Result<(nvrtc::Target, Vec<String>)> {
    let target = nvrtc.target_for(cc).ok_or_else(|| {
        Error::cuda(format!(
            "NVRTC {}.{} ({}) cannot compile for compute capability {}.{} (it knows sm_{:?})",
            nvrtc.version.0,
            nvrtc.version.1,
            nvrtc.path.display(),
            cc / 10,
            cc % 10,
            nvrtc.archs
        ))
    })?;
    let mut options = base_options(nvrtc.version >= (11, 8));
    options.push(format!("--gpu-architecture={}", target.arch));
    options.extend(unit.defines.iter().cloned());
    for dir in nvrtc::include_dirs_from_env(&nvrtc.path) {
        options.push(format!("-I{}", dir.display()));
    }
    Ok((target, options))
}

fn compile_or_load(cc: i32, driver_version: i32, unit_desc: &Unit) -> Result<Blob> {
    let start = Instant::now();
    let nvrtc = Nvrtc::get()?;
    let (target, options) = target_and_options(nvrtc, cc, unit_desc)?;
    let what = format!("{} ({})", unit_desc.what, unit_desc.name);
    // The key: every source, the architecture, the driver, the options and NVRTC's version.
    let mut key_options: Vec<String> = options.clone();
    key_options.push(format!("nvrtc-{}.{}", nvrtc.version.0, nvrtc.version.1));
    key_options.push(format!("output-{}", if target.cubin { "cubin" } else { "ptx" }));
    key_options.push(format!("unit-{}", unit_desc.name));
    let key_refs: Vec<&str> = key_options.iter().map(String::as_str).collect();
    let key = CacheKey::new(rustccl_kernels::sources(), &target.arch, driver_version as u32, &key_refs);
    let cache = KernelCache::from_env();

    if let Some(cache) = &cache {
        match cache.lookup(&key) {
            Lookup::Hit(image) => {
                let info = KernelInfo {
                    arch: target.arch.clone(),
                    from_cache: true,
                    time: start.elapsed(),
                    cache_path: Some(cache.path_for(&key)),
                    bytes: image.len(),
                };
                tracing::info!(
                    target: "INIT",
                    "CUDA {what} for {}: kernel cache hit {} ({} bytes, {:.1} ms), no compile",
                    info.arch,
                    cache.path_for(&key).display(),
                    image.len(),
                    info.time.as_secs_f64() * 1e3
                );
                return Ok(Blob { image, info });
            }
            Lookup::Miss => {}
            Lookup::Corrupt(why) => tracing::warn!(
                target: "INIT",
                "kernel cache entry {} is damaged ({why}); recompiling",
                cache.path_for(&key).display()
            ),
        }
    }

    let unit = rustccl_kernels::source(unit_desc.name).expect("every unit is embedded");
    let headers: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    let image = nvrtc.compile((unit_desc.name, unit), &headers, &options, target.cubin).map_err(|e| {
        if !options.iter().any(|o| o.starts_with("-I")) {
            e.context(format!(
                "CUDA headers not found (no cuda_fp16.h in {}, $CUDA_HOME/include, next to {} or \
                 /usr/local/cuda*/include); install the CUDA toolkit headers or set {}",
                nvrtc::CUDA_INCLUDE_ENV,
                nvrtc.path.display(),
                nvrtc::CUDA_INCLUDE_ENV
            ))
        } else {
            e
        }
    })?;
    let mut info = KernelInfo {
        arch: target.arch.clone(),
        from_cache: false,
        time: start.elapsed(),
        cache_path: None,
        bytes: image.len(),
    };
    match &cache {
        Some(cache) => match cache.store(&key, &image) {
            Ok(path) => info.cache_path = Some(path),
            Err(e) => tracing::warn!(
                target: "INIT",
                "could not store compiled kernels in {}: {e}",
                cache.dir().display()
            ),
        },
        None => tracing::warn!(
            target: "INIT",
            "no kernel cache directory ({} and HOME unset): kernels are compiled at every start",
            rustccl_kernels::CACHE_DIR_ENV
        ),
    }
    tracing::info!(
        target: "INIT",
        "CUDA {what} for {}: compiled by NVRTC {}.{} in {:.1} ms ({} bytes){}",
        info.arch,
        nvrtc.version.0,
        nvrtc.version.1,
        info.time.as_secs_f64() * 1e3,
        image.len(),
        info.cache_path.as_ref().map(|p| format!(", cached at {}", p.display())).unwrap_or_default()
    );
    Ok(Blob { image, info })
}

/// Compiles the kernels for `arch` (e.g. `sm_90`) without a device or the cache: the
/// compile check of the device code, for tests on machines with NVRTC but no GPU.
pub fn compile_only(cc: i32) -> Result<(String, usize)> {
    compile_unit_only(cc, &REDUCE_UNIT)
}

/// Compiles the collective interpreter for `op` on `dtype` (no device, no cache): the compile
/// check of `exec.cu`.
pub fn compile_exec_only(cc: i32, op: DeviceOp, dtype: DataType) -> Result<usize> {
    let defines = exec_defines(op, dtype)?;
    let unit = Unit { name: rustccl_kernels::exec::EXEC_SOURCE, defines: &defines, what: "collective kernel" };
    Ok(compile_unit_only(cc, &unit)?.1)
}

/// Compiles `unit` for `cc` without the cache; returns the target and the image's size.
fn compile_unit_only(cc: i32, unit: &Unit) -> Result<(String, usize)> {
    let nvrtc = Nvrtc::get()?;
    let (target, options) = target_and_options(nvrtc, cc, unit)?;
    let text = rustccl_kernels::source(unit.name).expect("every unit is embedded");
    let headers: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    let image = nvrtc.compile((unit.name, text), &headers, &options, target.cubin)?;
    Ok((target.arch, image.len()))
}

/// Compiles the collective interpreter for `op` on `dtype` with `headers` in place of the
/// kernel headers (no device, no cache): for tests of what NVRTC makes of a header.
#[cfg(test)]
pub(crate) fn compile_exec_with_headers(cc: i32, op: DeviceOp, dtype: DataType, headers: &[(&str, &str)]) -> Result<usize> {
    let defines = exec_defines(op, dtype)?;
    let unit = Unit { name: rustccl_kernels::exec::EXEC_SOURCE, defines: &defines, what: "collective kernel" };
    let nvrtc = Nvrtc::get()?;
    let (target, options) = target_and_options(nvrtc, cc, &unit)?;
    let text = rustccl_kernels::source(unit.name).expect("every unit is embedded");
    Ok(nvrtc.compile((unit.name, text), headers, &options, target.cubin)?.len())
}

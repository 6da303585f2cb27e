//! The device code of `rustccl-kernels` (the collective interpreter, `exec.cu`, one
//! compilation per operator and type), compiled by NVRTC for each architecture in use, cached
//! on disk ([`KernelCache`], keyed by the sources, the architecture, the driver version and the
//! compile options including NVRTC's version), and loaded once per context with
//! `cuModuleLoadData`.
//!
//! The first process on a machine pays the compiles (`rank-worker compile-kernels` does them
//! all ahead of time); every later one finds the CUBINs in the cache, and loading one takes
//! milliseconds. Each compile and each cache hit is logged at INFO level (subsystem INIT).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::RwLock;
use std::time::Instant;

use cudarc::driver::sys;
use rustccl_kernels::{DeviceOp, KernelCache, Lookup};

use super::driver::{check, Ctx, CtxGuard};
use super::nvrtc::{self, Nvrtc};
use super::ptxas;
use rustccl_kernels::exec::ExecEntry;
use rustccl_kernels::symmetric::SymKernel;
use crate::error::{Error, Result};
use crate::types::DataType;

/// A `CUfunction`, shareable.
#[derive(Clone, Copy)]
pub(crate) struct Func(pub sys::CUfunction);
// SAFETY: a CUfunction is a driver handle usable from any thread.
unsafe impl Send for Func {}
// SAFETY: as above.
unsafe impl Sync for Func {}

/// The kernels of every context in use.
#[derive(Default)]
pub(crate) struct Kernels {
    /// The collective interpreter, by (context, operator, type): compiled on first use of
    /// each pair (one compile per architecture, then the disk cache), loaded once per context.
    /// Read under a shared lock (launches on several threads do not wait for each other);
    /// cached launches hold the function and do not look it up at all.
    exec: RwLock<HashMap<(usize, DeviceOp, DataType), ExecFunc>>,
    /// The one-sided operations' kernels (`one_sided.cu`), by context: compiled once per
    /// architecture (then the disk cache), loaded once per context.
    one_sided: RwLock<HashMap<usize, OneSidedFuncs>>,
}

/// The one-sided kernels of one context (their module stays loaded).
#[derive(Clone, Copy)]
pub(crate) struct OneSidedFuncs {
    /// `rustccl_signal`.
    pub signal: Func,
    /// `rustccl_wait_signal`.
    pub wait: Func,
}

/// The interpreter of one (operator, type) in one context (its module stays loaded): a
/// function per entry point (`rustccl_kernels::exec::ExecEntry`, in `ExecEntry::ALL`'s order).
#[derive(Clone, Copy)]
pub(crate) struct ExecFunc {
    pub funcs: [Func; 4],
    /// The symmetric kernels (`rustccl_kernels::symmetric::SymKernel`, in `SymKernel::ALL`'s
    /// order; null where the sources lack them: an older exec.cu of an A/B run).
    pub sym: [Func; 5],
    /// The most registers per thread and local memory per thread in bytes (spills and local
    /// arrays; the interpreter is written to need none) of its entry points, as the driver
    /// reports them.
    pub regs: i32,
    pub local_bytes: i32,
}

/// The compile options, besides the architecture and include directories.
fn base_options(have_fp8: bool) -> Vec<String> {
    vec![
        "--std=c++17".to_string(),
        // Keep a * b + c two roundings, as the host reference computes it.
        "--fmad=false".to_string(),
        format!("-DRUSTCCL_HAVE_FP8={}", u8::from(have_fp8)),
    ]
    .into_iter()
    // Tuning knobs of the device code for experiments (e.g. `-DRUSTCCL_SIMPLE_UNROLL=8`);
    // part of the cache key like every option.
    .chain(crate::params::env_str("RUSTCCL_KERNEL_DEFINES").unwrap_or_default().split_whitespace().map(str::to_string))
    .collect()
}

impl Kernels {
    /// Registers and local memory per thread of every interpreter loaded so far:
    /// (operator, type, registers, local bytes).
    pub(crate) fn exec_resources(&self) -> Vec<(DeviceOp, DataType, i32, i32)> {
        let mut out: Vec<_> =
            self.exec.read().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, f)| (k.1, k.2, f.regs, f.local_bytes)).collect();
        out.sort_by_key(|&(op, dt, _, _)| (op.suffix(), dt as i32));
        out.dedup_by_key(|&mut (op, dt, _, _)| (op, dt));
        out
    }

    /// The collective interpreter for `op` on `dtype` in context `ctx`.
    pub(crate) fn exec(&self, ctx: Ctx, cc: i32, driver_version: i32, op: DeviceOp, dtype: DataType) -> Result<ExecFunc> {
        let key = (ctx.key(), op, dtype);
        if let Some(f) = self.exec.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(*f);
        }
        // Compiled without the lock, so that several pairs compile at once (a pair compiled
        // twice by racing threads is stored once).
        let defines = exec_defines(op, dtype)?;
        let what = format!("collective kernel {}/{}", op.suffix(), dtype);
        let unit = Unit { name: rustccl_kernels::exec::EXEC_SOURCE, defines: &defines, what: &what };
        let image = compile_or_load(cc, driver_version, &unit)?;
        let _g = CtxGuard::enter(ctx)?;
        let module = load_module(&image, &what)?;
        let mut funcs = [Func(std::ptr::null_mut()); 4];
        let (mut regs, mut local_bytes) = (0, 0);
        for entry in ExecEntry::ALL {
            let name = CString::new(entry.name()).expect("no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; writes one handle.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            if r == sys::CUresult::CUDA_ERROR_NOT_FOUND && entry != ExecEntry::Mixed && std::env::var_os(rustccl_kernels::SOURCE_DIR_ENV).is_some() {
                // An older exec.cu given for an A/B run (RUSTCCL_KERNEL_SOURCE_DIR), from
                // before the per-protocol entry points: every launch takes its one entry.
                tracing::warn!(target: "INIT", "{what}: no {} in the kernel sources of RUSTCCL_KERNEL_SOURCE_DIR; launches take {}", entry.name(), ExecEntry::Mixed.name());
                funcs[entry.index()] = funcs[ExecEntry::Mixed.index()];
                continue;
            }
            check(r, &format!("cuModuleGetFunction({})", entry.name()))?;
            let attr = |a: sys::CUfunction_attribute| -> Result<i32> {
                let mut v = 0;
                // SAFETY: `f` is the function just loaded; writes one int.
                check(unsafe { sys::cuFuncGetAttribute(&mut v, a, f) }, &format!("cuFuncGetAttribute({})", entry.name()))?;
                Ok(v)
            };
            let r = attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?;
            let local = attr(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?;
            if local > 0 {
                tracing::warn!(target: "INIT", "{what} ({}): {local} bytes of local memory per thread (register spills or local arrays); the interpreter is meant to need none", entry.name());
            } else {
                tracing::info!(target: "INIT", "{what} ({}): {r} registers per thread, no local memory", entry.name());
            }
            funcs[entry.index()] = Func(f);
            regs = regs.max(r);
            local_bytes = local_bytes.max(local);
        }
        let mut sym = [Func(std::ptr::null_mut()); 5];
        for k in SymKernel::ALL {
            let name = CString::new(k.name()).expect("no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; writes one handle.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            if r == sys::CUresult::CUDA_ERROR_NOT_FOUND && std::env::var_os(rustccl_kernels::SOURCE_DIR_ENV).is_some() {
                continue;
            }
            check(r, &format!("cuModuleGetFunction({})", k.name()))?;
            sym[k.index()] = Func(f);
        }
        let e = ExecFunc { funcs, sym, regs, local_bytes };
        Ok(*self.exec.write().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(e))
    }
}

impl Kernels {
    /// The one-sided operations' kernels in context `ctx` (`one_sided.cu`).
    pub(crate) fn one_sided(&self, ctx: Ctx, cc: i32, driver_version: i32) -> Result<OneSidedFuncs> {
        if let Some(f) = self.one_sided.read().unwrap_or_else(|p| p.into_inner()).get(&ctx.key()) {
            return Ok(*f);
        }
        let what = "one-sided kernels";
        let unit = Unit { name: rustccl_kernels::one_sided::SOURCE, defines: &[], what };
        let image = compile_or_load(cc, driver_version, &unit)?;
        let _g = CtxGuard::enter(ctx)?;
        let module = load_module(&image, what)?;
        let function = |name: &str| -> Result<Func> {
            let c = CString::new(name).expect("no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: the module was just loaded and is never unloaded; writes one handle.
            check(unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) }, &format!("cuModuleGetFunction({name})"))?;
            Ok(Func(f))
        };
        let f = OneSidedFuncs {
            signal: function(rustccl_kernels::one_sided::SIGNAL_KERNEL)?,
            wait: function(rustccl_kernels::one_sided::WAIT_KERNEL)?,
        };
        Ok(*self.one_sided.write().unwrap_or_else(|p| p.into_inner()).entry(ctx.key()).or_insert(f))
    }
}

/// Loads a compiled image (CUBIN, or NUL-terminated PTX) into the current context; the
/// module is never unloaded.
fn load_module(image: &[u8], what: &str) -> Result<sys::CUmodule> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a CUBIN, or NUL-terminated PTX, that outlives the call.
    check(
        unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const std::ffi::c_void) },
        &format!("cuModuleLoadData({what})"),
    )?;
    Ok(module)
}

/// A compilation unit among the kernel sources, with its extra options.
struct Unit<'a> {
    name: &'a str,
    defines: &'a [String],
    /// What the log calls it.
    what: &'a str,
}

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

/// The compiled image (CUBIN, or NUL-terminated PTX) of `unit_desc` for compute capability
/// `cc`: the disk cache's, else NVRTC's (stored in the cache).
fn compile_or_load(cc: i32, driver_version: i32, unit_desc: &Unit) -> Result<Vec<u8>> {
    let start = Instant::now();
    let nvrtc = Nvrtc::get()?;
    let (target, options) = target_and_options(nvrtc, cc, unit_desc)?;
    let what = format!("{} ({})", unit_desc.what, unit_desc.name);
    // The key: every source, the architecture, the driver, the options and NVRTC's version.
    let tags = [
        format!("nvrtc-{}.{}", nvrtc.version.0, nvrtc.version.1),
        format!("output-{}", if target.cubin { "cubin" } else { "ptx" }),
        format!("unit-{}", unit_desc.name),
    ];
    let key = crate::backend::rtc::cache_key(&target.arch, driver_version as u32, &options, &tags);
    let cache = crate::backend::rtc::kernel_cache();

    if let Some(cache) = &cache {
        match cache.lookup(&key) {
            Lookup::Hit(image) => {
                tracing::info!(
                    target: "INIT",
                    "CUDA {what} for {}: kernel cache hit {} ({} bytes, {:.1} ms), no compile",
                    target.arch,
                    cache.path_for(&key).display(),
                    image.len(),
                    start.elapsed().as_secs_f64() * 1e3
                );
                return Ok(image);
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
    let time = start.elapsed();
    let mut cache_path = None;
    match &cache {
        Some(cache) => match cache.store(&key, &image) {
            Ok(path) => cache_path = Some(path),
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
        target.arch,
        nvrtc.version.0,
        nvrtc.version.1,
        time.as_secs_f64() * 1e3,
        image.len(),
        cache_path.as_ref().map(|p| format!(", cached at {}", p.display())).unwrap_or_default()
    );
    Ok(image)
}

/// What compiling one interpreter made: the target, the image's size and ptxas' report.
#[derive(Debug)]
pub struct ExecCompile {
    /// `sm_XY` (CUBIN) or `compute_XY` (PTX, no ptxas report).
    pub arch: String,
    pub image_bytes: usize,
    /// NVRTC's program log (ptxas' report in it).
    pub log: String,
    /// ptxas' report, read from the log.
    pub functions: Vec<ptxas::FunctionReport>,
}

impl ExecCompile {
    /// The report of the interpreter's entry point `entry`.
    pub fn entry(&self, entry: ExecEntry) -> Option<&ptxas::FunctionReport> {
        self.functions.iter().find(|f| f.entry && f.name == entry.name())
    }
}

/// Compiles the collective interpreter for `op` on `dtype` with ptxas' verbose report (no
/// device), with `extra` `-D` options (kernel knobs) besides the usual ones: the compile check
/// of `exec.cu` and its register and local memory use. With a `cache`, a compile made before
/// with the same sources, options and NVRTC is read from there (the entry holds what the
/// report is made of: the target, the image's size, the log; not the image) and the second
/// value says so: what a compile check on a machine that keeps its cache (CI) need not repeat.
pub fn compile_exec_report(cc: i32, op: DeviceOp, dtype: DataType, extra: &[&str], cache: Option<&KernelCache>) -> Result<(ExecCompile, bool)> {
    let (nvrtc, target, options) = report_options(cc, op, dtype, extra)?;
    let tags = [format!("nvrtc-{}.{}", nvrtc.version.0, nvrtc.version.1), format!("report-of-{}", rustccl_kernels::exec::EXEC_SOURCE)];
    let key = crate::backend::rtc::cache_key(&target.arch, 0, &options, &tags);
    if let Some(Lookup::Hit(blob)) = cache.map(|c| c.lookup(&key)) {
        let text = String::from_utf8_lossy(&blob);
        let mut parts = text.splitn(3, '\n');
        if let (Some(arch), Some(Ok(image_bytes)), Some(log)) = (parts.next(), parts.next().map(str::parse), parts.next()) {
            let functions = ptxas::parse(log);
            return Ok((ExecCompile { arch: arch.to_string(), image_bytes, functions, log: log.to_string() }, true));
        }
    }
    let headers: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    let c = compile_with(nvrtc, &target, &options, &headers)?;
    if let Some(cache) = cache {
        cache
            .store(&key, format!("{}\n{}\n{}", c.arch, c.image_bytes, c.log).as_bytes())
            .map_err(|e| Error::system(format!("storing the compile report in {}: {e}", cache.dir().display())))?;
    }
    Ok((c, false))
}

/// Compiles the collective interpreter for `op` on `dtype` with `headers` in place of the
/// kernel headers (no device, no cache): for tests of what NVRTC makes of a header.
#[cfg(test)]
pub(crate) fn compile_exec_with_headers(cc: i32, op: DeviceOp, dtype: DataType, headers: &[(&str, &str)]) -> Result<ExecCompile> {
    let (nvrtc, target, options) = report_options(cc, op, dtype, &[])?;
    compile_with(nvrtc, &target, &options, headers)
}

/// NVRTC, the target and every option of a compile with ptxas' verbose report.
fn report_options(cc: i32, op: DeviceOp, dtype: DataType, extra: &[&str]) -> Result<(&'static Nvrtc, nvrtc::Target, Vec<String>)> {
    let mut defines = exec_defines(op, dtype)?;
    defines.extend(extra.iter().map(|d| d.to_string()));
    let unit = Unit { name: rustccl_kernels::exec::EXEC_SOURCE, defines: &defines, what: "collective kernel" };
    let nvrtc = Nvrtc::get()?;
    let (target, mut options) = target_and_options(nvrtc, cc, &unit)?;
    options.push(ptxas::VERBOSE_OPTION.to_string());
    Ok((nvrtc, target, options))
}

/// Compiles the one-sided kernels (`one_sided.cu`) for compute capability `cc` with ptxas'
/// verbose report (no device, no cache): the compile check of the unit.
pub fn compile_one_sided_report(cc: i32) -> Result<ExecCompile> {
    let unit = Unit { name: rustccl_kernels::one_sided::SOURCE, defines: &[], what: "one-sided kernels" };
    let nvrtc = Nvrtc::get()?;
    let (target, mut options) = target_and_options(nvrtc, cc, &unit)?;
    options.push(ptxas::VERBOSE_OPTION.to_string());
    let headers: Vec<(&str, &str)> = rustccl_kernels::headers().collect();
    compile_unit_with(nvrtc, unit.name, &target, &options, &headers)
}

/// Compiles `exec.cu` with `options` and the named `headers`: what ptxas reported.
fn compile_with(nvrtc: &Nvrtc, target: &nvrtc::Target, options: &[String], headers: &[(&str, &str)]) -> Result<ExecCompile> {
    compile_unit_with(nvrtc, rustccl_kernels::exec::EXEC_SOURCE, target, options, headers)
}

/// Compiles the unit `name` with `options` and the named `headers`: what ptxas reported.
fn compile_unit_with(nvrtc: &Nvrtc, name: &str, target: &nvrtc::Target, options: &[String], headers: &[(&str, &str)]) -> Result<ExecCompile> {
    let text = rustccl_kernels::source(name).expect("every unit is embedded");
    let out = nvrtc.compile_with_log((name, text), headers, options, target.cubin)?;
    Ok(ExecCompile { arch: target.arch.clone(), image_bytes: out.image.len(), functions: ptxas::parse(&out.log), log: out.log })
}

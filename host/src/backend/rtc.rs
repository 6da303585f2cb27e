//! What NVRTC (`cuda::nvrtc`) and hipRTC (`hip::rtc`) share: the same program calls with the
//! same C signatures (create with named headers, compile with options, the log), so one
//! routine drives a compile for both; each library keeps its own loading, version and output
//! calls.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use crate::error::{Error, Result};

/// A program handle (`nvrtcProgram`, `hiprtcProgram`).
pub(crate) type Program = *mut c_void;

/// The program calls of a run-time compiler (results are C enums: ints, 0 success).
pub(crate) struct ProgramCalls {
    /// The calls' prefix in messages (`nvrtc`, `hiprtc`).
    pub prefix: &'static str,
    /// The error kind of this library's failures.
    pub error: fn(String) -> Error,
    pub error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    pub create: unsafe extern "C" fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int,
    pub destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    pub compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    pub log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    pub log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
}

impl ProgramCalls {
    /// `r` as a result: the library's text for a failure of `what`.
    pub(crate) fn check(&self, r: c_int, what: &str) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let p = unsafe { (self.error_string)(r) };
        let text = if p.is_null() {
            format!("unknown {} error", self.prefix)
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err((self.error)(format!("{what} failed: {text} ({r})")))
    }

    /// Compiles `unit` (name, text) with the named `headers` and `options`; `output` takes
    /// the compiled program's result (a CUBIN, PTX, a code object). Returns it with the
    /// program log; a failed compile's error carries the options and the log.
    pub(crate) fn compile<T>(
        &self,
        unit: (&str, &str),
        headers: &[(&str, &str)],
        options: &[String],
        output: impl FnOnce(Program) -> Result<T>,
    ) -> Result<(T, String)> {
        let cstr = |s: &str| CString::new(s).map_err(|_| Error::internal(format!("NUL byte in {s:?}")));
        let src = cstr(unit.1)?;
        let name = cstr(unit.0)?;
        let texts = headers.iter().map(|(_, t)| cstr(t)).collect::<Result<Vec<_>>>()?;
        let names = headers.iter().map(|(n, _)| cstr(n)).collect::<Result<Vec<_>>>()?;
        let text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        let opts = options.iter().map(|o| cstr(o)).collect::<Result<Vec<_>>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is to a live NUL-terminated string; the arrays hold
        // `headers.len()` entries.
        self.check(
            unsafe { (self.create)(&mut prog, src.as_ptr(), name.as_ptr(), headers.len() as c_int, text_ptrs.as_ptr(), name_ptrs.as_ptr()) },
            &format!("{}CreateProgram", self.prefix),
        )?;
        struct Destroy<'a>(&'a ProgramCalls, Program);
        impl Drop for Destroy<'_> {
            fn drop(&mut self) {
                // SAFETY: a program the create call made, destroyed once.
                unsafe { (self.0.destroy)(&mut self.1) };
            }
        }
        let guard = Destroy(self, prog);
        let prog = guard.1;
        // SAFETY: `opt_ptrs` holds `opts.len()` live strings.
        let r = unsafe { (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = self.log(prog);
        if r != 0 {
            let mut e = self.check(r, &format!("{}CompileProgram({})", self.prefix, unit.0)).unwrap_err();
            e.message = format!("{}; options {:?}; log:\n{}", e.message, options, log.trim_end());
            return Err(e);
        }
        Ok((output(prog)?, log))
    }

    /// The program log, up to its first NUL (empty when there is none).
    fn log(&self, prog: Program) -> String {
        let mut size = 0usize;
        // SAFETY: writes one size.
        if unsafe { (self.log_size)(prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes the library writes.
        if unsafe { (self.log)(prog, buf.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// The kernel cache's key of a compile for `arch` under runtime version `version`: every
/// kernel source, then `options`, then `tags` (the compiler and its version, the unit, what
/// the entry holds): anything that changes the output changes the key.
pub(crate) fn cache_key(arch: &str, version: u32, options: &[String], tags: &[String]) -> rustccl_kernels::CacheKey {
    let all: Vec<&str> = options.iter().chain(tags).map(String::as_str).collect();
    rustccl_kernels::CacheKey::new(rustccl_kernels::sources(), arch, version, &all)
}

/// Runs `load` (compile or read from the kernel cache, then load) for every operator and
/// element type with a collective kernel whose type `has` accepts, several at once (compiles
/// are one core each): how many pairs. What `preload_exec_kernels` of the GPU backends does.
pub(crate) fn for_every_exec_kernel(
    has: impl Fn(crate::types::DataType) -> bool,
    load: impl Fn(rustccl_kernels::DeviceOp, crate::types::DataType) -> Result<()> + Sync,
) -> Result<usize> {
    use crate::types::DataType;
    use rustccl_kernels::DeviceOp;
    let pairs: Vec<(DeviceOp, DataType)> = DeviceOp::ALL
        .iter()
        .flat_map(|&op| DataType::ALL.iter().map(move |&dt| (op, dt)))
        .filter(|&(op, dt)| has(dt) && rustccl_kernels::exec::exec_defines(op, dt as i32).is_some())
        .collect();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(4).min(pairs.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(op, dt)) = pairs.get(i) else { return Ok(()) };
                    load(op, dt)?;
                })
            })
            .collect();
        let panicked = || Err(Error::internal("compile thread panicked"));
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| panicked())).collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(pairs.len())
}

/// The disk cache of compiled kernels: `RUSTCCL_KERNEL_CACHE_DIR` (read as a parameter, so that
/// an env plugin or a configuration file may set it), else under `XDG_CACHE_HOME` or `HOME`
/// (see [`rustccl_kernels::cache_dir_from`]); `None` when no directory can be determined.
pub(crate) fn kernel_cache() -> Option<rustccl_kernels::KernelCache> {
    rustccl_kernels::cache_dir_from(|name| {
        if name == rustccl_kernels::CACHE_DIR_ENV {
            crate::params::env_str(name).map(std::ffi::OsString::from)
        } else {
            std::env::var_os(name)
        }
    })
    .map(rustccl_kernels::KernelCache::new)
}

/// Where the kernel compile checks (the NVRTC and hipRTC tests) keep what they compiled:
/// `RUSTCCL_TEST_KERNEL_CACHE_DIR` (CI sets it to a directory it keeps between runs). A
/// compile made before with the same sources, options and compiler is read from there, not
/// repeated; any change to one of them compiles again. Unset: every check compiles.
#[cfg(test)]
pub(crate) fn test_kernel_cache() -> Option<rustccl_kernels::KernelCache> {
    std::env::var_os("RUSTCCL_TEST_KERNEL_CACHE_DIR").filter(|d| !d.is_empty()).map(|d| rustccl_kernels::KernelCache::new(std::path::PathBuf::from(d)))
}

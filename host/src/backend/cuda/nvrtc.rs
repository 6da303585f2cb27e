//! NVRTC, found and loaded at run time, and the CUDA headers it compiles against.
//!
//! The library: `libnvrtc.so.13`, `.12` or plain `libnvrtc.so`, looked for in
//! `RUSTCCL_NVRTC_PATH` (a file or a directory), the directories of `LD_LIBRARY_PATH`,
//! `$CUDA_HOME`/`$CUDA_PATH` (`lib64`, `targets/x86_64-linux/lib`), `/usr/local/cuda/lib64`,
//! `/usr/local/cuda*/targets/x86_64-linux/lib` and `/usr/local/cuda*/lib64`, then by name
//! through the dynamic loader. It is opened by full path with `libloading` and called through
//! a small table of its C functions, so a missing NVRTC is an error, never a panic.
//!
//! The headers (`cuda_fp16.h`, `cuda_bf16.h`, `cuda_fp8.h`, and CCCL's `nv/target` they
//! include): `RUSTCCL_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`, the `include`
//! directory next to NVRTC's `lib` (toolkit and pip layouts), `/usr/local/cuda/include`,
//! `/usr/local/cuda*/targets/x86_64-linux/include`; with their `cccl` subdirectory when there
//! is one (CUDA 13 moved CCCL there).

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Environment variable: NVRTC's library file, or a directory holding it.
pub const NVRTC_PATH_ENV: &str = "RUSTCCL_NVRTC_PATH";
/// Environment variable: the CUDA include directory NVRTC compiles against.
pub const CUDA_INCLUDE_ENV: &str = "RUSTCCL_CUDA_INCLUDE";

/// The library file names tried, newest first.
pub const LIBRARY_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

use crate::backend::rtc::{Program, ProgramCalls};

/// NVRTC's functions (`nvrtcResult` is a C enum: an int): the program calls it shares with
/// hipRTC, and its own.
struct Api {
    calls: ProgramCalls,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    num_archs: unsafe extern "C" fn(*mut c_int) -> c_int,
    archs: unsafe extern "C" fn(*mut c_int) -> c_int,
}

/// A loaded NVRTC.
pub struct Nvrtc {
    api: Api,
    /// The file it was loaded from (or the name the loader resolved).
    pub path: PathBuf,
    /// `(major, minor)`.
    pub version: (i32, i32),
    /// The real architectures it compiles for (`sm_XY` as `XY`), ascending.
    pub archs: Vec<i32>,
    _lib: libloading::Library,
    /// `libnvrtc-builtins`, opened before NVRTC from the same directory (kept loaded).
    _builtins: Option<libloading::Library>,
}

/// The compile's output: the image and NVRTC's program log (warnings; ptxas' report when
/// asked for with [`super::ptxas::VERBOSE_OPTION`]).
pub struct Compiled {
    pub image: Vec<u8>,
    pub log: String,
}

/// The directories searched for the library, in order.
pub fn library_dirs(env: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(ld) = env("LD_LIBRARY_PATH") {
        dirs.extend(ld.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env(var).filter(|r| !r.is_empty()) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("targets/x86_64-linux/lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    for root in versioned_cuda_roots() {
        dirs.push(root.join("targets/x86_64-linux/lib"));
        dirs.push(root.join("lib64"));
    }
    dedup(dirs)
}

/// `/usr/local/cuda-*`, newest version first.
fn versioned_cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/local")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix("cuda-")?;
            let key = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
            Some((key, e.path()))
        })
        .collect();
    roots.sort_by(|a, b| b.0.cmp(&a.0));
    roots.into_iter().map(|(_, p)| p).collect()
}

fn dedup(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in paths {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn env_var(name: &str) -> Option<String> {
    crate::params::env_str(name)
}

impl Nvrtc {
    /// The process's NVRTC, loaded on first use; the error is kept and returned to every
    /// caller.
    pub fn get() -> Result<&'static Nvrtc> {
        static NVRTC: OnceLock<Result<Nvrtc>> = OnceLock::new();
        NVRTC.get_or_init(Nvrtc::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Nvrtc> {
        let mut tried: Vec<String> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        let mut files: Vec<PathBuf> = Vec::new();
        if let Some(p) = env_var(NVRTC_PATH_ENV) {
            let p = PathBuf::from(p);
            if p.is_dir() {
                files.extend(LIBRARY_NAMES.iter().map(|n| p.join(n)));
            } else {
                files.push(p);
            }
        }
        for dir in library_dirs(env_var) {
            files.extend(LIBRARY_NAMES.iter().map(|n| dir.join(n)));
        }
        for file in files.iter().filter(|f| f.exists()) {
            tried.push(file.display().to_string());
            match Nvrtc::open(file.as_os_str(), file.clone()) {
                Ok(n) => return Ok(n),
                Err(e) => errors.push(e.message),
            }
        }
        // Last, the loader's own search (ld.so.cache, RUNPATH).
        for name in LIBRARY_NAMES {
            if let Ok(n) = Nvrtc::open(std::ffi::OsStr::new(name), PathBuf::from(name)) {
                return Ok(n);
            }
        }
        let dirs: Vec<String> = library_dirs(env_var).iter().map(|d| d.display().to_string()).collect();
        Err(Error::cuda(format!(
            "NVRTC not found: none of {} could be loaded from {NVRTC_PATH_ENV}, the directories [{}] \
             or the dynamic loader's path{}{}; install the CUDA toolkit's NVRTC and add its lib \
             directory to LD_LIBRARY_PATH (or set {NVRTC_PATH_ENV})",
            LIBRARY_NAMES.join(", "),
            dirs.join(", "),
            if tried.is_empty() { String::new() } else { format!(" (found but failed: {})", tried.join(", ")) },
            if errors.is_empty() { String::new() } else { format!(": {}", errors.join("; ")) },
        )))
    }

    fn open(file: &std::ffi::OsStr, path: PathBuf) -> Result<Nvrtc> {
        let builtins = preload_builtins(&path);
        // SAFETY: loading NVRTC runs its initialisers, which are sound to run.
        let lib = unsafe { libloading::Library::new(file) }
            .map_err(|e| Error::cuda(format!("loading {}: {e}", path.display())))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the function's C signature (nvrtc.h).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| Error::cuda(format!("{}: missing {}: {e}", path.display(), $name)))?
            };
        }
        let api = Api {
            calls: ProgramCalls {
                prefix: "nvrtc",
                error: Error::cuda,
                error_string: sym!("nvrtcGetErrorString"),
                create: sym!("nvrtcCreateProgram"),
                destroy: sym!("nvrtcDestroyProgram"),
                compile: sym!("nvrtcCompileProgram"),
                log_size: sym!("nvrtcGetProgramLogSize"),
                log: sym!("nvrtcGetProgramLog"),
            },
            version: sym!("nvrtcVersion"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            num_archs: sym!("nvrtcGetNumSupportedArchs"),
            archs: sym!("nvrtcGetSupportedArchs"),
        };
        let mut n = Nvrtc { api, path, version: (0, 0), archs: Vec::new(), _lib: lib, _builtins: builtins };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        n.check(unsafe { (n.api.version)(&mut major, &mut minor) }, "nvrtcVersion")?;
        n.version = (major, minor);
        let mut count = 0;
        // SAFETY: writes one int.
        n.check(unsafe { (n.api.num_archs)(&mut count) }, "nvrtcGetNumSupportedArchs")?;
        let mut archs = vec![0 as c_int; count.max(0) as usize];
        // SAFETY: `archs` holds the `count` ints NVRTC writes.
        n.check(unsafe { (n.api.archs)(archs.as_mut_ptr()) }, "nvrtcGetSupportedArchs")?;
        archs.sort_unstable();
        n.archs = archs;
        Ok(n)
    }

    fn check(&self, r: c_int, what: &str) -> Result<()> {
        self.api.calls.check(r, what)
    }

    /// What to compile for a device of compute capability `cc` (e.g. 90): a CUBIN for
    /// `sm_XY` when NVRTC knows the architecture; else PTX for the newest architecture it
    /// knows below it (the driver compiles it at load); `None` when it knows none.
    pub fn target_for(&self, cc: i32) -> Option<Target> {
        if self.archs.contains(&cc) {
            return Some(Target { arch: format!("sm_{cc}"), cubin: true });
        }
        self.archs.iter().rev().find(|a| **a <= cc).map(|a| Target { arch: format!("compute_{a}"), cubin: false })
    }

    /// Compiles `unit` (name, text) with the named `headers` and `options`, returning the
    /// CUBIN (`cubin`) or the PTX (NUL-terminated, as `cuModuleLoadData` wants it).
    pub fn compile(
        &self,
        unit: (&str, &str),
        headers: &[(&str, &str)],
        options: &[String],
        cubin: bool,
    ) -> Result<Vec<u8>> {
        Ok(self.compile_with_log(unit, headers, options, cubin)?.image)
    }

    /// [`Nvrtc::compile`], also returning the program log of the successful compile.
    pub fn compile_with_log(
        &self,
        unit: (&str, &str),
        headers: &[(&str, &str)],
        options: &[String],
        cubin: bool,
    ) -> Result<Compiled> {
        let (image, log) = self.api.calls.compile(unit, headers, options, |prog| {
            let (size_fn, get_fn, what) = if cubin {
                (self.api.cubin_size, self.api.cubin, "CUBIN")
            } else {
                (self.api.ptx_size, self.api.ptx, "PTX")
            };
            let mut size = 0usize;
            // SAFETY: writes one size.
            self.check(unsafe { size_fn(prog, &mut size) }, &format!("nvrtcGet{what}Size"))?;
            let mut out = vec![0u8; size];
            // SAFETY: `out` holds the `size` bytes NVRTC writes (PTX's size counts its NUL).
            self.check(unsafe { get_fn(prog, out.as_mut_ptr() as *mut c_char) }, &format!("nvrtcGet{what}"))?;
            if !cubin && out.last() != Some(&0) {
                out.push(0);
            }
            Ok(out)
        })?;
        Ok(Compiled { image, log })
    }
}

/// Opens NVRTC's builtins library (`libnvrtc-builtins.so.M.m`) from the directory of
/// `nvrtc` (a path to `libnvrtc.so.M` or `libnvrtc.so`), globally, so that NVRTC, which opens
/// it by name when it compiles, finds it there even when that directory is not on the
/// loader's path (pip's wheels have no RUNPATH). `None` when there is none or it does not
/// load: NVRTC then looks for it itself (and says so when it cannot find it).
fn preload_builtins(nvrtc: &Path) -> Option<libloading::Library> {
    let file = builtins_next_to(nvrtc)?;
    // SAFETY: loading NVRTC's builtins runs their initialisers, which are sound to run.
    match unsafe { libloading::os::unix::Library::open(Some(&file), libc::RTLD_NOW | libc::RTLD_GLOBAL) } {
        Ok(lib) => Some(lib.into()),
        Err(e) => {
            tracing::debug!(target: "INIT", "could not preload {}: {e}", file.display());
            None
        }
    }
}

/// The builtins library in `nvrtc`'s directory that goes with it: for `libnvrtc.so.13`, the
/// newest `libnvrtc-builtins.so.13.*`; for `libnvrtc.so`, the newest of any version.
fn builtins_next_to(nvrtc: &Path) -> Option<PathBuf> {
    let dir = nvrtc.parent().filter(|d| !d.as_os_str().is_empty())?;
    let major = nvrtc.file_name()?.to_str()?.strip_prefix("libnvrtc.so")?.trim_start_matches('.').to_string();
    let prefix = if major.is_empty() { "libnvrtc-builtins.so.".to_string() } else { format!("libnvrtc-builtins.so.{major}.") };
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix("libnvrtc-builtins.so.")?;
            name.starts_with(&prefix).then_some(())?;
            let key = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
            Some((key, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// What NVRTC compiles for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `sm_XY` (CUBIN) or `compute_XY` (PTX).
    pub arch: String,
    pub cubin: bool,
}

/// The include directories to pass NVRTC (`-I`): the first directory holding `cuda_fp16.h`,
/// and its `cccl` subdirectory when there is one. Empty when none is found (NVRTC may still
/// have the headers built in; if not, compiling fails with a message that says so).
pub fn include_dirs(nvrtc_path: &Path, env: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = env(CUDA_INCLUDE_ENV) {
        candidates.push(PathBuf::from(dir));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env(var) {
            candidates.push(Path::new(&root).join("include"));
            candidates.push(Path::new(&root).join("targets/x86_64-linux/include"));
        }
    }
    // Next to the library: <root>/lib64 or <root>/targets/x86_64-linux/lib or pip's <root>/lib.
    if let Some(lib_dir) = std::fs::canonicalize(nvrtc_path).ok().as_deref().and_then(Path::parent) {
        if let Some(root) = lib_dir.parent() {
            candidates.push(root.join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/include"));
    for root in versioned_cuda_roots() {
        candidates.push(root.join("targets/x86_64-linux/include"));
        candidates.push(root.join("include"));
    }
    match dedup(candidates).into_iter().find(|d| d.join("cuda_fp16.h").is_file()) {
        None => Vec::new(),
        Some(dir) => {
            let cccl = dir.join("cccl");
            let mut dirs = vec![dir];
            if cccl.join("nv").is_dir() {
                dirs.push(cccl);
            }
            dirs
        }
    }
}

/// [`include_dirs`] from the process environment.
pub fn include_dirs_from_env(nvrtc_path: &Path) -> Vec<PathBuf> {
    include_dirs(nvrtc_path, env_var)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_dirs_follow_the_environment() {
        let env = |name: &str| match name {
            "LD_LIBRARY_PATH" => Some("/a::/b".to_string()),
            "CUDA_HOME" => Some("/opt/cuda".to_string()),
            _ => None,
        };
        let dirs = library_dirs(env);
        assert_eq!(dirs[0], PathBuf::from("/a"));
        assert_eq!(dirs[1], PathBuf::from("/b"));
        assert_eq!(dirs[2], PathBuf::from("/opt/cuda/lib64"));
        assert!(dirs.contains(&PathBuf::from("/usr/local/cuda/lib64")));
    }

    #[test]
    fn builtins_are_the_ones_of_the_library_version() {
        let dir = std::env::temp_dir().join(format!("rustccl-nvrtc-builtins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libnvrtc.so.13",
            "libnvrtc-builtins.so.12.9",
            "libnvrtc-builtins.so.13.0",
            "libnvrtc-builtins.so.13.2",
            "libnvrtc-builtins.alt.so.13.9",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        assert_eq!(builtins_next_to(&dir.join("libnvrtc.so.13")), Some(dir.join("libnvrtc-builtins.so.13.2")));
        assert_eq!(builtins_next_to(&dir.join("libnvrtc.so.12")), Some(dir.join("libnvrtc-builtins.so.12.9")));
        assert_eq!(builtins_next_to(&dir.join("libnvrtc.so")), Some(dir.join("libnvrtc-builtins.so.13.2")));
        assert_eq!(builtins_next_to(&dir.join("libnvrtc.so.11")), None);
        // A name resolved by the loader (no directory): nothing to preload.
        assert_eq!(builtins_next_to(Path::new("libnvrtc.so.13")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn include_dirs_find_the_headers_and_cccl() {
        let root = std::env::temp_dir().join(format!("rustccl-nvrtc-inc-{}", std::process::id()));
        let inc = root.join("include");
        std::fs::create_dir_all(inc.join("cccl/nv")).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(inc.join("cuda_fp16.h"), "").unwrap();
        let lib = root.join("lib/libnvrtc.so.13");
        std::fs::write(&lib, "").unwrap();
        // Next to the library (the pip layout).
        let dirs = include_dirs(&lib, |_| None);
        let inc = std::fs::canonicalize(&inc).unwrap();
        assert_eq!(dirs, vec![inc.clone(), inc.join("cccl")]);
        // The override wins.
        let other = root.join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("cuda_fp16.h"), "").unwrap();
        let o = other.display().to_string();
        let dirs = include_dirs(&lib, |n| (n == CUDA_INCLUDE_ENV).then(|| o.clone()));
        assert_eq!(dirs, vec![other]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}

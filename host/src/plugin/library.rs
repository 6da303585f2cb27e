//! Plugin libraries, opened once per process and shared: every user holds an `Arc`, and the
//! library is closed when the last one is dropped.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use super::elf_check;

/// An open plugin library.
pub struct PluginLibrary {
    /// The file name as tried.
    pub request: String,
    /// Where the dynamic linker found it.
    pub path: String,
    pub lib: libloading::Library,
}

impl std::fmt::Debug for PluginLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PluginLibrary({})", self.path)
    }
}

/// Why a library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// No such file (the usual outcome for default names; not worth a warning).
    NotFound,
    /// The file exists but could not be loaded.
    Failed(String),
}

static OPEN: Mutex<Option<HashMap<String, Weak<PluginLibrary>>>> = Mutex::new(None);

/// Opens `file` (a path, or a name the dynamic linker searches for), or returns the copy
/// already open in this process. The file is checked first (`check_before_open`): a broken
/// one is refused with the reason instead of crashing the process inside `dlopen`.
pub fn open(file: &str) -> Result<Arc<PluginLibrary>, OpenError> {
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    let map = open.get_or_insert_with(HashMap::new);
    if let Some(lib) = map.get(file).and_then(Weak::upgrade) {
        return Ok(lib);
    }
    check_before_open(file).map_err(OpenError::Failed)?;
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading a plugin runs its initialisers; loading plugins is what the user asked
    // for by naming them (or by installing them under the default names).
    let lib = unsafe { libloading::os::unix::Library::open(Some(file), flags) }.map_err(|e| {
        // libloading's own text is just "dlopen failed"; the reason is in the source error.
        let text = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
        if text.contains("No such file") || text.contains("cannot open shared object file") && !std::path::Path::new(file).exists() {
            OpenError::NotFound
        } else {
            OpenError::Failed(text.replace('\n', " "))
        }
    })?;
    let raw = lib.into_raw();
    let path = loaded_path(raw).unwrap_or_else(|| file.to_string());
    // SAFETY: `raw` came from `into_raw` just above and is owned again by the new value.
    let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
    let lib = Arc::new(PluginLibrary { request: file.to_string(), path, lib: lib.into() });
    map.insert(file.to_string(), Arc::downgrade(&lib));
    Ok(lib)
}

/// Checks the file that `dlopen(file)` would map, before it does (see [`elf_check`] for why
/// and what is checked); the error is the reason, for the log.
///
/// A path (`file` has a `/`) is checked itself; a missing one is left to `dlopen`, which
/// reports it as missing. A bare name is looked for as the dynamic loader looks for it, as far
/// as can be known from here: in the directories of `LD_LIBRARY_PATH`, then the usual system
/// directories ([`name_search_dirs`]). A file built for another machine or class is passed
/// over there, as the loader passes over it; the first other file found decides.
/// Not covered, so a broken file reached only through them still goes to `dlopen`: the
/// program's and libnccl's own `DT_RPATH`/`DT_RUNPATH`, `$ORIGIN`-style tokens in
/// `LD_LIBRARY_PATH`, and directories that only `/etc/ld.so.cache` knows (`ld.so.conf`
/// entries other than the usual ones), in the order the cache would give.
fn check_before_open(file: &str) -> Result<(), String> {
    if file.contains('/') {
        let path = Path::new(file);
        if std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            return Ok(());
        }
        return elf_check::check_library(path).map_err(|e| e.reason);
    }
    check_name(file, &name_search_dirs())
}

/// The check of a bare library name against the files of that name in `dirs`, in order.
fn check_name(name: &str, dirs: &[PathBuf]) -> Result<(), String> {
    for dir in dirs {
        let path = dir.join(name);
        if std::fs::metadata(&path).is_err() {
            continue;
        }
        match elf_check::check_library(&path) {
            Ok(()) => return Ok(()),
            Err(e) if e.foreign => continue,
            Err(e) => return Err(format!("found as {}: {}", path.display(), e.reason)),
        }
    }
    Ok(())
}

/// Where the dynamic loader looks for a bare library name, as far as [`check_name`] follows
/// it: the entries of `LD_LIBRARY_PATH` (an empty one is the current directory, as for the
/// loader; ones with `$` tokens are left out), then `/usr/local/lib`, the multiarch
/// directories (`/lib/<arch>-linux-gnu`, `/usr/lib/<arch>-linux-gnu`), `/lib64`, `/usr/lib64`,
/// `/lib` and `/usr/lib`. Directories that do not exist cost one failed `stat` each.
fn name_search_dirs() -> Vec<PathBuf> {
    let ld_path = std::env::var_os("LD_LIBRARY_PATH").map(|v| v.to_string_lossy().into_owned()).unwrap_or_default();
    let mut dirs: Vec<PathBuf> = if ld_path.is_empty() {
        Vec::new()
    } else {
        ld_path
            .split([':', ';'])
            .filter(|d| !d.contains('$'))
            .map(|d| PathBuf::from(if d.is_empty() { "." } else { d }))
            .collect()
    };
    let multiarch = format!("{}-linux-gnu", std::env::consts::ARCH);
    dirs.push(PathBuf::from("/usr/local/lib"));
    dirs.push(Path::new("/lib").join(&multiarch));
    dirs.push(Path::new("/usr/lib").join(&multiarch));
    for d in ["/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// The first fields of glibc's `struct link_map` (`<link.h>`), all that is read of it.
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const libc::c_char,
}

/// A link map's `l_name`: the path the object was loaded from, empty for the main program.
///
/// # Safety
/// `map` is NULL or a `struct link_map` of an object that stays loaded during the call.
unsafe fn link_map_name(map: *const LinkMap) -> Option<String> {
    if map.is_null() {
        return None;
    }
    // SAFETY: non-NULL, a live link map (the caller's contract); l_name is NULL or a
    // NUL-terminated string owned by the loader.
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

/// The path of a loaded library, from the dynamic linker's link map.
fn loaded_path(handle: *mut libc::c_void) -> Option<String> {
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes a pointer to the
    // library's `struct link_map`, whose first two fields are `l_addr` and `l_name`.
    let rc = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, &mut map as *mut _ as *mut libc::c_void) };
    if rc != 0 {
        return None;
    }
    // SAFETY: the link map of a library that `handle` keeps loaded.
    unsafe { link_map_name(map) }.filter(|s| !s.is_empty())
}

/// `dladdr1`'s request for the object's link map (`RTLD_DL_LINKMAP` in `<dlfcn.h>`).
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// The directory of the file that holds this code: `libnccl.so.2` (or whatever shared library
/// rustccl is linked into) for C programs, the executable for Rust programs, which link rustccl
/// statically. The IB transport is looked for there ([`super::net_order::ib_library_files`]),
/// as a program's `$ORIGIN` would find it. The executable is named by the kernel
/// (`/proc/self/exe`), not by `argv[0]` (what `dladdr` gives for it, maybe a bare name or a
/// path relative to another directory); a library by the path it was loaded from. `None` when
/// neither can be told.
pub fn rustccl_directory() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain C data (pointers and integers), for which all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut libc::c_void = std::ptr::null_mut();
    let addr = rustccl_directory as *const libc::c_void;
    // SAFETY: dladdr1 only reads the address (a function of this object) and fills `info` and,
    // with RTLD_DL_LINKMAP, `map` with the object's `struct link_map`.
    let found = unsafe { libc::dladdr1(addr, &mut info, &mut map, RTLD_DL_LINKMAP) } != 0;
    if !found {
        return None;
    }
    // SAFETY: the link map of the object holding this function, loaded while it runs.
    let file = match unsafe { link_map_name(map as *const LinkMap) } {
        Some(name) if !name.is_empty() => PathBuf::from(name),
        // The main program's link map has an empty name.
        _ => std::env::current_exe().ok()?,
    };
    file.parent().map(Path::to_path_buf)
}

/// Names of NCCL's C plugin symbols this library exports (adapters for them come later).
pub fn nccl_c_symbols(lib: &PluginLibrary, prefix: &str, versions: std::ops::RangeInclusive<u32>) -> Vec<String> {
    versions
        .rev()
        .map(|v| format!("{prefix}{v}"))
        .filter(|name| {
            // SAFETY: only the presence of the symbol is checked; it is not used.
            unsafe { lib.lib.get::<*const u8>(name.as_bytes()) }.is_ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use elf_check::test_files::{real_library, Dir};

    /// A real library, the same cut to 4 KiB, and the same patched for another machine.
    fn copies(dir: &Dir, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let bytes = std::fs::read(real_library()).unwrap();
        let good = dir.write(&format!("good/{name}"), &bytes);
        let broken = dir.write(&format!("broken/{name}"), &bytes[..4096]);
        let mut patched = bytes;
        let other: u16 = if std::env::consts::ARCH == "aarch64" { 62 } else { 183 };
        let at = if cfg!(target_endian = "little") { other.to_le_bytes() } else { other.to_be_bytes() };
        patched[18..20].copy_from_slice(&at);
        let foreign = dir.write(&format!("foreign/{name}"), &patched);
        (good, broken, foreign)
    }

    #[test]
    fn rustccl_lives_beside_this_test_executable() {
        // The unit tests link rustccl statically: its directory is the test executable's.
        let exe = std::env::current_exe().unwrap();
        assert_eq!(rustccl_directory().as_deref(), exe.parent());
    }

    #[test]
    fn a_name_is_checked_where_the_loader_would_find_it() {
        let dir = Dir::new("names");
        let (good, broken, foreign) = copies(&dir, "libx.so");
        let parent = |p: &Path| p.parent().unwrap().to_path_buf();
        let (good, broken, foreign) = (parent(&good), parent(&broken), parent(&foreign));
        let missing = dir.0.join("missing");
        let in_order = |dirs: &[&PathBuf]| dirs.iter().map(|d| d.to_path_buf()).collect::<Vec<_>>();
        assert_eq!(check_name("libx.so", &in_order(&[&missing, &good, &broken])), Ok(()), "the first found decides");
        let e = check_name("libx.so", &in_order(&[&foreign, &missing, &broken, &good])).unwrap_err();
        assert!(e.starts_with(&format!("found as {}: truncated: ", broken.join("libx.so").display())), "{e}");
        assert_eq!(check_name("libx.so", &in_order(&[&foreign])), Ok(()), "only a foreign file: left to dlopen");
        assert_eq!(check_name("liby.so", &in_order(&[&good, &broken, &foreign])), Ok(()), "not found here: left to dlopen");
    }

    #[test]
    fn a_path_is_checked_itself_and_a_missing_one_left_to_dlopen() {
        let dir = Dir::new("paths");
        let (good, broken, foreign) = copies(&dir, "libx.so");
        assert_eq!(check_before_open(good.to_str().unwrap()), Ok(()));
        assert!(check_before_open(broken.to_str().unwrap()).unwrap_err().starts_with("truncated: PT_LOAD segment "));
        assert!(check_before_open(foreign.to_str().unwrap()).unwrap_err().starts_with("built for "));
        assert_eq!(check_before_open(dir.0.join("missing.so").to_str().unwrap()), Ok(()));
        assert_eq!(check_before_open(dir.0.to_str().unwrap()), Err("is a directory".to_string()));
        assert_eq!(open(broken.to_str().unwrap()).unwrap_err(), OpenError::Failed(check_before_open(broken.to_str().unwrap()).unwrap_err()));
    }
}

//! Plugin libraries, opened once per process and shared: every user holds an `Arc`, and the
//! library is closed when the last one is dropped.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex, Weak};

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
/// already open in this process.
pub fn open(file: &str) -> Result<Arc<PluginLibrary>, OpenError> {
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    let map = open.get_or_insert_with(HashMap::new);
    if let Some(lib) = map.get(file).and_then(Weak::upgrade) {
        return Ok(lib);
    }
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

/// The path of a loaded library, from the dynamic linker's link map.
fn loaded_path(handle: *mut libc::c_void) -> Option<String> {
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const libc::c_char,
    }
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes a pointer to the
    // library's `struct link_map`, whose first two fields are `l_addr` and `l_name`.
    let rc = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, &mut map as *mut _ as *mut libc::c_void) };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: checked non-null above; l_name is a NUL-terminated string owned by the loader.
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
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

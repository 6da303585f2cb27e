//! Loading libibverbs.so.1 at run time and resolving the functions the plugin calls.
//!
//! The library is opened once per process, from `NCCL_IBVERBS_LIB` when set, else by its
//! soname, and never unloaded (so no function pointer can dangle). Each function is looked
//! up under the symbol version NCCL asks for: libibverbs exports two `ibv_query_port`,
//! `ibv_create_qp`, ... (`IBVERBS_1.0`, an ABI from before 2006, and `IBVERBS_1.1`), and
//! only the second takes today's structures. Functions added later (`ibv_reg_mr_iova2`,
//! `ibv_reg_dmabuf_mr`, `_ibv_query_gid_ex`) are optional: an older library leaves them
//! `None` and the caller falls back or reports the feature as absent.
//!
//! `ibv_query_gid_type` is not resolved: it lives in libibverbs' private ABI
//! (`IBVERBS_PRIVATE_<n>`, a new version node in every rdma-core release), so no fixed
//! lookup can find it; `_ibv_query_gid_ex` gives the same GID type through the public ABI,
//! and sysfs does on libraries older than rdma-core 32.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

use rustccl_plugin_api::PluginError;

use super::types::*;

/// The library's soname, opened when `NCCL_IBVERBS_LIB` is not set.
pub const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

/// The symbol version of every function that exists since libibverbs 1.1.
const V1_1: &str = "IBVERBS_1.1";

/// The functions of one loaded libibverbs. Calling them is `unsafe` (C functions on raw
/// pointers); the safe layer is [`super::owned`].
pub struct Verbs {
    /// Where the library was loaded from (the value given to dlopen).
    pub path: String,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    /// `ibv_get_device_guid`: the node GUID, network byte order.
    pub get_device_guid: unsafe extern "C" fn(*mut ibv_device) -> u64,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    /// The exported (compat) `ibv_query_port`, as NCCL calls it: it fills the attributes up
    /// to `flags`, the layout every library version shares.
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    /// `ibv_reg_mr_iova2` (`IBVERBS_1.8`, rdma-core 29): registration with optional access
    /// flags such as relaxed ordering.
    pub reg_mr_iova2:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr>,
    /// `ibv_reg_dmabuf_mr` (`IBVERBS_1.12`, rdma-core 34): registration of a dma-buf.
    pub reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    /// `_ibv_query_gid_ex` (`IBVERBS_1.11`, rdma-core 32): a GID with its type.
    pub query_gid_ex: Option<
        unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
    >,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Verbs {
    /// The process's libibverbs, loaded at the first call from `library` (the value of
    /// `NCCL_IBVERBS_LIB`, `None` for the soname); later calls return the same library or
    /// the same error, whatever they pass (as NCCL, which loads it once).
    pub fn get(library: Option<&str>) -> Result<&'static Verbs, PluginError> {
        static LOADED: OnceLock<Result<&'static Verbs, PluginError>> = OnceLock::new();
        LOADED
            .get_or_init(|| Verbs::open(library).map(|v| &*Box::leak(Box::new(v))))
            .clone()
    }

    /// Loads the library named `library` (`None`: [`DEFAULT_LIBRARY`]) and resolves its
    /// functions, without caching: [`Verbs::get`] is the entry point; this one lets tests
    /// try paths that do not exist.
    pub fn open(library: Option<&str>) -> Result<Verbs, PluginError> {
        let path = library
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .unwrap_or(DEFAULT_LIBRARY);
        // SAFETY: loading libibverbs runs its initialisers, which only read its config
        // directory and sysfs; RTLD_NOW resolves everything up front, so a broken library
        // fails here rather than at a later call.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| not_loadable(library.is_some(), path, &e.to_string()))?;
        // Never unloaded: the handle is given up, so function pointers stay valid for the
        // process's life.
        let handle = lib.into_raw();
        let need = |name: &str| {
            lookup(handle, name, V1_1).ok_or_else(|| {
                PluginError::system(format!(
                    "{path} lacks {name}@{V1_1}: it is not rdma-core's libibverbs.so.1 (or a \
                     stand-in missing a function); install rdma-core's libibverbs1 or point \
                     NCCL_IBVERBS_LIB at a complete libibverbs.so.1"
                ))
            })
        };
        // SAFETY (every as_fn below): the pointer is the named libibverbs function, found
        // under the version whose C prototype the field's type repeats (verbs.h).
        unsafe {
            Ok(Verbs {
                path: path.to_string(),
                get_device_list: as_fn(need("ibv_get_device_list")?),
                free_device_list: as_fn(need("ibv_free_device_list")?),
                get_device_name: as_fn(need("ibv_get_device_name")?),
                get_device_guid: as_fn(need("ibv_get_device_guid")?),
                open_device: as_fn(need("ibv_open_device")?),
                close_device: as_fn(need("ibv_close_device")?),
                query_device: as_fn(need("ibv_query_device")?),
                query_port: as_fn(need("ibv_query_port")?),
                query_gid: as_fn(need("ibv_query_gid")?),
                alloc_pd: as_fn(need("ibv_alloc_pd")?),
                dealloc_pd: as_fn(need("ibv_dealloc_pd")?),
                reg_mr: as_fn(need("ibv_reg_mr")?),
                dereg_mr: as_fn(need("ibv_dereg_mr")?),
                create_cq: as_fn(need("ibv_create_cq")?),
                destroy_cq: as_fn(need("ibv_destroy_cq")?),
                create_qp: as_fn(need("ibv_create_qp")?),
                modify_qp: as_fn(need("ibv_modify_qp")?),
                destroy_qp: as_fn(need("ibv_destroy_qp")?),
                get_async_event: as_fn(need("ibv_get_async_event")?),
                ack_async_event: as_fn(need("ibv_ack_async_event")?),
                reg_mr_iova2: lookup(handle, "ibv_reg_mr_iova2", "IBVERBS_1.8").map(|p| as_fn(p)),
                reg_dmabuf_mr: lookup(handle, "ibv_reg_dmabuf_mr", "IBVERBS_1.12")
                    .map(|p| as_fn(p)),
                query_gid_ex: lookup(handle, "_ibv_query_gid_ex", "IBVERBS_1.11").map(|p| as_fn(p)),
            })
        }
    }
}

/// The function pointer of type `F` at address `p`.
///
/// # Safety
/// `p` is a function whose C prototype `F` (an `unsafe extern "C" fn` type) repeats.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked), and the caller's promise on the prototype.
    unsafe { std::mem::transmute_copy(&p) }
}

/// The error for a library that dlopen refuses: what to install, or what to fix in
/// `NCCL_IBVERBS_LIB` when the user named one.
fn not_loadable(user_path: bool, path: &str, why: &str) -> PluginError {
    if user_path {
        PluginError::system(format!(
            "NCCL_IBVERBS_LIB={path} cannot be loaded ({why}); point it at a libibverbs.so.1 \
             or unset it to use the system's"
        ))
    } else {
        PluginError::system(format!(
            "{DEFAULT_LIBRARY} not found ({why}): install rdma-core's libibverbs1 (Debian, \
             Ubuntu; rdma-core or libibverbs elsewhere) or set NCCL_IBVERBS_LIB to its path"
        ))
    }
}

/// `name` at `version` in the library behind `handle` (`dlvsym`; a library without symbol
/// versions, such as a test stand-in built without a version script, answers for any
/// version); `None` when absent.
fn lookup(handle: *mut c_void, name: &str, version: &str) -> Option<*mut c_void> {
    let name = CString::new(name).ok()?;
    let version = CString::new(version).ok()?;
    #[cfg(target_env = "gnu")]
    // SAFETY: `handle` is a live dlopen handle (never closed); both strings are
    // NUL-terminated.
    let sym = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    #[cfg(not(target_env = "gnu"))]
    // SAFETY: as above; without dlvsym, the default version of the symbol.
    let sym = unsafe {
        let _ = &version;
        libc::dlsym(handle, name.as_ptr())
    };
    (!sym.is_null()).then_some(sym)
}

/// The text of the NUL-terminated C string `p`, or `""` for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
pub unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_what_to_install() {
        let e = Verbs::open(Some("/nonexistent/rustccl/libibverbs.so.1")).unwrap_err();
        assert_eq!(e.code, PluginError::SYSTEM);
        assert!(
            e.message.starts_with(
                "NCCL_IBVERBS_LIB=/nonexistent/rustccl/libibverbs.so.1 cannot be loaded ("
            ),
            "{e}"
        );
        assert!(e.message.contains("unset it"), "{e}");

        let e = not_loadable(false, DEFAULT_LIBRARY, "cannot open shared object file");
        assert!(e.message.starts_with("libibverbs.so.1 not found ("), "{e}");
        assert!(e.message.contains("install rdma-core's libibverbs1"), "{e}");
        assert!(e.message.contains("set NCCL_IBVERBS_LIB"), "{e}");
    }

    #[test]
    fn a_library_without_verbs_is_refused_by_name() {
        // libc is loadable but is no libibverbs: the first missing function is named.
        let e = Verbs::open(Some("libc.so.6")).unwrap_err();
        assert!(
            e.message
                .starts_with("libc.so.6 lacks ibv_get_device_list@IBVERBS_1.1"),
            "{e}"
        );
    }

    #[test]
    fn the_system_library_resolves_every_function_when_installed() {
        // Where rdma-core is installed (CI installs libibverbs-dev), every required symbol is
        // found under its version, and rdma-core 34+ has the optional ones.
        match Verbs::open(None) {
            Ok(v) => {
                assert_eq!(v.path, DEFAULT_LIBRARY);
                assert!(
                    v.query_gid_ex.is_some() && v.reg_mr_iova2.is_some(),
                    "{v:?}"
                );
            }
            Err(e) => {
                assert!(e.message.starts_with("libibverbs.so.1 not found ("), "{e}");
                println!("skipped: {e}");
            }
        }
    }
}

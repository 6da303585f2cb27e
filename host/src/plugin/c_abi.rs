//! What every adapter of NCCL's C plugin tables shares: the variadic logger NCCL passes to a
//! plugin's `init` (`ncclDebugLogger_t`, formatted by `csrc/nccl_logger.c` and logged here
//! through rustccl's log), `ncclResult_t` codes turned into [`PluginError`]s, C strings read
//! defensively, and the lookup of an exported table by its symbol name.
//!
//! The per-kind adapters (`c_net`, `c_tuner`, `c_profiler`) declare the `#[repr(C)]` tables of
//! each version (layouts from NCCL's plugin headers) and implement the core's trait over them.

use std::ffi::{c_char, c_int, c_ulong, CStr};

use abi_stable::std_types::RStr;
use rustccl_plugin_api::PluginError;

use super::library::PluginLibrary;

/// NCCL's `ncclDebugLogger_t`: `(level, subsystem flags, file, line, printf format, ...)`.
pub type NcclDebugLogger =
    unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);

extern "C" {
    /// Defined in `csrc/nccl_logger.c`: formats and calls [`rustccl_c_plugin_log_line`].
    fn rustccl_c_plugin_logger(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);
}

/// The logger given to every C plugin.
pub fn logger() -> NcclDebugLogger {
    rustccl_c_plugin_logger
}

/// NCCL's log levels as C plugins pass them (`ncclDebugLogLevel`).
const NCCL_LOG_WARN: c_int = 2;
const NCCL_LOG_INFO: c_int = 3;
const NCCL_LOG_ABORT: c_int = 4;

/// Called by the C logger with the formatted line.
///
/// # Safety
/// `msg` is NULL or a NUL-terminated string alive for the call (the C logger's own buffer).
#[no_mangle]
pub unsafe extern "C" fn rustccl_c_plugin_log_line(level: c_int, flags: c_ulong, _file: *const c_char, _line: c_int, msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the C logger passes its own NUL-terminated buffer, alive for this call.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    let level = match level {
        NCCL_LOG_WARN | NCCL_LOG_ABORT => rustccl_plugin_api::log_level::WARN,
        NCCL_LOG_INFO => rustccl_plugin_api::log_level::INFO,
        l if l <= 1 => return, // NONE, VERSION: nothing to log
        _ => rustccl_plugin_api::log_level::TRACE,
    };
    super::host_log(level, u64::from(flags), RStr::from_str(text.trim_end()));
}

/// NCCL's `ncclResult_t` values.
pub mod result {
    pub const SUCCESS: i32 = 0;
    pub const UNHANDLED_CUDA_ERROR: i32 = 1;
    pub const SYSTEM_ERROR: i32 = 2;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE_ERROR: i32 = 6;
    pub const IN_PROGRESS: i32 = 7;
    pub const TIMEOUT: i32 = 8;
}

/// `Ok` for `ncclSuccess`; otherwise an error naming the plugin call, carrying the code
/// (unknown or odd codes, like `ncclInProgress` from a plugin, become internal errors).
pub fn check(code: c_int, what: &str) -> Result<(), PluginError> {
    match code {
        result::SUCCESS => Ok(()),
        c @ (result::UNHANDLED_CUDA_ERROR
        | result::SYSTEM_ERROR
        | result::INTERNAL_ERROR
        | result::INVALID_ARGUMENT
        | result::INVALID_USAGE
        | result::REMOTE_ERROR) => Err(PluginError::new(c, format!("{what} returned {}", result_name(c)))),
        c => Err(PluginError::internal(format!("{what} returned {c}, which is not a valid ncclResult_t here"))),
    }
}

fn result_name(code: i32) -> &'static str {
    match code {
        result::UNHANDLED_CUDA_ERROR => "ncclUnhandledCudaError",
        result::SYSTEM_ERROR => "ncclSystemError",
        result::INTERNAL_ERROR => "ncclInternalError",
        result::INVALID_ARGUMENT => "ncclInvalidArgument",
        result::INVALID_USAGE => "ncclInvalidUsage",
        result::REMOTE_ERROR => "ncclRemoteError",
        _ => "an unknown code",
    }
}

/// A C string a plugin handed over, or `default` when it is NULL; invalid UTF-8 is replaced.
///
/// # Safety
/// `ptr` is NULL or points at a NUL-terminated string alive for the call.
pub unsafe fn c_str_or(ptr: *const c_char, default: &str) -> String {
    if ptr.is_null() {
        return default.to_string();
    }
    // SAFETY: the caller promises a NUL-terminated string.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// The table a library exports under `symbol` (NCCL's `ncclNetPlugin_v11` and the like), as
/// a reference that lives as long as the library stays loaded (the caller keeps the
/// library's `Arc` beside it).
///
/// # Safety
/// `T` must be the layout NCCL defines for that symbol.
pub unsafe fn find_table<T>(lib: &PluginLibrary, symbol: &str) -> Option<&'static T> {
    // SAFETY: looking a data symbol up; its address is the table's (NCCL exports the struct
    // itself, not a pointer to it).
    let sym = unsafe { lib.lib.get::<*const T>(symbol.as_bytes()) }.ok()?;
    let ptr: *const T = *sym;
    // SAFETY: the caller promises `T` is the symbol's layout; the library outlives the
    // reference because its `Arc` is kept by every plugin made from it.
    unsafe { ptr.as_ref() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_become_errors_with_the_call_named() {
        assert!(check(0, "x").is_ok());
        let e = check(result::SYSTEM_ERROR, "ncclNet.init").unwrap_err();
        assert_eq!(e.code, PluginError::SYSTEM);
        assert!(e.message.contains("ncclNet.init returned ncclSystemError"), "{}", e.message);
        let e = check(result::IN_PROGRESS, "t.x").unwrap_err();
        assert_eq!(e.code, PluginError::INTERNAL);
        let e = check(77, "t.x").unwrap_err();
        assert!(e.message.contains("77"));
    }

    #[test]
    fn the_c_logger_formats_and_reaches_rust() {
        // Goes through the C vsnprintf and back; with no subscriber it must simply not crash,
        // and a NULL format is ignored.
        let fmt = c"value %d and %s";
        // SAFETY: a valid format with matching arguments.
        unsafe { logger()(NCCL_LOG_INFO, 0x10, c"f.c".as_ptr(), 1, fmt.as_ptr(), 42 as c_int, c"text".as_ptr()) };
        // SAFETY: NULL format is handled by the C side.
        unsafe { logger()(NCCL_LOG_WARN, 0, std::ptr::null(), 0, std::ptr::null()) };
    }

    #[test]
    fn null_strings_take_the_default() {
        // SAFETY: NULL and a literal.
        assert_eq!(unsafe { c_str_or(std::ptr::null(), "none") }, "none");
        assert_eq!(unsafe { c_str_or(c"IB".as_ptr(), "none") }, "IB");
    }
}

/// A C table's mandatory member, or why the table is refused (`abi`: whose ABI requires it).
pub(crate) fn required<F>(f: Option<F>, symbol: &str, member: &str, abi: &str) -> Result<F, String> {
    f.ok_or_else(|| format!("{symbol} has a NULL {member}, which NCCL's {abi} ABI requires"))
}

/// A C table's name, which must not be NULL.
pub(crate) fn table_name(ptr: *const c_char, symbol: &str) -> Result<String, String> {
    if ptr.is_null() {
        return Err(format!("{symbol} has a NULL name"));
    }
    // SAFETY: non-NULL; a plugin's name is a NUL-terminated string of its library, alive
    // while the library is loaded.
    Ok(unsafe { c_str_or(ptr, "") })
}

/// The first table that `load` finds and accepts among `versions` (newest first). `Ok(None)`:
/// the library exports none; a refused table lets an older one be tried, and the error lists
/// every refusal.
pub(crate) fn newest_table<T>(versions: &[u32], mut load: impl FnMut(u32) -> Result<Option<T>, String>) -> Result<Option<T>, String> {
    let mut refused = Vec::new();
    for &v in versions {
        match load(v) {
            Ok(Some(t)) => return Ok(Some(t)),
            Ok(None) => {}
            Err(e) => refused.push(e),
        }
    }
    if refused.is_empty() {
        Ok(None)
    } else {
        Err(refused.join("; "))
    }
}

//! NCCL's C env plugins (`ncclEnvPlugin_v1`, `ncclEnvPlugin_v2`), seen through the core's
//! [`Env`] trait.
//!
//! Layouts from NCCL's `plugins/env/example/nccl/env_v1.h` and `env_v2.h`:
//!
//! | version | `init` | other members |
//! |---|---|---|
//! | 1 | `(uint8 major, uint8 minor, uint8 patch, const char* suffix)` | `finalize(void)`, `const char* getEnv(const char* name)` |
//! | 2 | v1's arguments plus the `ncclDebugLogger_t` | as v1 |
//!
//! What the adapter does, as NCCL's loader does:
//! * `name`, `init` and `getEnv` are required: a table with one of them NULL is refused (and
//!   an older version tried). `finalize` may be NULL (NCCL calls it only when it is set).
//! * `getEnv` returns a pointer the plugin keeps valid until the next `getEnv` of the same
//!   name or `finalize`. The adapter copies the string before it returns, and calls `getEnv`
//!   under one lock, so no other call can come between the plugin's answer and the copy.
//!   NULL means unset; text that is not UTF-8 is taken with replacement characters.
//! * `init` gets the version `ncclGetVersion` reports and an empty suffix; v2's also the C
//!   logger every C plugin gets ([`c_abi::logger`]).

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::Mutex;

use rustccl_plugin_api::env::{Env, LibraryVersion};
use rustccl_plugin_api::{LogFn, PluginError};

use super::c_abi::{self, NcclDebugLogger};
use super::library::PluginLibrary;

/// C env ABI versions this host loads, newest first.
pub const C_ENV_ABI_VERSIONS: &[u32] = &[2, 1];

type InitV1 = unsafe extern "C" fn(major: u8, minor: u8, patch: u8, suffix: *const c_char) -> c_int;
type InitV2 = unsafe extern "C" fn(major: u8, minor: u8, patch: u8, suffix: *const c_char, log: NcclDebugLogger) -> c_int;
type Finalize = unsafe extern "C" fn() -> c_int;
type GetEnv = unsafe extern "C" fn(name: *const c_char) -> *const c_char;

/// `ncclEnv_v1_t` (exported as `ncclEnvPlugin_v1`).
#[repr(C)]
pub struct NcclEnvV1 {
    pub name: *const c_char,
    pub init: Option<InitV1>,
    pub finalize: Option<Finalize>,
    pub get_env: Option<GetEnv>,
}

/// `ncclEnv_v2_t` (exported as `ncclEnvPlugin_v2`): v1 with the logger passed to `init`.
#[repr(C)]
pub struct NcclEnvV2 {
    pub name: *const c_char,
    pub init: Option<InitV2>,
    pub finalize: Option<Finalize>,
    pub get_env: Option<GetEnv>,
}

#[derive(Clone, Copy)]
enum Init {
    V1(InitV1),
    V2(InitV2),
}

/// A C env table seen through the core's [`Env`] trait.
pub struct CEnv {
    pub name: String,
    pub version: u32,
    init: Init,
    finalize: Option<Finalize>,
    get_env: GetEnv,
    /// Held across each `getEnv` and the copy of its answer (see the module doc).
    calls: Mutex<()>,
}

impl std::fmt::Debug for CEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CEnv({} v{})", self.name, self.version)
    }
}

fn need<F>(f: Option<F>, symbol: &str, member: &str) -> Result<F, String> {
    c_abi::required(f, symbol, member, "env")
}

impl CEnv {
    /// The newest C env table `lib` exports (v2 first), checked for NULL mandatory members.
    /// `Ok(None)`: it exports none. A refused table lets an older one be tried; the error
    /// lists every refusal.
    pub fn from_library(lib: &PluginLibrary) -> Result<Option<CEnv>, String> {
        c_abi::newest_table(C_ENV_ABI_VERSIONS, |v| Self::version(lib, v))
    }

    fn version(lib: &PluginLibrary, v: u32) -> Result<Option<CEnv>, String> {
        let symbol = format!("ncclEnvPlugin_v{v}");
        let s = symbol.as_str();
        let (name, init, finalize, get_env) = match v {
            2 => {
                // SAFETY: `NcclEnvV2` is the layout NCCL defines for `ncclEnvPlugin_v2`.
                let Some(t) = (unsafe { c_abi::find_table::<NcclEnvV2>(lib, s) }) else { return Ok(None) };
                (t.name, Init::V2(need(t.init, s, "init")?), t.finalize, t.get_env)
            }
            1 => {
                // SAFETY: `NcclEnvV1` is the layout NCCL defines for `ncclEnvPlugin_v1`.
                let Some(t) = (unsafe { c_abi::find_table::<NcclEnvV1>(lib, s) }) else { return Ok(None) };
                (t.name, Init::V1(need(t.init, s, "init")?), t.finalize, t.get_env)
            }
            _ => return Ok(None),
        };
        let get_env = need(get_env, s, "getEnv")?;
        let name = c_abi::table_name(name, s)?;
        Ok(Some(CEnv { name, version: v, init, finalize, get_env, calls: Mutex::new(()) }))
    }

    fn what(&self, call: &str) -> String {
        format!("{} (NCCL C env v{}) {call}", self.name, self.version)
    }
}

impl Env for CEnv {
    fn init(&self, version: LibraryVersion, _log: LogFn) -> Result<(), PluginError> {
        // NCCL passes its suffix (e.g. "+cuda12.8"); rustccl has none. A literal: alive for
        // the process, whatever the plugin keeps.
        let suffix = c"".as_ptr();
        let (major, minor, patch) = (version.major, version.minor, version.patch);
        let code = match self.init {
            // SAFETY: a mandatory member of the plugin's table, called with its documented
            // arguments.
            Init::V1(init) => unsafe { init(major, minor, patch, suffix) },
            // SAFETY: as above; the logger is a function of this library, alive for the process.
            Init::V2(init) => unsafe { init(major, minor, patch, suffix, c_abi::logger()) },
        };
        c_abi::check(code, &self.what("init"))
    }

    fn get_env(&self, name: &str) -> Result<Option<String>, PluginError> {
        let c_name = CString::new(name)
            .map_err(|_| PluginError::invalid_argument(format!("parameter name {name:?} holds a NUL byte")))?;
        let _one_at_a_time = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: a mandatory member, given a NUL-terminated name alive for the call.
        let value = unsafe { (self.get_env)(c_name.as_ptr()) };
        if value.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL; the plugin keeps the string valid until its next getEnv of this name
        // or finalize, neither of which can happen while the lock is held.
        Ok(Some(unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned()))
    }

    fn finalize(&self) -> Result<(), PluginError> {
        let Some(finalize) = self.finalize else { return Ok(()) };
        let _one_at_a_time = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the plugin's own finalize, called once (the loader's exit hook sees to it).
        c_abi::check(unsafe { finalize() }, &self.what("finalize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nccl_headers() {
        use std::mem::{offset_of, size_of};
        let p = size_of::<usize>();
        assert_eq!(size_of::<NcclEnvV1>(), 4 * p);
        assert_eq!(size_of::<NcclEnvV2>(), 4 * p);
        assert_eq!(offset_of!(NcclEnvV1, init), p);
        assert_eq!(offset_of!(NcclEnvV1, finalize), 2 * p);
        assert_eq!(offset_of!(NcclEnvV1, get_env), 3 * p);
        assert_eq!(offset_of!(NcclEnvV2, get_env), 3 * p);
        // Function pointers in Option keep their C size (NULL is None).
        assert_eq!(size_of::<Option<GetEnv>>(), p);
    }

    unsafe extern "C" fn init_v1(major: u8, _minor: u8, _patch: u8, suffix: *const c_char) -> c_int {
        // SAFETY: the adapter passes a NUL-terminated literal.
        let empty = unsafe { CStr::from_ptr(suffix) }.is_empty();
        if major == 2 && empty { c_abi::result::SUCCESS } else { c_abi::result::INVALID_USAGE }
    }
    unsafe extern "C" fn get_env(name: *const c_char) -> *const c_char {
        // SAFETY: the adapter passes a NUL-terminated name.
        match unsafe { CStr::from_ptr(name) }.to_bytes() {
            b"NCCL_PROTO" => c"Simple".as_ptr(),
            b"NCCL_ODD" => c"a\xffb".as_ptr(),
            _ => std::ptr::null(),
        }
    }

    fn table(name: *const c_char, init: Option<InitV1>, get: Option<GetEnv>) -> CEnv {
        // What `version` builds from a table, without a library.
        let t = NcclEnvV1 { name, init, finalize: None, get_env: get };
        let s = "ncclEnvPlugin_v1";
        let build = || -> Result<CEnv, String> {
            let init = Init::V1(need(t.init, s, "init")?);
            let get_env = need(t.get_env, s, "getEnv")?;
            Ok(CEnv { name: c_abi::table_name(t.name, s)?, version: 1, init, finalize: t.finalize, get_env, calls: Mutex::new(()) })
        };
        build().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn answers_are_copied_and_null_is_unset() {
        extern "C" fn quiet(_l: i32, _s: u64, _m: abi_stable::std_types::RStr<'_>) {}
        let env = table(c"t".as_ptr(), Some(init_v1), Some(get_env));
        let v = LibraryVersion { major: 2, minor: 28, patch: 9, suffix: abi_stable::std_types::RStr::from_str("") };
        env.init(v, LogFn { log: quiet }).unwrap();
        let e = env.init(LibraryVersion { major: 3, ..v }, LogFn { log: quiet }).unwrap_err();
        assert!(e.message.contains("t (NCCL C env v1) init returned ncclInvalidUsage"), "{}", e.message);
        assert_eq!(env.get_env("NCCL_PROTO").unwrap().as_deref(), Some("Simple"));
        assert_eq!(env.get_env("NCCL_ALGO").unwrap(), None);
        assert_eq!(env.get_env("NCCL_ODD").unwrap().as_deref(), Some("a\u{fffd}b"));
        assert_eq!(env.get_env("BAD\0NAME").unwrap_err().code, PluginError::INVALID_ARGUMENT);
        env.finalize().unwrap();
    }

    #[test]
    #[should_panic(expected = "ncclEnvPlugin_v1 has a NULL getEnv")]
    fn a_table_without_get_env_is_refused() {
        table(c"t".as_ptr(), Some(init_v1), None);
    }
}

//! The environment plugin ABI (rustccl env v1), with the semantics of NCCL's env plugins
//! (`ncclEnvPlugin_v1` / `_v2`, NCCL 2.28+): the library resolves every parameter it reads
//! (`NCCL_*` and rustccl's own `RUSTCCL_*`) through one plugin per process, so that a site can
//! supply, check or override values in one place (a configuration service, a file, a policy).
//!
//! A plugin implements the safe trait [`Env`] and exports it with
//! [`export_env!`](crate::export_env)`(v1, ...)` (symbol `rustccl_env_v1`, table [`EnvV1`]);
//! the host sees a `&dyn Env` through [`EnvV1Client`].
//!
//! | version | symbol | what it has |
//! |---|---|---|
//! | 1 | `rustccl_env_v1` | `init(version, log)`, `get_env(name)`, `finalize()` |
//!
//! Rules (as NCCL's):
//! * The plugin is loaded once per process, at the first parameter lookup, before any
//!   parameter is read (the log level included), and `init` is called once. An error from
//!   `init` (or a library that exports no env table) leaves the process environment in
//!   charge, with a warning when the user named the plugin.
//! * `get_env(name)` is the value of `name`: `Ok(None)` means "unset" (the default applies)
//!   even if the process environment has it, since the plugin is authoritative; a plugin that
//!   only overrides some variables answers the others from `std::env`. An `Err` is logged as
//!   a warning and the variable is taken as unset (a plugin that rejects a value keeps it out).
//! * `get_env` may be called from any thread at any time until `finalize`; the host calls it
//!   for each lookup (values are not cached by the host unless the parameter itself is read
//!   once, as NCCL's cached parameters are). Values cross as `RString`s the host owns, so the
//!   lifetime rule of NCCL's C ABI (the returned pointer stays valid until the next `getEnv`
//!   of the same name) does not arise.
//! * `finalize` is called once at process exit; lookups after it read the process
//!   environment.
//! * `NCCL_ENV_PLUGIN` itself is never asked of the plugin.

use abi_stable::std_types::{ROption, RStr, RString};
use abi_stable::StableAbi;

use crate::{call_guarded, LogFn, PResult, PluginError};

/// The library's version, as NCCL passes it to an env plugin's `init`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryVersion {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
    /// NCCL's version suffix (`""` for rustccl).
    pub suffix: RStr<'static>,
}

/// The env plugin interface.
pub trait Env: Send + Sync {
    /// Called once, before the first `get_env`. An error leaves the process environment in
    /// charge.
    fn init(&self, version: LibraryVersion, log: LogFn) -> Result<(), PluginError>;
    /// The value of the parameter `name`; `Ok(None)`: unset.
    fn get_env(&self, name: &str) -> Result<Option<String>, PluginError>;
    /// Called once at process exit; no `get_env` follows.
    fn finalize(&self) -> Result<(), PluginError>;
}

/// The exported table of env ABI v1 (`rustccl_env_v1`).
#[repr(C)]
#[derive(StableAbi)]
pub struct EnvV1 {
    /// The plugin's name, for log lines.
    pub name: RStr<'static>,
    pub init: extern "C" fn(version: LibraryVersion, log: LogFn) -> PResult<()>,
    pub get_env: extern "C" fn(name: RStr<'_>) -> PResult<ROption<RString>>,
    pub finalize: extern "C" fn() -> PResult<()>,
}

/// Where the exported shims find the plugin's instance.
pub trait EnvProvider: 'static {
    fn get() -> &'static dyn Env;
}

extern "C" fn init_shim<P: EnvProvider>(version: LibraryVersion, log: LogFn) -> PResult<()> {
    call_guarded(|| P::get().init(version, log))
}
extern "C" fn get_env_shim<P: EnvProvider>(name: RStr<'_>) -> PResult<ROption<RString>> {
    call_guarded(|| P::get().get_env(name.as_str()).map(|v| v.map(RString::from).into()))
}
extern "C" fn finalize_shim<P: EnvProvider>() -> PResult<()> {
    call_guarded(|| P::get().finalize())
}

impl EnvV1 {
    /// The v1 table whose functions call `P::get()`.
    pub const fn table<P: EnvProvider>(name: &'static str) -> EnvV1 {
        EnvV1 { name: RStr::from_str(name), init: init_shim::<P>, get_env: get_env_shim::<P>, finalize: finalize_shim::<P> }
    }
}

/// Exports an env plugin from a cdylib at ABI version `v1` (symbol `rustccl_env_v1`, table
/// [`EnvV1`]): `export_env!(v1, "name", Type, constructor_expr);` (its own instance, built on
/// first use) or `export_env!(v1, "name", provider = MyProvider);`.
#[macro_export]
macro_rules! export_env {
    (v1, $name:expr, provider = $provider:path) => {
        const _: () = {
            static TABLE: $crate::env::EnvV1 = $crate::env::EnvV1::table::<$provider>($name);
            #[no_mangle]
            #[used]
            #[allow(non_upper_case_globals)]
            pub static rustccl_env_v1: $crate::export::PluginExport<$crate::env::EnvV1> =
                $crate::export::PluginExport::new(&TABLE);
        };
    };
    (v1, $name:expr, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            struct Provider;
            impl $crate::env::EnvProvider for Provider {
                fn get() -> &'static dyn $crate::env::Env {
                    INSTANCE.get_or_init(|| $ctor)
                }
            }
            $crate::export_env!(v1, $name, provider = Provider);
        };
    };
}

/// A loaded library's v1 table, seen through the [`Env`] trait.
pub struct EnvV1Client {
    pub table: &'static EnvV1,
}

impl EnvV1Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

impl Env for EnvV1Client {
    fn init(&self, version: LibraryVersion, log: LogFn) -> Result<(), PluginError> {
        (self.table.init)(version, log).into_result()
    }
    fn get_env(&self, name: &str) -> Result<Option<String>, PluginError> {
        (self.table.get_env)(RStr::from_str(name)).into_result().map(|v| v.into_option().map(RString::into_string))
    }
    fn finalize(&self) -> Result<(), PluginError> {
        (self.table.finalize)().into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Answers `NCCL_PROTO` itself, hides `NCCL_HIDDEN`, refuses `NCCL_BAD`, panics on
    /// `NCCL_PANIC`, and passes the rest through a fixed map.
    struct TestEnv {
        started: AtomicBool,
    }

    impl Env for TestEnv {
        fn init(&self, version: LibraryVersion, log: LogFn) -> Result<(), PluginError> {
            log.info(crate::subsys::INIT, "test env init");
            if version.major != 2 {
                return Err(PluginError::invalid_usage("needs NCCL 2"));
            }
            self.started.store(true, Ordering::Relaxed);
            Ok(())
        }
        fn get_env(&self, name: &str) -> Result<Option<String>, PluginError> {
            match name {
                "NCCL_PROTO" => Ok(Some("Simple".into())),
                "NCCL_HIDDEN" => Ok(None),
                "NCCL_BAD" => Err(PluginError::invalid_usage("NCCL_BAD is not allowed here")),
                "NCCL_PANIC" => panic!("asked for NCCL_PANIC"),
                _ => Ok(Some(format!("passed:{name}"))),
            }
        }
        fn finalize(&self) -> Result<(), PluginError> {
            self.started.store(false, Ordering::Relaxed);
            Ok(())
        }
    }

    static ENV: TestEnv = TestEnv { started: AtomicBool::new(false) };
    struct Provider;
    impl EnvProvider for Provider {
        fn get() -> &'static dyn Env {
            &ENV
        }
    }
    static V1: EnvV1 = EnvV1::table::<Provider>("test-env");

    crate::export_env!(v1, "macro-test", TestEnv, TestEnv { started: AtomicBool::new(false) });

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}
    const LOG: LogFn = LogFn { log: quiet };
    const V: LibraryVersion = LibraryVersion { major: 2, minor: 28, patch: 9, suffix: RStr::from_str("") };

    #[test]
    fn client_passes_answers_none_errors_and_panics() {
        let client = EnvV1Client { table: &V1 };
        assert_eq!(client.name(), "test-env");
        client.init(V, LOG).unwrap();
        assert!(ENV.started.load(Ordering::Relaxed));
        assert_eq!(client.get_env("NCCL_PROTO").unwrap().as_deref(), Some("Simple"));
        assert_eq!(client.get_env("NCCL_ALGO").unwrap().as_deref(), Some("passed:NCCL_ALGO"));
        assert_eq!(client.get_env("NCCL_HIDDEN").unwrap(), None);
        let e = client.get_env("NCCL_BAD").unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_USAGE);
        let e = client.get_env("NCCL_PANIC").unwrap_err();
        assert_eq!(e.code, PluginError::INTERNAL);
        assert!(e.message.contains("asked for NCCL_PANIC"), "{e}");
        client.finalize().unwrap();
        assert!(!ENV.started.load(Ordering::Relaxed));
        let old = LibraryVersion { major: 1, ..V };
        assert_eq!(client.init(old, LOG).unwrap_err().code, PluginError::INVALID_USAGE);
    }

    #[test]
    fn export_carries_its_layout() {
        use crate::export::{PluginExport, EXPORT_MAGIC};
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        static E: PluginExport<EnvV1> = PluginExport::new(&V1);
        assert_eq!(E.magic, EXPORT_MAGIC);
        check_layout_compatibility(<EnvV1 as StableAbi>::LAYOUT, E.layout).unwrap();
        // Not interchangeable with another kind's table.
        assert!(check_layout_compatibility(<crate::tuner::TunerV1 as StableAbi>::LAYOUT, E.layout).is_err());
    }
}

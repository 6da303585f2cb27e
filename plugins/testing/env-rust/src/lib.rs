//! Exists for loader tests: an env plugin named `rust-env` exporting rustccl's env table
//! (`rustccl_env_v1`). It answers `NCCL_ALGO` with `Ring` itself, leaves `NCCL_SHM_DISABLE`
//! unset whatever the environment says, and passes every other name through from the process
//! environment. Its `init` logs the version it was given through the host's logger.

use rustccl_plugin_api::env::{Env, LibraryVersion};
use rustccl_plugin_api::{subsys, LogFn, PluginError};

/// The plugin; it keeps no state.
pub struct RustEnv;

impl Env for RustEnv {
    fn init(&self, version: LibraryVersion, log: LogFn) -> Result<(), PluginError> {
        log.info(subsys::ENV, &format!("rust-env: init for NCCL {}.{}.{}", version.major, version.minor, version.patch));
        Ok(())
    }

    fn get_env(&self, name: &str) -> Result<Option<String>, PluginError> {
        Ok(match name {
            "NCCL_ALGO" => Some("Ring".to_string()),
            "NCCL_SHM_DISABLE" => None,
            _ => std::env::var(name).ok(),
        })
    }

    fn finalize(&self) -> Result<(), PluginError> {
        Ok(())
    }
}

rustccl_plugin_api::export_env!(v1, "rust-env", RustEnv, RustEnv);

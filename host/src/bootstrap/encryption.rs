//! The process's encryption key for rustccl's TCP traffic (bootstrap and the socket
//! transport), and where it comes from.
//!
//! Two ways, as NCCL 2.32 has (its `ncclSetEncryption` is process-global and set before
//! `ncclGetUniqueId`):
//! * [`set`] (`ncclSetEncryption` in the C API, [`crate::set_encryption`] in Rust): decides,
//!   once called, whatever the environment says.
//! * Otherwise the parameter `NCCL_ENCRYPTION_PSK` (the key itself, its UTF-8 bytes) or
//!   `NCCL_ENCRYPTION_PSK_FILE` (a file holding it; a trailing newline is not part of the
//!   key), read once at the first connection through the parameter system (so an env plugin
//!   may supply it) with [`params::resolve`], which never logs the value. A file keeps the key
//!   out of `/proc/<pid>/environ` and of job scripts.
//!
//! The key must have at least 32 bytes; a shorter one is an error, never plaintext. The key
//! reaches the socket transport in-process through [`rustccl_securewire::set_process_key`]
//! (the built-in transport links the same crate); it is never written to the environment,
//! logged or sent.

use std::sync::{Arc, Mutex};

use rustccl_securewire::{self as sw, Psk};

use crate::error::{Error, Result};
use crate::params;

/// `None`: not decided yet (the environment is read at the first use).
static DECIDED: Mutex<Option<Option<Arc<Psk>>>> = Mutex::new(None);

/// Sets the key (or, with `None`, plaintext) for the connections opened from now on.
pub fn set(key: Option<&[u8]>) -> Result<()> {
    let key = key.map(|k| Psk::new(k).map_err(|e| Error::invalid_argument(e.message))).transpose()?.map(Arc::new);
    publish(key.clone());
    *DECIDED.lock().unwrap_or_else(|p| p.into_inner()) = Some(key);
    tracing::info!(target: "INIT", "Encryption of TCP traffic {} by the API", if current_is_on() { "on (PSK)" } else { "off" });
    Ok(())
}

fn current_is_on() -> bool {
    matches!(&*DECIDED.lock().unwrap_or_else(|p| p.into_inner()), Some(Some(_)))
}

/// Hands the key to the socket transport (same process, same crate).
fn publish(key: Option<Arc<Psk>>) {
    sw::set_process_key(key);
}

/// The key this process's TCP connections use (`None`: plaintext); an unusable key in the
/// environment is an error naming the variable.
pub fn key() -> Result<Option<Arc<Psk>>> {
    let mut decided = DECIDED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = &*decided {
        return Ok(k.clone());
    }
    let key = from_params()?.map(Arc::new);
    if key.is_some() {
        tracing::info!(target: "INIT", "Encryption of TCP traffic on (PSK from the environment)");
    }
    publish(key.clone());
    *decided = Some(key.clone());
    Ok(key)
}

fn from_params() -> Result<Option<Psk>> {
    if let Some(v) = params::resolve("NCCL_ENCRYPTION_PSK").value {
        return Psk::new(v.as_bytes()).map(Some).map_err(|e| Error::invalid_argument(format!("NCCL_ENCRYPTION_PSK: {}", e.message)));
    }
    if let Some(path) = params::resolve("NCCL_ENCRYPTION_PSK_FILE").value {
        let mut bytes = std::fs::read(&path)
            .map_err(|e| Error::invalid_argument(format!("NCCL_ENCRYPTION_PSK_FILE: cannot read {path}: {e}")))?;
        while matches!(bytes.last(), Some(b'\n' | b'\r')) {
            bytes.pop();
        }
        let key = Psk::new(&bytes).map_err(|e| Error::invalid_argument(format!("NCCL_ENCRYPTION_PSK_FILE {path}: {}", e.message)));
        bytes.fill(0);
        return key.map(Some);
    }
    Ok(None)
}

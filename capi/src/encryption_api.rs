//! `ncclSetEncryption` (NCCL 2.32): the process's pre-shared key for rustccl's TCP traffic
//! (see `rustccl::set_encryption` and host/src/bootstrap/encryption.rs).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

use rustccl::Error;

use crate::{guard, nccl_api, NcclResult};

/// `NCCL_ENCRYPTION_MODE_NONE`: plaintext.
pub const ENCRYPTION_MODE_NONE: c_int = 0;
/// `NCCL_ENCRYPTION_MODE_PSK`: a pre-shared key.
pub const ENCRYPTION_MODE_PSK: c_int = 1;

/// `ncclEncryptionConfig_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclEncryptionConfig {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub mode: c_int,
    /// NUL-terminated key (PSK mode), at least 32 bytes.
    pub psk: *const c_char,
}

/// Reads and checks a caller's configuration: `None` turns encryption off.
///
/// # Safety
/// `config` is null or points to a configuration of at least its `size` field's bytes whose
/// `psk`, in PSK mode, is null or a NUL-terminated string.
unsafe fn read(config: *const NcclEncryptionConfig) -> Result<Option<Vec<u8>>, Error> {
    if config.is_null() {
        return Err(Error::invalid_argument("ncclSetEncryption: config is NULL"));
    }
    // SAFETY: non-null; the caller's struct; `size` is its first field.
    let size = unsafe { std::ptr::read_unaligned(config as *const usize) };
    if size < std::mem::size_of::<NcclEncryptionConfig>() {
        return Err(Error::invalid_argument(format!(
            "ncclSetEncryption: config.size is {size}, expected {} (initialise it with NCCL_ENCRYPTION_CONFIG_INITIALIZER)",
            std::mem::size_of::<NcclEncryptionConfig>()
        )));
    }
    // SAFETY: at least as large as the struct, per its size.
    let c = unsafe { std::ptr::read_unaligned(config) };
    match c.mode {
        ENCRYPTION_MODE_NONE => Ok(None),
        ENCRYPTION_MODE_PSK => {
            if c.psk.is_null() {
                return Err(Error::invalid_argument("ncclSetEncryption: mode is NCCL_ENCRYPTION_MODE_PSK but psk is NULL"));
            }
            // SAFETY: non-null; the caller vouches for a NUL-terminated string.
            Ok(Some(unsafe { CStr::from_ptr(c.psk) }.to_bytes().to_vec()))
        }
        m => Err(Error::invalid_argument(format!(
            "ncclSetEncryption: unknown mode {m} (NCCL_ENCRYPTION_MODE_NONE or NCCL_ENCRYPTION_MODE_PSK)"
        ))),
    }
}

nccl_api! {
    fn ncclSetEncryption / pncclSetEncryption(config: *const NcclEncryptionConfig) -> NcclResult {
        guard("ncclSetEncryption", || {
            // SAFETY: the caller's configuration, read within its declared size.
            let mut key = unsafe { read(config)? };
            let r = rustccl::set_encryption(key.as_deref());
            if let Some(k) = key.as_mut() {
                k.fill(0);
            }
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: c_int, psk: *const c_char) -> NcclEncryptionConfig {
        NcclEncryptionConfig { size: std::mem::size_of::<NcclEncryptionConfig>(), magic: 0, version: 0, mode, psk }
    }

    #[test]
    fn the_config_is_32_bytes_and_bad_arguments_are_refused() {
        assert_eq!(std::mem::size_of::<NcclEncryptionConfig>(), 32);
        let short = c"too short".as_ptr();
        let good = c"0123456789abcdef0123456789abcdef".as_ptr();
        // SAFETY (all calls): pointers to live configurations and C strings.
        unsafe {
            assert_eq!(ncclSetEncryption(std::ptr::null()) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, std::ptr::null())) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, short)) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(7, good)) as i32, 4);
            assert_eq!(ncclSetEncryption(&NcclEncryptionConfig { size: 8, ..config(ENCRYPTION_MODE_PSK, good) }) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, good)) as i32, 0);
            assert!(rustccl_securewire_is_set());
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_NONE, std::ptr::null())) as i32, 0);
            assert!(!rustccl_securewire_is_set());
        }
    }

    fn rustccl_securewire_is_set() -> bool {
        rustccl::bootstrap::encryption::key().unwrap().is_some()
    }
}

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

/// `NCCL_API_MAGIC`: what `NCCL_ENCRYPTION_CONFIG_INITIALIZER` writes into `magic`.
const API_MAGIC: c_uint = 0xcafe_beef;

/// `NCCL_ENCRYPTION_CONFIG_INITIALIZER`'s values: what the fields past a caller's `size` are.
fn initializer() -> NcclEncryptionConfig {
    NcclEncryptionConfig {
        size: std::mem::size_of::<NcclEncryptionConfig>(),
        magic: API_MAGIC,
        version: rustccl::version::NCCL_VERSION_CODE as c_uint,
        mode: ENCRYPTION_MODE_NONE,
        psk: std::ptr::null(),
    }
}

/// Reads and checks a caller's configuration, by NCCL 2.32's rules: a NULL configuration is
/// mode NONE; a `magic` other than `NCCL_API_MAGIC` is refused (the struct was not made with
/// `NCCL_ENCRYPTION_CONFIG_INITIALIZER`); `min(size, sizeof)` bytes are read, the
/// initializer's values past them (so a struct from a header with fewer fields works, and a
/// `size` that stops before `mode` means mode NONE). `None` turns encryption off.
///
/// # Safety
/// `config` is null or points to a configuration of at least its `size` field's bytes (and at
/// least up to `magic`, which NCCL reads whatever the size) whose `psk`, in PSK mode, is null
/// or a NUL-terminated string.
unsafe fn read(config: *const NcclEncryptionConfig) -> Result<Option<Vec<u8>>, Error> {
    let mut c = initializer();
    if !config.is_null() {
        // SAFETY: non-null; the caller's struct; `magic` is at the same place in every layout.
        let magic = unsafe { std::ptr::addr_of!((*config).magic).read_unaligned() };
        if magic != API_MAGIC {
            return Err(Error::invalid_argument(format!(
                "config->magic is {magic:#x}, not NCCL_API_MAGIC: initialize the configuration \
                 with NCCL_ENCRYPTION_CONFIG_INITIALIZER"
            )));
        }
        // SAFETY: non-null; `size` is the first field of every layout.
        let size = unsafe { std::ptr::read_unaligned(config as *const usize) };
        let n = size.min(std::mem::size_of::<NcclEncryptionConfig>());
        if n < std::mem::offset_of!(NcclEncryptionConfig, mode) + std::mem::size_of::<c_int>() {
            tracing::warn!(target: "INIT", "ncclSetEncryption: config->size is {size}, which stops before `mode`: mode NONE");
        }
        // SAFETY: the caller's struct holds `size` ≥ `n` bytes; `c` holds `n`; every byte
        // pattern is a valid integer or raw pointer.
        unsafe { std::ptr::copy_nonoverlapping(config as *const u8, std::ptr::addr_of_mut!(c) as *mut u8, n) };
    }
    match c.mode {
        ENCRYPTION_MODE_NONE => Ok(None),
        ENCRYPTION_MODE_PSK => {
            if c.psk.is_null() {
                return Err(Error::invalid_argument("mode is NCCL_ENCRYPTION_MODE_PSK but psk is NULL"));
            }
            // SAFETY: non-null; the caller vouches for a NUL-terminated string.
            Ok(Some(unsafe { CStr::from_ptr(c.psk) }.to_bytes().to_vec()))
        }
        m => Err(Error::invalid_argument(format!(
            "unknown mode {m} (NCCL_ENCRYPTION_MODE_NONE or NCCL_ENCRYPTION_MODE_PSK)"
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
        NcclEncryptionConfig { mode, psk, ..initializer() }
    }

    /// One test, as the key is process-global.
    #[test]
    fn the_config_is_read_by_nccls_rules_and_bad_arguments_are_refused() {
        assert_eq!(std::mem::size_of::<NcclEncryptionConfig>(), 32);
        let short = c"too short".as_ptr();
        let good = c"0123456789abcdef0123456789abcdef".as_ptr();
        // SAFETY (all calls): pointers to live configurations and C strings.
        unsafe {
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, std::ptr::null())) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, short)) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(7, good)) as i32, 4);
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, good)) as i32, 0);
            assert!(rustccl_securewire_is_set());
            // A magic other than NCCL_API_MAGIC: refused, and the key stays.
            assert_eq!(ncclSetEncryption(&NcclEncryptionConfig { magic: 0, ..config(ENCRYPTION_MODE_NONE, good) }) as i32, 4);
            assert!(rustccl_securewire_is_set());
            // NULL is mode NONE, as NCCL.
            assert_eq!(ncclSetEncryption(std::ptr::null()) as i32, 0);
            assert!(!rustccl_securewire_is_set());
            // Fields past `size` are the initializer's: a size that stops before `mode` is NONE.
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_PSK, good)) as i32, 0);
            assert_eq!(ncclSetEncryption(&NcclEncryptionConfig { size: 16, ..config(ENCRYPTION_MODE_PSK, good) }) as i32, 0);
            assert!(!rustccl_securewire_is_set());
            // A size past `psk` (a later header's larger struct) is read up to rustccl's fields.
            assert_eq!(ncclSetEncryption(&NcclEncryptionConfig { size: 64, ..config(ENCRYPTION_MODE_PSK, good) }) as i32, 0);
            assert!(rustccl_securewire_is_set());
            assert_eq!(ncclSetEncryption(&config(ENCRYPTION_MODE_NONE, std::ptr::null())) as i32, 0);
            assert!(!rustccl_securewire_is_set());
        }
    }

    fn rustccl_securewire_is_set() -> bool {
        rustccl::bootstrap::encryption::key().unwrap().is_some()
    }
}

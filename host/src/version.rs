//! Version numbers: the NCCL ABI rustccl presents, and the wire protocol its ranks speak.

/// NCCL's version code for `major.minor.patch` (NCCL_VERSION in nccl.h).
pub const fn nccl_version(major: i32, minor: i32, patch: i32) -> i32 {
    if major > 2 || (major == 2 && minor > 8) {
        major * 10000 + minor * 100 + patch
    } else {
        major * 1000 + minor * 100 + patch
    }
}

/// The version `ncclGetVersion` and `NCCL_VERSION_CODE` report: NCCL 2.32.3, the newest
/// release whose host API rustccl implements: every call of its `nccl.h` (and every device-API
/// host call nccl4py binds) works on the hardware rustccl drives, or is refused with the code
/// NCCL returns where the hardware it needs is missing: multimem (NVLink SHARP multicast)
/// `ncclInvalidArgument`, GIN (GPU-initiated networking) `ncclInvalidUsage`, CFT (Compute Fabric
/// Transport logical endpoints) `ncclInvalidArgument`, each with a message naming it (see the
/// top of `capi/include/nccl.h` and docs/STATUS.md). The structs have 2.32.3's layout.
pub const NCCL_VERSION_CODE: i32 = nccl_version(2, 32, 3);

/// `major.minor.patch` of [`NCCL_VERSION_CODE`] (the form of NCCL's "NCCL version" line).
pub fn nccl_version_string() -> String {
    let c = NCCL_VERSION_CODE;
    format!("{}.{}.{}", c / 10000, c % 10000 / 100, c % 100)
}

/// The file this library was loaded from (`libnccl.so.2` for C programs, the executable for
/// Rust ones), as the dynamic loader says; `None` if it cannot say.
pub fn loaded_from() -> Option<String> {
    // SAFETY: Dl_info is plain C data (pointers and integers), for which all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nccl_version_string as *const libc::c_void;
    // SAFETY: dladdr only reads the address (a function of this library) and fills `info`;
    // the name it points to belongs to the loader and lives as long as the object is loaded,
    // which it is while this code runs: it is copied out at once.
    let found = unsafe { libc::dladdr(addr, &mut info) } != 0 && !info.dli_fname.is_null();
    // SAFETY: checked non-NULL above; a NUL-terminated string owned by the loader.
    found.then(|| unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// The NCCL release whose C declarations and struct layouts `nccl.h` follows (2.32.3, the
/// version reported).
pub const ABI_VERSION_CODE: i32 = nccl_version(2, 32, 3);

/// rustccl's own version, as the crate says it.
pub const RUSTCCL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Version of the bootstrap wire protocol; ranks with different values refuse each other.
pub const WIRE_PROTOCOL: u32 = 1;

/// The version a rank announces to its peers at init: rustccl's version and the wire protocol.
/// `RUSTCCL_TEST_VERSION_OVERRIDE` replaces it, so that tests can start a mismatched rank.
pub fn announced_version() -> String {
    match std::env::var("RUSTCCL_TEST_VERSION_OVERRIDE") {
        Ok(v) if !v.is_empty() => v,
        _ => format!("rustccl {RUSTCCL_VERSION} (nccl abi {ABI_VERSION_CODE}, wire {WIRE_PROTOCOL})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn version_string_and_library_path() {
        assert_eq!(nccl_version_string(), "2.32.3");
        let path = loaded_from().expect("dladdr names the test executable");
        assert!(std::path::Path::new(&path).exists(), "{path}");
    }

    #[test]
    fn version_code_matches_nccl_formula() {
        assert_eq!(NCCL_VERSION_CODE, 23203);
        assert_eq!(ABI_VERSION_CODE, 23203);
        assert_eq!(nccl_version(2, 8, 4), 2804);
        assert_eq!(nccl_version(2, 14, 0), 21400);
    }
}

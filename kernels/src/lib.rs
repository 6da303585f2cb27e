//! rustccl's device code and the on-disk cache of its compiled forms.
//!
//! **What it does now (first slice):**
//! * The device sources, CUDA C++ that also builds as HIP, embedded with
//!   `include_str!` and listed by [`sources`]: `port.h` (CUDA/HIP portability:
//!   vendor headers, element types, warp size, shuffles, atomics, fences),
//!   `elem.h` (the element types' exact arithmetic on raw bits, bit for bit the
//!   host reference `Reducer`) and `exec.cu` (the collective interpreter, one
//!   compilation per [`DeviceOp`] and type, see [`exec`]).
//! * [`KernelCache`]: compiled blobs (PTX/CUBIN/code objects) stored under
//!   `RUSTCCL_KERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/rustccl/kernels`, else
//!   `~/.cache/rustccl/kernels`, keyed by a [`CacheKey`] (SHA-256 of the
//!   sources, target architecture, driver version and compile options). Writes
//!   are atomic (temporary file + rename); every file carries a header (magic,
//!   key, length, SHA-256 of the blob) so a corrupt or truncated file is
//!   detected and treated as a miss.
//!
//! The device code is **not compiled by this crate or its tests**: the host's
//! CUDA backend (`rustccl::backend::cuda`) compiles `exec.cu` with NVRTC at
//! run time for each GPU architecture, caches the CUBINs with [`KernelCache`]
//! and loads them; its tests compile it wherever NVRTC is found (no GPU needed).
//!
//! * `exec.cu`: the collective interpreter, one launch per group on a device, running the
//!   planner's steps with the Simple, LL and LL128 protocols (see [`exec`]); the header of
//!   its ABI with the host, `rustccl_exec_abi.h`, is generated from [`exec`].
//! * `one_sided.cu`: the one-sided operations' signal and wait kernels, a unit of their own
//!   (see [`one_sided`]), on the same generated header.
//!
//! **Not yet:** hipRTC compilation and cache size limits.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

pub mod exec;
pub mod one_sided;
pub mod symmetric;

/// The device sources as (file name, text), in include order: the headers, then
/// the kernel files that include them. The names are the ones used in
/// `#include "..."`, so they can be passed to NVRTC/hipRTC as named headers.
/// `exec.cu`'s ABI header is generated from [`exec`] (see [`exec::abi_header`]), so it is
/// compiled, and covered by the cache key, like the files.
///
/// For kernel experiments (an A/B run of two kernel versions with one build), a file of the
/// same name in the directory `RUSTCCL_KERNEL_SOURCE_DIR` replaces the embedded text; the
/// cache key covers the text, so compiled kernels never mix.
pub fn sources() -> &'static [(&'static str, &'static str)] {
    static SOURCES: OnceLock<Vec<(&str, &str)>> = OnceLock::new();
    static ABI_HEADER: OnceLock<String> = OnceLock::new();
    SOURCES.get_or_init(|| {
        let embedded = [
            ("port.h", include_str!("device/port.h")),
            ("elem.h", include_str!("device/elem.h")),
            (exec::ABI_HEADER, ABI_HEADER.get_or_init(exec::abi_header).as_str()),
            ("memory.h", include_str!("device/memory.h")),
            ("proto_simple.h", include_str!("device/proto_simple.h")),
            ("proto_ll.h", include_str!("device/proto_ll.h")),
            ("proto_ll128.h", include_str!("device/proto_ll128.h")),
            ("symmetric.h", include_str!("device/symmetric.h")),
            (exec::EXEC_SOURCE, include_str!("device/exec.cu")),
            (one_sided::SOURCE, include_str!("device/one_sided.cu")),
        ];
        let dir = std::env::var_os(SOURCE_DIR_ENV).filter(|d| !d.is_empty()).map(PathBuf::from);
        embedded
            .into_iter()
            .map(|(name, text)| match dir.as_ref().and_then(|d| std::fs::read_to_string(d.join(name)).ok()) {
                Some(replaced) => (name, &*Box::leak(replaced.into_boxed_str())),
                None => (name, text),
            })
            .collect()
    })
}

/// Directory whose files replace the embedded device sources of the same name (experiments).
pub const SOURCE_DIR_ENV: &str = "RUSTCCL_KERNEL_SOURCE_DIR";

/// The headers among [`sources`] (the `.h` files), for NVRTC/hipRTC's named headers.
pub fn headers() -> impl Iterator<Item = (&'static str, &'static str)> {
    sources()
        .iter()
        .copied()
        .filter(|(name, _)| name.ends_with(".h"))
}

/// The text of the source file `name` among [`sources`].
pub fn source(name: &str) -> Option<&'static str> {
    sources()
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

/// The operators of the device code (NCCL's device ops, `ncclDevRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceOp {
    Sum,
    Prod,
    Min,
    Max,
    /// Each input multiplied by a scalar (element-type bits), then summed.
    PreMulSum,
    /// Summed, then divided by a divisor (integer types only).
    SumPostDiv,
}

impl DeviceOp {
    pub const ALL: [DeviceOp; 6] = [
        DeviceOp::Sum,
        DeviceOp::Prod,
        DeviceOp::Min,
        DeviceOp::Max,
        DeviceOp::PreMulSum,
        DeviceOp::SumPostDiv,
    ];

    /// The operator's short name (`sum`, `prod`, ..., in logs).
    pub fn suffix(self) -> &'static str {
        match self {
            DeviceOp::Sum => "sum",
            DeviceOp::Prod => "prod",
            DeviceOp::Min => "min",
            DeviceOp::Max => "max",
            DeviceOp::PreMulSum => "premulsum",
            DeviceOp::SumPostDiv => "sumpostdiv",
        }
    }

    /// Whether the device code has this operator for elements of `ncclDataType_t` value
    /// `dtype`: every type (Int8 0 … Float8e5m2 11), but SumPostDiv on integers only (NCCL
    /// never uses it on floats: float Avg is PreMulSum with 1/n).
    pub fn supports(self, dtype: i32) -> bool {
        (0..12).contains(&dtype) && (self != DeviceOp::SumPostDiv || is_integer_dtype(dtype))
    }
}

/// Whether `ncclDataType_t` value `dtype` is an integer type (Int8 .. Uint64).
fn is_integer_dtype(dtype: i32) -> bool {
    (0..=5).contains(&dtype)
}

/// Environment variable that sets the cache directory.
pub const CACHE_DIR_ENV: &str = "RUSTCCL_KERNEL_CACHE_DIR";

/// The cache directory chosen from environment values given by `lookup`:
/// `RUSTCCL_KERNEL_CACHE_DIR`; else `$XDG_CACHE_HOME/rustccl/kernels` (if it is
/// an absolute path, as the XDG spec requires); else
/// `$HOME/.cache/rustccl/kernels`. Empty values count as unset. `None` when
/// none of them is usable.
pub fn cache_dir_from(lookup: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let get = |name: &str| lookup(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = get(CACHE_DIR_ENV) {
        return Some(dir);
    }
    if let Some(xdg) = get("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return Some(xdg.join("rustccl").join("kernels"));
    }
    get("HOME").map(|home| home.join(".cache").join("rustccl").join("kernels"))
}

/// Identifies one compiled blob: SHA-256 over everything that changes the
/// compiler's output.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// Version of the key derivation and file format; bumping it orphans old entries.
    const FORMAT: &'static str = "rustccl-kernel-cache-v1";

    /// The key for compiling `sources` (name, text) for `arch` (e.g. `sm_90`,
    /// `gfx942`) under driver version `driver_version` (e.g. CUDA's 12040) with
    /// compile `options` (in order). Anything else that changes the output,
    /// such as the NVRTC/hipRTC version, belongs in `options`.
    ///
    /// Every field is length-prefixed, so no two different inputs hash the same
    /// bytes (e.g. options `["-a", "b"]` and `["-ab"]` differ).
    pub fn new(
        sources: &[(&str, &str)],
        arch: &str,
        driver_version: u32,
        options: &[&str],
    ) -> Self {
        fn field(h: &mut Sha256, bytes: &[u8]) {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        let mut h = Sha256::new();
        field(&mut h, Self::FORMAT.as_bytes());
        h.update((sources.len() as u64).to_le_bytes());
        for (name, text) in sources {
            field(&mut h, name.as_bytes());
            field(&mut h, text.as_bytes());
        }
        field(&mut h, arch.as_bytes());
        h.update(driver_version.to_le_bytes());
        h.update((options.len() as u64).to_le_bytes());
        for option in options {
            field(&mut h, option.as_bytes());
        }
        CacheKey(h.finalize().into())
    }

    /// The key's raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The key as 64 lower-case hex digits (the cache file's name).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.to_hex())
    }
}

/// What a cache lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A valid entry: the blob.
    Hit(Vec<u8>),
    /// No entry for the key.
    Miss,
    /// A file exists but is damaged or not for this key (the reason); a
    /// [`KernelCache::store`] replaces it.
    Corrupt(String),
}

/// File header: magic, key, blob length (u64 LE), SHA-256 of the blob.
const MAGIC: &[u8; 8] = b"RCCLKRN1";
const HEADER_LEN: usize = 8 + 32 + 8 + 32;

/// A directory of compiled kernel blobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// A cache in the directory chosen by [`cache_dir_from`] from the process
    /// environment; `None` when no directory can be determined.
    pub fn from_env() -> Option<Self> {
        cache_dir_from(|name| std::env::var_os(name)).map(Self::new)
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds (or would hold) the entry for `key`.
    pub fn path_for(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.bin", key.to_hex()))
    }

    /// Looks `key` up, checking the file's header and the blob's hash.
    pub fn lookup(&self, key: &CacheKey) -> Lookup {
        let bytes = match fs::read(self.path_for(key)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => return Lookup::Corrupt(format!("unreadable: {e}")),
        };
        match decode(key, &bytes) {
            Ok(blob) => Lookup::Hit(blob.to_vec()),
            Err(reason) => Lookup::Corrupt(reason),
        }
    }

    /// The blob for `key`, or `None` on a miss or a damaged entry.
    pub fn load(&self, key: &CacheKey) -> Option<Vec<u8>> {
        match self.lookup(key) {
            Lookup::Hit(blob) => Some(blob),
            Lookup::Miss | Lookup::Corrupt(_) => None,
        }
    }

    /// Stores `blob` for `key` atomically: readers see the old entry or the new
    /// one, never a partial file, even with several processes storing at once.
    /// Returns the entry's path.
    pub fn store(&self, key: &CacheKey, blob: &[u8]) -> io::Result<PathBuf> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        fs::create_dir_all(&self.dir)?;
        let path = self.path_for(key);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            key.to_hex(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(&encode(key, blob))?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            // Best effort: the temporary file is useless now.
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| path)
    }
}

/// The bytes of a cache file for `blob`.
fn encode(key: &CacheKey, blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + blob.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(blob));
    out.extend_from_slice(blob);
    out
}

/// The blob inside a cache file, or why the file is not a valid entry for `key`.
fn decode<'a>(key: &CacheKey, bytes: &'a [u8]) -> Result<&'a [u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "truncated header ({} of {HEADER_LEN} bytes)",
            bytes.len()
        ));
    }
    let (header, blob) = bytes.split_at(HEADER_LEN);
    if &header[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    if &header[8..40] != key.as_bytes() {
        return Err("entry belongs to another key".into());
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[40..48]);
    let len = u64::from_le_bytes(len);
    if len != blob.len() as u64 {
        return Err(format!(
            "length mismatch (header says {len}, file holds {})",
            blob.len()
        ));
    }
    if header[48..80] != Sha256::digest(blob)[..] {
        return Err("checksum mismatch".into());
    }
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory for one test.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rustccl-kcache-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn key() -> CacheKey {
        CacheKey::new(
            sources(),
            "sm_90",
            12040,
            &["-std=c++17", "-DRUSTCCL_HAVE_FP8=1"],
        )
    }

    fn text_of(name: &str) -> &'static str {
        source(name).unwrap()
    }

    #[test]
    fn sources_are_embedded() {
        let names: Vec<&str> = sources().iter().map(|(n, _)| *n).collect();
        let own_headers = ["memory.h", "proto_simple.h", "proto_ll.h", "proto_ll128.h", "symmetric.h"];
        let mut want = vec!["port.h", "elem.h", "rustccl_exec_abi.h"];
        want.extend(own_headers);
        let headers: Vec<&str> = headers().map(|(n, _)| n).collect();
        assert_eq!(headers, want);
        want.extend(["exec.cu", "one_sided.cu"]);
        assert_eq!(names, want);
        for h in own_headers {
            assert!(text_of("exec.cu").contains(&format!("#include \"{h}\"")), "{h}");
        }
        assert!(text_of("exec.cu").contains("#include \"elem.h\""));
        assert!(text_of("elem.h").contains("#include \"port.h\""));
        assert!(text_of("exec.cu").contains("#include \"rustccl_exec_abi.h\""));
        // The generated header is a source like the files: NVRTC gets it and the cache key
        // covers it.
        assert_eq!(text_of(exec::ABI_HEADER), exec::abi_header());
        assert_eq!(source("nope.cu"), None);
        let text = |name: &str| sources().iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(text("port.h").contains("__HIP_PLATFORM_AMD__"));
        for (_, body) in sources() {
            assert!(body.len() > 500);
        }
    }

    #[test]
    fn operators_supported_per_type() {
        for dtype in 0..12 {
            for op in DeviceOp::ALL {
                let int = dtype <= 5;
                assert_eq!(op.supports(dtype), int || op != DeviceOp::SumPostDiv, "{op:?} {dtype}");
            }
        }
        assert!(DeviceOp::SumPostDiv.supports(4));
        assert!(!DeviceOp::SumPostDiv.supports(7));
        assert!(!DeviceOp::Sum.supports(12) && !DeviceOp::Sum.supports(-1));
    }

    #[test]
    fn key_changes_with_each_input() {
        let base = key();
        assert_eq!(base, key(), "deterministic");
        assert_eq!(base.to_hex().len(), 64);
        let mut edited: Vec<(&str, String)> =
            sources().iter().map(|(n, t)| (*n, t.to_string())).collect();
        edited[1].1.push(' ');
        let edited: Vec<(&str, &str)> = edited.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let renamed: Vec<(&str, &str)> = sources()
            .iter()
            .map(|(n, t)| (if *n == "port.h" { "port2.h" } else { *n }, *t))
            .collect();
        let opts = ["-std=c++17", "-DRUSTCCL_HAVE_FP8=1"];
        let variants = [
            CacheKey::new(&edited, "sm_90", 12040, &opts),
            CacheKey::new(&renamed, "sm_90", 12040, &opts),
            CacheKey::new(&sources()[..2], "sm_90", 12040, &opts),
            CacheKey::new(sources(), "sm_80", 12040, &opts),
            CacheKey::new(sources(), "sm_90", 12050, &opts),
            CacheKey::new(sources(), "sm_90", 12040, &["-std=c++17"]),
            CacheKey::new(
                sources(),
                "sm_90",
                12040,
                &["-DRUSTCCL_HAVE_FP8=1", "-std=c++17"],
            ),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i}");
            for w in &variants[i + 1..] {
                assert_ne!(v, w);
            }
        }
        // Field boundaries matter.
        assert_ne!(
            CacheKey::new(&[], "", 0, &["-a", "b"]),
            CacheKey::new(&[], "", 0, &["-ab"])
        );
        assert_ne!(
            CacheKey::new(&[("a", "bc")], "", 0, &[]),
            CacheKey::new(&[("ab", "c")], "", 0, &[])
        );
    }

    #[test]
    fn store_load_round_trip() {
        let dir = temp_dir("roundtrip");
        let cache = KernelCache::new(dir.join("nested"));
        let k = key();
        assert_eq!(cache.lookup(&k), Lookup::Miss);
        let blob: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let path = cache.store(&k, &blob).unwrap();
        assert_eq!(path, cache.path_for(&k));
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            (HEADER_LEN + blob.len()) as u64
        );
        assert_eq!(cache.load(&k), Some(blob.clone()));
        // Overwrite, and an empty blob is a valid entry.
        cache.store(&k, b"").unwrap();
        assert_eq!(cache.lookup(&k), Lookup::Hit(Vec::new()));
        // Another key is still a miss; no temporary files are left behind.
        let other = CacheKey::new(sources(), "sm_100", 12040, &[]);
        assert_eq!(cache.lookup(&other), Lookup::Miss);
        let names: Vec<String> = fs::read_dir(cache.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![format!("{}.bin", k.to_hex())]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_entries_are_misses() {
        let dir = temp_dir("corrupt");
        let cache = KernelCache::new(&dir);
        let k = key();
        let blob = vec![0xabu8; 4096];
        let path = cache.store(&k, &blob).unwrap();
        let good = fs::read(&path).unwrap();
        let corrupt = |bytes: &[u8]| -> Lookup {
            fs::write(&path, bytes).unwrap();
            cache.lookup(&k)
        };
        let expect_corrupt = |found: Lookup, what: &str| match found {
            Lookup::Corrupt(reason) => assert!(reason.contains(what), "{reason} lacks {what}"),
            other => panic!("expected corrupt ({what}), got {other:?}"),
        };
        // Truncated blob, truncated header, empty file.
        expect_corrupt(corrupt(&good[..good.len() - 1]), "length mismatch");
        expect_corrupt(corrupt(&good[..HEADER_LEN - 5]), "truncated header");
        expect_corrupt(corrupt(&[]), "truncated header");
        // One flipped bit in the blob.
        let mut flipped = good.clone();
        flipped[HEADER_LEN + 100] ^= 1;
        expect_corrupt(corrupt(&flipped), "checksum mismatch");
        // Bad magic; an extra trailing byte.
        let mut magic = good.clone();
        magic[0] = b'X';
        expect_corrupt(corrupt(&magic), "bad magic");
        let mut longer = good.clone();
        longer.push(0);
        expect_corrupt(corrupt(&longer), "length mismatch");
        // Another key's valid entry copied under this key's name.
        let other = CacheKey::new(sources(), "gfx942", 60200, &[]);
        expect_corrupt(corrupt(&encode(&other, &blob)), "another key");
        assert_eq!(cache.load(&k), None);
        // A store repairs it.
        cache.store(&k, &blob).unwrap();
        assert_eq!(cache.load(&k), Some(blob));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_stores_leave_a_valid_entry() {
        let dir = temp_dir("concurrent");
        let cache = KernelCache::new(&dir);
        let k = key();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let cache = &cache;
                s.spawn(move || {
                    for _ in 0..20 {
                        cache.store(&k, &vec![t; 50_000]).unwrap();
                        let blob = cache.load(&k).expect("never a partial file");
                        assert!(blob.len() == 50_000 && blob.iter().all(|&b| b == blob[0]));
                    }
                });
            }
        });
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_dir_resolution() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let all = &[
            ("RUSTCCL_KERNEL_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_dir_from(env(all)), Some(PathBuf::from("/c")));
        assert_eq!(
            cache_dir_from(env(&[
                ("RUSTCCL_KERNEL_CACHE_DIR", ""),
                ("XDG_CACHE_HOME", "/x"),
                ("HOME", "/h")
            ])),
            Some(PathBuf::from("/x/rustccl/kernels"))
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", "relative"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/rustccl/kernels"))
        );
        assert_eq!(cache_dir_from(env(&[])), None);
    }
}

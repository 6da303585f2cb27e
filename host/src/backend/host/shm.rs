//! Shareable host-backend memory: a file under /dev/shm, mapped `MAP_SHARED` by the process
//! that created it and by every process that imports it.
//!
//! The file is sized with `posix_fallocate`, so a /dev/shm too small for it fails at once
//! with a clear message rather than with SIGBUS on first touch. The creator unlinks the file
//! when it frees the memory; importers keep their mappings.
//!
//! Files must not outlive their processes, even SIGKILLed ones (nothing runs then):
//! - The last importer unlinks the file as soon as it has mapped it
//!   ([`SharedRegion::open_last`]), so once a connection is made its memory lives only in
//!   the two mappings and goes away with them, however the processes end.
//! - A file whose processes died before that (between create and import) is swept by the
//!   next process that creates one: names are `rustccl-<pid>-<start>-<pidns>-<n>-<random>`
//!   (the creator's pid, its start time in clock ticks since boot and its pid namespace), and
//!   a file of this pid namespace whose pid is gone, or now belongs to a process started at
//!   another time, is removed ([`sweep_dead`]).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};
use nix::errno::Errno;

use crate::error::{Error, Result};

/// Where shared memory files live.
pub const SHM_DIR: &str = "/dev/shm";

/// The prefix of every file name this module creates (and the only names it imports).
const PREFIX: &str = "rustccl-";

/// Distinguishes the files one process creates.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The pid that last swept the directory (so each process sweeps once, a forked child too).
static SWEPT_BY: AtomicU32 = AtomicU32::new(0);

/// Who created a file: the part of its name after the prefix that identifies the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creator {
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of /proc/<pid>/stat).
    pub start: u64,
    /// The inode of the pid namespace pids are counted in.
    pub pidns: u64,
}

impl Creator {
    /// This process, or `None` where /proc cannot tell (then no file is ever swept as ours
    /// and this process sweeps nothing).
    fn me() -> Option<Creator> {
        let pid = std::process::id();
        Some(Creator { pid, start: start_time(&format!("/proc/{pid}/stat"))?, pidns: pid_namespace()? })
    }

    /// Parses the creator out of a file name; `None` for names of another format.
    pub fn from_name(name: &str) -> Option<Creator> {
        let mut f = name.strip_prefix(PREFIX)?.split('-');
        let (pid, start, pidns) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
        // The counter and the random part follow.
        (f.count() == 2).then_some(Creator { pid, start, pidns })
    }

    /// Whether this creator is certainly dead, as seen from a process of pid namespace
    /// `pidns` (of another namespace, it cannot be told).
    fn is_dead(&self, pidns: u64) -> bool {
        self.pidns == pidns && start_time(&format!("/proc/{}/stat", self.pid)) != Some(self.start)
    }
}

/// Field 22 (starttime) of a /proc/<pid>/stat file; `None` if there is no such process.
fn start_time(stat_path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The inode of this process's pid namespace (`pid:[4026531836]`).
fn pid_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    link.to_str()?.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// Removes the files in `dir` whose creator is dead (see the module docs); returns their
/// names. Files of other pid namespaces and of other name formats are left alone.
pub fn sweep_dead(dir: &Path) -> Vec<String> {
    let Some(me) = Creator::me() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else { continue };
        let Some(creator) = Creator::from_name(&name) else { continue };
        if creator != me && creator.is_dead(me.pidns) {
            match std::fs::remove_file(dir.join(&name)) {
                Ok(()) => removed.push(name),
                // Another process swept it first, or it is not ours to remove.
                Err(e) => tracing::debug!(target: "SHM", "sweeping {name}: {e}"),
            }
        }
    }
    if !removed.is_empty() {
        tracing::info!(target: "SHM", "removed {} shared memory file(s) of dead processes from {}: {removed:?}", removed.len(), dir.display());
    }
    removed
}

/// A mapped shared memory file.
pub struct SharedRegion {
    map: MmapMut,
    ptr: NonNull<u8>,
    /// Set for the creator: the file to unlink on drop.
    owned_path: Option<PathBuf>,
    /// The file's name in its directory.
    name: String,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("ptr", &self.ptr)
            .field("len", &self.map.len())
            .field("owned_path", &self.owned_path)
            .finish()
    }
}

impl SharedRegion {
    /// Creates a file of `bytes` bytes in `dir` and maps it; returns the mapping and the
    /// file's name (what importers need).
    pub fn create(dir: &Path, bytes: usize) -> Result<(SharedRegion, String)> {
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot allocate 0 bytes of shareable memory"));
        }
        let len = libc::off_t::try_from(bytes)
            .map_err(|_| Error::invalid_argument(format!("{bytes} bytes of shareable memory is too large")))?;
        let pid = std::process::id();
        if SWEPT_BY.swap(pid, Ordering::Relaxed) != pid {
            sweep_dead(dir);
        }
        let mut random = [0u8; 8];
        getrandom::fill(&mut random)
            .map_err(|e| Error::system(format!("no randomness for a shared memory name: {e}")))?;
        let me = Creator::me().unwrap_or(Creator { pid, start: 0, pidns: 0 });
        let name = format!(
            "{PREFIX}{pid}-{}-{}-{}-{:016x}",
            me.start,
            me.pidns,
            COUNTER.fetch_add(1, Ordering::Relaxed),
            u64::from_ne_bytes(random)
        );
        let path = dir.join(&name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("creating shared memory file {}", path.display()), &e))?;
        if let Err(errno) = nix::fcntl::posix_fallocate(file.as_raw_fd(), 0, len) {
            let _ = std::fs::remove_file(&path);
            return Err(if errno == Errno::ENOSPC {
                Error::system(too_small_message(dir, bytes as u64, free_bytes(dir)))
            } else {
                Error::system(format!(
                    "reserving {bytes} bytes for shared memory file {}: posix_fallocate failed: {errno}",
                    path.display()
                ))
            });
        }
        match map(&file, bytes, &path, &name) {
            Ok(mut region) => {
                region.owned_path = Some(path.clone());
                tracing::debug!(target: "SHM", "created {} ({bytes} bytes)", path.display());
                Ok((region, name))
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps the first `bytes` bytes of the file `name` in `dir` that another
    /// [`SharedRegion::create`] made.
    pub fn open(dir: &Path, name: &str, bytes: usize) -> Result<SharedRegion> {
        let (file, path) = open_file(dir, name, bytes, |path| {
            Error::invalid_argument(format!(
                "shared memory {} does not exist (already freed by its exporter, or exported \
                 on another host?)",
                path.display()
            ))
        })?;
        let region = map(&file, bytes, &path, name)?;
        tracing::debug!(target: "SHM", "imported {} ({bytes} bytes)", path.display());
        Ok(region)
    }

    /// As [`SharedRegion::open`], for the last process to map the file: it is unlinked once
    /// mapped, so it disappears with the last mapping even if every process is killed. (The
    /// creator's own unlink then finds nothing, which is fine.)
    pub fn open_last(dir: &Path, name: &str, bytes: usize) -> Result<SharedRegion> {
        let region = SharedRegion::open(dir, name, bytes)?;
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!(target: "SHM", "unlinked {} (all mapped)", path.display()),
            Err(e) => tracing::debug!(target: "SHM", "unlinking {} after mapping it: {e}", path.display()),
        }
        Ok(region)
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        if let Some(path) = &self.owned_path {
            match std::fs::remove_file(path) {
                Ok(()) => tracing::debug!(target: "SHM", "unlinked {}", path.display()),
                // The last importer unlinked it already (open_last).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(target: "SHM", "unlinking {}: {e}", path.display()),
            }
        }
        // `map` unmaps when it drops, after this.
    }
}

/// Opens the file `name` in `dir` that a [`SharedRegion::create`] made, checking it holds at
/// least `bytes`; `missing` is the error when it does not exist (any more).
pub fn open_file(dir: &Path, name: &str, bytes: usize, missing: impl FnOnce(&Path) -> Error) -> Result<(File, PathBuf)> {
    validate_name(name)?;
    let path = dir.join(name);
    let file = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing(&path)),
        Err(e) => return Err(Error::io(format!("opening shared memory {}", path.display()), &e)),
    };
    let size = file.metadata().map_err(|e| Error::io(format!("reading the size of {}", path.display()), &e))?.len();
    if size < bytes as u64 {
        return Err(Error::invalid_argument(format!(
            "shared memory {} holds {size} bytes, but the handle says {bytes}",
            path.display()
        )));
    }
    Ok((file, path))
}

fn map(file: &File, bytes: usize, path: &Path, name: &str) -> Result<SharedRegion> {
    // SAFETY: the file is at least `bytes` long (fallocated by its creator, or its size
    // checked by the importer), so every mapped page is backed. Other mappings may change
    // the bytes at any time; the backend only reads and writes them through raw pointers,
    // never through references into the map.
    let mut map = unsafe { MmapOptions::new().len(bytes).map_mut(file) }
        .map_err(|e| Error::io(format!("mapping {bytes} bytes of {}", path.display()), &e))?;
    let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::internal("mmap returned null"))?;
    Ok(SharedRegion { map, ptr, owned_path: None, name: name.to_string() })
}

/// Checks that `name` is one [`SharedRegion::create`] makes: the prefix, then letters,
/// digits and dashes only (so a handle cannot point outside the shared memory directory).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = name.len() <= 100
        && name.len() > PREFIX.len()
        && name.starts_with(PREFIX)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!("invalid share handle: {name:?} is not a rustccl shared memory name")))
    }
}

/// Bytes free in `dir`'s filesystem, when it can be asked.
fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// The error message for a full shared memory directory.
pub fn too_small_message(dir: &Path, asked: u64, free: Option<u64>) -> String {
    let free = match free {
        Some(f) => format!("only {f} bytes are free there"),
        None => "its free space could not be read".to_string(),
    };
    format!(
        "{} is too small: allocating {asked} bytes of shared memory failed (ENOSPC) and {free}. \
         Enlarge it, e.g. `mount -o remount,size=8G {}` as root, or start the container with \
         `docker run --shm-size=8g ...`",
        dir.display(),
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        validate_name("rustccl-12-0-00ff00ff00ff00ff").unwrap();
        for bad in ["", "rustccl-", "other-1-2", "rustccl-../../etc/passwd", "rustccl-a/b", "rustccl-\0"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&format!("rustccl-{}", "a".repeat(100))).is_err());
    }

    #[test]
    fn too_small_message_says_what_and_how() {
        let m = too_small_message(Path::new("/dev/shm"), 1 << 30, Some(65536));
        assert!(m.starts_with("/dev/shm is too small"), "{m}");
        assert!(m.contains("1073741824 bytes"), "{m}");
        assert!(m.contains("only 65536 bytes are free"), "{m}");
        assert!(m.contains("mount -o remount,size=8G /dev/shm"), "{m}");
        assert!(m.contains("--shm-size"), "{m}");
    }

    #[test]
    fn a_full_directory_fails_with_enospc_message() {
        // Ask for far more than any /dev/shm holds; posix_fallocate must refuse it now.
        let e = SharedRegion::create(Path::new(SHM_DIR), 1 << 50).unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::SystemError);
        assert!(e.message.contains("is too small"), "{}", e.message);
        assert!(e.message.contains(&format!("{} bytes", 1u64 << 50)), "{}", e.message);
    }

    #[test]
    fn names_say_who_created_them() {
        let (a, name) = SharedRegion::create(Path::new(SHM_DIR), 4096).unwrap();
        let me = Creator::me().expect("/proc tells this process's start time and pid namespace");
        assert_eq!(Creator::from_name(&name), Some(me.clone()), "{name}");
        assert!(name.starts_with(&format!("rustccl-{}-", std::process::id())), "{name}");
        assert!(!me.is_dead(me.pidns));
        assert_eq!(Creator::from_name("rustccl-12-0-00ff00ff00ff00ff"), None, "the old format");
        assert_eq!(Creator::from_name("rustccl-1-2-3-4"), None);
        assert_eq!(Creator::from_name("rustccl-1-2-3-4-5-6"), None);
        drop(a);
    }

    #[test]
    fn files_of_dead_creators_are_swept_and_others_kept() {
        let dir = std::env::temp_dir().join(format!("rustccl-sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = Creator::me().unwrap();
        let name = |pid: u32, start: u64, ns: u64| format!("rustccl-{pid}-{start}-{ns}-0-00000000000000ff");
        // This pid, started at another time: a dead process whose pid was reused.
        let reused = name(me.pid, me.start + 1, me.pidns);
        // A pid above the largest possible one (4194304): no such process.
        let gone = name(4_194_305, 1, me.pidns);
        let mine = name(me.pid, me.start, me.pidns);
        // Another pid namespace: its pids cannot be checked from here.
        let foreign = name(4_194_305, 1, me.pidns + 1);
        let unrelated = ["rustccl-12-0-00ff00ff00ff00ff".to_string(), "other-file".to_string()];
        for n in [&reused, &gone, &mine, &foreign].into_iter().chain(&unrelated) {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        let mut removed = sweep_dead(&dir);
        removed.sort();
        let mut want = vec![gone.clone(), reused.clone()];
        want.sort();
        assert_eq!(removed, want);
        for n in [&mine, &foreign].into_iter().chain(&unrelated) {
            assert!(dir.join(n).exists(), "{n} was removed");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_last_importer_unlinks_the_file() {
        let dir = Path::new(SHM_DIR);
        let (a, name) = SharedRegion::create(dir, 4096).unwrap();
        let b = SharedRegion::open_last(dir, &name, 4096).unwrap();
        assert!(!dir.join(&name).exists());
        // SAFETY: both mappings are 4096 bytes long and alive.
        unsafe {
            a.ptr().as_ptr().add(7).write(9);
            assert_eq!(b.ptr().as_ptr().add(7).read(), 9);
        }
        let e = SharedRegion::open(dir, &name, 4096).unwrap_err();
        assert!(e.message.contains("does not exist"), "{}", e.message);
        drop(a); // finds nothing to unlink, quietly
        drop(b);
    }

    #[test]
    fn create_open_share_bytes_and_unlink() {
        let dir = Path::new(SHM_DIR);
        let (a, name) = SharedRegion::create(dir, 4096).unwrap();
        assert!(dir.join(&name).exists());
        let b = SharedRegion::open(dir, &name, 4096).unwrap();
        assert_ne!(a.ptr(), b.ptr());
        // SAFETY: both mappings are 4096 bytes long and alive.
        unsafe {
            a.ptr().as_ptr().add(100).write(42);
            assert_eq!(b.ptr().as_ptr().add(100).read(), 42);
        }
        assert!(SharedRegion::open(dir, &name, 8192).unwrap_err().message.contains("holds 4096 bytes"));
        drop(a);
        assert!(!dir.join(&name).exists());
        // SAFETY: `b` is still mapped.
        assert_eq!(unsafe { b.ptr().as_ptr().add(100).read() }, 42);
    }
}

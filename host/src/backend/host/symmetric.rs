//! Symmetric memory on the host backend: address space reserved with no memory behind it
//! (`PROT_NONE`, `MAP_NORESERVE`), and shareable allocations (`/dev/shm` files) mapped at
//! fixed addresses inside it, so that every rank of a communicator sees every rank's window
//! at the same offset of one flat range (`crate::window`).

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use super::memory::{Allocation, Kind};
use super::shm::open_file;
use super::HostBackend;
use crate::backend::{BackendKind, DevicePtr, ShareHandle, Sharing, SymmetricMemory, WindowMemory};
use crate::error::{Error, Result};

/// Reserved spaces of this backend: base → bytes.
pub type Spaces = BTreeMap<u64, usize>;

/// The reserved space holding `[at, at + bytes)`, if one does.
fn inside_space(b: &HostBackend, at: u64, bytes: usize) -> bool {
    let spaces = b.spaces.lock().unwrap_or_else(|p| p.into_inner());
    spaces
        .range(..=at)
        .next_back()
        .is_some_and(|(&base, &len)| at as u128 + bytes as u128 <= base as u128 + len as u128)
}

impl WindowMemory for HostBackend {
    /// Shareable memory (a /dev/shm file), which any process of the host maps anywhere.
    fn alloc_symmetric(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        self.alloc_shareable(device, bytes).map(|(p, _)| p)
    }

    fn symmetric_memory(&self, ptr: DevicePtr) -> Result<SymmetricMemory> {
        let table = self.read_memory();
        let (base, a) = table.containing(ptr.0).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{ptr} is not memory of this process's host backend: a window must lie in memory from ncclMemAlloc"
            ))
        })?;
        let name = a.exported_name().ok_or_else(|| {
            Error::invalid_argument(format!(
                "{ptr} lies in memory peers cannot map: a window must lie in memory from ncclMemAlloc (shareable memory)"
            ))
        })?;
        let handle = ShareHandle::new(BackendKind::Host, a.bytes() as u64, name.as_bytes())?;
        Ok(SymmetricMemory { base: DevicePtr(base), bytes: a.bytes(), handle })
    }

    fn reserve_space(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot reserve 0 bytes of address space"));
        }
        // SAFETY: a fresh anonymous mapping chosen by the kernel; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(Error::system(format!(
                "reserving {bytes} bytes of address space for symmetric windows failed: {e} \
                 (set NCCL_WIN_STRIDE lower, or allow more virtual memory: ulimit -v)"
            )));
        }
        self.spaces.lock().unwrap_or_else(|p| p.into_inner()).insert(p as u64, bytes);
        Ok(DevicePtr(p as u64))
    }

    fn release_space(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        let mut spaces = self.spaces.lock().unwrap_or_else(|p| p.into_inner());
        if spaces.get(&base.0) != Some(&bytes) {
            return Err(Error::invalid_argument(format!("release_space({base}, {bytes}): no such reserved space")));
        }
        let end = base.0 + bytes as u64;
        if let Some((at, _)) = self.read_memory().first_in(base.0, end) {
            return Err(Error::invalid_usage(format!(
                "release_space({base}): a window mapping at {at:#x} is still in it; unmap it first"
            )));
        }
        // SAFETY: a range this backend reserved and that holds no mapping any more.
        if unsafe { libc::munmap(base.0 as *mut libc::c_void, bytes) } != 0 {
            return Err(Error::system(format!("munmap of reserved space {base}: {}", std::io::Error::last_os_error())));
        }
        spaces.remove(&base.0);
        Ok(())
    }

    fn map_shared_at(&self, device: usize, handle: &ShareHandle, at: DevicePtr) -> Result<()> {
        self.check_device(device, "map_shared_at")?;
        let (name, bytes) = self.share_file(handle, "map_shared_at", "maps")?;
        let page = 4096u64;
        if !at.0.is_multiple_of(page) || !inside_space(self, at.0, bytes) {
            return Err(Error::invalid_argument(format!(
                "map_shared_at({at}, {bytes} bytes): not a page-aligned range of a reserved space"
            )));
        }
        let (file, path) = open_file(&self.shm_dir, name, bytes, |path| {
            Error::remote(format!(
                "the shared memory {} of a peer's window is gone (freed, or its process ended)",
                path.display()
            ))
        })?;
        let mut table = self.write_memory();
        if let Some((other, _)) = table.first_in(at.0, at.0 + bytes as u64) {
            return Err(Error::invalid_usage(format!("map_shared_at({at}): the range is already mapped (at {other:#x})")));
        }
        // SAFETY: `at..at+bytes` lies in a space this backend reserved and holds no other mapping
        // (checked above under the table's write lock), so MAP_FIXED replaces only reserved,
        // inaccessible pages; the file is at least `bytes` long.
        let p = unsafe {
            libc::mmap(
                at.0 as *mut libc::c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "mapping {} at {at}: {}",
                path.display(),
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(p as *mut u8).ok_or_else(|| Error::internal("mmap returned null"))?;
        table.insert(Allocation::window(ptr, bytes, Some(device)))?;
        Ok(())
    }

    fn unmap_at(&self, at: DevicePtr) -> Result<()> {
        let a = self.write_memory().remove(at, "unmap_at", &[Kind::Window])?;
        // SAFETY: the range was a window mapping of ours (just removed from the table, so no
        // backend operation uses it any more); it becomes reserved, inaccessible space again.
        let p = unsafe {
            libc::mmap(
                at.0 as *mut libc::c_void,
                a.bytes(),
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!("unmapping the window at {at}: {}", std::io::Error::last_os_error())));
        }
        Ok(())
    }
}

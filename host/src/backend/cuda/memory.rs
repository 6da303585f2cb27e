//! Memory of the CUDA backend: what it allocates, exports, imports, maps or registers, tracked
//! in a table by start address (so frees and ranges are checked without a driver call), and
//! the check of memory it does not track (`cuPointerGetAttributes`).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::sys;

use super::driver::{self, check, Ctx, CtxGuard};
use super::CudaBackend;
use crate::backend::{BackendKind, DevicePtr, HostMapped, ShareHandle};
use crate::error::{Error, Result};

/// The size of a `CUipcMemHandle`.
pub const IPC_HANDLE_BYTES: usize = 64;

/// What a tracked address range is.
#[derive(Debug)]
pub(super) enum Kind {
    /// `alloc`.
    Device,
    /// `alloc_shareable`: memory this process exported. `local_imports` counts imports of the
    /// handle in this process (which share the address); a free while they are open is
    /// deferred (`freed`) until the last closes.
    Exported { handle: [u8; IPC_HANDLE_BYTES], local_imports: usize, freed: bool },
    /// `alloc_host_mapped`: `host` is the host address.
    HostMapped { host: usize },
    /// `register_host`.
    /// Host memory registered (`refs` times: a process may register the same mapping for
    /// both ends of a connection).
    Registered { host: usize, refs: usize },
    /// `import` of another process's memory; `refs` imports of the same handle share it.
    Imported { handle: [u8; IPC_HANDLE_BYTES], refs: usize },
    /// `alloc_symmetric`: a cuMem allocation (`handle`) mapped at its own reserved range,
    /// offered to the processes of the host as a file descriptor (`ticket`) from the first
    /// time a window is made of it (so allocations never registered hold no descriptor).
    Vmm { handle: u64, ticket: Option<[u8; super::symmetric::TICKET_BYTES]> },
    /// `map_shared_at`: a (local or peer) cuMem allocation mapped inside a reserved space.
    WindowMap,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub bytes: usize,
    /// The device it belongs to (None for host memory).
    pub device: Option<usize>,
    pub kind: Kind,
}

impl Entry {
    fn live(&self) -> bool {
        !matches!(self.kind, Kind::Exported { freed: true, .. })
    }
}

/// Tracked memory by start address.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub entries: BTreeMap<u64, Entry>,
    /// Allocations the backend did not make (the caller's: PyTorch's allocator, `cudaMalloc`)
    /// that the driver confirmed once: start -> (bytes, device). A collective on the same
    /// buffers then costs no `cuPointerGetAttributes` per call (two per call were ~2 µs of a
    /// one-rank copy through the C ABI). The driver is not told of frees, so an entry may
    /// outlive its allocation: a later call on freed memory then passes this check and fails
    /// in the driver or the kernel instead — as with NCCL, which checks no pointer by default.
    /// Bounded: emptied when it holds `EXTERNAL_MAX` ranges.
    external: BTreeMap<u64, (usize, Option<usize>)>,
}

/// Caller allocations remembered at most (see `Table::external`).
const EXTERNAL_MAX: usize = 4096;

impl Table {
    /// The live entry whose range holds `ptr..ptr+bytes`.
    pub(super) fn find(&self, ptr: DevicePtr, bytes: usize) -> Option<&Entry> {
        let (base, e) = self.entries.range(..=ptr.0).next_back()?;
        let end = ptr.0.checked_add(bytes as u64)?;
        (e.live() && end <= base + e.bytes as u64).then_some(e)
    }

    /// The device of a remembered caller allocation holding `ptr..ptr+bytes` (`Some(None)`:
    /// host memory), if one is remembered.
    fn find_external(&self, ptr: DevicePtr, bytes: usize) -> Option<Option<usize>> {
        let (base, &(size, device)) = self.external.range(..=ptr.0).next_back()?;
        let end = ptr.0.checked_add(bytes as u64)?;
        (end <= base + size as u64).then_some(device)
    }

    fn remember_external(&mut self, start: u64, size: usize, device: Option<usize>) {
        if self.external.len() >= EXTERNAL_MAX {
            self.external.clear();
        }
        self.external.insert(start, (size, device));
    }
}

impl CudaBackend {
    pub(super) fn read_memory(&self) -> RwLockReadGuard<'_, Table> {
        self.memory.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn write_memory(&self) -> RwLockWriteGuard<'_, Table> {
        self.memory.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The device owning tracked memory at `ptr`, if tracked and device memory.
    pub(super) fn tracked_device(&self, ptr: DevicePtr) -> Option<usize> {
        self.read_memory().find(ptr, 0).and_then(|e| e.device)
    }

    /// Checks that `ptr..ptr+bytes` is memory the backend or the driver knows; returns the
    /// device that owns it (None for host memory).
    pub(super) fn check_range(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<Option<usize>> {
        if bytes == 0 {
            return Ok(None);
        }
        {
            let mem = self.read_memory();
            if let Some(e) = mem.find(ptr, bytes) {
                return Ok(e.device);
            }
            if let Some(device) = mem.find_external(ptr, bytes) {
                return Ok(device);
            }
        }
        let mut start: u64 = 0;
        let mut size: usize = 0;
        let mut mem_type: u32 = 0;
        let mut ordinal: i32 = -1;
        use sys::CUpointer_attribute::*;
        let mut attrs = [
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data: [*mut c_void; 4] = [
            &mut start as *mut u64 as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            &mut mem_type as *mut u32 as *mut c_void,
            &mut ordinal as *mut i32 as *mut c_void,
        ];
        // SAFETY: each data pointer has the size of its attribute (CUdeviceptr, size_t,
        // CUmemorytype, int).
        let r = unsafe { sys::cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr.0) };
        let end = ptr.0.checked_add(bytes as u64);
        if r != sys::CUresult::CUDA_SUCCESS || start == 0 || size == 0 {
            return Err(Error::invalid_argument(format!(
                "{what} {ptr} ({bytes} bytes) is not memory the CUDA driver knows{}",
                if r == sys::CUresult::CUDA_SUCCESS {
                    String::new()
                } else {
                    format!(" ({})", driver::error_text(r).0)
                }
            )));
        }
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(Error::invalid_argument(format!(
                "{what} {ptr} ({bytes} bytes) runs past the end of its allocation ({:#x}, {size} bytes)",
                start
            )));
        }
        let device_mem = mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        let device = (device_mem && ordinal >= 0).then_some(ordinal as usize);
        self.write_memory().remember_external(start, size, device);
        Ok(device)
    }
}

pub(super) fn alloc(b: &CudaBackend, device: usize, bytes: usize) -> Result<DevicePtr> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc: zero bytes"));
    }
    let _g = CtxGuard::enter(b.primary(device)?)?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one address.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes on device {device})"))?;
    b.write_memory().entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Device });
    Ok(DevicePtr(p))
}

pub(super) fn free(b: &CudaBackend, ptr: DevicePtr) -> Result<()> {
    let mut mem = b.write_memory();
    let Some(e) = mem.entries.get_mut(&ptr.0) else {
        return Err(Error::invalid_argument(format!(
            "free: {ptr} is not a live allocation of the CUDA backend (never allocated, or already freed)"
        )));
    };
    let device = e.device;
    match &mut e.kind {
        Kind::Device => {}
        Kind::Exported { freed: true, .. } => {
            return Err(Error::invalid_argument(format!("free: {ptr} was already freed")));
        }
        Kind::Exported { local_imports, freed, .. } if *local_imports > 0 => {
            // Imported in this process at the same address: free when the last closes.
            *freed = true;
            return Ok(());
        }
        Kind::Exported { .. } => {}
        Kind::HostMapped { .. } => {
            return Err(Error::invalid_argument(format!("free: {ptr} is host-mapped memory; use free_host_mapped")))
        }
        Kind::Registered { .. } => {
            return Err(Error::invalid_argument(format!(
                "free: {ptr} is registered host memory; use unregister_host"
            )))
        }
        Kind::Imported { .. } => {
            return Err(Error::invalid_argument(format!("free: {ptr} is imported memory; use close_import")))
        }
        Kind::Vmm { .. } => {
            drop(mem);
            return super::symmetric::free(b, ptr);
        }
        Kind::WindowMap => {
            return Err(Error::invalid_argument(format!("free: {ptr} is a window mapping; use unmap_at")))
        }
    }
    let _g = CtxGuard::enter(b.primary(device.unwrap_or(0))?)?;
    // SAFETY: a live allocation of ours, removed from the table below.
    check(unsafe { sys::cuMemFree_v2(ptr.0) }, "cuMemFree")?;
    mem.entries.remove(&ptr.0);
    Ok(())
}

pub(super) fn alloc_host_mapped(b: &CudaBackend, bytes: usize) -> Result<HostMapped> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc_host_mapped: zero bytes"));
    }
    let device = match driver::current()? {
        c if c.is_null() => 0,
        c => b.ctx_device(Ctx(c))?,
    };
    let _g = CtxGuard::enter(b.primary(device)?)?;
    let mut host: *mut c_void = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: writes one pointer.
    check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }, &format!("cuMemHostAlloc({bytes} bytes)"))?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `host` is mapped memory we just allocated.
    if let Err(e) =
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }, "cuMemHostGetDevicePointer")
    {
        // SAFETY: ours, not handed out.
        unsafe { sys::cuMemFreeHost(host) };
        return Err(e);
    }
    b.write_memory()
        .entries
        .insert(dev, Entry { bytes, device: None, kind: Kind::HostMapped { host: host as usize } });
    Ok(HostMapped { host: host as *mut u8, device: DevicePtr(dev), bytes })
}

pub(super) fn free_host_mapped(b: &CudaBackend, mem: HostMapped) -> Result<()> {
    let mut table = b.write_memory();
    let host = match table.entries.get(&mem.device.0) {
        Some(Entry { kind: Kind::HostMapped { host }, .. }) => *host,
        Some(_) => {
            return Err(Error::invalid_argument(format!(
                "free_host_mapped: {} is not host-mapped memory; use free, close_import or unregister_host",
                mem.device
            )))
        }
        None => {
            return Err(Error::invalid_argument(format!(
                "free_host_mapped: {} is not live host-mapped memory of the CUDA backend",
                mem.device
            )))
        }
    };
    // SAFETY: memory cuMemHostAlloc gave us, removed from the table below.
    check(unsafe { sys::cuMemFreeHost(host as *mut c_void) }, "cuMemFreeHost")?;
    table.entries.remove(&mem.device.0);
    Ok(())
}

/// # Safety
/// As [`crate::backend::DeviceBackend::register_host`]: `ptr..ptr+bytes` stays valid for
/// reads and writes until it is unregistered.
pub(super) unsafe fn register_host(b: &CudaBackend, ptr: *mut u8, bytes: usize) -> Result<DevicePtr> {
    if ptr.is_null() || bytes == 0 {
        return Err(Error::invalid_argument("register_host: null pointer or zero bytes"));
    }
    let device = match driver::current()? {
        c if c.is_null() => 0,
        c => b.ctx_device(Ctx(c))?,
    };
    {
        let mut table = b.write_memory();
        for e in table.entries.values_mut() {
            if let Kind::Registered { host, refs } = &mut e.kind {
                if *host == ptr as usize && e.bytes == bytes {
                    *refs += 1;
                    drop(table);
                    let mut dev: sys::CUdeviceptr = 0;
                    // SAFETY: the range is registered with DEVICEMAP (PORTABLE: every context).
                    check(
                        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut c_void, 0) },
                        "cuMemHostGetDevicePointer",
                    )?;
                    return Ok(DevicePtr(dev));
                }
            }
        }
    }
    let _g = CtxGuard::enter(b.primary(device)?)?;
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
    // SAFETY: the caller promises the range stays valid until unregister_host.
    check(
        unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, bytes, flags) },
        &format!("cuMemHostRegister({bytes} bytes)"),
    )?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: the range is registered with DEVICEMAP.
    if let Err(e) = check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut c_void, 0) },
        "cuMemHostGetDevicePointer",
    ) {
        // SAFETY: registered just above.
        unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        return Err(e);
    }
    b.write_memory()
        .entries
        .insert(dev, Entry { bytes, device: None, kind: Kind::Registered { host: ptr as usize, refs: 1 } });
    Ok(DevicePtr(dev))
}

pub(super) fn unregister_host(b: &CudaBackend, ptr: DevicePtr) -> Result<()> {
    let mut table = b.write_memory();
    let host = match table.entries.get_mut(&ptr.0) {
        Some(Entry { kind: Kind::Registered { refs, .. }, .. }) if *refs > 1 => {
            *refs -= 1;
            return Ok(());
        }
        Some(Entry { kind: Kind::Registered { host, .. }, .. }) => *host,
        _ => {
            return Err(Error::invalid_argument(format!(
                "unregister_host: {ptr} is not host memory registered with the CUDA backend"
            )))
        }
    };
    // SAFETY: registered by register_host, removed from the table below.
    check(unsafe { sys::cuMemHostUnregister(host as *mut c_void) }, "cuMemHostUnregister")?;
    table.entries.remove(&ptr.0);
    Ok(())
}

pub(super) fn alloc_shareable(b: &CudaBackend, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc_shareable: zero bytes"));
    }
    let _g = CtxGuard::enter(b.primary(device)?)?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one address.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes on device {device})"))?;
    let result = (|| {
        // Synchronous memory operations on shared memory are ordered across processes.
        let one: u32 = 1;
        // SAFETY: reads one unsigned int; `p` is our allocation.
        check(
            unsafe {
                sys::cuPointerSetAttribute(
                    &one as *const u32 as *const c_void,
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                    p,
                )
            },
            "cuPointerSetAttribute(SYNC_MEMOPS)",
        )?;
        let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: writes the 64-byte handle.
        check(unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), p) }, "cuIpcGetMemHandle")?;
        // SAFETY: written above.
        let h = unsafe { h.assume_init() };
        let mut raw = [0u8; IPC_HANDLE_BYTES];
        for (b, c) in raw.iter_mut().zip(h.reserved.iter()) {
            *b = *c as u8;
        }
        Ok(raw)
    })();
    let raw = match result {
        Ok(raw) => raw,
        Err(e) => {
            // SAFETY: ours, not handed out.
            unsafe { sys::cuMemFree_v2(p) };
            return Err(e);
        }
    };
    let handle = ShareHandle::new(BackendKind::Cuda, bytes as u64, &raw)?;
    b.write_memory().entries.insert(
        p,
        Entry { bytes, device: Some(device), kind: Kind::Exported { handle: raw, local_imports: 0, freed: false } },
    );
    Ok((DevicePtr(p), handle))
}

pub(super) fn import(b: &CudaBackend, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
    b.device(device, "import")?;
    if handle.kind() != BackendKind::Cuda {
        return Err(Error::invalid_argument(format!(
            "import: the share handle was made by the {} backend; the cuda backend imports only its own",
            handle.kind()
        )));
    }
    let raw: [u8; IPC_HANDLE_BYTES] = handle.payload().try_into().map_err(|_| {
        Error::invalid_argument(format!(
            "invalid share handle: a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, this payload {}",
            handle.payload().len()
        ))
    })?;
    let bytes = usize::try_from(handle.bytes())
        .map_err(|_| Error::invalid_argument(format!("invalid share handle: {} bytes", handle.bytes())))?;
    let mut mem = b.write_memory();
    // This process's own export, or an import already open: share it.
    for (base, e) in mem.entries.iter_mut() {
        match &mut e.kind {
            Kind::Exported { handle: h, local_imports, freed: false } if *h == raw => {
                if bytes > e.bytes {
                    return Err(Error::invalid_argument(format!(
                        "invalid share handle: {bytes} bytes, but the allocation has {}",
                        e.bytes
                    )));
                }
                *local_imports += 1;
                return Ok(DevicePtr(*base));
            }
            Kind::Imported { handle: h, refs } if *h == raw && e.device == Some(device) => {
                *refs += 1;
                return Ok(DevicePtr(*base));
            }
            _ => {}
        }
    }
    let _g = CtxGuard::enter(b.primary(device)?)?;
    let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
    for (c, b) in h.reserved.iter_mut().zip(raw.iter()) {
        *c = *b as std::ffi::c_char;
    }
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one address; a bad handle is reported by the driver.
    check(
        unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut p, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
        },
        "cuIpcOpenMemHandle",
    )?;
    mem.entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Imported { handle: raw, refs: 1 } });
    Ok(DevicePtr(p))
}

pub(super) fn close_import(b: &CudaBackend, ptr: DevicePtr) -> Result<()> {
    let mut mem = b.write_memory();
    let Some(e) = mem.entries.get_mut(&ptr.0) else {
        return Err(Error::invalid_argument(format!("close_import: {ptr} is not an open import")));
    };
    let device = e.device;
    match &mut e.kind {
        Kind::Imported { refs, .. } => {
            *refs -= 1;
            if *refs > 0 {
                return Ok(());
            }
        }
        Kind::Exported { local_imports, freed, .. } if *local_imports > 0 => {
            *local_imports -= 1;
            if *local_imports > 0 || !*freed {
                return Ok(());
            }
            // The export was freed while imported here: free it now.
            let _g = CtxGuard::enter(b.primary(device.unwrap_or(0))?)?;
            // SAFETY: our allocation, no longer referenced.
            check(unsafe { sys::cuMemFree_v2(ptr.0) }, "cuMemFree")?;
            mem.entries.remove(&ptr.0);
            return Ok(());
        }
        _ => {
            return Err(Error::invalid_argument(format!(
                "close_import: {ptr} is not imported memory; use free, free_host_mapped or unregister_host"
            )))
        }
    }
    let _g = CtxGuard::enter(b.primary(device.unwrap_or(0))?)?;
    // SAFETY: an address cuIpcOpenMemHandle gave us, removed from the table below.
    check(unsafe { sys::cuIpcCloseMemHandle(ptr.0) }, "cuIpcCloseMemHandle")?;
    mem.entries.remove(&ptr.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_finds_ranges_inside_live_entries() {
        let mut t = Table::default();
        t.entries.insert(0x1000, Entry { bytes: 0x100, device: Some(1), kind: Kind::Device });
        t.entries.insert(
            0x2000,
            Entry {
                bytes: 0x100,
                device: Some(0),
                kind: Kind::Exported { handle: [0; 64], local_imports: 1, freed: true },
            },
        );
        assert_eq!(t.find(DevicePtr(0x1000), 0x100).unwrap().device, Some(1));
        assert!(t.find(DevicePtr(0x10f0), 0x10).is_some());
        assert!(t.find(DevicePtr(0x10f0), 0x11).is_none());
        assert!(t.find(DevicePtr(0xfff), 1).is_none());
        assert!(t.find(DevicePtr(0x2000), 1).is_none(), "freed exports are not live");
        assert!(t.find(DevicePtr(u64::MAX), 2).is_none());
    }

    #[test]
    fn caller_allocations_are_remembered_by_range_and_bounded() {
        let mut t = Table::default();
        assert_eq!(t.find_external(DevicePtr(0x1000), 8), None);
        t.remember_external(0x1000, 0x100, Some(1));
        assert_eq!(t.find_external(DevicePtr(0x1000), 0x100), Some(Some(1)));
        assert_eq!(t.find_external(DevicePtr(0x10f8), 8), Some(Some(1)));
        assert_eq!(t.find_external(DevicePtr(0x10f8), 9), None, "past the end");
        assert_eq!(t.find_external(DevicePtr(0xfff), 1), None, "before the start");
        t.remember_external(0x9000, 0x10, None);
        assert_eq!(t.find_external(DevicePtr(0x9008), 8), Some(None), "host memory");
        for i in 0..EXTERNAL_MAX as u64 {
            t.remember_external(0x100_0000 + i * 0x100, 0x100, Some(0));
        }
        assert!(t.external.len() <= EXTERNAL_MAX, "bounded");
        // Remembered ranges are not tracked allocations (frees do not see them).
        assert!(t.find(DevicePtr(0x1000), 8).is_none());
    }
}

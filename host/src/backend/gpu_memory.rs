//! The memory a GPU backend tracks, the same for CUDA and HIP: what it allocates, exports,
//! imports, maps or registers, in a table by start address, so that frees are checked
//! (unknown pointers, double frees and frees of the wrong kind are `InvalidArgument`) and
//! ranges in it are checked without a driver call; caller allocations the driver confirmed
//! once are remembered.
//!
//! The bookkeeping is here once; each vendor gives its calls through [`MemoryCalls`] (one
//! driver call each, with its context or current device handled), so the rules — an export
//! imported by its own process shares the address and is freed by the last of the two, an
//! import or a registration opened twice is counted — are the same on both backends and are
//! tested without a GPU, against a fake driver (the tests below).

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::fdpass::Ticket;
use super::{BackendKind, DevicePtr, HostMapped, ShareHandle};
use crate::error::{Error, Result};

/// The size of an IPC handle: a `CUipcMemHandle` and a `hipIpcMemHandle_t` alike.
pub const IPC_HANDLE_BYTES: usize = 64;

/// What a tracked address range is.
#[derive(Debug)]
pub(crate) enum Kind {
    /// `alloc`.
    Device,
    /// `alloc_shareable`: memory this process exported. `local_imports` counts imports of the
    /// handle in this process (which share the address); a free while they are open is
    /// deferred (`freed`) until the last closes.
    Exported { handle: [u8; IPC_HANDLE_BYTES], local_imports: usize, freed: bool },
    /// `alloc_host_mapped`: `host` is the host address.
    HostMapped { host: usize },
    /// Host memory registered (`refs` times: a process may register the same mapping for
    /// both ends of a connection).
    Registered { host: usize, refs: usize },
    /// `import` of another process's memory; `refs` imports of the same handle share it.
    Imported { handle: [u8; IPC_HANDLE_BYTES], refs: usize },
    /// `alloc_symmetric`: a virtual-memory allocation (`handle`) mapped at its own reserved
    /// range, offered to the processes of the host as a file descriptor (`ticket`) from the
    /// first time a window is made of it (so allocations never registered hold no descriptor).
    Vmm { handle: u64, ticket: Option<[u8; Ticket::SIZE]> },
    /// `map_shared_at`: a (local or peer) allocation mapped inside a reserved space.
    WindowMap,
}

#[derive(Debug)]
pub(crate) struct Entry {
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
pub(crate) struct Table {
    pub entries: BTreeMap<u64, Entry>,
    /// Allocations the backend did not make (the caller's: PyTorch's allocator, `cudaMalloc`,
    /// `hipMalloc`) that the driver confirmed once: start -> (bytes, device). A collective on
    /// the same buffers then costs no pointer query per call (two per call were ~2 µs of a
    /// one-rank copy through the C ABI on CUDA). The driver is not told of frees, so an entry
    /// may outlive its allocation: a later call on freed memory then passes this check and
    /// fails in the driver or the kernel instead — as with NCCL, which checks no pointer by
    /// default. Bounded: emptied when it holds `EXTERNAL_MAX` ranges.
    external: BTreeMap<u64, (usize, Option<usize>)>,
}

/// Caller allocations remembered at most (see `Table::external`).
const EXTERNAL_MAX: usize = 4096;

impl Table {
    /// The live entry whose range holds `ptr..ptr+bytes`.
    pub(crate) fn find(&self, ptr: DevicePtr, bytes: usize) -> Option<&Entry> {
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

/// What the driver says of an address it knows: the allocation holding it (start, bytes) and
/// the device that owns it (None: host memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PointerRange {
    pub start: u64,
    pub bytes: usize,
    pub device: Option<usize>,
}

/// A vendor's memory calls: each is one driver call (with the context or current device it
/// needs), and undoes its own half-done work on failure. `device` arguments have been checked.
pub(crate) trait MemoryCalls {
    /// Which backend (the kind written into share handles) and its vendor's name for messages
    /// ("CUDA", "HIP").
    fn kind(&self) -> BackendKind;
    fn vendor(&self) -> &'static str;
    fn table(&self) -> &RwLock<Table>;
    /// `InvalidArgument` when `device` does not exist (`op` names the operation).
    fn check_device(&self, device: usize, op: &str) -> Result<()>;
    /// The device host memory is allocated or registered for: the caller's current one, else 0.
    fn host_device(&self) -> Result<usize>;

    fn device_alloc(&self, device: usize, bytes: usize) -> Result<u64>;
    fn device_free(&self, device: usize, ptr: u64) -> Result<()>;
    /// Pinned host memory mapped for every device: (host address, device address).
    fn host_alloc_mapped(&self, device: usize, bytes: usize) -> Result<(usize, u64)>;
    fn host_free(&self, host: usize) -> Result<()>;
    /// Registers `host..host+bytes` mapped for every device and returns its device address.
    ///
    /// # Safety
    /// The range stays valid for reads and writes until [`host_unregister`](Self::host_unregister).
    unsafe fn host_register(&self, device: usize, host: usize, bytes: usize) -> Result<u64>;
    /// The device address of registered host memory.
    fn host_device_pointer(&self, host: usize) -> Result<u64>;
    fn host_unregister(&self, host: usize) -> Result<()>;
    /// Prepares device memory `ptr` (from `device_alloc`) for other processes and returns its
    /// IPC handle.
    fn ipc_export(&self, device: usize, ptr: u64) -> Result<[u8; IPC_HANDLE_BYTES]>;
    fn ipc_open(&self, device: usize, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64>;
    fn ipc_close(&self, device: usize, ptr: u64) -> Result<()>;
    /// Frees a [`Kind::Vmm`] allocation (the backend's symmetric memory); backends without it
    /// never track one.
    fn free_vmm(&self, ptr: DevicePtr) -> Result<()> {
        Err(Error::internal(format!("free: {ptr} is symmetric memory, which the {} backend does not make", self.kind())))
    }
    /// What the driver knows of `ptr`; `Err` with the driver's words when it knows nothing.
    fn pointer_range(&self, ptr: u64) -> std::result::Result<PointerRange, String>;
}

/// The allocation and registration operations of [`crate::backend::Memory`] for a backend
/// whose memory is this bookkeeping over its [`MemoryCalls`]: written inside its `impl Memory`.
macro_rules! memory_operations {
    () => {
        fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
            $crate::backend::gpu_memory::alloc(self, device, bytes)
        }

        fn free(&self, ptr: DevicePtr) -> Result<()> {
            $crate::backend::gpu_memory::free(self, ptr)
        }

        fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped> {
            $crate::backend::gpu_memory::alloc_host_mapped(self, bytes)
        }

        fn free_host_mapped(&self, mem: HostMapped) -> Result<()> {
            $crate::backend::gpu_memory::free_host_mapped(self, mem)
        }

        unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<DevicePtr> {
            // SAFETY: the caller keeps the promise of this trait method, which the function
            // it delegates to has too.
            unsafe { $crate::backend::gpu_memory::register_host(self, ptr, bytes) }
        }

        fn unregister_host(&self, ptr: DevicePtr) -> Result<()> {
            $crate::backend::gpu_memory::unregister_host(self, ptr)
        }
    };
}
pub(crate) use memory_operations;

/// [`crate::backend::Sharing`] for a backend whose memory is this bookkeeping over its
/// [`MemoryCalls`] (IPC handles): the whole `impl` for `$backend`.
macro_rules! impl_sharing {
    ($backend:ty) => {
        impl $crate::backend::Sharing for $backend {
            fn alloc_shareable(
                &self,
                device: usize,
                bytes: usize,
            ) -> $crate::error::Result<($crate::backend::DevicePtr, $crate::backend::ShareHandle)> {
                $crate::backend::gpu_memory::alloc_shareable(self, device, bytes)
            }

            fn import(&self, device: usize, handle: &$crate::backend::ShareHandle) -> $crate::error::Result<$crate::backend::DevicePtr> {
                $crate::backend::gpu_memory::import(self, device, handle)
            }

            fn close_import(&self, ptr: $crate::backend::DevicePtr) -> $crate::error::Result<()> {
                $crate::backend::gpu_memory::close_import(self, ptr)
            }
        }
    };
}
pub(crate) use impl_sharing;

pub(crate) fn read<M: MemoryCalls + ?Sized>(b: &M) -> RwLockReadGuard<'_, Table> {
    b.table().read().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn write<M: MemoryCalls + ?Sized>(b: &M) -> RwLockWriteGuard<'_, Table> {
    b.table().write().unwrap_or_else(|p| p.into_inner())
}

/// The device owning tracked memory at `ptr`, if tracked and device memory.
pub(crate) fn tracked_device<M: MemoryCalls + ?Sized>(b: &M, ptr: DevicePtr) -> Option<usize> {
    read(b).find(ptr, 0).and_then(|e| e.device)
}

/// Checks that `ptr..ptr+bytes` is memory the backend or the driver knows; returns the device
/// that owns it (None for host memory).
pub(crate) fn check_range<M: MemoryCalls + ?Sized>(b: &M, ptr: DevicePtr, bytes: usize, what: &str) -> Result<Option<usize>> {
    if bytes == 0 {
        return Ok(None);
    }
    {
        let mem = read(b);
        if let Some(e) = mem.find(ptr, bytes) {
            return Ok(e.device);
        }
        if let Some(device) = mem.find_external(ptr, bytes) {
            return Ok(device);
        }
    }
    let r = b.pointer_range(ptr.0).map_err(|why| {
        Error::invalid_argument(format!("{what} {ptr} ({bytes} bytes) is not memory the {} driver knows{why}", b.vendor()))
    })?;
    if ptr.0.checked_add(bytes as u64).is_none_or(|end| end > r.start + r.bytes as u64) {
        return Err(Error::invalid_argument(format!(
            "{what} {ptr} ({bytes} bytes) runs past the end of its allocation ({:#x}, {} bytes)",
            r.start, r.bytes
        )));
    }
    write(b).remember_external(r.start, r.bytes, r.device);
    Ok(r.device)
}

pub(crate) fn alloc<M: MemoryCalls + ?Sized>(b: &M, device: usize, bytes: usize) -> Result<DevicePtr> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc: zero bytes"));
    }
    b.check_device(device, "alloc")?;
    let p = b.device_alloc(device, bytes)?;
    write(b).entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Device });
    Ok(DevicePtr(p))
}

pub(crate) fn free<M: MemoryCalls + ?Sized>(b: &M, ptr: DevicePtr) -> Result<()> {
    let mut mem = write(b);
    let Some(e) = mem.entries.get_mut(&ptr.0) else {
        return Err(Error::invalid_argument(format!(
            "free: {ptr} is not a live allocation of the {} backend (never allocated, or already freed)",
            b.kind()
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
            return Err(Error::invalid_argument(format!("free: {ptr} is registered host memory; use unregister_host")))
        }
        Kind::Imported { .. } => {
            return Err(Error::invalid_argument(format!("free: {ptr} is imported memory; use close_import")))
        }
        Kind::Vmm { .. } => {
            drop(mem);
            return b.free_vmm(ptr);
        }
        Kind::WindowMap => return Err(Error::invalid_argument(format!("free: {ptr} is a window mapping; use unmap_at"))),
    }
    b.device_free(device.unwrap_or(0), ptr.0)?;
    mem.entries.remove(&ptr.0);
    Ok(())
}

pub(crate) fn alloc_host_mapped<M: MemoryCalls + ?Sized>(b: &M, bytes: usize) -> Result<HostMapped> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc_host_mapped: zero bytes"));
    }
    let (host, dev) = b.host_alloc_mapped(b.host_device()?, bytes)?;
    write(b).entries.insert(dev, Entry { bytes, device: None, kind: Kind::HostMapped { host } });
    Ok(HostMapped { host: host as *mut u8, device: DevicePtr(dev), bytes })
}

pub(crate) fn free_host_mapped<M: MemoryCalls + ?Sized>(b: &M, mem: HostMapped) -> Result<()> {
    let mut table = write(b);
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
                "free_host_mapped: {} is not live host-mapped memory of the {} backend",
                mem.device,
                b.kind()
            )))
        }
    };
    b.host_free(host)?;
    table.entries.remove(&mem.device.0);
    Ok(())
}

/// # Safety
/// As [`crate::backend::Memory::register_host`]: `ptr..ptr+bytes` stays valid for
/// reads and writes until it is unregistered.
pub(crate) unsafe fn register_host<M: MemoryCalls + ?Sized>(b: &M, ptr: *mut u8, bytes: usize) -> Result<DevicePtr> {
    if ptr.is_null() || bytes == 0 {
        return Err(Error::invalid_argument("register_host: null pointer or zero bytes"));
    }
    let host = ptr as usize;
    {
        let mut table = write(b);
        let again = table.entries.values_mut().find_map(|e| match &mut e.kind {
            Kind::Registered { host: h, refs } if *h == host && e.bytes == bytes => Some(refs),
            _ => None,
        });
        if let Some(refs) = again {
            *refs += 1;
            drop(table);
            return b.host_device_pointer(host).map(DevicePtr);
        }
    }
    let device = b.host_device()?;
    // SAFETY: the caller promises the range stays valid until unregister_host.
    let dev = unsafe { b.host_register(device, host, bytes) }?;
    write(b).entries.insert(dev, Entry { bytes, device: None, kind: Kind::Registered { host, refs: 1 } });
    Ok(DevicePtr(dev))
}

pub(crate) fn unregister_host<M: MemoryCalls + ?Sized>(b: &M, ptr: DevicePtr) -> Result<()> {
    let mut table = write(b);
    let host = match table.entries.get_mut(&ptr.0) {
        Some(Entry { kind: Kind::Registered { refs, .. }, .. }) if *refs > 1 => {
            *refs -= 1;
            return Ok(());
        }
        Some(Entry { kind: Kind::Registered { host, .. }, .. }) => *host,
        _ => {
            return Err(Error::invalid_argument(format!(
                "unregister_host: {ptr} is not host memory registered with the {} backend",
                b.kind()
            )))
        }
    };
    b.host_unregister(host)?;
    table.entries.remove(&ptr.0);
    Ok(())
}

pub(crate) fn alloc_shareable<M: MemoryCalls + ?Sized>(b: &M, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)> {
    if bytes == 0 {
        return Err(Error::invalid_argument("alloc_shareable: zero bytes"));
    }
    b.check_device(device, "alloc_shareable")?;
    let p = b.device_alloc(device, bytes)?;
    let exported = b.ipc_export(device, p).and_then(|raw| Ok((raw, ShareHandle::new(b.kind(), bytes as u64, &raw)?)));
    let (raw, handle) = match exported {
        Ok(h) => h,
        Err(e) => {
            let _ = b.device_free(device, p);
            return Err(e);
        }
    };
    write(b)
        .entries
        .insert(p, Entry { bytes, device: Some(device), kind: Kind::Exported { handle: raw, local_imports: 0, freed: false } });
    Ok((DevicePtr(p), handle))
}

pub(crate) fn import<M: MemoryCalls + ?Sized>(b: &M, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
    b.check_device(device, "import")?;
    if handle.kind() != b.kind() {
        return Err(Error::invalid_argument(format!(
            "import: the share handle was made by the {} backend; the {} backend imports only its own",
            handle.kind(),
            b.kind()
        )));
    }
    let raw: [u8; IPC_HANDLE_BYTES] = handle.payload().try_into().map_err(|_| {
        Error::invalid_argument(format!(
            "invalid share handle: a {} IPC handle is {IPC_HANDLE_BYTES} bytes, this payload {}",
            b.vendor(),
            handle.payload().len()
        ))
    })?;
    let bytes = usize::try_from(handle.bytes())
        .map_err(|_| Error::invalid_argument(format!("invalid share handle: {} bytes", handle.bytes())))?;
    let mut mem = write(b);
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
    let p = b.ipc_open(device, &raw)?;
    mem.entries.insert(p, Entry { bytes, device: Some(device), kind: Kind::Imported { handle: raw, refs: 1 } });
    Ok(DevicePtr(p))
}

pub(crate) fn close_import<M: MemoryCalls + ?Sized>(b: &M, ptr: DevicePtr) -> Result<()> {
    let mut mem = write(b);
    let Some(e) = mem.entries.get_mut(&ptr.0) else {
        return Err(Error::invalid_argument(format!("close_import: {ptr} is not an open import")));
    };
    let device = e.device.unwrap_or(0);
    match &mut e.kind {
        Kind::Imported { refs, .. } => {
            *refs -= 1;
            if *refs > 0 {
                return Ok(());
            }
            b.ipc_close(device, ptr.0)?;
        }
        Kind::Exported { local_imports, freed, .. } if *local_imports > 0 => {
            *local_imports -= 1;
            if *local_imports > 0 || !*freed {
                return Ok(());
            }
            // The export was freed while imported here: free it now.
            b.device_free(device, ptr.0)?;
        }
        _ => {
            return Err(Error::invalid_argument(format!(
                "close_import: {ptr} is not imported memory; use free, free_host_mapped or unregister_host"
            )))
        }
    }
    mem.entries.remove(&ptr.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[test]
    fn table_finds_ranges_inside_live_entries() {
        let mut t = Table::default();
        t.entries.insert(0x1000, Entry { bytes: 0x100, device: Some(1), kind: Kind::Device });
        t.entries.insert(
            0x2000,
            Entry { bytes: 0x100, device: Some(0), kind: Kind::Exported { handle: [0; 64], local_imports: 1, freed: true } },
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

    /// A driver in a table: device memory is address ranges handed out in order, IPC handles
    /// name allocations, and every call is recorded, so the bookkeeping's calls can be checked.
    #[derive(Default)]
    struct Fake {
        table: RwLock<Table>,
        next: Mutex<u64>,
        /// Live device allocations, host mappings, registrations and open IPC mappings.
        live: Mutex<BTreeSet<(&'static str, u64)>>,
        calls: Mutex<Vec<String>>,
        /// Memory the "driver" knows but the backend did not make: (start, bytes, device).
        foreign: Vec<(u64, usize, Option<usize>)>,
    }

    impl Fake {
        fn take(&self, what: &'static str, bytes: usize) -> u64 {
            let mut next = self.next.lock().unwrap();
            let p = 0x10_0000 + *next;
            *next += (bytes as u64).next_multiple_of(0x1000);
            assert!(self.live.lock().unwrap().insert((what, p)));
            p
        }
        fn give(&self, what: &'static str, p: u64) -> Result<()> {
            self.calls.lock().unwrap().push(format!("{what}-free {p:#x}"));
            if self.live.lock().unwrap().remove(&(what, p)) {
                Ok(())
            } else {
                Err(Error::internal(format!("the fake driver has no {what} at {p:#x}")))
            }
        }
        fn live(&self) -> usize {
            self.live.lock().unwrap().len()
        }
    }

    impl MemoryCalls for Fake {
        fn kind(&self) -> BackendKind {
            BackendKind::Hip
        }
        fn vendor(&self) -> &'static str {
            "fake"
        }
        fn table(&self) -> &RwLock<Table> {
            &self.table
        }
        fn check_device(&self, device: usize, op: &str) -> Result<()> {
            if device < 2 {
                Ok(())
            } else {
                Err(Error::invalid_argument(format!("{op}: no device {device}")))
            }
        }
        fn host_device(&self) -> Result<usize> {
            Ok(0)
        }
        fn device_alloc(&self, _device: usize, bytes: usize) -> Result<u64> {
            Ok(self.take("dev", bytes))
        }
        fn device_free(&self, _device: usize, ptr: u64) -> Result<()> {
            self.give("dev", ptr)
        }
        fn host_alloc_mapped(&self, _device: usize, bytes: usize) -> Result<(usize, u64)> {
            let p = self.take("host", bytes);
            Ok((p as usize + 0x7000_0000, p))
        }
        fn host_free(&self, host: usize) -> Result<()> {
            self.give("host", host as u64 - 0x7000_0000)
        }
        unsafe fn host_register(&self, _device: usize, host: usize, _bytes: usize) -> Result<u64> {
            assert!(self.live.lock().unwrap().insert(("reg", host as u64)));
            Ok(host as u64 + 1)
        }
        fn host_device_pointer(&self, host: usize) -> Result<u64> {
            Ok(host as u64 + 1)
        }
        fn host_unregister(&self, host: usize) -> Result<()> {
            self.give("reg", host as u64)
        }
        fn ipc_export(&self, _device: usize, ptr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
            let mut h = [0u8; IPC_HANDLE_BYTES];
            h[..8].copy_from_slice(&ptr.to_le_bytes());
            Ok(h)
        }
        fn ipc_open(&self, _device: usize, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64> {
            let exporter = u64::from_le_bytes(handle[..8].try_into().unwrap());
            self.calls.lock().unwrap().push(format!("ipc-open {exporter:#x}"));
            Ok(self.take("ipc", 0x1000))
        }
        fn ipc_close(&self, _device: usize, ptr: u64) -> Result<()> {
            self.give("ipc", ptr)
        }
        fn pointer_range(&self, ptr: u64) -> std::result::Result<PointerRange, String> {
            self.calls.lock().unwrap().push(format!("query {ptr:#x}"));
            self.foreign
                .iter()
                .find(|&&(s, n, _)| ptr >= s && ptr < s + n as u64)
                .map(|&(start, bytes, device)| PointerRange { start, bytes, device })
                .ok_or_else(|| " (unknown pointer)".to_string())
        }
    }

    fn invalid(r: Result<impl std::fmt::Debug>, says: &str) {
        let e = r.unwrap_err();
        assert_eq!(e.code, ResultCode::InvalidArgument, "{}", e.message);
        assert!(e.message.contains(says), "{:?} lacks {says:?}", e.message);
    }

    #[test]
    fn frees_are_checked_by_kind_and_never_reach_the_driver_twice() {
        let b = Fake::default();
        let p = alloc(&b, 1, 100).unwrap();
        assert_eq!(check_range(&b, DevicePtr(p.0 + 10), 90, "buffer").unwrap(), Some(1));
        invalid(check_range(&b, DevicePtr(p.0 + 10), 91, "buffer"), "not memory the fake driver knows");
        invalid(alloc(&b, 2, 100), "no device 2");
        invalid(alloc(&b, 0, 0), "zero bytes");
        let h = alloc_host_mapped(&b, 64).unwrap();
        invalid(free(&b, h.device), "use free_host_mapped");
        // SAFETY: the fake driver never touches the memory.
        let r = unsafe { register_host(&b, 0x5000 as *mut u8, 4096) }.unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { register_host(&b, 0x5000 as *mut u8, 4096) }.unwrap(), r, "registered twice: one mapping");
        invalid(free(&b, r), "use unregister_host");
        invalid(free_host_mapped(&b, HostMapped { host: std::ptr::null_mut(), device: p, bytes: 100 }), "not host-mapped");
        free(&b, p).unwrap();
        invalid(free(&b, p), "never allocated, or already freed");
        free_host_mapped(&b, h).unwrap();
        unregister_host(&b, r).unwrap();
        assert_eq!(b.live(), 1, "the registration is counted: one unregister leaves it");
        unregister_host(&b, r).unwrap();
        invalid(unregister_host(&b, r), "not host memory registered");
        assert_eq!(b.live(), 0);
        assert!(read(&b).entries.is_empty());
    }

    #[test]
    fn an_export_imported_by_its_own_process_is_freed_by_the_last_of_the_two() {
        let b = Fake::default();
        let (p, handle) = alloc_shareable(&b, 0, 4096).unwrap();
        assert_eq!(handle.kind(), BackendKind::Hip);
        assert_eq!(import(&b, 0, &handle).unwrap(), p, "the exporter's own address, no mapping");
        free(&b, p).unwrap();
        assert_eq!(b.live(), 1, "still imported: the free waits");
        invalid(free(&b, p), "already freed");
        invalid(check_range(&b, p, 8, "buffer"), "not memory");
        close_import(&b, p).unwrap();
        assert_eq!(b.live(), 0, "the last close frees it");
        invalid(close_import(&b, p), "not an open import");
        // Freed first by close, then by free: the other order.
        let (q, handle) = alloc_shareable(&b, 0, 4096).unwrap();
        assert_eq!(import(&b, 0, &handle).unwrap(), q);
        close_import(&b, q).unwrap();
        assert_eq!(b.live(), 1);
        free(&b, q).unwrap();
        assert_eq!(b.live(), 0);
    }

    #[test]
    fn imports_of_one_handle_share_one_mapping_until_the_last_close() {
        let peer = Fake::default();
        let (theirs, handle) = alloc_shareable(&peer, 0, 8192).unwrap();
        let b = Fake { next: Mutex::new(0x100_0000), ..Fake::default() };
        let a = import(&b, 1, &handle).unwrap();
        assert_ne!(a, theirs);
        assert_eq!(import(&b, 1, &handle).unwrap(), a, "the same handle again: the same mapping");
        assert_eq!(check_range(&b, a, 8192, "slots").unwrap(), Some(1));
        let opened = b.calls.lock().unwrap().iter().filter(|c| c.starts_with("ipc-open")).count();
        assert_eq!(opened, 1);
        invalid(free(&b, a), "use close_import");
        close_import(&b, a).unwrap();
        assert_eq!(b.live(), 1);
        close_import(&b, a).unwrap();
        assert_eq!(b.live(), 0);
        // Handles of another backend, or of the wrong size, are refused before the driver.
        let cuda = ShareHandle::new(BackendKind::Cuda, 64, &[0u8; 64]).unwrap();
        invalid(import(&b, 0, &cuda), "made by the cuda backend");
        let short = ShareHandle::new(BackendKind::Hip, 64, &[0u8; 8]).unwrap();
        invalid(import(&b, 0, &short), "is 64 bytes, this payload 8");
    }

    #[test]
    fn caller_memory_is_asked_of_the_driver_once() {
        let b = Fake { foreign: vec![(0x9000_0000, 1 << 20, Some(1)), (0xa000_0000, 4096, None)], ..Fake::default() };
        assert_eq!(check_range(&b, DevicePtr(0x9000_1000), 4096, "buffer").unwrap(), Some(1));
        assert_eq!(check_range(&b, DevicePtr(0x9000_2000), 4096, "buffer").unwrap(), Some(1));
        assert_eq!(check_range(&b, DevicePtr(0xa000_0000), 4096, "buffer").unwrap(), None, "host memory");
        let queries = b.calls.lock().unwrap().iter().filter(|c| c.starts_with("query")).count();
        assert_eq!(queries, 2, "the second range of a known allocation costs no query");
        invalid(check_range(&b, DevicePtr(0x9000_0000 + (1 << 20) - 8), 16, "buffer"), "runs past the end");
        invalid(check_range(&b, DevicePtr(0x1234), 1, "buffer"), "unknown pointer");
        assert_eq!(check_range(&b, DevicePtr(0x1234), 0, "buffer").unwrap(), None, "empty ranges pass");
    }
}

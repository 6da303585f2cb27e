//! The host backend: "device" memory is host memory and collectives run on CPU threads.
//!
//! Semantics:
//! - Devices are virtual: `RUSTCCL_HOST_DEVICES` of them (64 by default), all sharing the
//!   process's memory.
//! - Work enqueued on a stream runs synchronously, before the call returns; streams are only
//!   ordering tokens and events are complete as soon as they are recorded.
//! - Memory is 256-byte aligned and zero-filled. Every allocation, import, host-mapped
//!   buffer and registration is tracked, so frees and every pointer range are checked: a bad
//!   pointer is `InvalidArgument`, never undefined behaviour.
//! - Shareable memory is a /dev/shm file (see `shm`); its [`ShareHandle`] carries the file
//!   name and size.
//! - There are no device kernels: collectives run on CPU threads, in the host executor
//!   (`coll/exec.rs`), which reduces with [`crate::reduce`] on the addresses
//!   [`host_address`](super::HostAccess::host_address) gives it. So of the optional groups it
//!   has host access and window memory (`symmetric`), no kernels and no zero-copy buffers.
//!
//! Concurrency: the memory table sits behind a read-write lock. Copies and fills hold the
//! read lock while they run (so ranks on different threads run in parallel and nothing they
//! touch can be freed meanwhile); allocation and free take the write lock.

mod memory;
mod shm;
mod symmetric;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use memory::{Allocation, Kind, Table};
use shm::SharedRegion;

use super::{BackendKind, BufferSharing, DeviceBackend, DevicePtr, Event, ForeignEvents, HostAccess, HostMapped, Kernels, Memory, ShareHandle, Sharing, Stream, Streams, SymmetricKernels, WindowMemory};
use crate::error::{Error, Result};

pub use shm::SHM_DIR;

/// The environment variable giving the number of virtual devices.
pub const DEVICES_ENV: &str = "RUSTCCL_HOST_DEVICES";
/// The number of virtual devices when [`DEVICES_ENV`] is unset.
pub const DEFAULT_DEVICES: usize = 64;

/// The host backend (see the module docs).
pub struct HostBackend {
    devices: usize,
    shm_dir: PathBuf,
    memory: RwLock<Table>,
    streams: Mutex<HashSet<u64>>,
    events: Mutex<HashSet<u64>>,
    /// Stream and event handles; 0 is never handed out (it is the default stream).
    next_handle: AtomicU64,
    /// Address space reserved for symmetric windows.
    spaces: Mutex<symmetric::Spaces>,
}

impl std::fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBackend")
            .field("devices", &self.devices)
            .field("shm_dir", &self.shm_dir)
            .field("live_allocations", &self.read_memory().len())
            .finish()
    }
}

impl HostBackend {
    /// A backend with [`DEVICES_ENV`] virtual devices; a value that is not a positive
    /// integer is `InvalidArgument`.
    pub fn new() -> Result<HostBackend> {
        let devices = match crate::params::env_int(DEVICES_ENV)? {
            None => DEFAULT_DEVICES,
            Some(n) if n >= 1 => n as usize,
            Some(n) => {
                return Err(Error::invalid_argument(format!(
                    "{DEVICES_ENV}={n}: the host backend needs at least one device"
                )))
            }
        };
        Ok(HostBackend::with_devices(devices))
    }

    /// A backend with `devices` virtual devices.
    pub fn with_devices(devices: usize) -> HostBackend {
        HostBackend {
            devices,
            shm_dir: PathBuf::from(SHM_DIR),
            memory: RwLock::new(Table::default()),
            streams: Mutex::new(HashSet::new()),
            events: Mutex::new(HashSet::new()),
            next_handle: AtomicU64::new(1),
            spaces: Mutex::new(symmetric::Spaces::new()),
        }
    }

    /// The process's host backend, made by [`HostBackend::new`] on first use. Every part of
    /// rustccl that uses the host backend should use this one, so memory allocated through
    /// it is valid everywhere.
    pub fn shared() -> Result<Arc<HostBackend>> {
        static SHARED: OnceLock<Arc<HostBackend>> = OnceLock::new();
        if let Some(b) = SHARED.get() {
            return Ok(b.clone());
        }
        let made = Arc::new(HostBackend::new()?);
        Ok(SHARED.get_or_init(|| made).clone())
    }

    fn read_memory(&self) -> RwLockReadGuard<'_, Table> {
        self.memory.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_memory(&self) -> RwLockWriteGuard<'_, Table> {
        self.memory.write().unwrap_or_else(|p| p.into_inner())
    }

    /// `import` and `import_last`: checks the handle and maps its file with `open`.
    fn import_region(
        &self,
        device: usize,
        handle: &ShareHandle,
        open: fn(&std::path::Path, &str, usize) -> Result<SharedRegion>,
    ) -> Result<DevicePtr> {
        self.check_device(device, "import")?;
        let (name, bytes) = self.share_file(handle, "import", "imports")?;
        let region = open(&self.shm_dir, name, bytes)?;
        self.write_memory().insert(Allocation::shared(region, Kind::Imported, Some(device)))
    }

    /// The file name and size a share handle of this backend names (`op` and `verb` for the
    /// message about another backend's handle).
    fn share_file<'h>(&self, handle: &'h ShareHandle, op: &str, verb: &str) -> Result<(&'h str, usize)> {
        if handle.kind() != BackendKind::Host {
            return Err(Error::invalid_argument(format!(
                "{op}: the share handle was made by the {} backend; the host backend {verb} only its own",
                handle.kind()
            )));
        }
        let name = std::str::from_utf8(handle.payload())
            .map_err(|_| Error::invalid_argument("invalid share handle: the file name is not UTF-8"))?;
        let bytes = usize::try_from(handle.bytes())
            .map_err(|_| Error::invalid_argument(format!("invalid share handle: {} bytes", handle.bytes())))?;
        Ok((name, bytes))
    }

    fn check_device(&self, device: usize, op: &str) -> Result<()> {
        if device < self.devices {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "{op}: device {device} does not exist; the host backend has {} ({DEVICES_ENV})",
                self.devices
            )))
        }
    }

    fn check_stream(&self, stream: Stream, op: &str) -> Result<()> {
        let live = stream.is_default() || self.streams.lock().unwrap_or_else(|p| p.into_inner()).contains(&stream.0);
        if live {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("{op}: stream {:#x} is not a live stream", stream.0)))
        }
    }

    fn check_event(&self, event: Event, op: &str) -> Result<()> {
        if self.events.lock().unwrap_or_else(|p| p.into_inner()).contains(&event.0) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("{op}: event {:#x} is not a live event", event.0)))
        }
    }

    fn new_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

impl DeviceBackend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn capabilities(&self) -> &crate::backend::Capabilities {
        crate::backend::caps::host_static()
    }

    fn device_count(&self) -> Result<usize> {
        Ok(self.devices)
    }

    fn device_name(&self, device: usize) -> Result<String> {
        self.check_device(device, "device_name")?;
        Ok(format!("host device {device}"))
    }

    fn kernels(&self) -> Option<&dyn Kernels> {
        None
    }

    fn symmetric_kernels(&self) -> Option<&dyn SymmetricKernels> {
        None
    }

    fn window_memory(&self) -> Option<&dyn WindowMemory> {
        Some(self)
    }

    fn buffer_sharing(&self) -> Option<&dyn BufferSharing> {
        None
    }

    fn host_access(&self) -> Option<&dyn HostAccess> {
        Some(self)
    }

    fn foreign_events(&self) -> Option<&dyn ForeignEvents> {
        None
    }
}

impl Memory for HostBackend {
    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        self.check_device(device, "alloc")?;
        let a = Allocation::heap(bytes, Kind::Device, Some(device))?;
        self.write_memory().insert(a)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        let a = self.write_memory().remove(ptr, "free", &[Kind::Device, Kind::Exported])?;
        drop(a); // outside the lock: unlinking a file can take a moment
        Ok(())
    }

    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped> {
        let a = Allocation::heap(bytes, Kind::HostMapped, None)?;
        let host = a.base();
        let device = self.write_memory().insert(a)?;
        Ok(HostMapped { host, device, bytes })
    }

    fn free_host_mapped(&self, mem: HostMapped) -> Result<()> {
        self.write_memory().remove(mem.device, "free_host_mapped", &[Kind::HostMapped])?;
        Ok(())
    }

    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<DevicePtr> {
        // SAFETY: the caller promises the range stays valid until unregister_host.
        let a = unsafe { Allocation::borrowed(ptr, bytes)? };
        self.write_memory().insert(a)
    }

    fn unregister_host(&self, ptr: DevicePtr) -> Result<()> {
        self.write_memory().remove(ptr, "unregister_host", &[Kind::Registered])?;
        Ok(())
    }

    fn memory_info(&self, _device: usize) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        self.check_stream(stream, "memset")?;
        let mem = self.read_memory();
        let d = mem.resolve(dst, bytes, "fill destination")?;
        // SAFETY: the range lies inside a live entry, kept alive by `mem` (a read guard).
        unsafe { std::ptr::write_bytes(d, value, bytes) };
        Ok(())
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
        self.check_stream(stream, "copy")?;
        let mem = self.read_memory();
        let d = mem.resolve(dst, bytes, "copy destination")?;
        let s = mem.resolve(src, bytes, "copy source")?;
        // SAFETY: both ranges lie inside live entries, which cannot be freed while `mem` (a
        // read guard) is held; `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, bytes) };
        Ok(())
    }

    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
        self.check_stream(stream, "copy_to_device")?;
        let mem = self.read_memory();
        let d = mem.resolve(dst, src.len(), "copy_to_device destination")?;
        // SAFETY: the destination range is live (kept alive by `mem`); `src` is a valid
        // slice; `copy` tolerates a slice that views the same memory.
        unsafe { std::ptr::copy(src.as_ptr(), d, src.len()) };
        Ok(())
    }

    fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
        self.check_stream(stream, "copy_from_device")?;
        let mem = self.read_memory();
        let s = mem.resolve(src, dst.len(), "copy_from_device source")?;
        // SAFETY: the source range is live (kept alive by `mem`); `dst` is a valid slice.
        unsafe { std::ptr::copy(s, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller keeps `src` valid for `bytes`.
        let data = unsafe { std::slice::from_raw_parts(src, bytes) };
        self.copy_to_device(dst, data, stream)
    }
}

impl Streams for HostBackend {
    fn create_stream(&self, device: usize) -> Result<Stream> {
        self.check_device(device, "create_stream")?;
        let id = self.new_handle();
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        Ok(Stream(id))
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream.is_default() {
            return Err(Error::invalid_argument("destroy_stream: the default stream cannot be destroyed"));
        }
        if self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.0) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("destroy_stream: stream {:#x} is not a live stream", stream.0)))
        }
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        self.check_stream(stream, "synchronize")
    }

    fn query(&self, stream: Stream) -> Result<bool> {
        self.check_stream(stream, "query").map(|()| true)
    }

    fn create_event(&self, device: usize) -> Result<Event> {
        self.check_device(device, "create_event")?;
        let id = self.new_handle();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        Ok(Event(id))
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        self.check_event(event, "record_event")?;
        self.check_stream(stream, "record_event")
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        self.check_event(event, "stream_wait_event")?;
        self.check_stream(stream, "stream_wait_event")
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        self.check_event(event, "query_event").map(|()| true)
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        self.check_event(event, "synchronize_event")
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        if self.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event.0) {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!("destroy_event: event {:#x} is not a live event", event.0)))
        }
    }

    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        f()
    }

    fn is_capturing(&self, _stream: Stream) -> Result<bool> {
        Ok(false)
    }
}

impl Sharing for HostBackend {
    fn alloc_shareable(&self, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)> {
        self.check_device(device, "alloc_shareable")?;
        let (region, name) = SharedRegion::create(&self.shm_dir, bytes)?;
        let handle = ShareHandle::new(BackendKind::Host, bytes as u64, name.as_bytes())?;
        let ptr = self.write_memory().insert(Allocation::shared(region, Kind::Exported, Some(device)))?;
        Ok((ptr, handle))
    }

    fn import(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        self.import_region(device, handle, SharedRegion::open)
    }

    fn import_last(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        self.import_region(device, handle, SharedRegion::open_last)
    }

    fn close_import(&self, ptr: DevicePtr) -> Result<()> {
        self.write_memory().remove(ptr, "close_import", &[Kind::Imported])?;
        Ok(())
    }

}

impl HostAccess for HostBackend {
    fn host_address(&self, ptr: DevicePtr, bytes: usize) -> Result<usize> {
        Ok(memory::resolve_locked(&self.memory, ptr, bytes, "buffer")? as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode::InvalidArgument;

    const S: Stream = Stream::DEFAULT;

    fn backend() -> HostBackend {
        HostBackend::with_devices(4)
    }

    fn upload<T: Copy>(b: &HostBackend, values: &[T], to_bytes: impl Fn(T) -> Vec<u8>) -> DevicePtr {
        let bytes: Vec<u8> = values.iter().flat_map(|v| to_bytes(*v)).collect();
        let p = b.alloc(0, bytes.len()).unwrap();
        b.copy_to_device(p, &bytes, S).unwrap();
        p
    }

    fn download(b: &HostBackend, p: DevicePtr, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        b.copy_from_device(&mut out, p, S).unwrap();
        out
    }

    #[test]
    fn identity_and_devices() {
        let b = backend();
        assert_eq!(b.kind(), BackendKind::Host);
        assert_eq!(b.device_count().unwrap(), 4);
        assert_eq!(b.device_name(3).unwrap(), "host device 3");
        let e = b.alloc(4, 16).unwrap_err();
        assert_eq!(e.code, InvalidArgument);
        assert!(e.message.contains("device 4"), "{}", e.message);
    }

    #[test]
    fn alloc_copy_round_trip() {
        let b = backend();
        let a = b.alloc(1, 1000).unwrap();
        let c = b.alloc(2, 1000).unwrap();
        assert_eq!(a.0 % 256, 0);
        assert_eq!(download(&b, a, 1000), vec![0u8; 1000], "zero-initialised");
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        b.copy_to_device(a, &data, S).unwrap();
        b.copy(c, a, 1000, S).unwrap();
        assert_eq!(download(&b, c, 1000), data);
        // Offsets inside an allocation work.
        b.copy(c.offset(10), a.offset(500), 20, S).unwrap();
        assert_eq!(download(&b, c.offset(10), 20), data[500..520]);
        b.memset(c, 0xEE, 5, S).unwrap();
        assert_eq!(download(&b, c, 6), [0xEE, 0xEE, 0xEE, 0xEE, 0xEE, data[5]]);
        b.free(a).unwrap();
        b.free(c).unwrap();
    }

    #[test]
    fn free_of_unknown_pointer_and_double_free_are_errors() {
        let b = backend();
        let e = b.free(DevicePtr(0xdead_0000)).unwrap_err();
        assert_eq!(e.code, InvalidArgument);
        assert!(e.message.contains("0xdead0000"), "{}", e.message);
        let p = b.alloc(0, 64).unwrap();
        b.free(p).unwrap();
        let e = b.free(p).unwrap_err();
        assert_eq!(e.code, InvalidArgument);
        assert!(e.message.contains("already freed"), "{}", e.message);
        assert_eq!(b.free(DevicePtr::NULL).unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn out_of_range_copies_are_errors() {
        let b = backend();
        let p = b.alloc(0, 100).unwrap();
        let q = b.alloc(0, 100).unwrap();
        let e = b.copy(q, p, 101, S).unwrap_err();
        assert_eq!(e.code, InvalidArgument);
        assert!(e.message.contains(&format!("{q}")) && e.message.contains("101 bytes"), "{}", e.message);
        assert_eq!(b.copy(q.offset(90), p, 20, S).unwrap_err().code, InvalidArgument);
        assert_eq!(b.copy_to_device(p.offset(1), &[1u8; 100], S).unwrap_err().code, InvalidArgument);
        assert_eq!(b.copy_from_device(&mut [0u8; 4], DevicePtr(16), S).unwrap_err().code, InvalidArgument);
        assert_eq!(b.memset(p.offset(100), 0, 1, S).unwrap_err().code, InvalidArgument);
        // Freed memory is out of range too; zero bytes are always fine.
        b.free(p).unwrap();
        assert_eq!(b.copy(q, p, 1, S).unwrap_err().code, InvalidArgument);
        b.copy(q, p, 0, S).unwrap();
        assert_eq!(download(&b, q, 100), vec![0u8; 100]);
    }

    /// `memset` and `copy` check the stream and every byte of their ranges before they write
    /// anything.
    #[test]
    fn memset_and_copy_write_nothing_when_refused() {
        let b = backend();
        let p = upload(&b, &(0..100u8).collect::<Vec<u8>>(), |v| vec![v]);
        let q = b.alloc(0, 100).unwrap();
        let before = download(&b, p, 100);
        // Ranges that start inside the allocation and run past its end.
        let e = b.memset(p.offset(90), 0xFF, 11, S).unwrap_err();
        assert_eq!(e.code, InvalidArgument);
        assert!(e.message.contains("fill destination") && e.message.contains("11 bytes"), "{}", e.message);
        let e = b.copy(p.offset(50), q, 51, S).unwrap_err();
        assert!(e.message.contains("copy destination"), "{}", e.message);
        let e = b.copy(q, p.offset(50), 51, S).unwrap_err();
        assert!(e.message.contains("copy source"), "{}", e.message);
        assert_eq!(download(&b, p, 100), before);
        assert_eq!(download(&b, q, 100), vec![0u8; 100]);
        // A stream that is no longer live.
        let s = b.create_stream(0).unwrap();
        b.destroy_stream(s).unwrap();
        assert_eq!(b.copy(q, p, 100, s).unwrap_err().code, InvalidArgument);
        assert_eq!(b.memset(p, 0xFF, 100, s).unwrap_err().code, InvalidArgument);
        assert_eq!(download(&b, p, 100), before);
        assert_eq!(download(&b, q, 100), vec![0u8; 100]);
        // Zero bytes and a copy onto itself change nothing.
        b.memset(p, 0xFF, 0, S).unwrap();
        b.copy(p, p, 100, S).unwrap();
        assert_eq!(download(&b, p, 100), before);
        // A fill of a whole allocation, across devices' memory in one process.
        let r = b.alloc(3, 4096).unwrap();
        b.memset(r, 0x5C, 4096, S).unwrap();
        b.copy(q, r.offset(4000), 96, S).unwrap();
        assert_eq!(download(&b, q, 100), [vec![0x5Cu8; 96], vec![0u8; 4]].concat());
    }

    #[test]
    fn shareable_memory_is_shared_through_the_handle_bytes() {
        let b = backend();
        let (exp, handle) = b.alloc_shareable(1, 8192).unwrap();
        assert_eq!(handle.bytes(), 8192);
        let wire = handle.to_bytes();
        let path = PathBuf::from(SHM_DIR).join(std::str::from_utf8(handle.payload()).unwrap());
        assert!(path.exists());

        let imp = b.import(2, &ShareHandle::from_bytes(&wire).unwrap()).unwrap();
        assert_ne!(exp, imp);
        b.copy_to_device(exp.offset(4000), b"written by the exporter", S).unwrap();
        assert_eq!(download(&b, imp.offset(4000), 23), b"written by the exporter");
        b.copy_to_device(imp, b"and by the importer", S).unwrap();
        assert_eq!(download(&b, exp, 19), b"and by the importer");
        // A copy can use both mappings.
        b.copy(exp.offset(100), imp, 19, S).unwrap();
        assert_eq!(download(&b, imp.offset(100), 19), b"and by the importer");

        // The wrong release calls say which one is right.
        assert!(b.free(imp).unwrap_err().message.contains("close_import"));
        assert!(b.close_import(exp).unwrap_err().message.contains("free"));
        // Freeing the export unlinks the file; the import keeps working.
        b.free(exp).unwrap();
        assert!(!path.exists());
        assert_eq!(download(&b, imp, 19), b"and by the importer");
        assert_eq!(b.import(0, &handle).unwrap_err().code, InvalidArgument);
        b.close_import(imp).unwrap();
        assert_eq!(b.close_import(imp).unwrap_err().code, InvalidArgument);
        assert_eq!(b.alloc_shareable(0, 0).unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn garbage_handles_are_rejected() {
        let b = backend();
        let garbage: Vec<u8> = (0..ShareHandle::SIZE).map(|i| (i * 131 + 7) as u8).collect();
        assert_eq!(ShareHandle::from_bytes(&garbage).unwrap_err().code, InvalidArgument);
        // Well-formed envelopes whose payload is not an importable file.
        for name in ["../../etc/passwd", "rustccl-", "rustccl-0-0-doesnotexist"] {
            let h = ShareHandle::new(BackendKind::Host, 64, name.as_bytes()).unwrap();
            let e = b.import(0, &h).unwrap_err();
            assert_eq!(e.code, InvalidArgument, "{name}: {}", e.message);
        }
        let h = ShareHandle::new(BackendKind::Host, 64, &[0xff, 0xfe]).unwrap();
        assert_eq!(b.import(0, &h).unwrap_err().code, InvalidArgument);
        let h = ShareHandle::new(BackendKind::Cuda, 64, &[0u8; 64]).unwrap();
        let e = b.import(0, &h).unwrap_err();
        assert!(e.message.contains("cuda backend"), "{}", e.message);
    }

    #[test]
    fn host_mapped_memory_is_visible_both_ways() {
        let b = backend();
        let m = b.alloc_host_mapped(256).unwrap();
        assert_eq!(m.host as u64, m.device.0);
        // SAFETY: `m.host` points to 256 live bytes nothing else is using.
        unsafe { m.host.add(10).write_bytes(0x5A, 4) };
        assert_eq!(download(&b, m.device.offset(9), 6), [0, 0x5A, 0x5A, 0x5A, 0x5A, 0]);
        b.memset(m.device, 7, 1, S).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { m.host.read() }, 7);
        assert!(b.free(m.device).unwrap_err().message.contains("free_host_mapped"));
        let dev = m.device;
        b.free_host_mapped(m).unwrap();
        assert_eq!(b.copy_from_device(&mut [0u8; 1], dev, S).unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn registered_host_memory_can_be_filled() {
        let b = backend();
        let mut user = vec![1u8; 32];
        // SAFETY: `user` outlives the registration (unregistered below).
        let p = unsafe { b.register_host(user.as_mut_ptr(), 32) }.unwrap();
        b.memset(p.offset(8), 3, 8, S).unwrap();
        b.unregister_host(p).unwrap();
        assert_eq!(user[7..17], [1, 3, 3, 3, 3, 3, 3, 3, 3, 1]);
        assert_eq!(b.unregister_host(p).unwrap_err().code, InvalidArgument);
        // SAFETY: a null pointer is refused before anything is registered.
        assert_eq!(unsafe { b.register_host(std::ptr::null_mut(), 8) }.unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn streams_and_events() {
        let b = backend();
        let s = b.create_stream(0).unwrap();
        assert!(!s.is_default());
        assert!(b.query(s).unwrap());
        assert!(b.query(Stream::DEFAULT).unwrap());
        b.synchronize(s).unwrap();
        let e = b.create_event(0).unwrap();
        assert!(b.query_event(e).unwrap());
        b.record_event(e, s).unwrap();
        b.stream_wait_event(Stream::DEFAULT, e).unwrap();
        assert!(b.query_event(e).unwrap());
        b.synchronize_event(e).unwrap();
        b.destroy_event(e).unwrap();
        assert_eq!(b.destroy_event(e).unwrap_err().code, InvalidArgument);
        assert_eq!(b.record_event(e, s).unwrap_err().code, InvalidArgument);
        b.destroy_stream(s).unwrap();
        assert_eq!(b.destroy_stream(s).unwrap_err().code, InvalidArgument);
        assert_eq!(b.synchronize(s).unwrap_err().code, InvalidArgument);
        assert_eq!(b.destroy_stream(Stream::DEFAULT).unwrap_err().code, InvalidArgument);
        let p = b.alloc(0, 4).unwrap();
        assert_eq!(b.memset(p, 1, 4, s).unwrap_err().code, InvalidArgument);
        assert_eq!(b.create_stream(9).unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn ranks_on_threads_share_one_backend() {
        let b = Arc::new(backend());
        let sum = b.alloc(0, 4 * 1024).unwrap();
        let handles: Vec<_> = (0..4u32)
            .map(|rank| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mine = b.alloc(rank as usize, 1024).unwrap();
                    b.memset(mine, rank as u8 + 1, 1024, S).unwrap();
                    b.copy(sum.offset(1024 * rank as usize), mine, 1024, S).unwrap();
                    b.free(mine).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let got = download(&b, sum, 4096);
        for rank in 0..4 {
            assert!(got[rank * 1024..(rank + 1) * 1024].iter().all(|&v| v == rank as u8 + 1));
        }
    }
}

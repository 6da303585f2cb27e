//! Memory of the CUDA backend: the driver's calls under the bookkeeping every GPU backend
//! shares (`backend::gpu_memory`: what is allocated, exported, imported, mapped or registered,
//! tracked by start address), and the check of memory it does not track
//! (`cuPointerGetAttributes`).

use std::ffi::c_void;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::sys;

use super::driver::{self, check, Ctx, CtxGuard};
use super::CudaBackend;
use crate::backend::gpu_memory::{self, MemoryCalls, PointerRange, Table};
use crate::backend::{BackendKind, DevicePtr};
use crate::error::Result;

pub use crate::backend::gpu_memory::IPC_HANDLE_BYTES;

impl CudaBackend {
    pub(super) fn read_memory(&self) -> RwLockReadGuard<'_, Table> {
        gpu_memory::read(self)
    }

    pub(super) fn write_memory(&self) -> RwLockWriteGuard<'_, Table> {
        gpu_memory::write(self)
    }

    /// The device owning tracked memory at `ptr`, if tracked and device memory.
    pub(super) fn tracked_device(&self, ptr: DevicePtr) -> Option<usize> {
        gpu_memory::tracked_device(self, ptr)
    }

    /// Checks that `ptr..ptr+bytes` is memory the backend or the driver knows; returns the
    /// device that owns it (None for host memory).
    pub(super) fn check_range(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<Option<usize>> {
        gpu_memory::check_range(self, ptr, bytes, what)
    }
}

impl MemoryCalls for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn vendor(&self) -> &'static str {
        "CUDA"
    }

    fn table(&self) -> &RwLock<Table> {
        &self.memory
    }

    fn check_device(&self, device: usize, op: &str) -> Result<()> {
        self.device(device, op).map(|_| ())
    }

    fn host_device(&self) -> Result<usize> {
        match driver::current()? {
            c if c.is_null() => Ok(0),
            c => self.ctx_device(Ctx(c)),
        }
    }

    fn device_alloc(&self, device: usize, bytes: usize) -> Result<u64> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes on device {device})"))?;
        Ok(p)
    }

    fn device_free(&self, device: usize, ptr: u64) -> Result<()> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live allocation of ours, which the bookkeeping forgets after this call.
        check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree")
    }

    fn host_alloc_mapped(&self, device: usize, bytes: usize) -> Result<(usize, u64)> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: writes one pointer.
        check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }, &format!("cuMemHostAlloc({bytes} bytes)"))?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is mapped memory we just allocated.
        if let Err(e) = check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }, "cuMemHostGetDevicePointer") {
            // SAFETY: ours, not handed out.
            unsafe { sys::cuMemFreeHost(host) };
            return Err(e);
        }
        Ok((host as usize, dev))
    }

    fn host_free(&self, host: usize) -> Result<()> {
        // SAFETY: memory cuMemHostAlloc gave us, which the bookkeeping forgets after this call.
        check(unsafe { sys::cuMemFreeHost(host as *mut c_void) }, "cuMemFreeHost")
    }

    unsafe fn host_register(&self, device: usize, host: usize, bytes: usize) -> Result<u64> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller promises the range stays valid until it is unregistered.
        check(unsafe { sys::cuMemHostRegister_v2(host as *mut c_void, bytes, flags) }, &format!("cuMemHostRegister({bytes} bytes)"))?;
        self.host_device_pointer(host).inspect_err(|_| {
            // SAFETY: registered just above.
            unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
        })
    }

    fn host_device_pointer(&self, host: usize) -> Result<u64> {
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: the range is registered with DEVICEMAP (PORTABLE: every context).
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) }, "cuMemHostGetDevicePointer")?;
        Ok(dev)
    }

    fn host_unregister(&self, host: usize) -> Result<()> {
        // SAFETY: registered by register_host, which the bookkeeping forgets after this call.
        check(unsafe { sys::cuMemHostUnregister(host as *mut c_void) }, "cuMemHostUnregister")
    }

    fn ipc_export(&self, device: usize, ptr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // Synchronous memory operations on shared memory are ordered across processes.
        let one: u32 = 1;
        // SAFETY: reads one unsigned int; `ptr` is our allocation.
        check(
            unsafe {
                sys::cuPointerSetAttribute(&one as *const u32 as *const c_void, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr)
            },
            "cuPointerSetAttribute(SYNC_MEMOPS)",
        )?;
        let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: writes the 64-byte handle.
        check(unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), ptr) }, "cuIpcGetMemHandle")?;
        // SAFETY: written above.
        let h = unsafe { h.assume_init() };
        let mut raw = [0u8; IPC_HANDLE_BYTES];
        for (b, c) in raw.iter_mut().zip(h.reserved.iter()) {
            *b = *c as u8;
        }
        Ok(raw)
    }

    fn ipc_open(&self, device: usize, raw: &[u8; IPC_HANDLE_BYTES]) -> Result<u64> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut h = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        for (c, b) in h.reserved.iter_mut().zip(raw.iter()) {
            *c = *b as std::ffi::c_char;
        }
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; a bad handle is reported by the driver.
        check(
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32) },
            "cuIpcOpenMemHandle",
        )?;
        Ok(p)
    }

    fn ipc_close(&self, device: usize, ptr: u64) -> Result<()> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: an address cuIpcOpenMemHandle gave us, which the bookkeeping forgets after.
        check(unsafe { sys::cuIpcCloseMemHandle(ptr) }, "cuIpcCloseMemHandle")
    }

    fn free_vmm(&self, ptr: DevicePtr) -> Result<()> {
        super::symmetric::free(self, ptr)
    }

    fn pointer_range(&self, ptr: u64) -> std::result::Result<PointerRange, String> {
        let mut start: u64 = 0;
        let mut size: usize = 0;
        let mut mem_type: u32 = 0;
        let mut ordinal: i32 = -1;
        use sys::CUpointer_attribute::*;
        let mut attrs =
            [CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL];
        let mut data: [*mut c_void; 4] = [
            &mut start as *mut u64 as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            &mut mem_type as *mut u32 as *mut c_void,
            &mut ordinal as *mut i32 as *mut c_void,
        ];
        // SAFETY: each data pointer has the size of its attribute (CUdeviceptr, size_t,
        // CUmemorytype, int).
        let r = unsafe { sys::cuPointerGetAttributes(4, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!(" ({})", driver::error_text(r).0));
        }
        if start == 0 || size == 0 {
            return Err(String::new());
        }
        let device_mem = mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        Ok(PointerRange { start, bytes: size, device: (device_mem && ordinal >= 0).then_some(ordinal as usize) })
    }
}

crate::backend::gpu_memory::impl_sharing!(CudaBackend);

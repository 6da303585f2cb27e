//! Memory of the HIP backend: the runtime's calls under the bookkeeping every GPU backend
//! shares (`backend::gpu_memory`). Device memory is fine-grained and host memory coherent
//! (see the module docs of `backend::hip`); IPC handles are `hipIpcMemHandle_t`s.

use std::ffi::c_void;
use std::sync::RwLock;

use super::runtime::{Handle, IpcMemHandle};
use super::HipBackend;
use crate::backend::gpu_memory::{MemoryCalls, PointerRange, Table, IPC_HANDLE_BYTES};
use crate::backend::BackendKind;
use crate::error::Result;

/// `hipDeviceMallocFinegrained`.
const DEVICE_MALLOC_FINEGRAINED: u32 = 0x1;
/// `hipHostMallocPortable | hipHostMallocMapped | hipHostMallocCoherent`.
const HOST_MALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4000_0000;
/// `hipHostRegisterPortable | hipHostRegisterMapped`.
const HOST_REGISTER_FLAGS: u32 = 0x1 | 0x2;

impl MemoryCalls for HipBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hip
    }

    fn vendor(&self) -> &'static str {
        "HIP"
    }

    fn table(&self) -> &RwLock<Table> {
        &self.memory
    }

    fn check_device(&self, device: usize, op: &str) -> Result<()> {
        self.device(device, op).map(|_| ())
    }

    fn host_device(&self) -> Result<usize> {
        self.current()
    }

    fn device_alloc(&self, device: usize, bytes: usize) -> Result<u64> {
        let _g = self.enter(device)?;
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: writes one address.
        let r = unsafe { (self.rt.calls.malloc_with_flags)(&mut p, bytes, DEVICE_MALLOC_FINEGRAINED) };
        self.rt.check(r, &format!("hipExtMallocWithFlags({bytes} bytes, fine-grained, on device {device})"))?;
        Ok(p as u64)
    }

    fn device_free(&self, device: usize, ptr: u64) -> Result<()> {
        let _g = self.enter(device)?;
        // SAFETY: a live allocation of ours, which the bookkeeping forgets after this call.
        self.rt.check(unsafe { (self.rt.calls.free)(ptr as Handle) }, "hipFree")
    }

    fn host_alloc_mapped(&self, device: usize, bytes: usize) -> Result<(usize, u64)> {
        let _g = self.enter(device)?;
        let mut host: Handle = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        self.rt.check(unsafe { (self.rt.calls.host_malloc)(&mut host, bytes, HOST_MALLOC_FLAGS) }, &format!("hipHostMalloc({bytes} bytes)"))?;
        match self.host_device_pointer(host as usize) {
            Ok(dev) => Ok((host as usize, dev)),
            Err(e) => {
                // SAFETY: ours, not handed out.
                unsafe { (self.rt.calls.host_free)(host) };
                Err(e)
            }
        }
    }

    fn host_free(&self, host: usize) -> Result<()> {
        // SAFETY: memory hipHostMalloc gave us, which the bookkeeping forgets after this call.
        self.rt.check(unsafe { (self.rt.calls.host_free)(host as Handle) }, "hipHostFree")
    }

    unsafe fn host_register(&self, device: usize, host: usize, bytes: usize) -> Result<u64> {
        let _g = self.enter(device)?;
        // SAFETY: the caller promises the range stays valid until it is unregistered.
        let r = unsafe { (self.rt.calls.host_register)(host as Handle, bytes, HOST_REGISTER_FLAGS) };
        self.rt.check(r, &format!("hipHostRegister({bytes} bytes)"))?;
        self.host_device_pointer(host).inspect_err(|_| {
            // SAFETY: registered just above.
            unsafe { (self.rt.calls.host_unregister)(host as Handle) };
        })
    }

    fn host_device_pointer(&self, host: usize) -> Result<u64> {
        let mut dev: Handle = std::ptr::null_mut();
        // SAFETY: the memory is mapped (allocated or registered with the mapped flag).
        self.rt.check(unsafe { (self.rt.calls.host_get_device_pointer)(&mut dev, host as Handle, 0) }, "hipHostGetDevicePointer")?;
        Ok(dev as u64)
    }

    fn host_unregister(&self, host: usize) -> Result<()> {
        // SAFETY: registered by register_host, which the bookkeeping forgets after this call.
        self.rt.check(unsafe { (self.rt.calls.host_unregister)(host as Handle) }, "hipHostUnregister")
    }

    fn ipc_export(&self, device: usize, ptr: u64) -> Result<[u8; IPC_HANDLE_BYTES]> {
        let _g = self.enter(device)?;
        let mut h = IpcMemHandle([0; IPC_HANDLE_BYTES]);
        // SAFETY: writes the 64-byte handle of our allocation.
        self.rt.check(unsafe { (self.rt.calls.ipc_get_mem_handle)(&mut h, ptr as Handle) }, "hipIpcGetMemHandle")?;
        Ok(h.0)
    }

    fn ipc_open(&self, device: usize, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64> {
        let _g = self.enter(device)?;
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: writes one address; a bad handle is reported by the runtime. Flags 0:
        // hipIpcMemLazyEnablePeerAccess.
        self.rt.check(unsafe { (self.rt.calls.ipc_open_mem_handle)(&mut p, IpcMemHandle(*handle), 0) }, "hipIpcOpenMemHandle")?;
        Ok(p as u64)
    }

    fn ipc_close(&self, device: usize, ptr: u64) -> Result<()> {
        let _g = self.enter(device)?;
        // SAFETY: an address hipIpcOpenMemHandle gave us, which the bookkeeping forgets after.
        self.rt.check(unsafe { (self.rt.calls.ipc_close_mem_handle)(ptr as Handle) }, "hipIpcCloseMemHandle")
    }

    fn pointer_range(&self, ptr: u64) -> std::result::Result<PointerRange, String> {
        // hipPointerAttribute_t: the memory type (an enum) and the device (an int) first, in
        // ROCm 5 and 6 alike; the type's values moved in ROCm 6 (to CUDA's).
        let mut attrs = [0u64; 8];
        // SAFETY: the buffer (64 bytes) is larger than the struct (32 bytes).
        let r = unsafe { (self.rt.calls.pointer_get_attributes)(attrs.as_mut_ptr().cast(), ptr as *const c_void) };
        if r != super::runtime::HIP_SUCCESS {
            return Err(format!(" ({})", self.rt.error_text(r).0));
        }
        let (mem_type, device) = (attrs[0] as u32, (attrs[0] >> 32) as u32 as i32);
        let device_type = if self.rt.major() >= 6 { 2 } else { 1 };
        let (mut base, mut size): (Handle, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: writes one address and one size.
        let r = unsafe { (self.rt.calls.mem_get_address_range)(&mut base, &mut size, ptr as Handle) };
        if r != super::runtime::HIP_SUCCESS {
            return Err(format!(" (hipMemGetAddressRange: {})", self.rt.error_text(r).0));
        }
        if base.is_null() || size == 0 {
            return Err(String::new());
        }
        let device = (mem_type == device_type && device >= 0).then_some(device as usize);
        Ok(PointerRange { start: base as u64, bytes: size, device })
    }
}

crate::backend::gpu_memory::impl_sharing!(HipBackend);

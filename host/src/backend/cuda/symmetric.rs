//! [`WindowMemory`] and [`BufferSharing`] of the CUDA backend. Symmetric memory (windows,
//! `crate::window`) is the driver's virtual memory
//! management. `ncclMemAlloc` memory is a cuMem allocation (`cuMemCreate`, pinned device
//! memory, exportable as a POSIX file descriptor, at the recommended granularity, as NCCL's),
//! mapped at a range of its own; it is exported (one descriptor) the first time a window is
//! made of it. Its share handle carries a ticket of `backend::fdpass`: a
//! process that maps it fetches the descriptor from the owner over a Unix socket, imports it
//! (`cuMemImportFromShareableHandle`) and maps it at a fixed address of a reserved range
//! (`cuMemAddressReserve`), so every rank of a communicator sees every rank's window at the
//! same offset of one flat range. A mapping keeps the memory alive: a peer that dies leaves
//! its memory readable until the survivors unmap it.

use std::ffi::c_void;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use cudarc::driver::sys;

use super::driver::{check, CtxGuard};
use crate::backend::gpu_memory::{Entry, Kind};
use super::CudaBackend;
use crate::backend::fdpass::{self, Ticket};
use crate::backend::{BackendKind, BufferSharing, DevicePtr, ShareHandle, SymmetricMemory, WindowMemory};
use crate::error::{Error, Result};

pub const TICKET_BYTES: usize = Ticket::SIZE;
/// What starts the payload of a cuMem share handle (IPC handles have none).
const MAGIC: &[u8; 4] = b"VMM1";

fn prop(b: &CudaBackend, device: usize) -> Result<sys::CUmemAllocationProp> {
    let handle = b.device_handle(device)?;
    // SAFETY: a plain C struct; all-zero is its documented default.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = handle;
    Ok(p)
}

/// The allocation granularity NCCL uses (the recommended one: 2 MiB on Hopper).
fn granularity(p: &sys::CUmemAllocationProp) -> Result<usize> {
    let mut g: usize = 0;
    // SAFETY: writes one size_t; `p` is a valid property struct.
    check(
        unsafe {
            sys::cuMemGetAllocationGranularity(&mut g, p, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(g.max(4096))
}

/// Read-write access for `device` and every device that can reach it as a peer.
fn set_access(b: &CudaBackend, device: usize, at: u64, bytes: usize) -> Result<()> {
    let mut descs = Vec::new();
    for d in 0..b.devices_len() {
        if d == device || b.can_access_peer(d, device) {
            // SAFETY: a plain C struct, filled below.
            let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            desc.location.id = b.device_handle(d)?;
            desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            descs.push(desc);
        }
    }
    // SAFETY: `at..at+bytes` is mapped; `descs` outlives the call.
    check(unsafe { sys::cuMemSetAccess(at, bytes, descs.as_ptr(), descs.len()) }, "cuMemSetAccess")
}

/// Exports allocation `h` as a file descriptor and offers it to the host's processes.
fn export(h: sys::CUmemGenericAllocationHandle) -> Result<Ticket> {
    let mut fd: i32 = -1;
    // SAFETY: POSIX file descriptor handles are written as one int.
    check(
        unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut i32 as *mut c_void,
                h,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle(POSIX file descriptor)",
    )?;
    // SAFETY: the driver just opened this descriptor for us.
    fdpass::offer(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn free(b: &CudaBackend, ptr: DevicePtr) -> Result<()> {
    let mut mem = b.write_memory();
    let Some(Entry { bytes, device, kind: Kind::Vmm { handle, ticket } }) = mem.entries.get(&ptr.0) else {
        return Err(Error::invalid_argument(format!("free: {ptr} is not symmetric memory of the CUDA backend")));
    };
    let (size, h, ticket) = (*bytes, *handle, *ticket);
    let _g = CtxGuard::enter(b.primary(device.unwrap_or(0))?)?;
    // SAFETY: our allocation's own mapping and reservation, removed from the table below;
    // mappings in other ranges (windows) keep the memory until they are unmapped.
    unsafe {
        check(sys::cuMemUnmap(ptr.0, size), "cuMemUnmap")?;
        check(sys::cuMemAddressFree(ptr.0, size), "cuMemAddressFree")?;
        check(sys::cuMemRelease(h), "cuMemRelease")?;
    }
    if let Some(t) = ticket.and_then(|t| Ticket::from_bytes(&t).ok()) {
        fdpass::withdraw(&t);
    }
    mem.entries.remove(&ptr.0);
    Ok(())
}

/// The ticket in a cuMem share handle.
fn ticket_of(handle: &ShareHandle) -> Result<Ticket> {
    if handle.kind() != BackendKind::Cuda {
        return Err(Error::invalid_argument(format!(
            "map_shared_at: the share handle was made by the {} backend; the cuda backend maps only its own",
            handle.kind()
        )));
    }
    let p = handle.payload();
    if p.len() != MAGIC.len() + TICKET_BYTES || &p[..4] != MAGIC {
        return Err(Error::invalid_argument(
            "map_shared_at: the share handle is not of ncclMemAlloc memory (a window must lie in memory from ncclMemAlloc)",
        ));
    }
    Ticket::from_bytes(&p[4..])
}

// ---- Registered buffers (ncclCommRegister): exported to a peer that writes into them ----

impl WindowMemory for CudaBackend {
    fn alloc_symmetric(&self, device: usize, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("alloc_symmetric: zero bytes"));
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let p = prop(self, device)?;
        let g = granularity(&p)?;
        let size = bytes.div_ceil(g) * g;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; `p` is valid.
        check(
            unsafe { sys::cuMemCreate(&mut h, size, &p, 0) },
            &format!("cuMemCreate({size} bytes on device {device}, POSIX file descriptor handles)"),
        )?;
        let mut at: sys::CUdeviceptr = 0;
        let undo = |at: u64, mapped: bool| {
            // SAFETY: undoes what was done above, in reverse order, on our own handle and range.
            unsafe {
                if mapped {
                    sys::cuMemUnmap(at, size);
                }
                if at != 0 {
                    sys::cuMemAddressFree(at, size);
                }
                sys::cuMemRelease(h);
            }
        };
        // SAFETY: writes one address.
        if let Err(e) = check(unsafe { sys::cuMemAddressReserve(&mut at, size, g, 0, 0) }, "cuMemAddressReserve") {
            undo(0, false);
            return Err(e);
        }
        // SAFETY: `at` is a fresh reservation of `size` bytes; `h` an allocation of as many.
        if let Err(e) = check(unsafe { sys::cuMemMap(at, size, 0, h, 0) }, "cuMemMap") {
            undo(at, false);
            return Err(e);
        }
        if let Err(e) = set_access(self, device, at, size) {
            undo(at, true);
            return Err(e);
        }
        self.write_memory().entries.insert(at, Entry { bytes: size, device: Some(device), kind: Kind::Vmm { handle: h, ticket: None } });
        Ok(DevicePtr(at))
    }

    fn symmetric_memory(&self, ptr: DevicePtr) -> Result<SymmetricMemory> {
        let mut mem = self.write_memory();
        let not = || {
            Error::invalid_argument(format!(
                "{ptr} is not memory from ncclMemAlloc: a window must lie in memory from ncclMemAlloc (cuMem memory peers can map)"
            ))
        };
        let (&base, e) = mem.entries.range_mut(..=ptr.0).next_back().ok_or_else(not)?;
        if ptr.0 >= base + e.bytes as u64 {
            return Err(not());
        }
        let bytes = e.bytes;
        let Kind::Vmm { handle, ticket } = &mut e.kind else { return Err(not()) };
        // Offered from the first window made of it on (withdrawn when it is freed).
        let ticket = match ticket {
            Some(t) => *t,
            None => *ticket.insert(export(*handle)?.to_bytes()),
        };
        let mut payload = MAGIC.to_vec();
        payload.extend_from_slice(&ticket);
        let handle = ShareHandle::new(BackendKind::Cuda, bytes as u64, &payload)?;
        Ok(SymmetricMemory { base: DevicePtr(base), bytes, handle })
    }

    fn reserve_space(&self, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot reserve 0 bytes of address space"));
        }
        let _g = CtxGuard::enter(self.primary(0)?)?;
        let g = granularity(&prop(self, 0)?)?;
        let mut at: sys::CUdeviceptr = 0;
        // SAFETY: writes one address.
        check(unsafe { sys::cuMemAddressReserve(&mut at, bytes, g, 0, 0) }, &format!("cuMemAddressReserve({bytes} bytes)")).map_err(|e| {
            e.context("reserving address space for symmetric windows (set NCCL_WIN_STRIDE lower to reserve less)")
        })?;
        self.spaces().insert(at, bytes);
        Ok(DevicePtr(at))
    }

    fn release_space(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        let mut spaces = self.spaces();
        if spaces.get(&base.0) != Some(&bytes) {
            return Err(Error::invalid_argument(format!("release_space({base}, {bytes}): no such reserved space")));
        }
        if let Some((at, _)) = self.read_memory().entries.range(base.0..base.0 + bytes as u64).next() {
            return Err(Error::invalid_usage(format!("release_space({base}): a window mapping at {at:#x} is still in it; unmap it first")));
        }
        // SAFETY: a range we reserved that holds no mapping any more.
        check(unsafe { sys::cuMemAddressFree(base.0, bytes) }, "cuMemAddressFree")?;
        spaces.remove(&base.0);
        Ok(())
    }

    fn map_shared_at(&self, device: usize, handle: &ShareHandle, at: DevicePtr) -> Result<()> {
        let ticket = ticket_of(handle)?;
        let size = usize::try_from(handle.bytes()).map_err(|_| Error::invalid_argument("map_shared_at: size too large"))?;
        let inside = self.spaces().range(..=at.0).next_back().is_some_and(|(&base, &len)| at.0 + size as u64 <= base + len as u64);
        if !inside {
            return Err(Error::invalid_argument(format!("map_shared_at({at}, {size} bytes): not inside a reserved space")));
        }
        if let Some((other, _)) = self.read_memory().entries.range(at.0..at.0 + size as u64).next() {
            return Err(Error::invalid_usage(format!("map_shared_at({at}): the range is already mapped (at {other:#x})")));
        }
        let fd = fdpass::fetch(&ticket).map_err(|e| e.context("fetching a peer's window memory"))?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        let raw = fd.into_raw_fd();
        // SAFETY: POSIX file descriptor handles are passed as the descriptor's value; the driver
        // does not take the descriptor over (closed below).
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                raw as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        // SAFETY: ours since fetch; the import holds what it needs.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        check(r, "cuMemImportFromShareableHandle")?;
        // SAFETY: `at..at+size` lies in a range we reserved and holds no mapping (checked above);
        // `h` is an allocation of `size` bytes (the exporter's rounded size).
        let mapped = check(unsafe { sys::cuMemMap(at.0, size, 0, h, 0) }, "cuMemMap (window)");
        let result = mapped.and_then(|_| {
            set_access(self, device, at.0, size).inspect_err(|_| {
                // SAFETY: mapped just above.
                unsafe { sys::cuMemUnmap(at.0, size) };
            })
        });
        // SAFETY: the mapping (if any) keeps the allocation; the handle is not needed any more.
        unsafe { sys::cuMemRelease(h) };
        result?;
        self.write_memory().entries.insert(at.0, Entry { bytes: size, device: Some(device), kind: Kind::WindowMap });
        Ok(())
    }

    fn unmap_at(&self, at: DevicePtr) -> Result<()> {
        let mut mem = self.write_memory();
        let Some(Entry { bytes, device, kind: Kind::WindowMap }) = mem.entries.get(&at.0) else {
            return Err(Error::invalid_argument(format!("unmap_at({at}): no window mapping starts there")));
        };
        let (size, device) = (*bytes, device.unwrap_or(0));
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a mapping map_shared_at made, removed from the table below.
        check(unsafe { sys::cuMemUnmap(at.0, size) }, "cuMemUnmap (window)")?;
        mem.entries.remove(&at.0);
        Ok(())
    }
}

impl BufferSharing for CudaBackend {
    /// The allocation holding `bytes` at `ptr`, for a peer to map: `ncclMemAlloc` memory by its
    /// file descriptor (as windows), other device memory (`cudaMalloc`) by a CUDA IPC handle of
    /// its whole allocation.
    fn export_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<SymmetricMemory> {
        let inside = |m: &SymmetricMemory| ptr.0 >= m.base.0 && ptr.0 + bytes as u64 <= m.base.0 + m.bytes as u64;
        if let Ok(m) = self.symmetric_memory(ptr) {
            return if inside(&m) {
                Ok(m)
            } else {
                Err(Error::invalid_argument(format!("{ptr} + {bytes} bytes runs past the end of its ncclMemAlloc allocation")))
            };
        }
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: writes an address and a size; an address the driver does not know is an error.
        check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr.0) }, "cuMemGetAddressRange (registered buffer)")?;
        let mut h = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: writes the 64-byte handle of the allocation that starts at `base`.
        check(unsafe { sys::cuIpcGetMemHandle(h.as_mut_ptr(), base) }, "cuIpcGetMemHandle (registered buffer)")?;
        // SAFETY: written above.
        let h = unsafe { h.assume_init() };
        let raw: Vec<u8> = h.reserved.iter().map(|c| *c as u8).collect();
        let m = SymmetricMemory { base: DevicePtr(base), bytes: size, handle: ShareHandle::new(BackendKind::Cuda, size as u64, &raw)? };
        if !inside(&m) {
            return Err(Error::invalid_argument(format!("{ptr} + {bytes} bytes runs past the end of its allocation")));
        }
        Ok(m)
    }

    /// Maps a peer's registered allocation: `ncclMemAlloc` memory at a space of its own, other
    /// memory through CUDA IPC.
    fn import_buffer(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        if ticket_of(handle).is_err() {
            return crate::backend::gpu_memory::import(self, device, handle);
        }
        let bytes = usize::try_from(handle.bytes()).map_err(|_| Error::invalid_argument("import_buffer: size too large"))?;
        let at = self.reserve_space(bytes)?;
        if let Err(e) = self.map_shared_at(device, handle, at) {
            let _ = self.release_space(at, bytes);
            return Err(e);
        }
        Ok(at)
    }

    /// Undoes [`import_buffer`](BufferSharing::import_buffer).
    fn close_buffer(&self, at: DevicePtr) -> Result<()> {
        let mapped = match self.read_memory().entries.get(&at.0) {
            Some(Entry { bytes, kind: Kind::WindowMap, .. }) => Some(*bytes),
            _ => None,
        };
        match mapped {
            Some(bytes) => {
                self.unmap_at(at)?;
                self.release_space(at, bytes)
            }
            None => crate::backend::gpu_memory::close_import(self, at),
        }
    }
}

//! `ncclWindow_t` handles: a pointer to NCCL's `ncclWindow_vidmem` layout (what kernels and
//! nccl_device.h read: the window's address in rank 0's slot of the flat range, the ranks, the
//! slot stride in 4 GiB units), whose `winHost` points at rustccl's own window. On the host
//! backend the layout lives in an ordinary box; on a device backend in pinned host memory
//! mapped for devices at the same address (unified addressing), so a kernel can take the
//! handle as it is. Handles are checked against the live set, so a stale or foreign pointer is
//! an error, not a crash.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex};

use rustccl::backend::{DeviceBackend, HostMapped};
use rustccl::window::Window;
use rustccl::{Communicator, Error};

/// NCCL's `struct ncclWindow_vidmem` (nccl_device.h; the fields NCCL 2.28 starts with).
#[repr(C)]
struct Vidmem {
    /// The handle's [`Window`] (`winHost`).
    win_host: u64,
    /// Rank 0's window in the flat range (`lsaFlatBase`).
    lsa_flat_base: u64,
    lsa_rank: i32,
    world_rank: i32,
    stride_4g: u32,
    mc_offset_4k: u32,
}

/// Where a handle's [`Vidmem`] lives.
enum Storage {
    Boxed(Box<Vidmem>),
    /// Pinned host memory devices read at the same address, freed with its backend.
    Mapped(HostMapped, Arc<dyn DeviceBackend>),
}

/// A live handle: its layout, and the window `winHost` points at.
struct Entry {
    storage: Storage,
    window: Box<Window>,
}

/// Live handles, by address.
static LIVE: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);

/// A registration asked for inside a group: it runs when the outermost group ends (as NCCL,
/// which writes `*win` then).
struct Deferred {
    comm: Arc<crate::handles::CComm>,
    buff: u64,
    size: usize,
    flags: u32,
    /// Where the caller wants the handle (its `ncclWindow_t*`).
    out: usize,
}

thread_local! {
    static DEFERRED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// Queues a registration until the group ends.
pub fn defer(comm: Arc<crate::handles::CComm>, buff: u64, size: usize, flags: u32, out: *mut *mut c_void) {
    DEFERRED.with(|d| d.borrow_mut().push(Deferred { comm, buff, size, flags, out: out as usize }));
}

/// At the end of the outermost group: runs the queued registrations in order, each writing
/// its handle; the first failure is returned and the registrations after it are dropped (the
/// other ranks' fail too, since each is collective).
pub fn run_deferred() -> Result<(), Error> {
    let queued = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    for q in queued {
        let w = q.comm.comm.window_register(rustccl::backend::DevicePtr(q.buff), q.size, q.flags)?;
        let h = publish(&q.comm.comm, w)?;
        // SAFETY: the caller's ncclWindow_t*, checked non-null when it was queued and kept
        // valid until its group ends (NCCL's contract too).
        unsafe { *(q.out as *mut *mut c_void) = h };
    }
    Ok(())
}

/// A handle for `w` (to give the caller as `ncclWindow_t`). On failure `w` is deregistered
/// from `comm` (the caller gets no handle to do it with).
pub fn publish(comm: &Communicator, w: Window) -> Result<*mut c_void, Error> {
    let window = Box::new(w);
    let vidmem = Vidmem {
        win_host: std::ptr::addr_of!(*window) as u64,
        lsa_flat_base: window.peer_ptr(0, 0).map_or(0, |p| p.0),
        lsa_rank: window.rank() as i32,
        world_rank: window.rank() as i32,
        stride_4g: (window.stride() >> 32) as u32,
        mc_offset_4k: 0,
    };
    let storage = match place(comm.backend(), vidmem) {
        Ok(s) => s,
        Err(e) => {
            let _ = comm.window_deregister(&window);
            return Err(e);
        }
    };
    let h = match &storage {
        Storage::Boxed(b) => std::ptr::addr_of!(**b) as usize,
        Storage::Mapped(m, _) => m.host as usize,
    };
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(h, Entry { storage, window });
    Ok(h as *mut c_void)
}

/// Puts a handle's layout where the backend's kernels can read it (a box where the backend
/// has no kernels: only host code reads it there).
fn place(backend: &Arc<dyn DeviceBackend>, vidmem: Vidmem) -> Result<Storage, Error> {
    if backend.kernels().is_none() {
        return Ok(Storage::Boxed(Box::new(vidmem)));
    }
    let m = backend.alloc_host_mapped(std::mem::size_of::<Vidmem>())?;
    if m.host as u64 != m.device.0 {
        let (host, device) = (m.host, m.device);
        let _ = backend.free_host_mapped(m);
        return Err(Error::invalid_usage(format!(
            "window handles must be readable by kernels at the address the host sees, but the {} backend mapped \
             pinned host memory at {host:p} for the host and {device} for devices (no unified addressing?); \
             windows need a device with unified addressing",
            backend.kind()
        )));
    }
    // SAFETY: `m.host` is fresh pinned memory of `size_of::<Vidmem>()` bytes, page-aligned,
    // that nothing else uses yet.
    unsafe { (m.host as *mut Vidmem).write(vidmem) };
    Ok(Storage::Mapped(m, backend.clone()))
}

fn not_live(win: *mut c_void, what: &str) -> Error {
    Error::invalid_argument(format!("{what}: {win:p} is not a live window of this library (deregistered already?)"))
}

/// Runs `f` on the window behind a live handle.
pub fn with<T>(win: *mut c_void, what: &str, f: impl FnOnce(&Window) -> T) -> Result<T, Error> {
    let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    let e = live.as_ref().and_then(|l| l.get(&(win as usize))).ok_or_else(|| not_live(win, what))?;
    Ok(f(&e.window))
}

/// Retires a live handle and gives its window back (its layout's memory is freed).
pub fn take(win: *mut c_void, what: &str) -> Result<Window, Error> {
    let e = LIVE.lock().unwrap_or_else(|p| p.into_inner()).as_mut().and_then(|l| l.remove(&(win as usize)));
    let e = e.ok_or_else(|| not_live(win, what))?;
    if let Storage::Mapped(m, backend) = e.storage {
        if let Err(err) = backend.free_host_mapped(m) {
            tracing::warn!(target: "INIT", "{what}: freeing the window handle's memory: {}", err.message);
        }
    }
    Ok(*e.window)
}

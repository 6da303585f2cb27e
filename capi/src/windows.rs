//! `ncclWindow_t` handles: a pointer to NCCL's `ncclWindow_vidmem` layout (what NCCL's device
//! headers read: the window's address in rank 0's slot of the flat range, the ranks, the slot
//! stride in 4 GiB units), followed by rustccl's own window. Handles are checked against the
//! live set, so a stale or foreign pointer is an error, not a crash.

use std::cell::RefCell;
use std::collections::HashSet;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex};

use rustccl::window::Window;
use rustccl::Error;

/// NCCL's `struct ncclWindow_vidmem` (nccl_device/core__types.h, 2.28).
#[repr(C)]
struct Vidmem {
    win_host: *mut c_void,
    lsa_flat_base: *mut u8,
    lsa_rank: i32,
    world_rank: i32,
    stride_4g: u32,
    mc_offset_4k: u32,
}

#[repr(C)]
struct Handle {
    vidmem: Vidmem,
    window: Window,
}

/// Live handles, by address.
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

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
        // SAFETY: the caller's ncclWindow_t*, checked non-null when it was queued and kept
        // valid until its group ends (NCCL's contract too).
        unsafe { *(q.out as *mut *mut c_void) = publish(w) };
    }
    Ok(())
}

/// A handle for `w` (to give the caller as `ncclWindow_t`).
pub fn publish(w: Window) -> *mut c_void {
    let base = w.peer_ptr(0, 0).map_or(0, |p| p.0);
    let (rank, stride) = (w.rank(), w.stride());
    let h = Box::into_raw(Box::new(Handle {
        vidmem: Vidmem {
            win_host: std::ptr::null_mut(),
            lsa_flat_base: base as *mut u8,
            lsa_rank: rank as i32,
            world_rank: rank as i32,
            stride_4g: (stride >> 32) as u32,
            mc_offset_4k: 0,
        },
        window: w,
    }));
    // SAFETY: `h` is the box just made; `win_host` points at its own window (as NCCL's points
    // at its host-side window).
    unsafe { (*h).vidmem.win_host = std::ptr::addr_of_mut!((*h).window) as *mut c_void };
    LIVE.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashSet::new).insert(h as usize);
    h as *mut c_void
}

fn not_live(win: *mut c_void, what: &str) -> Error {
    Error::invalid_argument(format!("{what}: {win:p} is not a live window of this library (deregistered already?)"))
}

/// Runs `f` on the window behind a live handle.
pub fn with<T>(win: *mut c_void, what: &str, f: impl FnOnce(&Window) -> T) -> Result<T, Error> {
    let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    if !live.as_ref().is_some_and(|l| l.contains(&(win as usize))) {
        return Err(not_live(win, what));
    }
    // SAFETY: a live handle from `publish`, not freed while the set holds it (we hold the lock).
    Ok(f(unsafe { &(*(win as *const Handle)).window }))
}

/// Retires a live handle and gives its window back.
pub fn take(win: *mut c_void, what: &str) -> Result<Window, Error> {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    if !live.as_mut().is_some_and(|l| l.remove(&(win as usize))) {
        return Err(not_live(win, what));
    }
    // SAFETY: a live handle from `publish`, just retired (so freed once).
    Ok(unsafe { Box::from_raw(win as *mut Handle) }.window)
}

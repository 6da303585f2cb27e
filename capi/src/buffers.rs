//! User buffers on the host backend. C callers pass ordinary host pointers, which the host
//! backend only accepts inside memory it knows; so each range an operation uses is registered
//! with the backend for the operation's lifetime (until the call returns, or the outermost
//! `ncclGroupEnd` inside a group), unless it already lies in known memory (`ncclMemAlloc`,
//! `ncclCommRegister`).

use std::cell::RefCell;
use std::sync::Arc;

use rustccl::backend::{BackendKind, DeviceBackend, DevicePtr};
use rustccl::Error;

thread_local! {
    /// Registrations made for operations not yet run, and the group depth seen by the C API.
    static PENDING: RefCell<(u32, Vec<(Arc<dyn DeviceBackend>, DevicePtr)>)> = const { RefCell::new((0, Vec::new())) };
}

/// Makes `ranges` usable by the backend for the coming operation. Larger ranges first, so a
/// range inside another (in-place AllGather) is covered by the outer registration.
pub fn prepare(backend: &Arc<dyn DeviceBackend>, ranges: &[(usize, usize)]) -> Result<(), Error> {
    if backend.kind() != BackendKind::Host {
        return Ok(());
    }
    let mut ranges: Vec<(usize, usize)> = ranges.iter().copied().filter(|&(p, b)| p != 0 && b > 0).collect();
    ranges.sort_by(|a, b| b.1.cmp(&a.1));
    for (ptr, bytes) in ranges {
        if backend.host_address(DevicePtr(ptr as u64), bytes).is_ok() {
            continue;
        }
        // SAFETY: the C caller promises, as with NCCL, that the buffer is valid for `bytes`
        // until the operation completes; the registration ends then (see `finish`).
        let p = unsafe { backend.register_host(ptr as *mut u8, bytes) }
            .map_err(|e| e.context("the buffer overlaps memory already known to the host backend in an unsupported way"))?;
        PENDING.with(|s| s.borrow_mut().1.push((Arc::clone(backend), p)));
    }
    Ok(())
}

/// Group depth as the C API sees it.
pub fn enter_group() {
    PENDING.with(|s| s.borrow_mut().0 += 1);
}

pub fn leave_group() {
    PENDING.with(|s| {
        let mut s = s.borrow_mut();
        s.0 = s.0.saturating_sub(1);
    });
}

/// Ends the registrations of operations that have run (outside any group).
pub fn finish() {
    let done = PENDING.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 == 0 {
            std::mem::take(&mut s.1)
        } else {
            Vec::new()
        }
    });
    for (backend, p) in done {
        let _ = backend.unregister_host(p);
    }
}

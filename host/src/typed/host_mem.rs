//! Host slices on the host backend. The backend only runs on memory it knows, so a slice an
//! operation uses is registered with it
//! ([`Memory::register_host`](crate::backend::Memory::register_host)) while the operation may
//! touch it, and unregistered when its last user is done.
//!
//! One slice may be used by several operations at once (a group sending one buffer to every
//! peer), and slices may overlap (shared borrows of one array): registrations are shared and
//! counted. A range inside a registration holds it; a range that overlaps registrations
//! without lying inside one replaces them with one registration of the union. (Replacing is
//! done under this table's lock, but not the backend's: an operation of another thread that
//! resolves an address of the replaced registrations at that instant would be refused with
//! `InvalidArgument`, never run on unregistered memory.)
//!
//! Public for the Python package (python/src/communicator.rs), which passes host buffers to
//! the raw API and must register them the same way: one table per process, so a buffer the
//! typed API and Python use at once is registered once.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Result;

struct Entry {
    backend: Arc<dyn DeviceBackend>,
    start: usize,
    end: usize,
    holders: usize,
}

static TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn table() -> MutexGuard<'static, Vec<Entry>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

fn same(a: &Arc<dyn DeviceBackend>, b: &Arc<dyn DeviceBackend>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// One operation's hold on the registration that covers `start..end`.
pub struct HostHold {
    backend: Arc<dyn DeviceBackend>,
    start: usize,
    end: usize,
}

/// Makes `ptr..ptr+bytes` (host memory the caller borrows for at least as long as the hold
/// lives) usable by `backend`; the address to give the raw API, and the hold to keep until
/// the operations using it have completed (`None` when nothing was registered: no bytes, or
/// memory the backend already knows).
///
/// # Safety
/// The memory must stay valid (and, if an operation writes it, not otherwise accessed) until
/// the hold is dropped.
pub unsafe fn hold(backend: &Arc<dyn DeviceBackend>, ptr: *const u8, bytes: usize) -> Result<(DevicePtr, Option<HostHold>)> {
    let start = ptr as usize;
    let addr = DevicePtr(start as u64);
    if bytes == 0 {
        return Ok((addr, None));
    }
    let end = start + bytes;
    let mut t = table();
    if let Some(e) = t.iter_mut().find(|e| same(&e.backend, backend) && e.start <= start && end <= e.end) {
        e.holders += 1;
        return Ok((addr, Some(HostHold { backend: Arc::clone(backend), start, end })));
    }
    let overlapping: Vec<usize> =
        (0..t.len()).filter(|&i| same(&t[i].backend, backend) && t[i].start < end && start < t[i].end).collect();
    if overlapping.is_empty() && backend.host_access().is_some_and(|h| h.host_address(addr, bytes).is_ok()) {
        // Memory the backend allocated or someone else registered.
        return Ok((addr, None));
    }
    let (mut lo, mut hi, mut holders) = (start, end, 1);
    for &i in overlapping.iter().rev() {
        let e = t.swap_remove(i);
        lo = lo.min(e.start);
        hi = hi.max(e.end);
        holders += e.holders;
        if let Err(err) = e.backend.unregister_host(DevicePtr(e.start as u64)) {
            tracing::warn!(target: "CALL", "replacing a host registration: {}", err.message);
        }
    }
    // SAFETY: the caller keeps `ptr..ptr+bytes` valid while its hold lives; the other parts
    // of the union are ranges earlier holders promised the same for, and the registration
    // ends (in `Drop for HostHold`) once no holder is left.
    let registered = unsafe { backend.register_host(lo as *mut u8, hi - lo) };
    match registered {
        Ok(_) => {
            t.push(Entry { backend: Arc::clone(backend), start: lo, end: hi, holders });
            Ok((addr, Some(HostHold { backend: Arc::clone(backend), start, end })))
        }
        Err(e) => {
            if holders > 1 {
                tracing::warn!(target: "CALL", "a host registration could not be replaced: {}", e.message);
            }
            Err(e.context("registering a host buffer with the host backend"))
        }
    }
}

impl Drop for HostHold {
    fn drop(&mut self) {
        let mut t = table();
        let Some(i) = t.iter().position(|e| same(&e.backend, &self.backend) && e.start <= self.start && self.end <= e.end) else {
            return;
        };
        t[i].holders -= 1;
        if t[i].holders == 0 {
            let e = t.swap_remove(i);
            if let Err(err) = e.backend.unregister_host(DevicePtr(e.start as u64)) {
                tracing::warn!(target: "CALL", "ending the registration of a host buffer: {}", err.message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Stream;

    #[test]
    fn overlapping_and_nested_holds_share_one_registration() {
        let backend: Arc<dyn DeviceBackend> = Arc::new(crate::backend::HostBackend::with_devices(1));
        let buf = vec![7u8; 64];
        let p = buf.as_ptr();
        // SAFETY (all holds below): `buf` outlives every hold, dropped before it.
        let (a, ha) = unsafe { hold(&backend, p, 32) }.unwrap();
        let (b, hb) = unsafe { hold(&backend, p.wrapping_add(8), 8) }.unwrap();
        let (c, hc) = unsafe { hold(&backend, p.wrapping_add(16), 48) }.unwrap();
        assert_eq!((a.0, b.0, c.0), (p as u64, p as u64 + 8, p as u64 + 16));
        let mut out = [0u8; 64];
        backend.copy_from_device(&mut out, a, Stream::DEFAULT).unwrap();
        assert_eq!(out, [7u8; 64], "the union is registered");
        drop((ha, hb));
        backend.copy_from_device(&mut out[..48], c, Stream::DEFAULT).unwrap();
        drop(hc);
        assert!(backend.host_access().unwrap().host_address(a, 1).is_err(), "the last holder unregisters");
        let (_, none) = unsafe { hold(&backend, p, 0) }.unwrap();
        assert!(none.is_none());
    }
}

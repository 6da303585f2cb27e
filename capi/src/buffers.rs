//! User buffers on the host backend. C callers pass ordinary host pointers, which the host
//! backend only accepts inside memory it knows; so each range an operation uses is registered
//! with the backend for the operation's lifetime, unless it already lies in known memory
//! (`ncclMemAlloc`, `ncclCommRegister`). The lifetime ends when the call returns (or the
//! outermost `ncclGroupEnd` inside a group), or, when the call returned `ncclInProgress`
//! (non-blocking communicators), when the background job that runs the operations finishes.
//!
//! Queued operations may use the same buffer, so a registration made here is shared: an
//! operation whose range lies inside one holds it too, and it ends when its last holder does.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use rustccl::backend::{DeviceBackend, DevicePtr};
use rustccl::Error;

/// A registration made here, and how many pending or running operations hold it.
struct Registration {
    backend: Arc<dyn DeviceBackend>,
    ptr: DevicePtr,
    bytes: usize,
    holders: usize,
}

impl Registration {
    fn covers(&self, backend: &Arc<dyn DeviceBackend>, ptr: usize, bytes: usize) -> bool {
        Arc::ptr_eq(&self.backend, backend) && ptr as u64 >= self.ptr.0 && (ptr as u128 + bytes as u128) <= self.ptr.0 as u128 + self.bytes as u128
    }
}

/// Every registration made here that some operation still holds.
static REGISTERED: Mutex<Vec<Registration>> = Mutex::new(Vec::new());

/// One operation's hold on a registration: its backend and start.
type Hold = (Arc<dyn DeviceBackend>, DevicePtr);

thread_local! {
    /// Holds of operations not yet run, and the group depth seen by the C API.
    static PENDING: RefCell<(u32, Vec<Hold>)> = const { RefCell::new((0, Vec::new())) };
}

fn registered() -> std::sync::MutexGuard<'static, Vec<Registration>> {
    REGISTERED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `ranges` usable by the backend for the coming operation. Larger ranges first, so a
/// range inside another (in-place AllGather) is covered by the outer registration.
pub fn prepare(backend: &Arc<dyn DeviceBackend>, ranges: &[(usize, usize)]) -> Result<(), Error> {
    // A job a Rust caller queued on this thread is nothing of this operation's.
    drop(rustccl::comm::jobs::take_launched());
    let Some(host) = backend.host_access() else {
        return Ok(());
    };
    let mut ranges: Vec<(usize, usize)> = ranges.iter().copied().filter(|&(p, b)| p != 0 && b > 0).collect();
    ranges.sort_by(|a, b| b.1.cmp(&a.1));
    let mut table = registered();
    for (ptr, bytes) in ranges {
        let hold = match table.iter_mut().find(|r| r.covers(backend, ptr, bytes)) {
            Some(r) => {
                r.holders += 1;
                r.ptr
            }
            None if host.host_address(DevicePtr(ptr as u64), bytes).is_ok() => continue,
            None => {
                check_mapped(ptr, bytes)?;
                // SAFETY: the C caller promises, as with NCCL, that the buffer is valid for
                // `bytes` until the operation completes; the registration ends then (see
                // `finish`).
                let p = unsafe { backend.register_host(ptr as *mut u8, bytes) }.map_err(|e| {
                    e.context("the buffer overlaps memory already known to the host backend (or used by a queued operation) in an unsupported way")
                })?;
                table.push(Registration { backend: Arc::clone(backend), ptr: p, bytes, holders: 1 });
                p
            }
        };
        PENDING.with(|s| s.borrow_mut().1.push((Arc::clone(backend), hold)));
    }
    Ok(())
}

/// A caller's buffer the host backend does not know yet is host memory of this process, and
/// the host backend runs on whatever range it registers: a range that is not mapped memory (a
/// count larger than the buffer, a range past the end of the address space) is refused here
/// rather than read. (Memory the backend knows is mapped already.)
fn check_mapped(p: usize, bytes: usize) -> Result<(), Error> {
    if p == 0 || bytes == 0 {
        return Ok(());
    }
    let refuse = || {
        Error::invalid_argument(format!(
            "the buffer at {p:#x} of {bytes} bytes is not memory of this process (is the count larger than the buffer?)"
        ))
    };
    let end = p.checked_add(bytes).ok_or_else(refuse)?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    let start = p - p % page;
    // SAFETY: with MS_ASYNC, msync only looks the range up in this process's mappings (it
    // fails with ENOMEM when part of it is unmapped); it does not read or write the memory.
    if unsafe { libc::msync(start as *mut libc::c_void, end - start, libc::MS_ASYNC) } != 0 {
        return Err(refuse());
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

/// Outside any group: the operations called have run, or were queued as a background job
/// (non-blocking); their holds end now, or when that job has finished.
pub fn finish() {
    let done = PENDING.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 == 0 {
            Some(std::mem::take(&mut s.1))
        } else {
            None
        }
    });
    let Some(done) = done else { return };
    match rustccl::comm::jobs::take_launched() {
        Some(job) => job.on_done(move || release(done)),
        None => release(done),
    }
}

/// Ends holds; a registration ends with its last one.
fn release(holds: Vec<Hold>) {
    let mut table = registered();
    for (backend, ptr) in holds {
        let Some(i) = table.iter().position(|r| Arc::ptr_eq(&r.backend, &backend) && r.ptr == ptr) else { continue };
        table[i].holders -= 1;
        if table[i].holders == 0 {
            let r = table.swap_remove(i);
            if let Err(e) = r.backend.unregister_host(r.ptr) {
                tracing::warn!(target: "CALL", "ending the registration of a user buffer: {}", e.message);
            }
        }
    }
}

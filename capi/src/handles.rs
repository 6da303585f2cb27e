//! `ncclComm_t` handles. A handle is a token naming a [`CComm`] in the table of live
//! communicators; it is never dereferenced. Each call takes its own reference to the
//! communicator ([`get`] returns an `Arc`), so a call racing `ncclCommDestroy` or
//! `ncclCommAbort` on another thread either runs on a still-valid communicator (which is
//! dropped when the last call using it returns) or is refused cleanly as not live. Tokens are
//! never reused, so a stale handle cannot reach a later communicator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustccl::types::DataType;
use rustccl::{Communicator, Error, ReduceOp};

/// A PreMulSum operator made by `ncclRedOpCreatePreMulSum`: valid only with its data type.
#[derive(Clone, Copy)]
pub struct UserOp {
    pub op: ReduceOp,
    pub dtype: DataType,
}

/// What an `ncclComm_t` names.
pub struct CComm {
    pub comm: Communicator,
    /// PreMulSum operators made by `ncclRedOpCreatePreMulSum`, by their `ncclRedOp_t` value.
    pub ops: Mutex<HashMap<i32, UserOp>>,
}

/// `ncclComm_t` as seen from C: an opaque token (see the module documentation).
pub type CommHandle = *mut CComm;

static LIVE: Mutex<Option<HashMap<usize, Arc<CComm>>>> = Mutex::new(None);

/// Tokens step by 16 from a non-null start, so they look like aligned pointers to C code.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

fn live() -> std::sync::MutexGuard<'static, Option<HashMap<usize, Arc<CComm>>>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes a handle for a new communicator.
pub fn publish(comm: Communicator) -> CommHandle {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) << 4;
    let c = Arc::new(CComm { comm, ops: Mutex::new(HashMap::new()) });
    live().get_or_insert_with(HashMap::new).insert(token, c);
    token as CommHandle
}

fn not_live(h: CommHandle, what: &str) -> Error {
    if h.is_null() {
        return Error::invalid_argument(format!("{what}: comm is NULL"));
    }
    Error::invalid_argument(format!(
        "{what}: comm {h:p} is not a live communicator (already destroyed or aborted, or not made by this library)"
    ))
}

/// The communicator behind a handle that must be live; the caller holds it until it drops
/// the `Arc`, even if another thread retires the handle meanwhile.
pub fn get(h: CommHandle, what: &str) -> Result<Arc<CComm>, Error> {
    live().as_ref().and_then(|m| m.get(&(h as usize))).cloned().ok_or_else(|| not_live(h, what))
}

/// Retires a handle: later calls with it are refused. Returns the communicator, which is
/// dropped once the caller and any call still running on it are done. Of two racing
/// retirements of one handle, one gets the communicator and the other an error like [`get`]'s.
pub fn retire(h: CommHandle, what: &str) -> Result<Arc<CComm>, Error> {
    live().as_mut().and_then(|m| m.remove(&(h as usize))).ok_or_else(|| not_live(h, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_null_handles_are_refused() {
        let e = get(std::ptr::null_mut(), "t").err().unwrap();
        assert!(e.message.contains("NULL"), "{}", e.message);
        let e = retire(0x1230 as CommHandle, "t").err().unwrap();
        assert!(e.message.contains("not a live communicator"), "{}", e.message);
    }
}

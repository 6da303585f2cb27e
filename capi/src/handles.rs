//! `ncclComm_t` handles. A handle points to a [`CComm`] the library allocated; the set of live
//! handles is kept, so a destroyed, foreign or garbage handle is refused with a message
//! instead of being dereferenced.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use rustccl::{Communicator, Error, ReduceOp};

/// What an `ncclComm_t` points to.
pub struct CComm {
    pub comm: Communicator,
    /// PreMulSum operators made by `ncclRedOpCreatePreMulSum`, by their `ncclRedOp_t` value.
    pub ops: Mutex<HashMap<i32, ReduceOp>>,
}

/// `ncclComm_t` as seen from C.
pub type CommHandle = *mut CComm;

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes a handle for a new communicator.
pub fn publish(comm: Communicator) -> CommHandle {
    let ptr = Box::into_raw(Box::new(CComm { comm, ops: Mutex::new(HashMap::new()) }));
    live().get_or_insert_with(HashSet::new).insert(ptr as usize);
    ptr
}

/// The communicator behind a handle that must be live.
pub fn get<'a>(h: CommHandle, what: &str) -> Result<&'a CComm, Error> {
    if h.is_null() {
        return Err(Error::invalid_argument(format!("{what}: comm is NULL")));
    }
    if !live().as_ref().is_some_and(|s| s.contains(&(h as usize))) {
        return Err(Error::invalid_argument(format!(
            "{what}: comm {h:p} is not a live communicator (already destroyed, or not made by this library)"
        )));
    }
    // SAFETY: the handle is in the live set, so it came from `publish` and was not retired.
    Ok(unsafe { &*h })
}

/// Retires a handle; the communicator is dropped. Errors like [`get`] when not live.
pub fn retire(h: CommHandle, what: &str) -> Result<(), Error> {
    get(h, what)?;
    live().as_mut().map(|s| s.remove(&(h as usize)));
    // SAFETY: came from `publish` (checked above) and is no longer in the live set.
    drop(unsafe { Box::from_raw(h) });
    Ok(())
}

//! Groups from Python (`with rustccl.group(): ...`): NCCL's group_start / group_end, plus what
//! keeps the host buffers of the group's operations registered and exported until the
//! outermost group_end has run them (on host memory the group has completed when it exits).

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::prelude::*;
use rustccl::backend::Stream;
use rustccl::error::ResultCode;
use rustccl::typed::host_mem::HostHold;
use rustccl::Communicator;

use crate::buffers::Keep;
use crate::errors::to_py;

/// What the calling thread's open group holds until its end.
#[derive(Default)]
pub struct Held {
    pub holds: Vec<HostHold>,
    pub keep: Vec<Keep>,
    /// Host-memory communicators with operations in the group, and the stream they used:
    /// waited for at the end.
    pub host_comms: Vec<(Arc<Communicator>, Stream)>,
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::default());
}

/// Keeps an operation's holds until the group ends.
pub fn defer(holds: Vec<HostHold>, keep: Vec<Keep>, host_comm: Option<(Arc<Communicator>, Stream)>) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.holds.extend(holds);
        h.keep.extend(keep);
        if let Some((c, s)) = host_comm {
            if !h.host_comms.iter().any(|(d, t)| Arc::ptr_eq(d, &c) && *t == s) {
                h.host_comms.push((c, s));
            }
        }
    });
}

/// `ncclGroupStart`.
#[pyfunction]
pub fn group_start() {
    rustccl::group_start();
}

/// `ncclGroupEnd`: the outermost one runs the group's operations; on host memory it returns
/// once they have completed.
#[pyfunction]
pub fn group_end(py: Python<'_>) -> PyResult<()> {
    let ended = py.detach(rustccl::group_end);
    if rustccl::coll::group_depth() > 0 {
        return ended.map_err(to_py);
    }
    let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let comms: Vec<(Arc<Communicator>, Stream)> = held.host_comms.clone();
    let waited = py.detach(move || -> rustccl::Result<()> {
        let mut first = ended.err().filter(|e| e.code != ResultCode::InProgress);
        for (comm, stream) in &comms {
            // Non-blocking communicators run the group in the background: wait for it.
            let r = comm.wait_idle().and_then(|_| comm.backend().synchronize(*stream));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    });
    drop(held);
    waited.map_err(to_py)
}

//! The one launch sequence: every piece of device work a communicator enqueues — the
//! interpreter (`super::launch`), a cached launch ([`super::cached`]), a symmetric kernel
//! ([`super::symmetric`]) and a copy-engine collective ([`super::copy_engine`]) — goes through
//! `ExecState::launch`, which does, in this order:
//! 1. the capture check: whether the stream is capturing a graph (a captured launch is
//!    recorded, not run, and may be replayed at any time);
//! 2. the control block (made on first use), whose device address kernels poll for an abort
//!    and write their errors to;
//! 3. unless captured, waiting for the communicator's last launch when that came on another
//!    stream (launches of one communicator run in order, whatever streams they come on);
//! 4. the enqueue itself (the caller's closure: images, kernel, copies, stream operations);
//! 5. unless captured, recording the communicator's event after the launch (the next launch
//!    on another stream, the watchdog, `wait_device_idle` and a full image arena wait on it).
//!
//! A captured launch neither waits for nor becomes the last launch: the graph runs whenever
//! it is replayed, not in the order of the calls.
//!
//! The copy engines differ in two ways, both stated by `Engine::CopyEngines`: they never run
//! in a capture (their epochs are counted by the host, so a replay would reuse an old one), so
//! their capture check is made before the caller commits to them (`super::copy_engine::ready`,
//! whose answer the sequence takes instead of asking again); and they read no control block
//! (stream memory operations cannot poll one), so none is made for them.

use std::sync::Arc;

use super::copy_engine::Ready;
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, Stream};
use crate::error::Result;
use crate::profile::{self, Stage};

/// What is launched, and on which stream.
pub(crate) enum Engine {
    /// A kernel (the interpreter or a symmetric kernel) on this stream: it may be captured,
    /// and it reads the control block.
    Kernel(Stream),
    /// A copy-engine collective, on the stream `ready` found not capturing.
    CopyEngines(Ready),
}

/// What the enqueue step of a launch gets to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub stream: Stream,
    /// Whether the stream is capturing a graph (always false for the copy engines).
    pub capturing: bool,
    /// The control block's device address for the kernel's parameter (`DevicePtr::NULL` for
    /// the copy engines, which read none).
    pub control: DevicePtr,
}

/// Step 1 for a stream: whether it is capturing a graph.
pub(crate) fn is_capturing(backend: &Arc<dyn DeviceBackend>, stream: Stream) -> Result<bool> {
    // Clock reads only when RUSTCCL_PROFILE_ENQUEUE=1.
    let t = profile::start();
    let capturing = backend.is_capturing(stream)?;
    profile::stage(Stage::Capture, t);
    Ok(capturing)
}

impl ExecState {
    /// Launches what `enqueue` enqueues as this communicator's next device work on `device`
    /// (see the module docs for the steps around it); returns what `enqueue` returns, once it
    /// is enqueued.
    pub(crate) fn launch<T>(
        &mut self,
        backend: &Arc<dyn DeviceBackend>,
        device: usize,
        engine: Engine,
        enqueue: impl FnOnce(&mut ExecState, Launch) -> Result<T>,
    ) -> Result<T> {
        let (stream, capturing, control) = match engine {
            Engine::Kernel(stream) => {
                let capturing = is_capturing(backend, stream)?;
                (stream, capturing, self.control(backend)?)
            }
            Engine::CopyEngines(ready) => (ready.stream(), false, DevicePtr::NULL),
        };
        if !capturing {
            self.follow_last(backend, stream)?;
        }
        let out = enqueue(self, Launch { stream, capturing, control })?;
        if !capturing {
            let t = profile::start();
            self.launched(backend, device, stream)?;
            profile::stage(Stage::Event, t);
        }
        Ok(out)
    }
}


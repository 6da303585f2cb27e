//! A device launch made once and repeated: what a single collective called again with the same
//! shape (`coll::cache`) reuses on a device backend — its program image (encoded once, kept in
//! the image arena and found there again by generation and offset, not by content), the
//! interpreter kernel (looked up once), and the peer access of its connections' slots (set up
//! once). The image depends only on the shape (the buffers and the PreMulSum scalar travel in
//! the kernel parameter, see [`super::encode`]), so a call with other buffers reuses it as is.
//!
//! Per call the launch only: asks whether the stream is being captured; waits for the
//! communicator's last launch when it was on another stream; checks the two user buffers
//! (and makes them reachable); fills the kernel parameter; launches; records the
//! communicator's event after the launch. No encode, no upload, no allocation — except when
//! the arena was emptied since (the image goes up again, not re-encoded) and when the stream
//! is being captured (the launch gets an image of its own that lives as long as the
//! communicator, as uncached captured launches do).
//!
//! About the event: it is recorded after every launch because the next launch of this
//! communicator may come on another stream and must wait for this one, the watchdog and
//! `wait_device_idle` ask it whether the device work completed, and a full arena waits for it
//! before its images are overwritten. Recording it lazily — on the old stream when a later
//! call comes on another — is not safe: the caller may have destroyed that stream in
//! between. What would let the launch skip it: the kernel writing a launch sequence number
//! into the control block (host-mapped) when its last block finishes, completion read from
//! that number, and a stream change answered by `cuStreamWaitValue64` on it on the new
//! stream (which needs nothing of the old stream); that is a change of `exec.cu` and of the
//! backend trait, left for later.

use std::sync::Arc;

use rustccl_kernels::DeviceOp;

use super::encode::{self, Encoded};
use super::state::{fits_arena, ArenaImage};
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, ExecKernel};
use crate::error::Result;
use crate::exec::Links;
use crate::profile::{self, Stage};
use crate::types::DataType;
use crate::work::Work;

/// One launch of the interpreter, ready to repeat for calls of one shape.
pub(crate) struct CachedLaunch {
    /// The program image (its bytes are kept to upload it again after the arena is emptied).
    enc: Encoded,
    /// Where it was put in the arena last (None: not yet).
    image: Option<ArenaImage>,
    kernel: ExecKernel,
    /// The connections the image names (kept alive with it).
    _links: Links,
}

impl CachedLaunch {
    /// Prepares the launch of `run`'s work on `device` (its connections in `links`): encodes
    /// it, looks its kernel up, makes its connections' slots reachable. `None` when the work
    /// is not one launch with nothing else to do (no copies, one kernel, an image that fits
    /// the arena): it then goes the uncached way every time.
    pub(crate) fn new(backend: &Arc<dyn DeviceBackend>, device: usize, run: &Work, links: &Links) -> Result<Option<CachedLaunch>> {
        if !run.copies.is_empty() || run.items.is_empty() {
            return Ok(None);
        }
        let segments = encode::segments(run);
        let [seg] = segments.as_slice() else { return Ok(None) };
        let Some(enc) = encode::encode(run, links, seg.ctxs.clone())? else { return Ok(None) };
        if !fits_arena(enc.bytes.len()) {
            return Ok(None);
        }
        let kernel = backend.exec_kernel(device, seg.op, seg.dtype)?;
        backend.reach_exec_memory(device, &enc.slots)?;
        Ok(Some(CachedLaunch { enc, image: None, kernel, _links: links.clone() }))
    }

    /// The kernel's operator and element type.
    pub(crate) fn kernel_pair(&self) -> (DeviceOp, DataType) {
        (self.kernel.op, self.kernel.dtype)
    }

    /// The program image's bytes.
    pub(crate) fn image_bytes(&self) -> &[u8] {
        &self.enc.bytes
    }

    /// Launches `run` (this launch's work, its contexts pointed at this call's buffers) on its
    /// stream; returns once it is enqueued.
    pub(crate) fn launch(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, run: &Work) -> Result<()> {
        let stream = run.stream;
        let t = std::time::Instant::now();
        let capturing = backend.is_capturing(stream)?;
        profile::record(Stage::Capture, t);
        let control = state.control(backend)?;
        let t = std::time::Instant::now();
        let base = if capturing {
            // A graph may replay it at any time: an image of its own, kept with the
            // communicator (allocated with the capture mode relaxed, as uncached launches).
            let mut base = DevicePtr::NULL;
            backend.with_relaxed_capture(&mut || {
                base = state.image(backend, device, &self.enc.bytes, true, stream)?;
                Ok(())
            })?;
            base
        } else {
            // Launches of one communicator run in order, whatever streams they come on.
            if state.last.is_some_and(|s| s != stream) {
                if let Some(e) = state.last_event() {
                    backend.stream_wait_event(stream, e)?;
                }
            }
            match self.image.and_then(|at| state.arena_at(at)) {
                Some(base) => base,
                None => {
                    let (base, at) = state.arena_image(backend, device, &self.enc.bytes, stream)?;
                    self.image = Some(at);
                    base
                }
            }
        };
        profile::record(Stage::Image, t);
        let t = std::time::Instant::now();
        for c in &run.ctxs {
            for (ptr, bytes) in [(c.src, c.src_len), (c.dst, c.dst_len)] {
                if bytes > 0 && ptr != 0 {
                    backend.check_exec_buffer(device, DevicePtr(ptr as u64), bytes)?;
                }
            }
        }
        let args = self.enc.args(base, control, &encode::calls(run));
        backend.launch_exec_kernel(&self.kernel, &args, self.enc.blocks, stream)?;
        profile::record(Stage::Kernel, t);
        if !capturing {
            state.launched(backend, device, stream)?;
        }
        Ok(())
    }
}

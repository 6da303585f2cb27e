//! The device executor's state of one communicator: the control block kernels poll (abort)
//! and write (errors), the program images in device memory (an arena for launches not
//! captured, images of their own for captured ones), and the event after the last launch.
//!
//! The arena has a generation, counted up each time it is emptied (full, suspended,
//! released): an `ArenaImage` kept by a cached launch (`super::cached`) names its image by
//! generation and offset, and is good only while the generation is the same.

use std::collections::HashMap;
use std::sync::Arc;

use rustccl_kernels::exec as k;

use crate::backend::{DeviceBackend, DevicePtr, Event, HostCallback, HostMapped, Stream};
use crate::error::Result;

/// Bytes of each communicator's image arena (pinned host memory and as much device memory).
const ARENA_BYTES: usize = 8 << 20;

/// Bytes of the control block (pinned host memory, mapped for the device).
pub(crate) const CONTROL_BYTES: usize = if std::mem::size_of::<k::ExecControl>() > 64 { std::mem::size_of::<k::ExecControl>() } else { 64 };

/// A program image: pinned host memory (the copy's source) and device memory (what the kernel
/// reads).
pub(crate) struct Image {
    host: HostMapped,
    device: DevicePtr,
}

/// Where images of launches not captured live: one allocation made once, filled from the start
/// and emptied (with the cache) when full, after the device is idle. Allocating on the launch
/// path would be worse than slow: pinned and device allocations may wait for every running
/// kernel, and with several devices in one process a kernel may be waiting for the very thread
/// that allocates (to launch its peer's half).
struct Arena {
    mem: Image,
    used: usize,
}

/// Where an image lies in the arena, as long as the arena's generation stays `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArenaImage {
    generation: u64,
    offset: usize,
}

/// Whether an image of `bytes` bytes goes in the arena (a larger one gets memory of its own).
pub(crate) fn fits_arena(bytes: usize) -> bool {
    bytes.div_ceil(256) * 256 <= ARENA_BYTES
}

/// The device executor's state of one communicator (kept in its device cache).
#[derive(Default)]
pub struct ExecState {
    /// Host memory the kernels poll and write (`ExecControl`).
    control: Option<HostMapped>,
    arena: Option<Arena>,
    /// Images in the arena by content: offset.
    cache: HashMap<Vec<u8>, usize>,
    /// Counted up each time the arena is emptied or freed (see [`ArenaImage`]).
    generation: u64,
    /// Images copied to the device so far (into the arena or memory of their own).
    uploads: u64,
    /// Images looked up in the arena by content so far.
    lookups: u64,
    /// Images of captured launches: kept until the communicator goes.
    captured: Vec<Image>,
    /// Host callbacks of captured launches (they tell the proxy of a replay's network
    /// receives): kept until the communicator goes, as the images.
    captured_callbacks: Vec<Arc<HostCallback>>,
    /// The stream of the last launch not captured, and an event recorded after that launch
    /// (recorded at once: the caller may destroy the stream before the communicator).
    pub(crate) last: Option<Stream>,
    event: Option<Event>,
    /// Whether the watchdog runs.
    pub watching: bool,
}

impl ExecState {
    /// The control block, made on first use.
    pub(crate) fn control(&mut self, backend: &Arc<dyn DeviceBackend>) -> Result<DevicePtr> {
        if let Some(c) = &self.control {
            return Ok(c.device);
        }
        let c = backend.alloc_host_mapped(CONTROL_BYTES)?;
        // SAFETY: fresh pinned memory of at least that size, not yet shared with any kernel.
        unsafe { std::ptr::write_bytes(c.host, 0, c.bytes) };
        let device = c.device;
        self.control = Some(c);
        Ok(device)
    }

    /// Host address of the control block, if made.
    pub(crate) fn control_host(&self) -> Option<usize> {
        self.control.as_ref().map(|c| c.host as usize)
    }

    /// Tells running and future kernels of this communicator to stop.
    pub(crate) fn abort(&self) {
        if let Some(c) = &self.control {
            // SAFETY: the control block is live pinned memory; `abort` is its first u32, which
            // kernels only read.
            unsafe { std::ptr::write_volatile(c.host as *mut u32, 1) };
        }
    }

    /// The event that completes after the last launch not captured, if there was one.
    pub(crate) fn last_event(&self) -> Option<Event> {
        self.last.and(self.event)
    }

    /// Makes work enqueued on `stream` from now on wait for this communicator's last launch
    /// when that came on another stream: launches of one communicator run in order, whatever
    /// streams they come on.
    pub(crate) fn follow_last(&self, backend: &Arc<dyn DeviceBackend>, stream: Stream) -> Result<()> {
        match self.last_event() {
            Some(e) if self.last != Some(stream) => backend.stream_wait_event(stream, e),
            _ => Ok(()),
        }
    }

    /// Records that a launch was enqueued on `stream`.
    pub(crate) fn launched(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, stream: Stream) -> Result<()> {
        let e = match self.event {
            Some(e) => e,
            None => *self.event.insert(backend.create_event(device)?),
        };
        backend.record_event(e, stream)?;
        self.last = Some(stream);
        Ok(())
    }

    /// Bytes held: (what [`suspend`](Self::suspend) frees: the image arena, in device and
    /// pinned memory; what stays: the control block and the images of captured launches,
    /// which graphs may replay).
    pub(crate) fn held_bytes(&self) -> (usize, usize) {
        let image = |i: &Image| i.host.bytes * 2;
        let arena = self.arena.as_ref().map_or(0, |a| image(&a.mem));
        let kept = self.control.as_ref().map_or(0, |c| c.bytes) + self.captured.iter().map(image).sum::<usize>();
        (arena, kept)
    }

    /// Frees the image arena (the device must be idle); the next launch makes it again.
    pub(crate) fn suspend(&mut self, backend: &Arc<dyn DeviceBackend>) {
        self.cache.clear();
        self.generation += 1;
        if let Some(a) = self.arena.take() {
            let _ = backend.free(a.mem.device);
            let _ = backend.free_host_mapped(a.mem.host);
        }
    }

    /// Keeps the host callback of a captured launch as long as the communicator.
    pub(crate) fn keep_captured(&mut self, callback: Arc<HostCallback>) {
        self.captured_callbacks.push(callback);
    }

    /// Frees everything (the device must be idle).
    pub(crate) fn release(&mut self, backend: &Arc<dyn DeviceBackend>) {
        self.cache.clear();
        self.generation += 1;
        let images = self.arena.take().map(|a| a.mem).into_iter().chain(self.captured.drain(..)).collect::<Vec<_>>();
        self.captured_callbacks.clear();
        for i in images {
            let _ = backend.free(i.device);
            let _ = backend.free_host_mapped(i.host);
        }
        self.last = None;
        if let Some(e) = self.event.take() {
            let _ = backend.destroy_event(e);
        }
        if let Some(c) = self.control.take() {
            let _ = backend.free_host_mapped(c);
        }
    }

    /// Images copied to the device so far.
    #[cfg(test)]
    pub(crate) fn uploads(&self) -> u64 {
        self.uploads
    }

    /// Images looked up in the arena by content so far.
    #[cfg(test)]
    pub(crate) fn lookups(&self) -> u64 {
        self.lookups
    }

    /// The device copy of `bytes`, uploaded on `stream` if it is new.
    pub(crate) fn image(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, bytes: &[u8], capturing: bool, stream: Stream) -> Result<DevicePtr> {
        if capturing || !fits_arena(bytes.len()) {
            // A graph may replay it at any time: memory of its own, kept until the end.
            let image = alloc_image(backend, device, bytes.len())?;
            // SAFETY: fresh pinned memory of `bytes.len()` bytes, kept (unchanged) with the
            // communicator, so the copy may run at any replay.
            unsafe { upload(backend, bytes, image.host.host, image.device, stream)? };
            self.uploads += 1;
            let dev = image.device;
            self.captured.push(image);
            return Ok(dev);
        }
        Ok(self.arena_image(backend, device, bytes, stream)?.0)
    }

    /// The device copy of `bytes` in the arena (which it must fit: [`fits_arena`]), uploaded
    /// on `stream` if it is new, and where it lies there.
    pub(crate) fn arena_image(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, bytes: &[u8], stream: Stream) -> Result<(DevicePtr, ArenaImage)> {
        let len = bytes.len().div_ceil(256) * 256;
        debug_assert!(fits_arena(bytes.len()));
        if self.arena.is_none() {
            self.arena = Some(Arena { mem: alloc_image(backend, device, ARENA_BYTES)?, used: 0 });
        }
        let generation = self.generation;
        self.lookups += 1;
        if let Some(&offset) = self.cache.get(bytes) {
            return Ok((self.arena.as_ref().expect("made above").mem.device.offset(offset), ArenaImage { generation, offset }));
        }
        if self.arena.as_ref().expect("made above").used + len > ARENA_BYTES {
            // Full: once the device is done with every image, start again.
            if let Some(e) = self.last_event() {
                backend.synchronize_event(e)?;
            }
            self.cache.clear();
            self.generation += 1;
            self.arena.as_mut().expect("made above").used = 0;
        }
        let generation = self.generation;
        let arena = self.arena.as_mut().expect("made above");
        let off = arena.used;
        arena.used += len;
        // SAFETY: `off + bytes.len()` lies in the arena; that range is not in use by any launch
        // (it was past `used`, or the device was idle when `used` went back to 0), and stays
        // unchanged until the copy has run (ranges are reused only after the device is idle).
        unsafe { upload(backend, bytes, arena.mem.host.host.add(off), arena.mem.device.offset(off), stream)? };
        self.uploads += 1;
        self.cache.insert(bytes.to_vec(), off);
        Ok((arena.mem.device.offset(off), ArenaImage { generation, offset: off }))
    }

    /// The device address of an image put in the arena earlier, if it is still there (the
    /// arena was not emptied since).
    pub(crate) fn arena_at(&self, at: ArenaImage) -> Option<DevicePtr> {
        let arena = self.arena.as_ref()?;
        (at.generation == self.generation).then(|| arena.mem.device.offset(at.offset))
    }
}

/// Writes `bytes` to pinned host memory at `host` and enqueues its copy to `device` on `stream`.
///
/// # Safety
/// `host` must be pinned memory of `backend` with room for `bytes`, left unchanged until the
/// copy has run (for a captured stream: as long as the graph may be replayed).
unsafe fn upload(backend: &Arc<dyn DeviceBackend>, bytes: &[u8], host: *mut u8, device: DevicePtr, stream: Stream) -> Result<()> {
    // SAFETY: the caller's contract: `host` has room for `bytes` and is not in use.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), host, bytes.len());
        backend.copy_from_pinned_async(device, host, bytes.len(), stream)
    }
}

/// Pinned host memory and device memory of `bytes` each.
fn alloc_image(backend: &Arc<dyn DeviceBackend>, device: usize, bytes: usize) -> Result<Image> {
    let host = backend.alloc_host_mapped(bytes)?;
    match backend.alloc(device, bytes) {
        Ok(device) => Ok(Image { host, device }),
        Err(e) => {
            let _ = backend.free_host_mapped(host);
            Err(e)
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    /// A launch on another stream than the last waits for the last one; on the same stream,
    /// or before any launch, nothing is waited for.
    #[test]
    fn launches_follow_the_last_one_across_streams() {
        let (fake, backend) = super::super::cached::tests::backend();
        let mut state = ExecState::default();
        let (a, b) = (Stream(1), Stream(2));
        state.follow_last(&backend, a).unwrap();
        assert_eq!(fake.log().waits, 0, "no launch yet");
        state.launched(&backend, 0, a).unwrap();
        state.follow_last(&backend, a).unwrap();
        assert_eq!(fake.log().waits, 0, "same stream");
        state.follow_last(&backend, b).unwrap();
        assert_eq!(fake.log().waits, 1, "another stream");
        state.launched(&backend, 0, b).unwrap();
        state.follow_last(&backend, b).unwrap();
        assert_eq!(fake.log().waits, 1, "the last launch is on b now");
    }
}

//! [`Streams`] (streams, events, stream capture) and [`Memory`] (copies and fills; allocation
//! and registration are `gpu_memory`'s bookkeeping over `memory.rs`) of the HIP backend, and
//! the device work on a stream runs
//! on: a stream this backend made is on the device it was made for; the NULL stream and
//! `hipStreamPerThread` on the device of the memory involved (the communicator's), else the
//! current one; a caller's stream on the device `hipStreamGetDevice` names (ROCm 6), or the
//! current one where the runtime lacks it.

use std::ffi::{c_int, c_void};

use super::runtime::{Handle, HIP_ERROR_NOT_READY, HIP_SUCCESS};
use super::HipBackend;
use crate::backend::gpu_memory;
use crate::backend::{DevicePtr, Event, HostMapped, Memory, Stream, Streams};
use crate::error::{Error, Result};

/// `hipMemcpyDefault` for every copy: the runtime tells host from device memory by address
/// (unified addressing), so a copy may name host-mapped or registered memory on either side.
const MEMCPY_DEFAULT: c_int = 4;

/// `hipStreamCaptureModeRelaxed`.
const CAPTURE_MODE_RELAXED: c_int = 2;

pub(super) fn raw(stream: Stream) -> Handle {
    stream.0 as usize as Handle
}

/// The NULL stream and `hipStreamPerThread` (2): streams of whatever device is current.
fn is_default_like(stream: Stream) -> bool {
    stream.0 <= 2
}

impl HipBackend {
    /// The device work on `stream` runs on; `hint`: the device of the memory involved.
    pub(super) fn stream_device(&self, stream: Stream, hint: Option<usize>) -> Result<usize> {
        if let Some(&device) = self.streams.lock().unwrap_or_else(|p| p.into_inner()).get(&stream.0) {
            return Ok(device);
        }
        if is_default_like(stream) {
            return match hint {
                Some(d) => Ok(d),
                None => self.current(),
            };
        }
        let Some(get) = self.rt.stream_get_device else { return self.current() };
        let mut d = 0;
        // SAFETY: writes one int; an invalid stream is reported by the runtime.
        self.rt.check(unsafe { get(raw(stream), &mut d) }, "hipStreamGetDevice").map_err(|e| {
            Error::invalid_argument(format!("stream {:#x} is not a live HIP stream ({})", stream.0, e.message))
        })?;
        Ok(d.max(0) as usize)
    }

    /// The device a copy or fill with these pointers runs on, made current until the guard
    /// drops.
    pub(super) fn enter_for(&self, stream: Stream, ptrs: &[DevicePtr]) -> Result<super::DeviceGuard> {
        // The memory's device matters only to a default stream (no lookups otherwise).
        let hint = if is_default_like(stream) { ptrs.iter().find_map(|p| gpu_memory::tracked_device(self, *p)) } else { None };
        self.enter(self.stream_device(stream, hint)?)
    }

    fn event_device(&self, event: Event, op: &str) -> Result<usize> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).get(&event.0).copied().ok_or_else(|| {
            Error::invalid_argument(format!("{op}: event {:#x} is not a live event of this backend", event.0))
        })
    }

    fn done(&self, r: c_int, what: &str) -> Result<bool> {
        match r {
            HIP_SUCCESS => Ok(true),
            HIP_ERROR_NOT_READY => Ok(false),
            r => Err(self.rt.error(r, what)),
        }
    }
}

impl Memory for HipBackend {
    gpu_memory::memory_operations!();

    fn memory_info(&self, device: usize) -> Result<Option<(usize, usize)>> {
        let _g = self.enter(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        self.rt.check(unsafe { (self.rt.calls.mem_get_info)(&mut free, &mut total) }, "hipMemGetInfo")?;
        Ok(Some((free, total)))
    }

    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        let in_op = |e: Error| e.context("memset");
        let _g = self.enter_for(stream, &[dst])?;
        gpu_memory::check_range(self, dst, bytes, "destination").map_err(in_op)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the range was checked above.
        self.rt.check(unsafe { (self.rt.calls.memset_d8_async)(dst.0 as Handle, value, bytes, raw(stream)) }, "hipMemsetD8Async").map_err(in_op)
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
        let in_op = |e: Error| e.context("copy");
        let (d, s, n) = (dst.0 as u128, src.0 as u128, bytes as u128);
        if dst != src && d < s + n && s < d + n {
            return Err(in_op(Error::invalid_argument(format!("{bytes} bytes from {src} to {dst}: the ranges overlap"))));
        }
        let _g = self.enter_for(stream, &[dst, src])?;
        gpu_memory::check_range(self, dst, bytes, "destination").map_err(in_op)?;
        gpu_memory::check_range(self, src, bytes, "source").map_err(in_op)?;
        if bytes == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both ranges were checked above.
        let r = unsafe { (self.rt.calls.memcpy_async)(dst.0 as Handle, src.0 as *const c_void, bytes, MEMCPY_DEFAULT, raw(stream)) };
        self.rt.check(r, "hipMemcpyAsync").map_err(in_op)
    }

    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _g = self.enter_for(stream, &[dst])?;
        gpu_memory::check_range(self, dst, src.len(), "copy_to_device destination")?;
        // SAFETY: `src` is a live slice until the stream synchronisation below; `dst` checked.
        let r = unsafe { (self.rt.calls.memcpy_async)(dst.0 as Handle, src.as_ptr().cast(), src.len(), MEMCPY_DEFAULT, raw(stream)) };
        self.rt.check(r, "hipMemcpyAsync(host to device)")?;
        // SAFETY: a stream of the current device (or a default one).
        self.rt.check(unsafe { (self.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
    }

    fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _g = self.enter_for(stream, &[src])?;
        gpu_memory::check_range(self, src, dst.len(), "copy_from_device source")?;
        // SAFETY: `dst` is a live slice until the stream synchronisation below; `src` checked.
        let r = unsafe { (self.rt.calls.memcpy_async)(dst.as_mut_ptr().cast(), src.0 as *const c_void, dst.len(), MEMCPY_DEFAULT, raw(stream)) };
        self.rt.check(r, "hipMemcpyAsync(device to host)")?;
        // SAFETY: as above.
        self.rt.check(unsafe { (self.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
    }

    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _g = self.enter_for(stream, &[dst])?;
        gpu_memory::check_range(self, dst, bytes, "copy destination")?;
        // SAFETY: the caller keeps `src` pinned and valid until the copy runs; `dst` checked.
        let r = unsafe { (self.rt.calls.memcpy_async)(dst.0 as Handle, src.cast(), bytes, MEMCPY_DEFAULT, raw(stream)) };
        self.rt.check(r, "hipMemcpyAsync(pinned host to device)")
    }
}

impl Streams for HipBackend {
    fn create_stream(&self, device: usize) -> Result<Stream> {
        let _g = self.enter(device)?;
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle; hipStreamNonBlocking.
        self.rt.check(unsafe { (self.rt.calls.stream_create)(&mut s, 1) }, "hipStreamCreateWithFlags")?;
        let stream = Stream(s as u64);
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.0, device);
        Ok(stream)
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream.is_default() {
            return Err(Error::invalid_argument("destroy_stream: the default stream cannot be destroyed"));
        }
        let device = self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.0).ok_or_else(|| {
            Error::invalid_argument(format!("destroy_stream: stream {:#x} is not a live stream of this backend", stream.0))
        })?;
        let _g = self.enter(device)?;
        // SAFETY: a stream we created, forgotten above.
        self.rt.check(unsafe { (self.rt.calls.stream_destroy)(raw(stream)) }, "hipStreamDestroy")
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        let _g = self.enter(self.stream_device(stream, None)?)?;
        // SAFETY: a stream of the current device.
        self.rt.check(unsafe { (self.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
    }

    fn query(&self, stream: Stream) -> Result<bool> {
        let _g = self.enter(self.stream_device(stream, None)?)?;
        // SAFETY: as above.
        self.done(unsafe { (self.rt.calls.stream_query)(raw(stream)) }, "hipStreamQuery")
    }

    fn create_event(&self, device: usize) -> Result<Event> {
        let _g = self.enter(device)?;
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle; hipEventDisableTiming.
        self.rt.check(unsafe { (self.rt.calls.event_create)(&mut e, 0x2) }, "hipEventCreateWithFlags")?;
        let event = Event(e as u64);
        self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(event.0, device);
        Ok(event)
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let device = self.event_device(event, "record_event")?;
        let _g = self.enter(self.stream_device(stream, Some(device))?)?;
        // SAFETY: a live event of ours and a stream of the current device.
        self.rt.check(unsafe { (self.rt.calls.event_record)(event.0 as Handle, raw(stream)) }, "hipEventRecord")
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let device = self.event_device(event, "stream_wait_event")?;
        let _g = self.enter(self.stream_device(stream, Some(device))?)?;
        // SAFETY: as above; waiting on an event of another device is allowed.
        self.rt.check(unsafe { (self.rt.calls.stream_wait_event)(raw(stream), event.0 as Handle, 0) }, "hipStreamWaitEvent")
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        let _g = self.enter(self.event_device(event, "query_event")?)?;
        // SAFETY: a live event of ours.
        self.done(unsafe { (self.rt.calls.event_query)(event.0 as Handle) }, "hipEventQuery")
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        let _g = self.enter(self.event_device(event, "synchronize_event")?)?;
        // SAFETY: a live event of ours.
        self.rt.check(unsafe { (self.rt.calls.event_synchronize)(event.0 as Handle) }, "hipEventSynchronize")
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        let device = self.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event.0).ok_or_else(|| {
            Error::invalid_argument(format!("destroy_event: event {:#x} is not a live event of this backend", event.0))
        })?;
        let _g = self.enter(device)?;
        // SAFETY: a live event of ours, forgotten above.
        self.rt.check(unsafe { (self.rt.calls.event_destroy)(event.0 as Handle) }, "hipEventDestroy")
    }

    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: swaps a thread-local setting; restored below.
        self.rt.check(unsafe { (self.rt.calls.exchange_capture_mode)(&mut mode) }, "hipThreadExchangeStreamCaptureMode")?;
        let r = f();
        // SAFETY: as above, putting the caller's mode back.
        let _ = unsafe { (self.rt.calls.exchange_capture_mode)(&mut mode) };
        r
    }

    fn is_capturing(&self, stream: Stream) -> Result<bool> {
        let _g = self.enter(self.stream_device(stream, None)?)?;
        let (mut status, mut id) = (0 as c_int, 0u64);
        // SAFETY: writes one enum and one id (hipStreamIsCapturing is missing from ROCm 5.2's
        // library; the capture info says the same).
        self.rt.check(unsafe { (self.rt.calls.stream_capture_info)(raw(stream), &mut status, &mut id) }, "hipStreamGetCaptureInfo")?;
        Ok(status != 0)
    }
}

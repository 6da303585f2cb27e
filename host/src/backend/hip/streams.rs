//! Streams, events, copies and fills of the HIP backend, and the device work on a stream runs
//! on: a stream this backend made is on the device it was made for; the NULL stream and
//! `hipStreamPerThread` on the device of the memory involved (the communicator's), else the
//! current one; a caller's stream on the device `hipStreamGetDevice` names (ROCm 6), or the
//! current one where the runtime lacks it.

use std::ffi::{c_int, c_void};

use super::runtime::{Handle, HIP_ERROR_NOT_READY, HIP_SUCCESS};
use super::HipBackend;
use crate::backend::gpu_memory;
use crate::backend::{DevicePtr, Event, Stream};
use crate::error::{Error, Result};

/// `hipMemcpyDefault` for every copy: the runtime tells host from device memory by address
/// (unified addressing), so a copy may name host-mapped or registered memory on either side.
const MEMCPY_DEFAULT: c_int = 4;

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
    fn enter_for(&self, stream: Stream, ptrs: &[DevicePtr]) -> Result<super::DeviceGuard> {
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

pub(super) fn memset(b: &HipBackend, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()> {
    let in_op = |e: Error| e.context("memset");
    let _g = b.enter_for(stream, &[dst])?;
    gpu_memory::check_range(b, dst, bytes, "destination").map_err(in_op)?;
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the range was checked above.
    b.rt.check(unsafe { (b.rt.calls.memset_d8_async)(dst.0 as Handle, value, bytes, raw(stream)) }, "hipMemsetD8Async").map_err(in_op)
}

pub(super) fn copy(b: &HipBackend, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
    let in_op = |e: Error| e.context("copy");
    let (d, s, n) = (dst.0 as u128, src.0 as u128, bytes as u128);
    if dst != src && d < s + n && s < d + n {
        return Err(in_op(Error::invalid_argument(format!("{bytes} bytes from {src} to {dst}: the ranges overlap"))));
    }
    let _g = b.enter_for(stream, &[dst, src])?;
    gpu_memory::check_range(b, dst, bytes, "destination").map_err(in_op)?;
    gpu_memory::check_range(b, src, bytes, "source").map_err(in_op)?;
    if bytes == 0 || dst == src {
        return Ok(());
    }
    // SAFETY: both ranges were checked above.
    let r = unsafe { (b.rt.calls.memcpy_async)(dst.0 as Handle, src.0 as *const c_void, bytes, MEMCPY_DEFAULT, raw(stream)) };
    b.rt.check(r, "hipMemcpyAsync").map_err(in_op)
}

pub(super) fn copy_to_device(b: &HipBackend, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let _g = b.enter_for(stream, &[dst])?;
    gpu_memory::check_range(b, dst, src.len(), "copy_to_device destination")?;
    // SAFETY: `src` is a live slice until the stream synchronisation below; `dst` checked.
    let r = unsafe { (b.rt.calls.memcpy_async)(dst.0 as Handle, src.as_ptr().cast(), src.len(), MEMCPY_DEFAULT, raw(stream)) };
    b.rt.check(r, "hipMemcpyAsync(host to device)")?;
    // SAFETY: a stream of the current device (or a default one).
    b.rt.check(unsafe { (b.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
}

pub(super) fn copy_from_device(b: &HipBackend, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let _g = b.enter_for(stream, &[src])?;
    gpu_memory::check_range(b, src, dst.len(), "copy_from_device source")?;
    // SAFETY: `dst` is a live slice until the stream synchronisation below; `src` checked.
    let r = unsafe { (b.rt.calls.memcpy_async)(dst.as_mut_ptr().cast(), src.0 as *const c_void, dst.len(), MEMCPY_DEFAULT, raw(stream)) };
    b.rt.check(r, "hipMemcpyAsync(device to host)")?;
    // SAFETY: as above.
    b.rt.check(unsafe { (b.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
}

/// # Safety
/// As [`crate::backend::DeviceBackend::copy_from_pinned_async`]: `src` is pinned memory of
/// this backend that stays valid and unchanged until the copy has run.
pub(super) unsafe fn copy_from_pinned_async(b: &HipBackend, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let _g = b.enter_for(stream, &[dst])?;
    gpu_memory::check_range(b, dst, bytes, "copy destination")?;
    // SAFETY: the caller keeps `src` pinned and valid until the copy runs; `dst` checked.
    let r = unsafe { (b.rt.calls.memcpy_async)(dst.0 as Handle, src.cast(), bytes, MEMCPY_DEFAULT, raw(stream)) };
    b.rt.check(r, "hipMemcpyAsync(pinned host to device)")
}

/// `hipLaunchHostFunc` (untested: no AMD GPU here).
///
/// # Safety
/// As `DeviceBackend::launch_host_callback`: `callback` outlives every run of it.
pub(super) unsafe fn launch_host_callback(b: &HipBackend, callback: &std::sync::Arc<crate::backend::HostCallback>, stream: Stream) -> Result<()> {
    let _g = b.enter_for(stream, &[])?;
    let user = std::sync::Arc::as_ptr(callback) as *mut c_void;
    let Some(launch) = b.rt.launch_host_func else {
        return Err(Error::system(format!(
            "{}: this HIP runtime lacks hipLaunchHostFunc, which a captured launch that receives over the network \
             needs (to tell the proxy of each replay's receives); update ROCm, or capture no network work",
            b.rt.path.display()
        )));
    };
    // SAFETY: the trampoline reads `user` as the callback, which the caller keeps alive.
    b.rt.check(unsafe { launch(raw(stream), crate::backend::HostCallback::trampoline, user) }, "hipLaunchHostFunc")
}

pub(super) fn stream_write_u32(b: &HipBackend, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
    let _g = b.enter_for(stream, &[addr])?;
    // SAFETY: a 4-byte device address the caller maps; ordered after the stream's earlier work.
    b.rt.check(unsafe { (b.rt.calls.stream_write_value32)(raw(stream), addr.0 as Handle, value, 0) }, "hipStreamWriteValue32")
}

pub(super) fn stream_wait_u32(b: &HipBackend, addr: DevicePtr, value: u32, stream: Stream) -> Result<()> {
    let _g = b.enter_for(stream, &[addr])?;
    // SAFETY: as above. hipStreamWaitValueGte (0), the whole word: `word >= value`, without
    // CUDA's wrap-around (see the module docs of `backend::hip`).
    b.rt.check(unsafe { (b.rt.calls.stream_wait_value32)(raw(stream), addr.0 as Handle, value, 0, u32::MAX) }, "hipStreamWaitValue32")
}

pub(super) fn create_stream(b: &HipBackend, device: usize) -> Result<Stream> {
    let _g = b.enter(device)?;
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: writes one handle; hipStreamNonBlocking.
    b.rt.check(unsafe { (b.rt.calls.stream_create)(&mut s, 1) }, "hipStreamCreateWithFlags")?;
    let stream = Stream(s as u64);
    b.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.0, device);
    Ok(stream)
}

pub(super) fn destroy_stream(b: &HipBackend, stream: Stream) -> Result<()> {
    if stream.is_default() {
        return Err(Error::invalid_argument("destroy_stream: the default stream cannot be destroyed"));
    }
    let device = b.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.0).ok_or_else(|| {
        Error::invalid_argument(format!("destroy_stream: stream {:#x} is not a live stream of this backend", stream.0))
    })?;
    let _g = b.enter(device)?;
    // SAFETY: a stream we created, forgotten above.
    b.rt.check(unsafe { (b.rt.calls.stream_destroy)(raw(stream)) }, "hipStreamDestroy")
}

pub(super) fn synchronize(b: &HipBackend, stream: Stream) -> Result<()> {
    let _g = b.enter(b.stream_device(stream, None)?)?;
    // SAFETY: a stream of the current device.
    b.rt.check(unsafe { (b.rt.calls.stream_synchronize)(raw(stream)) }, "hipStreamSynchronize")
}

pub(super) fn query(b: &HipBackend, stream: Stream) -> Result<bool> {
    let _g = b.enter(b.stream_device(stream, None)?)?;
    // SAFETY: as above.
    b.done(unsafe { (b.rt.calls.stream_query)(raw(stream)) }, "hipStreamQuery")
}

pub(super) fn create_event(b: &HipBackend, device: usize) -> Result<Event> {
    let _g = b.enter(device)?;
    let mut e: Handle = std::ptr::null_mut();
    // SAFETY: writes one handle; hipEventDisableTiming.
    b.rt.check(unsafe { (b.rt.calls.event_create)(&mut e, 0x2) }, "hipEventCreateWithFlags")?;
    let event = Event(e as u64);
    b.events.lock().unwrap_or_else(|p| p.into_inner()).insert(event.0, device);
    Ok(event)
}

pub(super) fn record_event(b: &HipBackend, event: Event, stream: Stream) -> Result<()> {
    let device = b.event_device(event, "record_event")?;
    let _g = b.enter(b.stream_device(stream, Some(device))?)?;
    // SAFETY: a live event of ours and a stream of the current device.
    b.rt.check(unsafe { (b.rt.calls.event_record)(event.0 as Handle, raw(stream)) }, "hipEventRecord")
}

pub(super) fn stream_wait_event(b: &HipBackend, stream: Stream, event: Event) -> Result<()> {
    let device = b.event_device(event, "stream_wait_event")?;
    let _g = b.enter(b.stream_device(stream, Some(device))?)?;
    // SAFETY: as above; waiting on an event of another device is allowed.
    b.rt.check(unsafe { (b.rt.calls.stream_wait_event)(raw(stream), event.0 as Handle, 0) }, "hipStreamWaitEvent")
}

pub(super) fn query_event(b: &HipBackend, event: Event) -> Result<bool> {
    let _g = b.enter(b.event_device(event, "query_event")?)?;
    // SAFETY: a live event of ours.
    b.done(unsafe { (b.rt.calls.event_query)(event.0 as Handle) }, "hipEventQuery")
}

pub(super) fn synchronize_event(b: &HipBackend, event: Event) -> Result<()> {
    let _g = b.enter(b.event_device(event, "synchronize_event")?)?;
    // SAFETY: a live event of ours.
    b.rt.check(unsafe { (b.rt.calls.event_synchronize)(event.0 as Handle) }, "hipEventSynchronize")
}

pub(super) fn destroy_event(b: &HipBackend, event: Event) -> Result<()> {
    let device = b.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event.0).ok_or_else(|| {
        Error::invalid_argument(format!("destroy_event: event {:#x} is not a live event of this backend", event.0))
    })?;
    let _g = b.enter(device)?;
    // SAFETY: a live event of ours, forgotten above.
    b.rt.check(unsafe { (b.rt.calls.event_destroy)(event.0 as Handle) }, "hipEventDestroy")
}

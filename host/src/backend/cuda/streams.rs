//! [`Streams`] of the CUDA backend (streams, events, stream capture), and where work on a
//! stream runs (its context and device).

use cudarc::driver::sys;

use super::driver::{self, check, Ctx, CtxGuard};
use super::{CudaBackend, Place};
use crate::backend::{DevicePtr, Event, ForeignEvents, Stream, Streams};
use crate::error::{Error, Result};

pub(super) fn raw_stream(stream: Stream) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

/// NULL, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: streams of whatever context is
/// current.
pub(super) fn is_default_like(stream: Stream) -> bool {
    stream.0 <= 2
}

impl CudaBackend {
    /// Where work on `stream` runs; `hint` is the device of the memory involved (or the
    /// communicator's), which a default stream goes to; without it, the current context's.
    pub(super) fn place(&self, stream: Stream, hint: Option<usize>) -> Result<Place> {
        if let Some(&device) = self.streams.lock().unwrap_or_else(|p| p.into_inner()).get(&stream.0) {
            return Ok(Place { ctx: self.primary(device)?, device });
        }
        let ctx = if is_default_like(stream) {
            // A default stream names no device: the memory's (the communicator's), as NCCL
            // sets the communicator's device before it enqueues; else the current one.
            if let Some(device) = hint {
                return Ok(Place { ctx: self.primary(device)?, device });
            }
            let cur = driver::current()?;
            if cur.is_null() {
                return self.primary(0).map(|ctx| Place { ctx, device: 0 });
            }
            Ctx(cur)
        } else {
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one handle; an invalid stream is reported by the driver.
            check(unsafe { sys::cuStreamGetCtx(raw_stream(stream), &mut ctx) }, "cuStreamGetCtx").map_err(|e| {
                Error::invalid_argument(format!("stream {:#x} is not a live CUDA stream ({})", stream.0, e.message))
            })?;
            Ctx(ctx)
        };
        Ok(Place { ctx, device: self.ctx_device(ctx)? })
    }

    /// Where a copy or fill with these pointers runs.
    pub(super) fn place_for(&self, stream: Stream, ptrs: &[DevicePtr]) -> Result<Place> {
        let hint = if is_default_like(stream) { ptrs.iter().find_map(|p| self.tracked_device(*p)) } else { None };
        self.place(stream, hint)
    }

    pub(super) fn event_device(&self, event: Event, op: &str) -> Result<usize> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).get(&event.0).copied().ok_or_else(|| {
            Error::invalid_argument(format!("{op}: event {:#x} is not a live event of this backend", event.0))
        })
    }
}

impl Streams for CudaBackend {
    fn create_stream(&self, device: usize) -> Result<Stream> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
            "cuStreamCreate",
        )?;
        let stream = Stream(s as usize as u64);
        self.streams.lock().unwrap_or_else(|p| p.into_inner()).insert(stream.0, device);
        Ok(stream)
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream.is_default() {
            return Err(Error::invalid_argument("destroy_stream: the default stream cannot be destroyed"));
        }
        let device = self.streams.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.0).ok_or_else(|| {
            Error::invalid_argument(format!(
                "destroy_stream: stream {:#x} is not a live stream of this backend",
                stream.0
            ))
        })?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a stream we created, forgotten above.
        check(unsafe { sys::cuStreamDestroy_v2(raw_stream(stream)) }, "cuStreamDestroy")
    }

    fn synchronize(&self, stream: Stream) -> Result<()> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: a stream of the current context.
        check(unsafe { sys::cuStreamSynchronize(raw_stream(stream)) }, "cuStreamSynchronize")
    }

    fn query(&self, stream: Stream) -> Result<bool> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: as above.
        match unsafe { sys::cuStreamQuery(raw_stream(stream)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::cuda_error(r, "cuStreamQuery")),
        }
    }

    fn create_event(&self, device: usize) -> Result<Event> {
        let _g = CtxGuard::enter(self.primary(device)?)?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(
            unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        let event = Event(e as usize as u64);
        self.events.lock().unwrap_or_else(|p| p.into_inner()).insert(event.0, device);
        Ok(event)
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let device = self.event_device(event, "record_event")?;
        let place = self.place(stream, Some(device))?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: a live event of ours and a stream of the current context.
        check(unsafe { sys::cuEventRecord(event.0 as usize as sys::CUevent, raw_stream(stream)) }, "cuEventRecord")
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let device = self.event_device(event, "stream_wait_event")?;
        let place = self.place(stream, Some(device))?;
        let _g = CtxGuard::enter(place.ctx)?;
        // SAFETY: as above; waiting on an event of another device is allowed.
        check(
            unsafe { sys::cuStreamWaitEvent(raw_stream(stream), event.0 as usize as sys::CUevent, 0) },
            "cuStreamWaitEvent",
        )
    }

    fn query_event(&self, event: Event) -> Result<bool> {
        let device = self.event_device(event, "query_event")?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours.
        match unsafe { sys::cuEventQuery(event.0 as usize as sys::CUevent) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::cuda_error(r, "cuEventQuery")),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        let device = self.event_device(event, "synchronize_event")?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours.
        check(unsafe { sys::cuEventSynchronize(event.0 as usize as sys::CUevent) }, "cuEventSynchronize")
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        let device = self.events.lock().unwrap_or_else(|p| p.into_inner()).remove(&event.0).ok_or_else(|| {
            Error::invalid_argument(format!("destroy_event: event {:#x} is not a live event of this backend", event.0))
        })?;
        let _g = CtxGuard::enter(self.primary(device)?)?;
        // SAFETY: a live event of ours, forgotten above.
        check(unsafe { sys::cuEventDestroy_v2(event.0 as usize as sys::CUevent) }, "cuEventDestroy")
    }

    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps a thread-local setting; restored below.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        let r = f();
        // SAFETY: as above, putting the caller's mode back.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        r
    }

    fn is_capturing(&self, stream: Stream) -> Result<bool> {
        let place = self.place(stream, None)?;
        let _g = CtxGuard::enter(place.ctx)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: writes one enum.
        check(unsafe { sys::cuStreamIsCapturing(raw_stream(stream), &mut status) }, "cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

impl ForeignEvents for CudaBackend {
    fn record_foreign_event(&self, event: Event, stream: Stream) -> Result<()> {
        let place = self.place(stream, None)?;
        let capturing = self.is_capturing(stream)?;
        let _g = CtxGuard::enter(place.ctx)?;
        let e = event.0 as usize as sys::CUevent;
        if capturing {
            // A plain record under capture only orders the capture and is not replayed; an
            // external record is a graph node that records the event at each replay.
            let external = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
            // SAFETY: the caller's live event (the driver reports a bad one) and a stream of
            // the current context.
            return check(unsafe { sys::cuEventRecordWithFlags(e, raw_stream(stream), external) }, "cuEventRecordWithFlags");
        }
        // SAFETY: as above.
        check(unsafe { sys::cuEventRecord(e, raw_stream(stream)) }, "cuEventRecord")
    }
}

//! The `stream=` argument of GPU operations: `None` (the legacy default stream), an int (a
//! raw `cudaStream_t` / `hipStream_t`), or an object with `.cuda_stream` (torch.cuda.Stream)
//! or `.ptr` (cupy). Host-memory operations use their communicator's own stream instead.

use pyo3::prelude::*;
use rustccl::backend::Stream;

use crate::errors::invalid_argument;

/// The raw stream handle `stream` names (0: the legacy default stream).
pub fn parse(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
    let Some(s) = stream.filter(|s| !s.is_none()) else {
        return Ok(Stream::DEFAULT);
    };
    let handle = if let Ok(v) = s.extract::<u64>() {
        v
    } else if let Ok(v) = s.getattr("cuda_stream") {
        v.extract::<u64>()?
    } else if let Ok(v) = s.getattr("ptr") {
        v.extract::<u64>()?
    } else {
        return Err(invalid_argument(
            "stream: pass None, an int (a raw cudaStream_t), a torch.cuda.Stream or a cupy stream",
        ));
    };
    Ok(Stream(handle))
}

/// DLPack's `stream` argument for a consumer that will use `stream` (1 is DLPack's name for
/// the legacy default stream, which the raw handle 0 means here).
pub fn dlpack_stream(stream: Stream) -> i64 {
    if stream.0 == 0 {
        1
    } else {
        stream.0 as i64
    }
}

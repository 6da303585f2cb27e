//! rustccl's errors as Python exceptions: `RustcclError` carries the `ncclResult_t` code
//! (`.result`), its NCCL name (`.result_name`) and the message (`.message`); one subclass per
//! code, so Python code can catch `InvalidArgumentError` or `RemoteError` alone.

use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{create_exception, exceptions::PyException};
use rustccl::error::ResultCode;

create_exception!(rustccl, RustcclError, PyException, "A rustccl failure: .result (ncclResult_t), .result_name, .message.");
create_exception!(rustccl, UnhandledCudaError, RustcclError, "ncclUnhandledCudaError: a CUDA (or HIP) call failed.");
create_exception!(rustccl, RustcclSystemError, RustcclError, "ncclSystemError: a system call, socket or file failed.");
create_exception!(rustccl, InternalError, RustcclError, "ncclInternalError: a bug in rustccl.");
create_exception!(rustccl, InvalidArgumentError, RustcclError, "ncclInvalidArgument: a bad argument (buffer, size, root, type).");
create_exception!(rustccl, InvalidUsageError, RustcclError, "ncclInvalidUsage: a call the communicator's state does not allow.");
create_exception!(rustccl, RemoteError, RustcclError, "ncclRemoteError: another rank failed or left.");
create_exception!(rustccl, InProgressError, RustcclError, "ncclInProgress: non-blocking work still runs.");
create_exception!(rustccl, RustcclTimeoutError, RustcclError, "ncclTimeout: an operation ran past its time limit.");

/// NCCL's name of a result code (`ncclInvalidArgument`, ...).
pub fn result_name(code: ResultCode) -> &'static str {
    match code {
        ResultCode::Success => "ncclSuccess",
        ResultCode::UnhandledCudaError => "ncclUnhandledCudaError",
        ResultCode::SystemError => "ncclSystemError",
        ResultCode::InternalError => "ncclInternalError",
        ResultCode::InvalidArgument => "ncclInvalidArgument",
        ResultCode::InvalidUsage => "ncclInvalidUsage",
        ResultCode::RemoteError => "ncclRemoteError",
        ResultCode::InProgress => "ncclInProgress",
        ResultCode::Timeout => "ncclTimeout",
    }
}

fn class_of(py: Python<'_>, code: ResultCode) -> Bound<'_, PyType> {
    match code {
        ResultCode::UnhandledCudaError => py.get_type::<UnhandledCudaError>(),
        ResultCode::SystemError => py.get_type::<RustcclSystemError>(),
        ResultCode::InternalError => py.get_type::<InternalError>(),
        ResultCode::InvalidArgument => py.get_type::<InvalidArgumentError>(),
        ResultCode::InvalidUsage => py.get_type::<InvalidUsageError>(),
        ResultCode::RemoteError => py.get_type::<RemoteError>(),
        ResultCode::InProgress => py.get_type::<InProgressError>(),
        ResultCode::Timeout => py.get_type::<RustcclTimeoutError>(),
        ResultCode::Success => py.get_type::<RustcclError>(),
    }
}

/// The exception object for `e` (raised by [`to_py`], returned by `async_error()`).
pub fn exception<'py>(py: Python<'py>, e: &rustccl::Error) -> PyResult<Bound<'py, PyAny>> {
    let exc = class_of(py, e.code).call1((e.message.clone(),))?;
    exc.setattr("result", e.code as i32)?;
    exc.setattr("result_name", result_name(e.code))?;
    exc.setattr("message", e.message.clone())?;
    Ok(exc)
}

/// `e` as the Python exception to raise.
pub fn to_py(e: rustccl::Error) -> PyErr {
    Python::attach(|py| match exception(py, &e) {
        Ok(exc) => PyErr::from_value(exc),
        Err(failed) => failed,
    })
}

/// An `InvalidArgumentError` for bad input from Python; `what` says what to pass instead.
pub fn invalid_argument(message: impl Into<String>) -> PyErr {
    to_py(rustccl::Error::invalid_argument(message.into()))
}

/// Converts rustccl's results into Python's.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for rustccl::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RustcclError", py.get_type::<RustcclError>())?;
    m.add("UnhandledCudaError", py.get_type::<UnhandledCudaError>())?;
    m.add("RustcclSystemError", py.get_type::<RustcclSystemError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("InvalidUsageError", py.get_type::<InvalidUsageError>())?;
    m.add("RemoteError", py.get_type::<RemoteError>())?;
    m.add("InProgressError", py.get_type::<InProgressError>())?;
    m.add("RustcclTimeoutError", py.get_type::<RustcclTimeoutError>())?;
    Ok(())
}

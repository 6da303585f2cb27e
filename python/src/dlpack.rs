//! DLPack (the `__dlpack__` / `__dlpack_device__` protocol of torch, cupy, numpy, jax) at the
//! FFI edge: the C structs of dlpack.h (unversioned, the default a producer gives), and the
//! consumer's side of the capsule: take the `DLManagedTensor` out of a capsule named
//! "dltensor", rename it "used_dltensor" (so the producer's capsule destructor leaves it
//! alone), and call its deleter when done with the memory.

use std::ffi::{c_void, CStr};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::invalid_argument;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLDeviceType` values rustccl takes.
pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
pub const DL_CUDA_HOST: i32 = 3;
pub const DL_ROCM: i32 = 10;
pub const DL_ROCM_HOST: i32 = 11;
pub const DL_CUDA_MANAGED: i32 = 13;

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";

/// A consumed DLPack tensor: its memory stays valid until this is dropped (the deleter runs).
pub struct Consumed {
    managed: *mut DlManagedTensor,
}

/// What a caller needs from a DLPack tensor.
pub struct Tensor {
    pub ptr: u64,
    pub elements: usize,
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
    pub c_contiguous: bool,
}

/// `obj.__dlpack_device__()`: `(device_type, device_id)`, or `None` if `obj` has no DLPack.
pub fn device_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack__")? || !obj.hasattr("__dlpack_device__")? {
        return Ok(None);
    }
    let (t, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    Ok(Some((t, id)))
}

/// Takes `obj`'s tensor through `obj.__dlpack__(stream=...)` (`stream`: DLPack's stream
/// argument for GPU tensors, `None` on the host).
pub fn consume(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> PyResult<(Consumed, Tensor)> {
    let py = obj.py();
    let capsule = match stream {
        Some(s) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item("stream", s)?;
            obj.call_method("__dlpack__", (), Some(&kwargs))?
        }
        None => obj.call_method0("__dlpack__")?,
    };
    // SAFETY: PyCapsule_IsValid accepts any object and only reads its type and name.
    let valid = unsafe { pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) } == 1;
    if !valid {
        return Err(invalid_argument(
            "__dlpack__() did not return an unused \"dltensor\" capsule; pass a tensor whose __dlpack__ follows the DLPack protocol",
        ));
    }
    // SAFETY: the capsule is valid and named "dltensor" (checked above): its pointer is a
    // DLManagedTensor the producer hands over.
    let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) } as *mut DlManagedTensor;
    if managed.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| invalid_argument("__dlpack__() returned an empty capsule")));
    }
    // SAFETY: renaming is how a consumer takes ownership (the producer's capsule destructor
    // then does not delete the tensor); the name is a 'static C string.
    if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), USED_DLTENSOR.as_ptr()) } != 0 {
        return Err(PyErr::take(py).unwrap_or_else(|| invalid_argument("could not take the DLPack capsule")));
    }
    let consumed = Consumed { managed };
    // SAFETY: `managed` is the producer's valid DLManagedTensor, owned by `consumed` until
    // its deleter runs; shape and strides hold `ndim` entries (strides may be NULL: C order).
    let t = unsafe { &(*managed).dl_tensor };
    let ndim = t.ndim.max(0) as usize;
    let shape: &[i64] = if ndim == 0 || t.shape.is_null() { &[] } else { unsafe { std::slice::from_raw_parts(t.shape, ndim) } };
    let elements = shape.iter().product::<i64>().max(0) as usize;
    let c_contiguous = t.strides.is_null() || {
        // SAFETY: as above, `ndim` strides (in elements).
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let shape_b: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        let strides_b: Vec<isize> = strides.iter().map(|&s| s as isize).collect();
        crate::pybuffer::is_c_contiguous(&shape_b, &strides_b, 1)
    };
    let tensor = Tensor {
        ptr: (t.data as u64).wrapping_add(t.byte_offset),
        elements,
        code: t.dtype.code,
        bits: t.dtype.bits,
        lanes: t.dtype.lanes,
        c_contiguous,
    };
    Ok((consumed, tensor))
}

impl Drop for Consumed {
    fn drop(&mut self) {
        // SAFETY: `managed` came from a capsule this consumer took over; its deleter (if any)
        // is called exactly once, as the protocol asks, while the GIL is held (producers such
        // as numpy release Python references in it).
        unsafe {
            if let Some(deleter) = (*self.managed).deleter {
                deleter(self.managed);
            }
        }
    }
}

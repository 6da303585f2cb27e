//! The buffer protocol (PEP 3118) at the FFI edge. PyO3's `PyBuffer` is typed by element and,
//! in an abi3 build for Python 3.9, compiled out (the protocol joined the stable ABI in 3.11),
//! so the two functions and `Py_buffer` are declared here: CPython has exported both with
//! this layout since 3.3, and 3.11 froze it.

use std::ffi::{c_char, c_int, c_void, CStr};

use pyo3::ffi::{PyObject, Py_ssize_t};
use pyo3::prelude::*;

#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: Py_ssize_t,
    itemsize: Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut Py_ssize_t,
    strides: *mut Py_ssize_t,
    suboffsets: *mut Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

/// `PyBUF_FORMAT | PyBUF_STRIDES` (`PyBUF_RECORDS_RO`): format and strides, read-only allowed
/// (writability is checked by the caller, with a message).
const PYBUF_RECORDS_RO: c_int = 0x0004 | 0x0010 | 0x0008;

/// An exported buffer, released on drop (with the GIL: the caller drops it while attached).
pub struct Exported {
    view: Box<PyBufferView>,
}

/// What a caller needs from an exported buffer.
pub struct View<'a> {
    pub ptr: *mut u8,
    pub bytes: usize,
    pub itemsize: usize,
    pub readonly: bool,
    pub format: &'a str,
    /// Whether the elements lie in C order without gaps.
    pub c_contiguous: bool,
}

impl Exported {
    /// Exports `obj`'s buffer; `None` (and no Python error left set) if it has none.
    pub fn of(obj: &Bound<'_, PyAny>) -> Option<Exported> {
        let mut view = Box::new(PyBufferView {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (we hold the GIL through its `Bound`), `view` points
        // at a `Py_buffer`-shaped struct that stays at one address (boxed) until released.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_RECORDS_RO) };
        if rc != 0 {
            // Not a buffer (or not exportable this way): clear the error, try DLPack next.
            drop(PyErr::take(obj.py()));
            return None;
        }
        Some(Exported { view })
    }

    pub fn view(&self) -> View<'_> {
        let v = &*self.view;
        let format = if v.format.is_null() {
            "B"
        } else {
            // SAFETY: a non-NULL format is a NUL-terminated string owned by the exporter
            // while the buffer is exported (until `self` is dropped).
            unsafe { CStr::from_ptr(v.format) }.to_str().unwrap_or("?")
        };
        let ndim = v.ndim.max(0) as usize;
        let (shape, strides): (&[Py_ssize_t], &[Py_ssize_t]) = if ndim == 0 || v.shape.is_null() {
            (&[], &[])
        } else {
            // SAFETY: with PyBUF_STRIDES the exporter fills `shape` (and `strides`, or leaves
            // it NULL for C order) with `ndim` entries, valid while exported.
            unsafe {
                (
                    std::slice::from_raw_parts(v.shape, ndim),
                    if v.strides.is_null() { &[] } else { std::slice::from_raw_parts(v.strides, ndim) },
                )
            }
        };
        let c_contiguous = v.suboffsets.is_null() && (strides.is_empty() || is_c_contiguous(shape, strides, v.itemsize as i64));
        View {
            ptr: v.buf as *mut u8,
            bytes: v.len.max(0) as usize,
            itemsize: v.itemsize.max(1) as usize,
            readonly: v.readonly != 0,
            format,
            c_contiguous,
        }
    }
}

/// Whether `shape`/`strides` (in bytes) lay the elements out in C order without gaps
/// (dimensions of one element may have any stride; an empty array is contiguous).
pub fn is_c_contiguous(shape: &[isize], strides: &[isize], itemsize: i64) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = itemsize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s as i64 != expected {
            return false;
        }
        expected *= n as i64;
    }
    true
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once;
        // buffers are dropped while the GIL is held (never inside `Python::detach`).
        unsafe { PyBuffer_Release(&mut *self.view) };
    }
}

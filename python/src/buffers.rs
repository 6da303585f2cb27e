//! Buffers from Python: objects with the buffer protocol (numpy arrays, bytearray,
//! memoryview), objects with DLPack (torch tensors, cupy arrays), and [`Buffer`]s made from
//! a raw address (`Buffer.from_ptr`, the torch backend's fast path). Each becomes a [`Buf`]:
//! an address, a count of elements, a data type and where the memory is, plus what keeps the
//! memory exported while an operation uses it.

use pyo3::prelude::*;
use rustccl::backend::BackendKind;
use rustccl::types::DataType;

use crate::dlpack;
use crate::dtype;
use crate::errors::invalid_argument;
use crate::pybuffer::Exported;

/// Where a buffer's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (also pinned host memory).
    Host,
    /// Memory of a GPU of `kind` (cuda or hip); `index` `None` when not said ("cuda").
    Device { kind: BackendKind, index: Option<i32> },
}

impl Memory {
    fn describe(self) -> String {
        match self {
            Memory::Host => "host memory".into(),
            Memory::Device { kind, index: Some(i) } => format!("{kind} device {i} memory"),
            Memory::Device { kind, index: None } => format!("{kind} device memory"),
        }
    }
}

/// A buffer given by address: `rustccl.Buffer.from_ptr(ptr, count, dtype, device="cpu")`.
#[pyclass(module = "rustccl._native", name = "Buffer", frozen)]
pub struct Buffer {
    ptr: u64,
    count: usize,
    dtype: DataType,
    memory: Memory,
}

#[pymethods]
impl Buffer {
    /// `count` elements of `dtype` at address `ptr` on `device` ("cpu", "cuda", "cuda:N",
    /// "hip:N"). The memory must stay valid while operations use it.
    #[staticmethod]
    #[pyo3(signature = (ptr, count, dtype, device = "cpu"))]
    fn from_ptr(ptr: u64, count: usize, dtype: &str, device: &str) -> PyResult<Buffer> {
        let dtype = dtype::from_name(dtype)?;
        let memory = parse_device(device)?;
        if ptr == 0 && count > 0 {
            return Err(invalid_argument("Buffer.from_ptr: ptr is 0 (NULL) with a non-zero count; pass the buffer's address"));
        }
        Ok(Buffer { ptr, count, dtype, memory })
    }

    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    #[getter]
    fn count(&self) -> usize {
        self.count
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        dtype::name(self.dtype)
    }

    #[getter]
    fn device(&self) -> String {
        match self.memory {
            Memory::Host => "cpu".into(),
            Memory::Device { kind, index: Some(i) } => format!("{kind}:{i}"),
            Memory::Device { kind, index: None } => kind.to_string(),
        }
    }

    fn __repr__(&self) -> String {
        format!("Buffer(ptr={:#x}, count={}, dtype={:?}, device={:?})", self.ptr, self.count, dtype::name(self.dtype), self.device())
    }
}

fn parse_device(device: &str) -> PyResult<Memory> {
    let bad = || invalid_argument(format!("device {device:?}: pass \"cpu\", \"cuda\", \"cuda:N\" or \"hip:N\""));
    let (name, index) = match device.split_once(':') {
        Some((n, i)) => (n, Some(i.trim().parse::<i32>().ok().filter(|&i| i >= 0).ok_or_else(bad)?)),
        None => (device, None),
    };
    match name.trim() {
        "cpu" if index.is_none() => Ok(Memory::Host),
        "cuda" => Ok(Memory::Device { kind: BackendKind::Cuda, index }),
        "hip" | "rocm" => Ok(Memory::Device { kind: BackendKind::Hip, index }),
        _ => Err(bad()),
    }
}

/// What keeps a buffer's memory exported while an operation uses it; dropped with the GIL.
pub enum Keep {
    Nothing,
    Exported(#[allow(dead_code)] Exported),
    Dlpack(#[allow(dead_code)] dlpack::Consumed),
}

/// A resolved buffer.
pub struct Buf {
    pub ptr: u64,
    pub count: usize,
    pub dtype: DataType,
    pub memory: Memory,
    pub readonly: bool,
    pub keep: Keep,
}

impl Buf {
    /// Refuses a read-only buffer as an operation's output.
    pub fn writable(&self, what: &str) -> PyResult<()> {
        if self.readonly {
            return Err(invalid_argument(format!("{what} is read-only but the operation writes it; pass a writable buffer")));
        }
        Ok(())
    }

    pub fn describe_memory(&self) -> String {
        self.memory.describe()
    }
}

/// `obj` as a buffer (`what` names it in messages: "sendbuf", ...). `dlpack_stream` is the
/// stream a GPU tensor's producer is asked to order its work before (DLPack's `stream`).
pub fn resolve(obj: &Bound<'_, PyAny>, what: &str, dlpack_stream: i64) -> PyResult<Buf> {
    if let Ok(b) = obj.cast::<Buffer>() {
        let b = b.get();
        return Ok(Buf { ptr: b.ptr, count: b.count, dtype: b.dtype, memory: b.memory, readonly: false, keep: Keep::Nothing });
    }
    if let Some(exported) = Exported::of(obj) {
        let v = exported.view();
        if !v.c_contiguous {
            return Err(invalid_argument(format!(
                "{what} is not C-contiguous; pass a contiguous array (numpy.ascontiguousarray(a), a.copy())"
            )));
        }
        let dtype = dtype::from_format(v.format, v.itemsize).map_err(|e| prefix(obj.py(), e, what))?;
        let (ptr, count, readonly) = (v.ptr as u64, v.bytes / v.itemsize, v.readonly);
        return Ok(Buf { ptr, count, dtype, memory: Memory::Host, readonly, keep: Keep::Exported(exported) });
    }
    let Some((device_type, device_id)) = dlpack::device_of(obj)? else {
        return Err(invalid_argument(format!(
            "{what} of type {} is not a buffer: pass a numpy array, a torch tensor, a cupy array, a bytearray or memoryview, \
             or rustccl.Buffer.from_ptr(...)",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )));
    };
    let memory = match device_type {
        dlpack::DL_CPU | dlpack::DL_CUDA_HOST | dlpack::DL_ROCM_HOST => Memory::Host,
        dlpack::DL_CUDA | dlpack::DL_CUDA_MANAGED => Memory::Device { kind: BackendKind::Cuda, index: Some(device_id) },
        dlpack::DL_ROCM => Memory::Device { kind: BackendKind::Hip, index: Some(device_id) },
        other => {
            return Err(invalid_argument(format!(
                "{what} lives on DLPack device type {other}, which rustccl cannot use; pass host, CUDA or ROCm memory"
            )))
        }
    };
    let stream = (memory != Memory::Host).then_some(dlpack_stream);
    let (consumed, t) = dlpack::consume(obj, stream)?;
    if !t.c_contiguous {
        return Err(invalid_argument(format!("{what} is not contiguous; pass a contiguous tensor (tensor.contiguous())")));
    }
    let dtype = dtype::from_dlpack(t.code, t.bits, t.lanes).map_err(|e| prefix(obj.py(), e, what))?;
    // DLPack has no read-only flag before its versioned form: a tensor is taken as writable.
    Ok(Buf { ptr: t.ptr, count: t.elements, dtype, memory, readonly: false, keep: Keep::Dlpack(consumed) })
}

/// `e` with "`what`: " before its message (the type errors do not know which buffer).
fn prefix(py: Python<'_>, e: PyErr, what: &str) -> PyErr {
    let message = e.value(py).getattr("message").and_then(|m| m.extract::<String>()).unwrap_or_default();
    invalid_argument(format!("{what}: {message}"))
}

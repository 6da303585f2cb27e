//! `rustccl.Communicator`: one rank's communicator, its collectives on Python buffers, and its
//! lifecycle. Thin over the `rustccl` crate's raw API: each call resolves its buffers
//! (`buffers`), checks what Python can get wrong (sizes, types, roots, read-only outputs) with
//! messages that say what to pass, and runs the raw call with the GIL released.
//!
//! Completion: on the host backend a call returns once its operation has completed (its
//! stream, one per communicator, is synchronized and the host buffers' registrations end);
//! in a group, at the outermost group end. On GPU memory the operation is enqueued on the
//! caller's stream and the call returns at once, as NCCL's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustccl::backend::{BackendKind, DeviceBackend, DevicePtr, Stream};
use rustccl::config::CommConfig;
use rustccl::error::ResultCode;
use rustccl::typed::host_mem::{self, HostHold};
use rustccl::types::DataType;
use rustccl::{Communicator, ReduceOp, ShrinkFlags};

use crate::buffers::{self, Buf, Keep, Memory};
use crate::errors::{exception, invalid_argument, to_py, IntoPy};
use crate::group;
use crate::streams;

/// `rustccl.UniqueId`: what every rank passes to make one communicator; picklable,
/// `bytes(uid)` gives its 128 bytes.
#[pyclass(module = "rustccl._native", name = "UniqueId", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyUniqueId {
    pub id: rustccl::UniqueId,
}

#[pymethods]
impl PyUniqueId {
    #[staticmethod]
    fn from_bytes(b: &[u8]) -> PyResult<PyUniqueId> {
        Ok(PyUniqueId { id: rustccl::UniqueId::from_bytes(b).py_err()? })
    }

    #[staticmethod]
    fn from_hex(s: &str) -> PyResult<PyUniqueId> {
        Ok(PyUniqueId { id: rustccl::UniqueId::from_hex(s).py_err()? })
    }

    fn hex(&self) -> String {
        self.id.to_hex()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.id.as_bytes())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let from_bytes = slf.get_type().getattr("from_bytes")?;
        Ok((from_bytes, (PyBytes::new(slf.py(), slf.get().id.as_bytes()),)))
    }

    fn __repr__(&self) -> String {
        format!("UniqueId({}...)", &self.id.to_hex()[..16])
    }
}

/// `rustccl.get_unique_id()`: a new id; this process becomes the rendezvous root.
#[pyfunction]
pub fn get_unique_id(py: Python<'_>) -> PyResult<PyUniqueId> {
    Ok(PyUniqueId { id: py.detach(rustccl::get_unique_id).py_err()? })
}

fn unique_id(obj: &Bound<'_, PyAny>) -> PyResult<rustccl::UniqueId> {
    if let Ok(u) = obj.cast::<PyUniqueId>() {
        return Ok(u.get().id);
    }
    if let Ok(b) = obj.extract::<Vec<u8>>() {
        if !obj.is_instance_of::<pyo3::types::PyString>() {
            return rustccl::UniqueId::from_bytes(&b).py_err();
        }
    }
    if let Ok(s) = obj.extract::<String>() {
        return rustccl::UniqueId::from_hex(&s).py_err();
    }
    Err(invalid_argument("unique_id: pass a rustccl.UniqueId (from get_unique_id), its 128 bytes, or its hex text"))
}

fn backend_kind(name: Option<&str>) -> PyResult<Option<BackendKind>> {
    match name {
        None => Ok(None),
        Some(n) => BackendKind::from_name(n)
            .map(Some)
            .ok_or_else(|| invalid_argument(format!("backend {n:?}: pass None (RUSTCCL_BACKEND or automatic), \"host\", \"cuda\" or \"hip\""))),
    }
}

fn reduce_op(op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    let name: String = match op.extract::<String>() {
        Ok(s) => s,
        Err(_) => op.getattr("value").and_then(|v| v.extract()).map_err(|_| invalid_argument("op: pass \"sum\", \"prod\", \"max\", \"min\", \"avg\" or a rustccl.ReduceOp"))?,
    };
    match name.to_ascii_lowercase().as_str() {
        "sum" => Ok(ReduceOp::Sum),
        "prod" => Ok(ReduceOp::Prod),
        "max" => Ok(ReduceOp::Max),
        "min" => Ok(ReduceOp::Min),
        "avg" => Ok(ReduceOp::Avg),
        _ => Err(invalid_argument(format!("unknown op {name:?}: pass \"sum\", \"prod\", \"max\", \"min\" or \"avg\""))),
    }
}

/// `rustccl.Communicator`.
#[pyclass(module = "rustccl._native", name = "Communicator", frozen)]
pub struct PyCommunicator {
    comm: Arc<Communicator>,
    backend: Arc<dyn DeviceBackend>,
    /// The stream of host-memory operations (host backend), made once.
    host_stream: Option<Stream>,
    /// The device it was made for (children are made for it too, even after an abort).
    device: i32,
    /// Set once destroyed or aborted (nothing left to do on garbage collection).
    closed: AtomicBool,
}

impl PyCommunicator {
    /// `device`: the communicator's (not asked of it: a non-blocking one may still be in init).
    fn wrap(comm: Communicator, device: i32) -> PyResult<PyCommunicator> {
        let backend = Arc::clone(comm.backend());
        let host_stream = if backend.capabilities().host_addressable {
            Some(backend.create_stream(device.max(0) as usize).py_err()?)
        } else {
            None
        };
        Ok(PyCommunicator { comm: Arc::new(comm), backend, host_stream, device, closed: AtomicBool::new(false) })
    }

    fn is_host(&self) -> bool {
        self.host_stream.is_some()
    }

    fn size_i(&self) -> PyResult<i32> {
        self.comm.count().py_err()
    }

    fn rank_i(&self) -> PyResult<i32> {
        self.comm.user_rank().py_err()
    }

    fn check_rank(&self, r: i64, what: &str) -> PyResult<i32> {
        let n = self.size_i()?;
        if r < 0 || r >= n as i64 {
            return Err(invalid_argument(format!("{what} {r} is not a rank of this communicator: pass 0..{}", n - 1)));
        }
        Ok(r as i32)
    }

    /// The stream an operation uses, and DLPack's name for it.
    fn stream(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
        match self.host_stream {
            // Host memory: the communicator's own stream (a caller's GPU stream means nothing here).
            Some(s) => Ok(s),
            None => streams::parse(stream),
        }
    }

    fn resolve(&self, obj: &Bound<'_, PyAny>, what: &str, stream: Stream) -> PyResult<Buf> {
        let b = buffers::resolve(obj, what, streams::dlpack_stream(stream))?;
        let kind = self.backend.kind();
        let fits = match b.memory {
            Memory::Host => self.is_host(),
            Memory::Device { kind: k, index } => {
                k == kind && index.is_none_or(|i| self.comm.device().map(|d| d == i).unwrap_or(true))
            }
        };
        if !fits {
            let instead = if self.is_host() {
                "copy it to host memory (tensor.cpu(), cupy.asnumpy)".to_string()
            } else {
                format!("move it to {kind} device {} (tensor.to(...))", self.comm.device().unwrap_or(0))
            };
            return Err(invalid_argument(format!(
                "{what} is {} but this communicator runs on the {kind} backend (device {}); {instead}",
                b.describe_memory(),
                self.comm.device().unwrap_or(0)
            )));
        }
        Ok(b)
    }

    /// Runs `op` on the addresses of `bufs` (`None`: NULL, a buffer this rank does not use),
    /// then completes as the module doc says.
    fn run<'py>(
        &self,
        py: Python<'py>,
        bufs: Vec<Option<Buf>>,
        stream: Stream,
        op: impl FnOnce(&Communicator, &[DevicePtr], Stream) -> rustccl::Result<()> + Send,
    ) -> PyResult<()> {
        let mut holds: Vec<HostHold> = Vec::new();
        let mut ptrs = Vec::with_capacity(bufs.len());
        let mut keep: Vec<Keep> = Vec::new();
        for b in bufs {
            let Some(b) = b else {
                ptrs.push(DevicePtr::NULL);
                continue;
            };
            if b.memory == Memory::Host {
                let bytes = b.count * b.dtype.size();
                // SAFETY: the memory is exported (buffer protocol / DLPack, kept in `keep`) or
                // promised valid by `Buffer.from_ptr`'s caller until the operation has
                // completed, which is before `holds` is dropped: at the end of this call, or
                // at the group's end (`group::defer`).
                let (p, h) = unsafe { host_mem::hold(&self.backend, b.ptr as *const u8, bytes) }.py_err()?;
                holds.extend(h);
                ptrs.push(p);
            } else {
                ptrs.push(DevicePtr(b.ptr));
            }
            keep.push(b.keep);
        }
        let comm = &self.comm;
        let result = py.detach(|| op(comm, &ptrs, stream));
        if rustccl::coll::group::in_group() {
            result.map_err(to_py)?;
            group::defer(holds, keep, self.host_stream.map(|s| (Arc::clone(&self.comm), s)));
            return Ok(());
        }
        let done = match result {
            Err(e) if e.code == ResultCode::InProgress && !self.is_host() => Ok(()),
            Err(e) if e.code == ResultCode::InProgress => py.detach(|| comm.wait_idle()),
            other => other,
        };
        let done = match (done, self.host_stream) {
            (Ok(()), Some(s)) => py.detach(|| self.backend.synchronize(s)),
            (other, _) => other,
        };
        drop(holds);
        drop(keep);
        done.map_err(to_py)
    }

    /// An error of this call's arguments: also cancels the calling thread's group (as the
    /// C API does), so its end fails instead of running part of it.
    fn refuse(&self, e: PyErr) -> PyErr {
        if rustccl::coll::group::in_group() {
            rustccl::coll::cancel_group(&rustccl::Error::invalid_argument(Python::attach(|py| e.value(py).to_string())));
        }
        e
    }

    fn same_dtype(a: &Buf, b: &Buf) -> PyResult<DataType> {
        if a.dtype != b.dtype {
            return Err(invalid_argument(format!(
                "sendbuf holds {} and recvbuf {}: pass buffers of one data type",
                crate::dtype::name(a.dtype),
                crate::dtype::name(b.dtype)
            )));
        }
        Ok(a.dtype)
    }
}

/// `expected` elements where `got` were given.
fn size_error(what: &str, got: usize, expected: usize, why: &str) -> PyErr {
    invalid_argument(format!("{what} has {got} elements but {expected} are needed ({why})"))
}

#[pymethods]
impl PyCommunicator {
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (nranks, unique_id, rank, *, device = 0, backend = None, blocking = true, op_timeout_ms = None))]
    fn new(
        py: Python<'_>,
        nranks: i32,
        unique_id: &Bound<'_, PyAny>,
        rank: i32,
        device: i32,
        backend: Option<&str>,
        blocking: bool,
        op_timeout_ms: Option<i32>,
    ) -> PyResult<PyCommunicator> {
        let id = self::unique_id(unique_id)?;
        let config = CommConfig {
            blocking: blocking as i32,
            op_timeout_ms: op_timeout_ms.unwrap_or(rustccl::config::UNDEF_INT),
            backend: backend_kind(backend)?,
            ..CommConfig::default()
        };
        let comm = py.detach(|| Communicator::init_rank_config(nranks, &id, rank, device, &config)).py_err()?;
        PyCommunicator::wrap(comm, device)
    }

    /// A communicator of every process of the job from the launcher's variables (torchrun,
    /// Slurm, Open MPI).
    #[staticmethod]
    #[pyo3(signature = (*, backend = None))]
    fn from_env(py: Python<'_>, backend: Option<&str>) -> PyResult<PyCommunicator> {
        let config = CommConfig { backend: backend_kind(backend)?, ..CommConfig::default() };
        let comm = py.detach(|| Communicator::from_env_config(&config)).py_err()?;
        let device = comm.device().py_err()?;
        PyCommunicator::wrap(comm, device)
    }

    #[getter]
    fn rank(&self) -> PyResult<i32> {
        self.rank_i()
    }

    #[getter]
    fn size(&self) -> PyResult<i32> {
        self.size_i()
    }

    #[getter]
    fn device(&self) -> PyResult<i32> {
        self.comm.device().py_err()
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.kind().name()
    }

    fn __repr__(&self) -> String {
        format!(
            "Communicator(rank={}, size={}, backend={:?}, device={})",
            self.comm.user_rank().unwrap_or(-1),
            self.comm.count().unwrap_or(-1),
            self.backend.kind().name(),
            self.comm.device().unwrap_or(-1)
        )
    }

    // --- Collectives ------------------------------------------------------------------------

    /// `ncclAllReduce`; `recvbuf=None`: in place.
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None, *, stream = None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, op) = (|| {
            let op = op.map_or(Ok(ReduceOp::Sum), reduce_op)?;
            let (send, recv) = self.pair(sendbuf, recvbuf, s)?;
            let (count, dtype) = (send.count, send.dtype);
            if let Some(r) = &recv {
                check_count("recvbuf", r, count, "as many as sendbuf")?;
            }
            Ok((vec![Some(send), recv], count, dtype, op))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.all_reduce(p[0], last(p), count, dtype, op, s))
    }

    /// `ncclBroadcast`: root's `sendbuf` into every rank's `recvbuf` (`None`: in place, the
    /// data lands in `sendbuf`).
    #[pyo3(signature = (sendbuf, recvbuf = None, root = 0, *, stream = None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, root) = (|| {
            let root = self.check_rank(root, "root")?;
            let (send, recv) = self.pair(sendbuf, recvbuf, s)?;
            let (count, dtype) = (recv.as_ref().unwrap_or(&send).count, send.dtype);
            if self.rank_i()? == root {
                check_count("sendbuf", &send, count, "as many as recvbuf")?;
            }
            Ok((vec![Some(send), recv], count, dtype, root))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.broadcast(p[0], last(p), count, dtype, root, s))
    }

    /// `ncclReduce`: the reduction of every rank's `sendbuf` into root's `recvbuf` (`None`:
    /// in place; only root's output is written).
    #[pyo3(signature = (sendbuf, recvbuf = None, op = None, root = 0, *, stream = None))]
    fn reduce(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, op, root) = (|| {
            let op = op.map_or(Ok(ReduceOp::Sum), reduce_op)?;
            let root = self.check_rank(root, "root")?;
            let me = self.rank_i()?;
            let (send, recv) = if me == root {
                self.pair(sendbuf, recvbuf, s)?
            } else {
                // Only root writes: another rank's recvbuf may be anything (or None).
                (self.resolve(sendbuf, "sendbuf", s)?, None)
            };
            let (count, dtype) = (send.count, send.dtype);
            if let Some(r) = &recv {
                check_count("recvbuf", r, count, "as many as sendbuf")?;
            }
            Ok((vec![Some(send), recv], count, dtype, op, root))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.reduce(p[0], last(p), count, dtype, op, root, s))
    }

    /// `ncclAllGather`: `recvbuf` gets every rank's `sendbuf` in rank order (size x sendbuf).
    #[pyo3(signature = (sendbuf, recvbuf, *, stream = None))]
    fn all_gather(&self, py: Python<'_>, sendbuf: &Bound<'_, PyAny>, recvbuf: &Bound<'_, PyAny>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype) = (|| {
            let n = self.size_i()? as usize;
            let (send, recv) = self.pair(sendbuf, Some(recvbuf), s)?;
            let recv = recv.expect("recvbuf given");
            let (count, dtype) = (send.count, send.dtype);
            check_count("recvbuf", &recv, count * n, &format!("{n} ranks x sendbuf's {count}"))?;
            Ok((vec![Some(send), Some(recv)], count, dtype))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.all_gather(p[0], p[1], count, dtype, s))
    }

    /// `ncclReduceScatter`: block `rank` of the reduction of every rank's `sendbuf` (size x
    /// recvbuf) into `recvbuf`.
    #[pyo3(signature = (sendbuf, recvbuf, op = None, *, stream = None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, op) = (|| {
            let op = op.map_or(Ok(ReduceOp::Sum), reduce_op)?;
            let n = self.size_i()? as usize;
            let (send, recv) = self.pair(sendbuf, Some(recvbuf), s)?;
            let recv = recv.expect("recvbuf given");
            let (count, dtype) = (recv.count, recv.dtype);
            check_count("sendbuf", &send, count * n, &format!("{n} ranks x recvbuf's {count}"))?;
            Ok((vec![Some(send), Some(recv)], count, dtype, op))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.reduce_scatter(p[0], p[1], count, dtype, op, s))
    }

    /// `ncclAlltoAll`: block `i` of `sendbuf` to rank `i`, block `i` of `recvbuf` from rank `i`
    /// (both size x block).
    #[pyo3(signature = (sendbuf, recvbuf, *, stream = None))]
    fn all_to_all(&self, py: Python<'_>, sendbuf: &Bound<'_, PyAny>, recvbuf: &Bound<'_, PyAny>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype) = (|| {
            let n = self.size_i()? as usize;
            let (send, recv) = self.pair(sendbuf, Some(recvbuf), s)?;
            let recv = recv.expect("recvbuf given");
            if send.count % n != 0 {
                return Err(invalid_argument(format!(
                    "sendbuf has {} elements, not a multiple of the {n} ranks: pass {n} equal blocks",
                    send.count
                )));
            }
            check_count("recvbuf", &recv, send.count, "as many as sendbuf")?;
            let (count, dtype) = (recv.count / n, recv.dtype);
            Ok((vec![Some(send), Some(recv)], count, dtype))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.all_to_all(p[0], p[1], count, dtype, s))
    }

    /// `ncclGather`: every rank's `sendbuf` into root's `recvbuf` (size x sendbuf), in rank
    /// order; other ranks may pass `recvbuf=None`.
    #[pyo3(signature = (sendbuf, recvbuf, root, *, stream = None))]
    fn gather(
        &self,
        py: Python<'_>,
        sendbuf: &Bound<'_, PyAny>,
        recvbuf: Option<&Bound<'_, PyAny>>,
        root: i64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, root) = (|| {
            let root = self.check_rank(root, "root")?;
            let n = self.size_i()? as usize;
            let me = self.rank_i()?;
            let send = self.resolve(sendbuf, "sendbuf", s)?;
            let (count, dtype) = (send.count, send.dtype);
            let recv = if me == root {
                let r = recvbuf.ok_or_else(|| invalid_argument("recvbuf is None on the root: pass a buffer of size x sendbuf"))?;
                let r = self.resolve(r, "recvbuf", s)?;
                r.writable("recvbuf")?;
                Self::same_dtype(&send, &r)?;
                check_count("recvbuf", &r, count * n, &format!("{n} ranks x sendbuf's {count}"))?;
                Some(r)
            } else {
                None
            };
            Ok((vec![Some(send), recv], count, dtype, root))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.gather(p[0], p[1], count, dtype, root, s))
    }

    /// `ncclScatter`: block `i` of root's `sendbuf` (size x recvbuf) into rank `i`'s
    /// `recvbuf`; other ranks may pass `sendbuf=None`.
    #[pyo3(signature = (sendbuf, recvbuf, root, *, stream = None))]
    fn scatter(
        &self,
        py: Python<'_>,
        sendbuf: Option<&Bound<'_, PyAny>>,
        recvbuf: &Bound<'_, PyAny>,
        root: i64,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, root) = (|| {
            let root = self.check_rank(root, "root")?;
            let n = self.size_i()? as usize;
            let me = self.rank_i()?;
            let recv = self.resolve(recvbuf, "recvbuf", s)?;
            recv.writable("recvbuf")?;
            let (count, dtype) = (recv.count, recv.dtype);
            let send = if me == root {
                let b = sendbuf.ok_or_else(|| invalid_argument("sendbuf is None on the root: pass a buffer of size x recvbuf"))?;
                let b = self.resolve(b, "sendbuf", s)?;
                Self::same_dtype(&b, &recv)?;
                check_count("sendbuf", &b, count * n, &format!("{n} ranks x recvbuf's {count}"))?;
                Some(b)
            } else {
                None
            };
            Ok((vec![send, Some(recv)], count, dtype, root))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.scatter(p[0], p[1], count, dtype, root, s))
    }

    /// `ncclSend`: `buf` to `peer` (which calls `recv`).
    #[pyo3(signature = (buf, peer, *, stream = None))]
    fn send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, peer: i64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, peer) = (|| {
            let peer = self.check_rank(peer, "peer")?;
            let b = self.resolve(buf, "buf", s)?;
            let (count, dtype) = (b.count, b.dtype);
            Ok((vec![Some(b)], count, dtype, peer))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.send(p[0], count, dtype, peer, s))
    }

    /// `ncclRecv`: `buf` from `peer` (which calls `send` with as many elements).
    #[pyo3(signature = (buf, peer, *, stream = None))]
    fn recv(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, peer: i64, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let (bufs, count, dtype, peer) = (|| {
            let peer = self.check_rank(peer, "peer")?;
            let b = self.resolve(buf, "buf", s)?;
            b.writable("buf")?;
            let (count, dtype) = (b.count, b.dtype);
            Ok((vec![Some(b)], count, dtype, peer))
        })()
        .map_err(|e| self.refuse(e))?;
        self.run(py, bufs, s, move |c, p, s| c.recv(p[0], count, dtype, peer, s))
    }

    /// Blocks until every rank has called `barrier`.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.detach(|| comm.barrier()).py_err()
    }

    /// Waits until the work enqueued on `stream` (GPU) or this communicator's stream (host)
    /// has completed.
    #[pyo3(signature = (stream = None))]
    fn synchronize(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream(stream)?;
        let backend = &self.backend;
        py.detach(|| backend.synchronize(s)).py_err()
    }

    // --- Lifecycle ---------------------------------------------------------------------------

    /// `ncclCommSplit`: ranks with one `color` (`None`: this rank joins none) form a new
    /// communicator, ordered by `key`; `None` for a rank without color.
    #[pyo3(signature = (color, key = 0))]
    fn split(&self, py: Python<'_>, color: Option<i32>, key: i32) -> PyResult<Option<PyCommunicator>> {
        let color = match color {
            None => rustccl::SPLIT_NOCOLOR,
            Some(c) if c < 0 => return Err(invalid_argument(format!("color {c}: pass a color >= 0, or None to join no communicator"))),
            Some(c) => c,
        };
        let comm = &self.comm;
        let child = py.detach(|| comm.split(color, key, None)).py_err()?;
        child.map(|c| PyCommunicator::wrap(c, self.device)).transpose()
    }

    /// `ncclCommShrink`: a communicator of the ranks not in `exclude`; `abort=True` first
    /// aborts operations in flight (after a rank failed).
    #[pyo3(signature = (exclude, *, abort = false))]
    fn shrink(&self, py: Python<'_>, exclude: Vec<i32>, abort: bool) -> PyResult<PyCommunicator> {
        let flags = if abort { ShrinkFlags::Abort } else { ShrinkFlags::Default };
        let comm = &self.comm;
        let child = py.detach(|| comm.shrink(&exclude, None, flags)).py_err()?;
        PyCommunicator::wrap(child, self.device)
    }

    /// `ncclCommAbort`: stops everything now; peers see this rank as failed.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        self.closed.store(true, Ordering::Release);
        let comm = &self.comm;
        py.detach(|| comm.abort()).py_err()
    }

    /// `ncclCommRevoke`: stops operations in flight and refuses new ones.
    fn revoke(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.detach(|| comm.revoke(0)).py_err()
    }

    /// `ncclCommFinalize`: completes outstanding work; afterwards only destroy is allowed.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let comm = &self.comm;
        py.detach(|| comm.finalize()).py_err()
    }

    /// `ncclCommDestroy` (also done on garbage collection).
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        self.closed.store(true, Ordering::Release);
        let comm = &self.comm;
        py.detach(|| comm.destroy()).py_err()
    }

    /// `ncclCommGetAsyncError`: `None`, or the error (not raised) that ended the
    /// communicator's work; an `InProgressError` while non-blocking work runs.
    fn async_error<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.comm.async_error() {
            ResultCode::Success => Ok(None),
            ResultCode::InProgress => Ok(Some(exception(py, &rustccl::Error::in_progress("operations are still running"))?)),
            code => {
                let e = self.comm.async_error_detail().unwrap_or_else(|| rustccl::Error::new(code, code.description()));
                Ok(Some(exception(py, &e)?))
            }
        }
    }
}

impl PyCommunicator {
    /// `sendbuf` and `recvbuf` (`None`: in place, and then no second buffer: the operation
    /// takes `sendbuf`'s address twice); the output must be writable, the types equal.
    fn pair(&self, sendbuf: &Bound<'_, PyAny>, recvbuf: Option<&Bound<'_, PyAny>>, s: Stream) -> PyResult<(Buf, Option<Buf>)> {
        let send = self.resolve(sendbuf, "sendbuf", s)?;
        match recvbuf {
            None => {
                send.writable("sendbuf (in place: recvbuf is None)")?;
                Ok((send, None))
            }
            Some(r) => {
                let recv = self.resolve(r, "recvbuf", s)?;
                recv.writable("recvbuf")?;
                Self::same_dtype(&send, &recv)?;
                Ok((send, Some(recv)))
            }
        }
    }
}

/// The output address: the second buffer's, or the first's in place.
fn last(p: &[DevicePtr]) -> DevicePtr {
    if p.len() > 1 && !p[1].is_null() {
        p[1]
    } else {
        p[0]
    }
}

fn check_count(what: &str, b: &Buf, expected: usize, why: &str) -> PyResult<()> {
    if b.count != expected {
        return Err(size_error(what, b.count, expected, why));
    }
    Ok(())
}

impl Drop for PyCommunicator {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // Nobody is left to tell of a failure here (the error stays the communicator's
            // and the process's last error).
            let _ = self.comm.destroy();
        }
        if let Some(s) = self.host_stream {
            let _ = self.backend.destroy_stream(s);
        }
    }
}

//! `rustccl._native`: the extension module under the `rustccl` Python package
//! (python/rustccl; see python/README.md). A module per idea: `errors` (exceptions carrying
//! ncclResult_t), `dtype` (element types), `pybuffer` and `dlpack` (the two FFI edges buffers
//! come through), `buffers` (what an operation takes), `streams`, `communicator` (the
//! communicator, its collectives and lifecycle) and `group`.

use pyo3::prelude::*;

mod buffers;
mod communicator;
mod dlpack;
mod dtype;
mod errors;
mod group;
mod pybuffer;
mod streams;

/// The rustccl version and the NCCL version whose API it implements.
#[pyfunction]
fn version() -> (String, String) {
    (rustccl::version::RUSTCCL_VERSION.to_string(), rustccl::version::nccl_version_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(communicator::get_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(group::group_start, m)?)?;
    m.add_function(wrap_pyfunction!(group::group_end, m)?)?;
    m.add_class::<communicator::PyUniqueId>()?;
    m.add_class::<communicator::PyCommunicator>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add("DTYPES", dtype::NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>())?;
    errors::register(m)?;
    Ok(())
}

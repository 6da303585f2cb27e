//! `rustccl._native`: the extension module under the `rustccl` Python package
//! (python/rustccl). See python/README.md.

use pyo3::prelude::*;

/// The rustccl version and the NCCL version whose API it implements.
#[pyfunction]
fn version() -> (String, String) {
    (rustccl::version::RUSTCCL_VERSION.to_string(), rustccl::version::nccl_version_string())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    Ok(())
}

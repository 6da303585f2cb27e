//! Scenarios about parameters and the env plugin.

use rustccl::params::{self, table};
use rustccl::Error;

/// `env-params`: one process, no communicator. Sets logging up (which loads the env plugin),
/// then prints `RESULT param <name> <value|-> <source>` for each name of `RUSTCCL_TEST_PARAMS`
/// (comma-separated; the value as the parameter API reads it, the source with NCCL's name) and
/// logs the parameter dump (`ncclParamDumpAll`).
pub fn params() -> Result<(), Error> {
    rustccl::log::init();
    let names = std::env::var("RUSTCCL_TEST_PARAMS").map_err(|_| Error::invalid_argument("set RUSTCCL_TEST_PARAMS"))?;
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let p = params::lookup(name).ok_or_else(|| Error::invalid_argument(format!("no parameter {name}")))?;
        let (value, source) = p.resolved();
        let text = match value? {
            params::ParamValue::Unset => "-".to_string(),
            v => v.to_text(),
        };
        println!("RESULT param {name} {text} {}", source.nccl_name());
    }
    table::dump_all();
    Ok(())
}

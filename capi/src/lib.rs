//! `libnccl.so.2`: rustccl behind NCCL 2.32.3's C ABI (see `include/nccl.h`). Every function
//! also exists with the `pnccl` prefix. Arguments are checked as NCCL checks them; a failure
//! returns the matching `ncclResult_t`, is logged, and is kept for `ncclGetLastError`.
//!
//! With `RUSTCCL_BACKEND=host` the whole API runs on host memory: buffers are ordinary host
//! pointers, the stream argument is ignored (NULL is fine), and an operation has completed when
//! its call (or the outermost `ncclGroupEnd`) returns; on a non-blocking communicator that call
//! returns `ncclInProgress` and the operation has completed once `ncclCommGetAsyncError` no
//! longer says `ncclInProgress`.

mod buffers;
mod cft_api;
mod comm_api;
mod coll_api;
mod coll_config;
mod devcomm;
mod encryption_api;
mod grow_suspend_api;
mod handles;
mod mem_api;
mod param_api;
mod types;
mod windows;

use rustccl::{Error, ResultCode};

use handles::CommHandle;

pub use types::*;

/// Runs an API body: a panic becomes `ncclInternalError`, an error is recorded (log and
/// `ncclGetLastError`) and returned as its code.
pub(crate) fn guard(what: &str, f: impl FnOnce() -> Result<(), Error>) -> NcclResult {
    run_guarded(what, None, false, f)
}

/// As [`guard`], for a call on `comm`: an error is also recorded as that communicator's last
/// error (`ncclGetLastError(comm)`), whichever layer raised it.
pub(crate) fn guard_comm(what: &str, comm: CommHandle, f: impl FnOnce() -> Result<(), Error>) -> NcclResult {
    run_guarded(what, Some(comm), false, f)
}

/// As [`guard_comm`], for an operation (collective, send, receive): inside a group, an error
/// also cancels the group, as NCCL does for every argument error (`ncclGroupEnd` returns it
/// and runs nothing).
pub(crate) fn guard_op(what: &str, comm: CommHandle, f: impl FnOnce() -> Result<(), Error>) -> NcclResult {
    run_guarded(what, Some(comm), true, f)
}

fn run_guarded(what: &str, comm: Option<CommHandle>, op: bool, f: impl FnOnce() -> Result<(), Error>) -> NcclResult {
    rustccl::log::init();
    let e = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => return ResultCode::Success as NcclResult,
        Ok(Err(e)) if e.code == ResultCode::InProgress => return e.code as NcclResult,
        Ok(Err(e)) => e.context(what),
        Err(_) => Error::internal(format!("{what}: internal panic (please report this issue)")),
    };
    if op {
        rustccl::coll::cancel_group(&e);
    }
    match comm.and_then(|h| handles::get(h, what).ok()) {
        // Logs it, and records it as the communicator's and the process's last error.
        Some(c) => drop(c.comm.record_error(e.clone())),
        None => {
            let e = e.clone().log_once("");
            rustccl::error::set_last_error(&e.message);
        }
    }
    e.code as NcclResult
}

/// Exports each function under its `nccl` name and its `pnccl` profiling alias.
macro_rules! nccl_api {
    ($( $(#[$m:meta])* fn $name:ident / $pname:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty $body:block )*) => {$(
        $(#[$m])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[no_mangle]
        pub unsafe extern "C" fn $pname($($arg: $ty),*) -> $ret {
            // SAFETY: same contract as the function it forwards to.
            unsafe { $name($($arg),*) }
        }
    )*};
}
pub(crate) use nccl_api;

//! The one error type of rustccl. Every failure carries an [`ResultCode`] that maps onto
//! NCCL's `ncclResult_t`, and a message meant for a person. The last error message is kept
//! process-wide (what `ncclGetLastError` returns) and per communicator.

use std::fmt;
use std::sync::Mutex;

/// NCCL's `ncclResult_t`, value for value.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultCode {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6,
    InProgress = 7,
    /// An operation ran past its time limit (NCCL 2.30's `ncclTimeout`).
    Timeout = 8,
}

impl ResultCode {
    pub const NUM_RESULTS: i32 = 9;

    pub fn from_i32(v: i32) -> Option<ResultCode> {
        use ResultCode::*;
        Some(match v {
            0 => Success,
            1 => UnhandledCudaError,
            2 => SystemError,
            3 => InternalError,
            4 => InvalidArgument,
            5 => InvalidUsage,
            6 => RemoteError,
            7 => InProgress,
            8 => Timeout,
            _ => return None,
        })
    }

    /// The text `ncclGetErrorString` gives for this code.
    pub fn description(self) -> &'static str {
        use ResultCode::*;
        match self {
            Success => "no error",
            UnhandledCudaError => "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            SystemError => "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            InternalError => "internal error - please report this issue to the rustccl developers",
            InvalidArgument => "invalid argument (run with NCCL_DEBUG=WARN for details)",
            InvalidUsage => "invalid usage (run with NCCL_DEBUG=WARN for details)",
            RemoteError => "remote process exited or there was a network error",
            InProgress => "NCCL operation in progress",
            Timeout => "operation timed out (see the hang report in the log)",
        }
    }
}

/// What kind of failure an error is, beside its code: what callers branch on (never the
/// message text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    #[default]
    General,
    /// `group_end` without a matching `group_start`.
    GroupUnbalanced,
    /// The communicator was aborted (this rank's own `abort`).
    Aborted,
    /// The communicator was revoked (this rank's own `revoke`).
    Revoked,
    /// Another rank failed, or announced a failure.
    PeerFailed,
    /// The ranks called different operations.
    Mismatch,
    /// An operation ran past its time limit.
    Timeout,
    /// A peer's encryption key differs from this process's (or one side has none): a
    /// rendezvous fails for every rank when a rank that knows its secret shows this.
    KeyMismatch,
}

/// A failure: its `ncclResult_t` code, its kind, and a message that says what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: ResultCode,
    pub kind: ErrorKind,
    pub message: String,
    /// Whether it was logged already (a failure is logged once, where it is first recorded).
    pub logged: bool,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: ResultCode, message: impl Into<String>) -> Error {
        Error { code, kind: ErrorKind::General, message: message.into(), logged: false }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(ResultCode::InvalidArgument, message)
    }
    pub fn invalid_usage(message: impl Into<String>) -> Error {
        Error::new(ResultCode::InvalidUsage, message)
    }
    pub fn remote(message: impl Into<String>) -> Error {
        Error::new(ResultCode::RemoteError, message)
    }
    pub fn system(message: impl Into<String>) -> Error {
        Error::new(ResultCode::SystemError, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ResultCode::InternalError, message)
    }
    pub fn cuda(message: impl Into<String>) -> Error {
        Error::new(ResultCode::UnhandledCudaError, message)
    }
    pub fn in_progress(message: impl Into<String>) -> Error {
        Error::new(ResultCode::InProgress, message)
    }
    pub fn timeout(message: impl Into<String>) -> Error {
        Error::new(ResultCode::Timeout, message).with_kind(ErrorKind::Timeout)
    }

    /// The same error, of kind `kind`.
    pub fn with_kind(mut self, kind: ErrorKind) -> Error {
        self.kind = kind;
        self
    }

    /// Logs the error at WARN level (with `prefix`) unless it was logged already, and marks it
    /// logged.
    pub fn log_once(mut self, prefix: impl fmt::Display) -> Error {
        if !self.logged {
            tracing::warn!(target: "INIT", "{prefix}{}", self.message);
            self.logged = true;
        }
        self
    }

    /// A system error from an `std::io::Error`, with what was being done.
    pub fn io(what: impl fmt::Display, err: &std::io::Error) -> Error {
        Error::system(format!("{what}: {err}"))
    }

    /// Prefixes the message with context, keeping the code.
    pub fn context(mut self, what: impl fmt::Display) -> Error {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// Logs this error at WARN level (once) and records it as the process-wide last error.
    pub fn record(self) -> Error {
        let e = self.log_once("");
        set_last_error(&e.message);
        e
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<rustccl_netif::Error> for Error {
    fn from(e: rustccl_netif::Error) -> Error {
        match e.code {
            rustccl_netif::ResultCode::InvalidArgument => Error::invalid_argument(e.message),
            rustccl_netif::ResultCode::SystemError => Error::system(e.message),
        }
    }
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Records `message` as the process-wide last error (`ncclGetLastError(NULL)`).
pub fn set_last_error(message: &str) {
    let mut last = LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    last.clear();
    last.push_str(message);
}

/// The process-wide last error message; empty when none was recorded.
pub fn last_error() -> String {
    LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_nccl_values() {
        for v in 0..ResultCode::NUM_RESULTS {
            assert_eq!(ResultCode::from_i32(v).unwrap() as i32, v);
        }
        assert_eq!(ResultCode::from_i32(9), None);
        assert_eq!(ResultCode::RemoteError as i32, 6);
        assert_eq!(ResultCode::InProgress.description(), "NCCL operation in progress");
    }

    #[test]
    fn kinds_survive_context_and_a_failure_is_logged_once() {
        let e = Error::invalid_usage("x").with_kind(ErrorKind::Mismatch).context("AllReduce");
        assert_eq!((e.code, e.kind), (ResultCode::InvalidUsage, ErrorKind::Mismatch));
        assert!(!e.logged);
        let e = e.record();
        assert!(e.logged);
        assert!(e.context("again").logged, "context keeps the mark");
        assert_eq!(Error::timeout("t").kind, ErrorKind::Timeout);
    }

    #[test]
    fn context_keeps_code_and_record_sets_last_error() {
        let e = Error::invalid_argument("rank 9 out of range").context("ncclCommInitRank");
        assert_eq!(e.code, ResultCode::InvalidArgument);
        assert_eq!(e.message, "ncclCommInitRank: rank 9 out of range");
        let e = e.record();
        assert_eq!(last_error(), e.message);
    }
}

//! The typed API's error: what kind of failure ([`ErrorKind`], what callers branch on), the
//! NCCL code it maps to ([`ResultCode`], what `ncclResult_t` a C caller would have seen), and
//! a message that says what to do.

use std::fmt;

use crate::error::{Error as RawError, ErrorKind as RawKind, ResultCode};

/// What kind of failure an [`Error`] is.
///
/// ```
/// use rustccl::typed::{Error, ErrorKind};
/// let e = Error::new(ErrorKind::Length, "all_reduce: send has 4 elements, recv 3");
/// assert_eq!(e.kind(), ErrorKind::Length);
/// assert_eq!(e.code(), rustccl::ResultCode::InvalidArgument);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A buffer's length does not fit the operation (checked before anything is enqueued).
    Length,
    /// A buffer lives where this communicator cannot use it: host slices on a device backend,
    /// device memory of another backend or device (checked before anything is enqueued).
    Memory,
    /// A root or peer is not a rank of the communicator (checked before anything is enqueued).
    Rank,
    /// Another argument is invalid (`ncclInvalidArgument`).
    InvalidArgument,
    /// The call is not allowed now (`ncclInvalidUsage`): finalized communicator, nested group...
    InvalidUsage,
    /// This rank aborted the communicator.
    Aborted,
    /// This rank revoked the communicator.
    Revoked,
    /// Another rank failed or left (`ncclRemoteError`, or the code the failing rank reported).
    PeerFailed,
    /// The ranks called different operations.
    Mismatch,
    /// An operation ran past its time limit.
    Timeout,
    /// Still running (`ncclInProgress`): a non-blocking init or operation.
    InProgress,
    /// The device runtime failed (`ncclUnhandledCudaError`).
    Device,
    /// The system failed (`ncclSystemError`): sockets, shared memory, threads.
    System,
    /// A bug in rustccl (`ncclInternalError`).
    Internal,
}

impl ErrorKind {
    /// The NCCL code a failure of this kind has when nothing more specific is known.
    ///
    /// ```
    /// use rustccl::typed::ErrorKind;
    /// assert_eq!(ErrorKind::PeerFailed.default_code(), rustccl::ResultCode::RemoteError);
    /// ```
    pub fn default_code(self) -> ResultCode {
        match self {
            ErrorKind::Length | ErrorKind::Memory | ErrorKind::Rank | ErrorKind::InvalidArgument => ResultCode::InvalidArgument,
            ErrorKind::InvalidUsage | ErrorKind::Aborted | ErrorKind::Revoked | ErrorKind::Mismatch => ResultCode::InvalidUsage,
            ErrorKind::PeerFailed => ResultCode::RemoteError,
            ErrorKind::Timeout => ResultCode::Timeout,
            ErrorKind::InProgress => ResultCode::InProgress,
            ErrorKind::Device => ResultCode::UnhandledCudaError,
            ErrorKind::System => ResultCode::SystemError,
            ErrorKind::Internal => ResultCode::InternalError,
        }
    }
}

/// A failure of the typed API: kind, NCCL code and message.
///
/// Converts from and into the crate's raw [`crate::Error`], so `?` works across both layers.
///
/// ```
/// use rustccl::typed::{Error, ErrorKind};
/// let raw = rustccl::Error::remote("rank 1 (pid 42 on node7) failed: killed");
/// let e = Error::from(raw);
/// assert_eq!((e.kind(), e.code()), (ErrorKind::PeerFailed, rustccl::ResultCode::RemoteError));
/// assert!(e.message().contains("rank 1"));
/// let back: rustccl::Error = e.into();
/// assert_eq!(back.code, rustccl::ResultCode::RemoteError);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    code: ResultCode,
    message: String,
}

/// The typed API's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with its default NCCL code.
    ///
    /// ```
    /// use rustccl::typed::{Error, ErrorKind};
    /// assert_eq!(Error::new(ErrorKind::Rank, "root 9 of 2").to_string(), "Rank (InvalidArgument): root 9 of 2");
    /// ```
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, code: kind.default_code(), message: message.into() }
    }

    /// What kind of failure this is.
    ///
    /// ```
    /// # use rustccl::typed::{Error, ErrorKind};
    /// assert_eq!(Error::new(ErrorKind::Memory, "m").kind(), ErrorKind::Memory);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The `ncclResult_t` this failure is.
    ///
    /// ```
    /// # use rustccl::typed::{Error, ErrorKind};
    /// assert_eq!(Error::new(ErrorKind::Timeout, "t").code() as i32, 8);
    /// ```
    pub fn code(&self) -> ResultCode {
        self.code
    }

    /// What went wrong, and what to do about it.
    ///
    /// ```
    /// # use rustccl::typed::{Error, ErrorKind};
    /// assert_eq!(Error::new(ErrorKind::Internal, "oops").message(), "oops");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({:?}): {}", self.kind, self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<RawError> for Error {
    fn from(e: RawError) -> Error {
        let kind = match (e.kind, e.code) {
            (RawKind::Aborted, _) => ErrorKind::Aborted,
            (RawKind::Revoked, _) => ErrorKind::Revoked,
            (RawKind::PeerFailed, _) => ErrorKind::PeerFailed,
            (RawKind::Mismatch, _) => ErrorKind::Mismatch,
            (RawKind::Timeout, _) | (_, ResultCode::Timeout) => ErrorKind::Timeout,
            (RawKind::GroupUnbalanced, _) => ErrorKind::InvalidUsage,
            (_, ResultCode::InvalidArgument) => ErrorKind::InvalidArgument,
            (_, ResultCode::InvalidUsage) => ErrorKind::InvalidUsage,
            (_, ResultCode::RemoteError) => ErrorKind::PeerFailed,
            (_, ResultCode::InProgress) => ErrorKind::InProgress,
            (_, ResultCode::UnhandledCudaError) => ErrorKind::Device,
            (_, ResultCode::SystemError) => ErrorKind::System,
            (_, ResultCode::InternalError) | (_, ResultCode::Success) => ErrorKind::Internal,
        };
        Error { kind, code: e.code, message: e.message }
    }
}

impl From<Error> for RawError {
    fn from(e: Error) -> RawError {
        let kind = match e.kind {
            ErrorKind::Aborted => RawKind::Aborted,
            ErrorKind::Revoked => RawKind::Revoked,
            ErrorKind::PeerFailed => RawKind::PeerFailed,
            ErrorKind::Mismatch => RawKind::Mismatch,
            ErrorKind::Timeout => RawKind::Timeout,
            _ => RawKind::General,
        };
        RawError::new(e.code, e.message).with_kind(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_errors_map_to_kinds_and_keep_their_code() {
        let cases = [
            (RawError::invalid_argument("a"), ErrorKind::InvalidArgument, ResultCode::InvalidArgument),
            (RawError::invalid_usage("a").with_kind(RawKind::Aborted), ErrorKind::Aborted, ResultCode::InvalidUsage),
            (RawError::invalid_usage("a").with_kind(RawKind::Revoked), ErrorKind::Revoked, ResultCode::InvalidUsage),
            (RawError::invalid_argument("a").with_kind(RawKind::PeerFailed), ErrorKind::PeerFailed, ResultCode::InvalidArgument),
            (RawError::invalid_usage("a").with_kind(RawKind::Mismatch), ErrorKind::Mismatch, ResultCode::InvalidUsage),
            (RawError::timeout("a"), ErrorKind::Timeout, ResultCode::Timeout),
            (RawError::remote("a"), ErrorKind::PeerFailed, ResultCode::RemoteError),
            (RawError::in_progress("a"), ErrorKind::InProgress, ResultCode::InProgress),
            (RawError::cuda("a"), ErrorKind::Device, ResultCode::UnhandledCudaError),
            (RawError::system("a"), ErrorKind::System, ResultCode::SystemError),
            (RawError::internal("a"), ErrorKind::Internal, ResultCode::InternalError),
        ];
        for (raw, kind, code) in cases {
            let e = Error::from(raw.clone());
            assert_eq!((e.kind(), e.code(), e.message()), (kind, code, "a"), "{raw:?}");
            let back = RawError::from(e);
            assert_eq!(back.code, raw.code, "{raw:?} round trip");
            if raw.kind != RawKind::General {
                assert_eq!(back.kind, raw.kind, "{raw:?} round trip");
            }
        }
    }
}

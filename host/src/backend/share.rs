//! [`ShareHandle`]: the bytes one process sends another (through bootstrap) so the other can
//! map the same device memory.
//!
//! The envelope is common to all backends and fixed-size ([`ShareHandle::SIZE`] bytes), so
//! it can travel in fixed-size bootstrap messages; what is inside the payload belongs to the
//! backend that made it (a /dev/shm file name for the host backend; an IPC or fabric handle
//! for CUDA and HIP). Layout, little-endian:
//!
//! | bytes   | field                                               |
//! |---------|-----------------------------------------------------|
//! | 0..4    | magic `b"RCSH"`                                     |
//! | 4       | format version (1)                                  |
//! | 5       | backend kind ([`BackendKind::code`])                |
//! | 6..8    | payload length (u16)                                |
//! | 8..16   | size of the shared allocation in bytes (u64)        |
//! | 16..128 | payload, then zero padding                          |

use super::BackendKind;
use crate::error::{Error, Result};

const MAGIC: [u8; 4] = *b"RCSH";
const VERSION: u8 = 1;
const HEADER: usize = 16;

/// A serialisable handle to shareable device memory (see the module docs for its layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareHandle {
    kind: BackendKind,
    bytes: u64,
    payload: Vec<u8>,
}

impl ShareHandle {
    /// The size of the serialised form.
    pub const SIZE: usize = 128;
    /// The most payload bytes a backend can put in.
    pub const MAX_PAYLOAD: usize = Self::SIZE - HEADER;

    /// A handle made by backend `kind` for an allocation of `bytes` bytes.
    pub fn new(kind: BackendKind, bytes: u64, payload: &[u8]) -> Result<ShareHandle> {
        if payload.len() > Self::MAX_PAYLOAD {
            return Err(Error::internal(format!(
                "share handle payload of {} bytes exceeds the {} bytes a handle holds",
                payload.len(),
                Self::MAX_PAYLOAD
            )));
        }
        Ok(ShareHandle { kind, bytes, payload: payload.to_vec() })
    }

    /// The backend that made this handle (only it can import it).
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The size of the shared allocation in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The backend-specific part.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind.code();
        out[6..8].copy_from_slice(&(self.payload.len() as u16).to_le_bytes());
        out[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        out[HEADER..HEADER + self.payload.len()].copy_from_slice(&self.payload);
        out
    }

    /// Parses and checks serialised bytes; anything that is not a handle this version wrote
    /// is `InvalidArgument`.
    pub fn from_bytes(raw: &[u8]) -> Result<ShareHandle> {
        let bad = |why: String| Error::invalid_argument(format!("invalid share handle: {why}"));
        if raw.len() != Self::SIZE {
            return Err(bad(format!("{} bytes, expected {}", raw.len(), Self::SIZE)));
        }
        if raw[0..4] != MAGIC {
            return Err(bad(format!("bad magic {:02x?}", &raw[0..4])));
        }
        if raw[4] != VERSION {
            return Err(bad(format!("format version {}, expected {VERSION}", raw[4])));
        }
        let kind = BackendKind::from_code(raw[5]).ok_or_else(|| bad(format!("unknown backend code {}", raw[5])))?;
        let len = u16::from_le_bytes([raw[6], raw[7]]) as usize;
        if len > Self::MAX_PAYLOAD {
            return Err(bad(format!("payload length {len} exceeds {}", Self::MAX_PAYLOAD)));
        }
        if raw[HEADER + len..].iter().any(|&b| b != 0) {
            return Err(bad("non-zero bytes after the payload".to_string()));
        }
        let mut size = [0u8; 8];
        size.copy_from_slice(&raw[8..16]);
        let bytes = u64::from_le_bytes(size);
        if bytes == 0 {
            return Err(bad("zero-sized allocation".to_string()));
        }
        Ok(ShareHandle { kind, bytes, payload: raw[HEADER..HEADER + len].to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let h = ShareHandle::new(BackendKind::Host, 4096, b"rustccl-1-2-abc").unwrap();
        let raw = h.to_bytes();
        assert_eq!(raw.len(), ShareHandle::SIZE);
        assert_eq!(&raw[0..4], b"RCSH");
        let back = ShareHandle::from_bytes(&raw).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.bytes(), 4096);
        assert_eq!(back.payload(), b"rustccl-1-2-abc");
        assert_eq!(back.kind(), BackendKind::Host);
    }

    #[test]
    fn rejects_garbage() {
        use crate::error::ResultCode::InvalidArgument;
        let good = ShareHandle::new(BackendKind::Host, 64, b"x").unwrap().to_bytes();

        assert_eq!(ShareHandle::from_bytes(&[0u8; 128]).unwrap_err().code, InvalidArgument);
        assert_eq!(ShareHandle::from_bytes(&good[..100]).unwrap_err().code, InvalidArgument);
        let garbage: Vec<u8> = (0..128u32).map(|i| (i * 37 + 11) as u8).collect();
        assert_eq!(ShareHandle::from_bytes(&garbage).unwrap_err().code, InvalidArgument);

        let mut bad_kind = good;
        bad_kind[5] = 99;
        assert!(ShareHandle::from_bytes(&bad_kind).unwrap_err().message.contains("backend"));
        let mut long = good;
        long[6] = 200;
        assert!(ShareHandle::from_bytes(&long).unwrap_err().message.contains("payload length"));
        let mut trailing = good;
        trailing[127] = 1;
        assert_eq!(ShareHandle::from_bytes(&trailing).unwrap_err().code, InvalidArgument);
        let mut zero = good;
        zero[8..16].fill(0);
        assert_eq!(ShareHandle::from_bytes(&zero).unwrap_err().code, InvalidArgument);
    }

    #[test]
    fn oversized_payload_is_refused() {
        let e = ShareHandle::new(BackendKind::Cuda, 1, &[1u8; 113]).unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::InternalError);
    }
}

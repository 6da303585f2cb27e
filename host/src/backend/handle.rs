//! The plain handle types every backend hands out: device addresses, streams, events and
//! host-mapped memory. They are numbers, not owners: a backend's `free`/`destroy_*` ends them.

use std::fmt;

/// A device address. With unified addressing (CUDA's UVA, HIP's, and trivially the host
/// backend) one 64-bit space covers every device and pinned host memory, so a copy can take
/// any two of these.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null address (C's `NULL`).
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address `bytes` further on. It wraps rather than panics: the backend validates
    /// every range before it touches memory, so a wrapped address is reported there.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes as u64))
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A stream: an ordered queue of device work (a `CUstream`/`hipStream_t` handle, or a
/// counter on the host backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stream(pub u64);

impl Stream {
    /// The default (legacy NULL) stream: what C callers mean when they pass `NULL`.
    pub const DEFAULT: Stream = Stream(0);

    /// A stream from the raw handle a C caller passed (`NULL` is [`Stream::DEFAULT`]).
    pub fn from_raw(raw: u64) -> Stream {
        Stream(raw)
    }

    pub fn as_raw(self) -> u64 {
        self.0
    }

    pub fn is_default(self) -> bool {
        self.0 == 0
    }
}

/// An event: a marker recorded on a stream that others can wait for (a `CUevent`/`hipEvent_t`
/// handle, or a counter on the host backend). Zero is never a valid event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

impl Event {
    pub fn as_raw(self) -> u64 {
        self.0
    }
}

/// Pinned host memory that devices can read and write (`cuMemHostAlloc` with
/// `DEVICEMAP|PORTABLE`): the same bytes seen at a host address and at a device address.
/// Free it with the backend's `free_host_mapped`.
#[derive(Debug)]
pub struct HostMapped {
    /// The host address. Reading or writing through it is the caller's `unsafe` business:
    /// devices may touch the same bytes at any time.
    pub host: *mut u8,
    /// The address devices (and the backend's copies and plans) use.
    pub device: DevicePtr,
    pub bytes: usize,
}

// SAFETY: a HostMapped is an address and a length; it owns nothing a thread could race on by
// moving or sharing the struct itself. Every access through `host` is already an unsafe,
// caller-checked operation.
unsafe impl Send for HostMapped {}
// SAFETY: as above; `&HostMapped` only gives out copies of the address.
unsafe impl Sync for HostMapped {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ptr_offset_and_null() {
        let p = DevicePtr(0x1000);
        assert_eq!(p.offset(0x20), DevicePtr(0x1020));
        assert!(!p.is_null());
        assert!(DevicePtr::NULL.is_null());
        assert_eq!(DevicePtr(u64::MAX).offset(2), DevicePtr(1));
        assert_eq!(format!("{:?}", p), "DevicePtr(0x1000)");
    }

    #[test]
    fn default_stream_is_null() {
        assert!(Stream::from_raw(0).is_default());
        assert_eq!(Stream::from_raw(0), Stream::DEFAULT);
        assert!(!Stream(7).is_default());
    }
}

//! Byte formats, all little-endian and fixed-size:
//!
//! * the **listen handle** ([`ListenInfo`]) a listener gives out: its address and a random
//!   per-listen magic number;
//! * the **hello** ([`Hello`]) every socket of a connection sends first: which listener it is
//!   meant for (the magic), which connection it belongs to (a random id chosen by the
//!   connecting side) and which socket of it it is (the control socket or data socket `i`);
//! * the **message header** ([`Header`]) the sender writes on the control socket for each
//!   message: sequence number, size, tag and the socket of its first chunk.

use rustccl_plugin_api::net::NetHandle;
use rustccl_plugin_api::wire::{u16_at, u32_at, u64_at, TcpListenHandle};

/// `b"RCCLSOCK"`: the first bytes of a listen handle and of every hello.
pub const PROTO_MAGIC: u64 = u64::from_le_bytes(*b"RCCLSOCK");
/// `b"RCCLSOCE"`: the first bytes of the hello of an encrypted connection's socket, which
/// [`SECURE_EXTRA_BYTES`] follow (see `crate::connect`).
pub const PROTO_MAGIC_SECURE: u64 = u64::from_le_bytes(*b"RCCLSOCE");
/// What follows an encrypted connection's hello: the dialer's 32 random bytes (the same on
/// every socket of the connection) and this socket's 32-byte key confirmation.
pub const SECURE_EXTRA_BYTES: usize = 64;

/// What a listen handle carries (rustccl_plugin_api's TCP listen handle, marked
/// [`PROTO_MAGIC`]).
pub type ListenInfo = TcpListenHandle;

/// The socket plugin's name in a handle error.
pub const MAKER: &str = "the socket plugin";

/// Size of a [`Hello`] on the wire.
pub const HELLO_BYTES: usize = 32;

/// [`Hello::socket`] of the control socket.
pub const CONTROL_SOCKET: u32 = u32::MAX;

/// The first bytes every socket of a connection sends.
///
/// Layout: `0..8` [`PROTO_MAGIC`], `8..16` listen magic, `16..24` connection id, `24..28`
/// socket ([`CONTROL_SOCKET`] or a data socket index), `28..30` data sockets in the
/// connection, `30..32` helper threads the sender uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub listen_magic: u64,
    pub conn_id: u64,
    pub socket: u32,
    pub nsocks: u16,
    pub nthreads: u16,
    /// The connection is encrypted ([`PROTO_MAGIC_SECURE`]).
    pub secure: bool,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        let magic = if self.secure {
            PROTO_MAGIC_SECURE
        } else {
            PROTO_MAGIC
        };
        b[0..8].copy_from_slice(&magic.to_le_bytes());
        b[8..16].copy_from_slice(&self.listen_magic.to_le_bytes());
        b[16..24].copy_from_slice(&self.conn_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.socket.to_le_bytes());
        b[28..30].copy_from_slice(&self.nsocks.to_le_bytes());
        b[30..32].copy_from_slice(&self.nthreads.to_le_bytes());
        b
    }

    /// `None` when the bytes do not start with [`PROTO_MAGIC`] or [`PROTO_MAGIC_SECURE`]
    /// (not one of our sockets).
    pub fn decode(b: &[u8; HELLO_BYTES]) -> Option<Hello> {
        let magic = u64_at(b, 0);
        (magic == PROTO_MAGIC || magic == PROTO_MAGIC_SECURE).then(|| Hello {
            secure: magic == PROTO_MAGIC_SECURE,
            listen_magic: u64_at(b, 8),
            conn_id: u64_at(b, 16),
            socket: u32_at(b, 24),
            nsocks: u16_at(b, 28),
            nthreads: u16_at(b, 30),
        })
    }
}

/// Size of a [`Header`] on the wire.
pub const HEADER_BYTES: usize = 24;

/// The control-socket record that announces one message.
///
/// Layout: `0..8` sequence number (0, 1, 2, ... per connection), `8..16` size in bytes,
/// `16..20` tag, `20..24` data socket of the first chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub seq: u64,
    pub size: u64,
    pub tag: i32,
    pub first_socket: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.first_socket.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        Header {
            seq: u64_at(b, 0),
            size: u64_at(b, 8),
            tag: u32_at(b, 16) as i32,
            first_socket: u32_at(b, 20),
        }
    }
}

/// Entry point for the fuzz target in `fuzz/` and the corpus regression test: bytes through
/// the decoders of the three formats (a listen handle, a hello, message headers), as the
/// plugin meets them from a peer. Panics only if a decoder breaks a promise (a round trip).
/// Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use rustccl_plugin_api::net::NET_HANDLE_BYTES;

    use super::*;

    /// The first 128 bytes as a listen handle, the next 32 as a hello, the rest as message
    /// headers (the last one possibly short, as a read cut short leaves it).
    pub fn wire(data: &[u8]) {
        let (handle_bytes, rest) = data.split_at(data.len().min(NET_HANDLE_BYTES));
        let mut handle = NetHandle::default();
        handle.bytes[..handle_bytes.len()].copy_from_slice(handle_bytes);
        if let Ok(info) = ListenInfo::decode(&handle, PROTO_MAGIC, MAKER) {
            assert_ne!(info.addr.port(), 0);
            assert_eq!(
                ListenInfo::decode(&info.encode(PROTO_MAGIC), PROTO_MAGIC, MAKER),
                Ok(info)
            );
        }
        let (hello_bytes, rest) = rest.split_at(rest.len().min(HELLO_BYTES));
        if let Ok(bytes) = <&[u8; HELLO_BYTES]>::try_from(hello_bytes) {
            if let Some(hello) = Hello::decode(bytes) {
                assert_eq!(&hello.encode(), bytes);
            }
        }
        for chunk in rest.chunks_exact(HEADER_BYTES) {
            let bytes: &[u8; HEADER_BYTES] = chunk.try_into().expect("an exact chunk");
            assert_eq!(&Header::decode(bytes).encode(), bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_handles_round_trip() {
        for addr in [
            "10.1.2.3:4567",
            "127.0.0.1:1",
            "[2001:db8::7]:65535",
            "[::1]:80",
        ] {
            let info = ListenInfo {
                addr: addr.parse().unwrap(),
                magic: 0xdead_beef_0123_4567,
            };
            let h = info.encode(PROTO_MAGIC);
            assert_eq!(
                ListenInfo::decode(&h, PROTO_MAGIC, MAKER),
                Ok(info),
                "{addr}"
            );
            assert!(h.bytes[40..].iter().all(|&b| b == 0));
        }
        let mut h = ListenInfo {
            addr: "1.2.3.4:5".parse().unwrap(),
            magic: 1,
        }
        .encode(PROTO_MAGIC);
        assert_eq!(&h.bytes[12..16], &[1, 2, 3, 4]);
        h.bytes[8] = 5;
        assert!(ListenInfo::decode(&h, PROTO_MAGIC, MAKER)
            .unwrap_err()
            .contains("family 5"));
        let err = ListenInfo::decode(&NetHandle::default(), PROTO_MAGIC, MAKER).unwrap_err();
        assert!(err.contains("not made by the socket plugin"), "{err}");
    }

    #[test]
    fn hellos_and_headers_round_trip() {
        let hello = Hello {
            listen_magic: 7,
            conn_id: u64::MAX - 3,
            socket: CONTROL_SOCKET,
            nsocks: 64,
            nthreads: 16,
            secure: false,
        };
        assert_eq!(Hello::decode(&hello.encode()), Some(hello));
        let mut bytes = hello.encode();
        bytes[0] ^= 1;
        assert_eq!(Hello::decode(&bytes), None);

        let header = Header {
            seq: 41,
            size: 1 << 30,
            tag: -5,
            first_socket: 3,
        };
        let bytes = header.encode();
        assert_eq!(Header::decode(&bytes), header);
        assert_eq!(&bytes[8..16], &(1u64 << 30).to_le_bytes());
    }
}

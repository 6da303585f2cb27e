//! Byte-format pieces the TCP-speaking net plugins share (net-socket's connections, net-ib's
//! out-of-band setup): little-endian field reads, and the listen handle that carries a
//! listener's TCP address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::net::{NetHandle, NET_HANDLE_BYTES};

/// The little-endian `u16` at `b[at..at + 2]`.
pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

/// The little-endian `u32` at `b[at..at + 4]`.
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The little-endian `u64` at `b[at..at + 8]`.
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// What a TCP listener's handle carries: its address and a random magic naming this listen.
///
/// Layout (of the 128 handle bytes): `0..8` the plugin's protocol magic, `8` address family
/// (4 or 6), `10..12` port, `12..28` IP address (IPv4 in the first 4 bytes), `28..36` listen
/// magic, `36..40` IPv6 scope id; the rest is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpListenHandle {
    pub addr: SocketAddr,
    pub magic: u64,
}

const _: () = assert!(NET_HANDLE_BYTES >= 40);

impl TcpListenHandle {
    /// The handle, marked with the plugin's protocol magic `proto`.
    pub fn encode(&self, proto: u64) -> NetHandle {
        let mut h = NetHandle::default();
        let b = &mut h.bytes;
        b[0..8].copy_from_slice(&proto.to_le_bytes());
        b[10..12].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                b[8] = 4;
                b[12..16].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b[8] = 6;
                b[12..28].copy_from_slice(&a.ip().octets());
                b[36..40].copy_from_slice(&a.scope_id().to_le_bytes());
            }
        }
        b[28..36].copy_from_slice(&self.magic.to_le_bytes());
        h
    }

    /// Reads a handle that `maker` (e.g. "the socket plugin") made with protocol magic
    /// `proto`; an error says what is wrong with it.
    pub fn decode(h: &NetHandle, proto: u64, maker: &str) -> Result<TcpListenHandle, String> {
        let b = &h.bytes;
        if u64_at(b, 0) != proto {
            return Err(format!("the handle was not made by {maker}'s listen"));
        }
        let port = u16_at(b, 10);
        let addr = match b[8] {
            4 => {
                let octets: [u8; 4] = b[12..16].try_into().expect("4 bytes");
                SocketAddr::new(IpAddr::V4(Ipv4Addr::from(octets)), port)
            }
            6 => {
                let octets: [u8; 16] = b[12..28].try_into().expect("16 bytes");
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(octets), port, 0, u32_at(b, 36)))
            }
            other => return Err(format!("the handle has an unknown address family {other}")),
        };
        if port == 0 {
            return Err("the handle has port 0".into());
        }
        Ok(TcpListenHandle { addr, magic: u64_at(b, 28) })
    }
}

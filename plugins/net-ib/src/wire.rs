//! Byte formats of connection setup, little-endian and fixed-size:
//!
//! * the **listen handle** ([`ListenHandle`]): the out-of-band (OOB) TCP address of the
//!   listener and a random magic naming this listen;
//! * the **connection info** ([`ConnInfo`]) each side writes once on the OOB socket: what
//!   the peer needs to bring its queue pairs to RTR and, from the sender, where its CTS FIFO
//!   is. The connecting side's info starts with the listen magic, so a stray or stale
//!   connection is refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use rustccl_plugin_api::net::NetHandle;

use crate::settings::MAX_QPS;

/// `b"RCCLIBV1"`: the first bytes of a listen handle and of the connector's info.
pub const PROTO_MAGIC: u64 = u64::from_le_bytes(*b"RCCLIBV1");

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// What a listen handle carries. Layout (of the 128 handle bytes): `0..8` [`PROTO_MAGIC`],
/// `8` address family (4 or 6), `10..12` port, `12..28` IP (IPv4 in the first 4 bytes),
/// `28..36` listen magic, `36..40` IPv6 scope id; the rest zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenHandle {
    pub addr: SocketAddr,
    pub magic: u64,
}

impl ListenHandle {
    pub fn encode(&self) -> NetHandle {
        let mut h = NetHandle::default();
        let b = &mut h.bytes;
        b[0..8].copy_from_slice(&PROTO_MAGIC.to_le_bytes());
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

    pub fn decode(h: &NetHandle) -> Result<ListenHandle, String> {
        let b = &h.bytes;
        if u64_at(b, 0) != PROTO_MAGIC {
            return Err("the handle was not made by the IB plugin's listen".into());
        }
        let port = u16_at(b, 10);
        let addr = match b[8] {
            4 => SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[12..16]).expect("4"))),
                port,
            ),
            6 => SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(<[u8; 16]>::try_from(&b[12..28]).expect("16")),
                port,
                0,
                u32_at(b, 36),
            )),
            other => return Err(format!("the handle has an unknown address family {other}")),
        };
        if port == 0 {
            return Err("the handle has port 0".into());
        }
        Ok(ListenHandle {
            addr,
            magic: u64_at(b, 28),
        })
    }
}

/// One side's connection info. Both sides open the same number of QPs (the connector's
/// `NCCL_IB_QPS_PER_CONNECTION`; the acceptor follows it), and QP `i` talks to the peer's
/// QP `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The listen magic (connector) or [`PROTO_MAGIC`] (acceptor).
    pub magic: u64,
    pub lid: u16,
    /// `IBV_MTU_*` of the port.
    pub mtu: u8,
    /// 1: the port is Ethernet (RoCE): address by GID with a GRH.
    pub roce: bool,
    pub gid: [u8; 16],
    /// The sender's CTS FIFO (zero from the receiver).
    pub fifo_addr: u64,
    pub fifo_rkey: u32,
    /// QP numbers, in order.
    pub qpns: Vec<u32>,
}

/// Bytes of an encoded [`ConnInfo`]: 48 fixed plus 4 per possible QP.
pub const CONN_INFO_BYTES: usize = 48 + 4 * MAX_QPS;

impl ConnInfo {
    /// Layout: `0..8` magic, `8..10` lid, `10` mtu, `11` roce, `12..28` gid, `28..36` FIFO
    /// address, `36..40` FIFO rkey, `40..42` QP count, `48..` QP numbers.
    pub fn encode(&self) -> [u8; CONN_INFO_BYTES] {
        assert!(self.qpns.len() <= MAX_QPS && !self.qpns.is_empty());
        let mut b = [0u8; CONN_INFO_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10] = self.mtu;
        b[11] = self.roce as u8;
        b[12..28].copy_from_slice(&self.gid);
        b[28..36].copy_from_slice(&self.fifo_addr.to_le_bytes());
        b[36..40].copy_from_slice(&self.fifo_rkey.to_le_bytes());
        b[40..42].copy_from_slice(&(self.qpns.len() as u16).to_le_bytes());
        for (i, qpn) in self.qpns.iter().enumerate() {
            b[48 + 4 * i..52 + 4 * i].copy_from_slice(&qpn.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8; CONN_INFO_BYTES]) -> Result<ConnInfo, String> {
        let nqps = u16_at(b, 40) as usize;
        if nqps == 0 || nqps > MAX_QPS {
            return Err(format!(
                "the peer announced {nqps} queue pairs (1..={MAX_QPS})"
            ));
        }
        Ok(ConnInfo {
            magic: u64_at(b, 0),
            lid: u16_at(b, 8),
            mtu: b[10],
            roce: b[11] != 0,
            gid: b[12..28].try_into().expect("16 bytes"),
            fifo_addr: u64_at(b, 28),
            fifo_rkey: u32_at(b, 36),
            qpns: (0..nqps).map(|i| u32_at(b, 48 + 4 * i)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_handle_round_trips_and_refuses_others() {
        for addr in ["10.1.2.3:4567", "[fe80::1%3]:99", "[::1]:1"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let h = ListenHandle {
                addr,
                magic: 0x1234_5678_9abc_def0,
            };
            assert_eq!(ListenHandle::decode(&h.encode()), Ok(h));
        }
        let e = ListenHandle::decode(&NetHandle::default()).unwrap_err();
        assert!(e.contains("not made by the IB plugin"), "{e}");
        let mut bad = ListenHandle {
            addr: "1.2.3.4:5".parse().unwrap(),
            magic: 1,
        }
        .encode();
        bad.bytes[8] = 9;
        assert!(ListenHandle::decode(&bad).unwrap_err().contains("family 9"));
    }

    #[test]
    fn conn_info_round_trips() {
        let info = ConnInfo {
            magic: 42,
            lid: 0x1234,
            mtu: 5,
            roce: true,
            gid: [7; 16],
            fifo_addr: 0xdead_beef_0000,
            fifo_rkey: 0xabcd,
            qpns: vec![0x10001, 0x10002, 0x10003],
        };
        let b = info.encode();
        assert_eq!(u64_at(&b, 0), 42);
        assert_eq!(ConnInfo::decode(&b), Ok(info));
        let mut none = b;
        none[40..42].copy_from_slice(&0u16.to_le_bytes());
        assert!(ConnInfo::decode(&none)
            .unwrap_err()
            .contains("0 queue pairs"));
    }
}

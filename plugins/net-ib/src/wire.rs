//! Byte formats of connection setup, little-endian and fixed-size:
//!
//! * the **listen handle** ([`ListenHandle`]): the out-of-band (OOB) TCP address of the
//!   listener and a random magic naming this listen;
//! * the **connection info** ([`ConnInfo`]) each side writes once on the OOB socket: what
//!   the peer needs to bring its queue pairs to RTR and where its "inbox" is, the
//!   registered region the peer RDMA-writes into (the sender's CTS FIFO, the receiver's
//!   multi-receive size records). The connecting side's info starts with the listen magic, so a stray or stale
//!   connection is refused.

use rustccl_plugin_api::wire::{u16_at, u32_at, u64_at, TcpListenHandle};

use crate::settings::MAX_QPS;

/// `b"RCCLIBV1"`: the first bytes of a listen handle and of the connector's info.
pub const PROTO_MAGIC: u64 = u64::from_le_bytes(*b"RCCLIBV1");

/// What a listen handle carries (rustccl_plugin_api's TCP listen handle, marked
/// [`PROTO_MAGIC`]).
pub type ListenHandle = TcpListenHandle;

/// The IB plugin's name in a handle error.
pub const MAKER: &str = "the IB plugin";

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
    /// The inbox: the region the peer RDMA-writes into. From the sender, its CTS FIFO
    /// (the receiver writes clear-to-send rows there); from the receiver, its size records
    /// (the sender writes the sizes of a multi-receive there). See [`crate::fifo`].
    pub inbox_addr: u64,
    pub inbox_rkey: u32,
    /// QP numbers, in order.
    pub qpns: Vec<u32>,
}

/// Bytes of an encoded [`ConnInfo`]: 48 fixed plus 4 per possible QP.
pub const CONN_INFO_BYTES: usize = 48 + 4 * MAX_QPS;

impl ConnInfo {
    /// Layout: `0..8` magic, `8..10` lid, `10` mtu, `11` roce, `12..28` gid, `28..36` inbox
    /// address, `36..40` inbox rkey, `40..42` QP count, `48..` QP numbers.
    pub fn encode(&self) -> [u8; CONN_INFO_BYTES] {
        assert!(self.qpns.len() <= MAX_QPS && !self.qpns.is_empty());
        let mut b = [0u8; CONN_INFO_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10] = self.mtu;
        b[11] = self.roce as u8;
        b[12..28].copy_from_slice(&self.gid);
        b[28..36].copy_from_slice(&self.inbox_addr.to_le_bytes());
        b[36..40].copy_from_slice(&self.inbox_rkey.to_le_bytes());
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
            inbox_addr: u64_at(b, 28),
            inbox_rkey: u32_at(b, 36),
            qpns: (0..nqps).map(|i| u32_at(b, 48 + 4 * i)).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use rustccl_plugin_api::net::NetHandle;

    use super::*;

    #[test]
    fn listen_handle_round_trips_and_refuses_others() {
        for addr in ["10.1.2.3:4567", "[fe80::1%3]:99", "[::1]:1"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let h = ListenHandle {
                addr,
                magic: 0x1234_5678_9abc_def0,
            };
            assert_eq!(ListenHandle::decode(&h.encode(PROTO_MAGIC), PROTO_MAGIC, MAKER), Ok(h));
        }
        let e = ListenHandle::decode(&NetHandle::default(), PROTO_MAGIC, MAKER).unwrap_err();
        assert!(e.contains("not made by the IB plugin"), "{e}");
        let mut bad = ListenHandle {
            addr: "1.2.3.4:5".parse().unwrap(),
            magic: 1,
        }
        .encode(PROTO_MAGIC);
        bad.bytes[8] = 9;
        assert!(ListenHandle::decode(&bad, PROTO_MAGIC, MAKER).unwrap_err().contains("family 9"));
    }

    #[test]
    fn conn_info_round_trips() {
        let info = ConnInfo {
            magic: 42,
            lid: 0x1234,
            mtu: 5,
            roce: true,
            gid: [7; 16],
            inbox_addr: 0xdead_beef_0000,
            inbox_rkey: 0xabcd,
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

//! Byte formats of connection setup, little-endian and fixed-size:
//!
//! * the **listen handle** ([`ListenHandle`]): the out-of-band (OOB) TCP address of the
//!   listener, a random magic naming this listen, and how many physical devices the
//!   listener's (possibly merged) device has, so the connector opens its queue pairs for
//!   both ends at once ([`encode_handle`]);
//! * the **connection info** ([`ConnInfo`]) each side writes once on the OOB socket: what
//!   the peer needs to bring its queue pairs to RTR (per physical device: LID, GID, MTU,
//!   link layer; per QP: its number and device) and where its "inbox" is, the registered
//!   region the peer RDMA-writes into (the sender's CTS FIFO, the receiver's multi-receive
//!   size records). The connecting side's info starts with the listen magic, so a stray or stale
//!   connection is refused.
//!
//! Both formats start with [`PROTO_MAGIC`], which changes with the layout: an older peer's
//! handle or info is refused with a message instead of being misread.

use rustccl_plugin_api::net::NetHandle;
use rustccl_plugin_api::wire::{u16_at, u32_at, u64_at, TcpListenHandle};

use crate::fifo::MAX_DEVS_PER_NIC;
use crate::settings::MAX_QPS;

/// `b"RCCLIBV2"`: the first bytes of a listen handle and of the connector's info (V2: merged
/// devices, with per-device and per-QP entries).
pub const PROTO_MAGIC: u64 = u64::from_le_bytes(*b"RCCLIBV2");

/// What a listen handle carries (rustccl_plugin_api's TCP listen handle, marked
/// [`PROTO_MAGIC`]).
pub type ListenHandle = TcpListenHandle;

/// The IB plugin's name in a handle error.
pub const MAKER: &str = "the IB plugin";

/// Byte of the listen handle holding the listener's device count (after the 40 bytes of the
/// TCP handle).
pub const HANDLE_DEVICES_AT: usize = 40;

/// The handle of a listen on a device of `devices` physical devices.
pub fn encode_handle(h: &ListenHandle, devices: usize) -> NetHandle {
    let mut out = h.encode(PROTO_MAGIC);
    out.bytes[HANDLE_DEVICES_AT] = devices as u8;
    out
}

/// Reads a handle made by [`encode_handle`]: the listener and its device count.
pub fn decode_handle(h: &NetHandle) -> Result<(ListenHandle, usize), String> {
    let listen = ListenHandle::decode(h, PROTO_MAGIC, MAKER)?;
    let devices = h.bytes[HANDLE_DEVICES_AT] as usize;
    if !(1..=MAX_DEVS_PER_NIC).contains(&devices) {
        return Err(format!(
            "the handle names a device of {devices} physical devices (1..={MAX_DEVS_PER_NIC})"
        ));
    }
    Ok((listen, devices))
}

/// What the peer needs of one physical device (port) of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemberInfo {
    pub lid: u16,
    /// `IBV_MTU_*` of the port.
    pub mtu: u8,
    /// The port is Ethernet (RoCE): address by GID with a GRH.
    pub roce: bool,
    pub gid: [u8; 16],
}

/// One queue pair of a connection: its number and the physical device (index into
/// [`ConnInfo::members`]) it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub member: u8,
}

/// One side's connection info. Both sides open the same number of QPs (the connector's
/// choice; the acceptor follows it), and QP `i` talks to the peer's QP `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The listen magic (connector) or [`PROTO_MAGIC`] (acceptor).
    pub magic: u64,
    /// The inbox: the region the peer RDMA-writes into, registered on this side's first
    /// device (that of QP 0, which carries those writes). From the sender, its CTS FIFO
    /// (the receiver writes clear-to-send rows there); from the receiver, its size records
    /// (the sender writes the sizes of a multi-receive there). See [`crate::fifo`].
    pub inbox_addr: u64,
    pub inbox_rkey: u32,
    /// The physical devices of this side (1 to [`MAX_DEVS_PER_NIC`]).
    pub members: Vec<MemberInfo>,
    /// The queue pairs, in order.
    pub qps: Vec<QpInfo>,
}

/// Bytes of one [`MemberInfo`] in the info.
const MEMBER_BYTES: usize = 24;
/// Bytes of one [`QpInfo`] in the info.
const QP_BYTES: usize = 8;
/// Where the member entries start.
const MEMBERS_AT: usize = 24;
/// Where the QP entries start.
const QPS_AT: usize = MEMBERS_AT + MEMBER_BYTES * MAX_DEVS_PER_NIC;

/// Bytes of an encoded [`ConnInfo`]: 24 fixed, 24 per possible device, 8 per possible QP.
pub const CONN_INFO_BYTES: usize = QPS_AT + QP_BYTES * MAX_QPS;

impl ConnInfo {
    /// Layout: `0..8` magic, `8..16` inbox address, `16..20` inbox rkey, `20` device count,
    /// `22..24` QP count; from 24, [`MAX_DEVS_PER_NIC`] device entries of 24 bytes (`0..2`
    /// lid, `2` mtu, `3` roce, `4..20` gid); then [`MAX_QPS`] QP entries of 8 bytes (`0..4`
    /// QP number, `4` device). Unused entries are zero.
    pub fn encode(&self) -> [u8; CONN_INFO_BYTES] {
        assert!((1..=MAX_DEVS_PER_NIC).contains(&self.members.len()));
        assert!((1..=MAX_QPS).contains(&self.qps.len()));
        let mut b = [0u8; CONN_INFO_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..16].copy_from_slice(&self.inbox_addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.inbox_rkey.to_le_bytes());
        b[20] = self.members.len() as u8;
        b[22..24].copy_from_slice(&(self.qps.len() as u16).to_le_bytes());
        for (i, m) in self.members.iter().enumerate() {
            let e = &mut b[MEMBERS_AT + MEMBER_BYTES * i..][..MEMBER_BYTES];
            e[0..2].copy_from_slice(&m.lid.to_le_bytes());
            e[2] = m.mtu;
            e[3] = m.roce as u8;
            e[4..20].copy_from_slice(&m.gid);
        }
        for (i, q) in self.qps.iter().enumerate() {
            let e = &mut b[QPS_AT + QP_BYTES * i..][..QP_BYTES];
            e[0..4].copy_from_slice(&q.qpn.to_le_bytes());
            e[4] = q.member;
        }
        b
    }

    pub fn decode(b: &[u8; CONN_INFO_BYTES]) -> Result<ConnInfo, String> {
        let nmembers = b[20] as usize;
        if !(1..=MAX_DEVS_PER_NIC).contains(&nmembers) {
            return Err(format!(
                "the peer announced {nmembers} devices (1..={MAX_DEVS_PER_NIC})"
            ));
        }
        let nqps = u16_at(b, 22) as usize;
        if nqps == 0 || nqps > MAX_QPS {
            return Err(format!(
                "the peer announced {nqps} queue pairs (1..={MAX_QPS})"
            ));
        }
        let members = (0..nmembers)
            .map(|i| {
                let e = &b[MEMBERS_AT + MEMBER_BYTES * i..][..MEMBER_BYTES];
                MemberInfo {
                    lid: u16_at(e, 0),
                    mtu: e[2],
                    roce: e[3] != 0,
                    gid: e[4..20].try_into().expect("16 bytes"),
                }
            })
            .collect();
        let qps = (0..nqps)
            .map(|i| QpInfo {
                qpn: u32_at(b, QPS_AT + QP_BYTES * i),
                member: b[QPS_AT + QP_BYTES * i + 4],
            })
            .collect::<Vec<_>>();
        if let Some(q) = qps.iter().find(|q| q.member as usize >= nmembers) {
            return Err(format!(
                "the peer put queue pair {:#x} on device {} of {nmembers}",
                q.qpn, q.member
            ));
        }
        Ok(ConnInfo {
            magic: u64_at(b, 0),
            inbox_addr: u64_at(b, 8),
            inbox_rkey: u32_at(b, 16),
            members,
            qps,
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
    fn handle_carries_the_device_count() {
        let h = ListenHandle {
            addr: "10.1.2.3:4567".parse().unwrap(),
            magic: 9,
        };
        for n in 1..=MAX_DEVS_PER_NIC {
            assert_eq!(decode_handle(&encode_handle(&h, n)), Ok((h, n)));
        }
        let none = h.encode(PROTO_MAGIC);
        assert!(decode_handle(&none)
            .unwrap_err()
            .contains("0 physical devices"));
        // A handle of the previous layout (before merged devices) is refused, not misread.
        let old = h.encode(u64::from_le_bytes(*b"RCCLIBV1"));
        assert!(decode_handle(&old)
            .unwrap_err()
            .contains("not made by the IB plugin"));
    }

    #[test]
    fn conn_info_round_trips_with_members() {
        let member = |lid: u16, g: u8| MemberInfo {
            lid,
            mtu: 5,
            roce: true,
            gid: [g; 16],
        };
        let info = ConnInfo {
            magic: 42,
            inbox_addr: 0xdead_beef_0000,
            inbox_rkey: 0xabcd,
            members: vec![member(0x1234, 7), member(0x5678, 9)],
            qps: (0..4)
                .map(|i| QpInfo {
                    qpn: 0x10001 + i,
                    member: (i % 2) as u8,
                })
                .collect(),
        };
        let b = info.encode();
        assert_eq!(u64_at(&b, 0), 42);
        assert_eq!(ConnInfo::decode(&b), Ok(info.clone()));
        // Every field lands where the layout says, so a change of layout shows here.
        assert_eq!(b[20], 2);
        assert_eq!(u16_at(&b, 22), 4);
        assert_eq!(u16_at(&b, MEMBERS_AT + MEMBER_BYTES), 0x5678);
        assert_eq!(b[MEMBERS_AT + MEMBER_BYTES + 4], 9);
        assert_eq!(u32_at(&b, QPS_AT + 3 * QP_BYTES), 0x10004);
        assert_eq!(b[QPS_AT + 3 * QP_BYTES + 4], 1);
        // The most of each: 4 devices, 128 QPs.
        let full = ConnInfo {
            members: (0..MAX_DEVS_PER_NIC as u16)
                .map(|i| member(i, i as u8))
                .collect(),
            qps: (0..MAX_QPS as u32)
                .map(|i| QpInfo {
                    qpn: i,
                    member: (i % 4) as u8,
                })
                .collect(),
            ..info.clone()
        };
        assert_eq!(ConnInfo::decode(&full.encode()), Ok(full));

        let mut none = b;
        none[22..24].copy_from_slice(&0u16.to_le_bytes());
        assert!(ConnInfo::decode(&none)
            .unwrap_err()
            .contains("0 queue pairs"));
        let mut no_devices = b;
        no_devices[20] = 0;
        assert!(ConnInfo::decode(&no_devices)
            .unwrap_err()
            .contains("0 devices"));
        let mut stray = b;
        stray[QPS_AT + 4] = 2;
        assert!(ConnInfo::decode(&stray)
            .unwrap_err()
            .contains("on device 2 of 2"));
    }
}

//! A connection's verbs objects and their bring-up, as NCCL does it. A connection runs on a
//! device that may be several physical devices (ports) merged ([`crate::merge`]): it has one
//! protection domain and one completion queue per physical device ("member"), and
//! max(local members, remote members) × `NCCL_IB_QPS_PER_CONNECTION` RC queue pairs
//! ([`qp_count`]), QP `i` on local member `i % local members` talking to the peer's QP `i`,
//! on remote member `i % remote members`. Each QP is taken RESET → INIT (remote write and read allowed) → RTR (the peer's QP number, the
//! smaller MTU, PSN 0; a GRH with the peer's GID on RoCE, the peer's LID on InfiniBand) →
//! RTS (`NCCL_IB_TIMEOUT`, `NCCL_IB_RETRY_CNT`, RNR retry 7 = wait for the receiver).

use std::os::raw::c_int;
use std::sync::Arc;

use rustccl_plugin_api::PluginError;

use crate::device::{IbDevice, LinkLayer};
use crate::fifo::{FIFO_ROWS, MAX_RECVS};
use crate::settings::{QpSettings, MAX_QPS};
use crate::verbs::types::*;
use crate::verbs::{Cq, Pd, Qp};
use crate::wire::{ConnInfo, MemberInfo, QpInfo};

/// Work requests each QP queue must hold. A connection keeps at most [`MAX_INFLIGHT`]
/// requests, so at most that many CTS rows are in flight; a row (a bundle of up to
/// [`MAX_RECVS`] sends) posts per QP at most [`MAX_RECVS`] data writes, the size-record
/// write and the write-with-immediate (`MAX_RECVS + 2` = 10), and a receiver posts one
/// receive per QP per row plus one CTS write on QP 0. 32 × (8 + 2) + 32 = 352.
pub const QUEUE_DEPTH: u32 = (FIFO_ROWS * (MAX_RECVS + 2) + FIFO_ROWS) as u32;

/// Requests (sends, or receives of up to [`MAX_RECVS`] buffers) a connection keeps in
/// flight before `isend`/`irecv` answer "not now": one per FIFO row, so a receiver never
/// overwrites a row the sender has not read (see [`crate::fifo`]: rows are consumed in
/// order).
pub const MAX_INFLIGHT: usize = FIFO_ROWS;

/// The QPs of a connection between a device of `local` physical devices and one of `remote`
/// (NCCL's rule: at least `per_connection` QPs on every device of either side). An error
/// above [`MAX_QPS`].
pub fn qp_count(local: usize, remote: usize, per_connection: usize) -> Result<usize, PluginError> {
    let n = local.max(remote).max(1) * per_connection.max(1);
    if n > MAX_QPS {
        return Err(PluginError::invalid_argument(format!(
            "NCCL_IB_QPS_PER_CONNECTION={per_connection} on a device of {} physical devices makes {n} queue pairs, more than {MAX_QPS}; lower it",
            local.max(remote)
        )));
    }
    Ok(n)
}

/// The verbs objects of one connection. Field order is drop order: QPs before the CQs and
/// PDs (they also hold `Arc`s to their CQ and PD, so any order is safe).
pub struct Endpoint {
    pub qps: Vec<Qp>,
    /// The local member each QP is on (QP `i`: `i % members`).
    pub qp_members: Vec<usize>,
    /// The peer's member each QP talks to, from its info ([`Endpoint::connect`]).
    pub remote_members: Vec<usize>,
    /// One CQ and one PD per member, in member order.
    pub cqs: Vec<Arc<Cq>>,
    pub pds: Vec<Arc<Pd>>,
    /// The physical devices (ports), in order.
    pub members: Vec<IbDevice>,
}

impl Endpoint {
    /// A PD and a CQ per member of `members`, and `nqps` RC QPs in INIT striped over them.
    pub fn create(
        members: &[IbDevice],
        nqps: usize,
        settings: &QpSettings,
    ) -> Result<Endpoint, PluginError> {
        assert!(!members.is_empty(), "a device has at least one member");
        let per_member = nqps.div_ceil(members.len()) as u32;
        let mut pds = Vec::with_capacity(members.len());
        let mut cqs = Vec::with_capacity(members.len());
        for dev in members {
            pds.push(dev.context.alloc_pd()?);
            let depth = QUEUE_DEPTH.min(dev.max_qp_wr.max(1));
            cqs.push(
                dev.context
                    .create_cq((2 * depth).saturating_mul(per_member).min(1 << 17))?,
            );
        }
        let qp_members: Vec<usize> = (0..nqps).map(|i| i % members.len()).collect();
        let qps = qp_members
            .iter()
            .map(|&m| {
                let depth = QUEUE_DEPTH.min(members[m].max_qp_wr.max(1));
                let cap = ibv_qp_cap {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                };
                let qp = pds[m].create_rc_qp(&cqs[m], &cqs[m], cap)?;
                let (mut attr, mask) = init_attr(members[m].port, settings);
                qp.modify(&mut attr, mask)?;
                Ok(qp)
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok(Endpoint {
            qps,
            qp_members,
            remote_members: Vec::new(),
            cqs,
            pds,
            members: members.to_vec(),
        })
    }

    /// This side's info for the peer (the inbox, the region the peer writes into, is the
    /// caller's: registered on the first member's PD).
    pub fn info(&self, magic: u64, inbox_addr: u64, inbox_rkey: u32) -> ConnInfo {
        ConnInfo {
            magic,
            inbox_addr,
            inbox_rkey,
            members: self.members.iter().map(member_info).collect(),
            qps: self
                .qps
                .iter()
                .zip(&self.qp_members)
                .map(|(qp, &m)| QpInfo {
                    qpn: qp.qp_num(),
                    member: m as u8,
                })
                .collect(),
        }
    }

    /// Takes every QP to RTR then RTS towards the peer's QP of the same index, on the
    /// peer's member that QP is on.
    pub fn connect(&mut self, peer: &ConnInfo, settings: &QpSettings) -> Result<(), PluginError> {
        if peer.qps.len() != self.qps.len() {
            return Err(PluginError::remote(format!(
                "NET/IB : the peer opened {} queue pairs, this side {}; set the same NCCL_IB_QPS_PER_CONNECTION on every rank",
                peer.qps.len(),
                self.qps.len()
            )));
        }
        for ((qp, &m), remote) in self.qps.iter().zip(&self.qp_members).zip(&peer.qps) {
            let local = LocalPort::of(&self.members[m]);
            let member = &peer.members[remote.member as usize];
            let (mut attr, mask) = rtr_attr(&local, member, remote.qpn, settings);
            qp.modify(&mut attr, mask)?;
            let (mut attr, mask) = rts_attr(settings);
            qp.modify(&mut attr, mask)?;
        }
        self.remote_members = peer.qps.iter().map(|q| q.member as usize).collect();
        Ok(())
    }
}

/// What a peer needs of physical device `dev` to address a QP on it.
pub fn member_info(dev: &IbDevice) -> MemberInfo {
    MemberInfo {
        lid: dev.lid,
        mtu: dev.active_mtu as u8,
        roce: dev.link_layer == LinkLayer::Ethernet,
        gid: dev.gid,
    }
}

/// RESET → INIT: port, partition key, remote write (data, CTS) and read (flush) allowed.
pub fn init_attr(port: u8, settings: &QpSettings) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: settings.pkey_index,
        port_num: port,
        qp_access_flags: (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) as u32,
        ..Default::default()
    };
    (
        attr,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
    )
}

/// What RTR needs of this side's port.
#[derive(Clone, Copy, Debug)]
pub struct LocalPort {
    pub port: u8,
    pub roce: bool,
    pub gid_index: u32,
    /// `IBV_MTU_*`.
    pub mtu: u32,
}

impl LocalPort {
    pub fn of(dev: &IbDevice) -> LocalPort {
        LocalPort {
            port: dev.port,
            roce: dev.link_layer == LinkLayer::Ethernet,
            gid_index: dev.gid_index,
            mtu: dev.active_mtu,
        }
    }
}

/// INIT → RTR towards the peer's QP `dest_qpn` on its device `peer`.
pub fn rtr_attr(
    dev: &LocalPort,
    peer: &MemberInfo,
    dest_qpn: u32,
    settings: &QpSettings,
) -> (ibv_qp_attr, c_int) {
    let mut ah = ibv_ah_attr {
        dlid: peer.lid,
        sl: settings.service_level,
        port_num: dev.port,
        ..Default::default()
    };
    if peer.roce || dev.roce {
        ah.is_global = 1;
        ah.grh = ibv_global_route {
            dgid: ibv_gid { raw: peer.gid },
            flow_label: 0,
            sgid_index: dev.gid_index as u8,
            hop_limit: 255,
            traffic_class: settings.traffic_class,
        };
    }
    let attr = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: dev.mtu.min(peer.mtu.into()),
        dest_qp_num: dest_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ah,
        ..Default::default()
    };
    let mask = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    (attr, mask)
}

/// RTR → RTS.
pub fn rts_attr(settings: &QpSettings) -> (ibv_qp_attr, c_int) {
    let attr = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: settings.timeout,
        retry_cnt: settings.retry_cnt,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let mask = IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC;
    (attr, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(roce: bool) -> MemberInfo {
        MemberInfo {
            lid: 9,
            mtu: 3,
            roce,
            gid: [0xaa; 16],
        }
    }

    #[test]
    fn qps_cover_every_device_of_either_side() {
        assert_eq!(qp_count(1, 1, 1).unwrap(), 1);
        assert_eq!(
            qp_count(2, 1, 2).unwrap(),
            4,
            "2-device sender, 1-device receiver"
        );
        assert_eq!(qp_count(1, 2, 2).unwrap(), 4);
        assert_eq!(qp_count(4, 3, 32).unwrap(), 128);
        let e = qp_count(4, 1, 64).unwrap_err();
        assert!(e.message.contains("256 queue pairs, more than 128"), "{e}");
    }

    #[test]
    fn rtr_routes_roce_by_gid_and_ib_by_lid() {
        let s = QpSettings {
            traffic_class: 106,
            service_level: 3,
            ..Default::default()
        };
        let roce = LocalPort {
            port: 1,
            roce: true,
            gid_index: 3,
            mtu: 5,
        };
        let (a, mask) = rtr_attr(&roce, &peer(true), 77, &s);
        assert_eq!(a.qp_state, IBV_QPS_RTR);
        assert_eq!(a.dest_qp_num, 77);
        assert_eq!(a.path_mtu, 3, "the smaller MTU");
        assert_eq!(a.ah_attr.is_global, 1);
        assert_eq!(a.ah_attr.grh.dgid.raw, [0xaa; 16]);
        assert_eq!(a.ah_attr.grh.sgid_index, 3);
        assert_eq!(a.ah_attr.grh.traffic_class, 106);
        assert_eq!(a.ah_attr.sl, 3);
        assert_ne!(mask & IBV_QP_AV, 0);
        assert_ne!(mask & IBV_QP_DEST_QPN, 0);
        let ib = LocalPort {
            port: 2,
            roce: false,
            gid_index: 0,
            mtu: 5,
        };
        let (a, _) = rtr_attr(&ib, &peer(false), 77, &s);
        assert_eq!(a.ah_attr.is_global, 0);
        assert_eq!(a.ah_attr.dlid, 9);
        assert_eq!(a.ah_attr.port_num, 2);
    }

    #[test]
    fn init_and_rts_carry_the_variables() {
        let s = QpSettings {
            timeout: 14,
            retry_cnt: 3,
            pkey_index: 2,
            ..Default::default()
        };
        let (a, mask) = init_attr(1, &s);
        assert_eq!((a.qp_state, a.port_num, a.pkey_index), (IBV_QPS_INIT, 1, 2));
        assert_eq!(
            mask,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        );
        let (a, mask) = rts_attr(&s);
        assert_eq!(
            (a.qp_state, a.timeout, a.retry_cnt, a.rnr_retry),
            (IBV_QPS_RTS, 14, 3, 7)
        );
        assert_ne!(mask & IBV_QP_RETRY_CNT, 0);
    }
}

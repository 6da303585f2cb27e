//! A connection's verbs objects and their bring-up, as NCCL does it: one protection domain
//! and one completion queue per connection, `NCCL_IB_QPS_PER_CONNECTION` RC queue pairs
//! taken RESET → INIT (remote write and read allowed) → RTR (the peer's QP number, the
//! smaller MTU, PSN 0; a GRH with the peer's GID on RoCE, the peer's LID on InfiniBand) →
//! RTS (`NCCL_IB_TIMEOUT`, `NCCL_IB_RETRY_CNT`, RNR retry 7 = wait for the receiver).

use std::os::raw::c_int;
use std::sync::Arc;

use rustccl_plugin_api::PluginError;

use crate::device::{IbDevice, LinkLayer};
use crate::fifo::{FIFO_ROWS, MAX_RECVS};
use crate::settings::QpSettings;
use crate::verbs::types::*;
use crate::verbs::{Cq, Pd, Qp};
use crate::wire::ConnInfo;

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

/// The verbs objects of one connection. Field order is drop order: QPs before the CQ
/// (they also hold `Arc`s to the CQ and PD, so any order is safe).
pub struct Endpoint {
    pub qps: Vec<Qp>,
    pub cq: Arc<Cq>,
    pub pd: Arc<Pd>,
}

impl Endpoint {
    /// A PD, a CQ and `nqps` RC QPs in INIT on `dev`'s port.
    pub fn create(
        dev: &IbDevice,
        nqps: usize,
        settings: &QpSettings,
    ) -> Result<Endpoint, PluginError> {
        let pd = dev.context.alloc_pd()?;
        let depth = QUEUE_DEPTH.min(dev.max_qp_wr.max(1));
        let cq = dev
            .context
            .create_cq((2 * depth).saturating_mul(nqps as u32).min(1 << 17))?;
        let cap = ibv_qp_cap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qps = (0..nqps)
            .map(|_| {
                let qp = pd.create_rc_qp(&cq, &cq, cap)?;
                let (mut attr, mask) = init_attr(dev.port, settings);
                qp.modify(&mut attr, mask)?;
                Ok(qp)
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok(Endpoint { qps, cq, pd })
    }

    /// This side's info for the peer (the inbox, the region the peer writes into, is the
    /// caller's).
    pub fn info(&self, dev: &IbDevice, magic: u64, inbox_addr: u64, inbox_rkey: u32) -> ConnInfo {
        ConnInfo {
            magic,
            lid: dev.lid,
            mtu: dev.active_mtu as u8,
            roce: dev.link_layer == LinkLayer::Ethernet,
            gid: dev.gid,
            inbox_addr,
            inbox_rkey,
            qpns: self.qps.iter().map(Qp::qp_num).collect(),
        }
    }

    /// Takes every QP to RTR then RTS towards the peer's QPs.
    pub fn connect(
        &self,
        dev: &IbDevice,
        peer: &ConnInfo,
        settings: &QpSettings,
    ) -> Result<(), PluginError> {
        if peer.qpns.len() != self.qps.len() {
            return Err(PluginError::remote(format!(
                "NET/IB : the peer opened {} queue pairs, this side {}; set the same NCCL_IB_QPS_PER_CONNECTION on every rank",
                peer.qpns.len(),
                self.qps.len()
            )));
        }
        for (qp, &qpn) in self.qps.iter().zip(&peer.qpns) {
            let local = LocalPort::of(dev);
            let (mut attr, mask) = rtr_attr(&local, peer, qpn, settings);
            qp.modify(&mut attr, mask)?;
            let (mut attr, mask) = rts_attr(settings);
            qp.modify(&mut attr, mask)?;
        }
        Ok(())
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

/// INIT → RTR towards the peer's QP `dest_qpn`.
pub fn rtr_attr(
    dev: &LocalPort,
    peer: &ConnInfo,
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

    fn peer(roce: bool) -> ConnInfo {
        ConnInfo {
            magic: 0,
            lid: 9,
            mtu: 3,
            roce,
            gid: [0xaa; 16],
            inbox_addr: 0,
            inbox_rkey: 0,
            qpns: vec![77],
        }
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

//! The flush (NCCL's `iflush`): making data the NIC wrote into GPU memory visible to the GPU.
//!
//! A write-with-immediate's completion says the data reached the NIC's side of PCIe, not that
//! the GPU will read it after its own earlier reads: the GPU may see stale bytes until a
//! later PCIe read from the NIC pushes the writes ahead of it. NCCL's answer, repeated here:
//! each receiving connection on a device that offers GPU memory has a **loopback RC QP**,
//! connected to itself, and `iflush` posts through it a 1-byte RDMA_READ of the received
//! buffer into a registered host byte; the read's completion means the earlier writes landed.
//!
//! * Only device memory needs it: when none of the receive's buffers is registered as device
//!   memory (a dma-buf), or `NCCL_GDR_FLUSH_DISABLE` is set, `iflush` answers "nothing to
//!   flush" (`None`), as NCCL does. The read targets the last non-empty buffer.
//! * On a merged device there is one such QP per physical device, and a flush reads through
//!   each of them (as NCCL: the writes may have come through any of the devices); it is done
//!   when every read is.
//! * Each QP is on its device's PD of the connection (the read's rkey is the receive buffer's
//!   registration on that PD, and an RDMA read must name a region of the responder QP's PD)
//!   but has a CQ of its own,
//!   where NCCL shares the connection's: a flush then completes by polling only its CQ, its
//!   completions never mix with the data path's request bookkeeping (`wr_id`s, per-QP
//!   counts), and an error completion fails the flush with a message about the flush, leaving
//!   the data path to report its own state.
//! * `properties().force_flush` stays false: NCCL asks for flushes itself when it receives
//!   into GPU memory.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use rustccl_plugin_api::PluginError;

use crate::comm::wc_status_name;
use crate::device::IbDevice;
use crate::qp::{init_attr, member_info, rtr_attr, rts_attr, LocalPort, MAX_INFLIGHT};
use crate::settings::QpSettings;
use crate::verbs::types::*;
use crate::verbs::{Cq, Mr, Pd, Qp};

/// Which buffer of a receive a flush reads: the last non-empty one, when any buffer is device
/// memory; `None`: nothing to flush. `bufs`: (size, registered as device memory) per buffer.
pub fn read_target(bufs: impl IntoIterator<Item = (usize, bool)>) -> Option<usize> {
    let mut device = false;
    let mut last = None;
    for (i, (size, is_device)) in bufs.into_iter().enumerate() {
        device |= is_device;
        if size > 0 {
            last = Some(i);
        }
    }
    last.filter(|_| device)
}

/// A receiving connection's flush QPs (one per physical device) and its outstanding reads.
pub struct Flush {
    /// Device name, for messages.
    device: String,
    state: Mutex<State>,
}

/// One physical device's loopback QP. Field order is drop order: the QP goes before the
/// registration of the byte it reads into.
struct Member {
    qp: Qp,
    cq: Arc<Cq>,
    target_mr: Mr,
}

/// Field order is drop order: the QPs and registrations go before the byte they read into.
struct State {
    members: Vec<Member>,
    /// The host byte the reads land in (a word, as NCCL's); never read by the plugin.
    target: Box<UnsafeCell<u64>>,
    /// Requests whose reads are posted and not all completed: reads still to complete, and
    /// the first error among those that did.
    outstanding: HashMap<u64, (usize, Option<PluginError>)>,
    /// Completed reads not yet reported by `test`.
    finished: HashMap<u64, Result<(), PluginError>>,
    /// The first error; the QP is then in error and every later flush fails with it.
    failed: Option<PluginError>,
}

impl Flush {
    /// A loopback QP per physical device of `members`, on that device's PD of the connection
    /// (`pds`, in the same order) with its own CQ, connected to itself on the device's port,
    /// and the registered byte they read into.
    pub fn create(
        members: &[IbDevice],
        pds: &[Arc<Pd>],
        settings: &QpSettings,
    ) -> Result<Flush, PluginError> {
        let device = members
            .iter()
            .map(|d| format!("{}:{}", d.name, d.port))
            .collect::<Vec<_>>()
            .join("+");
        let target = Box::new(UnsafeCell::new(0u64));
        let members = members
            .iter()
            .zip(pds)
            .map(|(dev, pd)| {
                let depth = (MAX_INFLIGHT as u32).min(dev.max_qp_wr.max(1));
                let cq = dev.context.create_cq(depth)?;
                let cap = ibv_qp_cap {
                    max_send_wr: depth,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                };
                let qp = pd.create_rc_qp(&cq, &cq, cap)?;
                let (mut attr, mask) = init_attr(dev.port, settings);
                qp.modify(&mut attr, mask)?;
                // Its own peer: the RTR of a QP that names its own number and this port's
                // GID/LID.
                let itself = member_info(dev);
                let (mut attr, mask) =
                    rtr_attr(&LocalPort::of(dev), &itself, qp.qp_num(), settings);
                qp.modify(&mut attr, mask)?;
                let (mut attr, mask) = rts_attr(settings);
                qp.modify(&mut attr, mask)?;
                // SAFETY: the byte is a heap block that lives in the same state as its
                // registrations and is dropped after them (field order); only the device
                // writes it.
                let target_mr = unsafe {
                    pd.reg_mr(
                        target.get() as *mut c_void,
                        std::mem::size_of::<u64>(),
                        IBV_ACCESS_LOCAL_WRITE,
                    )
                }?;
                Ok(Member { qp, cq, target_mr })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok(Flush {
            device,
            state: Mutex::new(State {
                members,
                target,
                outstanding: HashMap::new(),
                finished: HashMap::new(),
                failed: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts request `req`'s 1-byte RDMA_READ of `addr` through every device's QP, each with
    /// the rkey of the buffer's registration on that device (`rkeys`, by device).
    pub fn post(&self, req: u64, addr: u64, rkeys: &[u32]) -> Result<(), PluginError> {
        let mut st = self.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.outstanding.len() + st.finished.len() >= MAX_INFLIGHT {
            return Err(PluginError::invalid_usage(format!(
                "NET/IB : {MAX_INFLIGHT} flushes on {} are not tested to completion yet; test them before posting more",
                self.device
            )));
        }
        let target = st.target.get() as u64;
        let mut posted = 0;
        let mut result = Ok(());
        for (m, &rkey) in st.members.iter().zip(rkeys) {
            let mut sge = ibv_sge {
                addr: target,
                length: 1,
                lkey: m.target_mr.lkey(),
            };
            let mut wr = ibv_send_wr {
                wr_id: req,
                next: std::ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
                opcode: IBV_WR_RDMA_READ,
                send_flags: IBV_SEND_SIGNALED,
                imm_data: 0,
                wr: ibv_send_wr_wr {
                    rdma: ibv_send_wr_rdma {
                        remote_addr: addr,
                        rkey,
                    },
                },
                qp_type: 0,
                _bind_mw_tso: [0; 6],
            };
            // SAFETY: the SGE names the registered target byte, which lives as long as the
            // QP; the remote side is this QP itself and the caller's registered receive
            // buffer.
            result = unsafe { m.qp.post_send(&mut wr) };
            if result.is_err() {
                break;
            }
            posted += 1;
        }
        // On an error the request is not handed out: completions of reads already posted
        // find no request and are dropped.
        result?;
        st.outstanding.insert(req, (posted, None));
        Ok(())
    }

    /// Whether flush `req` is done (every device's read); an error if a read failed. A
    /// finished or failed request is forgotten.
    pub fn test(&self, req: u64) -> Result<bool, PluginError> {
        let mut st = self.lock();
        let st = &mut *st;
        let mut wc = [ibv_wc::default(); 16];
        for m in &st.members {
            loop {
                let n = m.cq.poll(&mut wc)?;
                for c in &wc[..n] {
                    let error = (c.status != IBV_WC_SUCCESS).then(|| {
                        let e = PluginError::remote(format!(
                            "NET/IB : flush read on {} failed: {} (status {}, vendor error {:#x}); data received into GPU memory may not be visible to the GPU",
                            self.device,
                            wc_status_name(c.status),
                            c.status,
                            c.vendor_err
                        ));
                        st.failed.get_or_insert_with(|| e.clone());
                        e
                    });
                    let Some((left, first_error)) = st.outstanding.get_mut(&c.wr_id) else {
                        continue;
                    };
                    *left -= 1;
                    if first_error.is_none() {
                        *first_error = error;
                    }
                    if *left == 0 {
                        let (_, e) = st.outstanding.remove(&c.wr_id).expect("just seen");
                        st.finished.insert(c.wr_id, e.map_or(Ok(()), Err));
                    }
                }
                if n < wc.len() {
                    break;
                }
            }
        }
        if let Some(result) = st.finished.remove(&req) {
            return result.map(|()| true);
        }
        if st.outstanding.contains_key(&req) {
            return Ok(false);
        }
        Err(PluginError::invalid_argument(format!(
            "unknown flush request {req:#x}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_last_non_empty_buffer_of_a_receive_with_device_memory() {
        assert_eq!(read_target([(100, true)]), Some(0));
        assert_eq!(read_target([(100, true), (7, false), (0, true)]), Some(1));
        assert_eq!(read_target([(100, false), (7, false)]), None, "host memory");
        assert_eq!(
            read_target([(0, true), (0, true)]),
            None,
            "nothing received"
        );
        assert_eq!(read_target(std::iter::empty()), None);
    }
}

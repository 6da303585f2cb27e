//! Signals of the one-sided operations (NCCL 2.29's `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal`): where they live and how a wait counts them.
//!
//! Each rank holds one 64-bit counter per peer (signal index 0, context 0: the only ones NCCL
//! accepts), in its symmetric resource memory (made with the communicator's first
//! `NCCL_WIN_COLL_SYMMETRIC` window, which a put's source must lie in anyway): on the host
//! backend after the barrier inboxes ([`counters_at`]), on GPUs at `SYM_RES_SIGNALS` of the
//! kernels' layout. A put or signal from rank r adds 1 to counter r of its peer, with release
//! ordering, after the put's bytes. Counters only grow; a wait for `opCnt` signals from a peer
//! waits until the counter reaches what this rank waited for from that peer so far plus
//! `opCnt` (NCCL's running expected value), then acquires. The host backend counts what its
//! waits consumed on the host ([`Expected`]); GPUs count it on the device, beside the counters
//! (`SYM_RES_SIGNALS_SEEN`), so that a wait captured in a graph counts on at every replay.

use rustccl_kernels::exec::{SYM_RES_INBOX, SYM_RES_SIGNALS};

/// The most ranks whose counters fit the kernels' layout (the barrier inboxes end below
/// `SYM_RES_SIGNALS` up to this many ranks).
pub const DEVICE_MAX_RANKS: usize = ((SYM_RES_SIGNALS - SYM_RES_INBOX) / (4 * rustccl_kernels::exec::SYM_MAX_BLOCKS as u64)) as usize;

use crate::error::{Error, Result};

/// NCCL's `ncclWaitSignalDesc_t`: wait for `op_cnt` more signals from `peer` on signal index
/// `sig_idx` of context `ctx`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitSignalDesc {
    pub op_cnt: i32,
    pub peer: i32,
    pub sig_idx: i32,
    pub ctx: i32,
}

// `ncclWaitSignalDesc_t` is 16 bytes: four ints, in this order.
const _: () = assert!(std::mem::size_of::<WaitSignalDesc>() == 16 && std::mem::align_of::<WaitSignalDesc>() == 4);

/// Where the counters start in a rank's resource memory: in the host layout after the one
/// row of inboxes the CPU twin uses (8-aligned); in the kernels' layout (`host_layout`
/// false) at `SYM_RES_SIGNALS`.
pub fn counters_at(nranks: usize, host_layout: bool) -> u64 {
    if host_layout {
        (SYM_RES_INBOX + 4 * nranks as u64).next_multiple_of(8)
    } else {
        SYM_RES_SIGNALS
    }
}

/// Bytes of resource memory the host layout needs with the counters.
pub fn host_resource_bytes(nranks: usize) -> usize {
    (counters_at(nranks, true) + 8 * nranks as u64) as usize
}

/// Checks a signal index and context as NCCL does (only 0 exists so far).
pub fn check_index(what: &str, sig_idx: i32, ctx: i32) -> Result<()> {
    if ctx != 0 {
        return Err(Error::invalid_argument(format!("{what}: context {ctx} is invalid: only context 0 exists (as in NCCL)")));
    }
    if sig_idx != 0 {
        return Err(Error::invalid_argument(format!("{what}: signal index {sig_idx} is invalid: only index 0 exists (as in NCCL)")));
    }
    Ok(())
}

/// What a rank waited for so far, per peer: the running expected counts.
#[derive(Debug, Default)]
pub struct Expected {
    counts: Vec<u64>,
}

/// Checks `descs` (peers in range, `op_cnt` > 0, index and context 0) and adds up what they
/// wait for per peer: (peer, signals), each peer once, in the order of its first descriptor.
pub fn merge(descs: &[WaitSignalDesc], nranks: usize) -> Result<Vec<(usize, u64)>> {
    if descs.is_empty() {
        return Err(Error::invalid_argument("WaitSignal: no descriptors (nDesc is 0)"));
    }
    let mut out: Vec<(usize, u64)> = Vec::with_capacity(descs.len());
    for (i, d) in descs.iter().enumerate() {
        check_index(&format!("WaitSignal: descriptor {i}"), d.sig_idx, d.ctx)?;
        if d.op_cnt <= 0 {
            return Err(Error::invalid_argument(format!("WaitSignal: descriptor {i} waits for {} signals: opCnt must be at least 1", d.op_cnt)));
        }
        let peer = usize::try_from(d.peer).ok().filter(|&p| p < nranks).ok_or_else(|| {
            Error::invalid_argument(format!("WaitSignal: descriptor {i}: peer {} is out of range for {nranks} ranks", d.peer))
        })?;
        match out.iter_mut().find(|(p, _)| *p == peer) {
            Some((_, n)) => *n += d.op_cnt as u64,
            None => out.push((peer, d.op_cnt as u64)),
        }
    }
    Ok(out)
}

impl Expected {
    /// The counter values to wait for, for `waits` (from [`merge`]), without counting them
    /// yet: a wait that fails leaves them as they were.
    pub fn targets(&self, waits: &[(usize, u64)]) -> Vec<(usize, u64)> {
        waits.iter().map(|&(peer, n)| (peer, self.counts.get(peer).copied().unwrap_or(0) + n)).collect()
    }

    /// Records that the wait for `targets` completed.
    pub fn reached(&mut self, targets: &[(usize, u64)]) {
        for &(peer, t) in targets {
            if self.counts.len() <= peer {
                self.counts.resize(peer + 1, 0);
            }
            self.counts[peer] = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(op_cnt: i32, peer: i32) -> WaitSignalDesc {
        WaitSignalDesc { op_cnt, peer, sig_idx: 0, ctx: 0 }
    }

    /// Expected counts run on from wait to wait (NCCL's opCnt: signals since the last wait),
    /// and a peer named twice adds up.
    #[test]
    fn expected_counts_accumulate() {
        let mut e = Expected::default();
        let waits = merge(&[desc(2, 1), desc(1, 0), desc(3, 1)], 2).unwrap();
        assert_eq!(waits, vec![(1, 5), (0, 1)]);
        let t = e.targets(&waits);
        assert_eq!(t, vec![(1, 5), (0, 1)]);
        e.reached(&t);
        assert_eq!(e.targets(&merge(&[desc(1, 1)], 2).unwrap()), vec![(1, 6)]);
    }

    #[test]
    fn bad_descriptors_are_refused() {
        for bad in [desc(0, 0), desc(-1, 0), desc(1, 2), desc(1, -1), WaitSignalDesc { sig_idx: 1, ..desc(1, 0) }, WaitSignalDesc { ctx: 1, ..desc(1, 0) }] {
            let err = merge(&[bad], 2).unwrap_err();
            assert_eq!(err.code, crate::error::ResultCode::InvalidArgument, "{bad:?}: {}", err.message);
        }
        assert!(merge(&[], 2).is_err());
    }

    /// The counters sit after the inboxes, aligned for 64-bit atomics.
    #[test]
    fn counters_follow_the_inboxes() {
        for n in 1..9 {
            let at = counters_at(n, true);
            assert!(at >= SYM_RES_INBOX + 4 * n as u64 && at.is_multiple_of(8));
            assert_eq!(host_resource_bytes(n) as u64, at + 8 * n as u64);
        }
        // The kernels' layout: past every block's inboxes up to DEVICE_MAX_RANKS ranks.
        let inboxes_end = SYM_RES_INBOX + 4 * rustccl_kernels::exec::SYM_MAX_BLOCKS as u64 * DEVICE_MAX_RANKS as u64;
        assert!(inboxes_end <= counters_at(DEVICE_MAX_RANKS, false));
        const { assert!(DEVICE_MAX_RANKS >= 4095) };
    }
}

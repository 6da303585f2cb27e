//! Buffers registered with `ncclCommRegister`, and zero-copy receives into them.
//!
//! A receive from a peer over a P2P connection, into a registered buffer, can skip the FIFO:
//! the sender's kernel writes the message straight into the buffer (`exec.cu`, "zero-copy
//! receives"). For that the sender's process must map the receiver's allocation. The receiver
//! arranges it when it launches the receive: it exports the allocation
//! (`BufferSharing::export_buffer`) and asks the peer's communicator to map it (a bootstrap
//! request, answered by the peer's reader thread, so the peer's main thread never has to take
//! part), then puts where the buffer lies in the peer's process in the receive's context
//! (`OpCtx::dst_remote`). Mappings are kept per (peer, allocation) until the buffer is
//! deregistered or the communicator destroyed. Anything that fails on the way (a backend that
//! cannot export the memory, a peer that cannot map it) leaves the receive on the FIFO, with
//! a debug log line: zero-copy is an optimisation, never a new way to fail.
//!
//! [`Registry`] is the bookkeeping alone (no device, no peers), tested here; the
//! communicator's side follows it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Communicator, Inner};
use crate::backend::{DevicePtr, ShareHandle};
use crate::error::{Error, Result};
use crate::work::Work;

/// How long a receiver waits for a peer to map its buffer before it sends through the FIFO.
const MAP_WAIT: Duration = Duration::from_secs(10);

/// Request codes of the bootstrap service (first byte of a request).
const REQ_MAP: u8 = 1;
const REQ_UNMAP: u8 = 2;

/// One allocation of this rank as a peer maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Remote {
    bytes: usize,
    /// Where it starts in the peer's process; `None`: the peer could not map it (not asked
    /// again while the buffer stays registered).
    at: Option<u64>,
}

/// What this rank registered, what its peers mapped of it, and what it mapped of theirs.
#[derive(Default)]
pub(crate) struct Registry {
    next_id: u64,
    /// Registered ranges: (id, address, bytes).
    ranges: Vec<(u64, u64, usize)>,
    /// This rank's allocations as peers map them: (peer, allocation base here).
    remote: HashMap<(u32, u64), Remote>,
    /// Peers' allocations mapped here: (peer, allocation base there) → (address here, the
    /// handle it was mapped from).
    imports: HashMap<(u32, u64), (u64, ShareHandle)>,
}

impl Registry {
    /// Records a registration; its id.
    pub(crate) fn register(&mut self, ptr: u64, bytes: usize) -> u64 {
        self.next_id += 1;
        self.ranges.push((self.next_id, ptr, bytes));
        self.next_id
    }

    /// Removes registration `id`; the peers' mappings of allocations that no registration
    /// touches any more, to undo: (peer, allocation base).
    pub(crate) fn deregister(&mut self, id: u64) -> Result<Vec<(u32, u64)>> {
        let i = self.ranges.iter().position(|r| r.0 == id).ok_or_else(|| {
            Error::invalid_argument(format!("registration handle {id} is not registered with this communicator (deregistered already?)"))
        })?;
        self.ranges.swap_remove(i);
        let ranges = &self.ranges;
        let stale: Vec<(u32, u64)> = self
            .remote
            .iter()
            .filter(|((_, base), r)| !ranges.iter().any(|&(_, p, n)| p < base + r.bytes as u64 && *base < p + n as u64))
            .map(|(k, _)| *k)
            .collect();
        for k in &stale {
            self.remote.remove(k);
        }
        Ok(stale)
    }

    /// Whether `bytes` at `ptr` lie in one registered range.
    pub(crate) fn covers(&self, ptr: u64, bytes: usize) -> bool {
        self.ranges.iter().any(|&(_, p, n)| ptr >= p && ptr + bytes as u64 <= p + n as u64)
    }

    /// Where `ptr` lies in `peer`'s process, if `peer` maps the allocation of `bytes` at `base`
    /// holding it: `Some(None)` the peer could not; `None` not asked yet.
    fn remote_address(&self, peer: u32, base: u64, ptr: u64) -> Option<Option<u64>> {
        self.remote.get(&(peer, base)).map(|r| r.at.map(|at| at + (ptr - base)))
    }

    /// Unmaps every peer buffer mapped here (warnings for failures).
    pub(crate) fn close_imports(&mut self, backend: &dyn crate::backend::DeviceBackend) {
        for (_, (at, _)) in self.imports.drain() {
            if let Err(e) = backend.buffer_sharing_or_err("close_buffer").and_then(|b| b.close_buffer(DevicePtr(at))) {
                tracing::warn!(target: "NET", "unmapping a peer's registered buffer: {}", e.message);
            }
        }
    }

    /// The allocation holding `ptr` that `peer` already maps (or could not), if any.
    fn known_allocation(&self, peer: u32, ptr: u64) -> Option<u64> {
        self.remote.iter().find(|((p, base), r)| *p == peer && ptr >= *base && ptr < base + r.bytes as u64).map(|((_, b), _)| *b)
    }
}

/// A request to map (or unmap) the requester's allocation at `base`.
fn encode_request(code: u8, pid: u32, base: u64, handle: Option<&ShareHandle>) -> Vec<u8> {
    let mut out = vec![code];
    out.extend_from_slice(&pid.to_le_bytes());
    out.extend_from_slice(&base.to_le_bytes());
    if let Some(h) = handle {
        out.extend_from_slice(&h.to_bytes());
    }
    out
}

/// The answer: the address, or why not.
fn encode_answer(r: Result<u64>) -> Vec<u8> {
    match r {
        Ok(at) => {
            let mut out = vec![1];
            out.extend_from_slice(&at.to_le_bytes());
            out
        }
        Err(e) => {
            let mut out = vec![0];
            out.extend_from_slice(e.message.as_bytes());
            out
        }
    }
}

fn decode_answer(a: &[u8]) -> Result<u64> {
    match a {
        [] => Err(Error::remote("the peer does not serve zero-copy mappings (its communicator is not ready or is closing)")),
        [1, rest @ ..] if rest.len() == 8 => Ok(u64::from_le_bytes(rest.try_into().unwrap())),
        [0, why @ ..] => Err(Error::remote(String::from_utf8_lossy(why).into_owned())),
        _ => Err(Error::remote("malformed answer to a zero-copy mapping request")),
    }
}

/// Serves a peer's request (on the bootstrap reader thread).
fn serve(inner: &Arc<Inner>, peer: u32, req: &[u8]) -> Vec<u8> {
    let parsed = (|| {
        let code = *req.first()?;
        let pid = u32::from_le_bytes(req.get(1..5)?.try_into().ok()?);
        let base = u64::from_le_bytes(req.get(5..13)?.try_into().ok()?);
        Some((code, pid, base, &req[13..]))
    })();
    let Some((code, pid, base, rest)) = parsed else {
        return encode_answer(Err(Error::invalid_argument("malformed zero-copy request")));
    };
    let comm = Communicator { inner: Arc::clone(inner) };
    match code {
        REQ_MAP => encode_answer(comm.map_peer_buffer(peer, pid, base, rest)),
        REQ_UNMAP => {
            comm.unmap_peer_buffer(peer, base);
            encode_answer(Ok(0))
        }
        _ => encode_answer(Err(Error::invalid_argument(format!("unknown zero-copy request {code}")))),
    }
}

impl Communicator {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.registered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Installs the service that maps peers' registered buffers (after init).
    pub(super) fn attach_registrations(inner: &Arc<Inner>) {
        let Some(bs) = inner.bootstrap.get() else { return };
        let weak = Arc::downgrade(inner);
        bs.set_request_handler(Some(Box::new(move |peer, req| match weak.upgrade() {
            Some(inner) => serve(&inner, peer, req),
            None => Vec::new(),
        })));
    }

    /// `ncclCommRegister`: registers `bytes` at `ptr` for zero-copy point-to-point; the id
    /// [`deregister_buffer`](Self::deregister_buffer) takes.
    pub fn register_buffer(&self, ptr: DevicePtr, bytes: usize) -> Result<u64> {
        self.ready("register_buffer")?;
        if ptr.0 == 0 || bytes == 0 {
            return self.fail(Error::invalid_argument("register_buffer: the buffer is NULL or its size 0"));
        }
        Ok(self.registry().register(ptr.0, bytes))
    }

    /// `ncclCommDeregister`: ends registration `id`. Peers unmap the allocations no other
    /// registration lies in (so memory freed and allocated again is never written through a
    /// stale mapping).
    pub fn deregister_buffer(&self, id: u64) -> Result<()> {
        let bs = self.ready("deregister_buffer")?;
        let stale = self.registry().deregister(id).or_else(|e| self.fail(e))?;
        // The device work that may use the mappings completes first.
        if !stale.is_empty() {
            self.wait_device_idle()?;
        }
        let pid = std::process::id();
        for (peer, base) in stale {
            if let Err(e) = bs.request(peer, &encode_request(REQ_UNMAP, pid, base, None), MAP_WAIT).and_then(|a| decode_answer(&a)) {
                tracing::debug!(target: "NET", "rank {}: rank {peer} did not unmap a deregistered buffer: {}", self.inner.rank, e.message);
            }
        }
        Ok(())
    }

    /// Sets `dst_remote` of `work`'s receives that can be zero-copy: from a peer over P2P
    /// (`exec::gpu::encode::direct_receives`) into a registered buffer the peer maps (asked
    /// now on first use).
    pub(crate) fn resolve_direct_receives(&self, work: &mut Work, links: &crate::exec::Links) {
        if self.registry().ranges.is_empty() {
            return;
        }
        for (ci, peer) in crate::exec::gpu::encode::direct_receives(work, links) {
            let ctx = &work.ctxs[ci];
            if !self.registry().covers(ctx.dst as u64, ctx.dst_len) {
                continue;
            }
            match self.peer_address(peer, ctx.dst as u64, ctx.dst_len) {
                Ok(at) => work.ctxs[ci].dst_remote = at as usize,
                Err(e) => tracing::debug!(
                    target: "NET",
                    "rank {}: the receive from rank {peer} goes through the FIFO (not zero-copy): {}",
                    self.inner.rank,
                    e.message
                ),
            }
        }
    }

    /// Receive steps of this communicator's kernels that their senders wrote straight into
    /// the receive buffer (zero-copy), so far: a lower bound (the kernels count without
    /// atomics). For tests and logs.
    pub fn zero_copy_steps(&self) -> u64 {
        let Some(control) = self.device_cache().exec.control_host() else { return 0 };
        // SAFETY: the live control block of this communicator (kept by the device cache),
        // host-mapped memory the kernels write; a volatile read of an aligned u32.
        let n = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*(control as *const rustccl_kernels::exec::ExecControl)).direct_steps)) };
        n as u64
    }

    /// Where `ptr` lies in `peer`'s process, asking the peer to map its allocation first.
    fn peer_address(&self, peer: u32, ptr: u64, bytes: usize) -> Result<u64> {
        // One lock (an `if let` on a guard would hold it through its body).
        let known = {
            let reg = self.registry();
            reg.known_allocation(peer, ptr).and_then(|base| reg.remote_address(peer, base, ptr))
        };
        if let Some(known) = known {
            return known.ok_or_else(|| Error::remote("the peer could not map this allocation earlier"));
        }
        let device = self.inner.device.max(0) as usize;
        let backend = self.backend();
        let m = backend.buffer_sharing_or_err("zero-copy receive")?.export_buffer(device, DevicePtr(ptr), bytes)?;
        let bs = self.ready("zero-copy receive")?;
        let answer = bs
            .request(peer, &encode_request(REQ_MAP, std::process::id(), m.base.0, Some(&m.handle)), MAP_WAIT)
            .and_then(|a| decode_answer(&a));
        let at = answer.as_ref().ok().copied();
        self.registry().remote.insert((peer, m.base.0), Remote { bytes: m.bytes, at });
        tracing::debug!(
            target: "NET",
            "rank {}: rank {peer} maps this rank's allocation {:#x} ({} bytes) at {at:#x?}",
            self.inner.rank,
            m.base.0,
            m.bytes
        );
        Ok(answer? + (ptr - m.base.0))
    }

    /// Serves `peer`'s request to map its allocation at `base` (in process `pid`): where it
    /// lies here.
    fn map_peer_buffer(&self, peer: u32, pid: u32, base: u64, handle: &[u8]) -> Result<u64> {
        let handle = ShareHandle::from_bytes(handle)?;
        let bs = self.ready("mapping a peer's buffer")?;
        let me = &bs.peers()[self.inner.rank as usize];
        let same_process = pid == std::process::id() && bs.peers().get(peer as usize).is_some_and(|p| p.hostname == me.hostname);
        if same_process {
            // One address space: the peer's address is this process's.
            return Ok(base);
        }
        let mut reg = self.registry();
        if let Some((at, h)) = reg.imports.get(&(peer, base)) {
            if *h == handle {
                return Ok(*at);
            }
        }
        // A new allocation at an address an old one had: the old mapping goes.
        if let Some((old, _)) = reg.imports.remove(&(peer, base)) {
            let _ = self.backend().buffer_sharing_or_err("close_buffer").and_then(|b| b.close_buffer(DevicePtr(old)));
        }
        let device = self.inner.device.max(0) as usize;
        let at = self.backend().buffer_sharing_or_err("mapping a peer's buffer")?.import_buffer(device, &handle)?;
        reg.imports.insert((peer, base), (at.0, handle));
        Ok(at.0)
    }

    /// Serves `peer`'s request to unmap its allocation at `base`. Nothing of this rank writes
    /// into it any more: the peer deregistered it after its device work, whose receives this
    /// rank's sends into it fed, had completed, and later receives do not post it.
    fn unmap_peer_buffer(&self, peer: u32, base: u64) {
        let Some((at, _)) = self.registry().imports.remove(&(peer, base)) else { return };
        if let Err(e) = self.backend().buffer_sharing_or_err("close_buffer").and_then(|b| b.close_buffer(DevicePtr(at))) {
            tracing::warn!(target: "NET", "rank {}: unmapping rank {peer}'s buffer: {}", self.inner.rank, e.message);
        }
    }

    /// Unmaps every peer buffer mapped here (destroy, after the device work).
    pub(super) fn release_registrations(&self) {
        if let Some(bs) = self.inner.bootstrap.get() {
            bs.set_request_handler(None);
        }
        let mut reg = self.registry();
        reg.close_imports(&**self.backend());
        reg.remote.clear();
        reg.ranges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_cover_their_ranges_and_deregistering_forgets_peer_mappings_no_longer_used() {
        let mut r = Registry::default();
        let a = r.register(0x1000, 0x1000);
        let b = r.register(0x1800, 0x1000);
        assert!(r.covers(0x1000, 0x1000) && r.covers(0x1800, 0x1000) && r.covers(0x1100, 0x10));
        assert!(!r.covers(0x1000, 0x1900), "spans two registrations: not one range");
        assert!(!r.covers(0x3000, 1));
        // Peer 1 maps the allocation at 0x1000 (0x2000 bytes) at 0x9000; peer 2 could not.
        r.remote.insert((1, 0x1000), Remote { bytes: 0x2000, at: Some(0x9000) });
        r.remote.insert((2, 0x1000), Remote { bytes: 0x2000, at: None });
        assert_eq!(r.known_allocation(1, 0x1850), Some(0x1000));
        assert_eq!(r.remote_address(1, 0x1000, 0x1850), Some(Some(0x9850)));
        assert_eq!(r.remote_address(2, 0x1000, 0x1850), Some(None));
        assert_eq!(r.known_allocation(3, 0x1850), None);
        // `b` still lies in the allocation: nothing to unmap.
        assert_eq!(r.deregister(a).unwrap(), vec![]);
        assert!(!r.covers(0x1000, 0x10) && r.covers(0x1800, 0x10));
        let mut gone = r.deregister(b).unwrap();
        gone.sort();
        assert_eq!(gone, vec![(1, 0x1000), (2, 0x1000)]);
        assert_eq!(r.known_allocation(1, 0x1850), None);
        assert_eq!(r.deregister(b).unwrap_err().code, crate::error::ResultCode::InvalidArgument);
    }

    #[test]
    fn requests_and_answers_round_trip_and_malformed_answers_are_errors() {
        let h = ShareHandle::new(crate::backend::BackendKind::Cuda, 4096, &[7; 64]).unwrap();
        let req = encode_request(REQ_MAP, 42, 0xabc000, Some(&h));
        assert_eq!(req[0], REQ_MAP);
        assert_eq!(u32::from_le_bytes(req[1..5].try_into().unwrap()), 42);
        assert_eq!(u64::from_le_bytes(req[5..13].try_into().unwrap()), 0xabc000);
        assert_eq!(ShareHandle::from_bytes(&req[13..]).unwrap(), h);
        assert_eq!(decode_answer(&encode_answer(Ok(0x7f00_0000_1000))).unwrap(), 0x7f00_0000_1000);
        let e = decode_answer(&encode_answer(Err(Error::invalid_usage("cannot map")))).unwrap_err();
        assert_eq!(e.message, "cannot map");
        assert!(decode_answer(&[]).is_err());
        assert!(decode_answer(&[1, 2, 3]).is_err());
    }
}

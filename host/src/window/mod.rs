//! Symmetric memory windows (NCCL's `ncclCommWindowRegister`, the dev_runtime seed): memory
//! every rank of a communicator registers together, which every rank then reaches with plain
//! loads and stores.
//!
//! Each communicator reserves one flat address range of `nranks × stride` bytes (no memory
//! behind it) the first time a window is registered. A registration maps the allocation that
//! holds each rank's buffer into slot `r` of that range, at the same offset for every rank
//! ("big space"): rank r's window lies at `base + r × stride + offset` in every process, so a
//! peer's address is arithmetic on the local one. Offsets come from [`space::Space`], which
//! gives every rank the same offset as long as every rank registers and deregisters in the
//! same order (as NCCL requires); each registration also exchanges what the ranks hold, so a
//! rank that registered something else is an error on every rank, not a hang.
//!
//! Backends provide the memory side (`WindowMemory::alloc_symmetric`, `symmetric_memory`,
//! `reserve_space`, `map_shared_at`, `unmap_at`): the host backend maps `/dev/shm` files, the
//! CUDA backend cuMem allocations passed between processes as file descriptors.

pub mod signals;
pub mod space;

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{DeviceBackend, DevicePtr, ShareHandle};
use crate::error::{Error, Result};
use space::Space;

/// `NCCL_WIN_DEFAULT`.
pub const WIN_DEFAULT: u32 = 0;
/// `NCCL_WIN_COLL_SYMMETRIC`: collectives on buffers in this window may use its peers' copies.
pub const WIN_COLL_SYMMETRIC: u32 = 1;
/// `NCCL_WIN_STRICT_ORDERING` (2.29): orders the network's (GIN's) writes into the window.
/// Accepted, as NCCL accepts it, and without effect: rustccl has no GIN.
pub const WIN_STRICT_ORDERING: u32 = 2;
/// `NCCL_WIN_GIN_ONLY` (2.32): register the window for GIN alone. Accepted without effect (no
/// GIN): the window is registered as an ordinary one.
pub const WIN_GIN_ONLY: u32 = 4;
/// `NCCL_WIN_CFT_COUNTED` (2.31): bind the window to CFT's counted logical endpoints. Accepted
/// without effect (no CFT hardware), as NCCL where the GPU has no CFT support.
pub const WIN_CFT_COUNTED: u32 = 8;
/// `NCCL_WIN_REQUIRED_ALIGNMENT`: a window starts this far into its allocation, or a multiple.
pub const WIN_ALIGNMENT: usize = 4096;
/// Offsets in the space are multiples of this (NCCL's cuMem granularity, 2 MiB on GPUs).
const SPACE_ALIGN: u64 = 2 << 20;
/// Each rank's slot in the flat range, unless `NCCL_WIN_STRIDE` says otherwise (rounded up to
/// a multiple of 4 GiB, as NCCL's device code needs).
const DEFAULT_STRIDE: u64 = 16 << 30;

/// A registered window as one rank sees it: its own buffer and where every rank's lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    id: u64,
    user: DevicePtr,
    bytes: usize,
    flags: u32,
    /// Rank r's window: `base + r × stride + offset`.
    base: u64,
    stride: u64,
    offset: u64,
    rank: usize,
    nranks: usize,
}

impl Window {
    /// The buffer this rank registered (`ncclWinGetUserPtr`).
    pub fn user_ptr(&self) -> DevicePtr {
        self.user
    }

    /// Bytes this rank registered.
    pub fn size(&self) -> usize {
        self.bytes
    }

    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// This window's number within its communicator.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where `offset` bytes into rank `peer`'s window lie in this process (loads and stores
    /// there reach the peer's memory; `ncclGetPeerDevicePointer`). Its own rank is a second
    /// view of its own buffer.
    pub fn peer_ptr(&self, peer: usize, offset: usize) -> Result<DevicePtr> {
        if peer >= self.nranks {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is not a rank of this window's communicator ({} ranks)",
                self.nranks
            )));
        }
        if offset > self.bytes {
            return Err(Error::invalid_argument(format!(
                "offset {offset} lies past the end of the window ({} bytes)",
                self.bytes
            )));
        }
        Ok(DevicePtr(self.flat(peer) + offset as u64))
    }

    /// Where rank `r`'s window starts in this process.
    fn flat(&self, r: usize) -> u64 {
        self.base + r as u64 * self.stride + self.offset
    }

    /// Ranks whose windows this process reaches by loads and stores (the LSA team): on one
    /// host, all of them.
    pub fn lsa_ranks(&self) -> usize {
        self.nranks
    }

    /// This rank's place in the LSA team (its rank: the team is every rank).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes between consecutive ranks' windows (a multiple of 4 GiB).
    pub fn stride(&self) -> u64 {
        self.stride
    }
}

/// The bootstrap's all-gather: every rank's bytes, in rank order.
pub type AllGather<'a> = dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// What a registration needs from its communicator.
pub struct Exchange<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub device: usize,
    pub backend: &'a Arc<dyn DeviceBackend>,
    /// Every rank's bytes, in rank order (the bootstrap's all-gather).
    pub allgather: &'a AllGather<'a>,
}

/// One allocation mapped for every rank.
struct Mem {
    /// Where the allocation starts in this process (its own mapping).
    local_base: u64,
    offset: u64,
    span: u64,
    /// The mapping of each rank's allocation, in rank order.
    mapped: Vec<DevicePtr>,
    refs: usize,
}

/// The flat range of a communicator.
struct Reserved {
    backend: Arc<dyn DeviceBackend>,
    base: u64,
    bytes: usize,
    stride: u64,
    space: Space,
}

/// A communicator's windows.
#[derive(Default)]
pub struct Windows {
    reserved: Option<Reserved>,
    mems: Vec<Mem>,
    windows: HashMap<u64, Window>,
    next_id: u64,
    /// The symmetric kernels' memory (epoch, barriers, LL scratch): its allocation and its
    /// window, made with the first `WIN_COLL_SYMMETRIC` window where the backend has
    /// symmetric kernels, released with the communicator.
    resources: Option<(DevicePtr, Window)>,
    /// Copy-engine collectives run so far (their flags' epoch; every rank counts the same).
    ce_epoch: u32,
    /// The copy-engine flags were set to let every wait pass (the communicator failed).
    ce_released: bool,
    /// The one-sided waits' running expected counts (`signals`; host backend).
    expected: signals::Expected,
    /// Whether the resource memory has the host backend's layout (else the kernels').
    host_layout: bool,
}

/// Where a symmetric collective finds its buffers and memory (pure data, in `work`: the
/// executors below this module take it).
pub use crate::work::SymmetricPlace;

/// The exchange message: whether the allocation is mapped already, its span, its handle.
const MSG_BYTES: usize = 16 + ShareHandle::SIZE;

impl Windows {
    /// Windows registered and not yet deregistered.
    pub fn count(&self) -> usize {
        self.windows.len()
    }

    /// Registers `bytes` at `ptr` as a window (collective: every rank calls it, in the same
    /// order as its other registrations).
    pub fn register(&mut self, x: &Exchange, ptr: DevicePtr, bytes: usize, flags: u32) -> Result<Window> {
        self.register_attempt(x, Ok(ptr), bytes, flags)
    }

    /// As [`register`](Windows::register), for a buffer this rank may have failed to get:
    /// every rank takes part in the exchange, so a rank's failure is every rank's error.
    fn register_attempt(&mut self, x: &Exchange, ptr: Result<DevicePtr>, bytes: usize, flags: u32) -> Result<Window> {
        // What this rank holds; its problems are reported to every rank through the exchange
        // (so that none waits for a rank that gave up).
        let local = ptr.and_then(|ptr| {
            if ptr.0 == 0 || bytes == 0 {
                return Err(Error::invalid_argument(format!("a window needs a buffer and a size (got {ptr}, {bytes} bytes)")));
            }
            if flags & !(WIN_COLL_SYMMETRIC | WIN_STRICT_ORDERING | WIN_GIN_ONLY | WIN_CFT_COUNTED) != 0 {
                return Err(Error::invalid_argument(format!(
                    "window flags {flags:#x}: only NCCL_WIN_DEFAULT (0), NCCL_WIN_COLL_SYMMETRIC (1), \
                     NCCL_WIN_STRICT_ORDERING (2), NCCL_WIN_GIN_ONLY (4) and NCCL_WIN_CFT_COUNTED (8) exist"
                )));
            }
            self.local_part(x, ptr, bytes).map(|(mem, known)| (ptr, mem, known))
        });
        let mut msg = vec![0u8; MSG_BYTES];
        msg[4..8].copy_from_slice(&flags.to_le_bytes());
        match &local {
            Ok((_, mem, known)) => {
                msg[0] = if known.is_some() { 2 } else { 1 };
                msg[8..16].copy_from_slice(&(mem.bytes as u64).to_le_bytes());
                msg[16..].copy_from_slice(&mem.handle.to_bytes());
            }
            Err(_) => msg[0] = 0,
        }
        let all = (x.allgather)(&msg)?;
        let (ptr, mem, known) = local?;
        if let Some(r) = all.iter().position(|m| m.len() != MSG_BYTES || m[0] == 0) {
            return Err(Error::remote(format!(
                "rank {r} could not register its part of the window (its log says why)"
            )));
        }
        if let Some(r) = all.iter().position(|m| m[4..8] != flags.to_le_bytes()) {
            return Err(Error::invalid_usage(format!(
                "rank {r} registered this window with other flags than rank {} ({flags:#x}): every rank must give the same flags",
                x.rank
            )));
        }
        if all.iter().any(|m| (m[0] == 2) != known.is_some()) {
            return Err(Error::invalid_usage(
                "the ranks registered windows in different orders (a buffer one rank registered before is new to another): \
                 every rank must register and deregister its windows in the same order",
            ));
        }
        let mem_off = ptr.0 - mem.base.0;
        let i = match known {
            Some(i) => {
                self.mems[i].refs += 1;
                i
            }
            None => {
                let handles = all
                    .iter()
                    .map(|m| {
                        let span = u64::from_le_bytes(m[8..16].try_into().expect("8 bytes"));
                        ShareHandle::from_bytes(&m[16..]).map(|h| (span, h))
                    })
                    .collect::<Result<Vec<_>>>()?;
                // Every rank maps every rank's allocation; all of them keep it only if all
                // succeeded.
                let mapped = self.map_all(x, mem.base.0, &handles);
                let oks = (x.allgather)(&[mapped.is_ok() as u8])?;
                let mapped = mapped?;
                if let Some(r) = oks.iter().position(|o| o.first() != Some(&1)) {
                    if let Err(e) = self.unmap(&mapped) {
                        tracing::warn!(target: "INIT", "undoing a window's mappings: {}", e.message);
                    }
                    return Err(Error::remote(format!(
                        "rank {r} could not map the window's memory (its log says why)"
                    )));
                }
                self.mems.push(mapped);
                self.mems.len() - 1
            }
        };
        let m = &self.mems[i];
        let r = self.reserved.as_ref().expect("reserved when a memory is mapped");
        let id = self.next_id;
        self.next_id += 1;
        let w = Window {
            id,
            user: ptr,
            bytes,
            flags,
            base: r.base,
            stride: r.stride,
            offset: m.offset + mem_off,
            rank: x.rank,
            nranks: x.nranks,
        };
        self.windows.insert(id, w.clone());
        Ok(w)
    }

    /// This rank's allocation for a window at `ptr`, and whether it is mapped already.
    fn local_part(&self, x: &Exchange, ptr: DevicePtr, bytes: usize) -> Result<(crate::backend::SymmetricMemory, Option<usize>)> {
        let mem = x.backend.window_memory_or_err("window registration")?.symmetric_memory(ptr)?;
        let off = (ptr.0 - mem.base.0) as usize;
        if !off.is_multiple_of(WIN_ALIGNMENT) {
            return Err(Error::invalid_argument(format!(
                "a window must start a multiple of {WIN_ALIGNMENT} bytes into its allocation ({ptr} is {off} bytes into the one at {})",
                mem.base
            )));
        }
        if off + bytes > mem.bytes {
            return Err(Error::invalid_argument(format!(
                "the window {ptr} + {bytes} bytes runs past the end of its allocation ({} bytes at {})",
                mem.bytes, mem.base
            )));
        }
        let known = self.mems.iter().position(|m| m.local_base == mem.base.0);
        Ok((mem, known))
    }

    /// Reserves the flat range if needed, takes an offset and maps every rank's allocation.
    fn map_all(&mut self, x: &Exchange, local_base: u64, handles: &[(u64, ShareHandle)]) -> Result<Mem> {
        let memory = x.backend.window_memory_or_err("window registration")?;
        if self.reserved.is_none() {
            let stride = stride_setting();
            let bytes = usize::try_from(stride as u128 * x.nranks as u128)
                .map_err(|_| Error::invalid_argument(format!("{} ranks × a {stride}-byte stride is too large", x.nranks)))?;
            let base = memory.reserve_space(bytes)?;
            tracing::info!(target: "INIT", "symmetric windows: {bytes} bytes of address space reserved ({stride} per rank)");
            self.reserved =
                Some(Reserved { backend: Arc::clone(x.backend), base: base.0, bytes, stride, space: Space::new(stride) });
        }
        let r = self.reserved.as_mut().expect("reserved above");
        let span = handles.iter().map(|(s, _)| *s).max().unwrap_or(0).div_ceil(SPACE_ALIGN) * SPACE_ALIGN;
        let offset = r.space.alloc(span, SPACE_ALIGN).ok_or_else(|| {
            Error::invalid_usage(format!(
                "no room for a {span}-byte window in the {}-byte space per rank: deregister windows, or raise NCCL_WIN_STRIDE",
                r.stride
            ))
        })?;
        let mut mapped = Vec::with_capacity(handles.len());
        for (peer, (_, h)) in handles.iter().enumerate() {
            let at = DevicePtr(r.base + peer as u64 * r.stride + offset);
            if let Err(e) = memory.map_shared_at(x.device, h, at) {
                for m in &mapped {
                    let _ = memory.unmap_at(*m);
                }
                r.space.free(offset, span);
                return Err(e.context(format!("mapping rank {peer}'s window")));
            }
            mapped.push(at);
        }
        Ok(Mem { local_base, offset, span, mapped, refs: 1 })
    }

    /// Deregisters window `id` (local, as NCCL: no exchange); its mappings go with the last
    /// window of their allocation.
    pub fn deregister(&mut self, id: u64) -> Result<()> {
        let w = self.windows.remove(&id).ok_or_else(|| {
            Error::invalid_argument(format!("window {id} is not registered with this communicator (deregistered already?)"))
        })?;
        let i = self
            .mems
            .iter()
            .position(|m| w.offset >= m.offset && w.offset < m.offset + m.span)
            .expect("a window's memory is mapped");
        self.mems[i].refs -= 1;
        if self.mems[i].refs == 0 {
            let m = self.mems.swap_remove(i);
            return self.unmap(&m).map_err(|e| e.context("unmapping a window"));
        }
        Ok(())
    }

    /// Unmaps every rank's mapping of `m` and frees its offset.
    fn unmap(&mut self, m: &Mem) -> Result<()> {
        let r = self.reserved.as_mut().expect("a mapped memory has a space");
        let mut first = None;
        for at in &m.mapped {
            if let Err(e) = r.backend.window_memory_or_err("unmapping a window").and_then(|w| w.unmap_at(*at)) {
                first.get_or_insert(e);
            }
        }
        r.space.free(m.offset, m.span);
        first.map_or(Ok(()), Err)
    }

    /// Makes the symmetric kernels' memory if this communicator has none yet (collective:
    /// every rank calls it after the same registration, so a rank's failure is every rank's
    /// and all of them go on without it).
    pub fn ensure_resources(&mut self, x: &Exchange) -> Result<()> {
        if self.resources.is_some() {
            return Ok(());
        }
        // The kernels' layout on devices; the host needs the epoch, the scalar, one inbox per
        // rank and the one-sided signal counters (no LL scratch, no copy-engine flags).
        self.host_layout = x.backend.capabilities().host_addressable;
        let bytes = if self.host_layout {
            signals::host_resource_bytes(x.nranks).next_multiple_of(WIN_ALIGNMENT)
        } else {
            rustccl_kernels::exec::SYM_RES_BYTES as usize
        };
        let alloc = x.backend.window_memory_or_err("the symmetric kernels' memory").and_then(|w| w.alloc_symmetric(x.device, bytes)).and_then(|p| {
            let zeroed = x.backend.memset(p, 0, bytes, crate::backend::Stream::DEFAULT).and_then(|_| x.backend.synchronize(crate::backend::Stream::DEFAULT));
            zeroed.map(|_| p).inspect_err(|_| {
                let _ = x.backend.free(p);
            })
        });
        let local = alloc.as_ref().ok().copied();
        match self.register_attempt(x, alloc, bytes, 0) {
            Ok(w) => {
                self.windows.remove(&w.id);
                self.resources = Some((local.expect("registered"), w));
                Ok(())
            }
            Err(e) => {
                if let Some(p) = local {
                    let _ = x.backend.free(p);
                }
                Err(e.context("making the symmetric kernels' memory"))
            }
        }
    }

    /// The flat-range addresses of `send` and `recv` (`send_bytes`, `recv_bytes` long) when
    /// both lie in `WIN_COLL_SYMMETRIC` windows and the symmetric kernels' memory exists.
    pub fn symmetric_place(&self, send: DevicePtr, send_bytes: usize, recv: DevicePtr, recv_bytes: usize) -> Option<SymmetricPlace> {
        let (_, res) = self.resources.as_ref()?;
        Some(SymmetricPlace {
            send: self.symmetric_flat(send, send_bytes)?,
            recv: self.symmetric_flat(recv, recv_bytes)?,
            res: res.flat(res.rank),
            stride: res.stride,
            rank: res.rank,
        })
    }

    /// The flat-range address of `bytes` at `p` when they lie in one `WIN_COLL_SYMMETRIC`
    /// window of this rank.
    pub fn symmetric_flat(&self, p: DevicePtr, bytes: usize) -> Option<u64> {
        self.windows.values().find_map(|w| {
            let inside = w.flags & WIN_COLL_SYMMETRIC != 0
                && p.0 >= w.user.0
                && p.0.checked_add(bytes as u64)? <= w.user.0 + w.bytes as u64;
            inside.then(|| w.flat(w.rank) + (p.0 - w.user.0))
        })
    }

    /// Whether `w` is a window registered with this communicator and not yet deregistered.
    pub fn is_live(&self, w: &Window) -> bool {
        self.windows.get(&w.id) == Some(w)
    }

    /// Where rank `owner` counts the one-sided signals from rank `from` (a flat-range
    /// address of a 64-bit counter in its resource memory; `signals`), once the resource
    /// memory exists.
    pub fn signal_counter(&self, owner: usize, from: usize) -> Option<u64> {
        let (_, res) = self.resources.as_ref()?;
        (owner < res.nranks && from < res.nranks).then(|| res.flat(owner) + signals::counters_at(res.nranks, self.host_layout) + 8 * from as u64)
    }

    /// Where this rank's device-side running expected counts start (u64 per peer, the
    /// kernels' layout: `SYM_RES_SIGNALS_SEEN`), once the resource memory exists; `None` in
    /// the host layout, whose waits count on the host ([`Windows::expected`]).
    pub fn signals_seen(&self) -> Option<u64> {
        let (_, res) = self.resources.as_ref()?;
        (!self.host_layout).then(|| res.flat(res.rank) + rustccl_kernels::exec::SYM_RES_SIGNALS_SEEN)
    }

    /// The one-sided waits' running expected counts.
    pub fn expected(&mut self) -> &mut signals::Expected {
        &mut self.expected
    }

    /// This rank's symmetric resource memory in the flat range, once it exists.
    pub fn resource_base(&self) -> Option<u64> {
        self.resources.as_ref().map(|(_, w)| w.flat(w.rank))
    }

    /// After a failure: sets this rank's copy-engine flags past every epoch, so that
    /// streams waiting in a copy-engine collective for a peer that will never arrive (dead,
    /// or aborted) go on instead of hanging (stream waits cannot be stopped otherwise). Once;
    /// on a stream of its own (the caller's may be the blocked one).
    pub fn release_copy_engine_waits(&mut self, backend: &dyn DeviceBackend, device: usize, nranks: usize) {
        let Some((mem, _)) = self.resources.as_ref() else { return };
        if self.ce_released {
            return;
        }
        self.ce_released = true;
        let flags = mem.0 + rustccl_kernels::exec::SYM_RES_CE;
        // Waits compare as the driver does, (int32_t)(flag - value) >= 0: a value far enough
        // past every epoch used so far (not the largest u32, which compares as below).
        let past = self.ce_epoch.wrapping_mul(2).wrapping_add(1 << 20);
        let r = backend.create_stream(device).and_then(|s| {
            let r = (0..nranks)
                .try_for_each(|p| backend.kernels_or_err("releasing copy-engine waits")?.stream_write_u32(DevicePtr(flags + 4 * p as u64), past, s))
                .and_then(|_| backend.synchronize(s));
            let _ = backend.destroy_stream(s);
            r
        });
        if let Err(e) = r {
            tracing::warn!(target: "INIT", "releasing the copy-engine collectives' waits: {}", e.message);
        }
    }

    /// The epoch of the next copy-engine collective (from 1).
    pub fn next_ce_epoch(&mut self) -> u32 {
        self.ce_epoch = self.ce_epoch.wrapping_add(1);
        self.ce_epoch
    }

    /// Unmaps everything and gives the range back (the communicator is going away).
    pub fn release(&mut self) {
        self.windows.clear();
        let resources = self.resources.take();
        let Some(r) = self.reserved.take() else { return };
        for m in self.mems.drain(..) {
            for at in m.mapped {
                if let Err(e) = r.backend.window_memory_or_err("unmapping a window").and_then(|w| w.unmap_at(at)) {
                    tracing::warn!(target: "INIT", "unmapping a window at {at}: {}", e.message);
                }
            }
        }
        if let Err(e) = r.backend.window_memory_or_err("releasing windows").and_then(|w| w.release_space(DevicePtr(r.base), r.bytes)) {
            tracing::warn!(target: "INIT", "releasing the windows' address space: {}", e.message);
        }
        if let Some((p, _)) = resources {
            if let Err(e) = r.backend.free(p) {
                tracing::warn!(target: "INIT", "freeing the symmetric kernels' memory: {}", e.message);
            }
        }
    }
}

impl Drop for Windows {
    fn drop(&mut self) {
        self.release();
    }
}

/// `NCCL_WIN_STRIDE` (bytes per rank; unset, 0 or -1: the default), rounded up to 4 GiB.
fn stride_setting() -> u64 {
    const FOUR_G: u64 = 4 << 30;
    let v = crate::params::env_int_or("NCCL_WIN_STRIDE", -1);
    let s = if v <= 0 { DEFAULT_STRIDE } else { v as u64 };
    s.div_ceil(FOUR_G) * FOUR_G
}

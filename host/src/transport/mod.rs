//! Transports: how a FIFO between two ranks is made. Ranks on one host (same host identity)
//! share the FIFO's memory (`shm`, unless `NCCL_SHM_DISABLE=1`); others each keep a local
//! FIFO and the proxy thread moves slots through the network plugin (`net`).
//!
//! The receiving side creates the connection and tells the sender, through the bootstrap, how
//! to reach it (a shared-memory handle or a network handle). Making a connection is a
//! non-blocking state machine ([`Establish`]), so that every connection of a group, across
//! every communicator in it, is made at once without either side waiting for the other.

pub mod fifo;
pub mod proxy;

use std::sync::{Arc, Mutex};

use rustccl_plugin_api::net::{NetHandle, NET_HANDLE_BYTES, PTR_HOST};
use rustccl_plugin_api::PluginHandle;

use crate::backend::{DeviceBackend, DevicePtr, ShareHandle};
use crate::bootstrap::Bootstrap;
use crate::program::{Link, Purpose};
use crate::error::{Error, Result};
use crate::plugin::net::NetInstance;
use fifo::{fifo_bytes, Fifo, LocalMemory};

/// Which end of a link this rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    Send,
    Recv,
}

/// How a connection moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Host backend: the FIFO in host memory both ranks map.
    Shm,
    /// Through the network plugin and the proxy.
    Net,
    /// Device backends: slots in the receiver's device memory, written by the sender's
    /// device over NVLink or PCIe (CUDA IPC); counters in host memory both ranks map.
    P2p,
    /// Device backends with `NCCL_P2P_DISABLE=1`: slots in pinned host memory both devices
    /// can reach.
    ShmPinned,
}

/// Where a connection's FIFO memory comes from; released with the connection.
enum Memory {
    /// Exported by this rank (the receiver) through the backend.
    Exported { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr },
    /// Imported from the receiver.
    Imported { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr },
    Local(#[allow(dead_code)] LocalMemory),
    /// Host memory registered with a device backend (unregistered before it is unmapped).
    Registered { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr },
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self {
            Memory::Exported { backend, ptr } => {
                let _ = backend.free(*ptr);
            }
            Memory::Imported { backend, ptr } => {
                let _ = backend.close_import(*ptr);
            }
            Memory::Local(_) => {}
            Memory::Registered { backend, ptr } => {
                let _ = backend.unregister_host(*ptr);
            }
        }
    }
}

/// One end of a connection: a FIFO, and the error the proxy reports if the network fails.
pub struct Connection {
    pub link: Link,
    pub dir: Dir,
    pub kind: Kind,
    pub fifo: Fifo,
    pub error: Mutex<Option<Error>>,
    /// Released in order: registrations before the mappings they cover.
    _memory: Vec<Memory>,
}

impl Connection {
    /// A connection over a FIFO whose header stand-in is `header` (device addresses in the
    /// FIFO may be made up): for tests of what is built from connections.
    #[cfg(test)]
    pub(crate) fn for_test(link: Link, dir: Dir, kind: Kind, fifo: Fifo, header: LocalMemory) -> Connection {
        Connection { link, dir, kind, fifo, error: Mutex::new(None), _memory: vec![Memory::Local(header)] }
    }

    /// The error the proxy saw on this connection, if any.
    pub fn failure(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Bytes of each FIFO slot of the host backend (its `Capabilities::slot_bytes`).
pub const SLOT_BYTES: usize = 512 * 1024;
/// Bytes of each FIFO slot of device connections (as NCCL's Simple buffer: 4 MiB over 8 steps).
pub const GPU_SLOT_BYTES: usize = 512 << 10;
/// P2P connections also have slots for LL and LL128 steps (see `kernels/src/device/exec.cu`),
/// after the Simple ones: 8 of each size.
pub const GPU_LL_SLOT_BYTES: usize = 64 << 10;
pub const GPU_LL128_SLOT_BYTES: usize = 256 << 10;

/// Device memory of a P2P connection's slots.
pub fn p2p_slots_bytes() -> usize {
    fifo::STEPS * (GPU_SLOT_BYTES + GPU_LL_SLOT_BYTES + GPU_LL128_SLOT_BYTES)
}

/// Where a P2P connection's LL and LL128 slots start, given its first (Simple) slot.
pub fn p2p_protocol_slots(slots: u64) -> (u64, u64) {
    let ll = slots + (fifo::STEPS * GPU_SLOT_BYTES) as u64;
    (ll, ll + (fifo::STEPS * GPU_LL_SLOT_BYTES) as u64)
}

/// The bootstrap tag under which the receiver of `link` sends its handle.
fn handle_tag(purpose: Purpose) -> u64 {
    crate::bootstrap::tags::connection(purpose)
}

/// What a communicator offers connection making.
pub struct Context<'a> {
    pub bootstrap: &'a Bootstrap,
    pub backend: &'a Arc<dyn DeviceBackend>,
    pub device: usize,
    pub net: &'a NetInstance,
    pub proxy: &'a proxy::Proxy,
    pub shm_disabled: bool,
    pub p2p_disabled: bool,
}

impl Context<'_> {
    /// The transport between this rank and `peer`.
    pub fn kind_for(&self, peer: u32) -> Kind {
        let peers = self.bootstrap.peers();
        let same_host = peers[peer as usize].host_hash == peers[self.bootstrap.rank() as usize].host_hash;
        let device = !self.backend.capabilities().host_addressable;
        match (device, same_host) {
            (false, true) if !self.shm_disabled => Kind::Shm,
            (false, _) => Kind::Net,
            (true, true) if !self.p2p_disabled => Kind::P2p,
            (true, true) if !self.shm_disabled => Kind::ShmPinned,
            (true, _) => Kind::Net,
        }
    }

    /// FIFO slot size (the backend's).
    pub fn slot_bytes(&self) -> usize {
        self.backend.capabilities().slot_bytes
    }

    fn host() -> Result<Arc<dyn DeviceBackend>> {
        Ok(crate::backend::host::HostBackend::shared()? as Arc<dyn DeviceBackend>)
    }

    /// Receiver of a device connection: makes the memory and the message for the sender.
    fn device_fifo_recv(&self, kind: Kind) -> Result<(Fifo, Vec<Memory>, Vec<u8>)> {
        let host = Context::host()?;
        let hb = fifo::header_bytes();
        let slots = fifo::STEPS * GPU_SLOT_BYTES;
        match kind {
            Kind::P2p => {
                // Header and slots in this device's memory: this rank polls `tail` locally
                // and the sender writes it over NVLink (as NCCL keeps its P2P counters).
                let (dptr, dhandle) = self.backend.alloc_shareable(self.device, hb + p2p_slots_bytes())?;
                let mem = vec![Memory::Exported { backend: Arc::clone(self.backend), ptr: dptr }];
                // Zeroed before the sender learns of it, on a stream of this device that waits
                // for nothing else (kernels running on the default stream may wait on peers).
                let s = self.backend.create_stream(self.device)?;
                let zeroed = self.backend.memset(dptr, 0, hb, s).and_then(|_| self.backend.synchronize(s));
                let _ = self.backend.destroy_stream(s);
                zeroed?;
                let mut msg = vec![2u8];
                msg.extend_from_slice(&dhandle.to_bytes());
                let (fifo, mem) = p2p_fifo(dptr, mem);
                Ok((fifo, mem, msg))
            }
            _ => {
                let (hptr, hhandle) = host.alloc_shareable(0, hb + slots)?;
                let haddr = host.host_address(hptr, hb + slots)?;
                // SAFETY: the mapping stays until `mem` releases it, after the registration.
                let dptr = unsafe { self.backend.register_host(haddr as *mut u8, hb + slots)? };
                let mut msg = vec![3u8];
                msg.extend_from_slice(&hhandle.to_bytes());
                let mem = vec![
                    Memory::Registered { backend: Arc::clone(self.backend), ptr: dptr },
                    Memory::Exported { backend: host, ptr: hptr },
                ];
                // SAFETY: as above; the slots follow the header in the registered mapping.
                Ok((unsafe { Fifo::with_device_slots(haddr as *mut u8, dptr.0, dptr.0 + hb as u64, GPU_SLOT_BYTES) }, mem, msg))
            }
        }
    }

    /// Sender of a device connection: maps what the receiver made.
    fn device_fifo_send(&self, msg: &[u8]) -> Result<(Fifo, Vec<Memory>)> {
        let host = Context::host()?;
        let hb = fifo::header_bytes();
        let slots = fifo::STEPS * GPU_SLOT_BYTES;
        if msg.first() == Some(&2) {
            let dhandle = ShareHandle::from_bytes(&msg[1..])?;
            let dptr = self.backend.import(self.device, &dhandle)?;
            let mem = vec![Memory::Imported { backend: Arc::clone(self.backend), ptr: dptr }];
            return Ok(p2p_fifo(dptr, mem));
        }
        let handle_len = 128;
        let hhandle = ShareHandle::from_bytes(msg.get(1..1 + handle_len).ok_or_else(|| Error::internal("short handle"))?)?;
        // The only importer: the file goes once mapped (nothing left if a rank is killed).
        let hptr = host.import_last(0, &hhandle)?;
        let host_mem = Memory::Imported { backend: Arc::clone(&host), ptr: hptr };
        // Shared pinned host memory (message 3): header and slots, registered here too.
        let haddr = host.host_address(hptr, hb + slots)?;
        // SAFETY: the imported mapping outlives the registration (released after it).
        let dptr = unsafe { self.backend.register_host(haddr as *mut u8, hb + slots)? };
        let mem = vec![Memory::Registered { backend: Arc::clone(self.backend), ptr: dptr }, host_mem];
        // SAFETY: as above.
        Ok((unsafe { Fifo::with_device_slots(haddr as *mut u8, dptr.0, dptr.0 + hb as u64, GPU_SLOT_BYTES) }, mem))
    }
}

/// A P2P connection's FIFO over device memory at `dptr` (header, then the slots), kept mapped
/// by `mem`. The host never reads this header; the FIFO's host-side header is a zeroed stand-in
/// owned with the memory.
fn p2p_fifo(dptr: DevicePtr, mut mem: Vec<Memory>) -> (Fifo, Vec<Memory>) {
    let stand_in = LocalMemory::new(fifo::header_bytes());
    let hb = fifo::header_bytes() as u64;
    // SAFETY: `stand_in` is a zeroed header the Fifo may read, kept with the connection; the
    // device header and slots are the `mem` mapping, released with the connection.
    let fifo = unsafe { Fifo::with_device_slots(stand_in.ptr(), dptr.0, dptr.0 + hb, GPU_SLOT_BYTES) };
    mem.push(Memory::Local(stand_in));
    (fifo, mem)
}

/// A connection being made.
pub enum Establish {
    /// Receiver, shared memory: made at once, handle sent.
    Start { link: Link, dir: Dir },
    /// Sender: waiting for the receiver's handle.
    AwaitHandle { link: Link },
    /// Receiver, network: listening, waiting for the sender.
    Accepting { link: Link, listen: PluginHandle, mem: LocalMemory },
    /// Sender, network: connecting.
    Connecting { link: Link, handle: NetHandle, mem: LocalMemory },
    Done,
}

impl Establish {
    pub fn new(link: Link, dir: Dir) -> Establish {
        match dir {
            Dir::Recv => Establish::Start { link, dir },
            Dir::Send => Establish::AwaitHandle { link },
        }
    }

    /// Advances; returns the connection once made.
    pub fn poll(&mut self, cx: &Context) -> Result<Option<Arc<Connection>>> {
        let zeroed_fifo = |slot: usize| LocalMemory::new(fifo_bytes(slot));
        match std::mem::replace(self, Establish::Done) {
            Establish::Start { link, .. } => match cx.kind_for(link.peer) {
                kind @ (Kind::P2p | Kind::ShmPinned) => {
                    let (fifo, mem, msg) = cx.device_fifo_recv(kind)?;
                    cx.bootstrap.send(link.peer, handle_tag(link.purpose), &msg)?;
                    Ok(Some(Arc::new(Connection { link, dir: Dir::Recv, kind, fifo, error: Mutex::new(None), _memory: mem })))
                }
                Kind::Shm => {
                    let bytes = fifo_bytes(SLOT_BYTES);
                    let (ptr, handle) = cx.backend.alloc_shareable(cx.device, bytes)?;
                    let base = cx.backend.host_address(ptr, bytes)?;
                    let mut msg = vec![0u8];
                    msg.extend_from_slice(&handle.to_bytes());
                    cx.bootstrap.send(link.peer, handle_tag(link.purpose), &msg)?;
                    let memory = Memory::Exported { backend: Arc::clone(cx.backend), ptr };
                    // SAFETY: the region is fifo_bytes(SLOT_BYTES) of zeroed shared memory that
                    // `memory` keeps mapped as long as the connection lives.
                    let fifo = unsafe { Fifo::new(base as *mut u8, SLOT_BYTES) };
                    Ok(Some(Arc::new(Connection { link, dir: Dir::Recv, kind: Kind::Shm, fifo, error: Mutex::new(None), _memory: vec![memory] })))
                }
                Kind::Net => {
                    let net = &cx.net.plugin.api;
                    let (handle, listen) = net.listen(cx.net.ctx, 0).map_err(Error::from)?;
                    let mut msg = vec![1u8];
                    msg.extend_from_slice(&handle.bytes);
                    cx.bootstrap.send(link.peer, handle_tag(link.purpose), &msg)?;
                    *self = Establish::Accepting { link, listen, mem: zeroed_fifo(cx.slot_bytes()) };
                    self.poll(cx)
                }
            },
            Establish::AwaitHandle { link } => {
                let Some(msg) = cx.bootstrap.try_recv(link.peer, handle_tag(link.purpose))? else {
                    *self = Establish::AwaitHandle { link };
                    return Ok(None);
                };
                match (msg.first(), cx.kind_for(link.peer)) {
                    (Some(2), Kind::P2p) | (Some(3), Kind::ShmPinned) => {
                        let kind = cx.kind_for(link.peer);
                        let (fifo, mem) = cx.device_fifo_send(&msg)?;
                        Ok(Some(Arc::new(Connection { link, dir: Dir::Send, kind, fifo, error: Mutex::new(None), _memory: mem })))
                    }
                    (Some(0), Kind::Shm) => {
                        let handle = ShareHandle::from_bytes(&msg[1..])?;
                        // The only importer: the file goes once mapped, so a killed rank
                        // leaves nothing in /dev/shm.
                        let ptr = cx.backend.import_last(cx.device, &handle)?;
                        let base = cx.backend.host_address(ptr, fifo_bytes(SLOT_BYTES))?;
                        let memory = Memory::Imported { backend: Arc::clone(cx.backend), ptr };
                        // SAFETY: the receiver's zeroed FIFO region, mapped while `memory` lives.
                        let fifo = unsafe { Fifo::new(base as *mut u8, SLOT_BYTES) };
                        Ok(Some(Arc::new(Connection { link, dir: Dir::Send, kind: Kind::Shm, fifo, error: Mutex::new(None), _memory: vec![memory] })))
                    }
                    (Some(1), Kind::Net) if msg.len() == 1 + NET_HANDLE_BYTES => {
                        let mut handle = NetHandle::default();
                        handle.bytes.copy_from_slice(&msg[1..]);
                        *self = Establish::Connecting { link, handle, mem: zeroed_fifo(cx.slot_bytes()) };
                        self.poll(cx)
                    }
                    _ => Err(Error::internal(format!(
                        "rank {} sent a connection handle this rank cannot use (transport mismatch)",
                        link.peer
                    ))),
                }
            }
            Establish::Accepting { link, listen, mem } => {
                let net = &cx.net.plugin.api;
                match net.accept(listen).map_err(Error::from)? {
                    None => {
                        *self = Establish::Accepting { link, listen, mem };
                        Ok(None)
                    }
                    Some(comm) => {
                        let _ = net.close_listen(listen);
                        Ok(Some(self.net_connection(cx, link, Dir::Recv, comm, mem)?))
                    }
                }
            }
            Establish::Connecting { link, handle, mem } => {
                let net = &cx.net.plugin.api;
                match net.connect(cx.net.ctx, 0, &handle).map_err(Error::from)? {
                    None => {
                        *self = Establish::Connecting { link, handle, mem };
                        Ok(None)
                    }
                    Some(comm) => Ok(Some(self.net_connection(cx, link, Dir::Send, comm, mem)?)),
                }
            }
            Establish::Done => Err(Error::internal("connection polled after it was made")),
        }
    }

    /// A network connection's FIFO: local host memory the proxy moves through the plugin. With
    /// a device backend the memory is registered with it too, so that the device writes and
    /// reads the slots directly (host-staged transfers).
    fn net_connection(&self, cx: &Context, link: Link, dir: Dir, comm: PluginHandle, mem: LocalMemory) -> Result<Arc<Connection>> {
        let slot = cx.slot_bytes();
        let mut memory = Vec::new();
        let fifo = if cx.backend.capabilities().host_addressable {
            // SAFETY: `mem` is zeroed and sized for the FIFO; the connection owns it.
            unsafe { Fifo::new(mem.ptr(), slot) }
        } else {
            // SAFETY: `mem` outlives the registration (released after it, see `memory`).
            let dptr = unsafe { cx.backend.register_host(mem.ptr(), fifo_bytes(slot))? };
            memory.push(Memory::Registered { backend: Arc::clone(cx.backend), ptr: dptr });
            // SAFETY: as above; the registration maps the whole FIFO.
            unsafe { Fifo::with_mapped_slots(mem.ptr(), dptr.0, slot) }
        };
        memory.push(Memory::Local(mem));
        let (base, len) = fifo.slots_region();
        let mr = cx.net.plugin.api.reg_mr(comm, base as usize, len, PTR_HOST).map_err(Error::from)?;
        let conn = Arc::new(Connection { link, dir, kind: Kind::Net, fifo, error: Mutex::new(None), _memory: memory });
        cx.proxy.add(Arc::clone(&conn), comm, mr);
        Ok(conn)
    }
}

#[cfg(test)]
mod caps_tests {
    use super::*;

    #[test]
    fn slot_constants_are_the_backends_capabilities() {
        let (h, g) = (crate::backend::Capabilities::host(), crate::backend::Capabilities::gpu());
        assert_eq!(h.slot_bytes, SLOT_BYTES);
        assert_eq!((g.slot_bytes, g.ll_slot_bytes, g.ll128_slot_bytes), (GPU_SLOT_BYTES, GPU_LL_SLOT_BYTES, GPU_LL128_SLOT_BYTES));
    }
}

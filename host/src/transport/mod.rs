//! Transports: how a FIFO between two ranks is made. Each transport is one module behind the
//! [`Transport`] trait (NCCL's `ncclTransport`: can-connect, receiver setup, sender connect,
//! resources released with the connection), and [`REGISTRY`] lists them in NCCL's order: the
//! first that can connect two ranks wins.
//!
//! - [`p2p`]: device backends, ranks of one host: slots in the receiver's device memory.
//! - [`shm`]: ranks of one host: a FIFO in host memory both map (host backend), or in pinned
//!   host memory both devices reach (device backends with `NCCL_P2P_DISABLE=1`).
//! - [`net`]: anything else: each side keeps a local FIFO and the [`proxy`] thread moves slots
//!   through the network plugin.
//!
//! The receiving side sets up the connection and tells the sender, through the bootstrap, how
//! to reach it: a message whose first byte is the transport's place in the registry and whose
//! rest is the transport's own (a shared-memory handle, a network handle). Making a connection
//! is a non-blocking state machine ([`Establish`]), so that every connection of a group, across
//! every communicator in it, is made at once without either side waiting for the other, in
//! NCCL's order ([`establish`]: every receiver set up, every sender connected, then both
//! polled).

pub mod establish;
pub mod fifo;
pub mod net;
pub mod p2p;
pub mod proxy;
pub mod shm;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::backend::{DeviceBackend, DevicePtr};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::plugin::net::NetInstance;
use crate::program::{Link, Purpose};
use fifo::{Fifo, LocalMemory};

pub use establish::{establish_all, Establish, Wanted};
pub use p2p::{p2p_protocol_slots, p2p_slots_bytes};

/// Which end of a link this rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    Send,
    Recv,
}

/// How a connection moves data (which transport made it).
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
pub(crate) enum Memory {
    /// Exported by this rank (the receiver) through the backend: `bytes` allocated here.
    Exported { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr, bytes: usize },
    /// Imported from the receiver.
    Imported { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr },
    Local(LocalMemory),
    /// Host memory registered with a device backend (unregistered before it is unmapped).
    Registered { backend: Arc<dyn DeviceBackend>, ptr: DevicePtr },
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self {
            Memory::Exported { backend, ptr, .. } => {
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
    /// Receiving network connections: slots the executors have said they will consume so far
    /// (a running total). The proxy posts a receive only for a slot below it, so that the net
    /// plugin never holds a receive that no operation waits for (NCCL posts receives per step
    /// of an operation too): a peer that leaves after its last send is then no failure here,
    /// a failed receive always is, and a connection closes with nothing in flight.
    expected: AtomicU64,
    /// The observer's transfers queued on this connection (network connections only).
    pub(crate) proxy_ops: crate::observe::ProxyOpQueue,
    /// Released in order: registrations before the mappings they cover.
    _memory: Vec<Memory>,
}

impl Connection {
    /// A connection over `fifo`, keeping `memory` (released in order) while it lives.
    pub(crate) fn new(link: Link, dir: Dir, kind: Kind, fifo: Fifo, memory: Vec<Memory>) -> Connection {
        Connection {
            link,
            dir,
            kind,
            fifo,
            error: Mutex::new(None),
            expected: AtomicU64::new(0),
            proxy_ops: Default::default(),
            _memory: memory,
        }
    }

    /// A connection over a FIFO whose header stand-in is `header` (device addresses in the
    /// FIFO may be made up): for tests of what is built from connections.
    #[cfg(test)]
    pub(crate) fn for_test(link: Link, dir: Dir, kind: Kind, fifo: Fifo, header: LocalMemory) -> Connection {
        Connection::new(link, dir, kind, fifo, vec![Memory::Local(header)])
    }

    /// Bytes this rank allocated for the connection (what releasing it frees here; memory
    /// mapped from the peer is the peer's).
    pub fn allocated_bytes(&self) -> usize {
        self._memory
            .iter()
            .map(|m| match m {
                Memory::Exported { bytes, .. } => *bytes,
                Memory::Local(l) => l.bytes(),
                Memory::Imported { .. } | Memory::Registered { .. } => 0,
            })
            .sum()
    }

    /// The error the proxy saw on this connection, if any.
    pub fn failure(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// An executor is about to consume `slots` more slots of this receiving connection (see
    /// [`expected`](Self::expected)). Only the proxy's connections need to be told.
    pub fn expect_slots(&self, slots: u64) {
        self.expected.fetch_add(slots, Ordering::Release);
    }

    /// Slots of this receiving connection the executors have said they will consume so far.
    pub fn expected(&self) -> u64 {
        self.expected.load(Ordering::Acquire)
    }

    /// Whether this is the sending end of a network connection that still holds data the
    /// proxy has not handed to the plugin, or whose send has not completed, and has not
    /// failed (what `Communicator::finalize` and `destroy` wait for).
    pub fn owes_peer(&self) -> bool {
        self.kind == Kind::Net && self.dir == Dir::Send && self.fifo.head() < self.fifo.tail() && self.failure().is_none()
    }
}


/// Bytes of each FIFO slot of the host backend (its `Capabilities::slot_bytes`).
pub const SLOT_BYTES: usize = 512 * 1024;
/// The Simple FIFO of device connections and its slot size (`NCCL_BUFFSIZE` over
/// `RUSTCCL_SIMPLE_STEPS` slots).
pub use crate::backend::caps::{gpu_simple_fifo, gpu_slot_bytes};
/// P2P connections also have slots for LL and LL128 steps (see `kernels/src/device/exec.cu`),
/// after the Simple ones: 8 of each size.
pub const GPU_LL_SLOT_BYTES: usize = 64 << 10;
pub const GPU_LL128_SLOT_BYTES: usize = 256 << 10;

/// The bootstrap tag under which the receiver of `link` sends its setup message.
fn handle_tag(purpose: Purpose) -> u64 {
    crate::bootstrap::tags::connection(purpose)
}

/// What the choice of transport between two ranks depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    /// The backend's memory is a device's (`!Capabilities::host_addressable`).
    pub device: bool,
    /// Both ranks have the same host identity.
    pub same_host: bool,
    /// `NCCL_SHM_DISABLE=1`.
    pub shm_disabled: bool,
    /// `NCCL_P2P_DISABLE=1`.
    pub p2p_disabled: bool,
}

/// A connection a transport has started and that waits for its peer (the network's accept
/// and connect); [`Establish`] polls it without blocking.
pub trait Pending {
    fn poll(self: Box<Self>, cx: &Context) -> Result<Progress>;
}

/// Where making a connection stands.
pub enum Progress {
    Made(Arc<Connection>),
    Waiting(Box<dyn Pending>),
}

/// One way of connecting two ranks, shaped after NCCL's `ncclTransport`. The receiver sets up
/// its end first and sends the sender a message; the sender connects from it. What a
/// transport allocates is held by the connection it makes and released with it.
pub trait Transport: Sync {
    /// Its name, for logs and errors.
    fn name(&self) -> &'static str;
    /// The kind of the connections it makes.
    fn kind(&self) -> Kind;
    /// Whether it connects two ranks in this situation (NCCL's `canConnect`).
    fn can_connect(&self, reach: &Reach) -> bool;
    /// Receiver: makes this end (or starts to) and the message that tells the sender how to
    /// reach it (NCCL's recv `setup`). The message is sent before the end is polled again.
    fn setup_recv(&self, cx: &Context, link: Link) -> Result<(Progress, Vec<u8>)>;
    /// Sender: connects to the receiver's end from its message (NCCL's send `setup` and
    /// `connect`).
    fn connect_send(&self, cx: &Context, link: Link, message: &[u8]) -> Result<Progress>;
}

/// The transports in the order they are tried (NCCL's: P2P, SHM, NET). A transport's place
/// here is the first byte of its setup messages. A new transport is a module and a line here.
pub static REGISTRY: [&dyn Transport; 4] = [&p2p::P2p, &shm::Shm, &shm::PinnedShm, &net::Net];

/// The first transport of the registry that can connect ranks in `reach`, with its tag.
pub fn choose(reach: &Reach) -> (u8, &'static dyn Transport) {
    let (tag, t) = REGISTRY
        .iter()
        .enumerate()
        .find(|(_, t)| t.can_connect(reach))
        .expect("the network transport connects any two ranks");
    (tag as u8, *t)
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
    /// What the choice of transport to `peer` depends on.
    pub fn reach(&self, peer: u32) -> Reach {
        let peers = self.bootstrap.peers();
        Reach {
            device: !self.backend.capabilities().host_addressable,
            same_host: peers[peer as usize].host_hash == peers[self.bootstrap.rank() as usize].host_hash,
            shm_disabled: self.shm_disabled,
            p2p_disabled: self.p2p_disabled,
        }
    }

    /// The transport between this rank and `peer`, and its tag.
    pub fn transport_for(&self, peer: u32) -> (u8, &'static dyn Transport) {
        choose(&self.reach(peer))
    }

    /// The kind of connection between this rank and `peer`.
    pub fn kind_for(&self, peer: u32) -> Kind {
        self.transport_for(peer).1.kind()
    }

    /// FIFO slot size (the backend's).
    pub fn slot_bytes(&self) -> usize {
        self.backend.capabilities().slot_bytes
    }

    /// The host backend, whose shareable memory device transports map into devices.
    fn host() -> Result<Arc<dyn DeviceBackend>> {
        Ok(crate::backend::host::HostBackend::shared()? as Arc<dyn DeviceBackend>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_constants_are_the_backends_capabilities() {
        let (h, g) = (crate::backend::Capabilities::host(), crate::backend::Capabilities::gpu());
        assert_eq!(h.slot_bytes, SLOT_BYTES);
        assert_eq!((g.slot_bytes, g.ll_slot_bytes, g.ll128_slot_bytes), (gpu_slot_bytes(), GPU_LL_SLOT_BYTES, GPU_LL128_SLOT_BYTES));
    }

    fn kind(device: bool, same_host: bool, shm_disabled: bool, p2p_disabled: bool) -> Kind {
        choose(&Reach { device, same_host, shm_disabled, p2p_disabled }).1.kind()
    }

    #[test]
    fn host_backend_uses_shared_memory_on_one_host_and_the_network_otherwise() {
        for p2p_disabled in [false, true] {
            assert_eq!(kind(false, true, false, p2p_disabled), Kind::Shm);
            assert_eq!(kind(false, true, true, p2p_disabled), Kind::Net);
            assert_eq!(kind(false, false, false, p2p_disabled), Kind::Net);
            assert_eq!(kind(false, false, true, p2p_disabled), Kind::Net);
        }
    }

    #[test]
    fn device_backend_prefers_p2p_then_pinned_shared_memory_then_the_network() {
        assert_eq!(kind(true, true, false, false), Kind::P2p);
        assert_eq!(kind(true, true, true, false), Kind::P2p);
        assert_eq!(kind(true, true, false, true), Kind::ShmPinned);
        assert_eq!(kind(true, true, true, true), Kind::Net);
        for (shm, p2p) in [(false, false), (true, false), (false, true), (true, true)] {
            assert_eq!(kind(true, false, shm, p2p), Kind::Net);
        }
    }

    #[test]
    fn each_kind_has_one_transport_and_its_tag_is_its_place() {
        let kinds: Vec<Kind> = REGISTRY.iter().map(|t| t.kind()).collect();
        assert_eq!(kinds, [Kind::P2p, Kind::Shm, Kind::ShmPinned, Kind::Net]);
        let names: Vec<&str> = REGISTRY.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["p2p", "shm", "shm-pinned", "net"]);
        let reach = Reach { device: true, same_host: true, shm_disabled: false, p2p_disabled: true };
        assert_eq!(choose(&reach).0, 2);
    }
}

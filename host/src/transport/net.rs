//! Network transport: ranks of different hosts, or of one host when the shared-memory
//! transports are disabled. Each side keeps a FIFO in local host memory (registered with a
//! device backend, so that the device writes and reads the slots directly) and the
//! communicator's [`proxy`](super::proxy) thread moves the slots through the net plugin.
//!
//! The receiver listens and sends the sender the plugin's handle; the receiver's accept and
//! the sender's connect are polled without blocking until the plugin completes them.

use std::sync::Arc;

use rustccl_plugin_api::net::{NetHandle, NET_HANDLE_BYTES, PTR_HOST};
use rustccl_plugin_api::PluginHandle;

use super::fifo::{fifo_bytes, Fifo, LocalMemory};
use super::{Connection, Context, Dir, Kind, Memory, Pending, Progress, Reach, Transport};
use crate::error::{Error, Result};
use crate::program::Link;

/// Through the network plugin and the proxy.
pub struct Net;

impl Transport for Net {
    fn name(&self) -> &'static str {
        "net"
    }

    fn kind(&self) -> Kind {
        Kind::Net
    }

    fn can_connect(&self, _reach: &Reach) -> bool {
        true
    }

    fn setup_recv(&self, cx: &Context, link: Link) -> Result<(Progress, Vec<u8>)> {
        let net = &cx.net.plugin.api;
        let (handle, listen) = net.listen(cx.net.ctx, 0).map_err(Error::from)?;
        let accepting = Accepting { link, listen, mem: zeroed_fifo(cx) };
        Ok((Progress::Waiting(Box::new(accepting)), handle.bytes.to_vec()))
    }

    fn connect_send(&self, cx: &Context, link: Link, message: &[u8]) -> Result<Progress> {
        if message.len() != NET_HANDLE_BYTES {
            return Err(Error::internal(format!(
                "rank {} sent a network handle of {} bytes, not {NET_HANDLE_BYTES}",
                link.peer,
                message.len()
            )));
        }
        let mut handle = NetHandle::default();
        handle.bytes.copy_from_slice(message);
        Ok(Progress::Waiting(Box::new(Connecting { link, handle, mem: zeroed_fifo(cx) })))
    }
}

fn zeroed_fifo(cx: &Context) -> LocalMemory {
    LocalMemory::new(fifo_bytes(cx.slot_bytes()))
}

/// Receiver: listening, waiting for the sender.
struct Accepting {
    link: Link,
    listen: PluginHandle,
    mem: LocalMemory,
}

impl Pending for Accepting {
    fn poll(self: Box<Self>, cx: &Context) -> Result<Progress> {
        let net = &cx.net.plugin.api;
        match net.accept(self.listen).map_err(Error::from)? {
            None => Ok(Progress::Waiting(self)),
            Some(comm) => {
                let _ = net.close_listen(self.listen);
                let Accepting { link, mem, .. } = *self;
                Ok(Progress::Made(net_connection(cx, link, Dir::Recv, comm, mem)?))
            }
        }
    }
}

/// Sender: connecting.
struct Connecting {
    link: Link,
    handle: NetHandle,
    mem: LocalMemory,
}

impl Pending for Connecting {
    fn poll(self: Box<Self>, cx: &Context) -> Result<Progress> {
        let net = &cx.net.plugin.api;
        match net.connect(cx.net.ctx, 0, &self.handle).map_err(Error::from)? {
            None => Ok(Progress::Waiting(self)),
            Some(comm) => {
                let Connecting { link, mem, .. } = *self;
                Ok(Progress::Made(net_connection(cx, link, Dir::Send, comm, mem)?))
            }
        }
    }
}

/// A network connection's FIFO: local host memory the proxy moves through the plugin. With
/// a device backend the memory is registered with it too, so that the device writes and
/// reads the slots directly (host-staged transfers).
fn net_connection(cx: &Context, link: Link, dir: Dir, comm: PluginHandle, mem: LocalMemory) -> Result<Arc<Connection>> {
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
    let conn = Arc::new(Connection::new(link, dir, Kind::Net, fifo, memory));
    cx.proxy.add(Arc::clone(&conn), comm, mr);
    Ok(conn)
}

//! The proxy thread of a communicator: it moves network connections' FIFO slots through the
//! net plugin. For a send connection it is the FIFO's consumer (a filled slot is sent, and
//! freed when the send completes); for a receive connection it is the producer (a free slot
//! gets a receive posted, and is published when it completes). Requests complete in order per
//! connection, so slots are handed over in order.
//!
//! A receive is posted only for a slot an executor has said it will consume
//! (`Connection::expected`), so every failed request is a real failure: the first one is
//! also the communicator's ([`Proxy::new`]'s `failure`), which ends its pending and later
//! operations whichever connection they wait on. Host and device work alike announce their
//! receives (`exec::NetReceives`; a captured device launch from a host callback at each
//! replay), so a connection closes with no receive in flight.
//!
//! A send is done when the plugin's request completes, not when the executor fills the
//! slot: `Communicator::finalize` and `destroy` wait for `Connection::owes_peer` to clear
//! before the proxy stops and closes the plugin's connections.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use rustccl_plugin_api::net::{Net, RecvBuffer, SIZE_NOT_REPORTED};
use rustccl_plugin_api::PluginHandle;

use super::fifo::STEPS;
use super::{Connection, Dir};
use crate::error::Error;
use crate::observe::ProxyTrack;

/// One network connection the proxy drives.
struct Driven {
    conn: Arc<Connection>,
    comm: PluginHandle,
    mr: PluginHandle,
    /// Posted requests: (slot index, request), oldest first.
    inflight: VecDeque<(u64, PluginHandle)>,
    /// Next slot index to post.
    next: u64,
    failed: bool,
    /// The observer's transfers on this connection, slot by slot.
    track: ProxyTrack,
}

/// Where the proxy records the first failure of a connection: the communicator's.
pub type FailureSlot = Arc<OnceLock<Error>>;

pub struct Proxy {
    net: Arc<dyn Net>,
    failure: FailureSlot,
    add: Mutex<Option<mpsc::Sender<Driven>>>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Proxy {
    /// A proxy for `net`; its thread starts with the first connection. The first connection
    /// that fails (one whose receives are exact, see the module docs) records its error in
    /// `failure`.
    pub fn new(net: Arc<dyn Net>, failure: FailureSlot) -> Proxy {
        Proxy { net, failure, add: Mutex::new(None), stop: Arc::new(AtomicBool::new(false)), thread: Mutex::new(None) }
    }

    /// Hands a network connection to the proxy.
    pub fn add(&self, conn: Arc<Connection>, comm: PluginHandle, mr: PluginHandle) {
        let mut add = self.add.lock().unwrap_or_else(|p| p.into_inner());
        if add.is_none() {
            let (tx, rx) = mpsc::channel();
            let (net, stop, failure) = (Arc::clone(&self.net), Arc::clone(&self.stop), Arc::clone(&self.failure));
            let handle = std::thread::Builder::new()
                .name("rustccl-proxy".into())
                .spawn(move || run(net, rx, stop, failure))
                .expect("start the proxy thread");
            *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
            *add = Some(tx);
        }
        let d = Driven { conn, comm, mr, inflight: VecDeque::new(), next: 0, failed: false, track: ProxyTrack::default() };
        let _ = add.as_ref().unwrap().send(d);
    }

    /// Stops the thread and closes its connections.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.add.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(net: Arc<dyn Net>, rx: mpsc::Receiver<Driven>, stop: Arc<AtomicBool>, failure: FailureSlot) {
    let mut conns: Vec<Driven> = Vec::new();
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        while let Ok(d) = rx.try_recv() {
            conns.push(d);
        }
        let mut busy = false;
        for d in conns.iter_mut().filter(|d| !d.failed) {
            let r = match d.conn.dir {
                Dir::Send => progress_send(&*net, d),
                Dir::Recv => progress_recv(&*net, d),
            };
            match r {
                Ok(progress) => busy |= progress,
                Err(e) => {
                    d.failed = true;
                    // Its events stop: nothing more will move on it.
                    d.track = ProxyTrack::default();
                    if failure.set(e.clone()).is_ok() {
                        tracing::info!(target: "NET", "{}", e.message);
                    }
                    *d.conn.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                }
            }
        }
        if busy {
            idle = 0;
        } else {
            idle += 1;
            if idle < 64 {
                std::hint::spin_loop();
            } else if idle < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    for d in conns {
        let _ = net.dereg_mr(d.comm, d.mr);
        let _ = match d.conn.dir {
            Dir::Send => net.close_send(d.comm),
            Dir::Recv => net.close_recv(d.comm),
        };
    }
}

fn net_error(d: &Driven, e: rustccl_plugin_api::PluginError) -> Error {
    let way = match d.conn.dir {
        Dir::Send => "to",
        Dir::Recv => "from",
    };
    Error::from(e).context(format!("the network connection {way} rank {} failed", d.conn.link.peer))
}

/// Sends filled slots; frees them as sends complete.
fn progress_send(net: &dyn Net, d: &mut Driven) -> Result<bool, Error> {
    let fifo = &d.conn.fifo;
    let mut progress = false;
    while d.next < fifo.tail() && d.inflight.len() < STEPS {
        let (ptr, _) = fifo.slot_raw(d.next);
        let len = fifo.size_of(d.next);
        // SAFETY: the slot stays untouched until the request completes: the executor does not
        // reuse it before the proxy pops it, which happens only after completion.
        match unsafe { net.isend(d.comm, ptr as usize, len, 0, d.mr) }.map_err(|e| net_error(d, e))? {
            Some(req) => {
                d.track.posted(&d.conn.proxy_ops, d.next, len);
                d.inflight.push_back((d.next, req));
                d.next += 1;
                progress = true;
            }
            None => break,
        }
    }
    // A completed send frees its slot.
    Ok(complete_in_order(net, d, |fifo, index, _| fifo.pop(index))? || progress)
}

/// Posts receives into free slots; publishes them as they complete.
fn progress_recv(net: &dyn Net, d: &mut Driven) -> Result<bool, Error> {
    let fifo = &d.conn.fifo;
    let mut progress = false;
    while d.next < d.conn.expected() && d.next - fifo.head() < STEPS as u64 && d.inflight.len() < STEPS {
        let (ptr, cap) = fifo.slot_raw(d.next);
        let bufs = [RecvBuffer { data: ptr as usize, size: cap, tag: 0, mr: d.mr }];
        // SAFETY: the slot is free (the consumer popped it) and is not given to the executor
        // before the receive completes.
        match unsafe { net.irecv(d.comm, &bufs) }.map_err(|e| net_error(d, e))? {
            Some(req) => {
                d.track.posted(&d.conn.proxy_ops, d.next, 0);
                d.inflight.push_back((d.next, req));
                d.next += 1;
                progress = true;
            }
            None => break,
        }
    }
    // A completed receive publishes its slot (with the size the plugin reported, if it did).
    Ok(complete_in_order(net, d, |fifo, index, bytes| fifo.push_received(index, bytes))? || progress)
}

/// Tests the oldest requests of a connection, in posting order, and hands each completed
/// one's slot to `done` (slot index, bytes if the plugin reported them: some never do, and
/// the executor then takes its step's size, as NCCL); stops at the first still in flight.
fn complete_in_order(
    net: &dyn Net,
    d: &mut Driven,
    done: impl Fn(&super::fifo::Fifo, u64, Option<usize>),
) -> Result<bool, Error> {
    let mut progress = false;
    while let Some(&(index, req)) = d.inflight.front() {
        let mut sizes = [SIZE_NOT_REPORTED];
        if !net.test(req, &mut sizes).map_err(|e| net_error(d, e))? {
            break;
        }
        d.inflight.pop_front();
        let bytes = (sizes[0] != SIZE_NOT_REPORTED).then_some(sizes[0]);
        done(&d.conn.fifo, index, bytes);
        d.track.completed(&d.conn.proxy_ops, index, bytes.unwrap_or(0));
        progress = true;
    }
    Ok(progress)
}

//! A minimal net plugin, "Skeleton": the smallest thing that carries rustccl's traffic between
//! processes, to copy and grow into your own transport. Build it (`cargo build --release -p
//! rustccl-example-net-skeleton`) and run any rustccl program with
//! `NCCL_NET_PLUGIN=target/release/librustccl_example_net_skeleton.so` (and, for ranks on one
//! machine, `NCCL_SHM_DISABLE=1`, or they talk through shared memory instead of the network).
//!
//! What a net plugin does (the trait `rustccl_plugin_api::net::Net` says it in full): hand out
//! devices, let a rank `listen` and give the peer a handle (opaque bytes) to `connect` to, then
//! move tagged messages with non-blocking `isend` / `irecv`, whose completion the host polls
//! with `test`. Every object is a number (`PluginHandle`) the plugin hands out.
//!
//! This one is deliberately simple, and slow:
//! * one device, the interface the bootstrap uses (`NCCL_SOCKET_IFNAME` picks it);
//! * one TCP connection per send/receive pair; a message is a frame `[tag i32][len u64][bytes]`;
//! * `isend` copies the message and queues it for a writer thread, so the send is complete at
//!   once (the host may reuse its buffer); a reader thread per receive connection files frames
//!   by arrival number, and `test` of the n-th `irecv` copies the n-th frame into its buffer
//!   (sends and receives match in order, as the ABI requires);
//! * host memory only, one buffer per receive, registration is a no-op.
//!
//! A real plugin would avoid the copies (register memory, write from the caller's buffer),
//! stripe large messages over several connections, and never block in `connect`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use abi_stable::std_types::RString;
use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{subsys, HandleRegistry, LogFn, PluginError, PluginHandle};

/// Errors a connection's thread saw, for the next call on that connection to report.
type SharedError = Arc<Mutex<Option<String>>>;

/// Frames a receive connection's reader got, by arrival number.
#[derive(Default)]
struct Inbox {
    frames: HashMap<u64, (i32, Vec<u8>)>,
    arrived: u64,
    /// Set when the connection ended (peer closed, or an I/O error).
    ended: Option<String>,
}

/// Everything the plugin hands out a handle for.
enum Object {
    Context(LogFn),
    Listener(TcpListener),
    Send { frames: Sender<Vec<u8>>, error: SharedError, writer: JoinHandle<()> },
    Recv { inbox: Arc<Mutex<Inbox>>, stream: TcpStream, posted: u64 },
    Registration,
    SendDone { size: usize, error: SharedError },
    RecvPending { inbox: Arc<Mutex<Inbox>>, number: u64, buf: RecvBuffer },
}

#[derive(Default)]
pub struct Skeleton {
    objects: HandleRegistry<Object>,
    /// Messages sent by this process (reported in the log at finalize).
    sent: AtomicU64,
}

fn sys(what: &str, e: std::io::Error) -> PluginError {
    PluginError::system(format!("Skeleton: {what}: {e}"))
}

fn unknown(what: &str, h: PluginHandle) -> PluginError {
    PluginError::invalid_argument(format!("Skeleton: {} is not a {what} of this plugin", h.id))
}

impl Skeleton {
    fn remove(&self, h: PluginHandle) -> Option<Object> {
        self.objects.remove(h)
    }
}

impl Net for Skeleton {
    fn init(&self, comm_id: u64, _config: &NetCommConfig, log: LogFn) -> Result<PluginHandle, PluginError> {
        log.info(subsys::NET, &format!("Skeleton: init for communicator {comm_id:016x}"));
        Ok(self.objects.insert(Object::Context(log)))
    }

    fn devices(&self, _ctx: PluginHandle) -> Result<i32, PluginError> {
        Ok(1)
    }

    fn properties(&self, _ctx: PluginHandle, _dev: i32) -> Result<NetProperties, PluginError> {
        Ok(NetProperties {
            name: RString::from("skeleton0"),
            pci_path: RString::new(),
            guid: 0,
            ptr_support: PTR_HOST,
            reg_is_global: false,
            force_flush: false,
            speed_mbps: 10_000,
            port: 0,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 1,
            max_p2p_bytes: 1 << 40,
            max_coll_bytes: 1 << 40,
        })
    }

    fn listen(&self, _ctx: PluginHandle, _dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        let iface = rustccl_netif::bootstrap_interface().map_err(|e| PluginError::system(format!("Skeleton: {e}")))?;
        let listener = TcpListener::bind(SocketAddr::new(iface.addr, 0)).map_err(|e| sys("bind", e))?;
        listener.set_nonblocking(true).map_err(|e| sys("listen", e))?;
        // The handle: the listening address as text, length first.
        let text = listener.local_addr().map_err(|e| sys("listen", e))?.to_string();
        let mut handle = NetHandle::default();
        handle.bytes[0] = text.len() as u8;
        handle.bytes[1..1 + text.len()].copy_from_slice(text.as_bytes());
        Ok((handle, self.objects.insert(Object::Listener(listener))))
    }

    fn connect(&self, _ctx: PluginHandle, _dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        let len = handle.bytes[0] as usize;
        let addr: SocketAddr = std::str::from_utf8(handle.bytes.get(1..1 + len).unwrap_or_default())
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| PluginError::invalid_argument("Skeleton: the handle holds no address"))?;
        // Blocking, for brevity (a real plugin returns Ok(None) until the connection is up).
        let mut stream = TcpStream::connect(addr).map_err(|e| sys(&format!("connect to {addr}"), e))?;
        let _ = stream.set_nodelay(true);
        let (frames, queue) = channel::<Vec<u8>>();
        let error: SharedError = Default::default();
        let seen = Arc::clone(&error);
        let writer = std::thread::spawn(move || {
            for frame in queue {
                if let Err(e) = stream.write_all(&frame) {
                    *seen.lock().unwrap() = Some(format!("Skeleton: sending to {addr}: {e}"));
                    return;
                }
            }
        });
        Ok(Some(self.objects.insert(Object::Send { frames, error, writer })))
    }

    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let accepted = self
            .objects
            .with(listen, |o| match o {
                Object::Listener(l) => Ok(l.accept()),
                _ => Err(unknown("listener", listen)),
            })
            .ok_or_else(|| unknown("listener", listen))??;
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(sys("accept", e)),
        };
        stream.set_nonblocking(false).map_err(|e| sys("accept", e))?;
        let inbox: Arc<Mutex<Inbox>> = Default::default();
        let (mut reader, filed) = (stream.try_clone().map_err(|e| sys("accept", e))?, Arc::clone(&inbox));
        std::thread::spawn(move || loop {
            let mut head = [0u8; 12];
            let frame = reader.read_exact(&mut head).and_then(|_| {
                let tag = i32::from_le_bytes(head[..4].try_into().unwrap());
                let mut data = vec![0u8; u64::from_le_bytes(head[4..].try_into().unwrap()) as usize];
                reader.read_exact(&mut data).map(|_| (tag, data))
            });
            let mut inbox = filed.lock().unwrap();
            match frame {
                Ok(f) => {
                    let n = inbox.arrived;
                    inbox.frames.insert(n, f);
                    inbox.arrived += 1;
                }
                Err(e) => {
                    inbox.ended = Some(format!("Skeleton: the connection ended: {e}"));
                    return;
                }
            }
        });
        Ok(Some(self.objects.insert(Object::Recv { inbox, stream, posted: 0 })))
    }

    fn reg_mr(&self, _comm: PluginHandle, _data: usize, _size: usize, _ptr_type: u32) -> Result<PluginHandle, PluginError> {
        Ok(self.objects.insert(Object::Registration))
    }

    fn dereg_mr(&self, _comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        self.remove(mr).map(drop).ok_or_else(|| unknown("registration", mr))
    }

    unsafe fn isend(&self, comm: PluginHandle, data: usize, size: usize, tag: i32, _mr: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let mut frame = Vec::with_capacity(12 + size);
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(&(size as u64).to_le_bytes());
        if size > 0 {
            // SAFETY: the caller keeps `data..data+size` valid until the request completes
            // (the contract of `Net::isend`); it is read here, before the request exists.
            frame.extend_from_slice(unsafe { std::slice::from_raw_parts(data as *const u8, size) });
        }
        let error = self
            .objects
            .with(comm, |o| match o {
                Object::Send { frames, error, .. } => match error.lock().unwrap().clone() {
                    Some(e) => Err(PluginError::remote(e)),
                    None => frames.send(frame).map(|_| Arc::clone(error)).map_err(|_| PluginError::remote("Skeleton: the writer stopped")),
                },
                _ => Err(unknown("send connection", comm)),
            })
            .ok_or_else(|| unknown("send connection", comm))??;
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(Some(self.objects.insert(Object::SendDone { size, error })))
    }

    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        let [buf] = bufs else {
            return Err(PluginError::invalid_argument("Skeleton: one buffer per receive (max_recvs is 1)"));
        };
        let (inbox, number) = self
            .objects
            .with(comm, |o| match o {
                Object::Recv { inbox, posted, .. } => {
                    *posted += 1;
                    Ok((Arc::clone(inbox), *posted - 1))
                }
                _ => Err(unknown("receive connection", comm)),
            })
            .ok_or_else(|| unknown("receive connection", comm))??;
        Ok(Some(self.objects.insert(Object::RecvPending { inbox, number, buf: *buf })))
    }

    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        // Ok(Some(bytes)): done; Ok(None): not yet; Err: failed (the request is freed either
        // way once it is no longer pending).
        let outcome = self
            .objects
            .with(request, |o| match o {
                Object::SendDone { size, error } => match error.lock().unwrap().clone() {
                    Some(e) => Err(PluginError::remote(e)),
                    None => Ok(Some(*size)),
                },
                Object::RecvPending { inbox, number, buf } => {
                    let mut inbox = inbox.lock().unwrap();
                    let Some((tag, data)) = inbox.frames.remove(number) else {
                        return match &inbox.ended {
                            Some(e) => Err(PluginError::remote(e.clone())),
                            None => Ok(None),
                        };
                    };
                    if tag != buf.tag || data.len() > buf.size {
                        return Err(PluginError::remote(format!(
                            "Skeleton: a {}-byte message with tag {tag} for a {}-byte buffer with tag {}",
                            data.len(),
                            buf.size,
                            buf.tag
                        )));
                    }
                    // SAFETY: the caller keeps the receive buffer valid and untouched until the
                    // request completes (the contract of `Net::irecv`), which is now.
                    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.data as *mut u8, data.len()) };
                    Ok(Some(data.len()))
                }
                _ => Err(unknown("request", request)),
            })
            .ok_or_else(|| unknown("request", request))?;
        match outcome {
            Ok(None) => Ok(false),
            Ok(Some(bytes)) => {
                self.remove(request);
                if let Some(s) = sizes.first_mut() {
                    *s = bytes;
                }
                Ok(true)
            }
            Err(e) => {
                self.remove(request);
                Err(e)
            }
        }
    }

    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        match self.remove(comm) {
            Some(Object::Send { frames, writer, .. }) => {
                // The writer sends what is queued, then ends when the queue closes.
                drop(frames);
                let _ = writer.join();
                Ok(())
            }
            _ => Err(unknown("send connection", comm)),
        }
    }

    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        match self.remove(comm) {
            Some(Object::Recv { stream, .. }) => {
                let _ = stream.shutdown(Shutdown::Both);
                Ok(())
            }
            _ => Err(unknown("receive connection", comm)),
        }
    }

    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        self.remove(listen).map(drop).ok_or_else(|| unknown("listener", listen))
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        match self.remove(ctx) {
            Some(Object::Context(log)) => {
                log.info(subsys::NET, &format!("Skeleton: finalize; {} messages sent by this process", self.sent.load(Ordering::Relaxed)));
                Ok(())
            }
            _ => Err(unknown("context", ctx)),
        }
    }
}

// The one line that makes this library a plugin: it exports the table `rustccl_net_v1`, whose
// functions call a `Skeleton` made on first use. "Skeleton" is the name `NCCL_NET` matches.
rustccl_plugin_api::export_net_v1!("Skeleton", Skeleton, Skeleton::default());

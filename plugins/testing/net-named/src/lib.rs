//! Exists for loader tests: a minimal but working in-process net plugin named `Loopback`, so
//! the loader can be tested picking a plugin by `NCCL_NET` name, and data can move, without
//! a real network. All "ranks" must live in one process.
//!
//! * `listen` registers a listener in a process-wide registry keyed by its handle bytes;
//!   `connect` with those bytes makes a connection at once and queues its receiving end for
//!   `accept` (which says "call again" until one is queued).
//! * `isend` / `irecv` queue requests on the connection; sends and receives match in the
//!   order they were posted, and within one multi-receive a send goes to the first unfilled
//!   buffer with its tag. Data is copied from the send buffer into the receive buffer when
//!   they match (under the registry's lock); `test` then reports both done, with the sizes.
//! * A send larger than its buffer, a tag that no buffer of the receive has, or the peer
//!   closing its end with requests pending make those requests fail in `test` (never hang).
//! * Memory registration is accepted and ignored; one device, host memory only.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard};

use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

/// The plugin's name (what `NCCL_NET` matches).
pub const NAME: &str = "Loopback";

const HANDLE_MAGIC: &[u8; 16] = b"RUSTCCL-LOOPBACK";

struct SendOp {
    req: u64,
    data: usize,
    size: usize,
    tag: i32,
}

struct RecvOp {
    req: u64,
    bufs: Vec<RecvBuffer>,
    filled: Vec<bool>,
}

#[derive(Default)]
struct Conn {
    sends: VecDeque<SendOp>,
    recvs: VecDeque<RecvOp>,
    send_closed: bool,
    recv_closed: bool,
}

enum Req {
    Pending(Vec<usize>),
    Done(Vec<usize>),
    Failed(String),
}

struct Listener {
    key: [u8; 128],
    pending: VecDeque<u64>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    contexts: HashSet<u64>,
    listeners: HashMap<u64, Listener>,
    by_handle: HashMap<[u8; 128], u64>,
    /// send comm id -> connection id
    send_comms: HashMap<u64, u64>,
    /// recv comm id -> connection id
    recv_comms: HashMap<u64, u64>,
    conns: HashMap<u64, Conn>,
    mrs: HashMap<u64, u64>,
    reqs: HashMap<u64, Req>,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn fail(&mut self, req: u64, why: &str) {
        if let Some(r) = self.reqs.get_mut(&req) {
            *r = Req::Failed(why.to_string());
        }
    }

    /// Matches the heads of the connection's queues, copying data, until one queue is empty.
    fn progress(&mut self, conn_id: u64) {
        loop {
            let conn = self.conns.get_mut(&conn_id).expect("connection");
            let (Some(send), Some(recv)) = (conn.sends.front(), conn.recvs.front_mut()) else {
                break;
            };
            let slot = (0..recv.bufs.len()).find(|&i| !recv.filled[i] && recv.bufs[i].tag == send.tag);
            let (send_req, recv_req, tag) = (send.req, recv.req, send.tag);
            let Some(i) = slot else {
                conn.sends.pop_front();
                conn.recvs.pop_front();
                let why = format!("Loopback: a send with tag {tag} matches no buffer of the receive");
                self.fail(send_req, &why);
                self.fail(recv_req, &why);
                continue;
            };
            let buf = recv.bufs[i];
            if send.size > buf.size {
                let why = format!("Loopback: a {}-byte send does not fit a {}-byte receive buffer", send.size, buf.size);
                conn.sends.pop_front();
                conn.recvs.pop_front();
                self.fail(send_req, &why);
                self.fail(recv_req, &why);
                continue;
            }
            if send.size > 0 {
                // SAFETY: both buffers stay valid until their requests complete (the contract
                // of `Net::isend` / `Net::irecv`), and they are not complete yet.
                unsafe { std::ptr::copy_nonoverlapping(send.data as *const u8, buf.data as *mut u8, send.size) };
            }
            let size = send.size;
            recv.filled[i] = true;
            let recv_done = recv.filled.iter().all(|&f| f);
            conn.sends.pop_front();
            if recv_done {
                conn.recvs.pop_front();
            }
            self.reqs.insert(send_req, Req::Done(vec![size]));
            if let Some(Req::Pending(sizes)) = self.reqs.get_mut(&recv_req) {
                sizes[i] = size;
                if recv_done {
                    let sizes = std::mem::take(sizes);
                    self.reqs.insert(recv_req, Req::Done(sizes));
                }
            }
        }
    }

    fn progress_if_open(&mut self, conn_id: u64) {
        if self.conns.contains_key(&conn_id) {
            self.progress(conn_id);
        }
    }

    /// Closes one end of a connection: its own requests are freed, the peer's pending ones fail.
    fn close_end(&mut self, conn_id: u64, sending_end: bool) {
        let Some(conn) = self.conns.get_mut(&conn_id) else { return };
        let sends: Vec<u64> = conn.sends.drain(..).map(|s| s.req).collect();
        let recvs: Vec<u64> = conn.recvs.drain(..).map(|r| r.req).collect();
        if sending_end {
            conn.send_closed = true;
        } else {
            conn.recv_closed = true;
        }
        let both = conn.send_closed && conn.recv_closed;
        let (own, peer) = if sending_end { (sends, recvs) } else { (recvs, sends) };
        for r in own {
            self.reqs.remove(&r);
        }
        for r in peer {
            self.fail(r, "Loopback: the peer closed the connection");
        }
        if both {
            self.conns.remove(&conn_id);
        }
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Loopback network.
pub struct Loopback;

fn bad(what: &str, h: PluginHandle) -> PluginError {
    PluginError::invalid_argument(format!("Loopback: unknown {what} handle {}", h.id))
}

impl Net for Loopback {
    fn init(&self, _comm_id: u64, _config: &NetCommConfig, _log: LogFn) -> Result<PluginHandle, PluginError> {
        let mut s = state();
        let id = s.id();
        s.contexts.insert(id);
        Ok(PluginHandle { id })
    }

    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        let s = state();
        if !s.contexts.contains(&ctx.id) {
            return Err(bad("context", ctx));
        }
        Ok(1)
    }

    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        let s = state();
        if !s.contexts.contains(&ctx.id) {
            return Err(bad("context", ctx));
        }
        if dev != 0 {
            return Err(PluginError::invalid_argument(format!("Loopback: no device {dev}")));
        }
        Ok(NetProperties {
            name: "lo-inproc".into(),
            pci_path: "".into(),
            guid: 0x4c4f4f50,
            ptr_support: PTR_HOST,
            reg_is_global: false,
            force_flush: false,
            speed_mbps: 100_000,
            port: 0,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 8,
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 30,
        })
    }

    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        let mut s = state();
        if !s.contexts.contains(&ctx.id) {
            return Err(bad("context", ctx));
        }
        if dev != 0 {
            return Err(PluginError::invalid_argument(format!("Loopback: no device {dev}")));
        }
        let id = s.id();
        let mut handle = NetHandle::default();
        handle.bytes[..16].copy_from_slice(HANDLE_MAGIC);
        handle.bytes[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        handle.bytes[20..28].copy_from_slice(&id.to_le_bytes());
        s.by_handle.insert(handle.bytes, id);
        s.listeners.insert(id, Listener { key: handle.bytes, pending: VecDeque::new() });
        Ok((handle, PluginHandle { id }))
    }

    fn connect(&self, ctx: PluginHandle, _dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        let mut s = state();
        if !s.contexts.contains(&ctx.id) {
            return Err(bad("context", ctx));
        }
        let listener = *s.by_handle.get(&handle.bytes).ok_or_else(|| {
            PluginError::remote("Loopback: no listener for this handle in this process (closed, or another process)")
        })?;
        let (conn, send, recv) = (s.id(), s.id(), s.id());
        s.conns.insert(conn, Conn::default());
        s.send_comms.insert(send, conn);
        s.recv_comms.insert(recv, conn);
        s.listeners.get_mut(&listener).expect("listener").pending.push_back(recv);
        Ok(Some(PluginHandle { id: send }))
    }

    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let mut s = state();
        let l = s.listeners.get_mut(&listen.id).ok_or_else(|| bad("listen", listen))?;
        Ok(l.pending.pop_front().map(|id| PluginHandle { id }))
    }

    fn reg_mr(&self, comm: PluginHandle, _data: usize, _size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError> {
        let mut s = state();
        if !s.send_comms.contains_key(&comm.id) && !s.recv_comms.contains_key(&comm.id) {
            return Err(bad("connection", comm));
        }
        if ptr_type != PTR_HOST {
            return Err(PluginError::invalid_usage("Loopback: only host memory can be registered"));
        }
        let id = s.id();
        s.mrs.insert(id, comm.id);
        Ok(PluginHandle { id })
    }

    fn dereg_mr(&self, _comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        state().mrs.remove(&mr.id).map(drop).ok_or_else(|| bad("registration", mr))
    }

    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        _mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        let mut s = state();
        let conn = *s.send_comms.get(&comm.id).ok_or_else(|| bad("send connection", comm))?;
        let req = s.id();
        s.reqs.insert(req, Req::Pending(vec![0]));
        match s.conns.get_mut(&conn) {
            Some(c) if !c.recv_closed => c.sends.push_back(SendOp { req, data, size, tag }),
            _ => s.fail(req, "Loopback: the peer closed the connection"),
        }
        s.progress_if_open(conn);
        Ok(Some(PluginHandle { id: req }))
    }

    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        if bufs.is_empty() || bufs.len() > 8 {
            return Err(PluginError::invalid_argument(format!("Loopback: {} buffers in one receive (1..=8)", bufs.len())));
        }
        let mut s = state();
        let conn = *s.recv_comms.get(&comm.id).ok_or_else(|| bad("receive connection", comm))?;
        let req = s.id();
        s.reqs.insert(req, Req::Pending(vec![0; bufs.len()]));
        match s.conns.get_mut(&conn) {
            Some(c) if !c.send_closed => c.recvs.push_back(RecvOp { req, bufs: bufs.to_vec(), filled: vec![false; bufs.len()] }),
            _ => s.fail(req, "Loopback: the peer closed the connection"),
        }
        s.progress_if_open(conn);
        Ok(Some(PluginHandle { id: req }))
    }

    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        let mut s = state();
        match s.reqs.get(&request.id) {
            None => Err(bad("request", request)),
            Some(Req::Pending(_)) => Ok(false),
            Some(Req::Done(_)) | Some(Req::Failed(_)) => match s.reqs.remove(&request.id) {
                Some(Req::Done(done)) => {
                    for (out, n) in sizes.iter_mut().zip(done) {
                        *out = n;
                    }
                    Ok(true)
                }
                Some(Req::Failed(why)) => Err(PluginError::remote(why)),
                _ => unreachable!(),
            },
        }
    }

    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        let mut s = state();
        let conn = s.send_comms.remove(&comm.id).ok_or_else(|| bad("send connection", comm))?;
        s.close_end(conn, true);
        Ok(())
    }

    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        let mut s = state();
        let conn = s.recv_comms.remove(&comm.id).ok_or_else(|| bad("receive connection", comm))?;
        s.close_end(conn, false);
        Ok(())
    }

    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        let mut s = state();
        let l = s.listeners.remove(&listen.id).ok_or_else(|| bad("listen", listen))?;
        s.by_handle.remove(&l.key);
        for recv in l.pending {
            if let Some(conn) = s.recv_comms.remove(&recv) {
                s.close_end(conn, false);
            }
        }
        Ok(())
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        if state().contexts.remove(&ctx.id) {
            Ok(())
        } else {
            Err(bad("context", ctx))
        }
    }
}

rustccl_plugin_api::export_net_v1!("Loopback", Loopback, Loopback);

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::RStr;

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}
    const LOG: LogFn = LogFn { log: quiet };
    const NO_MR: PluginHandle = PluginHandle { id: 0 };

    fn wait(net: &Loopback, req: PluginHandle, n: usize) -> Result<Vec<usize>, PluginError> {
        let mut sizes = vec![0; n];
        for _ in 0..1000 {
            if net.test(req, &mut sizes)? {
                return Ok(sizes);
            }
        }
        panic!("request {} never completed", req.id);
    }

    /// Two contexts, a connection from a to b.
    fn pair(net: &Loopback) -> (PluginHandle, PluginHandle, PluginHandle, PluginHandle) {
        let a = net.init(1, &NetCommConfig::default(), LOG).unwrap();
        let b = net.init(1, &NetCommConfig::default(), LOG).unwrap();
        assert_eq!(net.devices(a).unwrap(), 1);
        assert_eq!(net.properties(a, 0).unwrap().ptr_support, PTR_HOST);
        let (handle, listen) = net.listen(b, 0).unwrap();
        assert_eq!(net.accept(listen).unwrap(), None, "nothing to accept yet");
        let send = net.connect(a, 0, &handle).unwrap().expect("connected");
        let recv = net.accept(listen).unwrap().expect("accepted");
        net.close_listen(listen).unwrap();
        assert!(net.connect(a, 0, &handle).is_err(), "listener closed");
        (a, b, send, recv)
    }

    #[test]
    fn messages_match_in_order_and_by_tag() {
        let net = Loopback;
        let (a, b, send, recv) = pair(&net);
        let mr = net.reg_mr(send, 0, 0, PTR_HOST).unwrap();
        let m1 = b"first message".to_vec();
        let m2 = [7u8; 3];
        let m3 = b"tagged".to_vec();
        // SAFETY: every buffer outlives its request (all are waited for below).
        unsafe {
            let s1 = net.isend(send, m1.as_ptr() as usize, m1.len(), 0, mr).unwrap().unwrap();
            let mut r1 = vec![0u8; 64];
            let rq1 = net
                .irecv(recv, &[RecvBuffer { data: r1.as_mut_ptr() as usize, size: 64, tag: 0, mr: NO_MR }])
                .unwrap()
                .unwrap();
            assert_eq!(wait(&net, rq1, 1).unwrap(), vec![m1.len()]);
            assert_eq!(wait(&net, s1, 1).unwrap(), vec![m1.len()]);
            assert_eq!(&r1[..m1.len()], &m1[..]);

            // A multi-receive posted first; the sends fill the buffers by tag.
            let (mut x, mut y) = (vec![0u8; 8], vec![0u8; 8]);
            let rq = net
                .irecv(
                    recv,
                    &[
                        RecvBuffer { data: x.as_mut_ptr() as usize, size: 8, tag: 5, mr: NO_MR },
                        RecvBuffer { data: y.as_mut_ptr() as usize, size: 8, tag: 9, mr: NO_MR },
                    ],
                )
                .unwrap()
                .unwrap();
            let mut sizes = vec![0; 2];
            assert!(!net.test(rq, &mut sizes).unwrap());
            let s3 = net.isend(send, m3.as_ptr() as usize, m3.len(), 9, NO_MR).unwrap().unwrap();
            assert!(!net.test(rq, &mut sizes).unwrap(), "one of two buffers filled");
            let s2 = net.isend(send, m2.as_ptr() as usize, m2.len(), 5, NO_MR).unwrap().unwrap();
            assert_eq!(wait(&net, rq, 2).unwrap(), vec![3, 6]);
            wait(&net, s2, 1).unwrap();
            wait(&net, s3, 1).unwrap();
            assert_eq!((&x[..3], &y[..6]), (&m2[..], &m3[..]));
            assert!(net.test(rq, &mut sizes).is_err(), "a completed request is freed");

            // Too large for the buffer: both sides fail.
            let mut small = vec![0u8; 2];
            let s = net.isend(send, m1.as_ptr() as usize, m1.len(), 0, NO_MR).unwrap().unwrap();
            let r = net
                .irecv(recv, &[RecvBuffer { data: small.as_mut_ptr() as usize, size: 2, tag: 0, mr: NO_MR }])
                .unwrap()
                .unwrap();
            assert!(wait(&net, r, 1).unwrap_err().message.contains("does not fit"));
            assert!(wait(&net, s, 1).is_err());

            // The sender goes away: a pending receive fails instead of hanging.
            let r = net
                .irecv(recv, &[RecvBuffer { data: small.as_mut_ptr() as usize, size: 2, tag: 0, mr: NO_MR }])
                .unwrap()
                .unwrap();
            net.dereg_mr(send, mr).unwrap();
            net.close_send(send).unwrap();
            assert!(wait(&net, r, 1).unwrap_err().message.contains("peer closed"));
        }
        net.close_recv(recv).unwrap();
        assert!(net.close_recv(recv).is_err());
        net.finalize(a).unwrap();
        net.finalize(b).unwrap();
        assert!(net.finalize(b).is_err());
    }
}

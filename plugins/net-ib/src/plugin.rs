//! [`IbNet`]: the [`Net`] implementation, named "IB". It keeps the plugin's objects in
//! handle tables ([`rustccl_plugin_api::registry`]), sets connections up without blocking
//! ([`crate::oob`], [`crate::qp`]) and hands the data path to [`Comm`].
//!
//! The devices it offers are virtual devices, each one or more physical devices (ports):
//! at the first `init` the ports of one NIC are merged ([`crate::merge`],
//! `NCCL_IB_MERGE_NICS`), and `make_vdevice` appends more. Properties of a merged device are
//! [`merge_properties`] of its members'.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::std_types::RString;
use rustccl_plugin_api::net::{
    merge_properties, Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, NET_HANDLE_BYTES,
    PTR_DEVICE, PTR_DMABUF, PTR_HOST,
};
use rustccl_plugin_api::registry::{self, Kind, Registry};
use rustccl_plugin_api::{subsys, LogFn, PluginError, PluginHandle};
use socket2::Socket;

use crate::async_events::AsyncEvents;
use crate::comm::{register_fifo, Comm, Direction, Parts, RecvBuf, Registration, Setup};
use crate::device::{discover, IbDevice};
use crate::dmabuf::{self, DmaBufSupport};
use crate::fifo::{Fifo, MAX_RECVS};
use crate::flush::{self, Flush};
use crate::merge::{check_members, group_ports};
use crate::oob::{self, Pipe};
use crate::qp::{qp_count, Endpoint};
use crate::settings::IbSettings;
use crate::split::adaptive_routing_threshold;
use crate::verbs::Mr;
use crate::wire::{
    decode_handle, encode_handle, ConnInfo, ListenHandle, CONN_INFO_BYTES, PROTO_MAGIC,
};

/// How the plugin reads a variable (name → value).
pub type Lookup = fn(&str) -> Option<String>;

/// Largest message: the immediate carries the size in 32 bits.
pub const MAX_MESSAGE: usize = u32::MAX as usize;

/// What `init` found, shared by every context.
struct Found {
    /// The physical devices (ports).
    devices: Vec<IbDevice>,
    /// The devices offered: each the indices of its physical devices (merged at discovery,
    /// then those `make_vdevice` made). They live as long as the plugin, as in NCCL.
    vdevices: Mutex<Vec<Vec<usize>>>,
    /// Where listeners accept the out-of-band connections (the bootstrap interface, as
    /// NCCL's IB transport uses `NCCL_SOCKET_IFNAME`'s choice).
    oob_addr: IpAddr,
    /// Per physical device: GPU memory through dma-buf ([`crate::dmabuf`]).
    dmabuf: Vec<DmaBufSupport>,
    /// The connections the devices' async-event threads fail.
    events: Arc<AsyncEvents>,
}

impl Found {
    /// Whether device `dev` offers dma-buf registration: every physical device of it does.
    fn dmabuf(&self, dev: i32) -> bool {
        let vdevices = lock(&self.vdevices);
        usize::try_from(dev)
            .ok()
            .and_then(|d| vdevices.get(d))
            .is_some_and(|members| members.iter().all(|&m| self.dmabuf[m].available()))
    }
}

#[derive(Clone)]
struct Context {
    log: LogFn,
    found: Arc<Found>,
}

/// A connection's verbs objects before its peer is known.
struct Local {
    ep: Endpoint,
    fifo: Fifo,
    fifo_mr: Mr,
}

impl Local {
    fn create(
        members: &[IbDevice],
        nqps: usize,
        settings: &IbSettings,
    ) -> Result<Local, PluginError> {
        let ep = Endpoint::create(members, nqps, &settings.qp)?;
        let fifo = Fifo::default();
        let fifo_mr = register_fifo(&ep, &fifo)?;
        Ok(Local { ep, fifo, fifo_mr })
    }

    /// This side's info; `sender`: whether its inbox is the CTS FIFO (else the size
    /// records).
    fn info(&self, magic: u64, sender: bool) -> ConnInfo {
        let inbox = self.fifo.inbox_addr(sender);
        self.ep.info(magic, inbox, self.fifo_mr.rkey())
    }

    fn into_parts(self, oob: Pipe) -> Parts {
        Parts {
            ep: self.ep,
            fifo: self.fifo,
            fifo_mr: self.fifo_mr,
            oob,
            setup: None,
        }
    }
}

/// A `connect` in progress: the TCP connection to the listener.
struct Dialing {
    /// Taken when the connection is handed over.
    local: Option<Local>,
    magic: u64,
    /// Taken with `local`.
    sock: Option<Socket>,
}

/// An incoming connection whose info is being read.
struct Accepting {
    pipe: Pipe,
}

struct Listen {
    ctx: u64,
    dev: i32,
    log: LogFn,
    listener: std::net::TcpListener,
    magic: u64,
    pending: Vec<Accepting>,
}

/// A registration handle: the connection's cache entry and its keys.
#[derive(Clone)]
struct MrHandle {
    comm: u64,
    entry: u64,
    reg: Arc<Registration>,
    /// Device memory (a dma-buf registration): receives into it need a flush.
    device: bool,
}

/// A `connect` in progress, keyed by (context, device, handle bytes): the caller repeats
/// the same call until it completes.
type DialKey = (u64, i32, [u8; NET_HANDLE_BYTES]);

/// The InfiniBand / RoCE net plugin.
pub struct IbNet {
    settings: OnceLock<IbSettings>,
    lookup: Lookup,
    found: Mutex<Option<Arc<Found>>>,
    contexts: Registry<Context>,
    listens: Registry<Arc<Mutex<Listen>>>,
    dialing: Mutex<HashMap<DialKey, Dialing>>,
    sends: Registry<Arc<Comm>>,
    recvs: Registry<Arc<Comm>>,
    mrs: Registry<MrHandle>,
    requests: Registry<Arc<Comm>>,
    /// Flush requests ([`crate::flush`]), numbered from `requests`.
    flushes: Registry<Arc<Comm>>,
}

impl Default for IbNet {
    fn default() -> Self {
        IbNet::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_magic() -> Result<u64, PluginError> {
    getrandom::u64().map_err(|e| PluginError::system(format!("NET/IB : getrandom failed: {e}")))
}

/// A device's name in messages and logs: `mlx5_0:1`, or its members' joined with `+`.
fn label(members: &[IbDevice]) -> String {
    members
        .iter()
        .map(|d| format!("{}:{}", d.name, d.port))
        .collect::<Vec<_>>()
        .join("+")
}

/// The `[i]name:port/IB` entry of the INFO line (`[0]mlx5_0:1+mlx5_0:2/RoCE` when merged).
fn describe(index: usize, members: &[IbDevice]) -> String {
    let link = match members[0].link_layer {
        crate::LinkLayer::Ethernet => "RoCE",
        crate::LinkLayer::InfiniBand => "IB",
    };
    format!("[{index}]{}/{link}", label(members))
}

impl IbNet {
    /// A plugin that reads its settings from the environment at the first `init`.
    pub fn new() -> IbNet {
        IbNet::with_lookup(|name| std::env::var(name).ok())
    }

    /// A plugin that reads its settings through `lookup` at the first `init`.
    pub fn with_lookup(lookup: Lookup) -> IbNet {
        IbNet {
            settings: OnceLock::new(),
            lookup,
            found: Mutex::new(None),
            contexts: Registry::new(Kind::Context),
            listens: Registry::new(Kind::Listen),
            dialing: Mutex::new(HashMap::new()),
            sends: Registry::new(Kind::Send),
            recvs: Registry::new(Kind::Recv),
            mrs: Registry::new(Kind::Mr),
            requests: Registry::new(Kind::Request),
            flushes: Registry::new(Kind::Request),
        }
    }

    fn settings(&self) -> Result<&IbSettings, PluginError> {
        if let Some(s) = self.settings.get() {
            return Ok(s);
        }
        let read = IbSettings::from_lookup(self.lookup)?;
        Ok(self.settings.get_or_init(|| read))
    }

    /// The devices, found at the first successful `init` (and logged then).
    fn found(&self, log: &LogFn) -> Result<Arc<Found>, PluginError> {
        let mut slot = lock(&self.found);
        if let Some(f) = slot.as_ref() {
            return Ok(Arc::clone(f));
        }
        let settings = self.settings()?;
        let discovery = discover(settings)
            .inspect_err(|e| log.warn(subsys::INIT | subsys::NET, &format!("NET/IB : {e}")))?;
        for note in &discovery.notes {
            log.warn(subsys::INIT | subsys::NET, &format!("NET/IB : {note}"));
        }
        let iface = rustccl_netif::bootstrap_interface_from(self.lookup).map_err(|e| {
            PluginError::system(format!(
                "NET/IB : no interface for the out-of-band connections ({e}); set NCCL_SOCKET_IFNAME"
            ))
        })?;
        let identities: Vec<_> = discovery.devices.iter().map(IbDevice::identity).collect();
        let vdevices = group_ports(&identities, settings.merge);
        let list: Vec<String> = vdevices
            .iter()
            .enumerate()
            .map(|(i, members)| {
                let members: Vec<IbDevice> = members
                    .iter()
                    .map(|&m| discovery.devices[m].clone())
                    .collect();
                describe(i, &members)
            })
            .collect();
        log.info(
            subsys::INIT | subsys::NET,
            &format!(
                "NET/IB : Using {} ; OOB {}:{} ; {} QP(s) per connection",
                list.join(" "),
                iface.name,
                iface.addr,
                settings.qp.qps_per_connection
            ),
        );
        let dmabuf: Vec<DmaBufSupport> = discovery
            .devices
            .iter()
            .map(|d| {
                let support = dmabuf::probe(d, settings.gpu.dmabuf_enable);
                let name = format!("{}:{}", d.name, d.port);
                log.info(
                    subsys::INIT | subsys::NET,
                    &dmabuf::log_line(&name, &support),
                );
                support
            })
            .collect();
        let events = AsyncEvents::start(&discovery.devices, *log);
        let found = Arc::new(Found {
            devices: discovery.devices,
            vdevices: Mutex::new(vdevices),
            oob_addr: iface.addr,
            dmabuf,
            events,
        });
        *slot = Some(Arc::clone(&found));
        Ok(found)
    }

    fn context(&self, ctx: PluginHandle) -> Result<Context, PluginError> {
        self.contexts.get_or_unknown(ctx)
    }

    /// The indices of the physical devices of device `dev` (one, or the members of a
    /// merged device).
    fn members(found: &Found, dev: i32) -> Result<Vec<usize>, PluginError> {
        let vdevices = lock(&found.vdevices);
        usize::try_from(dev)
            .ok()
            .and_then(|d| vdevices.get(d))
            .cloned()
            .ok_or_else(|| {
                PluginError::invalid_argument(format!(
                    "no IB device {dev} ({} devices)",
                    vdevices.len()
                ))
            })
    }

    /// The physical devices of device `dev`.
    fn device(found: &Found, dev: i32) -> Result<Vec<IbDevice>, PluginError> {
        Ok(Self::members(found, dev)?
            .iter()
            .map(|&m| found.devices[m].clone())
            .collect())
    }

    /// The properties of one physical device (port), with its dma-buf support.
    fn physical_properties(d: &IbDevice, dmabuf: &DmaBufSupport) -> NetProperties {
        NetProperties {
            name: RString::from(d.name.as_str()),
            pci_path: RString::from(d.pci_path.as_str()),
            guid: d.guid,
            // GPU memory through dma-buf only (crate::dmabuf).
            ptr_support: dmabuf.ptr_support(),
            reg_is_global: false,
            force_flush: false,
            speed_mbps: d.speed_mbps,
            port: d.port.into(),
            latency_us: 0.0,
            max_comms: 65536,
            // Multi-receive: up to 8 tagged buffers per receive, as NCCL's IB.
            max_recvs: MAX_RECVS as u32,
            max_p2p_bytes: MAX_MESSAGE as u64,
            max_coll_bytes: MAX_MESSAGE as u64,
        }
    }

    fn comm(&self, comm: PluginHandle) -> Result<Arc<Comm>, PluginError> {
        self.sends
            .get(comm)
            .or_else(|| self.recvs.get(comm))
            .ok_or_else(|| registry::unknown("connection", comm))
    }

    /// The registration `mr` of connection `comm`, checked to cover `data..data + size`.
    fn check_mr(
        &self,
        comm: PluginHandle,
        mr: PluginHandle,
        data: usize,
        size: usize,
    ) -> Result<MrHandle, PluginError> {
        let m = self.mrs.get_or_unknown(mr)?;
        if m.comm != comm.id {
            return Err(PluginError::invalid_argument(format!(
                "memory registration {:#x} belongs to another connection",
                mr.id
            )));
        }
        let inside = data >= m.reg.start
            && data
                .checked_add(size)
                .is_some_and(|end| end <= m.reg.start + m.reg.len);
        if size > 0 && !inside {
            return Err(PluginError::invalid_argument(format!(
                "buffer {data:#x}+{size} is outside its registration {:#x}+{}",
                m.reg.start, m.reg.len
            )));
        }
        if size > 0 && data == 0 {
            return Err(PluginError::invalid_argument("a null buffer"));
        }
        if size > MAX_MESSAGE {
            return Err(PluginError::invalid_argument(format!(
                "a message of {size} bytes is larger than the IB transport's {MAX_MESSAGE}"
            )));
        }
        Ok(m)
    }

    /// Closes a connection: forgets its requests and registrations (the verbs objects go
    /// with the last reference).
    fn close_comm(&self, id: u64, comm: Arc<Comm>) {
        self.requests.remove_where(|c| Arc::ptr_eq(c, &comm));
        self.flushes.remove_where(|c| Arc::ptr_eq(c, &comm));
        self.mrs.remove_where(|m| m.comm == id);
    }

    /// Advances one `connect`; `Some` once the TCP connection is up: the connection then
    /// finishes its setup itself ([`Setup`]).
    fn dial(&self, d: &mut Dialing) -> Result<Option<Parts>, String> {
        let sock = d.sock.as_ref().expect("until handed over");
        if !oob::connected(sock).map_err(|e| e.to_string())? {
            return Ok(None);
        }
        let local = d.local.take().expect("handed over once");
        let sock = d.sock.take().expect("handed over once");
        let info = local.info(d.magic, true).encode().to_vec();
        let mut pipe = Pipe::new(sock.into(), info, CONN_INFO_BYTES);
        pipe.progress().map_err(|e| e.to_string())?;
        let qp = self.settings().map_err(|e| e.message)?.qp;
        let mut parts = local.into_parts(pipe);
        parts.setup = Some(Setup::Exchange { qp });
        Ok(Some(parts))
    }

    /// Advances one incoming connection; `Some` once the connector's info is read and this
    /// side's QPs are at RTS (the connection then writes its info and waits for "ready"
    /// itself: [`Setup::AwaitReady`]).
    fn accept_step(
        &self,
        a: &mut Accepting,
        l: &Listen,
        members: &[IbDevice],
    ) -> Result<Option<(Local, ConnInfo)>, String> {
        let Some(bytes) = a.pipe.progress().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let peer = oob::conn_info(bytes)?;
        if peer.magic != l.magic {
            return Err("a connection for another (or an earlier) listen arrived; closed".into());
        }
        let settings = self.settings().map_err(|e| e.message)?;
        let mut local = Local::create(members, peer.qps.len(), settings).map_err(|e| e.message)?;
        local
            .ep
            .connect(&peer, &settings.qp)
            .map_err(|e| e.message)?;
        let info = local.info(PROTO_MAGIC, false).encode().to_vec();
        a.pipe.next(info, 1);
        a.pipe.progress().map_err(|e| e.to_string())?;
        Ok(Some((local, peer)))
    }
}

impl Net for IbNet {
    fn init(
        &self,
        _comm_id: u64,
        _config: &NetCommConfig,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        let found = self.found(&log)?;
        Ok(self.contexts.insert(Context { log, found }))
    }

    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        Ok(lock(&self.context(ctx)?.found.vdevices).len() as i32)
    }

    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        let c = self.context(ctx)?;
        let members = Self::members(&c.found, dev)?;
        let props: Vec<NetProperties> = members
            .iter()
            .map(|&m| Self::physical_properties(&c.found.devices[m], &c.found.dmabuf[m]))
            .collect();
        Ok(merge_properties(&props).expect("a device has members"))
    }

    /// Appends a device made of the physical devices `devs` (see [`check_members`]).
    fn make_vdevice(&self, ctx: PluginHandle, devs: &[i32]) -> Result<i32, PluginError> {
        let c = self.context(ctx)?;
        let links: Vec<_> = c.found.devices.iter().map(|d| d.link_layer).collect();
        let members = check_members(devs, &links, self.settings()?.merge).inspect_err(|e| {
            c.log
                .warn(subsys::NET, &format!("NET/IB : make_vdevice: {e}"))
        })?;
        let mut vdevices = lock(&c.found.vdevices);
        vdevices.push(members);
        let index = vdevices.len() - 1;
        drop(vdevices);
        let members = Self::device(&c.found, index as i32)?;
        c.log.info(
            subsys::NET,
            &format!(
                "NET/IB : made virtual device {} speed={} ndevs={}",
                describe(index, &members),
                members.iter().map(|d| d.speed_mbps).sum::<u32>(),
                members.len()
            ),
        );
        Ok(index as i32)
    }

    fn listen(
        &self,
        ctx: PluginHandle,
        dev: i32,
    ) -> Result<(NetHandle, PluginHandle), PluginError> {
        let c = self.context(ctx)?;
        let members = Self::device(&c.found, dev)?;
        let name = label(&members);
        let listener = oob::listen(c.found.oob_addr).map_err(|e| {
            let e = format!(
                "NET/IB : cannot listen on {} for dev {dev} ({name}): {e}",
                c.found.oob_addr
            );
            c.log.warn(subsys::NET, &e);
            PluginError::system(e)
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| PluginError::system(format!("NET/IB : listener address: {e}")))?;
        let handle = ListenHandle {
            addr,
            magic: random_magic()?,
        };
        c.log.info(
            subsys::NET,
            &format!("NET/IB : listening on dev {dev} ({name}) at {addr}"),
        );
        let l = Listen {
            ctx: ctx.id,
            dev,
            log: c.log,
            listener,
            magic: handle.magic,
            pending: Vec::new(),
        };
        Ok((
            encode_handle(&handle, members.len()),
            self.listens.insert(Arc::new(Mutex::new(l))),
        ))
    }

    fn connect(
        &self,
        ctx: PluginHandle,
        dev: i32,
        handle: &NetHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        let c = self.context(ctx)?;
        let members = Self::device(&c.found, dev)?;
        let name = label(&members);
        let key: DialKey = (ctx.id, dev, handle.bytes);
        let mut dialing = lock(&self.dialing);
        let dialer = match dialing.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(slot) => {
                let (peer, peer_devices) = decode_handle(handle)
                    .map_err(|e| PluginError::invalid_argument(format!("connect: {e}")))?;
                let settings = self.settings()?;
                let nqps = qp_count(members.len(), peer_devices, settings.qp.qps_per_connection)?;
                let local = Local::create(&members, nqps, settings)?;
                let sock = oob::start_connect(peer.addr).map_err(|e| {
                    PluginError::system(format!(
                        "NET/IB : cannot connect to {} from dev {dev} ({name}): {e}",
                        peer.addr
                    ))
                })?;
                slot.insert(Dialing {
                    local: Some(local),
                    magic: peer.magic,
                    sock: Some(sock),
                })
            }
        };
        match self.dial(dialer) {
            Ok(None) => Ok(None),
            Ok(Some(parts)) => {
                dialing.remove(&key);
                drop(dialing);
                let settings_qp = self.settings()?.qp;
                let comm = Comm::new(Direction::Send, ctx.id, name, parts, (0, 0))
                    .with_adaptive_routing(adaptive_routing_threshold(
                        settings_qp.adaptive_routing,
                        members[0].link_layer,
                        settings_qp.ar_threshold,
                    ))
                    .with_gpu(c.found.dmabuf(dev), None);
                let comm = comm.start();
                for (m, d) in members.iter().enumerate() {
                    c.found.events.watch(&comm, d, m);
                }
                Ok(Some(self.sends.insert(comm)))
            }
            Err(e) => {
                dialing.remove(&key);
                let e = format!("NET/IB : connect from dev {dev} ({name}) failed: {e}");
                c.log.warn(subsys::NET, &e);
                Err(PluginError::remote(e))
            }
        }
    }

    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let l = self.listens.get_or_unknown(listen)?;
        let mut l = lock(&l);
        let c = self.context(PluginHandle { id: l.ctx })?;
        let members = Self::device(&c.found, l.dev)?;
        while let Some(sock) = oob::accept_one(&l.listener).map_err(|e| {
            PluginError::system(format!("NET/IB : accept on dev {} failed: {e}", l.dev))
        })? {
            l.pending.push(Accepting {
                pipe: Pipe::new(sock, Vec::new(), CONN_INFO_BYTES),
            });
        }
        let mut pending = std::mem::take(&mut l.pending);
        let mut done = None;
        let mut i = 0;
        while i < pending.len() {
            if done.is_some() {
                i += 1;
                continue;
            }
            match self.accept_step(&mut pending[i], &l, &members) {
                Ok(None) => i += 1,
                Ok(Some((local, peer))) => {
                    let a = pending.remove(i);
                    let mut parts = local.into_parts(a.pipe);
                    parts.setup = Some(Setup::AwaitReady);
                    done = Some((parts, peer));
                }
                Err(e) => {
                    // A failed incoming connection is dropped; the rightful one may still come.
                    l.log.warn(
                        subsys::NET,
                        &format!("NET/IB : incoming connection on dev {} dropped: {e}", l.dev),
                    );
                    pending.remove(i);
                }
            }
        }
        l.pending = pending;
        match done {
            None => Ok(None),
            Some((parts, peer)) => {
                let flush = self.flush_qp(&c.found, l.dev, &parts)?;
                let comm = Comm::new(
                    Direction::Recv,
                    l.ctx,
                    label(&members),
                    parts,
                    (peer.inbox_addr, peer.inbox_rkey),
                )
                .with_gpu(c.found.dmabuf(l.dev), flush);
                let comm = comm.start();
                for (m, d) in members.iter().enumerate() {
                    c.found.events.watch(&comm, d, m);
                }
                Ok(Some(self.recvs.insert(comm)))
            }
        }
    }

    fn reg_mr(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        ptr_type: u32,
    ) -> Result<PluginHandle, PluginError> {
        let c = self.comm(comm)?;
        if ptr_type != PTR_HOST {
            return Err(dmabuf::reg_mr_refused(ptr_type, &c.device, c.dmabuf));
        }
        if data == 0 {
            return Err(PluginError::invalid_argument("reg_mr of a null address"));
        }
        let (entry, reg) = c.reg_mr(data, size)?;
        Ok(self.mrs.insert(MrHandle {
            comm: comm.id,
            entry,
            reg,
            device: false,
        }))
    }

    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        let c = self.comm(comm)?;
        match self.mrs.get(mr) {
            Some(m) if m.comm == comm.id => {
                self.mrs.remove(mr);
                c.dereg_mr(m.entry);
                Ok(())
            }
            Some(_) => Err(PluginError::invalid_argument(format!(
                "memory registration {:#x} belongs to another connection",
                mr.id
            ))),
            None => Err(self.mrs.unknown(mr)),
        }
    }

    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        let c = self.sends.get_or_unknown(comm)?;
        let m = self.check_mr(comm, mr, data, size)?;
        let req = self.requests.reserve();
        if !c.isend(req.id, data, size, tag, m.reg.lkeys())? {
            return Ok(None);
        }
        self.requests.insert_at(req, c);
        Ok(Some(req))
    }

    unsafe fn irecv(
        &self,
        comm: PluginHandle,
        bufs: &[RecvBuffer],
    ) -> Result<Option<PluginHandle>, PluginError> {
        let c = self.recvs.get_or_unknown(comm)?;
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(PluginError::invalid_argument(format!(
                "the IB plugin receives into 1 to {MAX_RECVS} buffers at a time (max_recvs = {MAX_RECVS}), not {}",
                bufs.len()
            )));
        }
        let targets = bufs
            .iter()
            .map(|b| {
                let m = self.check_mr(comm, b.mr, b.data, b.size)?;
                Ok(RecvBuf {
                    addr: b.data,
                    size: b.size,
                    tag: b.tag,
                    rkeys: m.reg.rkeys(),
                })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        let req = self.requests.reserve();
        if !c.irecv(req.id, &targets)? {
            return Ok(None);
        }
        self.requests.insert_at(req, c);
        Ok(Some(req))
    }

    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        if let Some(c) = self.flushes.get(request) {
            return self.test_flush(request, &c);
        }
        let c = self.requests.get_or_unknown(request)?;
        match c.test(request.id) {
            Ok(None) => Ok(false),
            Ok(Some(got)) => {
                self.requests.remove(request);
                for (s, g) in sizes.iter_mut().zip(got) {
                    *s = g;
                }
                Ok(true)
            }
            Err(e) => {
                self.requests.remove(request);
                Err(e)
            }
        }
    }

    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        let c = self.sends.remove_or_unknown(comm)?;
        self.close_comm(comm.id, c);
        Ok(())
    }

    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        let c = self.recvs.remove_or_unknown(comm)?;
        self.close_comm(comm.id, c);
        Ok(())
    }

    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        self.listens.remove_or_unknown(listen).map(drop)
    }

    /// Ends a context, closing whatever it still has open.
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        self.contexts.remove_or_unknown(ctx)?;
        self.listens.remove_where(|l| lock(l).ctx == ctx.id);
        lock(&self.dialing).retain(|k, _| k.0 != ctx.id);
        for registry in [&self.sends, &self.recvs] {
            for (id, c) in registry.remove_where(|c| c.ctx == ctx.id) {
                self.close_comm(id, c);
            }
        }
        Ok(())
    }

    /// Registers `data..data + size` of dma-buf `fd` at `offset` ([`crate::dmabuf`]).
    fn reg_mr_dmabuf(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        ptr_type: u32,
        offset: u64,
        fd: i32,
    ) -> Result<PluginHandle, PluginError> {
        let c = self.comm(comm)?;
        if ptr_type == 0 || ptr_type & !(PTR_HOST | PTR_DEVICE | PTR_DMABUF) != 0 {
            return Err(PluginError::invalid_argument(format!(
                "reg_mr_dmabuf: unknown pointer type {ptr_type}"
            )));
        }
        let (entry, reg) = dmabuf::register(&c, data, size, offset, fd)?;
        Ok(self.mrs.insert(MrHandle {
            comm: comm.id,
            entry,
            reg,
            device: true,
        }))
    }

    /// A 1-byte read through the connection's loopback QP when the receive went into device
    /// memory; `None` otherwise ([`crate::flush`]).
    fn iflush(
        &self,
        comm: PluginHandle,
        bufs: &[RecvBuffer],
    ) -> Result<Option<PluginHandle>, PluginError> {
        let c = self.recvs.get_or_unknown(comm)?;
        let Some(flush) = c.flush.as_ref() else {
            return Ok(None);
        };
        let mrs = bufs
            .iter()
            .map(|b| self.check_mr(comm, b.mr, b.data, b.size))
            .collect::<Result<Vec<_>, _>>()?;
        let target = flush::read_target(bufs.iter().zip(&mrs).map(|(b, m)| (b.size, m.device)));
        let Some(i) = target else {
            return Ok(None);
        };
        let req = self.requests.reserve();
        flush.post(req.id, bufs[i].data as u64, &mrs[i].reg.rkeys())?;
        self.flushes.insert_at(req, Arc::clone(&c));
        Ok(Some(req))
    }
}

impl IbNet {
    /// The flush QP of a receiving connection on device `dev`: where the device offers GPU
    /// memory and `NCCL_GDR_FLUSH_DISABLE` is not set ([`crate::flush`]).
    fn flush_qp(
        &self,
        found: &Found,
        dev: i32,
        parts: &Parts,
    ) -> Result<Option<Flush>, PluginError> {
        let settings = self.settings()?;
        if !found.dmabuf(dev) || settings.gpu.flush_disable {
            return Ok(None);
        }
        Flush::create(&parts.ep.members, &parts.ep.pds, &settings.qp).map(Some)
    }

    /// `test` of a flush request; `sizes` are left as they are.
    fn test_flush(&self, request: PluginHandle, c: &Comm) -> Result<bool, PluginError> {
        let Some(flush) = c.flush.as_ref() else {
            return Err(PluginError::internal(
                "a flush request on a connection without a flush QP",
            ));
        };
        let done = flush.test(request.id);
        if !matches!(done, Ok(false)) {
            self.flushes.remove(request);
        }
        done
    }
}

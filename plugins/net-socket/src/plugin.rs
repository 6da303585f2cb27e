//! [`SocketNet`]: the [`Net`] implementation, named "Socket". It keeps the plugin's objects
//! in handle tables and forwards the work to [`connect`](crate::connect) (connection set-up)
//! and [`Comm`] (data).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::std_types::{RStr, RString};
use rustccl_netif::Family;
use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, PTR_HOST};
use rustccl_plugin_api::{subsys, LogFn, PluginError, PluginHandle};

use crate::comm::{Comm, Direction};
use crate::connect::{Acceptor, Dialer};
use crate::device::{self, Device};
use crate::registry::{self, Kind, Registry};
use crate::striping::SocketConfig;
use crate::wire::{ListenInfo, MAKER, PROTO_MAGIC};

/// Everything the plugin reads from the environment, fixed for its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketSettings {
    /// `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD` of the connections this side opens.
    pub config: SocketConfig,
    /// `NCCL_SOCKET_IFNAME`: which interfaces become devices (`None`: the default rules).
    pub ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub family: Option<Family>,
}

impl SocketSettings {
    /// Reads `NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_IFNAME` and
    /// `NCCL_SOCKET_FAMILY` from the process environment.
    pub fn from_env() -> Result<SocketSettings, String> {
        SocketSettings::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the same variables through `lookup` (name → value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<SocketSettings, String> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        Ok(SocketSettings {
            config: SocketConfig::from_lookup(&lookup)?,
            ifname: var("NCCL_SOCKET_IFNAME"),
            family: var("NCCL_SOCKET_FAMILY").and_then(|f| Family::parse(&f)),
        })
    }

    /// `config` for the sockets, loopback (`lo`) as the only device: for tests.
    pub fn loopback(config: SocketConfig) -> SocketSettings {
        SocketSettings {
            config,
            ifname: Some("lo".into()),
            family: Some(Family::V4),
        }
    }
}

/// Registered memory: a range of host memory, for one connection.
#[derive(Debug, Clone, Copy)]
struct Mr {
    comm: u64,
    data: usize,
    size: usize,
}

/// Per-communicator state made by `init`.
#[derive(Clone)]
struct Context {
    log: LogFn,
    traffic_class: i32,
    devices: Arc<Vec<Device>>,
    /// The encryption key of this context's connections (see [`Net::init_with_key`]).
    key: Option<Arc<rustccl_securewire::Psk>>,
}

struct Listen {
    ctx: u64,
    dev: i32,
    log: LogFn,
    acceptor: Acceptor,
}

/// A `connect` in progress: keyed by (context, device, handle bytes), since the caller
/// repeats the same call until it completes.
type DialKey = (u64, i32, [u8; rustccl_plugin_api::net::NET_HANDLE_BYTES]);

/// How the plugin reads a variable (name → value).
pub type Lookup = fn(&str) -> Option<String>;

/// The TCP socket net plugin.
pub struct SocketNet {
    /// Given to the constructor, or read through `lookup` at the first `init`.
    settings: OnceLock<SocketSettings>,
    lookup: Lookup,
    devices: Mutex<Option<Arc<Vec<Device>>>>,
    contexts: Registry<Context>,
    listens: Registry<Arc<Mutex<Listen>>>,
    dialing: Mutex<HashMap<DialKey, Dialer>>,
    sends: Registry<Arc<Comm>>,
    recvs: Registry<Arc<Comm>>,
    mrs: Registry<Mr>,
    requests: Registry<Arc<Comm>>,
}

impl Default for SocketNet {
    fn default() -> Self {
        SocketNet::new()
    }
}

/// The process's built-in instance (settings from the environment at its first `init`).
pub fn instance() -> &'static SocketNet {
    static INSTANCE: OnceLock<SocketNet> = OnceLock::new();
    INSTANCE.get_or_init(SocketNet::new)
}

impl SocketNet {
    /// A plugin that reads its settings from the environment at the first `init`.
    pub fn new() -> SocketNet {
        SocketNet::with_lookup(|name| std::env::var(name).ok())
    }

    /// A plugin that reads its settings through `lookup` at the first `init`: the host's
    /// built-in instance passes its parameter lookup, so that an env plugin resolves the
    /// socket variables as NCCL's resolves its socket transport's. Loaded as a library of its
    /// own, the plugin reads the process environment, as other net plugins do.
    pub fn with_lookup(lookup: Lookup) -> SocketNet {
        SocketNet {
            settings: OnceLock::new(),
            lookup,
            devices: Mutex::new(None),
            contexts: Registry::new(Kind::Context),
            listens: Registry::new(Kind::Listen),
            dialing: Mutex::new(HashMap::new()),
            sends: Registry::new(Kind::Send),
            recvs: Registry::new(Kind::Recv),
            mrs: Registry::new(Kind::Mr),
            requests: Registry::new(Kind::Request),
        }
    }

    /// A plugin with fixed settings (the environment is not read).
    pub fn with_settings(settings: SocketSettings) -> SocketNet {
        let net = SocketNet::new();
        let _ = net.settings.set(settings);
        net
    }

    /// A plugin with a fixed socket configuration; interfaces still come from the
    /// environment (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`).
    pub fn with_config(config: SocketConfig) -> Result<SocketNet, String> {
        let mut settings = SocketSettings::from_env()?;
        settings.config = config;
        Ok(SocketNet::with_settings(settings))
    }

    /// Connections (send and receive) open now, each with its helper threads running.
    pub fn open_connections(&self) -> usize {
        self.sends.len() + self.recvs.len()
    }

    fn settings(&self) -> Result<&SocketSettings, PluginError> {
        if let Some(s) = self.settings.get() {
            return Ok(s);
        }
        let read = SocketSettings::from_lookup(self.lookup).map_err(PluginError::invalid_argument)?;
        Ok(self.settings.get_or_init(|| read))
    }

    /// The devices, found at the first successful `init` (and logged then).
    fn devices(&self, log: &LogFn) -> Result<Arc<Vec<Device>>, PluginError> {
        let mut slot = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let settings = self.settings()?;
        let found = device::discover(settings.ifname.as_deref(), settings.family).map_err(|e| {
            let e = format!("NET/Socket : {e}");
            log.warn(subsys::INIT | subsys::NET, &e);
            PluginError::system(e)
        })?;
        let list: Vec<String> = found
            .iter()
            .enumerate()
            .map(|(i, d)| format!("[{i}]{}:{}", d.name, d.addr))
            .collect();
        log.info(
            subsys::INIT | subsys::NET,
            &format!(
                "NET/Socket : Using {} ; {} threads x {} sockets per connection{}",
                list.join(" "),
                settings.config.nthreads,
                settings.config.nsocks_per_thread,
                match settings.config.liveness {
                    Some(limit) => format!(" ; a peer silent for {} ms fails its connection", limit.as_millis()),
                    None => String::new(),
                }
            ),
        );
        let found = Arc::new(found);
        *slot = Some(found.clone());
        Ok(found)
    }

    fn context(&self, ctx: PluginHandle) -> Result<Context, PluginError> {
        self.contexts.get_or_unknown(ctx)
    }

    fn device<'a>(&self, ctx: &'a Context, dev: i32) -> Result<&'a Device, PluginError> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| ctx.devices.get(d))
            .ok_or_else(|| {
                PluginError::invalid_argument(format!(
                    "no socket device {dev} ({} devices)",
                    ctx.devices.len()
                ))
            })
    }

    /// The registration `mr` of connection `comm`, checked to cover `data..data + size`.
    fn check_mr(
        &self,
        comm: PluginHandle,
        mr: PluginHandle,
        data: usize,
        size: usize,
    ) -> Result<(), PluginError> {
        let m = self.mrs.get_or_unknown(mr)?;
        if m.comm != comm.id {
            return Err(PluginError::invalid_argument(format!(
                "memory registration {:#x} belongs to another connection",
                mr.id
            )));
        }
        let inside = data >= m.data
            && data
                .checked_add(size)
                .is_some_and(|end| end <= m.data + m.size);
        if size > 0 && !inside {
            return Err(PluginError::invalid_argument(format!(
                "buffer {data:#x}+{size} is outside its registration {:#x}+{}",
                m.data, m.size
            )));
        }
        Ok(())
    }

    fn comm(&self, comm: PluginHandle) -> Result<Arc<Comm>, PluginError> {
        self.sends
            .get(comm)
            .or_else(|| self.recvs.get(comm))
            .ok_or_else(|| registry::unknown("connection", comm))
    }

    fn init_keyed(
        &self,
        _comm_id: u64,
        config: &NetCommConfig,
        key: Option<Arc<rustccl_securewire::Psk>>,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        let devices = self.devices(&log)?;
        Ok(self.contexts.insert(Context {
            log,
            traffic_class: config.traffic_class,
            devices,
            key,
        }))
    }

    /// Closes a connection: stops its threads, forgets its requests and registrations.
    fn close_comm(&self, id: u64, comm: Arc<Comm>) {
        comm.close();
        self.requests.remove_where(|c| Arc::ptr_eq(c, &comm));
        self.mrs.remove_where(|m| m.comm == id);
    }
}

impl Net for SocketNet {
    /// Without a key given: the process's, if this copy of the record layer has one (the
    /// built-in plugin shares the host's; see [`rustccl_securewire::process_key`]).
    fn init(
        &self,
        comm_id: u64,
        config: &NetCommConfig,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        self.init_keyed(comm_id, config, rustccl_securewire::process_key(), log)
    }

    fn takes_encryption_key(&self) -> bool {
        true
    }

    /// The host's key (net ABI v3): a plugin loaded as a library of its own has its own copy
    /// of the record layer, whose process key the host never set, so the key comes here.
    fn init_with_key(
        &self,
        comm_id: u64,
        config: &NetCommConfig,
        key: Option<&[u8]>,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        let key = key
            .map(|k| rustccl_securewire::Psk::new(k).map(Arc::new))
            .transpose()
            .map_err(|e| PluginError::invalid_argument(format!("NET/Socket : {e}")))?;
        self.init_keyed(comm_id, config, key, log)
    }

    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        Ok(self.context(ctx)?.devices.len() as i32)
    }

    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        let ctx = self.context(ctx)?;
        let d = self.device(&ctx, dev)?;
        Ok(NetProperties {
            name: RString::from(d.name.as_str()),
            pci_path: RString::from(d.pci_path.as_str()),
            guid: dev as u64,
            ptr_support: PTR_HOST,
            reg_is_global: false,
            force_flush: false,
            speed_mbps: d.speed_mbps,
            port: 0,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: 1,
            max_p2p_bytes: 1 << 40,
            max_coll_bytes: 1 << 40,
        })
    }

    fn listen(
        &self,
        ctx: PluginHandle,
        dev: i32,
    ) -> Result<(NetHandle, PluginHandle), PluginError> {
        let c = self.context(ctx)?;
        let d = self.device(&c, dev)?;
        let acceptor = Acceptor::bind(d.addr, c.key.clone()).map_err(|e| {
            let e = format!("NET/Socket : cannot listen on {} ({}): {e}", d.name, d.addr);
            c.log.warn(subsys::NET, &e);
            PluginError::system(e)
        })?;
        let info = ListenInfo {
            addr: acceptor.addr(),
            magic: acceptor.magic(),
        };
        c.log.info(
            subsys::NET,
            &format!(
                "NET/Socket : listening on dev {dev} ({}) at {}",
                d.name, info.addr
            ),
        );
        let listen = Listen {
            ctx: ctx.id,
            dev,
            log: c.log,
            acceptor,
        };
        Ok((
            info.encode(PROTO_MAGIC),
            self.listens.insert(Arc::new(Mutex::new(listen))),
        ))
    }

    fn connect(
        &self,
        ctx: PluginHandle,
        dev: i32,
        handle: &NetHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        let c = self.context(ctx)?;
        let d = self.device(&c, dev)?;
        let key: DialKey = (ctx.id, dev, handle.bytes);
        let mut dialing = self.dialing.lock().unwrap_or_else(|p| p.into_inner());
        let dialer = match dialing.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(slot) => {
                let info = ListenInfo::decode(handle, PROTO_MAGIC, MAKER)
                    .map_err(|e| PluginError::invalid_argument(format!("connect: {e}")))?;
                let config = self.settings()?.config;
                let dialer = Dialer::start(info.addr, info.magic, config, c.traffic_class, c.key.clone())
                    .map_err(|e| {
                        let e = format!(
                            "NET/Socket : cannot connect to {} from dev {dev} ({}): {e}",
                            info.addr, d.name
                        );
                        c.log.warn(subsys::NET, &e);
                        PluginError::system(e)
                    })?;
                c.log.info(
                    subsys::NET,
                    &format!(
                        "NET/Socket : connecting to {} from dev {dev} ({}) with {} data sockets",
                        info.addr,
                        d.name,
                        config.nsocks()
                    ),
                );
                slot.insert(dialer)
            }
        };
        let peer: SocketAddr = dialer.peer();
        match dialer.progress() {
            Ok(false) => Ok(None),
            Ok(true) => {
                let est = dialing.remove(&key).expect("present").finish();
                drop(dialing);
                let liveness = self.settings()?.config.liveness;
                let comm = Comm::new(Direction::Send, ctx.id, est, c.log, liveness).map_err(|e| {
                    PluginError::system(format!(
                        "NET/Socket : cannot start the connection to {peer}: {e}"
                    ))
                })?;
                Ok(Some(self.sends.insert(Arc::new(comm))))
            }
            Err(e) => {
                dialing.remove(&key);
                let e = format!(
                    "NET/Socket : cannot connect to {peer} from dev {dev} ({}): {e}",
                    d.name
                );
                c.log.warn(subsys::NET, &e);
                Err(PluginError::remote(e))
            }
        }
    }

    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let l = self.listens.get_or_unknown(listen)?;
        let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
        let log = l.log;
        let est = l
            .acceptor
            .progress(&mut |w| log.warn(subsys::NET, &w))
            .map_err(|e| {
                let e = format!("NET/Socket : accept on dev {} failed: {e}", l.dev);
                log.warn(subsys::NET, &e);
                PluginError::system(e)
            })?;
        match est {
            None => Ok(None),
            Some(est) => {
                let peer = est.peer;
                let liveness = self.settings()?.config.liveness;
                let comm = Comm::new(Direction::Recv, l.ctx, est, log, liveness).map_err(|e| {
                    PluginError::system(format!(
                        "NET/Socket : cannot start the connection from {peer}: {e}"
                    ))
                })?;
                Ok(Some(self.recvs.insert(Arc::new(comm))))
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
        self.comm(comm)?;
        if ptr_type != PTR_HOST {
            return Err(PluginError::invalid_usage(format!(
                "the socket plugin supports host memory only (pointer type {ptr_type})"
            )));
        }
        Ok(self.mrs.insert(Mr {
            comm: comm.id,
            data,
            size,
        }))
    }

    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        match self.mrs.get(mr) {
            Some(m) if m.comm == comm.id => {
                self.mrs.remove(mr);
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
        self.check_mr(comm, mr, data, size)?;
        if size > 0 && data == 0 {
            return Err(PluginError::invalid_argument("isend of a null buffer"));
        }
        let req = self.requests.reserve();
        // SAFETY: forwarded from this function's contract.
        if !unsafe { c.post_send(req.id, data, size, tag)? } {
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
        let [buf] = bufs else {
            return Err(PluginError::invalid_argument(format!(
                "the socket plugin receives into exactly one buffer at a time (max_recvs = 1), not {}",
                bufs.len()
            )));
        };
        self.check_mr(comm, buf.mr, buf.data, buf.size)?;
        if buf.size > 0 && buf.data == 0 {
            return Err(PluginError::invalid_argument("irecv into a null buffer"));
        }
        let req = self.requests.reserve();
        // SAFETY: forwarded from this function's contract.
        if !unsafe { c.post_recv(req.id, *buf)? } {
            return Ok(None);
        }
        self.requests.insert_at(req, c);
        Ok(Some(req))
    }

    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        let c = self.requests.get_or_unknown(request)?;
        match c.test(request.id) {
            Ok(None) => Ok(false),
            Ok(Some(size)) => {
                self.requests.remove(request);
                if let Some(s) = sizes.first_mut() {
                    *s = size;
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
        self.listens
            .remove_where(|l| l.lock().unwrap_or_else(|p| p.into_inner()).ctx == ctx.id);
        self.dialing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| k.0 != ctx.id);
        for registry in [&self.sends, &self.recvs] {
            for (id, c) in registry.remove_where(|c| c.ctx == ctx.id) {
                self.close_comm(id, c);
            }
        }
        Ok(())
    }
}

/// A logger that drops everything (for hosts and tests that do not want plugin logs).
pub extern "C" fn silent_log(_level: i32, _subsys: u64, _message: RStr<'_>) {}

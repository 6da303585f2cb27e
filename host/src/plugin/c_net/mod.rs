//! NCCL's C net plugins (`ncclNetPlugin_v6` … `ncclNetPlugin_v12`) seen through the core's
//! [`Net`] trait: [`CNet`] wraps one table of any of those versions (`tables` declares them)
//! and handles the differences between versions itself:
//!
//! - v6–v10 are initialised once per process (a count per table, as NCCL's compatibility layer
//!   keeps): the adapter hands each communicator a context of its own; v11+ get `init` and
//!   `finalize(ctx)` per communicator. v10 takes the traffic class in `connect` (the adapter
//!   keeps it in its context), v11+ in `init`. v10+ get a profiler callback that records nothing.
//! - v6–v8 take `int` sizes: larger messages are refused with an error, as NCCL's adapters do.
//! - v7+ may offload to the device: the adapter passes empty device-handle storage (host only),
//!   and a plugin whose device 0 is not a host network is refused at `init`.
//! - The plugin's `void*` objects (listen and connection comms, registrations, requests) become
//!   numbered [`PluginHandle`]s that are never reused, so a stale or foreign handle is an error,
//!   not a call with a dangling pointer. Closing a connection forgets its registrations and
//!   requests. Calls on one connection (and on its requests) are serialised by a lock of the
//!   connection, so a close never races a call on the same connection.
//! - A connecting handle is kept between the calls of one `connect` (NCCL plugins keep their
//!   connection state in the handle's bytes), until the plugin returns the connection.
//! - Virtual devices (v9+, `NCCL_NET_FORCE_MERGE`) are made here after the first `init`
//!   (`merge.rs`): the `Net` trait's devices are the ones the transport should use, numbered
//!   anew (virtual devices first), and the adapter maps them to the plugin's indices.

mod merge;
mod tables;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rustccl_plugin_api::net::{Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer, NET_HANDLE_BYTES, PTR_DMABUF, SIZE_NOT_REPORTED};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};

use super::c_abi::{self, c_str_or};
use super::library::PluginLibrary;
use tables::*;
pub use merge::FORCE_MERGE;
pub use tables::{NEWEST, OLDEST};

/// An NCCL C net plugin's table, adapted.
pub struct CNet {
    fns: Fns,
    name: String,
    /// The table's address: the key of the process-wide init count of v6–v10.
    table_addr: usize,
    handles: Mutex<Handles>,
    /// Handles being connected: (context, device, the caller's bytes) → the bytes the plugin
    /// may update between calls.
    connecting: Mutex<HashMap<(u64, i32, [u8; NET_HANDLE_BYTES]), Box<[u8; NET_HANDLE_BYTES]>>>,
    /// The devices presented through `Net` (set by the first successful `init`).
    devmap: OnceLock<merge::DeviceMap>,
}

/// What `getProperties` says of a device, read into the core's terms.
struct DevProps {
    props: NetProperties,
    /// `netDeviceType` (host when the ABI predates it).
    ty: c_int,
    /// The physical devices it is made of (`vProps`, v9+; empty before).
    members: Vec<i32>,
}

/// Serialises the calls on one connection (or listener) and its requests.
type Guard = Arc<Mutex<()>>;

enum Obj {
    /// A communicator's context: the plugin's (v11+) or none (v6–v10), and its traffic class.
    Ctx { c_ctx: usize, traffic_class: c_int },
    Listen { ptr: usize, dev: i32, guard: Guard },
    Comm { ptr: usize, send: bool, max_recvs: usize, guard: Guard },
    Mr { ptr: usize, comm: u64 },
    Req { ptr: usize, comm: u64, n: usize },
}

#[derive(Default)]
struct Handles {
    next: u64,
    map: BTreeMap<u64, Obj>,
}

impl Handles {
    fn insert(&mut self, obj: Obj) -> PluginHandle {
        self.next += 1;
        self.map.insert(self.next, obj);
        PluginHandle { id: self.next }
    }
}

/// How many communicators use each v6–v10 table (initialised once, while the count is > 0).
static PROCESS_INITS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// The profiler callback given to v10+ `init`: no profiler listens; events get no handle.
unsafe extern "C" fn no_profiler(e_handle: *mut *mut c_void, _kind: c_int, _p: *mut c_void, _id: i64, _ext: *mut c_void) -> CResult {
    if !e_handle.is_null() {
        // SAFETY: the plugin passes storage for the event handle.
        unsafe { *e_handle = std::ptr::null_mut() };
    }
    c_abi::result::SUCCESS
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The config v10's `connect` is given for a traffic class. NCCL passes every connect of a
/// communicator the same `ncclNetCommConfig_v10_t`, alive from the net's init to its
/// finalize, so a plugin may keep the pointer: one config per traffic class (a handful of
/// values) lives for the life of the process. (v11+'s `init` gets a config for the call,
/// as NCCL's is on its stack.)
fn v10_config(traffic_class: c_int) -> *mut CommConfig {
    static CONFIGS: Mutex<BTreeMap<c_int, usize>> = Mutex::new(BTreeMap::new());
    let mut configs = lock(&CONFIGS);
    let addr = configs
        .entry(traffic_class)
        .or_insert_with(|| Box::into_raw(Box::new(CommConfig { traffic_class })) as usize);
    *addr as *mut CommConfig
}

fn ptr(p: usize) -> *mut c_void {
    p as *mut c_void
}

impl CNet {
    /// The newest C net table `lib` exports, adapted; `Ok(None)` when it exports none.
    pub fn load(lib: &PluginLibrary) -> Result<Option<CNet>, String> {
        for v in (OLDEST..=NEWEST).rev() {
            let symbol = format!("ncclNetPlugin_v{v}");
            // SAFETY: each symbol is read with the layout NCCL defines for it.
            let table = unsafe {
                match v {
                    12 => c_abi::find_table::<NetV12>(lib, &symbol).map(AnyTable::V12),
                    11 => c_abi::find_table::<NetV11>(lib, &symbol).map(AnyTable::V11),
                    10 => c_abi::find_table::<NetV10>(lib, &symbol).map(AnyTable::V10),
                    9 => c_abi::find_table::<NetV9>(lib, &symbol).map(AnyTable::V9),
                    8 => c_abi::find_table::<NetV8>(lib, &symbol).map(AnyTable::V8),
                    7 => c_abi::find_table::<NetV7>(lib, &symbol).map(AnyTable::V7),
                    _ => c_abi::find_table::<NetV6>(lib, &symbol).map(AnyTable::V6),
                }
            };
            let Some(table) = table else { continue };
            return Self::from_table(table, &symbol).map(Some);
        }
        Ok(None)
    }

    fn from_table(table: AnyTable, symbol: &str) -> Result<CNet, String> {
        if table.name_ptr().is_null() {
            return Err(format!("its {symbol} table is malformed: its name is NULL"));
        }
        // SAFETY: checked non-NULL; a plugin's name is a static C string.
        let name = unsafe { c_str_or(table.name_ptr(), "") };
        let fns = Fns::from_table(table)
            .map_err(|m| format!("its {symbol} table ({name}) is malformed: NULL {}", m.join(", ")))?;
        let table_addr = table.addr();
        Ok(CNet { fns, name, table_addr, handles: Mutex::default(), connecting: Mutex::default(), devmap: OnceLock::new() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The NCCL C net ABI version of the table.
    pub fn version(&self) -> u32 {
        self.fns.version
    }

    fn err(&self, code: c_int, what: &str) -> Result<(), PluginError> {
        c_abi::check(code, &format!("NET/{}: {what}", self.name))
    }

    fn stale(&self, what: &str, h: PluginHandle) -> PluginError {
        PluginError::invalid_argument(format!("NET/{}: {what} handle {} is unknown or already closed", self.name, h.id))
    }

    fn ctx_of(&self, ctx: PluginHandle) -> Result<(usize, c_int), PluginError> {
        match lock(&self.handles).map.get(&ctx.id) {
            Some(Obj::Ctx { c_ctx, traffic_class }) => Ok((*c_ctx, *traffic_class)),
            _ => Err(self.stale("context", ctx)),
        }
    }

    /// The lock of the connection or listener `id` (or of the connection a request or a
    /// registration belongs to).
    fn guard_of(&self, id: u64) -> Option<Guard> {
        let h = lock(&self.handles);
        let owner = match h.map.get(&id)? {
            Obj::Req { comm, .. } | Obj::Mr { comm, .. } => *comm,
            _ => id,
        };
        match h.map.get(&owner)? {
            Obj::Listen { guard, .. } | Obj::Comm { guard, .. } => Some(Arc::clone(guard)),
            _ => None,
        }
    }

    /// The pointer and direction of connection `comm`.
    fn comm_of(&self, h: &Handles, comm: PluginHandle) -> Result<(usize, bool, usize), PluginError> {
        match h.map.get(&comm.id) {
            Some(Obj::Comm { ptr, send, max_recvs, .. }) => Ok((*ptr, *send, *max_recvs)),
            _ => Err(self.stale("connection", comm)),
        }
    }

    fn mr_of(&self, h: &Handles, comm: PluginHandle, mr: PluginHandle) -> Result<usize, PluginError> {
        match h.map.get(&mr.id) {
            Some(Obj::Mr { ptr, comm: owner }) if *owner == comm.id => Ok(*ptr),
            _ => Err(self.stale("memory registration", mr)),
        }
    }

    /// Plugin device `dev`'s properties, device-offload type and members.
    fn props(&self, dev: i32) -> Result<DevProps, PluginError> {
        let default_name = format!("{} device {dev}", self.name);
        macro_rules! base {
            ($p:expr, $reg:expr, $flush:expr, $p2p:expr, $coll:expr, $ty:expr, $members:expr) => {{
                let p = $p;
                // SAFETY: NULL or NUL-terminated strings of the plugin, read during this call.
                let (name, pci) = unsafe { (c_str_or(p.name, &default_name), c_str_or(p.pci_path, "")) };
                let props = NetProperties {
                    name: name.into(),
                    pci_path: pci.into(),
                    guid: p.guid,
                    ptr_support: p.ptr_support.max(0) as u32,
                    reg_is_global: $reg,
                    force_flush: $flush,
                    speed_mbps: p.speed.max(0) as u32,
                    port: p.port,
                    latency_us: p.latency,
                    max_comms: p.max_comms.max(0) as u32,
                    max_recvs: p.max_recvs.max(1) as u32,
                    max_p2p_bytes: $p2p as u64,
                    max_coll_bytes: $coll as u64,
                };
                DevProps { props, ty: $ty, members: $members }
            }};
        }
        macro_rules! call {
            ($f:expr, $t:ty) => {{
                // SAFETY: an all-zero property struct is valid (NULL strings, zero numbers).
                let mut p: $t = unsafe { std::mem::zeroed() };
                // SAFETY: the table's own function with storage of its version's layout.
                self.err(unsafe { $f(dev, &mut p) }, &format!("getProperties({dev})"))?;
                p
            }};
        }
        let host = NET_DEVICE_HOST;
        Ok(match self.fns.get_properties {
            GetProperties::V6(f) => base!(call!(f, PropsV6), false, false, MAX_NET_SIZE, MAX_COLLNET_SIZE, host, vec![]),
            GetProperties::V7(f) => {
                let p = call!(f, PropsV7);
                base!(&p, false, false, MAX_NET_SIZE, MAX_COLLNET_SIZE, p.net_device_type, vec![])
            }
            GetProperties::V8(f) => {
                let p = call!(f, PropsV8);
                base!(&p, p.reg_is_global != 0, false, MAX_NET_SIZE, MAX_COLLNET_SIZE, p.net_device_type, vec![])
            }
            GetProperties::V9(f) => {
                let p = call!(f, PropsV9);
                let m = p.v_props.members();
                base!(&p, p.reg_is_global != 0, p.force_flush != 0, p.max_p2p_bytes, p.max_coll_bytes, p.net_device_type, m)
            }
            GetProperties::V11(f) => {
                let p = call!(f, PropsV11);
                let m = p.v_props.members();
                base!(&p, p.reg_is_global != 0, p.force_flush != 0, p.max_p2p_bytes, p.max_coll_bytes, p.net_device_type, m)
            }
            GetProperties::V12(f) => {
                let p = call!(f, PropsV12);
                let m = p.v_props.members();
                base!(&p, p.reg_is_global != 0, p.force_flush != 0, p.max_p2p_bytes, p.max_coll_bytes, p.net_device_type, m)
            }
        })
    }

    /// Refuses a plugin whose device 0 offloads to the device (rustccl drives host networks
    /// only).
    fn check_host_network(&self) -> Result<(), PluginError> {
        if self.plugin_devices()? < 1 {
            return Ok(()); // "no devices" is reported by the caller
        }
        let ty = self.props(0)?.ty;
        if ty != NET_DEVICE_HOST {
            return Err(PluginError::invalid_usage(format!(
                "NET/{}: device 0 is a device-offload network (netDeviceType {ty}); rustccl supports host networks \
                 (NCCL_NET_DEVICE_HOST) only: choose another plugin with NCCL_NET_PLUGIN",
                self.name
            )));
        }
        Ok(())
    }

    /// How many devices the plugin has (its own count: physical and virtual ones).
    fn plugin_devices(&self) -> Result<i32, PluginError> {
        let mut n: c_int = 0;
        // SAFETY: the table's function with storage for the count.
        self.err(unsafe { (self.fns.devices)(&mut n) }, "devices")?;
        Ok(n)
    }

    /// The plugin's index of `Net` device `dev`.
    fn plugin_dev(&self, dev: i32) -> Result<i32, PluginError> {
        let map = self.devmap.get().map(|m| m.as_slice()).unwrap_or(&[]);
        usize::try_from(dev).ok().and_then(|i| map.get(i).copied()).ok_or_else(|| {
            PluginError::invalid_argument(format!("NET/{}: no device {dev}: it presents {} device(s)", self.name, map.len()))
        })
    }

    /// Fixes the devices presented through `Net` (fusing them as asked, once per process).
    fn init_devices(&self) -> Result<(), PluginError> {
        let map = self.device_map()?;
        let _ = self.devmap.set(map);
        Ok(())
    }

    /// Makes a virtual device fusing `devs` (NCCL's `makeVDevice`, v9+); returns its index.
    pub fn make_virtual_device(&self, devs: &[i32]) -> Result<i32, PluginError> {
        let mut d: c_int = -1;
        let too_many = |max: usize| {
            PluginError::invalid_argument(format!("NET/{}: a virtual device fuses at most {max} devices", self.name))
        };
        let code = match self.fns.make_vdevice {
            None => {
                return Err(PluginError::invalid_usage(format!("NET/{}: this plugin has no virtual devices", self.name)))
            }
            Some(MakeVDev::V9(f)) => {
                let mut p = VDeviceProps::<4> { ndevs: devs.len() as c_int, devs: [0; 4] };
                p.devs.get_mut(..devs.len()).ok_or_else(|| too_many(4))?.copy_from_slice(devs);
                // SAFETY: the table's function with valid storage.
                unsafe { f(&mut d, &mut p) }
            }
            Some(MakeVDev::V12(f)) => {
                let mut p = VDeviceProps::<8> { ndevs: devs.len() as c_int, devs: [0; 8] };
                p.devs.get_mut(..devs.len()).ok_or_else(|| too_many(8))?.copy_from_slice(devs);
                // SAFETY: as above.
                unsafe { f(&mut d, &mut p) }
            }
        };
        self.err(code, "makeVDevice")?;
        Ok(d)
    }

    /// Closes connection `comm` (a sender when `send`), forgetting its registrations and requests.
    fn close_comm(&self, comm: PluginHandle, send: bool) -> Result<(), PluginError> {
        let what = if send { "send connection" } else { "receive connection" };
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale(what, comm))?;
        let _g = lock(&guard);
        let p = {
            let mut h = lock(&self.handles);
            let (p, is_send, _) = self.comm_of(&h, comm)?;
            if is_send != send {
                return Err(self.stale(what, comm));
            }
            h.map.retain(|&id, o| id != comm.id && !matches!(o, Obj::Req { comm: c, .. } | Obj::Mr { comm: c, .. } if *c == comm.id));
            p
        };
        let f = if send { self.fns.close_send } else { self.fns.close_recv };
        // SAFETY: the plugin's connection, forgotten above so that nothing uses it again.
        self.err(unsafe { f(ptr(p)) }, if send { "closeSend" } else { "closeRecv" })
    }
}

impl Net for CNet {
    fn init(&self, comm_id: u64, config: &NetCommConfig, _log: LogFn) -> Result<PluginHandle, PluginError> {
        let tc = config.traffic_class;
        let logger = c_abi::logger();
        let c_ctx = match self.fns.init {
            Init::Old(_) | Init::V10(_) => {
                let mut inits = lock(&PROCESS_INITS);
                let count = inits.entry(self.table_addr).or_insert(0);
                if *count == 0 {
                    // SAFETY: the table's init with NCCL's logger (and profiler callback).
                    let code = unsafe {
                        match self.fns.init {
                            Init::Old(f) => f(logger),
                            Init::V10(f) => f(logger, no_profiler),
                            Init::Ctx(_) => unreachable!(),
                        }
                    };
                    self.err(code, "init")?;
                    self.check_host_network()?;
                }
                self.init_devices()?;
                *count += 1;
                0
            }
            Init::Ctx(f) => {
                let mut ctx: *mut c_void = std::ptr::null_mut();
                let mut cfg = CommConfig { traffic_class: tc };
                // SAFETY: the table's init with storage for the context and a config alive for the call.
                self.err(unsafe { f(&mut ctx, comm_id, &mut cfg, logger, no_profiler) }, "init")?;
                if let Err(e) = self.check_host_network().and_then(|()| self.init_devices()) {
                    if let Some(fin) = self.fns.finalize {
                        // SAFETY: the context init just returned.
                        let _ = unsafe { fin(ctx) };
                    }
                    return Err(e);
                }
                ctx as usize
            }
        };
        Ok(lock(&self.handles).insert(Obj::Ctx { c_ctx, traffic_class: tc }))
    }

    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        self.ctx_of(ctx)?;
        Ok(self.devmap.get().map_or(0, |m| m.len() as i32))
    }

    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        self.ctx_of(ctx)?;
        Ok(self.props(self.plugin_dev(dev)?)?.props)
    }

    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        let (c_ctx, _) = self.ctx_of(ctx)?;
        let dev = self.plugin_dev(dev)?;
        let mut handle = NetHandle::default();
        let mut listen: *mut c_void = std::ptr::null_mut();
        let h = handle.bytes.as_mut_ptr() as *mut c_void;
        // SAFETY: the table's function with a handle buffer of NCCL_NET_HANDLE_MAXSIZE bytes.
        let code = unsafe {
            match self.fns.listen {
                Listen::Old(f) => f(dev, h, &mut listen),
                Listen::Ctx(f) => f(ptr(c_ctx), dev, h, &mut listen),
            }
        };
        self.err(code, &format!("listen({dev})"))?;
        if listen.is_null() {
            return Err(PluginError::internal(format!("NET/{}: listen succeeded but returned no listener", self.name)));
        }
        let l = lock(&self.handles).insert(Obj::Listen { ptr: listen as usize, dev, guard: Guard::default() });
        Ok((handle, l))
    }

    fn connect(&self, ctx: PluginHandle, dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        let (c_ctx, tc) = self.ctx_of(ctx)?;
        let dev = self.plugin_dev(dev)?;
        let key = (ctx.id, dev, handle.bytes);
        let h = {
            let mut c = lock(&self.connecting);
            // The box does not move while it is in the map; only this connect uses it.
            c.entry(key).or_insert_with(|| Box::new(handle.bytes)).as_mut_ptr() as *mut c_void
        };
        let mut comm: *mut c_void = std::ptr::null_mut();
        let mut dev_handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: the table's function with the handle's persistent bytes, storage for the
        // connection, device-handle storage holding NULL (no offload requested) and, for
        // v10, a config that is never freed.
        let code = unsafe {
            match self.fns.connect {
                Connect::V6(f) => f(dev, h, &mut comm),
                Connect::V7(f) => f(dev, h, &mut comm, &mut dev_handle),
                Connect::V10(f) => f(dev, v10_config(tc), h, &mut comm, &mut dev_handle),
                Connect::Ctx(f) => f(ptr(c_ctx), dev, h, &mut comm, &mut dev_handle),
            }
        };
        if code != c_abi::result::SUCCESS || !comm.is_null() {
            lock(&self.connecting).remove(&key);
        }
        self.err(code, &format!("connect({dev})"))?;
        if comm.is_null() {
            return Ok(None);
        }
        let max_recvs = self.props(dev).map(|p| p.props.max_recvs as usize).unwrap_or(1);
        Ok(Some(lock(&self.handles).insert(Obj::Comm { ptr: comm as usize, send: true, max_recvs, guard: Guard::default() })))
    }

    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        let guard = self.guard_of(listen.id).ok_or_else(|| self.stale("listener", listen))?;
        let _g = lock(&guard);
        let (l, dev) = match lock(&self.handles).map.get(&listen.id) {
            Some(Obj::Listen { ptr, dev, .. }) => (*ptr, *dev),
            _ => return Err(self.stale("listener", listen)),
        };
        let mut comm: *mut c_void = std::ptr::null_mut();
        let mut dev_handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: the plugin's listener, alive (checked under its lock), and storage as for connect.
        let code = unsafe {
            match self.fns.accept {
                Accept::V6(f) => f(ptr(l), &mut comm),
                Accept::V7(f) => f(ptr(l), &mut comm, &mut dev_handle),
            }
        };
        self.err(code, "accept")?;
        if comm.is_null() {
            return Ok(None);
        }
        let max_recvs = self.props(dev).map(|p| p.props.max_recvs as usize).unwrap_or(1);
        Ok(Some(lock(&self.handles).insert(Obj::Comm { ptr: comm as usize, send: false, max_recvs, guard: Guard::default() })))
    }

    fn reg_mr(&self, comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError> {
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("connection", comm))?;
        let _g = lock(&guard);
        let (c, _, _) = self.comm_of(&lock(&self.handles), comm)?;
        let mut mh: *mut c_void = std::ptr::null_mut();
        let code = match self.fns.reg_mr {
            RegMr::Int(f) => {
                let size = c_int::try_from(size).map_err(|_| self.int_limit("regMr", size, c_int::MAX as usize))?;
                // SAFETY: the plugin's live connection (checked under its lock) and the caller's buffer.
                unsafe { f(ptr(c), ptr(data), size, ptr_type as c_int, &mut mh) }
            }
            // SAFETY: as above.
            RegMr::Size(f) => unsafe { f(ptr(c), ptr(data), size, ptr_type as c_int, &mut mh) },
        };
        self.err(code, "regMr")?;
        Ok(lock(&self.handles).insert(Obj::Mr { ptr: mh as usize, comm: comm.id }))
    }

    fn reg_mr_dmabuf(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        ptr_type: u32,
        offset: u64,
        fd: i32,
    ) -> Result<PluginHandle, PluginError> {
        let f = self.fns.reg_mr_dma_buf.ok_or_else(|| {
            PluginError::invalid_usage(format!("NET/{}: this plugin does not register dma-bufs (regMrDmaBuf is NULL)", self.name))
        })?;
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("connection", comm))?;
        let _g = lock(&guard);
        let (c, _, _) = self.comm_of(&lock(&self.handles), comm)?;
        let dmabuf = self.props(0).map(|p| p.props.ptr_support & PTR_DMABUF != 0).unwrap_or(false);
        if !dmabuf {
            return Err(PluginError::invalid_usage(format!("NET/{}: its devices do not support dma-buf (ptrSupport)", self.name)));
        }
        let mut mh: *mut c_void = std::ptr::null_mut();
        // SAFETY: as for reg_mr.
        self.err(unsafe { f(ptr(c), ptr(data), size, ptr_type as c_int, offset, fd, &mut mh) }, "regMrDmaBuf")?;
        Ok(lock(&self.handles).insert(Obj::Mr { ptr: mh as usize, comm: comm.id }))
    }

    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("connection", comm))?;
        let _g = lock(&guard);
        let (c, m) = {
            let mut h = lock(&self.handles);
            let (c, _, _) = self.comm_of(&h, comm)?;
            let m = self.mr_of(&h, comm, mr)?;
            h.map.remove(&mr.id);
            (c, m)
        };
        // SAFETY: the plugin's connection and registration, both alive (checked under the lock).
        self.err(unsafe { (self.fns.dereg_mr)(ptr(c), ptr(m)) }, "deregMr")
    }

    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("send connection", comm))?;
        let _g = lock(&guard);
        let (c, m) = {
            let h = lock(&self.handles);
            let (c, send, _) = self.comm_of(&h, comm)?;
            if !send {
                return Err(self.stale("send connection", comm));
            }
            (c, self.mr_of(&h, comm, mr)?)
        };
        let mut req: *mut c_void = std::ptr::null_mut();
        let null = std::ptr::null_mut();
        // SAFETY: live plugin objects (checked under the connection's lock); the caller keeps
        // the buffer valid until the request completes (this function's contract).
        let code = unsafe {
            match self.fns.isend {
                Isend::Int(f) => f(ptr(c), ptr(data), self.int_size(size, "isend")?, tag, ptr(m), &mut req),
                Isend::Size(f) => f(ptr(c), ptr(data), size, tag, ptr(m), &mut req),
                Isend::Prof(f) => f(ptr(c), ptr(data), size, tag, ptr(m), null, &mut req),
            }
        };
        self.err(code, "isend")?;
        Ok((!req.is_null()).then(|| lock(&self.handles).insert(Obj::Req { ptr: req as usize, comm: comm.id, n: 1 })))
    }

    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("receive connection", comm))?;
        let _g = lock(&guard);
        let (c, mut mhs) = {
            let h = lock(&self.handles);
            let (c, send, max_recvs) = self.comm_of(&h, comm)?;
            if send {
                return Err(self.stale("receive connection", comm));
            }
            if bufs.is_empty() || bufs.len() > max_recvs {
                return Err(PluginError::invalid_argument(format!(
                    "NET/{}: a receive takes 1 to {max_recvs} buffers (maxRecvs), not {}",
                    self.name,
                    bufs.len()
                )));
            }
            let mhs = bufs.iter().map(|b| self.mr_of(&h, comm, b.mr).map(ptr)).collect::<Result<Vec<_>, _>>()?;
            (c, mhs)
        };
        let n = bufs.len() as c_int;
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| ptr(b.data)).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut phandles: Vec<*mut c_void> = vec![std::ptr::null_mut(); bufs.len()];
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY: live plugin objects (checked under the connection's lock), arrays of n
        // entries alive for the call; the caller keeps the buffers valid until completion.
        let code = unsafe {
            match self.fns.irecv {
                Irecv::Int(f) => {
                    let mut sizes =
                        bufs.iter().map(|b| self.int_size(b.size, "irecv")).collect::<Result<Vec<_>, _>>()?;
                    f(ptr(c), n, data.as_mut_ptr(), sizes.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), &mut req)
                }
                Irecv::Size(f) => {
                    let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
                    f(ptr(c), n, data.as_mut_ptr(), sizes.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), &mut req)
                }
                Irecv::Prof(f) => {
                    let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
                    let (d, s, t, m, p) =
                        (data.as_mut_ptr(), sizes.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr(), phandles.as_mut_ptr());
                    f(ptr(c), n, d, s, t, m, p, &mut req)
                }
            }
        };
        self.err(code, "irecv")?;
        Ok((!req.is_null()).then(|| lock(&self.handles).insert(Obj::Req { ptr: req as usize, comm: comm.id, n: bufs.len() })))
    }

    fn iflush(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        let guard = self.guard_of(comm.id).ok_or_else(|| self.stale("receive connection", comm))?;
        let _g = lock(&guard);
        let (c, mut mhs) = {
            let h = lock(&self.handles);
            let (c, _, _) = self.comm_of(&h, comm)?;
            let mhs = bufs.iter().map(|b| self.mr_of(&h, comm, b.mr).map(ptr)).collect::<Result<Vec<_>, _>>()?;
            (c, mhs)
        };
        let Some(f) = self.fns.iflush else { return Ok(None) };
        if bufs.is_empty() {
            return Ok(None);
        }
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| ptr(b.data)).collect();
        let mut sizes = bufs.iter().map(|b| self.int_size(b.size, "iflush")).collect::<Result<Vec<_>, _>>()?;
        let mut req: *mut c_void = std::ptr::null_mut();
        // SAFETY: as for irecv.
        let code = unsafe {
            f(ptr(c), bufs.len() as c_int, data.as_mut_ptr(), sizes.as_mut_ptr(), mhs.as_mut_ptr(), &mut req)
        };
        self.err(code, "iflush")?;
        Ok((!req.is_null()).then(|| lock(&self.handles).insert(Obj::Req { ptr: req as usize, comm: comm.id, n: bufs.len() })))
    }

    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        let guard = self.guard_of(request.id).ok_or_else(|| self.stale("request", request))?;
        let _g = lock(&guard);
        let (r, n) = match lock(&self.handles).map.get(&request.id) {
            Some(Obj::Req { ptr, n, .. }) => (*ptr, *n),
            _ => return Err(self.stale("request", request)),
        };
        let mut done: c_int = 0;
        // -1 until the plugin writes a size: some leave them untouched (nccl-fastsocket).
        let mut got: Vec<c_int> = vec![-1; n];
        // SAFETY: the plugin's live request (checked under its connection's lock), storage for
        // the flag and one size per buffer.
        let code = unsafe { (self.fns.test)(ptr(r), &mut done, got.as_mut_ptr()) };
        if code != c_abi::result::SUCCESS || done != 0 {
            // Completed or failed: the plugin has freed (or will not complete) the request.
            lock(&self.handles).map.remove(&request.id);
        }
        self.err(code, "test")?;
        if done == 0 {
            return Ok(false);
        }
        for (s, g) in sizes.iter_mut().zip(&got) {
            *s = usize::try_from(*g).unwrap_or(SIZE_NOT_REPORTED);
        }
        Ok(true)
    }

    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        self.close_comm(comm, true)
    }

    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        self.close_comm(comm, false)
    }

    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        let guard = self.guard_of(listen.id).ok_or_else(|| self.stale("listener", listen))?;
        let _g = lock(&guard);
        let l = match lock(&self.handles).map.remove(&listen.id) {
            Some(Obj::Listen { ptr, .. }) => ptr,
            Some(other) => {
                lock(&self.handles).map.insert(listen.id, other);
                return Err(self.stale("listener", listen));
            }
            None => return Err(self.stale("listener", listen)),
        };
        // SAFETY: the plugin's listener, forgotten above.
        self.err(unsafe { (self.fns.close_listen)(ptr(l)) }, "closeListen")
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        let c_ctx = {
            let mut h = lock(&self.handles);
            match h.map.get(&ctx.id) {
                Some(Obj::Ctx { c_ctx, .. }) => {
                    let c = *c_ctx;
                    h.map.remove(&ctx.id);
                    c
                }
                _ => return Err(self.stale("context", ctx)),
            }
        };
        lock(&self.connecting).retain(|k, _| k.0 != ctx.id);
        match self.fns.finalize {
            // SAFETY: the context the plugin's init returned, forgotten above.
            Some(f) => self.err(unsafe { f(ptr(c_ctx)) }, "finalize"),
            None => {
                let mut inits = lock(&PROCESS_INITS);
                if let Some(count) = inits.get_mut(&self.table_addr) {
                    *count = count.saturating_sub(1);
                }
                Ok(())
            }
        }
    }

    /// Not through the trait: the adapter fuses a C plugin's devices itself, once, at its first
    /// `init` (`NCCL_NET_FORCE_MERGE`, merge.rs), and renumbers the devices it presents.
    fn make_vdevice(&self, _ctx: PluginHandle, _devs: &[i32]) -> Result<i32, PluginError> {
        Err(PluginError::invalid_usage(format!(
            "NET/{}: an NCCL C net plugin's devices are fused by the host at its first init, as {FORCE_MERGE} names them, \
             not through make_vdevice",
            self.name
        )))
    }
}

impl CNet {
    fn int_limit(&self, what: &str, size: usize, max: usize) -> PluginError {
        PluginError::invalid_argument(format!(
            "NET/{}: {what} of {size} bytes is larger than NCCL C net ABI v{} allows ({max} bytes: it passes sizes as int); \
             use a plugin built for v9 or later",
            self.name, self.fns.version
        ))
    }

    /// A message size for the `int`-sized ABIs (v6–v8): at most `MAX_NET_SIZE`, as NCCL's
    /// adapters allow.
    fn int_size(&self, size: usize, what: &str) -> Result<c_int, PluginError> {
        if size > MAX_NET_SIZE {
            return Err(self.int_limit(what, size, MAX_NET_SIZE));
        }
        Ok(size as c_int)
    }
}

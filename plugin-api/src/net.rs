//! The net plugin ABI (rustccl net v1 and v2), with the semantics of NCCL's `ncclNet_v11`:
//! connection-oriented (listen / connect / accept, non-blocking: `Ok(None)` means "call again"),
//! memory registration (host and device pointers, dma-buf), tagged isend and multi-buffer irecv,
//! test, flush, close, device properties, and (v2) virtual devices that fuse several NICs.
//!
//! | version | symbol | table | adds |
//! |---|---|---|---|
//! | 1 | `rustccl_net_v1` | [`NetV1`] | |
//! | 2 | `rustccl_net_v2` | [`NetV2`]: the v1 table, then `make_vdevice` | NCCL's `makeVDevice` (v9+) |
//! | 3 | `rustccl_net_v3` | [`NetV3`]: the v2 table, then `init_v3` | the encryption key at init ([`NetInitArgs`]) |
//!
//! Encryption (v3): a host with an encryption key (`NCCL_ENCRYPTION_PSK`, `ncclSetEncryption`)
//! gives it to [`Net::init_with_key`]; a plugin whose TCP traffic rustccl's record layer can
//! encrypt (the socket plugin, loaded as a library or built in) says so with
//! [`Net::takes_encryption_key`] and uses the key for that communicator's connections. Older
//! tables cannot take a key: the host knows it ([`NetClient`]'s `takes_encryption_key` is
//! false) and decides (see `host/src/plugin/net.rs`). The key is never logged.
//!
//! A plugin implements the safe trait [`Net`] and exports it with
//! [`export_net!`](crate::export_net)`(v2, ...)` (or `v1`: a v1 table has no `make_vdevice`,
//! so hosts see "cannot fuse devices"); the host
//! gets a `&dyn Net` back either way: directly for a built-in plugin, or through
//! [`NetV2Client`] / [`NetV1Client`], which call a loaded library's table. So the core sees
//! one interface.
//!
//! Virtual devices (merged NICs), as NCCL's: [`Net::make_vdevice`] takes the indices of
//! physical devices and returns the index of a new device that stripes over them; from then
//! on `devices` counts it and `properties` describes it as [`merge_properties`] does (name
//! `a+b`, speed the sum). A plugin that merges its own devices at init (the IB plugin with
//! `NCCL_IB_MERGE_NICS`) calls its own `make_vdevice` there, so the host sees only the virtual
//! devices; a plugin that cannot fuse devices keeps the trait's default, a clear
//! "not supported" error.
//!
//! Rules every implementation follows (the conformance suite checks them):
//! - sends and receives on one connection match in the order they were posted; a tag only
//!   selects a buffer within one multi-receive;
//! - a receive buffer may be larger than the message; `test` reports the size received;
//! - at least [`MAX_REQUESTS`] requests may be outstanding per connection;
//! - a dead peer is an error from `test` (or from the next call), never a hang;
//! - closing a connection with requests in flight is allowed and frees them.

use abi_stable::std_types::{RSlice, RSliceMut, RStr};
use abi_stable::StableAbi;

use crate::{call_guarded, LogFn, PluginError, PluginHandle, PResult};

/// Largest connection handle exchanged between ranks (`NCCL_NET_HANDLE_MAXSIZE`).
pub const NET_HANDLE_BYTES: usize = 128;
/// Requests that may be outstanding on one connection (`NCCL_NET_MAX_REQUESTS`).
pub const MAX_REQUESTS: usize = 32;
/// Pointer kinds (`ptr_support` bits and the `ptr_type` of a registration).
pub const PTR_HOST: u32 = 1;
pub const PTR_DEVICE: u32 = 2;
pub const PTR_DMABUF: u32 = 4;
/// What `test` leaves in `sizes[i]` when the plugin does not say how much it received: the
/// caller stores it before the call. NCCL's own plugins may leave sizes untouched (Google's
/// nccl-fastsocket does), and NCCL never relies on them for the length of a step it knows.
pub const SIZE_NOT_REPORTED: usize = usize::MAX;

/// The opaque bytes a listener gives, which the connecting side needs.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq)]
pub struct NetHandle {
    pub bytes: [u8; NET_HANDLE_BYTES],
}

impl Default for NetHandle {
    fn default() -> Self {
        NetHandle { bytes: [0; NET_HANDLE_BYTES] }
    }
}

impl std::fmt::Debug for NetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NetHandle({:02x?}..)", &self.bytes[..8])
    }
}

/// Per-communicator settings given to `init`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetCommConfig {
    /// IP traffic class / DSCP, or -1 for the network's default.
    pub traffic_class: i32,
}

impl Default for NetCommConfig {
    fn default() -> Self {
        NetCommConfig { traffic_class: -1 }
    }
}

/// What `init` of a v3 table takes: v1's settings and the process's encryption key.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct NetInitArgs<'a> {
    pub config: NetCommConfig,
    /// The pre-shared key the plugin's TCP traffic must be encrypted with; empty: none. A
    /// secret: never log or keep it longer than the context it was given for.
    pub encryption_key: RSlice<'a, u8>,
}

impl std::fmt::Debug for NetInitArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetInitArgs")
            .field("config", &self.config)
            .field("encryption_key", &if self.encryption_key.is_empty() { "(none)" } else { "(set; not shown)" })
            .finish()
    }
}

/// What a network device offers (`ncclNetProperties_v11_t`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct NetProperties {
    pub name: abi_stable::std_types::RString,
    /// sysfs path of the PCI device, empty when virtual.
    pub pci_path: abi_stable::std_types::RString,
    /// Equal GUIDs mean the same physical port.
    pub guid: u64,
    /// [`PTR_HOST`] | [`PTR_DEVICE`] | [`PTR_DMABUF`].
    pub ptr_support: u32,
    /// Registrations are valid across communicators.
    pub reg_is_global: bool,
    /// Receives into device memory need an `iflush`.
    pub force_flush: bool,
    /// Link speed, Mbit/s.
    pub speed_mbps: u32,
    pub port: i32,
    /// Latency, microseconds.
    pub latency_us: f32,
    /// Most connections this device supports.
    pub max_comms: u32,
    /// Most buffers in one multi-receive.
    pub max_recvs: u32,
    /// Largest message of a point-to-point send.
    pub max_p2p_bytes: u64,
    /// Largest message of a collective operation.
    pub max_coll_bytes: u64,
}

/// One buffer of a multi-receive (or of a flush).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvBuffer {
    /// Address (host or device memory, as registered).
    pub data: usize,
    pub size: usize,
    pub tag: i32,
    pub mr: PluginHandle,
}

/// Most physical devices one virtual device fuses (NCCL's `NCCL_NET_MAX_DEVS_PER_NIC`, v12).
pub const MAX_VDEVICE_DEVS: usize = 8;

/// The properties of a virtual device made of physical devices with `members`' properties, as
/// NCCL's IB transport describes its merged devices: the names joined with `+`, the speeds
/// summed; what every member must offer for the virtual device to offer it (pointer kinds,
/// global registrations) is the intersection; limits are the smallest member's, latency the
/// largest; the PCI path, GUID and port are the first member's. `None` for no members.
pub fn merge_properties(members: &[NetProperties]) -> Option<NetProperties> {
    let first = members.first()?;
    let mut merged = first.clone();
    merged.name = members.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join("+").into();
    for p in &members[1..] {
        merged.speed_mbps = merged.speed_mbps.saturating_add(p.speed_mbps);
        merged.ptr_support &= p.ptr_support;
        merged.reg_is_global &= p.reg_is_global;
        merged.force_flush |= p.force_flush;
        merged.latency_us = merged.latency_us.max(p.latency_us);
        merged.max_comms = merged.max_comms.min(p.max_comms);
        merged.max_recvs = merged.max_recvs.min(p.max_recvs);
        merged.max_p2p_bytes = merged.max_p2p_bytes.min(p.max_p2p_bytes);
        merged.max_coll_bytes = merged.max_coll_bytes.min(p.max_coll_bytes);
    }
    Some(merged)
}

/// Checks the device list of a [`Net::make_vdevice`] call against a plugin with `ndev`
/// physical devices: 1 to [`MAX_VDEVICE_DEVS`] distinct indices below `ndev`. The error is the
/// one to return.
pub fn check_vdevice_members(devs: &[i32], ndev: i32) -> Result<(), PluginError> {
    if devs.is_empty() || devs.len() > MAX_VDEVICE_DEVS {
        return Err(PluginError::invalid_argument(format!(
            "a virtual device fuses 1 to {MAX_VDEVICE_DEVS} devices, not {}",
            devs.len()
        )));
    }
    for (i, &d) in devs.iter().enumerate() {
        if d < 0 || d >= ndev {
            return Err(PluginError::invalid_argument(format!("no physical device {d} (there are {ndev})")));
        }
        if devs[..i].contains(&d) {
            return Err(PluginError::invalid_argument(format!("device {d} is listed twice")));
        }
    }
    Ok(())
}

/// The net plugin interface. Handles are numbers the plugin hands out (context, listen,
/// send and receive connections, registrations, requests); a stale or foreign handle is an
/// error, never undefined behaviour.
pub trait Net: Send + Sync {
    /// Starts the plugin for one communicator; returns its context.
    fn init(&self, comm_id: u64, config: &NetCommConfig, log: LogFn) -> Result<PluginHandle, PluginError>;
    /// Number of devices (must be at least 1 for the plugin to be used).
    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError>;
    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError>;
    /// Listens on `dev`; the handle goes to the connecting rank.
    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError>;
    /// Connects to a listener; `Ok(None)`: not yet, call again.
    fn connect(&self, ctx: PluginHandle, dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError>;
    /// Accepts a connection; `Ok(None)`: not yet, call again.
    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError>;
    /// Registers memory for use with a send or receive connection.
    fn reg_mr(&self, comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError>;
    /// Registers a dma-buf; plugins without [`PTR_DMABUF`] support refuse.
    fn reg_mr_dmabuf(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        ptr_type: u32,
        offset: u64,
        fd: i32,
    ) -> Result<PluginHandle, PluginError> {
        let _ = (comm, data, size, ptr_type, offset, fd);
        Err(PluginError::invalid_usage("this network does not support dma-buf registration"))
    }
    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError>;
    /// Posts a send; `Ok(None)`: no resources now, call again.
    ///
    /// # Safety
    /// `data..data+size` must stay valid and unchanged until the request completes or the
    /// connection is closed.
    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError>;
    /// Posts one receive of up to `max_recvs` buffers; `Ok(None)`: call again.
    ///
    /// # Safety
    /// Each buffer must stay valid and untouched until the request completes or the
    /// connection is closed.
    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError>;
    /// Makes received data visible to the device; `Ok(None)`: nothing to flush.
    fn iflush(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        let _ = (comm, bufs);
        Ok(None)
    }
    /// Whether `request` is done; when done, `sizes[i]` is the size received into buffer `i`
    /// (or sent), and the request is freed. A plugin that does not know the size leaves
    /// `sizes[i]` as it was (the caller sets [`SIZE_NOT_REPORTED`] first).
    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError>;
    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError>;
    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError>;
    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError>;
    /// Ends the communicator's context.
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError>;
    /// Fuses the physical devices `devs` (1 to [`MAX_VDEVICE_DEVS`] distinct indices, see
    /// [`check_vdevice_members`]) into a virtual device and returns its index (NCCL's
    /// `makeVDevice`). Afterwards `devices` counts it and `properties` describes it (see
    /// [`merge_properties`]). Virtual devices are the plugin's, for the life of the process, as
    /// in NCCL; `ctx` is the context of the communicator asking. The default: not supported.
    fn make_vdevice(&self, ctx: PluginHandle, devs: &[i32]) -> Result<i32, PluginError> {
        let _ = (ctx, devs);
        Err(PluginError::invalid_usage(VDEVICE_NOT_SUPPORTED))
    }
    /// Whether [`init_with_key`](Self::init_with_key) encrypts the plugin's traffic with the
    /// key it is given. The default: no (the key is ignored).
    fn takes_encryption_key(&self) -> bool {
        false
    }
    /// `init` with the process's encryption key (`None`: none), which a plugin that
    /// [`takes_encryption_key`](Self::takes_encryption_key) uses for this context's
    /// connections. The default ignores the key and calls `init`.
    fn init_with_key(
        &self,
        comm_id: u64,
        config: &NetCommConfig,
        key: Option<&[u8]>,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        let _ = key;
        self.init(comm_id, config, log)
    }
}

/// The message of [`Net::make_vdevice`]'s default: the plugin cannot fuse devices.
pub const VDEVICE_NOT_SUPPORTED: &str = "this network cannot fuse devices into a virtual device (make_vdevice is not supported)";

/// The exported table of net ABI v1 (`rustccl_net_v1`).
#[repr(C)]
#[derive(StableAbi)]
pub struct NetV1 {
    /// The name `NCCL_NET` and `config.netName` match (case-insensitive).
    pub name: RStr<'static>,
    pub init: extern "C" fn(comm_id: u64, config: &NetCommConfig, log: LogFn) -> PResult<PluginHandle>,
    pub devices: extern "C" fn(ctx: PluginHandle) -> PResult<i32>,
    pub properties: extern "C" fn(ctx: PluginHandle, dev: i32) -> PResult<NetProperties>,
    pub listen: extern "C" fn(ctx: PluginHandle, dev: i32, handle: &mut NetHandle) -> PResult<PluginHandle>,
    /// Returns handle id 0 for "call again".
    pub connect: extern "C" fn(ctx: PluginHandle, dev: i32, handle: &NetHandle) -> PResult<PluginHandle>,
    pub accept: extern "C" fn(listen: PluginHandle) -> PResult<PluginHandle>,
    pub reg_mr: extern "C" fn(comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> PResult<PluginHandle>,
    pub reg_mr_dmabuf: extern "C" fn(
        comm: PluginHandle,
        data: usize,
        size: usize,
        ptr_type: u32,
        offset: u64,
        fd: i32,
    ) -> PResult<PluginHandle>,
    pub dereg_mr: extern "C" fn(comm: PluginHandle, mr: PluginHandle) -> PResult<()>,
    pub isend: extern "C" fn(comm: PluginHandle, data: usize, size: usize, tag: i32, mr: PluginHandle) -> PResult<PluginHandle>,
    pub irecv: extern "C" fn(comm: PluginHandle, bufs: RSlice<'_, RecvBuffer>) -> PResult<PluginHandle>,
    pub iflush: extern "C" fn(comm: PluginHandle, bufs: RSlice<'_, RecvBuffer>) -> PResult<PluginHandle>,
    pub test: extern "C" fn(request: PluginHandle, sizes: RSliceMut<'_, usize>) -> PResult<bool>,
    pub close_send: extern "C" fn(comm: PluginHandle) -> PResult<()>,
    pub close_recv: extern "C" fn(comm: PluginHandle) -> PResult<()>,
    pub close_listen: extern "C" fn(listen: PluginHandle) -> PResult<()>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

/// The exported table of net ABI v2 (`rustccl_net_v2`): v1's functions, then
/// `make_vdevice`.
#[repr(C)]
#[derive(StableAbi)]
pub struct NetV2 {
    pub base: NetV1,
    /// `make_vdevice(ctx, devs) -> index of the new device` (written out: abi_stable's derive
    /// reads the signature; [`MakeVDeviceFn`] is the same type).
    pub make_vdevice: extern "C" fn(ctx: PluginHandle, devs: RSlice<'_, i32>) -> PResult<i32>,
}

/// The exported table of net ABI v3 (`rustccl_net_v3`): v2's functions, then `init_v3`,
/// which takes the encryption key ([`NetInitArgs`]).
#[repr(C)]
#[derive(StableAbi)]
pub struct NetV3 {
    pub base: NetV2,
    /// `init_v3(comm_id, args, log) -> context`: [`Net::init_with_key`] (written out, as
    /// `make_vdevice`; [`InitV3Fn`] is the same type).
    pub init_v3: extern "C" fn(comm_id: u64, args: &NetInitArgs<'_>, log: LogFn) -> PResult<PluginHandle>,
}

/// The type of [`NetV3::init_v3`].
pub type InitV3Fn = extern "C" fn(comm_id: u64, args: &NetInitArgs<'_>, log: LogFn) -> PResult<PluginHandle>;

/// The type of [`NetV2::make_vdevice`].
pub type MakeVDeviceFn = extern "C" fn(ctx: PluginHandle, devs: RSlice<'_, i32>) -> PResult<i32>;

/// Where the exported shims find the plugin's instance.
pub trait NetProvider: 'static {
    fn get() -> &'static dyn Net;
}

fn opt(h: Option<PluginHandle>) -> PluginHandle {
    h.unwrap_or(PluginHandle { id: 0 })
}

extern "C" fn init_shim<P: NetProvider>(comm_id: u64, config: &NetCommConfig, log: LogFn) -> PResult<PluginHandle> {
    call_guarded(|| P::get().init(comm_id, config, log))
}
extern "C" fn devices_shim<P: NetProvider>(ctx: PluginHandle) -> PResult<i32> {
    call_guarded(|| P::get().devices(ctx))
}
extern "C" fn properties_shim<P: NetProvider>(ctx: PluginHandle, dev: i32) -> PResult<NetProperties> {
    call_guarded(|| P::get().properties(ctx, dev))
}
extern "C" fn listen_shim<P: NetProvider>(ctx: PluginHandle, dev: i32, handle: &mut NetHandle) -> PResult<PluginHandle> {
    call_guarded(|| {
        let (h, l) = P::get().listen(ctx, dev)?;
        *handle = h;
        Ok(l)
    })
}
extern "C" fn connect_shim<P: NetProvider>(ctx: PluginHandle, dev: i32, handle: &NetHandle) -> PResult<PluginHandle> {
    call_guarded(|| P::get().connect(ctx, dev, handle).map(opt))
}
extern "C" fn accept_shim<P: NetProvider>(listen: PluginHandle) -> PResult<PluginHandle> {
    call_guarded(|| P::get().accept(listen).map(opt))
}
extern "C" fn reg_mr_shim<P: NetProvider>(comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> PResult<PluginHandle> {
    call_guarded(|| P::get().reg_mr(comm, data, size, ptr_type))
}
extern "C" fn reg_mr_dmabuf_shim<P: NetProvider>(
    comm: PluginHandle,
    data: usize,
    size: usize,
    ptr_type: u32,
    offset: u64,
    fd: i32,
) -> PResult<PluginHandle> {
    call_guarded(|| P::get().reg_mr_dmabuf(comm, data, size, ptr_type, offset, fd))
}
extern "C" fn dereg_mr_shim<P: NetProvider>(comm: PluginHandle, mr: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().dereg_mr(comm, mr))
}
extern "C" fn isend_shim<P: NetProvider>(comm: PluginHandle, data: usize, size: usize, tag: i32, mr: PluginHandle) -> PResult<PluginHandle> {
    // SAFETY: the host keeps the buffer valid until the request completes (the ABI contract
    // of `isend`, which the host side of the table, NetV1Client, is bound by).
    call_guarded(|| unsafe { P::get().isend(comm, data, size, tag, mr) }.map(opt))
}
extern "C" fn irecv_shim<P: NetProvider>(comm: PluginHandle, bufs: RSlice<'_, RecvBuffer>) -> PResult<PluginHandle> {
    // SAFETY: as for isend.
    call_guarded(|| unsafe { P::get().irecv(comm, bufs.as_slice()) }.map(opt))
}
extern "C" fn iflush_shim<P: NetProvider>(comm: PluginHandle, bufs: RSlice<'_, RecvBuffer>) -> PResult<PluginHandle> {
    call_guarded(|| P::get().iflush(comm, bufs.as_slice()).map(opt))
}
extern "C" fn test_shim<P: NetProvider>(request: PluginHandle, mut sizes: RSliceMut<'_, usize>) -> PResult<bool> {
    call_guarded(|| P::get().test(request, sizes.as_mut_slice()))
}
extern "C" fn close_send_shim<P: NetProvider>(comm: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().close_send(comm))
}
extern "C" fn close_recv_shim<P: NetProvider>(comm: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().close_recv(comm))
}
extern "C" fn close_listen_shim<P: NetProvider>(listen: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().close_listen(listen))
}
extern "C" fn finalize_shim<P: NetProvider>(ctx: PluginHandle) -> PResult<()> {
    call_guarded(|| P::get().finalize(ctx))
}
extern "C" fn init_v3_shim<P: NetProvider>(comm_id: u64, args: &NetInitArgs<'_>, log: LogFn) -> PResult<PluginHandle> {
    let key = (!args.encryption_key.is_empty()).then(|| args.encryption_key.as_slice());
    call_guarded(|| P::get().init_with_key(comm_id, &args.config, key, log))
}
extern "C" fn make_vdevice_shim<P: NetProvider>(ctx: PluginHandle, devs: RSlice<'_, i32>) -> PResult<i32> {
    call_guarded(|| P::get().make_vdevice(ctx, devs.as_slice()))
}

impl NetV1 {
    /// The table whose functions call `P::get()`.
    pub const fn table<P: NetProvider>(name: &'static str) -> NetV1 {
        NetV1 {
            name: RStr::from_str(name),
            init: init_shim::<P>,
            devices: devices_shim::<P>,
            properties: properties_shim::<P>,
            listen: listen_shim::<P>,
            connect: connect_shim::<P>,
            accept: accept_shim::<P>,
            reg_mr: reg_mr_shim::<P>,
            reg_mr_dmabuf: reg_mr_dmabuf_shim::<P>,
            dereg_mr: dereg_mr_shim::<P>,
            isend: isend_shim::<P>,
            irecv: irecv_shim::<P>,
            iflush: iflush_shim::<P>,
            test: test_shim::<P>,
            close_send: close_send_shim::<P>,
            close_recv: close_recv_shim::<P>,
            close_listen: close_listen_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

impl NetV2 {
    /// The v2 table whose functions call `P::get()`.
    pub const fn table<P: NetProvider>(name: &'static str) -> NetV2 {
        NetV2 { base: NetV1::table::<P>(name), make_vdevice: make_vdevice_shim::<P> }
    }
}

impl NetV3 {
    /// The v3 table whose functions call `P::get()`.
    pub const fn table<P: NetProvider>(name: &'static str) -> NetV3 {
        NetV3 { base: NetV2::table::<P>(name), init_v3: init_v3_shim::<P> }
    }
}

/// Exports a net plugin from a cdylib at ABI version `v3` (symbol `rustccl_net_v3`, table
/// [`NetV3`]: a plugin that takes the encryption key), `v2` (`rustccl_net_v2`, [`NetV2`]) or
/// `v1` (`rustccl_net_v1`, [`NetV1`]):
/// `export_net!(v2, "Name", Type, constructor_expr);`. Export v2 unless the plugin must load
/// into hosts older than v2. [`export_net_v1!`](crate::export_net_v1) is `export_net!(v1, ...)`.
#[macro_export]
macro_rules! export_net {
    (v1, $name:expr, $ty:ty, $ctor:expr) => {
        $crate::export_net!(@table NetV1, rustccl_net_v1, $name, $ty, $ctor);
    };
    (v2, $name:expr, $ty:ty, $ctor:expr) => {
        $crate::export_net!(@table NetV2, rustccl_net_v2, $name, $ty, $ctor);
    };
    (v3, $name:expr, $ty:ty, $ctor:expr) => {
        $crate::export_net!(@table NetV3, rustccl_net_v3, $name, $ty, $ctor);
    };
    (@table $table:ident, $symbol:ident, $name:expr, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            struct Provider;
            impl $crate::net::NetProvider for Provider {
                fn get() -> &'static dyn $crate::net::Net {
                    INSTANCE.get_or_init(|| $ctor)
                }
            }
            static TABLE: $crate::net::$table = $crate::net::$table::table::<Provider>($name);
            #[no_mangle]
            #[used]
            pub static $symbol: $crate::export::PluginExport<$crate::net::$table> =
                $crate::export::PluginExport::new(&TABLE);
        };
    };
}

/// Exports a net plugin at ABI v1: `export_net_v1!("Name", Type, constructor_expr);` (the same
/// as [`export_net!`](crate::export_net)`(v1, ...)`).
#[macro_export]
macro_rules! export_net_v1 {
    ($name:expr, $ty:ty, $ctor:expr) => {
        $crate::export_net!(v1, $name, $ty, $ctor);
    };
}

fn some(h: PluginHandle) -> Option<PluginHandle> {
    (h.id != 0).then_some(h)
}

/// A net table of some ABI version, as [`NetClient`] calls it.
pub trait NetTable: Sync + 'static {
    /// The v1 functions.
    fn base(&self) -> &NetV1;
    /// `make_vdevice`, when this version has it.
    fn make_vdevice(&self) -> Option<MakeVDeviceFn>;
    /// `init_v3` (init with the encryption key), when this version has it.
    fn init_v3(&self) -> Option<InitV3Fn> {
        None
    }
}

impl NetTable for NetV1 {
    fn base(&self) -> &NetV1 {
        self
    }
    fn make_vdevice(&self) -> Option<MakeVDeviceFn> {
        None
    }
}

impl NetTable for NetV2 {
    fn base(&self) -> &NetV1 {
        &self.base
    }
    fn make_vdevice(&self) -> Option<MakeVDeviceFn> {
        Some(self.make_vdevice)
    }
}

impl NetTable for NetV3 {
    fn base(&self) -> &NetV1 {
        &self.base.base
    }
    fn make_vdevice(&self) -> Option<MakeVDeviceFn> {
        Some(self.base.make_vdevice)
    }
    fn init_v3(&self) -> Option<InitV3Fn> {
        Some(self.init_v3)
    }
}

/// A loaded library's table, seen through the [`Net`] trait.
pub struct NetClient<T: NetTable> {
    pub table: &'static T,
}

/// A loaded library's v1 table: [`Net::make_vdevice`] says the table predates it.
pub type NetV1Client = NetClient<NetV1>;
/// A loaded library's v2 table.
pub type NetV2Client = NetClient<NetV2>;
/// A loaded library's v3 table (takes the encryption key).
pub type NetV3Client = NetClient<NetV3>;

impl<T: NetTable> NetClient<T> {
    pub fn name(&self) -> &'static str {
        self.table.base().name.as_str()
    }
}

fn into<T>(r: PResult<T>) -> Result<T, PluginError> {
    r.into_result()
}

impl<T: NetTable> Net for NetClient<T> {
    fn init(&self, comm_id: u64, config: &NetCommConfig, log: LogFn) -> Result<PluginHandle, PluginError> {
        into((self.table.base().init)(comm_id, config, log))
    }
    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        into((self.table.base().devices)(ctx))
    }
    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        into((self.table.base().properties)(ctx, dev))
    }
    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        let mut handle = NetHandle::default();
        let l = into((self.table.base().listen)(ctx, dev, &mut handle))?;
        Ok((handle, l))
    }
    fn connect(&self, ctx: PluginHandle, dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.base().connect)(ctx, dev, handle)).map(some)
    }
    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.base().accept)(listen)).map(some)
    }
    fn reg_mr(&self, comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError> {
        into((self.table.base().reg_mr)(comm, data, size, ptr_type))
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
        into((self.table.base().reg_mr_dmabuf)(comm, data, size, ptr_type, offset, fd))
    }
    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        into((self.table.base().dereg_mr)(comm, mr))
    }
    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.base().isend)(comm, data, size, tag, mr)).map(some)
    }
    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.base().irecv)(comm, RSlice::from_slice(bufs))).map(some)
    }
    fn iflush(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.base().iflush)(comm, RSlice::from_slice(bufs))).map(some)
    }
    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        into((self.table.base().test)(request, RSliceMut::from_mut_slice(sizes)))
    }
    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        into((self.table.base().close_send)(comm))
    }
    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        into((self.table.base().close_recv)(comm))
    }
    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        into((self.table.base().close_listen)(listen))
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.base().finalize)(ctx))
    }
    fn takes_encryption_key(&self) -> bool {
        self.table.init_v3().is_some()
    }
    fn init_with_key(
        &self,
        comm_id: u64,
        config: &NetCommConfig,
        key: Option<&[u8]>,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        match self.table.init_v3() {
            Some(f) => {
                let args = NetInitArgs { config: *config, encryption_key: RSlice::from_slice(key.unwrap_or(&[])) };
                into(f(comm_id, &args, log))
            }
            None => self.init(comm_id, config, log),
        }
    }
    fn make_vdevice(&self, ctx: PluginHandle, devs: &[i32]) -> Result<i32, PluginError> {
        match self.table.make_vdevice() {
            Some(f) => into(f(ctx, RSlice::from_slice(devs))),
            None => Err(PluginError::invalid_usage(format!(
                "net plugin {}: its rustccl net ABI v1 table predates make_vdevice, so it cannot fuse devices",
                self.name()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Two physical devices; virtual devices made by `make_vdevice` follow them.
    struct TwoNics {
        virtual_devs: Mutex<Vec<Vec<i32>>>,
    }

    fn nic(name: &str, speed_mbps: u32, ptr_support: u32) -> NetProperties {
        NetProperties {
            name: name.into(),
            pci_path: format!("/sys/devices/{name}").into(),
            guid: name.len() as u64,
            ptr_support,
            reg_is_global: true,
            force_flush: false,
            speed_mbps,
            port: 1,
            latency_us: 1.5,
            max_comms: 1000,
            max_recvs: 8,
            max_p2p_bytes: 1 << 30,
            max_coll_bytes: 1 << 30,
        }
    }

    const PHYSICAL: i32 = 2;

    fn no(what: &str) -> PluginError {
        PluginError::internal(format!("test network: no {what}"))
    }

    impl TwoNics {
        fn physical(dev: i32) -> NetProperties {
            [nic("mlx5_0", 100_000, PTR_HOST | PTR_DEVICE), nic("mlx5_1", 200_000, PTR_HOST)][dev as usize].clone()
        }
    }

    impl Net for TwoNics {
        fn init(&self, _: u64, _: &NetCommConfig, _: LogFn) -> Result<PluginHandle, PluginError> {
            Ok(PluginHandle { id: 1 })
        }
        fn devices(&self, _: PluginHandle) -> Result<i32, PluginError> {
            Ok(PHYSICAL + self.virtual_devs.lock().unwrap().len() as i32)
        }
        fn properties(&self, _: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
            if (0..PHYSICAL).contains(&dev) {
                return Ok(Self::physical(dev));
            }
            let v = self.virtual_devs.lock().unwrap();
            let members = v.get((dev - PHYSICAL) as usize).ok_or_else(|| no("such device"))?;
            let props: Vec<NetProperties> = members.iter().map(|&d| Self::physical(d)).collect();
            Ok(merge_properties(&props).expect("members"))
        }
        fn make_vdevice(&self, _: PluginHandle, devs: &[i32]) -> Result<i32, PluginError> {
            check_vdevice_members(devs, PHYSICAL)?;
            let mut v = self.virtual_devs.lock().unwrap();
            v.push(devs.to_vec());
            Ok(PHYSICAL + v.len() as i32 - 1)
        }
        fn listen(&self, _: PluginHandle, _: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
            Err(no("listen"))
        }
        fn connect(&self, _: PluginHandle, _: i32, _: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
            Err(no("connect"))
        }
        fn accept(&self, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
            Err(no("accept"))
        }
        fn reg_mr(&self, _: PluginHandle, _: usize, _: usize, _: u32) -> Result<PluginHandle, PluginError> {
            Err(no("reg_mr"))
        }
        fn dereg_mr(&self, _: PluginHandle, _: PluginHandle) -> Result<(), PluginError> {
            Err(no("dereg_mr"))
        }
        unsafe fn isend(&self, _: PluginHandle, _: usize, _: usize, _: i32, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
            Err(no("isend"))
        }
        unsafe fn irecv(&self, _: PluginHandle, _: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
            Err(no("irecv"))
        }
        fn test(&self, _: PluginHandle, _: &mut [usize]) -> Result<bool, PluginError> {
            Err(no("test"))
        }
        fn close_send(&self, _: PluginHandle) -> Result<(), PluginError> {
            Err(no("close_send"))
        }
        fn close_recv(&self, _: PluginHandle) -> Result<(), PluginError> {
            Err(no("close_recv"))
        }
        fn close_listen(&self, _: PluginHandle) -> Result<(), PluginError> {
            Err(no("close_listen"))
        }
        fn finalize(&self, _: PluginHandle) -> Result<(), PluginError> {
            Ok(())
        }
    }

    struct Provider;
    impl NetProvider for Provider {
        fn get() -> &'static dyn Net {
            static NET: std::sync::OnceLock<TwoNics> = std::sync::OnceLock::new();
            NET.get_or_init(|| TwoNics { virtual_devs: Mutex::new(Vec::new()) })
        }
    }

    static V1: NetV1 = NetV1::table::<Provider>("TwoNics");
    static V2: NetV2 = NetV2::table::<Provider>("TwoNics");

    extern "C" fn quiet(_: i32, _: u64, _: abi_stable::std_types::RStr<'_>) {}

    #[test]
    fn merged_properties_are_named_a_plus_b_with_the_speeds_summed() {
        let m = merge_properties(&[nic("mlx5_0", 100_000, PTR_HOST | PTR_DEVICE), nic("mlx5_1", 200_000, PTR_HOST)]).unwrap();
        assert_eq!(m.name.as_str(), "mlx5_0+mlx5_1");
        assert_eq!(m.speed_mbps, 300_000);
        assert_eq!(m.ptr_support, PTR_HOST, "only what every member offers");
        assert_eq!(m.pci_path.as_str(), "/sys/devices/mlx5_0");
        assert_eq!(merge_properties(&[]), None);
        assert_eq!(merge_properties(&[nic("a", u32::MAX, 1), nic("b", 5, 1)]).unwrap().speed_mbps, u32::MAX);
    }

    #[test]
    fn vdevice_member_lists_are_checked() {
        assert!(check_vdevice_members(&[0, 1], 2).is_ok());
        assert!(check_vdevice_members(&[1], 2).is_ok());
        for (devs, why) in [
            (&[][..], "1 to 8 devices, not 0"),
            (&[0, 2][..], "no physical device 2"),
            (&[-1][..], "no physical device -1"),
            (&[1, 1][..], "listed twice"),
            (&[0; 9][..], "not 9"),
        ] {
            let e = check_vdevice_members(devs, 2).unwrap_err();
            assert!(e.message.contains(why) && e.code == PluginError::INVALID_ARGUMENT, "{devs:?}: {e}");
        }
    }

    /// Through the v2 table a host makes a virtual device; through a v1 table of the same
    /// plugin it gets a clear "predates make_vdevice" error, and the rest works as before.
    #[test]
    fn make_vdevice_goes_through_v2_and_v1_reports_it_absent() {
        let v2 = NetV2Client { table: &V2 };
        let ctx = v2.init(7, &NetCommConfig::default(), LogFn { log: quiet }).unwrap();
        assert_eq!(v2.devices(ctx).unwrap(), 2);
        let v = v2.make_vdevice(ctx, &[0, 1]).unwrap();
        assert_eq!(v, 2);
        assert_eq!(v2.devices(ctx).unwrap(), 3);
        let p = v2.properties(ctx, v).unwrap();
        assert_eq!((p.name.as_str(), p.speed_mbps), ("mlx5_0+mlx5_1", 300_000));
        let e = v2.make_vdevice(ctx, &[0, 5]).unwrap_err();
        assert!(e.message.contains("no physical device 5"), "{e}");

        let v1 = NetV1Client { table: &V1 };
        assert_eq!(v1.name(), "TwoNics");
        let e = v1.make_vdevice(ctx, &[0, 1]).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_USAGE);
        assert!(e.message.contains("TwoNics") && e.message.contains("v1 table predates make_vdevice"), "{e}");
        assert_eq!(v1.devices(ctx).unwrap(), 3, "the v1 table reaches the same plugin");
    }

    /// A plugin that keeps the trait's default answers "not supported", through the v2 table
    /// too, and a panic inside make_vdevice is an error, not an unwind across the ABI.
    #[test]
    fn the_default_make_vdevice_says_not_supported() {
        struct Plain;
        impl Net for Plain {
            fn init(&self, _: u64, _: &NetCommConfig, _: LogFn) -> Result<PluginHandle, PluginError> { Err(no("init")) }
            fn devices(&self, _: PluginHandle) -> Result<i32, PluginError> { Ok(1) }
            fn properties(&self, _: PluginHandle, _: i32) -> Result<NetProperties, PluginError> { Err(no("properties")) }
            fn listen(&self, _: PluginHandle, _: i32) -> Result<(NetHandle, PluginHandle), PluginError> { Err(no("listen")) }
            fn connect(&self, _: PluginHandle, _: i32, _: &NetHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("connect")) }
            fn accept(&self, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("accept")) }
            fn reg_mr(&self, _: PluginHandle, _: usize, _: usize, _: u32) -> Result<PluginHandle, PluginError> { Err(no("reg_mr")) }
            fn dereg_mr(&self, _: PluginHandle, _: PluginHandle) -> Result<(), PluginError> { Err(no("dereg_mr")) }
            unsafe fn isend(&self, _: PluginHandle, _: usize, _: usize, _: i32, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("isend")) }
            unsafe fn irecv(&self, _: PluginHandle, _: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> { Err(no("irecv")) }
            fn test(&self, _: PluginHandle, _: &mut [usize]) -> Result<bool, PluginError> { Err(no("test")) }
            fn close_send(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_send")) }
            fn close_recv(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_recv")) }
            fn close_listen(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_listen")) }
            fn finalize(&self, _: PluginHandle) -> Result<(), PluginError> { Ok(()) }
        }
        struct PlainProvider;
        impl NetProvider for PlainProvider {
            fn get() -> &'static dyn Net {
                &Plain
            }
        }
        static PLAIN: NetV2 = NetV2::table::<PlainProvider>("Plain");
        let e = NetV2Client { table: &PLAIN }.make_vdevice(PluginHandle { id: 1 }, &[0]).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (PluginError::INVALID_USAGE, VDEVICE_NOT_SUPPORTED));
    }

    /// A v1 export cannot pass for v2 (nor the reverse): the layout check tells them apart.
    #[test]
    fn v1_and_v2_layouts_differ() {
        use abi_stable::abi_stability::abi_checking::check_layout_compatibility;
        assert!(check_layout_compatibility(<NetV2 as StableAbi>::LAYOUT, <NetV1 as StableAbi>::LAYOUT).is_err());
        assert!(check_layout_compatibility(<NetV1 as StableAbi>::LAYOUT, <NetV2 as StableAbi>::LAYOUT).is_err());
        assert!(check_layout_compatibility(<NetV2 as StableAbi>::LAYOUT, <NetV2 as StableAbi>::LAYOUT).is_ok());
        assert!(check_layout_compatibility(<NetV3 as StableAbi>::LAYOUT, <NetV2 as StableAbi>::LAYOUT).is_err());
        assert!(check_layout_compatibility(<NetV2 as StableAbi>::LAYOUT, <NetV3 as StableAbi>::LAYOUT).is_err());
        assert!(check_layout_compatibility(<NetV3 as StableAbi>::LAYOUT, <NetV3 as StableAbi>::LAYOUT).is_ok());
    }

    /// Through a v3 table the key reaches the plugin's `init_with_key`; through v2 and v1
    /// tables of the same plugin it cannot (the client says so) and plain `init` runs.
    #[test]
    fn the_key_goes_through_v3_only_and_is_never_printed() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static KEY_LEN: AtomicUsize = AtomicUsize::new(0);
        struct Keyed;
        impl Net for Keyed {
            fn init(&self, _: u64, _: &NetCommConfig, _: LogFn) -> Result<PluginHandle, PluginError> {
                KEY_LEN.store(0, Ordering::SeqCst);
                Ok(PluginHandle { id: 1 })
            }
            fn takes_encryption_key(&self) -> bool {
                true
            }
            fn init_with_key(&self, _: u64, c: &NetCommConfig, key: Option<&[u8]>, _: LogFn) -> Result<PluginHandle, PluginError> {
                assert_eq!(c.traffic_class, 5);
                KEY_LEN.store(key.map_or(1000, <[u8]>::len), Ordering::SeqCst);
                Ok(PluginHandle { id: 3 })
            }
            fn devices(&self, _: PluginHandle) -> Result<i32, PluginError> { Ok(1) }
            fn properties(&self, _: PluginHandle, _: i32) -> Result<NetProperties, PluginError> { Err(no("properties")) }
            fn listen(&self, _: PluginHandle, _: i32) -> Result<(NetHandle, PluginHandle), PluginError> { Err(no("listen")) }
            fn connect(&self, _: PluginHandle, _: i32, _: &NetHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("connect")) }
            fn accept(&self, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("accept")) }
            fn reg_mr(&self, _: PluginHandle, _: usize, _: usize, _: u32) -> Result<PluginHandle, PluginError> { Err(no("reg_mr")) }
            fn dereg_mr(&self, _: PluginHandle, _: PluginHandle) -> Result<(), PluginError> { Err(no("dereg_mr")) }
            unsafe fn isend(&self, _: PluginHandle, _: usize, _: usize, _: i32, _: PluginHandle) -> Result<Option<PluginHandle>, PluginError> { Err(no("isend")) }
            unsafe fn irecv(&self, _: PluginHandle, _: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> { Err(no("irecv")) }
            fn test(&self, _: PluginHandle, _: &mut [usize]) -> Result<bool, PluginError> { Err(no("test")) }
            fn close_send(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_send")) }
            fn close_recv(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_recv")) }
            fn close_listen(&self, _: PluginHandle) -> Result<(), PluginError> { Err(no("close_listen")) }
            fn finalize(&self, _: PluginHandle) -> Result<(), PluginError> { Ok(()) }
        }
        struct KeyedProvider;
        impl NetProvider for KeyedProvider {
            fn get() -> &'static dyn Net {
                &Keyed
            }
        }
        static K3: NetV3 = NetV3::table::<KeyedProvider>("Keyed");
        static K2: NetV2 = NetV2::table::<KeyedProvider>("Keyed");
        let config = NetCommConfig { traffic_class: 5 };
        let log = LogFn { log: quiet };
        let v3 = NetV3Client { table: &K3 };
        assert!(v3.takes_encryption_key());
        assert_eq!(v3.init_with_key(1, &config, Some(&[7u8; 40]), log).unwrap().id, 3);
        assert_eq!(KEY_LEN.load(Ordering::SeqCst), 40);
        v3.init_with_key(1, &config, None, log).unwrap();
        assert_eq!(KEY_LEN.load(Ordering::SeqCst), 1000, "no key arrives as None");
        let v2 = NetV2Client { table: &K2 };
        assert!(!v2.takes_encryption_key());
        assert_eq!(v2.init_with_key(1, &config, Some(&[7u8; 40]), log).unwrap().id, 1, "v2: plain init");
        let args = NetInitArgs { config, encryption_key: RSlice::from_slice(b"0123456789abcdef0123456789abcdef") };
        let shown = format!("{args:?}");
        assert!(shown.contains("(set; not shown)") && !shown.contains("0123"), "{shown}");
    }
}

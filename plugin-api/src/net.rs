//! The net plugin ABI (rustccl net v1), with the semantics of NCCL's `ncclNet_v11`:
//! connection-oriented (listen / connect / accept, non-blocking: `Ok(None)` means "call again"),
//! memory registration (host and device pointers, dma-buf), tagged isend and multi-buffer irecv,
//! test, flush, close, and device properties.
//!
//! A plugin implements the safe trait [`Net`] and exports it with
//! [`export_net_v1!`](crate::export_net_v1); the host
//! gets a `&dyn Net` back either way: directly for a built-in plugin, or through
//! [`NetV1Client`], which calls a loaded library's table. So the core sees one interface.
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
}

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

/// Exports a net plugin: `export_net_v1!("Name", Type, constructor_expr);` in a cdylib.
#[macro_export]
macro_rules! export_net_v1 {
    ($name:expr, $ty:ty, $ctor:expr) => {
        const _: () = {
            static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
            struct Provider;
            impl $crate::net::NetProvider for Provider {
                fn get() -> &'static dyn $crate::net::Net {
                    INSTANCE.get_or_init(|| $ctor)
                }
            }
            static TABLE: $crate::net::NetV1 = $crate::net::NetV1::table::<Provider>($name);
            #[no_mangle]
            #[used]
            pub static rustccl_net_v1: $crate::export::PluginExport<$crate::net::NetV1> =
                $crate::export::PluginExport::new(&TABLE);
        };
    };
}

fn some(h: PluginHandle) -> Option<PluginHandle> {
    (h.id != 0).then_some(h)
}

/// A loaded library's v1 table, seen through the [`Net`] trait.
pub struct NetV1Client {
    pub table: &'static NetV1,
}

impl NetV1Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

fn into<T>(r: PResult<T>) -> Result<T, PluginError> {
    r.into_result()
}

impl Net for NetV1Client {
    fn init(&self, comm_id: u64, config: &NetCommConfig, log: LogFn) -> Result<PluginHandle, PluginError> {
        into((self.table.init)(comm_id, config, log))
    }
    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        into((self.table.devices)(ctx))
    }
    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        into((self.table.properties)(ctx, dev))
    }
    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        let mut handle = NetHandle::default();
        let l = into((self.table.listen)(ctx, dev, &mut handle))?;
        Ok((handle, l))
    }
    fn connect(&self, ctx: PluginHandle, dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.connect)(ctx, dev, handle)).map(some)
    }
    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.accept)(listen)).map(some)
    }
    fn reg_mr(&self, comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError> {
        into((self.table.reg_mr)(comm, data, size, ptr_type))
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
        into((self.table.reg_mr_dmabuf)(comm, data, size, ptr_type, offset, fd))
    }
    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        into((self.table.dereg_mr)(comm, mr))
    }
    unsafe fn isend(
        &self,
        comm: PluginHandle,
        data: usize,
        size: usize,
        tag: i32,
        mr: PluginHandle,
    ) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.isend)(comm, data, size, tag, mr)).map(some)
    }
    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.irecv)(comm, RSlice::from_slice(bufs))).map(some)
    }
    fn iflush(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        into((self.table.iflush)(comm, RSlice::from_slice(bufs))).map(some)
    }
    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        into((self.table.test)(request, RSliceMut::from_mut_slice(sizes)))
    }
    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        into((self.table.close_send)(comm))
    }
    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        into((self.table.close_recv)(comm))
    }
    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        into((self.table.close_listen)(listen))
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.finalize)(ctx))
    }
}

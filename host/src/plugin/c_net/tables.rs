//! The `#[repr(C)]` net tables NCCL's C plugins export (`ncclNetPlugin_v6` … `ncclNetPlugin_v12`)
//! and their device-property structs, laid out as NCCL's `net_vN.h` headers define them, and
//! [`Fns`]: one table of any version normalised to the calls the adapter makes (signatures that
//! differ between versions become the variants of small enums). Every member is an
//! `Option<fn>`, so a NULL member reads as `None` instead of a call through NULL; which members
//! are mandatory is decided here, when a table is read ([`Fns::from_table`]).

use std::ffi::{c_char, c_int, c_void};

use super::super::c_abi::NcclDebugLogger;

/// `ncclResult_t` (a C enum).
pub type CResult = c_int;
/// `ncclProfilerCallback_t`: `(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData)`.
pub type ProfilerCallback =
    unsafe extern "C" fn(e_handle: *mut *mut c_void, kind: c_int, p_handle: *mut c_void, plugin_id: i64, ext: *mut c_void) -> CResult;
/// `ncclNetDeviceHandle_vN_t**`: the adapter passes storage holding NULL (host-only).
pub type DevHandleOut = *mut *mut c_void;

/// `ncclNetDeviceType`: only host networking is supported.
pub const NET_DEVICE_HOST: c_int = 0;
/// `MAX_NET_SIZE`: the largest message of the `int`-sized ABIs (v6–v8), and their `maxP2pBytes`.
pub const MAX_NET_SIZE: usize = 1 << 30;
/// `MAX_COLLNET_SIZE`: `maxCollBytes` of the ABIs that predate the field (v6–v8).
pub const MAX_COLLNET_SIZE: usize = 512 << 20;
/// The newest and oldest table versions this adapter reads.
pub const NEWEST: u32 = 12;
pub const OLDEST: u32 = 6;

/// `ncclNetProperties_v6_t`.
#[repr(C)]
pub struct PropsV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t`: v6 plus the device-offload type and version.
#[repr(C)]
pub struct PropsV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`: v7 with `regIsGlobal` after `ptrSupport`.
#[repr(C)]
pub struct PropsV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_vN_t`: the physical devices a virtual one fuses (4 up to v11, 8 in v12).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VDeviceProps<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}

impl<const N: usize> VDeviceProps<N> {
    /// The member list (`ndevs` clamped to the array).
    pub fn members(&self) -> Vec<i32> {
        self.devs[..(self.ndevs.max(0) as usize).min(N)].to_vec()
    }
}

/// `ncclNetProperties_v9_t` (v10's is the same layout).
#[repr(C)]
pub struct PropsV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<4>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNetProperties_v11_t`: v9 plus `maxMultiRequestSize`.
#[repr(C)]
pub struct PropsV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<4>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12_t`: v11 with 8 devices per virtual NIC, plus rail and plane ids.
#[repr(C)]
pub struct PropsV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<8>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

/// `ncclNetCommConfig_vN_t` (v10 passes it to connect, v11+ to init).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfig {
    pub traffic_class: c_int,
}

type F<T> = Option<T>;
type Ptr = *mut c_void;

type InitOld = unsafe extern "C" fn(NcclDebugLogger) -> CResult;
type InitV10 = unsafe extern "C" fn(NcclDebugLogger, ProfilerCallback) -> CResult;
type InitCtx = unsafe extern "C" fn(*mut Ptr, u64, *mut CommConfig, NcclDebugLogger, ProfilerCallback) -> CResult;
type Devices = unsafe extern "C" fn(*mut c_int) -> CResult;
type GetProps<P> = unsafe extern "C" fn(c_int, *mut P) -> CResult;
type ListenOld = unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> CResult;
type ListenCtx = unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr) -> CResult;
type ConnectV6 = unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> CResult;
type ConnectV7 = unsafe extern "C" fn(c_int, Ptr, *mut Ptr, DevHandleOut) -> CResult;
type ConnectV10 = unsafe extern "C" fn(c_int, *mut CommConfig, Ptr, *mut Ptr, DevHandleOut) -> CResult;
type ConnectCtx = unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr, DevHandleOut) -> CResult;
type AcceptV6 = unsafe extern "C" fn(Ptr, *mut Ptr) -> CResult;
type AcceptV7 = unsafe extern "C" fn(Ptr, *mut Ptr, DevHandleOut) -> CResult;
type RegMrInt = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, *mut Ptr) -> CResult;
type RegMrSize = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, *mut Ptr) -> CResult;
type RegMrDmaBuf = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, *mut Ptr) -> CResult;
type DeregMr = unsafe extern "C" fn(Ptr, Ptr) -> CResult;
type IsendInt = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Ptr, *mut Ptr) -> CResult;
type IsendSize = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, *mut Ptr) -> CResult;
type IsendProf = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Ptr, *mut Ptr) -> CResult;
type IrecvInt = unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut c_int, *mut c_int, *mut Ptr, *mut Ptr) -> CResult;
type IrecvSize = unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut usize, *mut c_int, *mut Ptr, *mut Ptr) -> CResult;
type IrecvProf =
    unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut usize, *mut c_int, *mut Ptr, *mut Ptr, *mut Ptr) -> CResult;
type Iflush = unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut c_int, *mut Ptr, *mut Ptr) -> CResult;
type Test = unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> CResult;
type Close = unsafe extern "C" fn(Ptr) -> CResult;
type GetDeviceMr = unsafe extern "C" fn(Ptr, Ptr, *mut Ptr) -> CResult;
type IrecvConsumed = unsafe extern "C" fn(Ptr, c_int, Ptr) -> CResult;
type MakeVDevice<const N: usize> = unsafe extern "C" fn(*mut c_int, *mut VDeviceProps<N>) -> CResult;
type Finalize = unsafe extern "C" fn(Ptr) -> CResult;
type SetNetAttr = unsafe extern "C" fn(Ptr, Ptr) -> CResult;

/// `ncclNet_v6_t`.
#[repr(C)]
pub struct NetV6 {
    pub name: *const c_char,
    pub init: F<InitOld>,
    pub devices: F<Devices>,
    pub get_properties: F<GetProps<PropsV6>>,
    pub listen: F<ListenOld>,
    pub connect: F<ConnectV6>,
    pub accept: F<AcceptV6>,
    pub reg_mr: F<RegMrInt>,
    pub reg_mr_dma_buf: F<RegMrDmaBuf>,
    pub dereg_mr: F<DeregMr>,
    pub isend: F<IsendInt>,
    pub irecv: F<IrecvInt>,
    pub iflush: F<Iflush>,
    pub test: F<Test>,
    pub close_send: F<Close>,
    pub close_recv: F<Close>,
    pub close_listen: F<Close>,
}

/// Declares a table of v7 or later: the members every one of them has, in NCCL's order, with
/// the version's own signatures, then the members it adds at the end.
macro_rules! net_table {
    ($(#[$doc:meta])* $name:ident { init: $init:ty, props: $props:ty, listen: $listen:ty, connect: $connect:ty,
      reg_mr: $reg:ty, isend: $isend:ty, irecv: $irecv:ty, tail: { $($tail:ident: $tty:ty),* } }) => {
        $(#[$doc])*
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            pub init: F<$init>,
            pub devices: F<Devices>,
            pub get_properties: F<GetProps<$props>>,
            pub listen: F<$listen>,
            pub connect: F<$connect>,
            pub accept: F<AcceptV7>,
            pub reg_mr: F<$reg>,
            pub reg_mr_dma_buf: F<RegMrDmaBuf>,
            pub dereg_mr: F<DeregMr>,
            pub isend: F<$isend>,
            pub irecv: F<$irecv>,
            pub iflush: F<Iflush>,
            pub test: F<Test>,
            pub close_send: F<Close>,
            pub close_recv: F<Close>,
            pub close_listen: F<Close>,
            pub get_device_mr: F<GetDeviceMr>,
            pub irecv_consumed: F<IrecvConsumed>,
            $(pub $tail: F<$tty>,)*
        }
    };
}

net_table!(/// `ncclNet_v7_t`.
    NetV7 { init: InitOld, props: PropsV7, listen: ListenOld, connect: ConnectV7, reg_mr: RegMrInt,
    isend: IsendInt, irecv: IrecvInt, tail: {} });
net_table!(/// `ncclNet_v8_t`: `size_t` regMr.
    NetV8 { init: InitOld, props: PropsV8, listen: ListenOld, connect: ConnectV7, reg_mr: RegMrSize,
    isend: IsendInt, irecv: IrecvInt, tail: {} });
net_table!(/// `ncclNet_v9_t`: `size_t` sizes everywhere, virtual devices.
    NetV9 { init: InitOld, props: PropsV9, listen: ListenOld, connect: ConnectV7, reg_mr: RegMrSize,
    isend: IsendSize, irecv: IrecvSize, tail: { make_vdevice: MakeVDevice<4> } });
net_table!(/// `ncclNet_v10_t`: profiler callback in init, comm config in connect, profiler handles.
    NetV10 { init: InitV10, props: PropsV9, listen: ListenOld, connect: ConnectV10, reg_mr: RegMrSize,
    isend: IsendProf, irecv: IrecvProf, tail: { make_vdevice: MakeVDevice<4> } });
net_table!(/// `ncclNet_v11_t`: a context per communicator, finalize, net attributes.
    NetV11 { init: InitCtx, props: PropsV11, listen: ListenCtx, connect: ConnectCtx, reg_mr: RegMrSize,
    isend: IsendProf, irecv: IrecvProf,
    tail: { make_vdevice: MakeVDevice<4>, finalize: Finalize, set_net_attr: SetNetAttr } });
net_table!(/// `ncclNet_v12_t`: v11 with 8 devices per virtual NIC and rail/plane ids.
    NetV12 { init: InitCtx, props: PropsV12, listen: ListenCtx, connect: ConnectCtx, reg_mr: RegMrSize,
    isend: IsendProf, irecv: IrecvProf,
    tail: { make_vdevice: MakeVDevice<8>, finalize: Finalize, set_net_attr: SetNetAttr } });

// ---- One table of any version, normalised ------------------------------------------------

#[derive(Clone, Copy)]
pub enum Init {
    Old(InitOld),
    V10(InitV10),
    Ctx(InitCtx),
}

#[derive(Clone, Copy)]
pub enum GetProperties {
    V6(GetProps<PropsV6>),
    V7(GetProps<PropsV7>),
    V8(GetProps<PropsV8>),
    V9(GetProps<PropsV9>),
    V11(GetProps<PropsV11>),
    V12(GetProps<PropsV12>),
}

#[derive(Clone, Copy)]
pub enum Listen {
    Old(ListenOld),
    Ctx(ListenCtx),
}

#[derive(Clone, Copy)]
pub enum Connect {
    V6(ConnectV6),
    V7(ConnectV7),
    V10(ConnectV10),
    Ctx(ConnectCtx),
}

#[derive(Clone, Copy)]
pub enum Accept {
    V6(AcceptV6),
    V7(AcceptV7),
}

#[derive(Clone, Copy)]
pub enum RegMr {
    Int(RegMrInt),
    Size(RegMrSize),
}

#[derive(Clone, Copy)]
pub enum Isend {
    Int(IsendInt),
    Size(IsendSize),
    Prof(IsendProf),
}

#[derive(Clone, Copy)]
pub enum Irecv {
    Int(IrecvInt),
    Size(IrecvSize),
    Prof(IrecvProf),
}

#[derive(Clone, Copy)]
pub enum MakeVDev {
    V9(MakeVDevice<4>),
    V12(MakeVDevice<8>),
}

/// The calls of one table, whatever its version.
#[derive(Clone, Copy)]
pub struct Fns {
    pub version: u32,
    pub init: Init,
    pub devices: Devices,
    pub get_properties: GetProperties,
    pub listen: Listen,
    pub connect: Connect,
    pub accept: Accept,
    pub reg_mr: RegMr,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: DeregMr,
    pub isend: Isend,
    pub irecv: Irecv,
    /// NULL is tolerated: nothing to flush.
    pub iflush: Option<Iflush>,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub make_vdevice: Option<MakeVDev>,
    /// v11+: mandatory there.
    pub finalize: Option<Finalize>,
}

// SAFETY: plain function pointers into a loaded library, which the plugin keeps loaded; the
// functions themselves are called as NCCL calls them (from any thread).
unsafe impl Send for Fns {}
unsafe impl Sync for Fns {}

/// A member that must not be NULL.
fn need<T>(f: Option<T>, member: &str, missing: &mut Vec<String>) -> Option<T> {
    if f.is_none() {
        missing.push(member.to_string());
    }
    f
}

/// Reads the mandatory members or lists the NULL ones.
macro_rules! normalise {
    ($t:expr, $v:expr, $missing:ident, init: $init:expr, props: $props:expr, listen: $listen:expr,
     connect: $connect:expr, accept: $accept:expr, reg_mr: $reg:expr, isend: $isend:expr, irecv: $irecv:expr,
     vdev: $vdev:expr, finalize: $fin:expr) => {{
        let t = $t;
        let init = need(t.init, "init", &mut $missing);
        let devices = need(t.devices, "devices", &mut $missing);
        let props = need(t.get_properties, "getProperties", &mut $missing);
        let listen = need(t.listen, "listen", &mut $missing);
        let connect = need(t.connect, "connect", &mut $missing);
        let accept = need(t.accept, "accept", &mut $missing);
        let reg_mr = need(t.reg_mr, "regMr", &mut $missing);
        let dereg_mr = need(t.dereg_mr, "deregMr", &mut $missing);
        let isend = need(t.isend, "isend", &mut $missing);
        let irecv = need(t.irecv, "irecv", &mut $missing);
        let test = need(t.test, "test", &mut $missing);
        let close_send = need(t.close_send, "closeSend", &mut $missing);
        let close_recv = need(t.close_recv, "closeRecv", &mut $missing);
        let close_listen = need(t.close_listen, "closeListen", &mut $missing);
        let finalize = $fin;
        if !$missing.is_empty() {
            return Err($missing);
        }
        Ok(Fns {
            version: $v,
            init: $init(init.unwrap()),
            devices: devices.unwrap(),
            get_properties: $props(props.unwrap()),
            listen: $listen(listen.unwrap()),
            connect: $connect(connect.unwrap()),
            accept: $accept(accept.unwrap()),
            reg_mr: $reg(reg_mr.unwrap()),
            reg_mr_dma_buf: t.reg_mr_dma_buf,
            dereg_mr: dereg_mr.unwrap(),
            isend: $isend(isend.unwrap()),
            irecv: $irecv(irecv.unwrap()),
            iflush: t.iflush,
            test: test.unwrap(),
            close_send: close_send.unwrap(),
            close_recv: close_recv.unwrap(),
            close_listen: close_listen.unwrap(),
            make_vdevice: $vdev,
            finalize,
        })
    }};
}

/// A table of some version, as found in a library.
#[derive(Clone, Copy)]
pub enum AnyTable {
    V6(&'static NetV6),
    V7(&'static NetV7),
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
    V12(&'static NetV12),
}

impl AnyTable {
    pub fn version(&self) -> u32 {
        match self {
            AnyTable::V6(_) => 6,
            AnyTable::V7(_) => 7,
            AnyTable::V8(_) => 8,
            AnyTable::V9(_) => 9,
            AnyTable::V10(_) => 10,
            AnyTable::V11(_) => 11,
            AnyTable::V12(_) => 12,
        }
    }

    /// Where the table lies (the identity of the plugin in this process).
    pub fn addr(&self) -> usize {
        match self {
            AnyTable::V6(t) => *t as *const NetV6 as usize,
            AnyTable::V7(t) => *t as *const NetV7 as usize,
            AnyTable::V8(t) => *t as *const NetV8 as usize,
            AnyTable::V9(t) => *t as *const NetV9 as usize,
            AnyTable::V10(t) => *t as *const NetV10 as usize,
            AnyTable::V11(t) => *t as *const NetV11 as usize,
            AnyTable::V12(t) => *t as *const NetV12 as usize,
        }
    }

    pub fn name_ptr(&self) -> *const c_char {
        match self {
            AnyTable::V6(t) => t.name,
            AnyTable::V7(t) => t.name,
            AnyTable::V8(t) => t.name,
            AnyTable::V9(t) => t.name,
            AnyTable::V10(t) => t.name,
            AnyTable::V11(t) => t.name,
            AnyTable::V12(t) => t.name,
        }
    }
}

impl Fns {
    /// The table's calls, or the names of its NULL mandatory members.
    pub fn from_table(table: AnyTable) -> Result<Fns, Vec<String>> {
        let mut missing = Vec::new();
        let v = table.version();
        match table {
            AnyTable::V6(t) => normalise!(t, v, missing, init: Init::Old, props: GetProperties::V6,
                listen: Listen::Old, connect: Connect::V6, accept: Accept::V6, reg_mr: RegMr::Int,
                isend: Isend::Int, irecv: Irecv::Int, vdev: None, finalize: None),
            AnyTable::V7(t) => normalise!(t, v, missing, init: Init::Old, props: GetProperties::V7,
                listen: Listen::Old, connect: Connect::V7, accept: Accept::V7, reg_mr: RegMr::Int,
                isend: Isend::Int, irecv: Irecv::Int, vdev: None, finalize: None),
            AnyTable::V8(t) => normalise!(t, v, missing, init: Init::Old, props: GetProperties::V8,
                listen: Listen::Old, connect: Connect::V7, accept: Accept::V7, reg_mr: RegMr::Size,
                isend: Isend::Int, irecv: Irecv::Int, vdev: None, finalize: None),
            AnyTable::V9(t) => normalise!(t, v, missing, init: Init::Old, props: GetProperties::V9,
                listen: Listen::Old, connect: Connect::V7, accept: Accept::V7, reg_mr: RegMr::Size,
                isend: Isend::Size, irecv: Irecv::Size, vdev: t.make_vdevice.map(MakeVDev::V9), finalize: None),
            AnyTable::V10(t) => normalise!(t, v, missing, init: Init::V10, props: GetProperties::V9,
                listen: Listen::Old, connect: Connect::V10, accept: Accept::V7, reg_mr: RegMr::Size,
                isend: Isend::Prof, irecv: Irecv::Prof, vdev: t.make_vdevice.map(MakeVDev::V9), finalize: None),
            AnyTable::V11(t) => normalise!(t, v, missing, init: Init::Ctx, props: GetProperties::V11,
                listen: Listen::Ctx, connect: Connect::Ctx, accept: Accept::V7, reg_mr: RegMr::Size,
                isend: Isend::Prof, irecv: Irecv::Prof, vdev: t.make_vdevice.map(MakeVDev::V9),
                finalize: need(t.finalize, "finalize", &mut missing)),
            AnyTable::V12(t) => normalise!(t, v, missing, init: Init::Ctx, props: GetProperties::V12,
                listen: Listen::Ctx, connect: Connect::Ctx, accept: Accept::V7, reg_mr: RegMr::Size,
                isend: Isend::Prof, irecv: Irecv::Prof, vdev: t.make_vdevice.map(MakeVDev::V12),
                finalize: need(t.finalize, "finalize", &mut missing)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn property_layouts_match_nccls_headers() {
        // x86-64 / aarch64 LP64 sizes and offsets of NCCL's structs.
        assert_eq!(size_of::<PropsV6>(), 48);
        assert_eq!(size_of::<PropsV7>(), 56);
        assert_eq!(size_of::<PropsV8>(), 64);
        assert_eq!(offset_of!(PropsV9, v_props), 64);
        assert_eq!(offset_of!(PropsV9, max_p2p_bytes), 88);
        assert_eq!(size_of::<PropsV9>(), 104);
        assert_eq!(offset_of!(PropsV11, max_multi_request_size), 104);
        assert_eq!(size_of::<PropsV11>(), 112);
        assert_eq!(offset_of!(PropsV12, max_p2p_bytes), 104);
        assert_eq!(offset_of!(PropsV12, rail_id), 124);
        assert_eq!(size_of::<PropsV12>(), 128);
    }

    #[test]
    fn table_layouts_match_nccls_headers() {
        let p = size_of::<usize>();
        assert_eq!(size_of::<NetV6>(), 17 * p);
        assert_eq!(size_of::<NetV7>(), 19 * p);
        assert_eq!(size_of::<NetV8>(), 19 * p);
        assert_eq!(size_of::<NetV9>(), 20 * p);
        assert_eq!(size_of::<NetV10>(), 20 * p);
        assert_eq!(size_of::<NetV11>(), 22 * p);
        assert_eq!(size_of::<NetV12>(), 22 * p);
        assert_eq!(offset_of!(NetV11, finalize), 20 * p);
    }
}

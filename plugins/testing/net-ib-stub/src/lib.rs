//! Exists for loader tests: a net plugin named `IB` — the name of NCCL's InfiniBand transport,
//! which the loader tries before Socket — exporting rustccl net ABI v2, so the order rules
//! (IB with a device before Socket, IB without one passed over, `NCCL_NET` choosing) and
//! `make_vdevice` are tested without RDMA hardware.
//!
//! * `RUSTCCL_TEST_IB_DEVICES` (read at each `devices` call; default 2) is the number of
//!   physical devices, `stub_0`, `stub_1`, ..., device `d` at `(d + 1) × 100` Gbit/s; 0 is an
//!   IB transport that found no active port.
//! * `RUSTCCL_TEST_IB_WARN`, when set, is a warning `init` logs (as net-ib warns of a missing
//!   RDMA stack), so that the loader's handling of an IB transport's warnings is tested.
//! * `make_vdevice` fuses physical devices into a virtual one (numbered after the physical
//!   devices, for the life of the process) whose properties are
//!   [`merge_properties`]' (`stub_0+stub_1`, speeds summed).
//! * Data moves through the Loopback network of `rustccl-test-net-named` (every device is the
//!   same in-process loopback), so all "ranks" must live in one process.
//!
//! The library also carries Loopback's `rustccl_net_v1` export (a Rust cdylib exports its
//! dependencies' `#[no_mangle]` statics); a host reads the newest table first, so it loads
//! this plugin as `IB` through v2.

use std::sync::Mutex;

use rustccl_plugin_api::net::{check_vdevice_members, merge_properties, Net, NetCommConfig, NetHandle, NetProperties, RecvBuffer};
use rustccl_plugin_api::{LogFn, PluginError, PluginHandle};
use rustccl_test_net_named::Loopback;

/// The variable that sets the number of physical devices.
pub const DEVICES_VAR: &str = "RUSTCCL_TEST_IB_DEVICES";

/// The variable whose value `init` logs as a warning.
pub const WARN_VAR: &str = "RUSTCCL_TEST_IB_WARN";

/// The IB stub: physical devices from [`DEVICES_VAR`], virtual ones made by `make_vdevice`.
#[derive(Default)]
pub struct IbStub {
    /// The members of each virtual device, in the order made.
    virtual_devs: Mutex<Vec<Vec<i32>>>,
}

fn physical_devices() -> i32 {
    std::env::var(DEVICES_VAR).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(2)
}

impl IbStub {
    fn virtual_devs(&self) -> std::sync::MutexGuard<'_, Vec<Vec<i32>>> {
        self.virtual_devs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn physical_properties(ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        let mut p = Loopback.properties(ctx, 0)?;
        p.name = format!("stub_{dev}").into();
        p.guid = 0x1b00 + dev as u64;
        p.speed_mbps = (dev as u32 + 1) * 100_000;
        Ok(p)
    }

    /// Checks `dev` is a device of this plugin (Loopback has one device: every device maps to it).
    fn check_device(&self, ctx: PluginHandle, dev: i32) -> Result<(), PluginError> {
        let n = self.devices(ctx)?;
        if (0..n).contains(&dev) {
            Ok(())
        } else {
            Err(PluginError::invalid_argument(format!("IB stub: no device {dev} (there are {n})")))
        }
    }
}

impl Net for IbStub {
    fn init(&self, comm_id: u64, config: &NetCommConfig, log: LogFn) -> Result<PluginHandle, PluginError> {
        if let Ok(text) = std::env::var(WARN_VAR) {
            log.warn(rustccl_plugin_api::subsys::NET, &text);
        }
        Loopback.init(comm_id, config, log)
    }
    fn devices(&self, ctx: PluginHandle) -> Result<i32, PluginError> {
        Loopback.devices(ctx)?;
        Ok(physical_devices().max(0) + self.virtual_devs().len() as i32)
    }
    fn properties(&self, ctx: PluginHandle, dev: i32) -> Result<NetProperties, PluginError> {
        self.check_device(ctx, dev)?;
        let physical = physical_devices();
        if dev < physical {
            return Self::physical_properties(ctx, dev);
        }
        let members = self.virtual_devs()[(dev - physical) as usize].clone();
        let props = members.iter().map(|&d| Self::physical_properties(ctx, d)).collect::<Result<Vec<_>, _>>()?;
        merge_properties(&props).ok_or_else(|| PluginError::internal("IB stub: a virtual device without members"))
    }
    fn make_vdevice(&self, ctx: PluginHandle, devs: &[i32]) -> Result<i32, PluginError> {
        Loopback.devices(ctx)?;
        let physical = physical_devices();
        check_vdevice_members(devs, physical)?;
        let mut v = self.virtual_devs();
        v.push(devs.to_vec());
        Ok(physical + v.len() as i32 - 1)
    }
    fn listen(&self, ctx: PluginHandle, dev: i32) -> Result<(NetHandle, PluginHandle), PluginError> {
        self.check_device(ctx, dev)?;
        Loopback.listen(ctx, 0)
    }
    fn connect(&self, ctx: PluginHandle, dev: i32, handle: &NetHandle) -> Result<Option<PluginHandle>, PluginError> {
        self.check_device(ctx, dev)?;
        Loopback.connect(ctx, 0, handle)
    }
    fn accept(&self, listen: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        Loopback.accept(listen)
    }
    fn reg_mr(&self, comm: PluginHandle, data: usize, size: usize, ptr_type: u32) -> Result<PluginHandle, PluginError> {
        Loopback.reg_mr(comm, data, size, ptr_type)
    }
    fn dereg_mr(&self, comm: PluginHandle, mr: PluginHandle) -> Result<(), PluginError> {
        Loopback.dereg_mr(comm, mr)
    }
    unsafe fn isend(&self, comm: PluginHandle, data: usize, size: usize, tag: i32, mr: PluginHandle) -> Result<Option<PluginHandle>, PluginError> {
        // SAFETY: the caller's contract (`Net::isend`) is passed on unchanged.
        unsafe { Loopback.isend(comm, data, size, tag, mr) }
    }
    unsafe fn irecv(&self, comm: PluginHandle, bufs: &[RecvBuffer]) -> Result<Option<PluginHandle>, PluginError> {
        // SAFETY: the caller's contract (`Net::irecv`) is passed on unchanged.
        unsafe { Loopback.irecv(comm, bufs) }
    }
    fn test(&self, request: PluginHandle, sizes: &mut [usize]) -> Result<bool, PluginError> {
        Loopback.test(request, sizes)
    }
    fn close_send(&self, comm: PluginHandle) -> Result<(), PluginError> {
        Loopback.close_send(comm)
    }
    fn close_recv(&self, comm: PluginHandle) -> Result<(), PluginError> {
        Loopback.close_recv(comm)
    }
    fn close_listen(&self, listen: PluginHandle) -> Result<(), PluginError> {
        Loopback.close_listen(listen)
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        Loopback.finalize(ctx)
    }
}

rustccl_plugin_api::export_net!(v2, "IB", IbStub, IbStub::default());

//! rustccl's InfiniBand / RoCE network transport, over RDMA verbs.
//!
//! **Devices.** It loads libibverbs at run time through its own thin binding ([`verbs`]:
//! `NCCL_IBVERBS_LIB`, else `libibverbs.so.1`) and finds the devices NCCL would use
//! ([`device::discover`]): every ACTIVE InfiniBand or RoCE port, filtered by `NCCL_IB_HCA`,
//! off with `NCCL_IB_DISABLE`, each with its speed ([`speed`]) and, on RoCE, the GID NCCL's
//! rules pick ([`gid`]). [`list_devices`] is the plain listing. On a machine without RDMA
//! devices or without the library, these return an empty list or a clear error.
//!
//! **Merged NICs** ([`merge`]): the plugin's devices are virtual devices of 1 to 4 ports. At
//! the first `init` the ports of one NIC (same PCI device, system image GUID and link layer)
//! become one device `a+b` whose speed is the sum (`NCCL_IB_MERGE_NICS`, default 1);
//! `make_vdevice` (net ABI v2) appends a device of any physical devices. A connection on a
//! merged device has a PD and a CQ per member and max(local, remote members) ×
//! `NCCL_IB_QPS_PER_CONNECTION` QPs striped over them ([`qp`]).
//!
//! **The net plugin "IB"** ([`IbNet`], exported by the cdylib `librustccl_net_ib.so` as
//! `rustccl_net_v2`, with `make_vdevice`, and `rustccl_net_v1`), with NCCL's design:
//! * connection setup over an out-of-band TCP socket ([`oob`], [`wire`]) without blocking:
//!   `connect` returns once the TCP connection is up and its info sent, `accept` once the
//!   peer's info is read and its QPs are ready; a helper thread per connection finishes the
//!   exchange ([`comm::Setup`]);
//! * `NCCL_IB_QPS_PER_CONNECTION` RC queue pairs per physical device taken to RTS with
//!   `NCCL_IB_TIMEOUT`, `_RETRY_CNT`, `_TC`, `_SL`, `_PKEY` ([`qp`], [`settings`]);
//! * registrations through a page-range cache with reference counts ([`mr_cache`]), one MR
//!   per physical device;
//! * the receiver's clear-to-send entries RDMA-written into the sender's FIFO of 32 rows of
//!   8 entries ([`fifo`]), the data RDMA_WRITE_WITH_IMM straight into the receive buffer,
//!   split over the QPs in 128-byte-aligned parts ([`split`]); above `NCCL_IB_AR_THRESHOLD`
//!   with adaptive routing, plain writes then a 0-byte write-with-immediate per QP; `test`
//!   polls the CQs; an error completion or EOF on the out-of-band socket (a dead peer) fails
//!   the connection ([`comm`]);
//! * multi-receive (`max_recvs` 8): a receive of up to 8 tagged buffers takes one FIFO row;
//!   the sends matching its tags go as one bundle whose sizes the sender writes into the
//!   receiver's size records ([`fifo`], [`comm`]);
//! * GPU memory through dma-buf only ([`dmabuf`]): where `NCCL_DMABUF_ENABLE` is not 0 and
//!   the library's `ibv_reg_dmabuf_mr` passes NCCL's probe (fd -1 answers `EBADF`, not
//!   `EOPNOTSUPP`), `properties().ptr_support` is `PTR_HOST | PTR_DEVICE | PTR_DMABUF` and
//!   `reg_mr_dmabuf` registers a dma-buf (cached apart from host registrations of the same
//!   addresses); elsewhere `PTR_HOST`, and device memory is refused with a reason. No
//!   peer-memory (nvidia-peermem) registration;
//! * the flush ([`flush`]): a receiving connection on such a device has a loopback QP, and
//!   `iflush` of a receive into device memory posts a 1-byte RDMA read of it whose
//!   completion completes the request; host memory, or `NCCL_GDR_FLUSH_DISABLE`, has
//!   nothing to flush (`None`). `force_flush` is false;
//! * an async-event thread per opened device ([`async_events`]): a fatal device event fails
//!   the device's connections, a port error the port's, a QP or CQ error the connection that
//!   owns it, each with an error naming the device, the port and the event.
//!
//! # Why a binding of its own
//!
//! The `ibverbs` crate, which the first slice used, lacks what the transport is made of: it
//! has no RDMA write, write-with-immediate or read, and cannot register memory the caller
//! owns; and its build compiles the rdma-core sources it vendors (cmake, libnl, clang). The
//! binding here is a few `#[repr(C)]` structures checked against the C header
//! (`tests/struct_offsets.rs`), functions resolved with dlopen as NCCL does, and verbs.h's
//! inline verbs called through the context's ops table. Nothing RDMA is needed to build the
//! crate, so it is a default workspace member; at run time a machine without libibverbs gets
//! an error saying what to install, and a userspace stand-in can be chosen by path.

pub mod async_events;
pub mod comm;
pub mod device;
pub mod dmabuf;
pub mod fifo;
pub mod flush;
pub mod gid;
pub mod merge;
pub mod mr_cache;
pub mod oob;
pub mod plugin;
pub mod qp;
pub mod settings;
pub mod speed;
pub mod split;
pub mod verbs;
pub mod wire;

use std::path::{Path, PathBuf};

use rustccl_plugin_api::PluginError;

pub use device::{discover, Discovery, HcaFilter, IbDevice, LinkLayer};
pub use plugin::IbNet;
pub use settings::{IbSettings, QpSettings};

rustccl_plugin_api::export_net!(v2, "IB", IbNet, IbNet::new());
rustccl_plugin_api::export_net!(v1, "IB", IbNet, IbNet::new());

/// Where the kernel describes RDMA devices.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// One port of an RDMA device, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPortInfo {
    /// Port number (from 1).
    pub port: u32,
    /// Port state name, e.g. `ACTIVE`, `DOWN`, `INIT`; `None` if unreadable.
    pub state: Option<String>,
    /// Rate in Mbit/s (NCCL's unit for net speed), e.g. 400000 for NDR x4.
    pub speed_mbps: Option<u64>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: Option<String>,
}

/// One RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbDeviceInfo {
    /// Device name, e.g. `mlx5_0`.
    pub name: String,
    /// Node GUID (host byte order), if libibverbs reports one.
    pub guid: Option<u64>,
    /// Ports, by number; empty if sysfs has none for this device.
    pub ports: Vec<IbPortInfo>,
}

impl IbDeviceInfo {
    /// The GUID in the usual `xxxx:xxxx:xxxx:xxxx` form (as `ibv_devinfo` prints).
    pub fn guid_string(&self) -> Option<String> {
        self.guid.map(format_guid)
    }
}

/// Formats a GUID as four groups of four hex digits.
pub fn format_guid(guid: u64) -> String {
    let hex = format!("{guid:016x}");
    format!(
        "{}:{}:{}:{}",
        &hex[0..4],
        &hex[4..8],
        &hex[8..12],
        &hex[12..16]
    )
}

/// The numeric value of a GUID as verbs returns it (`__be64`: network byte order read as a
/// host integer).
pub(crate) fn guid_from_verbs(raw: u64) -> u64 {
    u64::from_be(raw)
}

/// Lists the RDMA devices of this machine through the system's libibverbs (or
/// `NCCL_IBVERBS_LIB`). See the crate documentation.
pub fn list_devices() -> Result<Vec<IbDeviceInfo>, PluginError> {
    let library = std::env::var("NCCL_IBVERBS_LIB").ok();
    list_devices_with(
        verbs::Verbs::get(library.as_deref())?,
        Path::new(SYSFS_INFINIBAND),
    )
}

/// [`list_devices`] with a loaded library and another sysfs directory for the port details.
pub fn list_devices_with(
    lib: &'static verbs::Verbs,
    sysfs: &Path,
) -> Result<Vec<IbDeviceInfo>, PluginError> {
    let list = verbs::DeviceList::get(lib)?;
    let devices = list
        .iter()
        .map(|dev| {
            let name = dev.name();
            let guid = Some(dev.guid()).filter(|&g| g != 0);
            let ports = if name.is_empty() {
                Vec::new()
            } else {
                read_ports(&sysfs.join(&name))
            };
            IbDeviceInfo { name, guid, ports }
        })
        .collect();
    Ok(devices)
}

/// Reads the ports of the device whose sysfs directory is `device_dir`
/// (`<device_dir>/ports/<n>/{state,rate,link_layer}`), sorted by number.
/// Missing or unreadable files leave the field `None`.
pub fn read_ports(device_dir: &Path) -> Vec<IbPortInfo> {
    let Ok(entries) = std::fs::read_dir(device_dir.join("ports")) else {
        return Vec::new();
    };
    let mut ports: Vec<IbPortInfo> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let port = e.file_name().to_str()?.parse::<u32>().ok()?;
            let dir: PathBuf = e.path();
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
            Some(IbPortInfo {
                port,
                state: read("state").and_then(|s| parse_state(&s)),
                speed_mbps: read("rate").and_then(|s| parse_rate_mbps(&s)),
                link_layer: read("link_layer")
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            })
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    ports
}

/// Parses a sysfs port state such as `4: ACTIVE` into `ACTIVE`.
pub fn parse_state(text: &str) -> Option<String> {
    let name = match text.split_once(':') {
        Some((_, name)) => name,
        None => text,
    }
    .trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// Parses a sysfs port rate such as `400 Gb/sec (4X NDR)` or `2.5 Gb/sec (1X SDR)`
/// into Mbit/s.
pub fn parse_rate_mbps(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let scale = match words.next()? {
        "Gb/sec" => 1000.0,
        "Mb/sec" => 1.0,
        _ => return None,
    };
    (number.is_finite() && number >= 0.0).then(|| (number * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_devices_never_panics() {
        // On a machine without RDMA hardware (CI), libibverbs reports either an empty list
        // or an error, and a machine without libibverbs an error saying what to install;
        // each must come back as a value. A stand-in library (NCCL_IBVERBS_LIB) may list
        // devices that sysfs does not know.
        match list_devices() {
            Ok(devices) => {
                let stand_in = std::env::var_os("NCCL_IBVERBS_LIB").is_some();
                if !Path::new(SYSFS_INFINIBAND).is_dir() && !stand_in {
                    assert!(
                        devices.is_empty(),
                        "devices without {SYSFS_INFINIBAND}: {devices:?}"
                    );
                }
                for d in &devices {
                    assert!(!d.name.is_empty());
                }
            }
            Err(e) => {
                assert_eq!(e.code, PluginError::SYSTEM, "{e}");
                assert!(
                    e.message.starts_with("cannot list RDMA devices (")
                        || e.message.contains("libibverbs.so.1 not found (")
                        || e.message.starts_with("NCCL_IBVERBS_LIB="),
                    "{e}"
                );
                assert!(!e.message.contains('\n'));
            }
        }
    }

    #[test]
    fn discovery_without_devices_is_empty_or_a_clear_error() {
        // No RDMA device here (or no library): discover() with every variable unset gives
        // no device, or the library's / listing's error; never a panic.
        let settings = IbSettings::default();
        match discover(&settings) {
            Ok(found) => {
                if !Path::new(SYSFS_INFINIBAND).is_dir()
                    && std::env::var_os("NCCL_IBVERBS_LIB").is_none()
                {
                    assert!(found.devices.is_empty(), "{found:?}");
                }
            }
            Err(e) => {
                assert_eq!(e.code, PluginError::SYSTEM, "{e}");
                assert!(
                    e.message.starts_with("cannot list RDMA devices (")
                        || e.message.contains("not found ("),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn parses_sysfs_values() {
        assert_eq!(parse_state("4: ACTIVE\n").as_deref(), Some("ACTIVE"));
        assert_eq!(parse_state("1: DOWN").as_deref(), Some("DOWN"));
        assert_eq!(parse_state("  \n"), None);
        assert_eq!(parse_rate_mbps("400 Gb/sec (4X NDR)\n"), Some(400_000));
        assert_eq!(parse_rate_mbps("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_rate_mbps("100 Mb/sec"), Some(100));
        assert_eq!(parse_rate_mbps("fast"), None);
        assert_eq!(parse_rate_mbps("10 furlongs"), None);
    }

    #[test]
    fn reads_ports_from_a_sysfs_tree() {
        let dev = std::env::temp_dir().join(format!("rustccl-ib-sysfs-{}", std::process::id()));
        for (port, state, rate, link) in [
            ("2", "1: DOWN\n", "10 Gb/sec (4X SDR)\n", "InfiniBand\n"),
            ("1", "4: ACTIVE\n", "200 Gb/sec (2X HDR)\n", "Ethernet\n"),
        ] {
            let dir = dev.join("ports").join(port);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("state"), state).unwrap();
            std::fs::write(dir.join("rate"), rate).unwrap();
            std::fs::write(dir.join("link_layer"), link).unwrap();
        }
        std::fs::create_dir_all(dev.join("ports").join("3")).unwrap(); // no files
        std::fs::create_dir_all(dev.join("ports").join("not-a-port")).unwrap();
        let ports = read_ports(&dev);
        std::fs::remove_dir_all(&dev).unwrap();
        assert_eq!(
            ports,
            vec![
                IbPortInfo {
                    port: 1,
                    state: Some("ACTIVE".into()),
                    speed_mbps: Some(200_000),
                    link_layer: Some("Ethernet".into()),
                },
                IbPortInfo {
                    port: 2,
                    state: Some("DOWN".into()),
                    speed_mbps: Some(10_000),
                    link_layer: Some("InfiniBand".into()),
                },
                IbPortInfo {
                    port: 3,
                    state: None,
                    speed_mbps: None,
                    link_layer: None
                },
            ]
        );
        assert!(read_ports(Path::new("/nonexistent/rustccl")).is_empty());
    }

    #[test]
    fn guid_conversion_and_format() {
        // ibv_get_device_guid returns the GUID bytes in network order; read as a
        // host integer on a little-endian machine they appear swapped.
        let guid = 0x0002_c903_0032_4f40u64;
        assert_eq!(guid_from_verbs(guid.to_be()), guid);
        assert_eq!(format_guid(guid), "0002:c903:0032:4f40");
        let info = IbDeviceInfo {
            name: "mlx5_0".into(),
            guid: Some(guid),
            ports: vec![],
        };
        assert_eq!(info.guid_string().as_deref(), Some("0002:c903:0032:4f40"));
    }
}

//! The transport's devices, as NCCL makes them: every ACTIVE port whose link layer is
//! InfiniBand or Ethernet (RoCE) is one device, in the library's device order then by port,
//! filtered by `NCCL_IB_HCA` (`[^][=]name[:port],...`: the `NCCL_SOCKET_IFNAME` matcher of
//! `rustccl-netif`, with ports). Each device carries its open context, its speed and, for
//! RoCE, the GID chosen by [`crate::gid`].
//!
//! A device that cannot be opened or queried is skipped with a note (NCCL warns and goes
//! on); the notes are returned for the plugin to log.

use std::path::Path;
use std::sync::Arc;

use rustccl_netif::IfnameSpec;
use rustccl_plugin_api::PluginError;

use crate::gid::{choose_roce_gid_index, GidEntry, GidType};
use crate::merge::PortIdentity;
use crate::settings::IbSettings;
use crate::speed::port_speed_mbps;
use crate::verbs::types::*;
use crate::verbs::{Context, DeviceList, Verbs};
use crate::SYSFS_INFINIBAND;

/// A port's link layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
}

impl LinkLayer {
    /// The link layer of a port that can be a device: ACTIVE, and InfiniBand or Ethernet
    /// (`IBV_LINK_LAYER_UNSPECIFIED`, older InfiniBand-only drivers, counts as InfiniBand).
    pub fn of_usable_port(attr: &ibv_port_attr) -> Option<LinkLayer> {
        if attr.state != IBV_PORT_ACTIVE {
            return None;
        }
        match attr.link_layer {
            IBV_LINK_LAYER_INFINIBAND | IBV_LINK_LAYER_UNSPECIFIED => Some(LinkLayer::InfiniBand),
            IBV_LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }
}

/// `NCCL_IB_HCA`: which device ports are used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter(Option<IfnameSpec>);

impl HcaFilter {
    /// From the variable's value; unset, empty or a lone `^`/`=` selects every port.
    pub fn parse(spec: Option<&str>) -> HcaFilter {
        HcaFilter(spec.map(IfnameSpec::parse).filter(|s| !s.names.is_empty()))
    }

    /// Whether port `port` of device `name` is used.
    pub fn selects(&self, name: &str, port: u32) -> bool {
        self.0.as_ref().is_none_or(|s| s.matches_port(name, port))
    }
}

/// One device: a port of an RDMA device.
#[derive(Clone)]
pub struct IbDevice {
    /// Device name, e.g. `mlx5_0`.
    pub name: String,
    /// Port number (from 1).
    pub port: u8,
    pub link_layer: LinkLayer,
    /// Node GUID (host value).
    pub guid: u64,
    /// System image GUID (host value): one per adapter, what NCCL compares to merge ports.
    pub sys_image_guid: u64,
    /// The device's PCI path in sysfs, or empty ([`pci_path`]).
    pub pci_path: String,
    /// Mbit/s, from the port's width and lane speed.
    pub speed_mbps: u32,
    pub lid: u16,
    /// `IBV_MTU_*` of the port.
    pub active_mtu: u32,
    /// The GID used (index and value): RoCE's chosen one, GID 0 on InfiniBand.
    pub gid_index: u32,
    pub gid: [u8; 16],
    /// Largest number of outstanding work requests per QP.
    pub max_qp_wr: u32,
    /// The open device (shared by its ports).
    pub context: Arc<Context>,
}

impl std::fmt::Debug for IbDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbDevice")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("link_layer", &self.link_layer)
            .field("speed_mbps", &self.speed_mbps)
            .field("gid_index", &self.gid_index)
            .finish_non_exhaustive()
    }
}

impl IbDevice {
    /// What decides whether this port and another are one NIC ([`crate::merge`]).
    pub fn identity(&self) -> PortIdentity {
        PortIdentity {
            pci_path: self.pci_path.clone(),
            sys_image_guid: self.sys_image_guid,
            link_layer: self.link_layer,
        }
    }
}

/// The PCI path of device `name` in sysfs (the real path of its `device` link), or empty.
pub fn pci_path(name: &str) -> String {
    std::fs::canonicalize(Path::new(SYSFS_INFINIBAND).join(name).join("device"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The devices and what was skipped on the way.
#[derive(Debug, Default)]
pub struct Discovery {
    pub devices: Vec<IbDevice>,
    /// One line per device or port skipped for an error.
    pub notes: Vec<String>,
}

/// The devices of this machine under `settings` (see the module doc). An error when
/// `NCCL_IB_DISABLE` is set, the library cannot be loaded or cannot list devices, or a
/// user GID index is outside a port's table; an empty list is not an error.
pub fn discover(settings: &IbSettings) -> Result<Discovery, PluginError> {
    if settings.disable {
        return Err(PluginError::internal(
            "NCCL_IB_DISABLE is set: the InfiniBand/RoCE transport is off; unset it (or set 0) to use it",
        ));
    }
    let verbs = Verbs::get(settings.library.as_deref())?;
    discover_with(verbs, settings)
}

/// [`discover`] with a loaded library.
pub fn discover_with(
    verbs: &'static Verbs,
    settings: &IbSettings,
) -> Result<Discovery, PluginError> {
    let hca = HcaFilter::parse(settings.hca.as_deref());
    let list = DeviceList::get(verbs)?;
    let mut found = Discovery::default();
    for dev in list.iter() {
        let name = dev.name();
        if !(1..=u8::MAX.into()).any(|p| hca.selects(&name, p)) {
            continue;
        }
        let opened = dev
            .open()
            .and_then(|ctx| ctx.query_device().map(|attr| (ctx, attr)));
        let (context, attr) = match opened {
            Ok(pair) => pair,
            Err(e) => {
                found.notes.push(format!("{name} skipped: {}", e.message));
                continue;
            }
        };
        for port in 1..=attr.phys_port_cnt {
            if !hca.selects(&name, port.into()) {
                continue;
            }
            let port_attr = match context.query_port(port) {
                Ok(a) => a,
                Err(e) => {
                    found
                        .notes
                        .push(format!("{name}:{port} skipped: {}", e.message));
                    continue;
                }
            };
            let Some(link_layer) = LinkLayer::of_usable_port(&port_attr) else {
                continue;
            };
            let table_len = u32::try_from(port_attr.gid_tbl_len).unwrap_or(0);
            let gid_index = match link_layer {
                LinkLayer::InfiniBand => 0,
                LinkLayer::Ethernet => {
                    if let Some(i) = settings.gid.index.filter(|&i| i >= table_len) {
                        return Err(PluginError::invalid_argument(format!(
                            "NCCL_IB_GID_INDEX={i} but {name} port {port} has {table_len} GIDs (0 to {}); \
                             pick one that `show_gids` lists or unset it",
                            table_len.saturating_sub(1)
                        )));
                    }
                    let table = read_gid_table(&context, port, table_len);
                    choose_roce_gid_index(&table, table_len, &settings.gid)
                }
            };
            let gid = match context.query_gid(port, gid_index) {
                Ok(g) => g.raw,
                Err(e) => {
                    found
                        .notes
                        .push(format!("{name}:{port} skipped: {}", e.message));
                    continue;
                }
            };
            found.devices.push(IbDevice {
                name: name.clone(),
                port,
                link_layer,
                guid: crate::guid_from_verbs(attr.node_guid),
                sys_image_guid: crate::guid_from_verbs(attr.sys_image_guid),
                pci_path: pci_path(&name),
                speed_mbps: port_speed_mbps(port_attr.active_speed.into(), port_attr.active_width),
                lid: port_attr.lid,
                active_mtu: port_attr.active_mtu,
                gid_index,
                gid,
                max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
                context: Arc::clone(&context),
            });
        }
    }
    Ok(found)
}

/// The GID table of a RoCE port: each entry with its type, through `_ibv_query_gid_ex`
/// where the library has it, else `ibv_query_gid` and sysfs's type file. Unused entries
/// (an error from the library) are left out.
fn read_gid_table(context: &Context, port: u8, table_len: u32) -> Vec<GidEntry> {
    (0..table_len)
        .filter_map(|index| match context.query_gid_entry(port, index) {
            Ok(Some(e)) => Some(GidEntry {
                index,
                gid: e.gid.raw,
                gid_type: GidType::from_verbs(e.gid_type),
            }),
            Ok(None) => {
                let gid = context.query_gid(port, index).ok()?.raw;
                let types = Path::new(SYSFS_INFINIBAND)
                    .join(context.name())
                    .join(format!("ports/{port}/gid_attrs/types/{index}"));
                let gid_type = std::fs::read_to_string(types)
                    .ok()
                    .and_then(|t| GidType::from_sysfs(&t));
                Some(GidEntry {
                    index,
                    gid,
                    gid_type,
                })
            }
            Err(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: u32, link_layer: u8) -> ibv_port_attr {
        ibv_port_attr {
            state,
            link_layer,
            ..Default::default()
        }
    }

    #[test]
    fn only_active_ib_and_ethernet_ports_are_devices() {
        assert_eq!(
            LinkLayer::of_usable_port(&port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND)),
            Some(LinkLayer::InfiniBand)
        );
        assert_eq!(
            LinkLayer::of_usable_port(&port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET)),
            Some(LinkLayer::Ethernet)
        );
        assert_eq!(
            LinkLayer::of_usable_port(&port(IBV_PORT_ACTIVE, IBV_LINK_LAYER_UNSPECIFIED)),
            Some(LinkLayer::InfiniBand)
        );
        assert_eq!(
            LinkLayer::of_usable_port(&port(1, IBV_LINK_LAYER_INFINIBAND)),
            None,
            "DOWN"
        );
        assert_eq!(
            LinkLayer::of_usable_port(&port(2, IBV_LINK_LAYER_ETHERNET)),
            None,
            "INIT"
        );
        assert_eq!(LinkLayer::of_usable_port(&port(IBV_PORT_ACTIVE, 7)), None);
    }

    #[test]
    fn nccl_ib_hca_selects_ports() {
        let all = HcaFilter::parse(None);
        assert!(all.selects("mlx5_0", 1) && all.selects("anything", 2));
        assert!(HcaFilter::parse(Some("")).selects("mlx5_0", 1));
        assert!(HcaFilter::parse(Some("^")).selects("mlx5_0", 1));

        let f = HcaFilter::parse(Some("mlx5_0:1,mlx5_2"));
        assert!(f.selects("mlx5_0", 1) && !f.selects("mlx5_0", 2));
        assert!(f.selects("mlx5_2", 2) && !f.selects("mlx5_1", 1));

        let f = HcaFilter::parse(Some("=mlx5_1"));
        assert!(f.selects("mlx5_1", 1) && !f.selects("mlx5_10", 1));

        let f = HcaFilter::parse(Some("^mlx5_0:2"));
        assert!(f.selects("mlx5_0", 1) && !f.selects("mlx5_0", 2) && f.selects("mlx5_3", 2));
    }

    #[test]
    fn ib_disable_refuses_before_loading_anything() {
        let settings = IbSettings {
            disable: true,
            library: Some("/nonexistent/x.so".into()),
            ..Default::default()
        };
        let e = discover(&settings).unwrap_err();
        assert_eq!(e.code, PluginError::INTERNAL);
        assert!(e.message.starts_with("NCCL_IB_DISABLE is set"), "{e}");
    }
}

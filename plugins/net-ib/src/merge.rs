//! Merged NICs: NCCL's virtual devices over several ports.
//!
//! A dual-port NIC shows up as two ports (or two PCI functions), each a device of its own.
//! NCCL's IB transport fuses the ports that are one NIC into one virtual device named
//! `a+b` whose speed is the sum (`NCCL_IB_MERGE_NICS`, default 1), so that the host sees one
//! device per NIC and a connection stripes its queue pairs over the ports. Its rule, followed
//! here by [`group_ports`]: in discovery order, a port joins the first virtual device that has
//! fewer than [`MAX_DEVS_PER_NIC`] members and whose *first* member is the same NIC, meaning
//!
//! * the same PCI device: the paths agree except for the PCI function digit (ports of one
//!   card), or, with `NCCL_IB_MERGE_VFS` (default 1), except for the device number and
//!   function too (the virtual functions of one card) ([`nic_pci_key`]);
//! * the same system image GUID (one adapter);
//! * the same link layer (InfiniBand and RoCE ports never merge).
//!
//! Otherwise it starts a virtual device of its own. `make_vdevice` ([`check_members`]) fuses
//! any physical devices the host names (different HCAs too), refusing what NCCL refuses.

use rustccl_plugin_api::net::check_vdevice_members;
use rustccl_plugin_api::PluginError;

use crate::device::LinkLayer;
pub use crate::fifo::MAX_DEVS_PER_NIC;

/// `NCCL_IB_MERGE_NICS` and `NCCL_IB_MERGE_VFS`, both on by default as in NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeSettings {
    /// Fuse the ports of one NIC at discovery; off: every port is a device, and
    /// `make_vdevice` refuses more than one member.
    pub nics: bool,
    /// Count virtual functions of one card as one NIC.
    pub vfs: bool,
}

impl Default for MergeSettings {
    fn default() -> Self {
        MergeSettings {
            nics: true,
            vfs: true,
        }
    }
}

/// What NCCL compares to decide whether two ports belong to one NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortIdentity {
    /// The device's PCI path in sysfs (empty when there is none, e.g. on the verbs stand-in).
    pub pci_path: String,
    pub sys_image_guid: u64,
    pub link_layer: LinkLayer,
}

/// The part of a PCI path (`.../0000:17:00.1`) that names the NIC: without the function
/// digit, and with `merge_vfs` without the last four characters (`00.1`: device, dot and
/// function), as NCCL compares them.
pub fn nic_pci_key(path: &str, merge_vfs: bool) -> &str {
    let drop = if merge_vfs { 4 } else { 1 };
    path.get(..path.len().saturating_sub(drop)).unwrap_or("")
}

/// Whether `a` and `b` are ports of one NIC (see the module doc).
pub fn same_nic(a: &PortIdentity, b: &PortIdentity, merge_vfs: bool) -> bool {
    nic_pci_key(&a.pci_path, merge_vfs) == nic_pci_key(&b.pci_path, merge_vfs)
        && a.sys_image_guid == b.sys_image_guid
        && a.link_layer == b.link_layer
}

/// The virtual devices NCCL makes of `ports` (in discovery order): each a list of port
/// indices, in order. Without `settings.nics`, one per port.
pub fn group_ports(ports: &[PortIdentity], settings: MergeSettings) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let joins = settings
            .nics
            .then(|| {
                groups.iter().position(|g| {
                    g.len() < MAX_DEVS_PER_NIC && same_nic(&ports[g[0]], port, settings.vfs)
                })
            })
            .flatten();
        match joins {
            Some(g) => groups[g].push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Checks a `make_vdevice` list of physical device indices against the physical devices'
/// link layers: 1 to [`MAX_DEVS_PER_NIC`] distinct existing devices of one link layer, and
/// one only when `NCCL_IB_MERGE_NICS=0` (NCCL refuses the same). Returns the indices.
pub fn check_members(
    devs: &[i32],
    link_layers: &[LinkLayer],
    settings: MergeSettings,
) -> Result<Vec<usize>, PluginError> {
    check_vdevice_members(devs, link_layers.len() as i32)?;
    if devs.len() > MAX_DEVS_PER_NIC {
        return Err(PluginError::invalid_argument(format!(
            "an IB virtual device fuses at most {MAX_DEVS_PER_NIC} devices, not {}",
            devs.len()
        )));
    }
    if devs.len() > 1 && !settings.nics {
        return Err(PluginError::invalid_usage(
            "NCCL_IB_MERGE_NICS=0: the IB transport does not fuse devices; unset it (or set 1) to make a virtual device of several",
        ));
    }
    let members: Vec<usize> = devs.iter().map(|&d| d as usize).collect();
    let first = link_layers[members[0]];
    if let Some(&other) = members.iter().find(|&&m| link_layers[m] != first) {
        return Err(PluginError::invalid_argument(format!(
            "devices {} ({first:?}) and {other} ({:?}) have different link layers and cannot be fused; \
             select NICs of one link layer (NCCL_IB_HCA)",
            members[0], link_layers[other]
        )));
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(path: &str, guid: u64, link_layer: LinkLayer) -> PortIdentity {
        PortIdentity {
            pci_path: path.into(),
            sys_image_guid: guid,
            link_layer,
        }
    }

    const ETH: LinkLayer = LinkLayer::Ethernet;
    const IB: LinkLayer = LinkLayer::InfiniBand;
    const ON: MergeSettings = MergeSettings {
        nics: true,
        vfs: true,
    };

    #[test]
    fn pci_keys_drop_the_function_or_the_vf_part() {
        let p = "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.1";
        assert_eq!(
            nic_pci_key(p, false),
            "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00."
        );
        assert_eq!(
            nic_pci_key(p, true),
            "/sys/devices/pci0000:16/0000:16:02.0/0000:17:"
        );
        assert_eq!(nic_pci_key("", true), "");
        assert_eq!(nic_pci_key("ab", true), "");
    }

    #[test]
    fn ports_of_one_nic_merge_as_nccl_merges_them() {
        let a = "/sys/devices/pci0000:16/0000:17:00.0";
        let a_fn1 = "/sys/devices/pci0000:16/0000:17:00.1";
        let a_vf = "/sys/devices/pci0000:16/0000:17:01.2";
        let b = "/sys/devices/pci0000:30/0000:31:00.0";
        // Two ports of one device (same path and GUID): one virtual device.
        let dual = [port(a, 1, ETH), port(a, 1, ETH)];
        assert_eq!(group_ports(&dual, ON), vec![vec![0, 1]]);
        // NCCL_IB_MERGE_NICS=0 keeps them apart.
        let off = MergeSettings { nics: false, ..ON };
        assert_eq!(group_ports(&dual, off), vec![vec![0], vec![1]]);
        // Two PCI functions of one card (mlx5_0, mlx5_1 of a dual-port ConnectX).
        assert_eq!(
            group_ports(&[port(a, 1, IB), port(a_fn1, 1, IB)], ON),
            vec![vec![0, 1]]
        );
        // A virtual function merges only with NCCL_IB_MERGE_VFS.
        let vf = [port(a, 1, IB), port(a_vf, 1, IB)];
        assert_eq!(group_ports(&vf, ON), vec![vec![0, 1]]);
        let no_vfs = MergeSettings { vfs: false, ..ON };
        assert_eq!(group_ports(&vf, no_vfs), vec![vec![0], vec![1]]);
        // Another GUID, another PCI device or another link layer: apart.
        for other in [port(a, 2, ETH), port(b, 1, ETH), port(a, 1, IB)] {
            assert_eq!(
                group_ports(&[port(a, 1, ETH), other.clone()], ON),
                vec![vec![0], vec![1]],
                "{other:?}"
            );
        }
        // Interleaved NICs each gather their ports; a port joins the first match.
        let mixed = [
            port(a, 1, ETH),
            port(b, 2, ETH),
            port(a, 1, ETH),
            port(b, 2, ETH),
        ];
        assert_eq!(group_ports(&mixed, ON), vec![vec![0, 2], vec![1, 3]]);
        // At most MAX_DEVS_PER_NIC (4) members: a fifth port starts a new device.
        let five = vec![port(a, 1, ETH); 5];
        assert_eq!(group_ports(&five, ON), vec![vec![0, 1, 2, 3], vec![4]]);
        // The double has no sysfs: empty paths, told apart by GUID.
        assert_eq!(
            group_ports(&[port("", 7, ETH), port("", 8, ETH), port("", 7, ETH)], ON),
            vec![vec![0, 2], vec![1]]
        );
        assert!(group_ports(&[], ON).is_empty());
    }

    #[test]
    fn make_vdevice_lists_are_checked() {
        let links = [ETH, ETH, IB, ETH, ETH, ETH];
        assert_eq!(check_members(&[1, 0], &links, ON).unwrap(), vec![1, 0]);
        assert_eq!(check_members(&[2], &links, ON).unwrap(), vec![2]);
        for (devs, says) in [
            (&[][..], "1 to 8 devices, not 0"),
            (&[0, 6][..], "no physical device 6"),
            (&[-1][..], "no physical device -1"),
            (&[3, 3][..], "listed twice"),
            (&[0, 1, 3, 4, 5][..], "at most 4 devices, not 5"),
            (&[0, 2][..], "different link layers"),
        ] {
            let e = check_members(devs, &links, ON).unwrap_err();
            assert_eq!(e.code, PluginError::INVALID_ARGUMENT, "{devs:?}: {e}");
            assert!(e.message.contains(says), "{devs:?}: {e}");
        }
        let off = MergeSettings { nics: false, ..ON };
        let e = check_members(&[0, 1], &links, off).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_USAGE);
        assert!(e.message.contains("NCCL_IB_MERGE_NICS=0"), "{e}");
        assert_eq!(check_members(&[1], &links, off).unwrap(), vec![1]);
    }
}

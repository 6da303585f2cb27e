//! The plugin's devices: one per usable network interface, chosen with the bootstrap's rules
//! (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`; see `rustccl-netif`) but keeping every
//! interface that qualifies instead of the first one, up to [`MAX_DEVICES`].
//!
//! Without `NCCL_SOCKET_IFNAME`: every interface that is up and neither loopback nor
//! `docker*`; if there is none, the `docker*` ones; if none, loopback. With it: every
//! interface that is up and matches (an error when none does).

use std::net::IpAddr;
use std::path::Path;

use rustccl_netif::{Family, IfnameSpec, Interface};

/// Most devices the plugin reports (NCCL's socket plugin limit).
pub const MAX_DEVICES: usize = 16;

/// Link speed reported when sysfs does not say (Mbit/s).
pub const DEFAULT_SPEED_MBPS: u32 = 10_000;

/// One device: an interface and the address the plugin listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub addr: IpAddr,
    /// Real sysfs path of the interface's device (`/sys/devices/pci...`), empty when virtual.
    pub pci_path: String,
    pub speed_mbps: u32,
}

impl Device {
    /// The device for `iface`, with its PCI path and speed read from `/sys/class/net`.
    pub fn from_interface(iface: &Interface) -> Device {
        let dir = Path::new("/sys/class/net").join(&iface.name);
        let pci_path = std::fs::canonicalize(dir.join("device"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let speed = std::fs::read_to_string(dir.join("speed")).ok();
        Device {
            name: iface.name.clone(),
            addr: iface.addr,
            pci_path,
            speed_mbps: parse_speed(speed.as_deref()),
        }
    }
}

/// The speed in `/sys/class/net/<if>/speed` (Mbit/s); virtual interfaces report -1 or
/// nothing, which gives [`DEFAULT_SPEED_MBPS`].
pub fn parse_speed(text: Option<&str>) -> u32 {
    text.and_then(|t| t.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_SPEED_MBPS, |s| s.min(u32::MAX as i64) as u32)
}

/// The interfaces that become devices, one entry per interface name (its first IPv4
/// address, else its first IPv6 one, unless `family` says which), in the system's order.
pub fn select(
    ifaces: &[Interface],
    spec: Option<&str>,
    family: Option<Family>,
) -> Result<Vec<Interface>, String> {
    let is_v4 = |i: &Interface| i.addr.is_ipv4();
    let usable: Vec<&Interface> = ifaces
        .iter()
        .filter(|i| i.up && i.running)
        .filter(|i| match family {
            Some(Family::V4) => is_v4(i),
            Some(Family::V6) => !is_v4(i),
            None => true,
        })
        .collect();
    let tier =
        |keep: &dyn Fn(&Interface) -> bool| -> Vec<Interface> { one_per_name(&usable, keep) };

    let chosen = match spec.map(str::trim).filter(|s| !s.is_empty()) {
        Some(spec) => {
            let parsed = IfnameSpec::parse(spec);
            let chosen = tier(&|i| parsed.matches(&i.name));
            if chosen.is_empty() {
                return Err(format!(
                    "NCCL_SOCKET_IFNAME={spec} matches no interface that is up{}",
                    family_text(family)
                ));
            }
            chosen
        }
        None => {
            let is_docker = |i: &Interface| i.name.starts_with("docker");
            let is_loopback = |i: &Interface| i.loopback || i.name.starts_with("lo");
            let mut chosen = tier(&|i| !is_docker(i) && !is_loopback(i));
            if chosen.is_empty() {
                chosen = tier(&|i| is_docker(i) && !i.loopback);
            }
            if chosen.is_empty() {
                chosen = tier(&is_loopback);
            }
            if chosen.is_empty() {
                return Err(format!("no network interface is up{}", family_text(family)));
            }
            chosen
        }
    };
    Ok(chosen.into_iter().take(MAX_DEVICES).collect())
}

fn family_text(family: Option<Family>) -> &'static str {
    match family {
        Some(Family::V4) => " with an IPv4 address",
        Some(Family::V6) => " with an IPv6 address",
        None => "",
    }
}

/// The interfaces of `usable` that `keep` accepts, one per name: IPv4 preferred.
fn one_per_name(usable: &[&Interface], keep: &dyn Fn(&Interface) -> bool) -> Vec<Interface> {
    let mut out: Vec<Interface> = Vec::new();
    for iface in usable.iter().copied().filter(|i| keep(i)) {
        match out.iter_mut().find(|o| o.name == iface.name) {
            Some(existing) => {
                if !existing.addr.is_ipv4() && iface.addr.is_ipv4() {
                    *existing = iface.clone();
                }
            }
            None => out.push(iface.clone()),
        }
    }
    out
}

/// The devices of this machine, from the environment's `NCCL_SOCKET_IFNAME` / family choice.
pub fn discover(spec: Option<&str>, family: Option<Family>) -> Result<Vec<Device>, String> {
    let ifaces = rustccl_netif::list_interfaces().map_err(|e| e.message)?;
    let chosen = select(&ifaces, spec, family).map_err(|e| {
        let seen: Vec<String> = ifaces.iter().map(|i| i.to_string()).collect();
        format!(
            "{e}; interfaces seen: {}",
            if seen.is_empty() {
                "none".into()
            } else {
                seen.join(", ")
            }
        )
    })?;
    Ok(chosen.iter().map(Device::from_interface).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, up: bool) -> Interface {
        let addr: IpAddr = addr.parse().unwrap();
        Interface {
            name: name.into(),
            addr,
            up,
            running: up,
            loopback: addr.is_loopback(),
        }
    }

    fn names(v: Result<Vec<Interface>, String>) -> Vec<(String, String)> {
        v.unwrap()
            .into_iter()
            .map(|i| (i.name, i.addr.to_string()))
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn default_rules_keep_every_real_interface() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("eth0", "2001:db8::1", true),
            iface("docker0", "172.17.0.1", true),
            iface("eth0", "10.0.0.1", true),
            iface("eth1", "10.0.1.1", false),
            iface("ib0", "192.168.0.1", true),
        ];
        assert_eq!(
            names(select(&ifaces, None, None)),
            pairs(&[("eth0", "10.0.0.1"), ("ib0", "192.168.0.1")])
        );
        assert_eq!(
            names(select(&ifaces, None, Some(Family::V6))),
            pairs(&[("eth0", "2001:db8::1")])
        );
        // Then docker, then loopback.
        assert_eq!(
            names(select(&ifaces[..3], None, Some(Family::V4))),
            pairs(&[("docker0", "172.17.0.1")])
        );
        assert_eq!(
            names(select(&ifaces[..1], None, None)),
            pairs(&[("lo", "127.0.0.1")])
        );
        let err = select(&ifaces[4..5], None, None).unwrap_err();
        assert!(err.contains("no network interface is up"), "{err}");
    }

    #[test]
    fn spec_selects_and_excludes() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("eth0", "10.0.0.1", true),
            iface("eth10", "10.0.10.1", true),
            iface("ib0", "192.168.0.1", true),
        ];
        assert_eq!(names(select(&ifaces, Some("eth"), None)).len(), 2);
        assert_eq!(
            names(select(&ifaces, Some("=eth0"), None)),
            pairs(&[("eth0", "10.0.0.1")])
        );
        assert_eq!(
            names(select(&ifaces, Some("^eth,lo"), None)),
            pairs(&[("ib0", "192.168.0.1")])
        );
        assert_eq!(
            names(select(&ifaces, Some("lo"), None)),
            pairs(&[("lo", "127.0.0.1")])
        );
        let err = select(&ifaces, Some("enp"), Some(Family::V6)).unwrap_err();
        assert!(
            err.contains("NCCL_SOCKET_IFNAME=enp") && err.contains("IPv6"),
            "{err}"
        );
        let many: Vec<Interface> = (0..20)
            .map(|n| iface(&format!("eth{n}"), "10.0.0.1", true))
            .collect();
        assert_eq!(select(&many, None, None).unwrap().len(), MAX_DEVICES);
    }

    #[test]
    fn speeds_parse() {
        assert_eq!(parse_speed(Some("25000\n")), 25000);
        assert_eq!(parse_speed(Some("-1\n")), DEFAULT_SPEED_MBPS);
        assert_eq!(parse_speed(Some("garbage")), DEFAULT_SPEED_MBPS);
        assert_eq!(parse_speed(None), DEFAULT_SPEED_MBPS);
    }

    #[test]
    fn this_machine_has_a_device() {
        let devs = discover(None, None).unwrap();
        assert!(!devs.is_empty());
        let lo = discover(Some("lo"), Some(Family::V4)).unwrap();
        assert_eq!(lo[0].addr, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(lo[0].pci_path, "", "loopback is virtual");
    }
}

//! Virtual devices (NIC fusion) of NCCL C net plugins, v9+.
//!
//! NCCL fuses physical NICs into virtual ones through the plugin's `makeVDevice`: the new
//! device gets the next index, `devices` counts it, and its properties list its members
//! (`vProps`); from then on NCCL's topology uses the virtual device and drops its members. The
//! fusion is done once per plugin and process.
//!
//! rustccl does the same inside [`CNet`]: after the plugin's first `init`, it reads
//! `NCCL_NET_FORCE_MERGE` (NCCL's syntax: groups separated by `;`, each a `,`-separated list of
//! device names, a name optionally `name:port`; names match exactly), asks the plugin for one
//! virtual device per group of two or more, and from then on presents through the `Net` trait
//! only the devices the transport should use: the virtual devices first (so the transport's
//! device 0 is the first of them), then the physical devices no group took. A spec that names
//! an unknown device, a device twice, or too many devices, a plugin that cannot fuse (no
//! `makeVDevice`: NULL, or an ABI older than v9), or a `makeVDevice` that fails, gets one
//! warning and the plugin's own devices, unmerged.
//!
//! `NCCL_NET_MERGE_LEVEL` (NCCL: fuse automatically the devices at most that topological
//! distance apart, `PORT` by default, `LOC` to disable) has no counterpart: rustccl has no PCI
//! topology of host networks, so it never fuses automatically (as `LOC`); setting it gets one
//! INFO line saying so.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rustccl_plugin_api::PluginError;

use super::tables::MakeVDev;
use super::{lock, CNet};
use crate::params;

/// The devices a plugin presents: at each `Net` device number, the plugin's device index.
pub type DeviceMap = Arc<Vec<i32>>;

/// Per plugin table (by address) and process: its device map, fixed at its first `init`.
static MAPS: Mutex<BTreeMap<usize, DeviceMap>> = Mutex::new(BTreeMap::new());

pub const FORCE_MERGE: &str = "NCCL_NET_FORCE_MERGE";
const MERGE_LEVEL: &str = "NCCL_NET_MERGE_LEVEL";

/// The groups of device indices `spec` asks to fuse, given the devices' (name, port); groups
/// of one device are dropped (nothing to fuse, as NCCL does). An error says what is wrong.
pub fn plan(spec: &str, devices: &[(String, i32)], max_per_device: usize) -> Result<Vec<Vec<i32>>, String> {
    let mut groups = Vec::new();
    let mut taken = vec![false; devices.len()];
    for group in spec.split(';').map(str::trim).filter(|g| !g.is_empty()) {
        let mut members = Vec::new();
        for entry in group.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, port) = match entry.rsplit_once(':') {
                Some((n, p)) => (n, Some(p.parse::<i32>().map_err(|_| format!("\"{entry}\": the port after ':' is not a number"))?)),
                None => (entry, None),
            };
            let found = devices
                .iter()
                .position(|(n, p)| n == name && port.map_or(true, |want| want == *p))
                .ok_or_else(|| format!("no device is named \"{entry}\""))?;
            if taken[found] {
                return Err(format!("device \"{entry}\" is named twice"));
            }
            taken[found] = true;
            members.push(found as i32);
        }
        if members.len() > max_per_device {
            return Err(format!("group \"{group}\" has {} devices; a virtual device fuses at most {max_per_device}", members.len()));
        }
        if members.len() > 1 {
            groups.push(members);
        }
    }
    Ok(groups)
}

impl CNet {
    /// The devices this plugin presents, fused as `NCCL_NET_FORCE_MERGE` asks the first time
    /// (once per process); call after the plugin's `init`.
    pub(super) fn device_map(&self) -> Result<DeviceMap, PluginError> {
        let mut maps = lock(&MAPS);
        if let Some(m) = maps.get(&self.table_addr) {
            return Ok(Arc::clone(m));
        }
        let map = Arc::new(self.fuse()?);
        maps.insert(self.table_addr, Arc::clone(&map));
        Ok(map)
    }

    fn fuse(&self) -> Result<Vec<i32>, PluginError> {
        let n = self.plugin_devices()?;
        let physical: Vec<i32> = (0..n).collect();
        if let Some(level) = params::env_str(MERGE_LEVEL) {
            tracing::info!(
                target: "NET",
                "NET/{}: {MERGE_LEVEL}={level} has no effect: rustccl has no PCI topology of host networks and never fuses \
                 devices automatically; name the devices to fuse in {FORCE_MERGE}",
                self.name
            );
        }
        let Some(spec) = params::env_str(FORCE_MERGE) else { return Ok(physical) };
        let unmerged = format!("running on its {n} device(s) unmerged");
        let max = match self.fns.make_vdevice {
            None => {
                let why = if self.fns.version < 9 {
                    format!("NCCL C net ABI v{} predates makeVDevice", self.fns.version)
                } else {
                    format!("its ncclNetPlugin_v{} table's makeVDevice is NULL", self.fns.version)
                };
                tracing::warn!(target: "NET", "NET/{}: {FORCE_MERGE}={spec} is ignored: this plugin cannot fuse devices ({why}); {unmerged}", self.name);
                return Ok(physical);
            }
            Some(MakeVDev::V9(_)) => 4,
            Some(MakeVDev::V12(_)) => 8,
        };
        let mut named = Vec::with_capacity(physical.len());
        for &d in &physical {
            let p = self.props(d)?;
            named.push((p.props.name.to_string(), p.props.port));
        }
        let groups = match plan(&spec, &named, max) {
            Ok(g) => g,
            Err(why) => {
                let list: Vec<String> = named.iter().map(|(name, port)| format!("{name}:{port}")).collect();
                tracing::warn!(
                    target: "NET",
                    "NET/{}: {FORCE_MERGE}={spec} is ignored: {why} (its devices, name:port, are {}); {unmerged}",
                    self.name,
                    list.join(", ")
                );
                return Ok(physical);
            }
        };
        if groups.is_empty() {
            return Ok(physical);
        }
        let mut map = Vec::new();
        let mut described = Vec::new();
        for g in &groups {
            let v = match self.make_virtual_device(g) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(target: "NET", "NET/{}: {FORCE_MERGE}={spec}: {}; {unmerged}", self.name, e.message);
                    return Ok(physical);
                }
            };
            let p = self.props(v)?;
            let members: Vec<String> = g.iter().map(|&d| format!("{d} '{}'", named[d as usize].0)).collect();
            described.push(format!(
                "virtual device {v} '{}' of devices {} (its vProps list {:?})",
                p.props.name,
                members.join(", "),
                p.members
            ));
            map.push(v);
        }
        map.extend(physical.iter().filter(|d| !groups.iter().any(|g| g.contains(d))));
        tracing::info!(
            target: "NET",
            "NET/{}: {FORCE_MERGE}={spec}: made {}; the network's devices are now the plugin's {:?}",
            self.name,
            described.join("; "),
            map
        );
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::plan;

    fn devs() -> Vec<(String, i32)> {
        vec![("lo".into(), 0), ("ctcp-lo".into(), 0), ("mlx5_0".into(), 1), ("mlx5_0".into(), 2)]
    }

    #[test]
    fn groups_are_split_by_semicolons_and_names_by_commas() {
        assert_eq!(plan("lo,ctcp-lo", &devs(), 4).unwrap(), vec![vec![0, 1]]);
        assert_eq!(plan(" lo , ctcp-lo ; mlx5_0:1,mlx5_0:2 ;", &devs(), 4).unwrap(), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(plan("lo", &devs(), 4).unwrap(), Vec::<Vec<i32>>::new(), "one device: nothing to fuse");
    }

    #[test]
    fn bad_specs_say_why() {
        assert!(plan("lo,eth9", &devs(), 4).unwrap_err().contains("no device is named \"eth9\""));
        assert!(plan("lo,lo", &devs(), 4).unwrap_err().contains("named twice"));
        assert!(plan("lo;lo,ctcp-lo", &devs(), 4).unwrap_err().contains("named twice"));
        assert!(plan("lo,ctcp-lo:x", &devs(), 4).unwrap_err().contains("not a number"));
        assert!(plan("mlx5_0:3,lo", &devs(), 4).unwrap_err().contains("mlx5_0:3"));
        assert!(plan("lo,ctcp-lo,mlx5_0:1", &devs(), 2).unwrap_err().contains("at most 2"));
    }
}

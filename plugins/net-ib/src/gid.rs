//! Which GID of a RoCE port the transport uses, as NCCL chooses it.
//!
//! `NCCL_IB_GID_INDEX` wins when set. Otherwise the scan starts at index 0 and walks the
//! table: an entry of the wanted address family (`NCCL_IB_ADDR_FAMILY`, IPv4 by default)
//! inside `NCCL_IB_ADDR_RANGE` replaces a current choice of the other family; among entries
//! of the wanted family, a configured, non-link-local one of RoCE version
//! `NCCL_IB_ROCE_VERSION_NUM` (2 by default) replaces a current choice of another version
//! or an unusable one. IB ports use GID 0 (routing is by LID).
//!
//! Pure functions over a table of (index, bytes, type), so the rules are tested without a
//! library.

use std::net::IpAddr;

use rustccl_netif::Family;

/// The type of a GID entry (`ibv_gid_entry.gid_type`, or sysfs
/// `ports/<p>/gid_attrs/types/<i>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// IB, or RoCE v1 (sysfs says `IB/RoCE v1` for both).
    IbOrRoceV1,
    RoceV2,
}

impl GidType {
    /// From the `gid_type` of `_ibv_query_gid_ex` (`IBV_GID_TYPE_*`).
    pub fn from_verbs(gid_type: u32) -> Option<GidType> {
        match gid_type {
            0 | 1 => Some(GidType::IbOrRoceV1),
            2 => Some(GidType::RoceV2),
            _ => None,
        }
    }

    /// From the text of sysfs `gid_attrs/types/<i>` (`IB/RoCE v1`, `RoCE v1`, `RoCE v2`).
    pub fn from_sysfs(text: &str) -> Option<GidType> {
        let text = text.trim();
        if text.starts_with("IB/RoCE v1") || text.starts_with("RoCE v1") {
            Some(GidType::IbOrRoceV1)
        } else if text.starts_with("RoCE v2") {
            Some(GidType::RoceV2)
        } else {
            None
        }
    }

    /// The RoCE version number `NCCL_IB_ROCE_VERSION_NUM` compares with.
    pub fn roce_version(self) -> u32 {
        match self {
            GidType::IbOrRoceV1 => 1,
            GidType::RoceV2 => 2,
        }
    }
}

/// One GID table entry. An index missing from a table reads as an unused (all-zero) entry
/// of unknown type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub gid_type: Option<GidType>,
}

/// An address range (`NCCL_IB_ADDR_RANGE`, e.g. `10.0.0.0/16` or `fd00::/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrRange {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl AddrRange {
    /// Parses `addr/len` of `family`; the message says what is wrong.
    pub fn parse(text: &str, family: Family) -> Result<AddrRange, String> {
        let (addr, len) = text
            .trim()
            .split_once('/')
            .ok_or("expected address/prefix-length, e.g. 10.0.0.0/16")?;
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = match (addr, family) {
            (IpAddr::V4(_), Family::V4) => 32,
            (IpAddr::V6(_), Family::V6) => 128,
            _ => {
                return Err(format!(
                    "{addr} is not of NCCL_IB_ADDR_FAMILY ({})",
                    family_name(family)
                ))
            }
        };
        let prefix_len: u8 = len
            .trim()
            .parse()
            .ok()
            .filter(|&l| l <= max)
            .ok_or_else(|| format!("prefix length {len:?} is not 0 to {max}"))?;
        Ok(AddrRange { addr, prefix_len })
    }

    /// Whether the first `prefix_len` bits of `bytes` are the range's.
    fn contains(&self, bytes: &[u8]) -> bool {
        let prefix: Vec<u8> = match self.addr {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let (whole, bits) = (usize::from(self.prefix_len / 8), self.prefix_len % 8);
        if bytes.len() < prefix.len() || bytes[..whole] != prefix[..whole] {
            return false;
        }
        bits == 0 || {
            let mask = 0xffu8 << (8 - bits);
            bytes[whole] & mask == prefix[whole] & mask
        }
    }
}

/// `AF_INET` / `AF_INET6`, as the variables spell them.
pub fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "AF_INET",
        Family::V6 => "AF_INET6",
    }
}

/// What decides the GID: the values of the `NCCL_IB_*` variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidConfig {
    /// `NCCL_IB_GID_INDEX` (unset or negative: `None`, scan).
    pub index: Option<u32>,
    /// `NCCL_IB_ADDR_FAMILY` (default IPv4).
    pub family: Family,
    /// `NCCL_IB_ADDR_RANGE` (default: any).
    pub range: Option<AddrRange>,
    /// `NCCL_IB_ROCE_VERSION_NUM` (default 2).
    pub roce_version: u32,
}

impl Default for GidConfig {
    fn default() -> GidConfig {
        GidConfig {
            index: None,
            family: Family::V4,
            range: None,
            roce_version: 2,
        }
    }
}

/// The family of a GID: IPv4 for IPv4-mapped `::ffff:a.b.c.d` (and its multicast form
/// `ff0e::ffff:a.b.c.d`), else IPv6.
pub fn family_of(gid: &[u8; 16]) -> Family {
    let mapped_tail = gid[8..10] == [0, 0] && gid[10..12] == [0xff, 0xff];
    let mapped = gid[..8] == [0; 8] && mapped_tail;
    let mapped_multicast = gid[..4] == [0xff, 0x0e, 0, 0] && gid[4..8] == [0; 4] && mapped_tail;
    if mapped || mapped_multicast {
        Family::V4
    } else {
        Family::V6
    }
}

/// `fe80::/64`, the link-local prefix.
pub fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
}

/// Whether an address was configured: not all-zero, and not `fe80::` with a zero interface.
pub fn is_configured(gid: &[u8; 16]) -> bool {
    let tail_zero = gid[4..] == [0; 12];
    !(tail_zero && (gid[..4] == [0; 4] || gid[..4] == [0xfe, 0x80, 0, 0]))
}

/// Configured and not link-local: a GID that routes.
pub fn is_usable(gid: &[u8; 16]) -> bool {
    is_configured(gid) && !is_link_local(gid)
}

/// Whether `gid` lies in `range` (no range: always). The IPv4 address of a mapped GID is
/// its last 4 bytes.
fn in_range(gid: &[u8; 16], family: Family, range: Option<&AddrRange>) -> bool {
    match (range, family) {
        (None, _) => true,
        (Some(r), Family::V4) => r.contains(&gid[12..]),
        (Some(r), Family::V6) => r.contains(gid),
    }
}

/// The GID index NCCL's rules give for a RoCE port whose table has `table_len` entries;
/// `table` lists the entries read (others count as unused). See the module doc.
pub fn choose_roce_gid_index(table: &[GidEntry], table_len: u32, config: &GidConfig) -> u32 {
    if let Some(index) = config.index {
        return index;
    }
    let entry = |index: u32| {
        table
            .iter()
            .find(|e| e.index == index)
            .copied()
            .unwrap_or(GidEntry {
                index,
                gid: [0; 16],
                gid_type: None,
            })
    };
    let mut chosen = entry(0);
    for index in 1..table_len {
        let candidate = entry(index);
        let family = family_of(&candidate.gid);
        let in_range = in_range(&candidate.gid, config.family, config.range.as_ref());
        if family != family_of(&chosen.gid) && family == config.family && in_range {
            chosen = candidate;
            continue;
        }
        if family != config.family || !is_usable(&candidate.gid) || !in_range {
            continue;
        }
        let version = |e: &GidEntry| e.gid_type.map(GidType::roce_version);
        let wanted = version(&candidate) == Some(config.roce_version);
        if wanted && (version(&chosen) != version(&candidate) || !is_usable(&chosen.gid)) {
            chosen = candidate;
        }
    }
    chosen.index
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn link_local() -> [u8; 16] {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0x0a, 0xc0, 0xeb, 0xff, 0xfe, 0x3d, 0xca, 0x54]);
        g
    }

    fn v6(first: u16) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&first.to_be_bytes());
        g[15] = 1;
        g
    }

    fn e(index: u32, gid: [u8; 16], t: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type: Some(t),
        }
    }

    use GidType::{IbOrRoceV1 as V1, RoceV2 as V2};

    /// The usual mlx5 RoCE table: link-local v1/v2, IPv4 v1/v2, IPv6 v1/v2.
    fn mlx5_table() -> Vec<GidEntry> {
        vec![
            e(0, link_local(), V1),
            e(1, link_local(), V2),
            e(2, v4([10, 110, 0, 33]), V1),
            e(3, v4([10, 110, 0, 33]), V2),
            e(4, v6(0xfd00), V1),
            e(5, v6(0xfd00), V2),
        ]
    }

    #[test]
    fn default_is_ipv4_roce_v2() {
        assert_eq!(
            choose_roce_gid_index(&mlx5_table(), 6, &GidConfig::default()),
            3
        );
    }

    #[test]
    fn roce_version_and_family_choose_among_entries() {
        let v1 = GidConfig {
            roce_version: 1,
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&mlx5_table(), 6, &v1), 2);
        let ipv6 = GidConfig {
            family: Family::V6,
            ..GidConfig::default()
        };
        assert_eq!(
            choose_roce_gid_index(&mlx5_table(), 6, &ipv6),
            5,
            "link-local v2 (1) skipped"
        );
        let ipv6_v1 = GidConfig {
            family: Family::V6,
            roce_version: 1,
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&mlx5_table(), 6, &ipv6_v1), 4);
    }

    #[test]
    fn the_user_index_wins() {
        let cfg = GidConfig {
            index: Some(1),
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&mlx5_table(), 6, &cfg), 1);
    }

    #[test]
    fn the_range_filters_addresses() {
        let mut table = mlx5_table();
        table.push(e(6, v4([192, 168, 7, 2]), V1));
        table.push(e(7, v4([192, 168, 7, 2]), V2));
        let range = AddrRange::parse("192.168.0.0/16", Family::V4).unwrap();
        let cfg = GidConfig {
            range: Some(range),
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&table, 8, &cfg), 7);
        let narrow = AddrRange::parse("10.110.0.32/31", Family::V4).unwrap();
        let cfg = GidConfig {
            range: Some(narrow),
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&table, 8, &cfg), 3);
        let none = AddrRange::parse("172.16.0.0/12", Family::V4).unwrap();
        let cfg = GidConfig {
            range: Some(none),
            ..GidConfig::default()
        };
        assert_eq!(
            choose_roce_gid_index(&table, 8, &cfg),
            0,
            "nothing fits: index 0 stays"
        );
    }

    #[test]
    fn unused_and_link_local_entries_are_skipped() {
        // Only link-local and empty entries of the wanted version: index 0 stays.
        let table = [
            e(0, link_local(), V1),
            e(1, link_local(), V2),
            e(2, [0; 16], V2),
        ];
        assert_eq!(choose_roce_gid_index(&table, 3, &GidConfig::default()), 0);
        // The same for IPv6: link-local v2 (1) and the unused entry (2) are not taken.
        let ipv6 = GidConfig {
            family: Family::V6,
            ..GidConfig::default()
        };
        assert_eq!(choose_roce_gid_index(&table, 3, &ipv6), 0);
        // Entries beyond what was read count as unused.
        assert_eq!(
            choose_roce_gid_index(&mlx5_table()[..2], 6, &GidConfig::default()),
            0
        );
        // A stand-in with one IPv4 RoCE v2 GID at 0.
        assert_eq!(
            choose_roce_gid_index(&[e(0, v4([10, 0, 0, 1]), V2)], 1, &GidConfig::default()),
            0
        );
        // IPv4 only at v1 and the user wants v2: the first IPv4 entry still beats IPv6.
        let table = [e(0, link_local(), V1), e(1, v4([10, 0, 0, 1]), V1)];
        assert_eq!(choose_roce_gid_index(&table, 2, &GidConfig::default()), 1);
    }

    #[test]
    fn gid_classes() {
        assert_eq!(family_of(&v4([10, 0, 0, 1])), Family::V4);
        let mut mcast = v4([239, 0, 0, 1]);
        mcast[0] = 0xff;
        mcast[1] = 0x0e;
        assert_eq!(family_of(&mcast), Family::V4);
        assert_eq!(family_of(&link_local()), Family::V6);
        assert_eq!(family_of(&[0; 16]), Family::V6);
        assert!(is_link_local(&link_local()) && !is_usable(&link_local()));
        assert!(!is_configured(&[0; 16]));
        let mut bare_fe80 = [0u8; 16];
        bare_fe80[..2].copy_from_slice(&[0xfe, 0x80]);
        assert!(!is_configured(&bare_fe80));
        assert!(is_usable(&v4([10, 0, 0, 1])) && is_usable(&v6(0xfd00)));
    }

    #[test]
    fn types_and_ranges_parse() {
        assert_eq!(GidType::from_sysfs("IB/RoCE v1\n"), Some(V1));
        assert_eq!(GidType::from_sysfs("RoCE v2\n"), Some(V2));
        assert_eq!(GidType::from_sysfs(""), None);
        assert_eq!(GidType::from_verbs(0), Some(V1));
        assert_eq!(GidType::from_verbs(2), Some(V2));
        assert_eq!(GidType::from_verbs(7), None);
        assert!(AddrRange::parse("10.0.0.0", Family::V4)
            .unwrap_err()
            .contains("address/prefix-length"));
        assert!(AddrRange::parse("10.0.0.0/33", Family::V4)
            .unwrap_err()
            .contains("0 to 32"));
        assert!(AddrRange::parse("fd00::/64", Family::V4)
            .unwrap_err()
            .contains("AF_INET"));
        assert!(AddrRange::parse("fd00::/64", Family::V6).is_ok());
    }
}

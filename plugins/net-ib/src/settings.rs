//! The `NCCL_*` variables that decide which devices the transport uses and how, read
//! through a lookup (name → value) so that the host's parameter resolution (env plugin,
//! config file) applies, as for the socket plugin.

use rustccl_netif::Family;
use rustccl_plugin_api::PluginError;

use crate::gid::{AddrRange, GidConfig};
use crate::merge::MergeSettings;

/// What the device choice depends on.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IbSettings {
    /// `NCCL_IB_DISABLE` non-zero: the transport reports no device and refuses to start.
    pub disable: bool,
    /// `NCCL_IB_HCA`: `[^][=]name[:port],...` (unset: every active port).
    pub hca: Option<String>,
    /// `NCCL_IB_GID_INDEX`, `NCCL_IB_ADDR_FAMILY`, `NCCL_IB_ADDR_RANGE`,
    /// `NCCL_IB_ROCE_VERSION_NUM`.
    pub gid: GidConfig,
    /// `NCCL_IBVERBS_LIB`: the libibverbs to load (unset: `libibverbs.so.1`).
    pub library: Option<String>,
    /// How connections set up their queue pairs.
    pub qp: QpSettings,
    /// `NCCL_IB_MERGE_NICS`, `NCCL_IB_MERGE_VFS`: which ports become one device.
    pub merge: MergeSettings,
    /// GPU memory: dma-buf registration and the flush.
    pub gpu: GpuSettings,
}

/// `NCCL_DMABUF_ENABLE` and `NCCL_GDR_FLUSH_DISABLE`, with NCCL's defaults (see
/// [`crate::dmabuf`] and [`crate::flush`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSettings {
    /// `NCCL_DMABUF_ENABLE` (1): offer dma-buf registration where the library and device
    /// support it.
    pub dmabuf_enable: bool,
    /// `NCCL_GDR_FLUSH_DISABLE` (0): non-zero (as NCCL) gives receiving connections no flush
    /// QP, and `iflush` answers "nothing to flush".
    pub flush_disable: bool,
}

impl Default for GpuSettings {
    fn default() -> Self {
        GpuSettings {
            dmabuf_enable: true,
            flush_disable: false,
        }
    }
}

/// The queue-pair and data-path variables (`NCCL_IB_QPS_PER_CONNECTION`, `_TIMEOUT`,
/// `_RETRY_CNT`, `_TC`, `_SL`, `_PKEY`, `_ADAPTIVE_ROUTING`, `_AR_THRESHOLD`), with NCCL's
/// defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpSettings {
    /// RC queue pairs per connection; a message is split over them.
    pub qps_per_connection: usize,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Retransmissions before a send fails.
    pub retry_cnt: u8,
    /// Traffic class of the GRH (RoCE).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Partition key index.
    pub pkey_index: u16,
    /// `NCCL_IB_ADAPTIVE_ROUTING`: `None` = NCCL's default (on for InfiniBand, off for
    /// RoCE; see [`crate::split::adaptive_routing_threshold`]).
    pub adaptive_routing: Option<bool>,
    /// `NCCL_IB_AR_THRESHOLD`: messages larger than this use the adaptive-routing posting.
    pub ar_threshold: usize,
}

/// Most queue pairs per connection (NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS: usize = 128;

impl Default for QpSettings {
    fn default() -> Self {
        QpSettings {
            qps_per_connection: 1,
            timeout: 20,
            retry_cnt: 7,
            traffic_class: 0,
            service_level: 0,
            pkey_index: 0,
            adaptive_routing: None,
            ar_threshold: 8192,
        }
    }
}

impl IbSettings {
    /// From the process environment.
    pub fn from_env() -> Result<IbSettings, PluginError> {
        IbSettings::from_lookup(|name| std::env::var(name).ok())
    }

    /// From `lookup`; a value that does not parse is an `InvalidArgument` error naming the
    /// variable and what it accepts.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<IbSettings, PluginError> {
        let var = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let int = |name: &str| -> Result<Option<i64>, PluginError> {
            var(name)
                .map(|v| {
                    v.parse::<i64>().map_err(|_| {
                        PluginError::invalid_argument(format!(
                            "{name}={v} is not an integer; unset it or give a number"
                        ))
                    })
                })
                .transpose()
        };
        let family = match var("NCCL_IB_ADDR_FAMILY").as_deref() {
            None => Family::V4,
            Some(v) if v.eq_ignore_ascii_case("AF_INET") => Family::V4,
            Some(v) if v.eq_ignore_ascii_case("AF_INET6") => Family::V6,
            Some(v) => {
                return Err(PluginError::invalid_argument(format!(
                    "NCCL_IB_ADDR_FAMILY={v} is neither AF_INET nor AF_INET6; set one of them or unset it (AF_INET)"
                )))
            }
        };
        let range = var("NCCL_IB_ADDR_RANGE")
            .map(|v| {
                AddrRange::parse(&v, family).map_err(|why| {
                    PluginError::invalid_argument(format!("NCCL_IB_ADDR_RANGE={v}: {why}"))
                })
            })
            .transpose()?;
        let index = match int("NCCL_IB_GID_INDEX")? {
            Some(i) if i >= 0 => Some(u32::try_from(i).map_err(|_| {
                PluginError::invalid_argument(format!("NCCL_IB_GID_INDEX={i} is too large; GID tables have at most a few hundred entries"))
            })?),
            _ => None,
        };
        let roce_version = match int("NCCL_IB_ROCE_VERSION_NUM")? {
            None => 2,
            Some(v @ (1 | 2)) => v as u32,
            Some(v) => {
                return Err(PluginError::invalid_argument(format!(
                "NCCL_IB_ROCE_VERSION_NUM={v}: RoCE versions are 1 and 2; set one or unset it (2)"
            )))
            }
        };
        Ok(IbSettings {
            disable: int("NCCL_IB_DISABLE")?.is_some_and(|v| v != 0),
            hca: var("NCCL_IB_HCA"),
            gid: GidConfig {
                index,
                family,
                range,
                roce_version,
            },
            library: var("NCCL_IBVERBS_LIB"),
            merge: MergeSettings {
                nics: int("NCCL_IB_MERGE_NICS")?.is_none_or(|v| v != 0),
                vfs: int("NCCL_IB_MERGE_VFS")?.is_none_or(|v| v != 0),
            },
            qp: {
                let d = QpSettings::default();
                let ranged = |name: &str, default: i64, max: i64| -> Result<i64, PluginError> {
                    match int(name)? {
                        None => Ok(default),
                        Some(v) if (0..=max).contains(&v) => Ok(v),
                        Some(v) => Err(PluginError::invalid_argument(format!(
                            "{name}={v} is outside 0..={max}; set a value in range or unset it ({default})"
                        ))),
                    }
                };
                QpSettings {
                    qps_per_connection: match ranged(
                        "NCCL_IB_QPS_PER_CONNECTION",
                        1,
                        MAX_QPS as i64,
                    )? {
                        0 => 1,
                        n => n as usize,
                    },
                    timeout: ranged("NCCL_IB_TIMEOUT", d.timeout.into(), 31)? as u8,
                    retry_cnt: ranged("NCCL_IB_RETRY_CNT", d.retry_cnt.into(), 7)? as u8,
                    traffic_class: ranged("NCCL_IB_TC", 0, 255)? as u8,
                    service_level: ranged("NCCL_IB_SL", 0, 15)? as u8,
                    pkey_index: ranged("NCCL_IB_PKEY", 0, 0xffff)? as u16,
                    adaptive_routing: int("NCCL_IB_ADAPTIVE_ROUTING")?.map(|v| v != 0),
                    ar_threshold: ranged("NCCL_IB_AR_THRESHOLD", d.ar_threshold as i64, i64::MAX)?
                        as usize,
                }
            },
            gpu: GpuSettings {
                dmabuf_enable: int("NCCL_DMABUF_ENABLE")?.is_none_or(|v| v != 0),
                flush_disable: int("NCCL_GDR_FLUSH_DISABLE")?.is_some_and(|v| v != 0),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<IbSettings, PluginError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        IbSettings::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn qp_variables_parse_with_bounds() {
        let s = settings(&[
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_TIMEOUT", "14"),
            ("NCCL_IB_RETRY_CNT", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "1"),
            ("NCCL_IB_PKEY", "2"),
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_AR_THRESHOLD", "65536"),
        ])
        .unwrap();
        assert_eq!(
            s.qp,
            QpSettings {
                qps_per_connection: 4,
                timeout: 14,
                retry_cnt: 3,
                traffic_class: 106,
                service_level: 1,
                pkey_index: 2,
                adaptive_routing: Some(true),
                ar_threshold: 65536,
            }
        );
        assert_eq!(
            settings(&[("NCCL_IB_QPS_PER_CONNECTION", "0")])
                .unwrap()
                .qp
                .qps_per_connection,
            1
        );
        let e = settings(&[("NCCL_IB_RETRY_CNT", "9")]).unwrap_err();
        assert!(
            e.message.contains("NCCL_IB_RETRY_CNT=9 is outside 0..=7"),
            "{e}"
        );
        assert!(settings(&[("NCCL_IB_QPS_PER_CONNECTION", "1000")]).is_err());
    }

    #[test]
    fn defaults_when_unset() {
        let s = settings(&[]).unwrap();
        assert_eq!(s, IbSettings::default());
        assert_eq!(
            s.gid,
            GidConfig {
                index: None,
                family: Family::V4,
                range: None,
                roce_version: 2
            }
        );
    }

    #[test]
    fn values_parse() {
        let s = settings(&[
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_IB_HCA", " ^=mlx5_0:1 "),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_ADDR_RANGE", "fd00::/8"),
            ("NCCL_IB_ROCE_VERSION_NUM", "1"),
            ("NCCL_IBVERBS_LIB", "/opt/double/libibverbs.so.1"),
        ])
        .unwrap();
        assert!(s.disable);
        assert_eq!(s.hca.as_deref(), Some("^=mlx5_0:1"));
        assert_eq!(s.gid.index, Some(3));
        assert_eq!(s.gid.family, Family::V6);
        assert_eq!(s.gid.range.map(|r| r.prefix_len), Some(8));
        assert_eq!(s.gid.roce_version, 1);
        assert_eq!(s.library.as_deref(), Some("/opt/double/libibverbs.so.1"));
        assert!(!settings(&[("NCCL_IB_DISABLE", "0")]).unwrap().disable);
        assert_eq!(
            s.merge,
            MergeSettings {
                nics: true,
                vfs: true
            },
            "NCCL's defaults"
        );
        let m = settings(&[("NCCL_IB_MERGE_NICS", "0"), ("NCCL_IB_MERGE_VFS", "0")]).unwrap();
        assert_eq!(
            m.merge,
            MergeSettings {
                nics: false,
                vfs: false
            }
        );
        let gpu = |vars: &[(&str, &str)]| settings(vars).unwrap().gpu;
        assert_eq!(
            gpu(&[]),
            GpuSettings {
                dmabuf_enable: true,
                flush_disable: false
            }
        );
        assert!(!gpu(&[("NCCL_DMABUF_ENABLE", "0")]).dmabuf_enable);
        assert!(gpu(&[("NCCL_GDR_FLUSH_DISABLE", "1")]).flush_disable);
        assert!(!gpu(&[("NCCL_GDR_FLUSH_DISABLE", "0")]).flush_disable);
        assert_eq!(
            settings(&[("NCCL_IB_GID_INDEX", "-1")]).unwrap().gid.index,
            None
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (var, value, says) in [
            (
                "NCCL_IB_DISABLE",
                "yes",
                "NCCL_IB_DISABLE=yes is not an integer",
            ),
            (
                "NCCL_IB_GID_INDEX",
                "three",
                "NCCL_IB_GID_INDEX=three is not an integer",
            ),
            (
                "NCCL_IB_ADDR_FAMILY",
                "AF_UNIX",
                "NCCL_IB_ADDR_FAMILY=AF_UNIX is neither",
            ),
            (
                "NCCL_IB_ADDR_RANGE",
                "10.0.0.0/40",
                "NCCL_IB_ADDR_RANGE=10.0.0.0/40: prefix length",
            ),
            ("NCCL_IB_ROCE_VERSION_NUM", "3", "RoCE versions are 1 and 2"),
        ] {
            let e = settings(&[(var, value)]).unwrap_err();
            assert_eq!(e.code, PluginError::INVALID_ARGUMENT, "{e}");
            assert!(e.message.contains(says), "{var}={value}: {e}");
        }
    }
}

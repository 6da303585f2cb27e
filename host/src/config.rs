//! Communicator configuration: [`CommConfig`] mirrors `ncclConfig_t` field for field (an
//! unset int is [`UNDEF_INT`], as `NCCL_CONFIG_UNDEF_INT`), and [`CommConfig::resolve`]
//! validates it, fills defaults and merges the environment into a [`ResolvedConfig`].
//!
//! Precedence: a field the caller set wins; the environment (`NCCL_COMM_BLOCKING`, ...)
//! applies to fields left unset; defaults fill the rest. Where the environment disagrees with
//! a value the caller set, the log says which one was kept.

use crate::error::{Error, Result};
use crate::params;
use crate::version::{nccl_version, NCCL_VERSION_CODE};

/// `NCCL_CONFIG_UNDEF_INT`: the value of an int field the caller did not set.
pub const UNDEF_INT: i32 = i32::MIN;
/// `ncclConfig_t.magic` of a config made by `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// Most channels (CTAs) a collective may use.
pub const MAX_CHANNELS: i32 = 64;
/// Largest CGA cluster size.
pub const MAX_CGA_CLUSTER_SIZE: i32 = 8;

/// `ncclConfig_t` (NCCL 2.32.3's `ncclConfig_v23100`), with strings as Rust strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommConfig {
    pub magic: u32,
    pub version: u32,
    pub blocking: i32,
    pub cga_cluster_size: i32,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub net_name: Option<String>,
    pub split_share: i32,
    pub traffic_class: i32,
    pub comm_name: Option<String>,
    pub collnet_enable: i32,
    pub cta_policy: i32,
    pub shrink_share: i32,
    pub nvls_ctas: i32,
    pub n_channels_per_net_peer: i32,
    pub nvlink_centric_sched: i32,
    /// 2.29: 0 no CUDA graphs, 1 one graph, 2 several graphs or graphs mixed with eager calls.
    pub graph_usage_mode: i32,
    /// 2.29: contexts for one-sided operations (ncclPutSignal and co., which rustccl lacks).
    pub num_rma_ctx: i32,
    /// 2.30.3: most peers a rank talks to at once in point-to-point based operations.
    pub max_p2p_peers: i32,
    /// 2.30.7: 1 keeps capture-time ordering of communication kernels, 0 leaves it to the caller.
    pub graph_stream_ordering: i32,
    /// 2.31: 1 lets this communicator's kernels overlap other such communicators' (implicit
    /// launch order); `NCCL_LAUNCH_ORDER_IMPLICIT` overrides it.
    pub launch_order_implicit: i32,
    /// 2.31: one-sided signal indexes per context (`sigIdx < numRmaSig`).
    pub num_rma_sig: i32,
    /// 2.31: 1 sets up one-sided signals at init; `NCCL_RMA_EAGER_INIT` overrides it.
    pub rma_eager_init: i32,
    /// 2.31: `ncclHostCftMode_t` (1 enable, 2 disable, 3 fallback) for CFT logical endpoints.
    pub host_cft_mode: i32,
    /// 2.32: `ncclNvlsHostMode_t`, a bitmask of host NVLS components to leave off.
    pub nvls_host_mode: i32,
    /// rustccl's own (not in `ncclConfig_t`): milliseconds an operation may wait before it
    /// ends with `Timeout` on every rank; 0 = no limit (the default). The environment's
    /// `NCCL_OP_TIMEOUT_MS` applies when unset.
    pub op_timeout_ms: i32,
    /// rustccl's own (not in `ncclConfig_t`): the backend of this communicator (and of the
    /// children it splits or shrinks into); `None` = `RUSTCCL_BACKEND` or the automatic choice
    /// ([`select_backend`](crate::backend::select_backend)). Lets one process hold a host and
    /// a GPU communicator at once (the Python package's `backend=` argument).
    pub backend: Option<BackendKind>,
}

impl Default for CommConfig {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        CommConfig {
            magic: CONFIG_MAGIC,
            version: NCCL_VERSION_CODE as u32,
            blocking: UNDEF_INT,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: None,
            split_share: UNDEF_INT,
            traffic_class: UNDEF_INT,
            comm_name: None,
            collnet_enable: UNDEF_INT,
            cta_policy: UNDEF_INT,
            shrink_share: UNDEF_INT,
            nvls_ctas: UNDEF_INT,
            n_channels_per_net_peer: UNDEF_INT,
            nvlink_centric_sched: UNDEF_INT,
            graph_usage_mode: UNDEF_INT,
            num_rma_ctx: UNDEF_INT,
            max_p2p_peers: UNDEF_INT,
            graph_stream_ordering: UNDEF_INT,
            launch_order_implicit: UNDEF_INT,
            num_rma_sig: UNDEF_INT,
            rma_eager_init: UNDEF_INT,
            host_cft_mode: UNDEF_INT,
            nvls_host_mode: UNDEF_INT,
            op_timeout_ms: UNDEF_INT,
            backend: None,
        }
    }
}

/// A configuration with every field decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedConfig {
    pub blocking: bool,
    pub cga_cluster_size: i32,
    pub min_ctas: i32,
    pub max_ctas: i32,
    pub net_name: Option<String>,
    pub split_share: bool,
    /// `None`: the network's default traffic class.
    pub traffic_class: Option<i32>,
    pub comm_name: Option<String>,
    pub collnet_enable: bool,
    pub cta_policy: i32,
    pub shrink_share: bool,
    /// `None`: chosen by the planner.
    pub nvls_ctas: Option<i32>,
    pub n_channels_per_net_peer: Option<i32>,
    pub nvlink_centric_sched: bool,
    /// `None`: operations may wait without limit.
    pub op_timeout: Option<std::time::Duration>,
    /// `graphUsageMode` (2 when unset, as NCCL).
    pub graph_usage_mode: i32,
    /// `numRmaCtx`, `maxP2pPeers`: `None` when unset. Accepted, not acted on (see
    /// `log_unused_fields`).
    pub num_rma_ctx: Option<i32>,
    pub max_p2p_peers: Option<i32>,
    /// `graphStreamOrdering` (on when unset, as NCCL).
    pub graph_stream_ordering: bool,
    /// 2.31/2.32 fields, accepted and not acted on (see `log_unused_fields`):
    /// `launchOrderImplicit` and `rmaEagerInit` (off when unset, the environment's value
    /// first, as NCCL), `numRmaSig`, `hostCftMode` and `nvlsHostMode` (`None` when unset).
    pub launch_order_implicit: bool,
    pub rma_eager_init: bool,
    pub num_rma_sig: Option<i32>,
    pub host_cft_mode: Option<i32>,
    pub nvls_host_mode: Option<i32>,
}

/// Logs once per process (INFO) each field of NCCL 2.29–2.32 a caller set that rustccl accepts
/// but does not act on: its one-sided operations have one context and one signal index and set
/// their signals up with the first symmetric window (`numRmaCtx`, `numRmaSig`, `rmaEagerInit`),
/// it plans point-to-point without a peer cap (`maxP2pPeers`), orders its kernels on the
/// caller's stream whatever graphs are used (`graphUsageMode`, `graphStreamOrdering`,
/// `launchOrderImplicit`), and drives no CFT or NVLS hardware (`hostCftMode`, `nvlsHostMode`).
fn log_unused_fields(c: &CommConfig) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static LOGGED: [AtomicBool; 9] = [const { AtomicBool::new(false) }; 9];
    let fields = [
        ("graphUsageMode", c.graph_usage_mode, "rustccl orders its work on the caller's stream in every mode"),
        ("numRmaCtx", c.num_rma_ctx, "rustccl has no one-sided operations (ncclPutSignal and co.) yet"),
        ("maxP2pPeers", c.max_p2p_peers, "rustccl does not cap the peers of point-to-point operations"),
        ("graphStreamOrdering", c.graph_stream_ordering, "rustccl keeps capture-time ordering in every case"),
        ("launchOrderImplicit", c.launch_order_implicit, "rustccl orders each communicator's launches itself in every case"),
        ("numRmaSig", c.num_rma_sig, "rustccl's one-sided calls have one signal index (sigIdx 0)"),
        ("rmaEagerInit", c.rma_eager_init, "rustccl sets one-sided signals up with the first symmetric window"),
        ("hostCftMode", c.host_cft_mode, "rustccl drives no CFT (Compute Fabric Transport) hardware: the CFT queries are refused"),
        ("nvlsHostMode", c.nvls_host_mode, "rustccl has no NVLS (NVLink SHARP)"),
    ];
    for (flag, (name, v, why)) in LOGGED.iter().zip(fields) {
        if v != UNDEF_INT && !flag.swap(true, Ordering::Relaxed) {
            tracing::info!(target: "INIT", "config.{name} = {v} accepted but not acted on: {why}");
        }
    }
}

/// Source of environment values; the real one reads the process environment, tests give maps.
pub trait EnvSource {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment, through [`params::env_str`] (which logs values the user set).
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        params::env_str(name)
    }
}

fn check_flag(name: &str, v: i32) -> Result<()> {
    if v == UNDEF_INT || v == 0 || v == 1 {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!("config.{name} = {v}: must be 0 or 1")))
    }
}

fn check_positive(name: &str, v: i32) -> Result<()> {
    if v == UNDEF_INT || v > 0 {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!("config.{name} = {v}: must be positive")))
    }
}

/// The environment's flag `var` (0 or 1) when set and valid, else the caller's value: for the
/// fields whose variable NCCL lets override the config (2.31's `launchOrderImplicit`,
/// `rmaEagerInit`).
fn env_first(env: &dyn EnvSource, field: &str, user: i32, var: &str) -> i32 {
    match env.get(var).map(|v| (v.trim().parse::<i32>(), v)) {
        Some((Ok(n @ (0 | 1)), _)) => {
            if user != UNDEF_INT && user != n {
                tracing::info!(target: "ENV", "{var}={n} overrides config.{field} = {user}");
            }
            n
        }
        Some((_, v)) => {
            tracing::info!(target: "ENV", "{var}={v:?} is not 0 or 1; ignored");
            user
        }
        None => user,
    }
}

/// Picks the caller's value when set, else the environment's, else the default; logs when the
/// environment was overruled by the caller.
fn pick(
    env: &dyn EnvSource,
    field: &str,
    user: i32,
    var: &str,
    default: i32,
    env_ok: impl Fn(i64) -> bool,
) -> i32 {
    let from_env = env.get(var).and_then(|v| match v.trim().parse::<i64>() {
        Ok(n) if env_ok(n) => Some(n as i32),
        _ => {
            tracing::info!(target: "ENV", "{var}={v:?} is not a valid value for {field}; ignored");
            None
        }
    });
    match (user != UNDEF_INT, from_env) {
        (true, Some(e)) if e != user => {
            tracing::info!(target: "ENV", "{var}={e} ignored: config.{field} = {user} was set by the caller");
            user
        }
        (true, _) => user,
        (false, Some(e)) => e,
        (false, None) => default,
    }
}

impl CommConfig {
    /// The defaults of a non-blocking communicator.
    pub fn non_blocking() -> CommConfig {
        CommConfig { blocking: 0, ..CommConfig::default() }
    }

    /// Validates the caller's fields, then merges the environment and defaults.
    pub fn resolve(&self) -> Result<ResolvedConfig> {
        self.resolve_with(&ProcessEnv)
    }

    pub fn resolve_with(&self, env: &dyn EnvSource) -> Result<ResolvedConfig> {
        if self.magic != CONFIG_MAGIC {
            return Err(Error::invalid_argument(format!(
                "config magic is {:#x}, expected {CONFIG_MAGIC:#x}: the ncclConfig_t was not initialised with NCCL_CONFIG_INITIALIZER",
                self.magic
            )));
        }
        let mut c = self.clone();
        // Fields that did not exist in the caller's NCCL version take their defaults.
        if (c.version as i32) < nccl_version(2, 14, 0) {
            c.blocking = UNDEF_INT;
        }
        if (c.version as i32) < nccl_version(2, 17, 0) {
            c.cga_cluster_size = UNDEF_INT;
            c.min_ctas = UNDEF_INT;
            c.max_ctas = UNDEF_INT;
            c.net_name = None;
        }
        check_flag("blocking", c.blocking)?;
        check_flag("splitShare", c.split_share)?;
        check_flag("collnetEnable", c.collnet_enable)?;
        check_flag("shrinkShare", c.shrink_share)?;
        check_flag("nvlinkCentricSched", c.nvlink_centric_sched)?;
        if c.cga_cluster_size != UNDEF_INT && c.cga_cluster_size < 0 {
            return Err(Error::invalid_argument(format!(
                "config.cgaClusterSize = {}: must not be negative",
                c.cga_cluster_size
            )));
        }
        check_positive("minCTAs", c.min_ctas)?;
        check_positive("maxCTAs", c.max_ctas)?;
        check_positive("nvlsCTAs", c.nvls_ctas)?;
        check_positive("nChannelsPerNetPeer", c.n_channels_per_net_peer)?;
        if c.min_ctas != UNDEF_INT && c.max_ctas != UNDEF_INT && c.min_ctas > c.max_ctas {
            return Err(Error::invalid_argument(format!(
                "config.minCTAs = {} is larger than config.maxCTAs = {}",
                c.min_ctas, c.max_ctas
            )));
        }
        if c.traffic_class != UNDEF_INT && c.traffic_class < 0 {
            return Err(Error::invalid_argument(format!(
                "config.trafficClass = {}: must not be negative",
                c.traffic_class
            )));
        }
        if c.op_timeout_ms != UNDEF_INT && c.op_timeout_ms < 0 {
            return Err(Error::invalid_argument(format!(
                "config.op_timeout_ms = {}: must be 0 (no limit) or a positive number of milliseconds",
                c.op_timeout_ms
            )));
        }
        if !matches!(c.graph_usage_mode, UNDEF_INT | 0 | 1 | 2) {
            return Err(Error::invalid_argument(format!(
                "config.graphUsageMode = {}: must be 0 (no graphs), 1 (one graph) or 2 (several, or mixed with eager calls)",
                c.graph_usage_mode
            )));
        }
        check_flag("graphStreamOrdering", c.graph_stream_ordering)?;
        if c.graph_stream_ordering == 0 && !matches!(c.graph_usage_mode, 0 | 1) {
            return Err(Error::invalid_argument(
                "config.graphStreamOrdering = 0 needs config.graphUsageMode 0 or 1: without capture-time ordering, graphs must not be mixed",
            ));
        }
        if c.num_rma_ctx != UNDEF_INT && c.num_rma_ctx < 0 {
            return Err(Error::invalid_argument(format!("config.numRmaCtx = {}: must not be negative", c.num_rma_ctx)));
        }
        check_flag("launchOrderImplicit", c.launch_order_implicit)?;
        check_flag("rmaEagerInit", c.rma_eager_init)?;
        if c.num_rma_sig != UNDEF_INT && c.num_rma_sig < 1 {
            return Err(Error::invalid_argument(format!("config.numRmaSig = {}: must be at least 1", c.num_rma_sig)));
        }
        if !matches!(c.host_cft_mode, UNDEF_INT | 1..=3) {
            return Err(Error::invalid_argument(format!(
                "config.hostCftMode = {}: must be ncclHostCftEnable (1), ncclHostCftDisable (2), ncclHostCftFallback (3) or unset",
                c.host_cft_mode
            )));
        }
        if c.nvls_host_mode != UNDEF_INT && c.nvls_host_mode < 0 {
            return Err(Error::invalid_argument(format!(
                "config.nvlsHostMode = {}: must be a combination of the ncclNvlsHostMode_t flags (0 or more) or unset",
                c.nvls_host_mode
            )));
        }
        if !matches!(c.cta_policy, UNDEF_INT | 0 | 1 | 2) {
            return Err(Error::invalid_argument(format!(
                "config.CTAPolicy = {}: must be NCCL_CTA_POLICY_DEFAULT, _EFFICIENCY or _ZERO",
                c.cta_policy
            )));
        }

        let flag = |v: i64| v == 0 || v == 1;
        let blocking = pick(env, "blocking", c.blocking, "NCCL_COMM_BLOCKING", 1, flag) == 1;
        let split_share =
            pick(env, "splitShare", c.split_share, "NCCL_COMM_SPLIT_SHARE_RESOURCES", 0, flag) == 1;
        let shrink_share =
            pick(env, "shrinkShare", c.shrink_share, "NCCL_COMM_SHRINK_SHARE_RESOURCES", 0, flag) == 1;
        let cga = pick(env, "cgaClusterSize", c.cga_cluster_size, "NCCL_CGA_CLUSTER_SIZE", 4, |v| v >= 0);
        let positive = |v: i64| v > 0;
        let mut min_ctas = pick(env, "minCTAs", c.min_ctas, "NCCL_MIN_CTAS", 1, positive);
        let mut max_ctas = pick(env, "maxCTAs", c.max_ctas, "NCCL_MAX_CTAS", MAX_CHANNELS, positive);
        let cga_cluster_size = if cga > MAX_CGA_CLUSTER_SIZE {
            tracing::info!(target: "INIT", "cgaClusterSize {cga} is larger than {MAX_CGA_CLUSTER_SIZE}; using {MAX_CGA_CLUSTER_SIZE}");
            MAX_CGA_CLUSTER_SIZE
        } else {
            cga
        };
        if max_ctas > MAX_CHANNELS {
            tracing::info!(target: "INIT", "maxCTAs {max_ctas} is larger than {MAX_CHANNELS}; using {MAX_CHANNELS}");
            max_ctas = MAX_CHANNELS;
        }
        if min_ctas > max_ctas {
            tracing::info!(target: "INIT", "minCTAs {min_ctas} is larger than maxCTAs {max_ctas}; using {max_ctas}");
            min_ctas = max_ctas;
        }
        let net_name = match (&c.net_name, env.get("NCCL_NET")) {
            (Some(user), Some(e)) if &e != user => {
                tracing::info!(target: "ENV", "NCCL_NET={e} ignored: config.netName = {user} was set by the caller");
                Some(user.clone())
            }
            (Some(user), _) => Some(user.clone()),
            (None, e) => e,
        };
        let undef_to_none = |v: i32| if v == UNDEF_INT { None } else { Some(v) };
        // NCCL: these two variables override the caller's fields.
        c.launch_order_implicit = env_first(env, "launchOrderImplicit", c.launch_order_implicit, "NCCL_LAUNCH_ORDER_IMPLICIT");
        c.rma_eager_init = env_first(env, "rmaEagerInit", c.rma_eager_init, "NCCL_RMA_EAGER_INIT");
        log_unused_fields(&c);
        let op_timeout_ms = pick(env, "op_timeout_ms", c.op_timeout_ms, "NCCL_OP_TIMEOUT_MS", 0, |v| (0..=i32::MAX as i64).contains(&v));
        let op_timeout = (op_timeout_ms > 0).then(|| std::time::Duration::from_millis(op_timeout_ms as u64));
        Ok(ResolvedConfig {
            blocking,
            cga_cluster_size,
            min_ctas,
            max_ctas,
            net_name,
            split_share,
            traffic_class: undef_to_none(c.traffic_class),
            comm_name: c.comm_name.clone(),
            collnet_enable: c.collnet_enable == 1,
            cta_policy: if c.cta_policy == UNDEF_INT { 0 } else { c.cta_policy },
            shrink_share,
            nvls_ctas: undef_to_none(c.nvls_ctas),
            n_channels_per_net_peer: undef_to_none(c.n_channels_per_net_peer),
            nvlink_centric_sched: c.nvlink_centric_sched == 1,
            op_timeout,
            graph_usage_mode: if c.graph_usage_mode == UNDEF_INT { 2 } else { c.graph_usage_mode },
            num_rma_ctx: undef_to_none(c.num_rma_ctx),
            // NCCL: below one means every rank.
            max_p2p_peers: undef_to_none(c.max_p2p_peers).filter(|&v| v >= 1),
            graph_stream_ordering: c.graph_stream_ordering != 0,
            launch_order_implicit: c.launch_order_implicit == 1,
            rma_eager_init: c.rma_eager_init == 1,
            num_rma_sig: undef_to_none(c.num_rma_sig),
            host_cft_mode: undef_to_none(c.host_cft_mode),
            nvls_host_mode: undef_to_none(c.nvls_host_mode),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct MapEnv(HashMap<&'static str, &'static str>);
    impl EnvSource for MapEnv {
        fn get(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|s| s.to_string())
        }
    }
    fn env(pairs: &[(&'static str, &'static str)]) -> MapEnv {
        MapEnv(pairs.iter().cloned().collect())
    }

    #[test]
    fn defaults() {
        let r = CommConfig::default().resolve_with(&env(&[])).unwrap();
        assert!(r.blocking);
        assert_eq!((r.cga_cluster_size, r.min_ctas, r.max_ctas), (4, 1, MAX_CHANNELS));
        assert!(!r.split_share);
        assert_eq!(r.net_name, None);
    }

    #[test]
    fn bad_magic_and_bad_values_are_invalid_arguments() {
        let bad = CommConfig { magic: 0, ..Default::default() };
        let e = bad.resolve_with(&env(&[])).unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::InvalidArgument);
        assert!(e.message.contains("NCCL_CONFIG_INITIALIZER"));
        for c in [
            CommConfig { blocking: 2, ..Default::default() },
            CommConfig { split_share: -1, ..Default::default() },
            CommConfig { cga_cluster_size: -3, ..Default::default() },
            CommConfig { min_ctas: 0, ..Default::default() },
            CommConfig { min_ctas: 8, max_ctas: 4, ..Default::default() },
            CommConfig { cta_policy: 7, ..Default::default() },
            CommConfig { graph_usage_mode: 3, ..Default::default() },
            CommConfig { graph_stream_ordering: 2, ..Default::default() },
            CommConfig { graph_stream_ordering: 0, ..Default::default() },
            CommConfig { num_rma_ctx: -1, ..Default::default() },
            CommConfig { launch_order_implicit: 2, ..Default::default() },
            CommConfig { rma_eager_init: -1, ..Default::default() },
            CommConfig { num_rma_sig: 0, ..Default::default() },
            CommConfig { host_cft_mode: 0, ..Default::default() },
            CommConfig { host_cft_mode: 4, ..Default::default() },
            CommConfig { nvls_host_mode: -1, ..Default::default() },
        ] {
            assert_eq!(c.resolve_with(&env(&[])).unwrap_err().code, crate::error::ResultCode::InvalidArgument, "{c:?}");
        }
    }

    #[test]
    fn min_ctas_alone_is_accepted() {
        // NCCL compares minCTAs with an unset maxCTAs (INT_MIN) and refuses; we do not.
        let r = CommConfig { min_ctas: 4, ..Default::default() }.resolve_with(&env(&[])).unwrap();
        assert_eq!((r.min_ctas, r.max_ctas), (4, MAX_CHANNELS));
    }

    #[test]
    fn env_fills_unset_fields_but_caller_wins() {
        let e = env(&[("NCCL_COMM_BLOCKING", "0"), ("NCCL_NET", "Socket"), ("NCCL_MAX_CTAS", "100")]);
        let r = CommConfig::default().resolve_with(&e).unwrap();
        assert!(!r.blocking);
        assert_eq!(r.net_name.as_deref(), Some("Socket"));
        assert_eq!(r.max_ctas, MAX_CHANNELS, "capped");
        let user = CommConfig { blocking: 1, net_name: Some("IB".into()), ..Default::default() };
        let r = user.resolve_with(&e).unwrap();
        assert!(r.blocking);
        assert_eq!(r.net_name.as_deref(), Some("IB"));
    }

    #[test]
    fn op_timeout_from_config_or_env() {
        assert_eq!(CommConfig::default().resolve_with(&env(&[])).unwrap().op_timeout, None);
        let e = env(&[("NCCL_OP_TIMEOUT_MS", "1500")]);
        assert_eq!(CommConfig::default().resolve_with(&e).unwrap().op_timeout, Some(std::time::Duration::from_millis(1500)));
        let c = CommConfig { op_timeout_ms: 0, ..Default::default() };
        assert_eq!(c.resolve_with(&e).unwrap().op_timeout, None, "the caller's 0 wins");
        let c = CommConfig { op_timeout_ms: -5, ..Default::default() };
        assert_eq!(c.resolve_with(&env(&[])).unwrap_err().code, crate::error::ResultCode::InvalidArgument);
    }

    #[test]
    fn fields_of_2_29_and_2_30_resolve() {
        let r = CommConfig::default().resolve_with(&env(&[])).unwrap();
        assert_eq!((r.graph_usage_mode, r.num_rma_ctx, r.max_p2p_peers, r.graph_stream_ordering), (2, None, None, true));
        let c = CommConfig { graph_usage_mode: 1, num_rma_ctx: 4, max_p2p_peers: 0, graph_stream_ordering: 0, ..Default::default() };
        let r = c.resolve_with(&env(&[])).unwrap();
        assert_eq!((r.graph_usage_mode, r.num_rma_ctx, r.max_p2p_peers, r.graph_stream_ordering), (1, Some(4), None, false));
        let c = CommConfig { max_p2p_peers: 3, ..Default::default() };
        assert_eq!(c.resolve_with(&env(&[])).unwrap().max_p2p_peers, Some(3));
    }

    #[test]
    fn fields_of_2_31_and_2_32_resolve_and_their_variables_override_them() {
        let r = CommConfig::default().resolve_with(&env(&[])).unwrap();
        assert_eq!((r.launch_order_implicit, r.rma_eager_init), (false, false));
        assert_eq!((r.num_rma_sig, r.host_cft_mode, r.nvls_host_mode), (None, None, None));
        let c = CommConfig {
            launch_order_implicit: 1,
            rma_eager_init: 1,
            num_rma_sig: 4,
            host_cft_mode: 3,
            nvls_host_mode: i32::MAX,
            ..Default::default()
        };
        let r = c.resolve_with(&env(&[])).unwrap();
        assert_eq!((r.launch_order_implicit, r.rma_eager_init), (true, true));
        assert_eq!((r.num_rma_sig, r.host_cft_mode, r.nvls_host_mode), (Some(4), Some(3), Some(i32::MAX)));
        // NCCL: the variables win over the fields (unlike NCCL_MIN_CTAS and co.).
        let e = env(&[("NCCL_LAUNCH_ORDER_IMPLICIT", "0"), ("NCCL_RMA_EAGER_INIT", "0")]);
        let r = c.resolve_with(&e).unwrap();
        assert_eq!((r.launch_order_implicit, r.rma_eager_init), (false, false));
        let e = env(&[("NCCL_LAUNCH_ORDER_IMPLICIT", "1"), ("NCCL_RMA_EAGER_INIT", "yes")]);
        let r = CommConfig::default().resolve_with(&e).unwrap();
        assert_eq!((r.launch_order_implicit, r.rma_eager_init), (true, false), "an invalid value is ignored");
    }

    #[test]
    fn a_config_from_an_older_header_is_accepted() {
        // A program built against 2.28.9's nccl.h: its version, and the 2.30 fields at their
        // initializer's values (read_config leaves what a smaller struct lacks at the defaults).
        let old = CommConfig { version: 22809, blocking: 0, min_ctas: 2, ..Default::default() };
        let r = old.resolve_with(&env(&[])).unwrap();
        assert!(!r.blocking);
        assert_eq!(r.min_ctas, 2);
    }

    #[test]
    fn old_versions_ignore_newer_fields() {
        let old = CommConfig { version: 21300, blocking: 0, min_ctas: 3, ..Default::default() };
        let r = old.resolve_with(&env(&[])).unwrap();
        assert!(r.blocking, "blocking did not exist before 2.14");
        assert_eq!(r.min_ctas, 1, "minCTAs did not exist before 2.17");
    }
}

/// Which implementation a backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Host,
    Cuda,
    Hip,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [BackendKind::Host, BackendKind::Cuda, BackendKind::Hip];

    /// The name `RUSTCCL_BACKEND` uses ("host", "cuda", "hip").
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
        }
    }

    /// The kind named `name`, ignoring case and surrounding spaces.
    pub fn from_name(name: &str) -> Option<BackendKind> {
        let name = name.trim();
        BackendKind::ALL.into_iter().find(|k| k.name().eq_ignore_ascii_case(name))
    }

    /// The byte that identifies this kind in a serialised share handle (`backend::ShareHandle`).
    pub fn code(self) -> u8 {
        match self {
            BackendKind::Host => 1,
            BackendKind::Cuda => 2,
            BackendKind::Hip => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

//! Stable-ABI definitions shared by rustccl and its plugins.
//!
//! Four plugin kinds, each a module with the same shape: a safe trait the host uses and a
//! plugin implements, one `#[repr(C)]` [`abi_stable::StableAbi`] table of `extern "C"` shims per
//! ABI version, an `export_*!` macro that puts a table in a cdylib under the symbol
//! `rustccl_<kind>_v<N>` (see [`export`]), and a client per version that implements the
//! trait by calling a loaded table (adapting older versions to the current trait):
//!
//! * [`net`]: trait [`net::Net`], tables `NetV1` (`rustccl_net_v1`), `NetV2`
//!   (`rustccl_net_v2`: v1 plus `make_vdevice`, NCCL's merged NICs) and `NetV3`
//!   (`rustccl_net_v3`: v2 plus `init_v3`, the encryption key at init), `export_net!(v1 | v2 | v3, ...)`
//!   (or `export_net_v1!`), `NetV1Client` / `NetV2Client`;
//! * [`tuner`]: trait [`tuner::Tuner`], tables `TunerV1` (`rustccl_tuner_v1`) and `TunerV2`
//!   (`rustccl_tuner_v2`), `export_tuner!(v1 | v2, ...)` (or `export_tuner_v1!` /
//!   `export_tuner_v2!`), `TunerV1Client` / `TunerV2Client`;
//! * [`profiler`]: trait [`profiler::Profiler`], table `ProfilerV3` (`rustccl_profiler_v3`),
//!   `export_profiler!`, `ProfilerV3Client`; [`profiler_v2`], [`profiler_v1`]: the older
//!   tables and their clients;
//! * [`mod@env`]: trait [`env::Env`], table `EnvV1` (`rustccl_env_v1`), `export_env!`,
//!   `EnvV1Client`: one per process, through which the library resolves every parameter.
//!
//! This root module holds what the kinds share: [`PluginError`] / [`PResult`] (the result of
//! every exported function), the host's logger [`LogFn`], [`call_guarded`] (no panic crosses
//! the ABI), the enums numbered as NCCL's ([`CollType`], [`Algorithm`], [`Protocol`]), the
//! tuner's [`CostTable`] view, and [`PluginHandle`] / [`HandleRegistry`] (plugin-side state
//! never crosses the boundary: the plugin hands out numbers, and a stale or foreign number
//! is an error, never undefined behaviour).
//!
//! Loaded libraries are never unloaded, so no function pointer can dangle.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use abi_stable::std_types::{RResult, RStr, RString};
use abi_stable::StableAbi;

pub mod env;
pub mod export;
pub mod net;
pub mod profiler;
pub mod profiler_v1;
pub mod profiler_v2;
pub mod registry;
pub mod tuner;
pub mod wire;

/// An error crossing the plugin boundary: an `ncclResult_t` code and a message.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    /// `ncclResult_t` value (2 system, 3 internal, 4 invalid argument, 5 invalid usage,
    /// 6 remote).
    pub code: i32,
    pub message: RString,
}

impl PluginError {
    pub const SYSTEM: i32 = 2;
    pub const INTERNAL: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE: i32 = 6;

    pub fn new(code: i32, message: impl Into<String>) -> PluginError {
        PluginError { code, message: RString::from(message.into()) }
    }
    pub fn system(message: impl Into<String>) -> PluginError {
        PluginError::new(Self::SYSTEM, message)
    }
    pub fn internal(message: impl Into<String>) -> PluginError {
        PluginError::new(Self::INTERNAL, message)
    }
    pub fn invalid_argument(message: impl Into<String>) -> PluginError {
        PluginError::new(Self::INVALID_ARGUMENT, message)
    }
    pub fn invalid_usage(message: impl Into<String>) -> PluginError {
        PluginError::new(Self::INVALID_USAGE, message)
    }
    pub fn remote(message: impl Into<String>) -> PluginError {
        PluginError::new(Self::REMOTE, message)
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for PluginError {}

/// The result type of every exported plugin function.
pub type PResult<T> = RResult<T, PluginError>;

/// Log levels passed to a plugin's logger (NCCL's `ncclDebugLogLevel`).
pub mod log_level {
    pub const WARN: i32 = 2;
    pub const INFO: i32 = 3;
    pub const TRACE: i32 = 5;
}

/// Subsystem flags passed to a plugin's logger (NCCL's values).
pub mod subsys {
    pub const INIT: u64 = 0x1;
    pub const NET: u64 = 0x10;
    pub const ENV: u64 = 0x80;
    pub const TUNING: u64 = 0x40;
    pub const PROFILE: u64 = 0x4000;
}

/// The logger the host gives a plugin at init: level, subsystem flags, message.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct LogFn {
    pub log: extern "C" fn(level: i32, subsys: u64, message: RStr<'_>),
}

impl LogFn {
    pub fn warn(&self, subsys: u64, message: &str) {
        (self.log)(log_level::WARN, subsys, RStr::from_str(message))
    }
    pub fn info(&self, subsys: u64, message: &str) {
        (self.log)(log_level::INFO, subsys, RStr::from_str(message))
    }
}

impl fmt::Debug for LogFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogFn")
    }
}

/// Runs a plugin function, turning a panic into an internal error: a panic must not unwind
/// across the ABI.
pub fn call_guarded<T>(f: impl FnOnce() -> Result<T, PluginError>) -> PResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.into(),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            RResult::RErr(PluginError::internal(format!("plugin panicked: {what}")))
        }
    }
}

/// Cost of an (algorithm, protocol) pair that must not be used, as in NCCL
/// (`NCCL_ALGO_PROTO_IGNORE`). Any negative, infinite or NaN cost is treated the
/// same way; see [`is_usable_cost`].
pub const ALGO_PROTO_IGNORE: f32 = -1.0;

/// Whether a cost-table entry denotes a usable pair: a finite, non-negative time.
pub fn is_usable_cost(cost: f32) -> bool {
    cost.is_finite() && cost >= 0.0
}

/// Generates the numbering, naming and parsing helpers of a C-like enum.
macro_rules! nccl_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal => ($display:literal, $config:literal) ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(u8)]
        #[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value ),+
        }

        impl $name {
            /// Every value, in numeric order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The NCCL numeric value (also the index into tables).
            pub fn index(self) -> usize {
                self as usize
            }

            /// The value with NCCL number `index`, if there is one.
            pub fn from_index(index: usize) -> Option<Self> {
                Self::ALL.get(index).copied()
            }

            /// The name NCCL prints for this value (e.g. in logs).
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $display),+ }
            }

            /// The lower-case name used in configuration files and env vars.
            pub fn config_name(self) -> &'static str {
                match self { $($name::$variant => $config),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $name {
            type Err = String;

            /// Parses the configuration name or the NCCL display name,
            /// ignoring ASCII case and surrounding spaces.
            fn from_str(s: &str) -> Result<Self, String> {
                let s = s.trim();
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| s.eq_ignore_ascii_case(v.config_name()) || s.eq_ignore_ascii_case(v.name()))
                    .ok_or_else(|| {
                        let names: Vec<&str> = Self::ALL.iter().map(|v| v.config_name()).collect();
                        format!(concat!("unknown ", stringify!($name), " '{}' (expected one of: {})"), s, names.join(", "))
                    })
            }
        }
    };
}

nccl_enum! {
    /// A collective or point-to-point function, numbered as NCCL's `ncclFunc_t`.
    pub enum CollType {
        Broadcast = 0 => ("Broadcast", "broadcast"),
        Reduce = 1 => ("Reduce", "reduce"),
        AllGather = 2 => ("AllGather", "allgather"),
        ReduceScatter = 3 => ("ReduceScatter", "reducescatter"),
        AllReduce = 4 => ("AllReduce", "allreduce"),
        SendRecv = 5 => ("SendRecv", "sendrecv"),
        Send = 6 => ("Send", "send"),
        Recv = 7 => ("Recv", "recv"),
    }
}

impl CollType {
    /// Number of functions a tuner is asked about (NCCL's `NCCL_NUM_FUNCTIONS`):
    /// Broadcast through AllReduce. Send/receive are not tuned.
    pub const NUM_TUNED: usize = 5;

    /// Whether the host asks the tuner about this function.
    pub fn is_tuned(self) -> bool {
        self.index() < Self::NUM_TUNED
    }
}

nccl_enum! {
    /// A collective algorithm, numbered as NCCL's `NCCL_ALGO_*`.
    pub enum Algorithm {
        Tree = 0 => ("TREE", "tree"),
        Ring = 1 => ("RING", "ring"),
        CollNetDirect = 2 => ("COLLNET_DIRECT", "collnet_direct"),
        CollNetChain = 3 => ("COLLNET_CHAIN", "collnet_chain"),
        Nvls = 4 => ("NVLS", "nvls"),
        NvlsTree = 5 => ("NVLS_TREE", "nvls_tree"),
        Pat = 6 => ("PAT", "pat"),
    }
}

nccl_enum! {
    /// A wire protocol, numbered as NCCL's `NCCL_PROTO_*`.
    pub enum Protocol {
        Ll = 0 => ("LL", "ll"),
        Ll128 = 1 => ("LL128", "ll128"),
        Simple = 2 => ("SIMPLE", "simple"),
    }
}

/// A mutable view of the `n_algo × n_proto` table of predicted times (row-major:
/// `costs[algo * n_proto + proto]`) that the host fills and a tuner edits; the
/// host then picks the cheapest usable entry.
///
/// Entries that are not usable (see [`is_usable_cost`]) mean "this pair cannot
/// run here" and are never overwritten by [`CostTable::set`], as NCCL requires.
#[derive(Debug)]
pub struct CostTable<'a> {
    costs: &'a mut [f32],
    n_algo: usize,
    n_proto: usize,
}

impl<'a> CostTable<'a> {
    /// Wraps `costs`, which must hold exactly `n_algo * n_proto` entries.
    pub fn new(costs: &'a mut [f32], n_algo: usize, n_proto: usize) -> Result<Self, String> {
        match n_algo.checked_mul(n_proto) {
            Some(n) if n == costs.len() => Ok(CostTable {
                costs,
                n_algo,
                n_proto,
            }),
            _ => Err(format!(
                "cost table has {} entries, expected {n_algo} algorithms x {n_proto} protocols",
                costs.len()
            )),
        }
    }

    /// Number of algorithm rows.
    pub fn n_algo(&self) -> usize {
        self.n_algo
    }

    /// Number of protocol columns.
    pub fn n_proto(&self) -> usize {
        self.n_proto
    }

    /// The raw row-major entries.
    pub fn as_slice(&self) -> &[f32] {
        self.costs
    }

    /// The raw row-major entries, mutable (for passing across the ABI).
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        self.costs
    }

    fn position(&self, algo: Algorithm, proto: Protocol) -> Option<usize> {
        (algo.index() < self.n_algo && proto.index() < self.n_proto)
            .then(|| algo.index() * self.n_proto + proto.index())
    }

    /// The cost of `(algo, proto)`, or `None` when the table has no such entry.
    pub fn get(&self, algo: Algorithm, proto: Protocol) -> Option<f32> {
        self.position(algo, proto).map(|i| self.costs[i])
    }

    /// Whether `(algo, proto)` exists in the table and is usable.
    pub fn is_enabled(&self, algo: Algorithm, proto: Protocol) -> bool {
        self.get(algo, proto).is_some_and(is_usable_cost)
    }

    /// Sets the cost of a usable entry. Returns `false` (and changes nothing) when
    /// the entry is missing or disabled, or when `cost` itself is not usable (use
    /// [`CostTable::disable`] to disable).
    pub fn set(&mut self, algo: Algorithm, proto: Protocol, cost: f32) -> bool {
        if !is_usable_cost(cost) || !self.is_enabled(algo, proto) {
            return false;
        }
        match self.position(algo, proto) {
            Some(i) => {
                self.costs[i] = cost;
                true
            }
            None => false,
        }
    }

    /// Marks `(algo, proto)` as not usable. Returns whether the entry exists.
    pub fn disable(&mut self, algo: Algorithm, proto: Protocol) -> bool {
        match self.position(algo, proto) {
            Some(i) => {
                self.costs[i] = ALGO_PROTO_IGNORE;
                true
            }
            None => false,
        }
    }

    /// The cheapest usable entry (the first one on ties, in algorithm then
    /// protocol order, as NCCL scans), or `None` if nothing is usable.
    pub fn best(&self) -> Option<(Algorithm, Protocol, f32)> {
        let mut best: Option<(Algorithm, Protocol, f32)> = None;
        for &algo in Algorithm::ALL {
            for &proto in Protocol::ALL {
                if let Some(cost) = self.get(algo, proto).filter(|c| is_usable_cost(*c)) {
                    let better = match best {
                        None => true,
                        Some((_, _, b)) => cost < b,
                    };
                    if better {
                        best = Some((algo, proto, cost));
                    }
                }
            }
        }
        best
    }
}

/// An opaque reference to plugin-side state (one per communicator), made by a
/// plugin's `init` and passed back to its other functions. `0` is never valid.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PluginHandle {
    /// The plugin-chosen number.
    pub id: u64,
}

/// Plugin-side map from [`PluginHandle`]s to per-communicator state.
///
/// Thread-safe; a poisoned lock is recovered rather than propagated, because a
/// plugin must not panic across the ABI.
#[derive(Debug)]
pub struct HandleRegistry<T> {
    next_id: AtomicU64,
    states: Mutex<BTreeMap<u64, T>>,
}

impl<T> Default for HandleRegistry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> HandleRegistry<T> {
    /// An empty registry (usable in a `static`).
    pub const fn new() -> Self {
        HandleRegistry {
            next_id: AtomicU64::new(1),
            states: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, T>> {
        self.states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores `state` and returns a fresh handle for it.
    pub fn insert(&self, state: T) -> PluginHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, state);
        PluginHandle { id }
    }

    /// Runs `f` on the state of `handle`; `None` if the handle is unknown.
    pub fn with<R>(&self, handle: PluginHandle, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock().get_mut(&handle.id).map(f)
    }

    /// Removes and returns the state of `handle`; `None` if it is unknown.
    pub fn remove(&self, handle: PluginHandle) -> Option<T> {
        self.lock().remove(&handle.id)
    }

    /// Number of live handles.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_numbering_matches_nccl() {
        let colls: Vec<(CollType, usize)> = vec![
            (CollType::Broadcast, 0),
            (CollType::Reduce, 1),
            (CollType::AllGather, 2),
            (CollType::ReduceScatter, 3),
            (CollType::AllReduce, 4),
            (CollType::SendRecv, 5),
            (CollType::Send, 6),
            (CollType::Recv, 7),
        ];
        for (c, n) in colls {
            assert_eq!(c.index(), n);
            assert_eq!(CollType::from_index(n), Some(c));
        }
        assert_eq!(CollType::ALL.len(), 8);
        assert!(CollType::AllReduce.is_tuned() && !CollType::SendRecv.is_tuned());
        let algos = [
            Algorithm::Tree,
            Algorithm::Ring,
            Algorithm::CollNetDirect,
            Algorithm::CollNetChain,
            Algorithm::Nvls,
            Algorithm::NvlsTree,
            Algorithm::Pat,
        ];
        for (n, a) in algos.iter().enumerate() {
            assert_eq!(a.index(), n);
        }
        assert_eq!(Algorithm::from_index(7), None);
        assert_eq!(Protocol::Ll as u8, 0);
        assert_eq!(Protocol::Ll128 as u8, 1);
        assert_eq!(Protocol::Simple as u8, 2);
    }

    #[test]
    fn enum_names_parse() {
        assert_eq!("allreduce".parse::<CollType>(), Ok(CollType::AllReduce));
        assert_eq!(" AllGather ".parse::<CollType>(), Ok(CollType::AllGather));
        assert_eq!("nvls_tree".parse::<Algorithm>(), Ok(Algorithm::NvlsTree));
        assert_eq!(
            "COLLNET_DIRECT".parse::<Algorithm>(),
            Ok(Algorithm::CollNetDirect)
        );
        assert_eq!("ll128".parse::<Protocol>(), Ok(Protocol::Ll128));
        let err = "warp".parse::<Protocol>().unwrap_err();
        assert!(err.contains("'warp'") && err.contains("simple"), "{err}");
        for &p in Protocol::ALL {
            assert_eq!(p.config_name().parse::<Protocol>(), Ok(p));
        }
    }

    #[test]
    fn cost_table_get_set_best() {
        let mut raw = vec![5.0f32; 7 * 3];
        {
            let mut t = CostTable::new(&mut raw, 7, 3).unwrap();
            assert!(t.disable(Algorithm::NvlsTree, Protocol::Ll));
            assert!(!t.is_enabled(Algorithm::NvlsTree, Protocol::Ll));
            assert!(
                !t.set(Algorithm::NvlsTree, Protocol::Ll, 0.0),
                "disabled entries stay disabled"
            );
            assert!(t.set(Algorithm::Ring, Protocol::Simple, 1.5));
            assert_eq!(t.get(Algorithm::Ring, Protocol::Simple), Some(1.5));
            assert_eq!(t.best(), Some((Algorithm::Ring, Protocol::Simple, 1.5)));
            assert!(!t.set(Algorithm::Ring, Protocol::Ll, f32::INFINITY));
            assert!(!t.set(Algorithm::Ring, Protocol::Ll, -3.0));
        }
        assert_eq!(raw[5 * 3], ALGO_PROTO_IGNORE);
        assert_eq!(raw[3 + 2], 1.5);
        // Infinity and NaN mean "disabled" too.
        raw[3 + 2] = f32::INFINITY;
        raw[0] = f32::NAN;
        let t = CostTable::new(&mut raw, 7, 3).unwrap();
        assert!(!t.is_enabled(Algorithm::Ring, Protocol::Simple));
        assert!(!t.is_enabled(Algorithm::Tree, Protocol::Ll));
        assert_eq!(t.best(), Some((Algorithm::Tree, Protocol::Ll128, 5.0)));
    }

    #[test]
    fn cost_table_smaller_than_enums() {
        // A host may pass fewer algorithms than this crate knows (older table).
        let mut raw = vec![ALGO_PROTO_IGNORE; 2 * 3];
        let mut t = CostTable::new(&mut raw, 2, 3).unwrap();
        assert_eq!(t.best(), None);
        assert_eq!(t.get(Algorithm::Pat, Protocol::Ll), None);
        assert!(!t.disable(Algorithm::Pat, Protocol::Ll));
        assert!(CostTable::new(&mut raw, 3, 3).is_err());
        assert!(CostTable::new(&mut raw, usize::MAX, 2).is_err());
    }

    #[test]
    fn registry_handles() {
        let reg: HandleRegistry<String> = HandleRegistry::new();
        let a = reg.insert("a".into());
        let b = reg.insert("b".into());
        assert_ne!(a, b);
        assert_ne!(a.id, 0);
        assert_eq!(reg.with(b, |s| s.clone()), Some("b".to_string()));
        reg.with(a, |s| s.push('!'));
        assert_eq!(reg.remove(a), Some("a!".to_string()));
        assert_eq!(reg.remove(a), None);
        assert_eq!(reg.with(PluginHandle { id: 999 }, |_| ()), None);
        assert_eq!(reg.len(), 1);
    }
}

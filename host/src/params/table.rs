//! The table of parameters rustccl reads (NCCL 2.30's parameter registry, with the 2.31–2.32
//! variables rustccl accepts): each with its
//! name, type, default, whether NCCL documents it (published) and what it does in rustccl.
//! The query API (`ncclParamBind`, `ncclParamGet*`, `ncclParamGetParameter`,
//! `ncclParamGetAllParameterKeys`, `ncclParamDumpAll`) reads values through it.
//!
//! A value is what [`super::resolve`] gives at the time of the query (the env plugin's answer
//! when one is in use, else the environment variable of the same name), else the default;
//! [`Param::resolved`] also says where it came from. rustccl's own knobs (`RUSTCCL_*`, and `NCCL_OP_TIMEOUT_MS`) are
//! private: listed only with `NCCL_PARAM_DUMP_ALL=true`, as NCCL lists its undocumented ones.

use crate::error::{Error, Result};

/// A parameter's type, which decides how its value is read and returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// A 64-bit signed integer (NCCL's `NCCL_PARAM`s): read as decimal or 0x hexadecimal.
    Int,
    /// A flag: 1/T/TRUE or 0/F/FALSE (any case).
    Bool,
    /// Text.
    Str,
}

impl ParamType {
    /// The name NCCL's dump prints for the type.
    pub fn c_name(self) -> &'static str {
        match self {
            ParamType::Int => "int64_t",
            ParamType::Bool => "bool",
            ParamType::Str => "const char *",
        }
    }
}

/// One parameter.
#[derive(Debug)]
pub struct Param {
    pub name: &'static str,
    pub ty: ParamType,
    /// The value when the variable is unset; `None`: unset (a string parameter only).
    pub default: Option<&'static str>,
    /// Documented by NCCL (listed without `NCCL_PARAM_DUMP_ALL`).
    pub published: bool,
    pub description: &'static str,
}

/// A parameter's value, of its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamValue {
    Int(i64),
    Bool(bool),
    Str(String),
    /// A string parameter that is not set and has no default.
    Unset,
}

impl ParamValue {
    /// The value as text (`ncclParamGetParameter`): integers in decimal, flags as 1/0, and
    /// an unset string as the empty string.
    pub fn to_text(&self) -> String {
        match self {
            ParamValue::Int(v) => v.to_string(),
            ParamValue::Bool(b) => (if *b { "1" } else { "0" }).to_string(),
            ParamValue::Str(s) => s.clone(),
            ParamValue::Unset => String::new(),
        }
    }

    /// The value as an integer (integer and flag parameters).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            ParamValue::Int(v) => Some(*v),
            ParamValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }
}

const fn p(name: &'static str, ty: ParamType, default: Option<&'static str>, published: bool, description: &'static str) -> Param {
    Param { name, ty, default, published, description }
}

use ParamType::{Bool, Int, Str};

/// Every parameter rustccl reads.
pub static PARAMS: &[Param] = &[
    p("NCCL_DEBUG", Str, None, true, "Log level: VERSION, WARN, INFO, ABORT or TRACE (nothing when unset)"),
    p("NCCL_DEBUG_SUBSYS", Str, None, true, "Comma-separated subsystems INFO logs cover (INIT, COLL, P2P, NET, ENV, ... or ALL; ^ excludes)"),
    p("NCCL_DEBUG_FILE", Str, None, true, "File the log goes to (%h host name, %p pid) instead of stderr"),
    p("NCCL_COMM_ID", Str, None, true, "host:port of a root started by rank 0, so that no unique id need be passed around"),
    p("NCCL_HOSTID", Str, None, true, "Host identity ranks compare to find ranks of one node"),
    p("NCCL_ENCRYPTION_PSK", Str, None, false, "The pre-shared key that encrypts rustccl's TCP traffic (bootstrap and the socket transport), at least 32 bytes; the query API never shows it"),
    p("NCCL_ENCRYPTION_PSK_FILE", Str, None, false, "A file holding the pre-shared key (NCCL_ENCRYPTION_PSK's alternative; a trailing newline is not part of the key)"),
    p("NCCL_SOCKET_IFNAME", Str, None, true, "Interfaces bootstrap and sockets may use (prefix list; ^ excludes, = exact)"),
    p("NCCL_SOCKET_FAMILY", Str, None, true, "AF_INET or AF_INET6: the address family of the interface chosen"),
    p("NCCL_NET", Str, None, true, "Name of the network to use (the plugin's name)"),
    p("NCCL_NET_PLUGIN", Str, None, true, "Network plugin library to load (name, suffix or path; none disables)"),
    p("NCCL_TUNER_PLUGIN", Str, None, true, "Tuner plugin library to load"),
    p("NCCL_PROFILER_PLUGIN", Str, None, true, "Profiler plugin library to load"),
    p("NCCL_CONF_FILE", Str, None, true, "Configuration file of NAME=VALUE lines read instead of ~/.nccl.conf (then /etc/nccl.conf), for what the environment does not set; read from the environment itself"),
    p("NCCL_ENV_PLUGIN", Str, None, true, "Env plugin library through which every parameter is resolved (name, suffix or path; none disables); read from the environment itself"),
    p("NCCL_ALGO", Str, None, true, "Algorithms the planner may choose (Ring, Tree; ^ excludes)"),
    p("NCCL_THREAD_THRESHOLDS", Str, None, true, "Bytes per thread below which a channel is dropped: LL LL128 Simple (negative keeps the default)"),
    p("NCCL_PROTO", Str, None, true, "Protocols the planner may choose (Simple, LL, LL128; ^ excludes; on the host backend Ring/LL is the one-shot exchange)"),
    p("NCCL_COMM_BLOCKING", Int, Some("-2147483648"), true, "Default of config.blocking: 0 non-blocking, 1 blocking (unset: INT_MIN)"),
    p("NCCL_CGA_CLUSTER_SIZE", Int, Some("4"), true, "CGA cluster size of device kernels (0 to 8)"),
    p("NCCL_MIN_CTAS", Int, Some("1"), true, "Fewest channels (CTAs) a collective uses"),
    p("NCCL_MAX_CTAS", Int, Some("64"), true, "Most channels (CTAs) a collective uses"),
    p("NCCL_COMM_SPLIT_SHARE_RESOURCES", Int, Some("0"), true, "Default of config.splitShare"),
    p("NCCL_COMM_SHRINK_SHARE_RESOURCES", Int, Some("0"), true, "Default of config.shrinkShare"),
    p("NCCL_LAUNCH_ORDER_IMPLICIT", Int, Some("0"), true, "2.31: 1 asks for implicit launch order (overrides config.launchOrderImplicit); accepted, rustccl orders each communicator's launches itself"),
    p("NCCL_RMA_EAGER_INIT", Int, Some("0"), true, "2.31: 1 sets one-sided signals up at init (overrides config.rmaEagerInit); accepted, rustccl sets them up with the first symmetric window"),
    p("NCCL_SHM_DISABLE", Int, Some("0"), true, "1: no shared-memory transport between ranks of one host"),
    p("NCCL_P2P_DISABLE", Int, Some("0"), true, "1: no peer-to-peer (CUDA IPC) transport between GPUs"),
    p("NCCL_P2P_LL_THRESHOLD", Int, Some("16384"), true, "Point-to-point messages up to this many bytes use LL on GPUs"),
    p("NCCL_MAX_P2P_NCHANNELS", Int, None, true, "Channels a point-to-point message may use on GPUs, per peer and in all (1 to 32; unset: 32)"),
    p("NCCL_WIN_STRIDE", Int, Some("-1"), true, "Bytes of address space per rank for symmetric windows, rounded up to 4 GiB (-1: 16 GiB)"),
    p("NCCL_BUFFSIZE", Int, Some("4194304"), true, "Bytes of the Simple buffer of each device connection (cut into RUSTCCL_SIMPLE_STEPS slots); every rank must set the same"),
    p("NCCL_PARAM_DUMP_ALL", Bool, Some("0"), false, "List rustccl's private parameters too in key lists and dumps"),
    p("NCCL_OP_TIMEOUT_MS", Int, Some("0"), false, "rustccl: milliseconds an operation may wait before it ends with ncclTimeout on every rank (0: no limit)"),
    p("RUSTCCL_SOCKET_TIMEOUT_MS", Int, Some("0"), false, "rustccl: socket plugin: milliseconds a connection's peer may stay silent (unacknowledged data, unanswered keepalives) before the connection, and so the communicator, fails (0: TCP's own limits, many minutes)"),
    p("RUSTCCL_BACKEND", Str, None, false, "rustccl: backend to run on (host or cuda; unset: cuda when a GPU is present)"),
    p("RUSTCCL_DEVICE", Int, Some("0"), false, "rustccl: device the C API uses when the calling thread has no current CUDA device"),
    p("RUSTCCL_SYM_KERNEL", Str, None, false, "rustccl: the symmetric kernel collectives on symmetric windows take (auto, off; all_reduce: ll, ld, rsag); every rank must set the same"),
    p("RUSTCCL_SIMPLE_STEPS", Int, Some("4"), false, "rustccl: slots the Simple buffer of a device connection is cut into (2, 4 or 8); a step posts one slot"),
    p("RUSTCCL_HOST_SPIN", Int, Some("64"), false, "rustccl: rounds the host executor spins while waiting before it yields the core (at most 16 when ranks outnumber cores)"),
    p("RUSTCCL_HOST_SMALL_BYTES", Int, None, false, "rustccl: host backend: single collectives putting at most this many bytes per rank (up to 32768) on the board of small collectives (shared memory, one shot) take it; 0: never; unset: 32 KiB for reductions, 4 KiB for copies"),
    p("RUSTCCL_HOST_SINGLE_COPY_BYTES", Int, Some("32768"), false, "rustccl: host backend: all_gather, all_reduce and reduce_scatter calls of at least this many bytes per rank (broadcast: 8 times as many) copy straight between the ranks' buffers (process_vm_readv/process_vm_writev, one copy) where every rank may; 0: never"),
    p("RUSTCCL_HOST_DEVICES", Int, Some("64"), false, "rustccl: number of virtual devices of the host backend"),
    p("RUSTCCL_BOOTSTRAP_TIMEOUT", Str, Some("120"), false, "rustccl: seconds bootstrap waits (rendezvous, each bootstrap operation, connection setup)"),
    p("RUSTCCL_HANG_REPORT_S", Str, Some("60"), false, "rustccl: seconds an operation may wait before a hang report is logged"),
    p("RUSTCCL_HANG_REPORT_SIGNAL", Str, None, false, "rustccl: signal (e.g. USR1) on which every communicator logs what it waits for"),
    p("RUSTCCL_CHECK_COLLECTIVES", Int, Some("0"), false, "rustccl: 1 checks that every rank called the same operation (signatures in the FIFOs)"),
    p("RUSTCCL_PLAN_CACHE", Int, Some("1"), false, "rustccl: 0 plans (and on devices encodes) every single collective again instead of reusing what the same shape made"),
    p("RUSTCCL_PROFILE_ENQUEUE", Str, None, false, "rustccl: 1 times the stages of the enqueue path (printed at exit)"),
    p("RUSTCCL_NVRTC_PATH", Str, None, false, "rustccl: path of libnvrtc for compiling device kernels at run time"),
    p("RUSTCCL_HIPRTC_PATH", Str, None, false, "rustccl: path (file or directory) of hipRTC (libhiprtc.so, or ROCm 5's libamdhip64.so) for compiling device kernels for AMD GPUs"),
    p("RUSTCCL_HIP_PATH", Str, None, false, "rustccl: path (file or directory) of the HIP runtime, libamdhip64.so"),
    p("RUSTCCL_HIP_ARCH", Str, None, false, "rustccl: the AMD GPU target (e.g. gfx90a, gfx942) the hip backend compiles kernels for, instead of the gcnArchName the runtime reports"),
    p("RUSTCCL_KERNEL_CACHE_DIR", Str, None, false, "rustccl: directory of compiled device kernels (unset: $XDG_CACHE_HOME/rustccl/kernels or ~/.cache/rustccl/kernels)"),
    p("RUSTCCL_CUDA_INCLUDE", Str, None, false, "rustccl: CUDA include directory for run-time compilation"),
    p("RUSTCCL_KERNEL_DEFINES", Str, None, false, "rustccl: extra -D options for the device kernels (tuning experiments)"),
    p("RUSTCCL_KERNEL_SOURCE_DIR", Str, None, false, "rustccl: directory whose files replace the embedded device sources (experiments)"),
];

/// The parameter named `key`.
pub fn lookup(key: &str) -> Option<&'static Param> {
    PARAMS.iter().find(|p| p.name == key)
}

/// Parameters whose values are secrets: listed, but their value reads as [`SECRET_SHOWN`].
pub const SECRETS: &[&str] = &["NCCL_ENCRYPTION_PSK"];

/// What a set secret parameter reads as.
pub const SECRET_SHOWN: &str = "(set; not shown)";

/// The parameter named `key`, or an `InvalidArgument` that says how to find the names.
pub fn find(key: &str) -> Result<&'static Param> {
    lookup(key).ok_or_else(|| {
        Error::invalid_argument(format!(
            "no parameter is named {key:?} (ncclParamGetAllParameterKeys lists them; NCCL_PARAM_DUMP_ALL=true includes rustccl's own)"
        ))
    })
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_uppercase().as_str() {
        "1" | "T" | "TRUE" => Some(true),
        "0" | "F" | "FALSE" => Some(false),
        _ => None,
    }
}

impl Param {
    /// Whether the parameter is set (not empty), in the environment or by the env plugin.
    pub fn is_set(&self) -> bool {
        super::resolve(self.name).value.is_some()
    }

    /// The current value: the one set, else the default. A value that does not parse as the
    /// parameter's type is an `InvalidArgument` naming it.
    pub fn value(&self) -> Result<ParamValue> {
        self.resolved().0
    }

    /// The current value (as [`Param::value`]) and where it came from.
    pub fn resolved(&self) -> (Result<ParamValue>, super::Source) {
        let r = super::resolve(self.name);
        if SECRETS.contains(&self.name) {
            // A key is never handed out: the query API and the dump say only that it is set.
            let shown = r.value.map_or(ParamValue::Unset, |_| ParamValue::Str(SECRET_SHOWN.into()));
            return (Ok(shown), r.source);
        }
        (self.parse(r.value, r.source), r.source)
    }

    fn parse(&self, set: Option<String>, source: super::Source) -> Result<ParamValue> {
        let Some(text) = set.or_else(|| self.default.map(str::to_string)) else {
            return Ok(ParamValue::Unset);
        };
        let bad = |what: &str| {
            let origin = match source {
                super::Source::Environment => "set in the environment",
                super::Source::Plugin => "set by the env plugin",
                super::Source::ConfigFile => "set in a configuration file",
                super::Source::Default => "default",
            };
            Error::invalid_argument(format!("{}={text:?} ({origin}) is not {what}", self.name))
        };
        Ok(match self.ty {
            ParamType::Int => ParamValue::Int(super::parse_int(text.trim()).ok_or_else(|| bad("an integer"))?),
            ParamType::Bool => ParamValue::Bool(parse_bool(&text).ok_or_else(|| bad("a flag (1/T/TRUE or 0/F/FALSE)"))?),
            ParamType::Str => ParamValue::Str(text),
        })
    }
}

/// Whether `NCCL_PARAM_DUMP_ALL` asks for every parameter (a value that is not a flag: no).
pub fn dump_all_requested() -> bool {
    matches!(lookup("NCCL_PARAM_DUMP_ALL").map(Param::value), Some(Ok(ParamValue::Bool(true))))
}

/// The parameters listed: the published ones, or all with `NCCL_PARAM_DUMP_ALL=true`.
pub fn listed() -> impl Iterator<Item = &'static Param> {
    let all = dump_all_requested();
    PARAMS.iter().filter(move |p| all || p.published)
}

/// Logs every listed parameter with its value, where it came from (NCCL's names: `EnvVar`,
/// `EnvPlugin`, `ConfigFile`, `Default`) and its default (INFO, ENV).
pub fn dump_all() {
    for p in listed() {
        let (value, source) = p.resolved();
        let current = match value {
            Ok(ParamValue::Unset) => "<unset>".to_string(),
            Ok(v) => v.to_text(),
            Err(e) => format!("<invalid: {}>", e.message),
        };
        let kind = if p.published { "Published" } else { "Private" };
        tracing::info!(
            target: "ENV",
            "{} ({}) [{kind}] {}; current value={current} set_by={} default={}",
            p.name,
            p.ty.c_name(),
            p.description,
            source.nccl_name(),
            p.default.unwrap_or("<unset>")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_defaults_parse() {
        let mut names: Vec<_> = PARAMS.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PARAMS.len());
        for p in PARAMS {
            assert!(p.name.starts_with("NCCL_") || p.name.starts_with("RUSTCCL_"), "{}", p.name);
            assert!(!p.name.starts_with("RUSTCCL_") || !p.published, "{} is rustccl's own", p.name);
            if !p.is_set() {
                assert!(p.value().is_ok(), "default of {}", p.name);
                assert_eq!(p.value().unwrap() == ParamValue::Unset, p.default.is_none(), "{}", p.name);
            }
        }
    }

    #[test]
    fn values_come_from_the_environment_and_bad_ones_are_named() {
        let p = find("RUSTCCL_CHECK_COLLECTIVES").unwrap();
        std::env::remove_var(p.name);
        assert_eq!(p.value().unwrap(), ParamValue::Int(0));
        std::env::set_var(p.name, "0x3");
        assert_eq!(p.value().unwrap(), ParamValue::Int(3));
        std::env::set_var(p.name, "three");
        let e = p.value().unwrap_err();
        assert!(e.message.contains("RUSTCCL_CHECK_COLLECTIVES=\"three\""), "{}", e.message);
        std::env::remove_var(p.name);
        assert_eq!(parse_bool("true"), Some(true));
        assert_eq!(parse_bool("F"), Some(false));
        assert_eq!(parse_bool("yes"), None);
        let e = find("NCCL_NO_SUCH_THING").unwrap_err();
        assert_eq!(e.code, crate::error::ResultCode::InvalidArgument);
        assert!(e.message.contains("NCCL_NO_SUCH_THING"));
    }

    #[test]
    fn a_key_is_never_shown() {
        let p = find("NCCL_ENCRYPTION_PSK").unwrap();
        std::env::set_var(p.name, "a-test-key-that-must-never-be-printed-0123");
        let v = p.value().unwrap();
        std::env::remove_var(p.name);
        assert_eq!(v, ParamValue::Str(SECRET_SHOWN.into()));
        assert_eq!(p.value().unwrap(), ParamValue::Unset);
    }

    #[test]
    fn every_parameter_read_in_the_sources_is_in_the_table() {
        // The names the library reads through params::env_* or std::env::var, found in its
        // own sources: a new knob must be added to the table.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut missing = Vec::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for call in ["env_str(\"", "env_int(\"", "env_int_or(\"", "env_seconds_or(\"", "resolve(\"", "env::var(\""] {
                    for (at, _) in text.match_indices(call) {
                        let rest = &text[at + call.len()..];
                        let name = &rest[..rest.find('"').unwrap_or(0)];
                        if !name.contains("TEST") && lookup(name).is_none() {
                            missing.push(format!("{name} ({})", path.display()));
                        }
                    }
                }
            }
        }
        assert!(missing.is_empty(), "parameters missing from params::table: {missing:?}");
    }
}

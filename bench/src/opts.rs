//! Command-line options, parsed the way nccl-tests parses them (`-b 8 -e 128M -f 2`, long
//! forms, `--flag=value`, `-n5`), plus the operation, type, operator and root selections.

use rustccl::types::DataType;

use crate::ops::{Coll, Redop};

/// Which timing each row reports, nccl-tests' `-a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    Rank0,
    Avg,
    Min,
    Max,
}

impl Average {
    pub fn from_i64(v: i64) -> Option<Average> {
        Some(match v {
            0 => Average::Rank0,
            1 => Average::Avg,
            2 => Average::Min,
            3 => Average::Max,
            _ => return None,
        })
    }

    pub fn code(self) -> i64 {
        match self {
            Average::Rank0 => 0,
            Average::Avg => 1,
            Average::Min => 2,
            Average::Max => 3,
        }
    }

    /// Reduces the per-rank times (rank order) to the reported one.
    pub fn reduce(self, times: &[f64]) -> f64 {
        match self {
            Average::Rank0 => times.first().copied().unwrap_or(0.0),
            Average::Avg => times.iter().sum::<f64>() / times.len().max(1) as f64,
            Average::Min => times.iter().copied().fold(f64::INFINITY, f64::min),
            Average::Max => times.iter().copied().fold(0.0, f64::max),
        }
    }
}

/// The root selection (`-r`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootSel {
    One(i32),
    All,
}

/// Where the JSON report goes (`-J`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonOut {
    Stdout,
    File(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub ops: Vec<Coll>,
    /// The op as the user named it (for the header).
    pub op_arg: String,
    /// The ranks. Without `-N` ([`Options::nranks_given`] false) the launcher picks them
    /// ([`crate::layout`]: one per GPU on the CUDA backend, [`DEFAULT_HOST_RANKS`] otherwise)
    /// and passes `--nranks` to the ranks; until then it holds [`DEFAULT_HOST_RANKS`].
    pub nranks: usize,
    /// `-N` was given.
    pub nranks_given: bool,
    /// `--start-mps`: start NVIDIA's MPS daemon when more ranks than GPUs share the GPUs and
    /// it is not running (see [`crate::layout`]).
    pub start_mps: bool,
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Step factor (> 1) or, when it is 1, `step_bytes` is added.
    pub step_factor: usize,
    pub step_bytes: usize,
    pub iters: usize,
    /// `-n` was not given: sizes whose iterations are slow run fewer of them (see
    /// [`Options::auto_iters`]).
    pub auto_iters: bool,
    pub warmup: usize,
    pub agg_iters: usize,
    pub check: usize,
    /// `-G`: the timed iterations are captured into a CUDA graph once and the graph is
    /// launched this many times (0: no graph, the launches are timed directly).
    pub cudagraph: usize,
    /// `-R`: how the send and receive buffers are registered, nccl-tests' `local_register`:
    /// [`REGISTER_NONE`], [`REGISTER_LOCAL`] (`ncclCommRegister`) or [`REGISTER_SYMMETRIC`]
    /// (`ncclMemAlloc` + `ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)`).
    pub local_register: u32,
    /// None: every operator.
    pub redops: Vec<Redop>,
    pub redop_arg: String,
    pub dtypes: Vec<DataType>,
    pub dtype_arg: String,
    pub root: RootSel,
    pub average: Average,
    pub json: Option<JsonOut>,
    /// Seconds the launcher lets the ranks run (0: no limit).
    pub timeout_s: u64,
    /// `--lib`: drive a libnccl-compatible library through the C ABI.
    pub lib: Option<String>,
    /// `--cudart`: the CUDA runtime library the C driver loads.
    pub cudart: Option<String>,
    /// `--host-memory`: the C driver uses host memory and the NULL stream (no CUDA).
    pub host_memory: bool,
    /// `--tune`: sweep algorithm x protocol x channels and write a tuner table
    /// ([`crate::tune`]).
    pub tune: bool,
    /// `--tune-out`: the table's path without extension (`.csv` and `.json` are written).
    pub tune_out: Option<String>,
    /// `--tune-channels`: the channel counts to try (empty: powers of two up to the most).
    pub tune_channels: Vec<u32>,
    /// Every `--lib` in order (`rustccl` names the Rust API). With more than one, the launcher
    /// runs the sweep once per library, one after the other ([`crate::plot::series_runs`]).
    pub libs: Vec<String>,
    /// `--plot`: an SVG of time and bus bandwidth against size for every library of the run.
    pub plot: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            ops: vec![Coll::AllReduce],
            op_arg: "all_reduce".into(),
            nranks: DEFAULT_HOST_RANKS,
            nranks_given: false,
            start_mps: false,
            min_bytes: 8,
            max_bytes: 128 << 20,
            step_factor: 2,
            step_bytes: 1 << 20,
            iters: 20,
            auto_iters: true,
            warmup: 1,
            agg_iters: 1,
            check: 1,
            cudagraph: 0,
            local_register: REGISTER_NONE,
            redops: vec![Redop::Sum],
            redop_arg: "sum".into(),
            dtypes: vec![DataType::Float32],
            dtype_arg: "float".into(),
            root: RootSel::One(0),
            average: Average::Max,
            json: None,
            timeout_s: 0,
            lib: None,
            cudart: None,
            host_memory: false,
            tune: false,
            tune_out: None,
            tune_channels: Vec::new(),
            libs: Vec::new(),
            plot: None,
        }
    }
}

pub const USAGE: &str = "\
USAGE: rustccl-bench [op] [options]

  op: all_reduce (default) | all_gather | reduce_scatter | broadcast | reduce | alltoall |
      alltoallv | gather | scatter | sendrecv | all   (also allreduce, all_reduce_perf, ...)

  -N, --nranks <n>          ranks, one local process each (default: one per GPU on the CUDA
                            backend, 4 on the host backend and with --host-memory)
      --start-mps           when there are more ranks than GPUs and NVIDIA's MPS daemon is not
                            running, start it (nvidia-cuda-mps-control -d) and stop it at the
                            end (also RUSTCCL_BENCH_START_MPS=1); without it such a run says in
                            one line that the ranks sharing a GPU time-slice (milliseconds per
                            call) and how to start MPS
  -b, --minbytes <size>     smallest size, K/M/G suffixes (default 8)
  -e, --maxbytes <size>     largest size (default 128M)
  -f, --stepfactor <f>      multiply the size by f each step (default 2)
  -i, --stepbytes <size>    add this to the size each step instead (sets the factor to 1)
  -n, --iters <n>           timed iterations per size (default 20; without -n, sizes where 20
                            would take over 0.25 s run fewer, at least 2, so that the default
                            sweep to 128M ends in seconds on the host backend)
  -w, --warmup_iters <n>    untimed iterations before each timed size (default 1)
  -m, --agg_iters <n>       operations per iteration, in one group (default 1)
  -c, --check <0|1>         check every element of one run per size first (default 1)
  -G, --cudagraph <n>       capture the timed iterations into a CUDA graph once per size and
                            time n launches of it (default 0: no graph); time per operation =
                            elapsed / (n x iters x agg_iters), as nccl-tests. CUDA only: the
                            cuda backend, or --lib without --host-memory; checks run uncaptured
  -R, --local_register <0|1|2>
                            how the send and receive buffers are registered, as nccl-tests
                            (default 0: plain buffers); 1: ncclCommRegister on plain buffers
                            (--lib only; the Rust API refuses it); 2: symmetric windows: the
                            buffers come from ncclMemAlloc (the Rust API: the backend's
                            alloc_symmetric) and every rank registers them, send then receive,
                            with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC); they are
                            deregistered before they are freed
  -o, --op <sum|prod|min|max|avg|premulsum|mulsum|all>    reduction operator (default sum)
  -d, --datatype <type|all> int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
                            f8e4m3 f8e5m2 (also float16, float32, bf16, fp8e4m3, ...; default float)
  -r, --root <root|all>     root of broadcast/reduce/gather/scatter (default 0)
  -a, --average <0|1|2|3>   reported time: rank 0 / average / min / max over ranks (default 3, max)
  -J, --json <file|->       also write every row as JSON to a file, or to stdout with '-'
                            (the table then goes to stderr)
  -T, --timeout <s>         kill the ranks after s seconds (default 0, none)
  -t, -g <1>                accepted for nccl-tests compatibility (one rank per process)
      --lib <path>          drive a libnccl-compatible library (libnccl.so.2) through its C ABI
                            instead of rustccl's Rust API; give it several times (`rustccl` for
                            the Rust API) to run the sweep once per library, one after the other
      --plot <file.svg>     write an SVG plot: time and bus bandwidth (out-of-place) against
                            size, log-log, one line per library (and operation)
      --cudart <path>       the CUDA runtime for --lib, and for -G (default: libcudart.so,
                            .so.13, .so.12)
      --host-memory         with --lib: host memory and the NULL stream, no CUDA (rustccl's
                            library with RUSTCCL_BACKEND=host)
      --tune                instead of one table: sweep algorithm x protocol x channels for each
                            tuned collective (all five unless an op is given) over the sizes,
                            and write the fastest per size range as a table for the csv-table
                            tuner (plugins/tuner-default); see docs/TUNING.md
      --tune-out <prefix>   with --tune: write <prefix>.csv and <prefix>.json (default
                            rustccl-tuner)
      --tune-channels <l>   with --tune: channel counts to try, e.g. 1,2,4 (default: powers of
                            two up to the backend's most, 32 with --lib)
  -h, --help

Sizes: each size is rounded down to whole elements of the type; every operation uses
count = size / sizeof(type) as nccl-tests does (all_gather, reduce_scatter, alltoall, gather,
scatter: count/nranks elements per rank). Timing: wall clock over the timed iterations after a
barrier, ended by a stream synchronize; busbw factors as nccl-tests. Without --lib the Rust API
runs on the backend RUSTCCL_BACKEND names (unset: cuda when a GPU is present, else host);
rank r uses GPU r % (GPU count).";

/// `-R 0`: plain buffers.
pub const REGISTER_NONE: u32 = 0;
/// `-R 1`: plain buffers registered with `ncclCommRegister` (local registration).
pub const REGISTER_LOCAL: u32 = 1;
/// `-R 2`: `ncclMemAlloc` buffers registered as symmetric windows (`ncclCommWindowRegister`
/// with `NCCL_WIN_COLL_SYMMETRIC`).
pub const REGISTER_SYMMETRIC: u32 = 2;

/// What a `-R` mode does, for the header.
pub fn register_text(mode: u32) -> &'static str {
    match mode {
        REGISTER_NONE => "none",
        REGISTER_LOCAL => "local registration: ncclCommRegister",
        REGISTER_SYMMETRIC => "symmetric windows: ncclMemAlloc + ncclCommWindowRegister",
        _ => "?",
    }
}

/// The `--lib` value that names rustccl's Rust API (no C library).
pub const RUST_API_LIB: &str = "rustccl";

/// The ranks without `-N` when they do not run on GPUs.
pub const DEFAULT_HOST_RANKS: usize = 4;

/// Seconds of timed iterations a size may take with automatic iterations.
pub const AUTO_BUDGET_S: f64 = 0.25;

fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

/// A size with an optional K/M/G suffix (binary units, like nccl-tests; decimals allowed).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('b' | 'B') if t.len() > 1 => (&t[..t.len() - 1], 1),
        _ => (t, 1),
    };
    let num = num.trim();
    if let Ok(v) = num.parse::<u64>() {
        return v
            .checked_mul(mult)
            .map(|b| b as usize)
            .ok_or_else(|| format!("size {s:?} is too large"));
    }
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok((v * mult as f64) as usize),
        _ => err(format!(
            "invalid size {s:?} (a number with an optional K, M or G suffix)"
        )),
    }
}

fn parse_int(flag: &str, s: &str) -> Result<i64, String> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16)
    } else {
        t.parse::<i64>()
    };
    r.map_err(|_| format!("{flag}: {s:?} is not an integer"))
}

fn parse_count(flag: &str, s: &str, min: i64) -> Result<usize, String> {
    let v = parse_int(flag, s)?;
    if v < min {
        return err(format!("{flag}: {v} is too small (at least {min})"));
    }
    Ok(v as usize)
}

/// The operation(s) a name selects: `all_reduce`, `allreduce`, `all_reduce_perf`,
/// `All-Reduce`, ... and `all`.
pub fn parse_op(s: &str) -> Result<Vec<Coll>, String> {
    let mut k: String = s
        .to_ascii_lowercase()
        .chars()
        .filter(|c| !matches!(c, '_' | '-'))
        .collect();
    if let Some(stripped) = k.strip_suffix("perf") {
        k = stripped.to_string();
    }
    if k == "all" {
        return Ok(Coll::ALL.to_vec());
    }
    if k == "bcast" {
        return Ok(vec![Coll::Broadcast]);
    }
    Coll::ALL
        .iter()
        .find(|c| c.name().replace('_', "") == k)
        .map(|c| vec![*c])
        .ok_or_else(|| {
            let names: Vec<&str> = Coll::ALL.iter().map(|c| c.name()).collect();
            format!(
                "unknown operation {s:?}; one of {} or all",
                names.join(", ")
            )
        })
}

/// The element type a name selects (nccl-tests' names and rustccl's).
pub fn parse_dtype_one(s: &str) -> Option<DataType> {
    use DataType::*;
    Some(match s.to_ascii_lowercase().as_str() {
        "int8" | "char" | "i8" => Int8,
        "uint8" | "u8" => Uint8,
        "int32" | "int" | "i32" => Int32,
        "uint32" | "u32" => Uint32,
        "int64" | "i64" => Int64,
        "uint64" | "u64" => Uint64,
        "half" | "float16" | "fp16" | "f16" => Float16,
        "float" | "float32" | "fp32" | "f32" => Float32,
        "double" | "float64" | "fp64" | "f64" => Float64,
        "bfloat16" | "bf16" => Bfloat16,
        "f8e4m3" | "float8e4m3" | "fp8e4m3" | "e4m3" | "fp8_e4m3" => Float8e4m3,
        "f8e5m2" | "float8e5m2" | "fp8e5m2" | "e5m2" | "fp8_e5m2" => Float8e5m2,
        _ => return None,
    })
}

pub fn parse_dtypes(s: &str) -> Result<Vec<DataType>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(DataType::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        match parse_dtype_one(part.trim()) {
            Some(t) if !out.contains(&t) => out.push(t),
            Some(_) => {}
            None => return err(format!("unknown datatype {part:?}; one of int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2, or all")),
        }
    }
    Ok(out)
}

pub fn parse_redops(s: &str) -> Result<Vec<Redop>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Redop::ALL.to_vec());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let r = match part.trim().to_ascii_lowercase().as_str() {
            "sum" => Redop::Sum,
            "prod" => Redop::Prod,
            "max" => Redop::Max,
            "min" => Redop::Min,
            "avg" => Redop::Avg,
            "premulsum" | "mulsum" => Redop::PreMulSum,
            _ => return err(format!("unknown reduction operator {part:?}; one of sum prod min max avg premulsum, or all")),
        };
        if !out.contains(&r) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Parses the arguments (without the program name). `prog` is the program's file name: a
/// copy or link named like an operation (`all_gather_perf`) selects it by default.
pub fn parse(args: &[String], prog: Option<&str>) -> Result<Options, String> {
    let mut o = Options::default();
    if let Some(ops) = prog.and_then(|p| parse_op(p).ok()) {
        if ops.len() == 1 {
            o.op_arg = ops[0].name().to_string();
            o.ops = ops;
        }
    }
    let mut factor_given = false;
    let mut step_given = false;
    let mut op_given = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        i += 1;
        // Flags without a value.
        match a {
            "-h" | "--help" => return err(USAGE),
            "--host-memory" => {
                o.host_memory = true;
                continue;
            }
            "--start-mps" => {
                o.start_mps = true;
                continue;
            }
            "--tune" => {
                o.tune = true;
                continue;
            }
            _ => {}
        }
        if !a.starts_with('-') || a == "-" {
            if op_given {
                return err(format!(
                    "unexpected argument {a:?} (the operation is already {:?})",
                    o.op_arg
                ));
            }
            o.ops = parse_op(a)?;
            o.op_arg = a.to_string();
            op_given = true;
            continue;
        }
        // A flag with a value: `-b 8`, `-b8`, `--minbytes 8`, `--minbytes=8`.
        let (flag, inline): (String, Option<String>) = if let Some(long) = a.strip_prefix("--") {
            match long.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
                None => (a.to_string(), None),
            }
        } else if a.len() > 2 {
            (a[..2].to_string(), Some(a[2..].to_string()))
        } else {
            (a.to_string(), None)
        };
        let known = [
            "-N",
            "--nranks",
            "-b",
            "--minbytes",
            "-e",
            "--maxbytes",
            "-f",
            "--stepfactor",
            "-i",
            "--stepbytes",
            "-n",
            "--iters",
            "-w",
            "--warmup_iters",
            "-m",
            "--agg_iters",
            "-c",
            "--check",
            "-G",
            "--cudagraph",
            "-R",
            "--local_register",
            "-o",
            "--op",
            "-d",
            "--datatype",
            "-r",
            "--root",
            "-a",
            "--average",
            "-J",
            "--json",
            "-T",
            "--timeout",
            "-t",
            "--nthreads",
            "-g",
            "--ngpus",
            "--lib",
            "--plot",
            "--cudart",
            "--tune-out",
            "--tune-channels",
        ];
        if !known.contains(&flag.as_str()) {
            return err(format!("unknown option {a:?}\n\n{USAGE}"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args
                    .get(i)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))?;
                i += 1;
                v
            }
        };
        let v = value.as_str();
        match flag.as_str() {
            "-N" | "--nranks" => {
                o.nranks = parse_count(&flag, v, 1)?;
                o.nranks_given = true;
            }
            "-b" | "--minbytes" => o.min_bytes = parse_size(v)?,
            "-e" | "--maxbytes" => o.max_bytes = parse_size(v)?,
            "-f" | "--stepfactor" => {
                o.step_factor = parse_count(&flag, v, 1)?;
                factor_given = true;
            }
            "-i" | "--stepbytes" => {
                o.step_bytes = parse_size(v)?;
                step_given = true;
            }
            "-n" | "--iters" => {
                o.iters = parse_count(&flag, v, 1)?;
                o.auto_iters = false;
            }
            "-w" | "--warmup_iters" => o.warmup = parse_count(&flag, v, 0)?,
            "-m" | "--agg_iters" => o.agg_iters = parse_count(&flag, v, 1)?,
            "-c" | "--check" => o.check = parse_count(&flag, v, 0)?,
            "-G" | "--cudagraph" => o.cudagraph = parse_count(&flag, v, 0)?,
            "-R" | "--local_register" => {
                o.local_register = match parse_int(&flag, v)? {
                    0 => REGISTER_NONE,
                    1 => REGISTER_LOCAL,
                    2 => REGISTER_SYMMETRIC,
                    _ => return err(format!("{flag} {v}: one of 0 (plain buffers), 1 (ncclCommRegister), 2 (symmetric windows)")),
                }
            }
            "-o" | "--op" => {
                o.redops = parse_redops(v)?;
                o.redop_arg = v.to_string();
            }
            "-d" | "--datatype" => {
                o.dtypes = parse_dtypes(v)?;
                o.dtype_arg = v.to_string();
            }
            "-r" | "--root" => {
                o.root = if v.eq_ignore_ascii_case("all") {
                    RootSel::All
                } else {
                    let r = parse_int(&flag, v)?;
                    if r == -1 {
                        RootSel::All
                    } else if r < 0 || r > i32::MAX as i64 {
                        return err(format!("{flag}: root {r} is out of range"));
                    } else {
                        RootSel::One(r as i32)
                    }
                }
            }
            "-a" | "--average" => {
                o.average = Average::from_i64(parse_int(&flag, v)?)
                    .ok_or_else(|| format!("{flag}: one of 0 1 2 3"))?
            }
            "-J" | "--json" => {
                o.json = Some(if v == "-" {
                    JsonOut::Stdout
                } else {
                    JsonOut::File(v.to_string())
                })
            }
            "-T" | "--timeout" => o.timeout_s = parse_count(&flag, v, 0)? as u64,
            "-t" | "--nthreads" | "-g" | "--ngpus" => {
                if parse_int(&flag, v)? != 1 {
                    return err(format!("{flag} {v}: rustccl-bench runs one rank per process; use -N for more ranks"));
                }
            }
            "--lib" => o.libs.push(v.to_string()),
            "--plot" => {
                if v.is_empty() {
                    return err("--plot needs a file name (e.g. --plot sweep.svg)");
                }
                o.plot = Some(v.to_string())
            }
            "--cudart" => o.cudart = Some(v.to_string()),
            "--tune-out" => o.tune_out = Some(v.to_string()),
            "--tune-channels" => {
                o.tune_channels = v
                    .split(',')
                    .map(|c| c.trim().parse::<u32>().ok().filter(|&c| c > 0))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| format!("{flag} {v}: a comma list of channel counts (1 or more)"))?;
            }
            _ => unreachable!(),
        }
    }
    // nccl-tests: -i alone means additive steps; -f > 1 means multiplicative.
    if step_given && !factor_given {
        o.step_factor = 1;
    }
    if o.step_factor <= 1 && o.step_bytes == 0 {
        return err("the size never grows: give -f > 1 or -i > 0");
    }
    if o.min_bytes > o.max_bytes {
        return err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
            o.min_bytes, o.max_bytes
        ));
    }
    // Without -N the launcher checks the root once it has picked the ranks.
    if o.nranks_given {
        o.check_root()?;
    }
    // One library: this process drives it. Several: the launcher runs one after the other,
    // each rank process getting one `--lib` (or none for the Rust API).
    if let [one] = o.libs.as_slice() {
        o.lib = (one != RUST_API_LIB).then(|| one.clone());
    }
    let c_libs = o.libs.iter().filter(|l| *l != RUST_API_LIB).count();
    if o.libs.len() > 1 && o.tune {
        return err("--tune takes one library: give --lib once");
    }
    if o.host_memory && c_libs == 0 {
        return err(
            "--host-memory goes with --lib (the Rust API driver always uses the backend's memory)",
        );
    }
    if o.cudart.is_some() && c_libs == 0 && o.cudagraph == 0 {
        return err("--cudart goes with --lib or -G");
    }
    if o.tune && o.cudagraph > 0 {
        return err("--tune does not take -G (its sweeps launch the operations directly)");
    }
    if (o.tune_out.is_some() || !o.tune_channels.is_empty()) && !o.tune {
        return err("--tune-out and --tune-channels go with --tune");
    }
    if o.tune && !op_given {
        o.ops = crate::tune::TUNED.to_vec();
        o.op_arg = "all tuned collectives".into();
    }
    Ok(o)
}

/// The sizes of the sweep, nccl-tests' loop: from min to max, times the factor (> 1) or plus
/// the step.
pub fn sweep(min: usize, max: usize, factor: usize, step: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut size = min;
    while size <= max {
        out.push(size);
        let next = if factor > 1 {
            size.checked_mul(factor)
        } else {
            size.checked_add(step)
        };
        size = match next {
            // A size of 0 times a factor stays 0: step it to 1 so the sweep ends.
            Some(0) if factor > 1 => 1,
            Some(s) if s > size => s,
            _ => break,
        };
    }
    out
}

impl Options {
    pub fn sizes(&self) -> Vec<usize> {
        sweep(
            self.min_bytes,
            self.max_bytes,
            self.step_factor,
            self.step_bytes,
        )
    }

    /// A root (`-r`) of a rooted operation must be one of the ranks.
    pub fn check_root(&self) -> Result<(), String> {
        if let RootSel::One(r) = self.root {
            let rooted = self.ops.iter().any(|c| c.has_root());
            if rooted && r as usize >= self.nranks {
                return err(format!("root {r} is out of range for {} ranks", self.nranks));
            }
        }
        Ok(())
    }

    /// The roots a rooted operation runs with.
    pub fn roots(&self, nranks: usize) -> Vec<i32> {
        match self.root {
            RootSel::One(r) => vec![r],
            RootSel::All => (0..nranks as i32).collect(),
        }
    }

    /// The timed iterations of one size whose iteration was measured at `est_s` seconds (the
    /// slowest rank's warm-up): `iters`, or with automatic iterations as many as fit in
    /// [`AUTO_BUDGET_S`], between 2 and `iters`.
    pub fn auto_iters(&self, est_s: f64) -> usize {
        if !self.auto_iters || est_s <= 0.0 {
            return self.iters;
        }
        let fit = (AUTO_BUDGET_S / est_s).floor();
        if fit >= self.iters as f64 {
            self.iters
        } else {
            (fit as usize).clamp(2.min(self.iters), self.iters)
        }
    }

    /// The step as nccl-tests prints it: `2(factor)` or `1048576(bytes)`.
    pub fn step_text(&self) -> String {
        if self.step_factor > 1 {
            format!("{}(factor)", self.step_factor)
        } else {
            format!("{}(bytes)", self.step_bytes)
        }
    }
}

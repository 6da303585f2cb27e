//! Collective scenarios of the rank worker: the correctness matrix (every collective × op ×
//! type, odd counts, unaligned buffers, roots, in-place) and the group scenarios (64 send/recv
//! pairs in one group, several communicators in one group).
//!
//! # How the matrix checks a result
//!
//! Every case (one collective call) gets fresh pseudo-random inputs from `COLL_SEED` and the
//! case's index. Every worker regenerates the inputs of *all* ranks (so it needs nothing from
//! the others to check), computes the expected output of its own rank independently of the
//! library — exactly, in `i128` for integers and `f64` for floats — and only then encodes it to
//! the element type (the library's `reduce::float` / `reduce::fp8` narrowing helpers are used
//! for that encoding and nothing else; decoding, for messages and tolerances, is this file's
//! own). Outputs are poisoned before each call (0xA5 bytes, or 0xFF, a NaN in every float
//! type, on alternate cases) and the whole buffer is checked after it: every output element,
//! the bytes before and after the output (still poison), gaps (AlltoAllv), buffers a rank must
//! not write (a non-root's receive buffer of Reduce/Gather), and the send buffer (unchanged).
//!
//! Inputs are chosen so that the exact result is representable whatever order the ranks'
//! contributions are combined in, so results are compared bit for bit:
//! * integers, Sum/Prod/PreMulSum: any values; two's complement wraps, and wrapping `+`/`*` give
//!   the same result in any order (arithmetic mod 2^bits), so the reference is the exact
//!   result reduced mod 2^bits.
//! * integers, Avg: values bounded so that the sum cannot overflow; the result is the exact
//!   sum divided by nranks, truncated toward zero (`reduce`'s documented SumPostDiv).
//! * Min/Max: any finite values (floats: random significands and exponents over the whole
//!   range, subnormals included, and ±0, with -0 < +0 as `reduce` documents); no rounding.
//! * float Sum, PreMulSum, and Avg over a power-of-two number of ranks: every contribution
//!   (input × scalar, the scalar being 1, 1/nranks, or the rank's PreMulSum scalar, all exact in
//!   every type) is an integer multiple of a power-of-two unit, and the contributions' absolute
//!   values add up to at most 2^p units (p = the type's precision: e5m2 3, e4m3 4, bf16 8,
//!   f16 11, f32 24; f64 capped at 2^40), so every partial sum of any subset of ranks is
//!   exact.
//! * float Prod: factors ±1, ±2, ±1/2, ±3, ±3/2, ±3·2, 0, with per-type caps on the number of
//!   3s (3^a < 2^p) and on the total exponent, so every partial product of any subset is
//!   exact.
//!
//! The one comparison with a tolerance: **float Avg over a number of ranks that is not a power
//! of two** (3 here). The library computes it as NCCL does, as PreMulSum with the scalar
//! 1/nranks rounded to the type, each product rounded, then n-1 rounded additions; so with
//! u = 2^-p the result may differ from the exact average by about (n+1)·u·Σ|x|/n (one
//! rounding of the scalar, one per product, one per addition, each relative to at most
//! Σ|x|/n). The tolerance is 1.5·(n+1)·u·Σ|x|/n: the factor 1.5 covers fp8, whose every
//! operation is rounded to half and then to fp8 (two roundings, 2^-11 + 2^-p), and the
//! second-order terms. Inputs are small integers, so no product is subnormal.

use std::time::Instant;

use rustccl::backend::{DevicePtr, Stream};
use rustccl::reduce::{float, fp8};
use rustccl::spec::Collective;
use rustccl::testing::reference::{self, Pattern, Source};
use rustccl::types::DataType;
use rustccl::{group_end, group_start, CommConfig, Communicator, Error, ReduceOp, Scalar, UniqueId};

const S: Stream = Stream::DEFAULT;
/// Bytes checked after each output (and before it, where the offset leaves room).
const GUARD: usize = 64;
/// Most mismatch lines printed.
const MAX_REPORTS: usize = 20;

// ---- Random numbers --------------------------------------------------------------------------

/// splitmix64: small, fast, and good enough for test data.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut r = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        r.next();
        r
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in `-k..=k`.
    pub fn sym(&mut self, k: i64) -> i64 {
        self.below(2 * k as u64 + 1) as i64 - k
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Mixes several words into one seed.
pub fn mix(words: &[u64]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for &w in words {
        h = Rng::new(h ^ w.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next();
    }
    h
}

// ---- Element types, independently of the library --------------------------------------------

fn is_int(dt: DataType) -> bool {
    !dt.is_float()
}

fn signed(dt: DataType) -> bool {
    matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64)
}

fn bits(dt: DataType) -> u32 {
    dt.size() as u32 * 8
}

/// `v` reduced into the range of integer type `dt` (mod 2^bits, two's complement).
fn wrap(dt: DataType, v: i128) -> i128 {
    let b = bits(dt);
    let m = (v as u128) & ((1u128 << b) - 1);
    if signed(dt) && m >> (b - 1) == 1 {
        m as i128 - (1i128 << b)
    } else {
        m as i128
    }
}

fn int_max(dt: DataType) -> i128 {
    if signed(dt) {
        (1i128 << (bits(dt) - 1)) - 1
    } else {
        (1i128 << bits(dt)) - 1
    }
}

fn int_min(dt: DataType) -> i128 {
    if signed(dt) {
        -(1i128 << (bits(dt) - 1))
    } else {
        0
    }
}

/// A float type's shape: precision p (significand bits, the implicit one included), the
/// smallest normal exponent, the largest finite value.
struct Fmt {
    p: u32,
    emin: i32,
    max: f64,
}

fn fmt(dt: DataType) -> Fmt {
    match dt {
        DataType::Float16 => Fmt { p: 11, emin: -14, max: 65504.0 },
        DataType::Bfloat16 => Fmt { p: 8, emin: -126, max: 3.3895313892515355e38 },
        DataType::Float8e4m3 => Fmt { p: 4, emin: -6, max: 448.0 },
        DataType::Float8e5m2 => Fmt { p: 3, emin: -14, max: 57344.0 },
        DataType::Float32 => Fmt { p: 24, emin: -126, max: f32::MAX as f64 },
        DataType::Float64 => Fmt { p: 53, emin: -1022, max: f64::MAX },
        _ => unreachable!("not a float type"),
    }
}

/// Writes `v` (already in range) as an element of integer type `dt`.
fn put_int(dt: DataType, v: i128, out: &mut [u8]) {
    let b = (v as u128).to_le_bytes();
    out[..dt.size()].copy_from_slice(&b[..dt.size()]);
}

/// Writes `v` as an element of float type `dt` (one rounding; exact for every value the
/// matrix expects exactly).
fn put_float(dt: DataType, v: f64, out: &mut [u8]) {
    match dt {
        DataType::Float16 => out[..2].copy_from_slice(&float::f64_to_f16(v).to_le_bytes()),
        DataType::Bfloat16 => out[..2].copy_from_slice(&float::f64_to_bf16(v).to_le_bytes()),
        DataType::Float8e4m3 => out[0] = fp8::f64_to_e4m3(v),
        DataType::Float8e5m2 => out[0] = fp8::f64_to_e5m2(v),
        DataType::Float32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        _ => unreachable!(),
    }
}

/// Value of a binary float with `eb` exponent bits and `mb` mantissa bits (IEEE layout); for
/// e4m3 (`fnuz == false`, no infinities) the all-ones code is NaN only with mantissa 111.
fn decode_bin(x: u64, eb: u32, mb: u32, e4m3: bool) -> f64 {
    let sign = if x >> (eb + mb) & 1 == 1 { -1.0 } else { 1.0 };
    let e = ((x >> mb) & ((1 << eb) - 1)) as i32;
    let m = (x & ((1 << mb) - 1)) as f64;
    let bias = (1 << (eb - 1)) - 1;
    let top = (1 << eb) - 1;
    if e == top && !e4m3 {
        return if m == 0.0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if e4m3 && e == top && m == 7.0 {
        return f64::NAN;
    }
    let scale = 2f64.powi(-(mb as i32));
    if e == 0 {
        sign * m * scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m * scale) * 2f64.powi(e - bias)
    }
}

/// The value of one element (this file's own decoding).
fn value(dt: DataType, b: &[u8]) -> f64 {
    let mut a = [0u8; 8];
    a[..dt.size()].copy_from_slice(&b[..dt.size()]);
    let u = u64::from_le_bytes(a);
    match dt {
        DataType::Int8 => u as u8 as i8 as f64,
        DataType::Uint8 => u as u8 as f64,
        DataType::Int32 => u as u32 as i32 as f64,
        DataType::Uint32 => u as u32 as f64,
        DataType::Int64 => u as i64 as f64,
        DataType::Uint64 => u as f64,
        DataType::Float16 => decode_bin(u, 5, 10, false),
        DataType::Bfloat16 => decode_bin(u, 8, 7, false),
        DataType::Float8e4m3 => decode_bin(u, 4, 3, true),
        DataType::Float8e5m2 => decode_bin(u, 5, 2, false),
        DataType::Float32 => f32::from_bits(u as u32) as f64,
        DataType::Float64 => f64::from_bits(u),
    }
}

fn show(dt: DataType, b: &[u8]) -> String {
    let hex: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
    format!("0x{hex} ({})", value(dt, b))
}

// ---- The matrix's vocabulary -------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
    AlltoAllv,
    Gather,
    Scatter,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 10] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AlltoAll,
        Coll::AlltoAllv,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecv,
    ];
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "AllReduce",
            Coll::AllGather => "AllGather",
            Coll::ReduceScatter => "ReduceScatter",
            Coll::Broadcast => "Broadcast",
            Coll::Reduce => "Reduce",
            Coll::AlltoAll => "AlltoAll",
            Coll::AlltoAllv => "AlltoAllv",
            Coll::Gather => "Gather",
            Coll::Scatter => "Scatter",
            Coll::SendRecv => "SendRecv",
        }
    }
    /// NCCL's collective (`None`: SendRecv and AlltoAllv, which are groups of sends and receives).
    fn collective(self) -> Option<Collective> {
        Some(match self {
            Coll::AllReduce => Collective::AllReduce,
            Coll::AllGather => Collective::AllGather,
            Coll::ReduceScatter => Collective::ReduceScatter,
            Coll::Broadcast => Collective::Broadcast,
            Coll::Reduce => Collective::Reduce,
            Coll::AlltoAll => Collective::AlltoAll,
            Coll::Gather => Collective::Gather,
            Coll::Scatter => Collective::Scatter,
            Coll::AlltoAllv | Coll::SendRecv => return None,
        })
    }
    fn reduces(self) -> bool {
        self.collective().is_some_and(|c| c.spec().reduces)
    }
    fn rooted(self) -> bool {
        self.collective().is_some_and(|c| c.spec().rooted)
    }
    fn has_in_place(self) -> bool {
        !matches!(self, Coll::AlltoAll | Coll::AlltoAllv | Coll::SendRecv)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    /// PreMulSum with `Scalar::Host`: rank r's scalar is (r+1)/2 for floats, ±(r+1) for
    /// integers (negative on odd ranks of signed types).
    PreMulHost,
    /// PreMulSum with `Scalar::Device`: rank r's scalar is (n-r)/4 for floats, ±(n-r) for
    /// integers (negative on even ranks of signed types), one element of the type in device
    /// memory.
    PreMulDevice,
}

impl Op {
    pub const ALL: [Op; 7] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg, Op::PreMulHost, Op::PreMulDevice];
    fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
            Op::Avg => "avg",
            Op::PreMulHost => "premulsum-host",
            Op::PreMulDevice => "premulsum-device",
        }
    }
}

/// Rank r's PreMulSum scalar: exact in every type for up to 8 ranks (e5m2 has 3 significant
/// bits: 3.5 and 1.75 are, 7.5 and 3.75 are not).
fn scalar_of(op: Op, dt: DataType, r: usize, n: usize) -> f64 {
    let neg = |odd: bool| if signed(dt) && (r % 2 == 1) == odd { -1.0 } else { 1.0 };
    match (op, dt.is_float()) {
        (Op::PreMulHost, true) => 0.5 * (r + 1) as f64,
        (Op::PreMulHost, false) => neg(true) * (r + 1) as f64,
        (Op::PreMulDevice, true) => 0.25 * (n - r) as f64,
        (Op::PreMulDevice, false) => neg(false) * (n - r) as f64,
        _ => 1.0,
    }
}

fn dtype_from_name(s: &str) -> Option<DataType> {
    DataType::ALL.into_iter().find(|d| d.name().eq_ignore_ascii_case(s.trim()))
}

/// One collective call of the matrix.
#[derive(Clone, Debug)]
pub struct Case {
    pub index: usize,
    pub coll: Coll,
    pub op: Op,
    pub dtype: DataType,
    pub count: usize,
    pub in_place: bool,
    pub root: usize,
    /// Element offsets of the send and receive pointers inside their allocations.
    pub send_off: usize,
    pub recv_off: usize,
    /// SendRecv: send to rank+shift, receive from rank-shift.
    pub shift: usize,
    pub poison: u8,
}

impl Case {
    fn describe(&self) -> String {
        let op = if self.coll.reduces() { format!(" {}", self.op.name()) } else { String::new() };
        let root = if self.coll.rooted() { format!(" root {}", self.root) } else { String::new() };
        let shift = if self.coll == Coll::SendRecv { format!(" shift {}", self.shift) } else { String::new() };
        format!(
            "#{} {}{op} {} count {}{root}{shift} {} offsets {}/{}",
            self.index,
            self.coll.name(),
            self.dtype,
            self.count,
            if self.in_place { "in-place" } else { "out-of-place" },
            self.send_off,
            self.recv_off
        )
    }
}

/// What the matrix runs, from the environment (defaults: everything).
/// * `COLL_COLLS`, `COLL_OPS`, `COLL_DTYPES`: comma lists of names (`all` or unset: all).
/// * `COLL_COUNTS`: comma list of counts (default `1,7,1001`).
/// * `COLL_LARGE`: types also run with 100003 elements (default `float32,bfloat16`; `none`),
///   with ops Sum and PreMulSum-device; plus one AllReduce of 1048583 float32 (over 4 MiB, so
///   the planner uses two channels) unless `none`.
/// * `COLL_ROOTS`: `all` (every root; the default with 3 ranks) or `one` (one non-zero root
///   per case, varying; the default otherwise).
/// * `COLL_SEED`: the data seed (the test passes a fresh one per run).
pub struct Matrix {
    colls: Vec<Coll>,
    ops: Vec<Op>,
    dtypes: Vec<DataType>,
    counts: Vec<usize>,
    large: Vec<DataType>,
    all_roots: bool,
    pub seed: u64,
}

fn env_list<T: Copy>(var: &str, all: &[T], name: impl Fn(T) -> String) -> Result<Vec<T>, Error> {
    let v = std::env::var(var).unwrap_or_default();
    if v.trim().is_empty() || v.trim() == "all" {
        return Ok(all.to_vec());
    }
    v.split(',')
        .map(|s| {
            all.iter()
                .copied()
                .find(|x| name(*x).eq_ignore_ascii_case(s.trim()))
                .ok_or_else(|| Error::invalid_argument(format!("{var}: unknown name {s:?}")))
        })
        .collect()
}

impl Matrix {
    pub fn from_env(nranks: usize) -> Result<Matrix, Error> {
        let counts = match std::env::var("COLL_COUNTS") {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|s| s.trim().parse().map_err(|_| Error::invalid_argument(format!("COLL_COUNTS: {s:?}"))))
                .collect::<Result<Vec<usize>, Error>>()?,
            _ => vec![1, 7, 1001],
        };
        let large = match std::env::var("COLL_LARGE") {
            Ok(v) if v.trim() == "none" => vec![],
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|s| dtype_from_name(s).ok_or_else(|| Error::invalid_argument(format!("COLL_LARGE: {s:?}"))))
                .collect::<Result<Vec<_>, Error>>()?,
            _ => vec![DataType::Float32, DataType::Bfloat16],
        };
        let all_roots = match std::env::var("COLL_ROOTS").as_deref() {
            Ok("all") => true,
            Ok("one") => false,
            _ => nranks == 3,
        };
        let seed = std::env::var("COLL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
        Ok(Matrix {
            colls: env_list("COLL_COLLS", &Coll::ALL, |c| c.name().to_string())?,
            ops: env_list("COLL_OPS", &Op::ALL, |o| o.name().to_string())?,
            dtypes: env_list("COLL_DTYPES", &DataType::ALL, |d| d.name().to_string())?,
            counts,
            large,
            all_roots,
            seed,
        })
    }

    /// Every case, in the same order on every rank.
    pub fn cases(&self, n: usize) -> Vec<Case> {
        let mut out: Vec<Case> = Vec::new();
        let mut push = |coll: Coll, op: Op, dtype: DataType, count: usize, in_place: bool, root: usize| {
            let i = out.len();
            out.push(Case {
                index: i,
                coll,
                op,
                dtype,
                count,
                in_place,
                root,
                send_off: i % 4,
                recv_off: (i / 4 + 1 + i) % 4,
                shift: if n > 1 { 1 + (i / 2) % (n - 1) } else { 0 },
                poison: if i % 2 == 0 { 0xA5 } else { 0xFF },
            });
        };
        let mut k = 0usize;
        for &coll in &self.colls {
            for &dtype in &self.dtypes {
                let ops: Vec<Op> = if coll.reduces() { self.ops.clone() } else { vec![Op::Sum] };
                for &op in &ops {
                    let mut counts = self.counts.clone();
                    if self.large.contains(&dtype) && (!coll.reduces() || matches!(op, Op::Sum | Op::PreMulDevice)) {
                        counts.push(100_003);
                    }
                    for &count in &counts {
                        for in_place in [false, true] {
                            if in_place && !coll.has_in_place() {
                                continue;
                            }
                            let roots: Vec<usize> = if !coll.rooted() || n == 1 {
                                vec![0]
                            } else if self.all_roots {
                                (0..n).collect()
                            } else {
                                k += 1;
                                vec![1 + k % (n - 1)]
                            };
                            for root in roots {
                                push(coll, op, dtype, count, in_place, root);
                            }
                        }
                    }
                }
            }
        }
        if !self.large.is_empty()
            && self.colls.contains(&Coll::AllReduce)
            && self.dtypes.contains(&DataType::Float32)
            && self.ops.contains(&Op::Sum)
        {
            push(Coll::AllReduce, Op::Sum, DataType::Float32, 1_048_583, false, 0);
            push(Coll::AllReduce, Op::Sum, DataType::Float32, 1_048_583, true, 0);
        }
        out
    }
}

// ---- Inputs ------------------------------------------------------------------------------------

/// The exact values of every rank's input (reducing collectives).
enum Vals {
    Int(Vec<Vec<i128>>),
    Float(Vec<Vec<f64>>),
}

/// Every rank's input bytes, and for reducing collectives their exact values.
struct Inputs {
    bytes: Vec<Vec<u8>>,
    vals: Option<Vals>,
}

/// AlltoAllv's uneven counts: elements rank `from` sends to rank `to` (zero for some pairs).
fn v_count(from: usize, to: usize, c: usize) -> usize {
    (c * ((from + 2 * to) % 4)) / 2 + (from + to) % 2
}

/// AlltoAllv layout of rank `r`: send displacements (peers in reverse order, one element gap
/// between blocks), receive displacements (peers in order, two elements gap), total lengths.
fn v_layout(r: usize, n: usize, c: usize) -> (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, usize, usize) {
    let sc: Vec<usize> = (0..n).map(|p| v_count(r, p, c)).collect();
    let rc: Vec<usize> = (0..n).map(|p| v_count(p, r, c)).collect();
    let mut sd = vec![0; n];
    let mut cur = 0;
    for p in (0..n).rev() {
        sd[p] = cur;
        cur += sc[p] + 1;
    }
    let slen = cur;
    let mut rd = vec![0; n];
    cur = 0;
    for p in 0..n {
        rd[p] = cur;
        cur += rc[p] + 2;
    }
    (sc, sd, rc, rd, slen, cur)
}

/// Elements of rank `r`'s (input, output) (0 where the rank has none).
fn lens(case: &Case, n: usize, r: usize) -> (usize, usize) {
    let c = case.count;
    match case.coll.collective() {
        Some(coll) => coll.spec().extents(c, n, r, case.root),
        None if case.coll == Coll::AlltoAllv => {
            let v = v_layout(r, n, c);
            (v.4, v.5)
        }
        None => (c, c),
    }
}

/// Elements of rank `r`'s input.
fn send_len(case: &Case, n: usize, r: usize) -> usize {
    lens(case, n, r).0
}

/// Elements of rank `r`'s output (0 where the rank has none).
fn recv_len(case: &Case, n: usize, r: usize) -> usize {
    lens(case, n, r).1
}

/// Caps for float Prod factors: most 3s, most total positive and negative powers of two.
fn prod_caps(dt: DataType) -> (u32, i32, i32) {
    match dt {
        DataType::Float8e5m2 => (1, 8, 8),
        DataType::Float8e4m3 => (2, 5, 5),
        DataType::Bfloat16 => (5, 8, 8),
        DataType::Float16 => (6, 6, 8),
        _ => (8, 16, 16),
    }
}

/// A random finite value of float type `dt`: ±m·2^e with m < 2^p over the whole exponent range
/// (subnormals included; f32/f64 over a narrower but still wide range), ±0 one time in eight.
fn any_float(rng: &mut Rng, dt: DataType) -> f64 {
    let f = fmt(dt);
    let sign = if rng.next() & 1 == 1 { -1.0 } else { 1.0 };
    if rng.below(8) == 0 {
        return sign * 0.0;
    }
    let (lo, hi) = match dt {
        DataType::Float32 => (-149, 100),
        DataType::Float64 => (-1074, 960),
        _ => {
            let lo = f.emin - (f.p as i32 - 1);
            let hi = f.max.log2().floor() as i32 - (f.p as i32 - 1);
            (lo, hi)
        }
    };
    loop {
        let m = rng.below(1u64 << f.p.min(52)) as f64;
        let e = lo + rng.below((hi - lo + 1) as u64) as i32;
        let v = m * 2f64.powi(e);
        if v <= f.max && v.is_finite() {
            return sign * v;
        }
    }
}

/// The float quantum of inputs (a power of two), and the exact-integer limit 2^p (in units).
fn float_grid(dt: DataType) -> (f64, i64) {
    match dt {
        DataType::Float8e4m3 | DataType::Float8e5m2 => (1.0, 1 << fmt(dt).p),
        DataType::Float16 => (0.5, 1 << 11),
        DataType::Bfloat16 => (0.0625, 1 << 8),
        DataType::Float32 => (1.0 / 1024.0, 1 << 24),
        _ => (1.0 / (1 << 20) as f64, 1 << 40),
    }
}

fn gen_inputs(case: &Case, n: usize, seed: u64) -> Inputs {
    let dt = case.dtype;
    let es = dt.size();
    if !case.coll.reduces() {
        // Data movement: random bytes (NaN payloads and all), per rank.
        let bytes = (0..n)
            .map(|r| {
                let mut b = vec![0u8; send_len(case, n, r) * es];
                Rng::new(mix(&[seed, case.index as u64, r as u64])).fill(&mut b);
                b
            })
            .collect();
        return Inputs { bytes, vals: None };
    }
    let len = send_len(case, n, 0);
    let mut rng = Rng::new(mix(&[seed, case.index as u64, 0xC011]));
    let mut bytes = vec![vec![0u8; len * es]; n];
    if is_int(dt) {
        let mut vals = vec![vec![0i128; len]; n];
        let (lo, hi) = (int_min(dt), int_max(dt));
        for i in 0..len {
            for r in 0..n {
                let v = match case.op {
                    Op::Avg => {
                        // The sum of n values in [lo/n, hi/n] cannot overflow.
                        let (a, b) = (lo / n as i128, hi / n as i128);
                        a + (rng.next() as u128 % (b - a + 1) as u128) as i128
                    }
                    Op::Prod if rng.next() & 1 == 0 => {
                        let small: &[i128] = if signed(dt) { &[-1, 1, 2, 3, -2] } else { &[1, 2, 3] };
                        small[rng.below(small.len() as u64) as usize]
                    }
                    _ => wrap(dt, ((rng.next() as u128) << 64 | rng.next() as u128) as i128),
                };
                vals[r][i] = v;
                put_int(dt, v, &mut bytes[r][i * es..]);
            }
        }
        return Inputs { bytes, vals: Some(Vals::Int(vals)) };
    }
    let mut vals = vec![vec![0f64; len]; n];
    let (q, m) = float_grid(dt);
    // Contribution of rank r in units: weight w[r] times its integer k; unit = q / den.
    let (w, den): (Vec<i64>, f64) = match case.op {
        Op::PreMulHost => ((0..n).map(|r| r as i64 + 1).collect(), 2.0),
        Op::PreMulDevice => ((0..n).map(|r| (n - r) as i64).collect(), 4.0),
        Op::Avg if n.is_power_of_two() => (vec![1; n], n as f64),
        _ => (vec![1; n], 1.0),
    };
    let _ = den;
    let (a3, ep, en) = prod_caps(dt);
    for i in 0..len {
        match case.op {
            Op::Min | Op::Max => {
                for r in 0..n {
                    vals[r][i] = any_float(&mut rng, dt);
                }
            }
            Op::Prod => {
                let (mut threes, mut pos, mut neg) = (0u32, 0i32, 0i32);
                for r in 0..n {
                    let sign = if rng.next() & 1 == 1 { -1.0 } else { 1.0 };
                    let v = if rng.below(64) == 0 {
                        sign * 0.0
                    } else {
                        let a = (rng.below(3) == 0) as u32;
                        let b = rng.below(3) as i32 - 1;
                        if threes + a <= a3 && pos + b.max(0) <= ep && neg + (-b).max(0) <= en {
                            threes += a;
                            pos += b.max(0);
                            neg += (-b).max(0);
                            sign * 3f64.powi(a as i32) * 2f64.powi(b)
                        } else {
                            sign
                        }
                    };
                    vals[r][i] = v;
                }
            }
            _ => {
                // A budget of m units shared by the ranks (starting at a rotating rank), each
                // taking at most about 3/n of it, so that no partial sum is inexact.
                let mut budget = m;
                let start = rng.below(n as u64) as usize;
                for j in 0..n {
                    let r = (start + j) % n;
                    let cap = (3 * m / (n as i64 * w[r])).max(1);
                    let kmax = (budget / w[r]).min(cap);
                    let k = rng.sym(kmax);
                    budget -= k.abs() * w[r];
                    vals[r][i] = k as f64 * q;
                }
            }
        }
        for r in 0..n {
            put_float(dt, vals[r][i], &mut bytes[r][i * es..]);
        }
    }
    Inputs { bytes, vals: Some(Vals::Float(vals)) }
}

// ---- Reference -----------------------------------------------------------------------------------

/// The expected value of one reduced element.
enum Want {
    Exact,
    /// Compare numerically: |got - value| <= tol.
    Approx(f64, f64),
}

/// Reduces input element `i` over all ranks (the shared reference model's arithmetic); writes
/// the encoded exact result to `out`, or returns `Approx` (with `out` also holding the nearest
/// encoding, for messages).
fn reduce_ref(case: &Case, n: usize, vals: &Vals, i: usize, out: &mut [u8]) -> Want {
    let dt = case.dtype;
    let op = match case.op {
        Op::Sum => reference::Op::Sum,
        Op::Prod => reference::Op::Prod,
        Op::Min => reference::Op::Min,
        Op::Max => reference::Op::Max,
        Op::Avg => reference::Op::Avg,
        Op::PreMulHost | Op::PreMulDevice => reference::Op::PreMulSum,
    };
    let scalar = |r: usize| scalar_of(case.op, dt, r, n);
    match vals {
        Vals::Int(v) => {
            let res = reference::reduce_ints(op, n, |r| v[r][i], |r| scalar(r) as i128);
            put_int(dt, wrap(dt, res), out);
            Want::Exact
        }
        Vals::Float(v) => {
            let x = |r: usize| v[r][i];
            // NCCL's Avg multiplies by 1/nranks rounded to the type.
            let mut s = [0u8; 8];
            put_float(dt, 1.0 / n as f64, &mut s);
            let res = reference::reduce_floats(op, n, x, scalar, value(dt, &s));
            put_float(dt, res, out);
            if op == reference::Op::Avg && !n.is_power_of_two() {
                let u = 2f64.powi(-(fmt(dt).p as i32));
                let abs: f64 = (0..n).map(|r| x(r).abs()).sum();
                return Want::Approx(res, 1.5 * (n + 1) as f64 * u * abs / n as f64);
            }
            Want::Exact
        }
    }
}

// ---- Running one case ------------------------------------------------------------------------------

/// Buffers a rank reuses for every case: send (A), receive (B), PreMulSum scalar.
pub struct Bufs {
    a: DevicePtr,
    b: DevicePtr,
    scalar: DevicePtr,
    bytes: usize,
}

/// Element offsets, inside their buffers, of this rank's send data and receive pointer.
struct Layout {
    /// Send data lives in B (in-place) or A.
    send_in_b: bool,
    send_at: usize,
    recv_at: usize,
    /// Bytes of A and B the case uses (from the buffer's start, guard included).
    a_len: usize,
    b_len: usize,
}

fn layout(case: &Case, n: usize, me: usize) -> Layout {
    let es = case.dtype.size();
    let c = case.count;
    let (sl, rl) = (send_len(case, n, me), recv_len(case, n, me));
    if !case.in_place {
        let b_len = (case.recv_off + rl) * es + GUARD;
        return Layout {
            send_in_b: false,
            send_at: case.send_off,
            recv_at: case.recv_off,
            a_len: (case.send_off + sl) * es + GUARD,
            b_len,
        };
    }
    let base = case.recv_off;
    let (send_in, recv_in) = case.coll.collective().map_or((0, 0), |coll| coll.spec().in_place_offsets(c, me));
    let (send_at, recv_at) = (base + send_in, base + recv_in);
    let end = (send_at + sl).max(recv_at + rl).max(base);
    Layout { send_in_b: true, send_at, recv_at, a_len: 0, b_len: end * es + GUARD }
}

/// Calls the collective.
fn call(comm: &Communicator, case: &Case, n: usize, me: usize, send: DevicePtr, recv: DevicePtr, scalar: DevicePtr) -> Result<(), Error> {
    let dt = case.dtype;
    let c = case.count;
    let op = match case.op {
        Op::Sum => ReduceOp::Sum,
        Op::Prod => ReduceOp::Prod,
        Op::Min => ReduceOp::Min,
        Op::Max => ReduceOp::Max,
        Op::Avg => ReduceOp::Avg,
        Op::PreMulHost => ReduceOp::PreMulSum(Scalar::Host(scalar_of(case.op, dt, me, n))),
        Op::PreMulDevice => ReduceOp::PreMulSum(Scalar::Device(scalar)),
    };
    let root = case.root as i32;
    match case.coll {
        Coll::AllReduce => comm.all_reduce(send, recv, c, dt, op, S),
        Coll::AllGather => comm.all_gather(send, recv, c, dt, S),
        Coll::ReduceScatter => comm.reduce_scatter(send, recv, c, dt, op, S),
        Coll::Broadcast => comm.broadcast(send, recv, c, dt, root, S),
        Coll::Reduce => comm.reduce(send, recv, c, dt, op, root, S),
        Coll::AlltoAll => comm.all_to_all(send, recv, c, dt, S),
        Coll::AlltoAllv => {
            let (sc, sd, rc, rd, _, _) = v_layout(me, n, c);
            comm.all_to_allv(send, &sc, &sd, recv, &rc, &rd, dt, S)
        }
        Coll::Gather => comm.gather(send, recv, c, dt, root, S),
        Coll::Scatter => comm.scatter(send, recv, c, dt, root, S),
        Coll::SendRecv => {
            let to = ((me + case.shift) % n) as i32;
            let from = ((me + n - case.shift) % n) as i32;
            group_start();
            let a = comm.send(send, c, dt, to, S);
            let b = comm.recv(recv, c, dt, from, S);
            let e = group_end();
            a.and(b).and(e)
        }
    }
}

/// The expected content of B after the call (from its initial content), and the elements to
/// compare with a tolerance (element index in B, value, tolerance).
fn expect_b(case: &Case, n: usize, me: usize, lay: &Layout, inp: &Inputs, b: &mut [u8]) -> Vec<(usize, f64, f64)> {
    let es = case.dtype.size();
    let c = case.count;
    let mut approx = Vec::new();
    let blocks: Vec<(usize, usize, usize)> = if case.coll == Coll::AlltoAllv {
        let (_, _, rc, rd, _, _) = v_layout(me, n, c);
        (0..n).map(|r| (rd[r], rc[r], v_layout(r, n, c).1[me])).collect()
    } else {
        Vec::new()
    };
    let pattern = match case.coll.collective() {
        Some(coll) => Pattern::Collective { coll, root: case.root },
        None if case.coll == Coll::AlltoAllv => Pattern::AlltoAllv { blocks: &blocks },
        None => Pattern::SendRecv { from: (me + n - case.shift) % n },
    };
    let call = reference::Call { pattern, count: c, nranks: n, rank: me, in_place: case.in_place };
    let at = lay.recv_at;
    let mut e = [0u8; 8];
    for j in 0..recv_len(case, n, me) {
        let want: &[u8] = match call.source(j) {
            Source::Reduced(i) => {
                let vals = inp.vals.as_ref().expect("reduction inputs have values");
                if let Want::Approx(v, tol) = reduce_ref(case, n, vals, i, &mut e) {
                    approx.push((at + j, v, tol));
                }
                &e[..es]
            }
            Source::Input { rank, index } => &inp.bytes[rank][index * es..(index + 1) * es],
            Source::Untouched => continue,
        };
        b[(at + j) * es..(at + j + 1) * es].copy_from_slice(want);
    }
    approx
}

/// Compares a buffer's content with what is expected; describes the first differences.
fn compare(case: &Case, what: &str, got: &[u8], want: &[u8], origin: usize, approx: &[(usize, f64, f64)], out: &mut Vec<String>) {
    let es = case.dtype.size();
    let dt = case.dtype;
    let mut skip = std::collections::HashSet::new();
    for &(pos, v, tol) in approx {
        skip.insert(pos);
        let g = value(dt, &got[pos * es..(pos + 1) * es]);
        if !((g - v).abs() <= tol) && out.len() < 4 {
            out.push(format!(
                "{what} element {}: got {} want {v} ± {tol}",
                pos as isize - origin as isize,
                show(dt, &got[pos * es..(pos + 1) * es])
            ));
        }
    }
    if got == want && skip.is_empty() {
        return;
    }
    let mut pos = 0;
    while pos < got.len() && out.len() < 4 {
        let e = pos / es;
        let whole = (e + 1) * es <= got.len();
        if whole && skip.contains(&e) {
            pos = (e + 1) * es;
            continue;
        }
        let end = if whole { (e + 1) * es } else { pos + 1 };
        if got[pos..end] != want[pos..end] {
            let idx = e as isize - origin as isize;
            let place = if whole { format!("element {idx}") } else { format!("guard byte {pos}") };
            if whole {
                out.push(format!("{what} {place}: got {} want {}", show(dt, &got[pos..end]), show(dt, &want[pos..end])));
            } else {
                out.push(format!("{what} {place}: got {:#04x} want {:#04x}", got[pos], want[pos]));
            }
        }
        pos = end;
    }
}

fn run_case(comm: &Communicator, m: &Matrix, case: &Case, n: usize, me: usize, bufs: &Bufs, selftest: bool) -> Result<(usize, Vec<String>), Error> {
    let be = comm.backend();
    let es = case.dtype.size();
    let inp = gen_inputs(case, n, m.seed);
    let lay = layout(case, n, me);
    assert!(lay.a_len <= bufs.bytes && lay.b_len <= bufs.bytes, "buffers too small for {}", case.describe());
    let mine = &inp.bytes[me];
    // Initial contents.
    let mut b0 = vec![case.poison; lay.b_len];
    let mut a0 = vec![case.poison; lay.a_len];
    let (send, recv) = if lay.send_in_b {
        b0[lay.send_at * es..lay.send_at * es + mine.len()].copy_from_slice(mine);
        (bufs.b.offset(lay.send_at * es), bufs.b.offset(lay.recv_at * es))
    } else {
        a0[lay.send_at * es..lay.send_at * es + mine.len()].copy_from_slice(mine);
        (bufs.a.offset(lay.send_at * es), bufs.b.offset(lay.recv_at * es))
    };
    be.copy_to_device(bufs.a, &a0, S)?;
    be.copy_to_device(bufs.b, &b0, S)?;
    if case.op == Op::PreMulDevice && case.coll.reduces() {
        let mut s = [0u8; 8];
        let v = scalar_of(case.op, case.dtype, me, n);
        if case.dtype.is_float() {
            put_float(case.dtype, v, &mut s);
        } else {
            put_int(case.dtype, wrap(case.dtype, v as i128), &mut s);
        }
        be.copy_to_device(bufs.scalar, &s[..es], S)?;
    }

    call(comm, case, n, me, send, recv, bufs.scalar).map_err(|e| e.context(case.describe()))?;

    let mut want_b = b0;
    let mut approx = expect_b(case, n, me, &lay, &inp, &mut want_b);
    if selftest {
        // Checks the checker: a wrong expected element (even cases) or guard byte (odd cases).
        if case.index % 2 == 1 {
            *want_b.last_mut().unwrap() ^= 0x10;
        } else if let Some(a) = approx.first_mut() {
            a.1 += 3.0 * a.2 + 1.0;
        } else if recv_len(case, n, me) > 0 && case.count > 0 {
            want_b[lay.recv_at * es] ^= 0x01;
        } else {
            *want_b.last_mut().unwrap() ^= 0x10;
        }
    }
    let mut got_b = vec![0u8; lay.b_len];
    be.copy_from_device(&mut got_b, bufs.b, S)?;
    let mut problems = Vec::new();
    let what = if lay.send_in_b { "buffer" } else { "output" };
    compare(case, what, &got_b, &want_b, lay.recv_at, &approx, &mut problems);
    if !lay.send_in_b {
        let mut got_a = vec![0u8; lay.a_len];
        be.copy_from_device(&mut got_a, bufs.a, S)?;
        compare(case, "send buffer", &got_a, &a0, lay.send_at, &[], &mut problems);
    }
    Ok((recv_len(case, n, me), problems))
}

/// `coll-matrix`: runs every case of the matrix and checks this rank's results.
pub fn matrix(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    matrix_with(comm)
}

/// The matrix with every rank in this process: `init_all` over `nranks` devices (one GPU
/// each on a device backend), one thread per rank.
pub fn matrix_one_process(nranks: i32) -> Result<(), Error> {
    let devices: Vec<i32> = (0..nranks).map(test_device).collect();
    let comms = Communicator::init_all(&devices)?;
    let threads: Vec<_> = comms.into_iter().map(|c| std::thread::spawn(move || matrix_with(c))).collect();
    let mut result = Ok(());
    for t in threads {
        let r = t.join().unwrap_or_else(|_| Err(Error::internal("a rank thread panicked")));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

fn matrix_with(comm: Communicator) -> Result<(), Error> {
    let t0 = Instant::now();
    let (nranks, rank) = (comm.count()?, comm.user_rank()?);
    let (n, me) = (nranks as usize, rank as usize);
    if let Some(want) = std::env::var("COLL_EXPECT_HOSTS").ok().and_then(|v| v.parse::<usize>().ok()) {
        // Across namespaces: make sure the ranks really are on different "hosts" (so the
        // connections between them go through the network plugin).
        let mut hosts = comm.host_hashes()?;
        hosts.sort_unstable();
        hosts.dedup();
        if hosts.len() != want {
            return Err(Error::internal(format!("{} distinct hosts, expected {want}", hosts.len())));
        }
    }
    let m = Matrix::from_env(n)?;
    let cases = m.cases(n);
    let need = cases
        .iter()
        .map(|c| {
            let l = layout(c, n, me);
            l.a_len.max(l.b_len)
        })
        .max()
        .unwrap_or(GUARD);
    let be = comm.backend().clone();
    let dev = comm.device()? as usize;
    // COLL_WINDOWS=1: both buffers are symmetric windows (ncclMemAlloc memory registered with
    // NCCL_WIN_COLL_SYMMETRIC), so collectives that have symmetric kernels take them.
    let windows = std::env::var("COLL_WINDOWS").is_ok_and(|v| v == "1");
    let bufs = if windows {
        Bufs { a: be.window_memory_or_err("COLL_WINDOWS=1")?.alloc_symmetric(dev, need)?, b: be.window_memory_or_err("COLL_WINDOWS=1")?.alloc_symmetric(dev, need)?, scalar: be.alloc(dev, 8)?, bytes: need }
    } else {
        Bufs { a: be.alloc(dev, need)?, b: be.alloc(dev, need)?, scalar: be.alloc(dev, 8)?, bytes: need }
    };
    let wins = if windows {
        let flags = rustccl::window::WIN_COLL_SYMMETRIC;
        vec![comm.window_register(bufs.a, need, flags)?, comm.window_register(bufs.b, need, flags)?]
    } else {
        Vec::new()
    };
    // COLL_REGISTER=1: both buffers are registered (ncclCommRegister), so point-to-point
    // receives over P2P may be written straight into them by their senders (zero-copy).
    let register = std::env::var("COLL_REGISTER").is_ok_and(|v| v == "1");
    let regs = if register { vec![comm.register_buffer(bufs.a, need)?, comm.register_buffer(bufs.b, need)?] } else { Vec::new() };
    let sym_before = rustccl::coll::symmetric::launches();
    // COLL_SELFTEST=1 corrupts one expected byte of every case: every case must then fail.
    let selftest = std::env::var("COLL_SELFTEST").is_ok_and(|v| v == "1");
    let mut failed = 0;
    let mut first = None;
    let mut reports = 0;
    let mut elements = 0usize;
    let t1 = Instant::now();
    // COLL_SUSPEND=1: suspend (NCCL_SUSPEND_MEM) and resume halfway, so that the second half
    // runs over connections made again.
    let suspend_at = std::env::var("COLL_SUSPEND").is_ok_and(|v| v == "1").then_some(cases.len() / 2);
    for (i, case) in cases.iter().enumerate() {
        if suspend_at == Some(i) {
            comm.suspend(rustccl::SUSPEND_MEM)?;
            comm.resume()?;
        }
        let (checked, problems) = run_case(&comm, &m, case, n, me, &bufs, selftest)?;
        elements += checked;
        if !problems.is_empty() {
            failed += 1;
            let line = format!("rank {me} {}: {}", case.describe(), problems.join("; "));
            if reports < MAX_REPORTS && !selftest {
                println!("MISMATCH {line}");
                reports += 1;
            }
            first.get_or_insert(line);
        }
    }
    let run_s = t1.elapsed().as_secs_f64();
    let sym = rustccl::coll::symmetric::launches() - sym_before;
    let zero_copy = comm.zero_copy_steps();
    for r in regs {
        comm.deregister_buffer(r)?;
    }
    for w in &wins {
        comm.window_deregister(w)?;
    }
    for p in [bufs.a, bufs.b, bufs.scalar] {
        be.free(p)?;
    }
    comm.destroy()?;
    if selftest {
        if failed != cases.len() {
            return Err(Error::internal(format!("selftest: only {failed} of {} corrupted cases were caught", cases.len())));
        }
        println!("RESULT selftest caught {failed} of {}", cases.len());
        return Ok(());
    }
    if let Some(first) = first {
        return Err(Error::internal(format!("{failed} of {} cases failed (seed {}); first: {first}", cases.len(), m.seed)));
    }
    println!(
        "RESULT checked {} cases {elements} elements in {run_s:.2} s (total {:.2} s){}",
        cases.len(),
        t0.elapsed().as_secs_f64(),
        if windows { format!(", windows: {sym} symmetric launches") } else { String::new() }
            + &if register { format!(", registered: {zero_copy} zero-copy receive steps") } else { String::new() }
    );
    Ok(())
}

// ---- Groups ---------------------------------------------------------------------------------------

/// Element counts of the group scenario's messages (some over a FIFO slot of 512 KiB).
const P2P_COUNTS: [usize; 9] = [0, 1, 3, 17, 255, 1000, 4097, 65_537, 150_001];
const P2P_TYPES: [DataType; 5] = [DataType::Int8, DataType::Float16, DataType::Float32, DataType::Uint64, DataType::Bfloat16];

/// Message `j` from `from` to `to`: (count, type).
fn p2p_msg(from: usize, to: usize, j: usize) -> (usize, DataType) {
    let c = P2P_COUNTS[(j * 7 + from * 3 + to * 5) % P2P_COUNTS.len()];
    let t = P2P_TYPES[(j + from + 2 * to) % P2P_TYPES.len()];
    (c, t)
}

fn p2p_data(seed: u64, from: usize, to: usize, j: usize) -> Vec<u8> {
    let (c, t) = p2p_msg(from, to, j);
    let mut b = vec![0u8; c * t.size()];
    Rng::new(mix(&[seed, from as u64, to as u64, j as u64, 0x9292])).fill(&mut b);
    b
}

/// `group-p2p`: every rank sends `ceil(64 / n)` messages of different sizes and types to every
/// rank (itself included) and receives as many from each — at least 64 sends and 64 receives
/// per rank, all in one group. Per peer, messages match in call order; the calls are
/// interleaved in a different peer order for sends and receives.
pub fn group_p2p(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    let comm = Communicator::init_rank_scalable(nranks, rank, ids, test_device(rank), &CommConfig::default())?;
    let (n, me) = (nranks as usize, rank as usize);
    let per_peer = 64usize.div_ceil(n);
    let seed = std::env::var("COLL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let be = comm.backend().clone();
    let dev = comm.device()? as usize;
    // Packed layouts, each message at an odd element offset after a gap.
    let mut send_at = Vec::new();
    let mut recv_at = Vec::new();
    let (mut sa, mut ra) = (0usize, 0usize);
    for j in 0..per_peer {
        for p in 0..n {
            let (c, t) = p2p_msg(me, p, j);
            sa += t.size() * (1 + j % 3);
            send_at.push(sa);
            sa += c * t.size();
            let (c, t) = p2p_msg(p, me, j);
            ra += t.size() * (1 + (j + p) % 3);
            recv_at.push(ra);
            ra += c * t.size();
        }
    }
    let (sa, ra) = (sa + GUARD, ra + GUARD);
    let a = be.alloc(dev, sa)?;
    let b = be.alloc(dev, ra)?;
    let mut a0 = vec![0x5Au8; sa];
    for j in 0..per_peer {
        for p in 0..n {
            let d = p2p_data(seed, me, p, j);
            let at = send_at[j * n + p];
            a0[at..at + d.len()].copy_from_slice(&d);
        }
    }
    be.copy_to_device(a, &a0, S)?;
    be.memset(b, 0xA5, ra, S)?;
    let t0 = Instant::now();
    group_start();
    let mut result = Ok(());
    // Sends: peers starting after me; receives: peers in reverse order.
    for j in 0..per_peer {
        for k in 0..n {
            let p = (me + 1 + k) % n;
            let (c, t) = p2p_msg(me, p, j);
            result = result.and(comm.send(a.offset(send_at[j * n + p]), c, t, p as i32, S));
        }
    }
    for j in 0..per_peer {
        for p in (0..n).rev() {
            let (c, t) = p2p_msg(p, me, j);
            result = result.and(comm.recv(b.offset(recv_at[j * n + p]), c, t, p as i32, S));
        }
    }
    let end = group_end();
    result.and(end)?;
    let took = t0.elapsed();
    let mut want = vec![0xA5u8; ra];
    for j in 0..per_peer {
        for p in 0..n {
            let d = p2p_data(seed, p, me, j);
            let at = recv_at[j * n + p];
            want[at..at + d.len()].copy_from_slice(&d);
        }
    }
    let mut got = vec![0u8; ra];
    be.copy_from_device(&mut got, b, S)?;
    if got != want {
        let pos = got.iter().zip(&want).position(|(x, y)| x != y).unwrap();
        let which = recv_at.iter().rposition(|&at| at <= pos).unwrap_or(0);
        let (j, p) = (which / n, which % n);
        return Err(Error::internal(format!(
            "group p2p: byte {pos} differs (got {:#04x} want {:#04x}); near message {j} from rank {p} at {}",
            got[pos], want[pos], recv_at[which]
        )));
    }
    let mut got_a = vec![0u8; sa];
    be.copy_from_device(&mut got_a, a, S)?;
    if got_a != a0 {
        return Err(Error::internal("group p2p: a send buffer was modified"));
    }
    be.free(a)?;
    be.free(b)?;
    comm.destroy()?;
    println!("RESULT p2p {} sends {} recvs in one group, {} bytes in, {:.3} s", per_peer * n, per_peer * n, ra - GUARD, took.as_secs_f64());
    Ok(())
}

/// Device buffer helpers for the group scenarios.
fn upload(comm: &Communicator, data: &[u8]) -> Result<DevicePtr, Error> {
    let be = comm.backend();
    let p = be.alloc(comm.device()? as usize, data.len().max(1))?;
    be.copy_to_device(p, data, S)?;
    Ok(p)
}

fn download(comm: &Communicator, p: DevicePtr, len: usize) -> Result<Vec<u8>, Error> {
    let mut v = vec![0u8; len];
    comm.backend().copy_from_device(&mut v, p, S)?;
    Ok(v)
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn check_eq(what: &str, got: Vec<u8>, want: Vec<u8>) -> Result<(), Error> {
    if got == want {
        return Ok(());
    }
    let pos = got.iter().zip(&want).position(|(x, y)| x != y).unwrap_or(0);
    Err(Error::internal(format!("{what}: byte {pos} got {:#04x} want {:#04x} (len {} vs {})", got[pos], want[pos], got.len(), want.len())))
}

/// `group-two-comms` (needs two ids): communicator A (first id), its split B (same ranks in
/// reverse order), a split H of A in halves (even / odd ranks) sharing A's resources, and C
/// (second id). In one group: AllReduce on A, AllGather and a send/recv ring on B, AllReduce on
/// H, Broadcast and ReduceScatter on C, a send/recv ring on A. Then a second group that
/// interleaves A and C calls.
pub fn group_two_comms(nranks: i32, rank: i32, ids: &[UniqueId]) -> Result<(), Error> {
    if ids.len() < 2 {
        return Err(Error::invalid_argument("group-two-comms needs two ids"));
    }
    let (n, me) = (nranks as usize, rank as usize);
    let a = Communicator::init_rank(nranks, &ids[0], rank)?;
    let c = Communicator::init_rank(nranks, &ids[1], rank)?;
    let b = a.split(0, nranks - rank, None)?.ok_or_else(|| Error::internal("no split"))?;
    let shared = CommConfig { split_share: 1, ..Default::default() };
    let h = a.split(rank % 2, rank, Some(&shared))?.ok_or_else(|| Error::internal("no split"))?;
    let bme = n - 1 - me;
    let cnt = 1001usize;

    let a_in = upload(&a, &i32s(&(0..cnt).map(|i| (me as i32 + 1) * (i as i32 % 13 - 6)).collect::<Vec<_>>()))?;
    let a_out = upload(&a, &vec![0xA5; cnt * 4])?;
    let b_in = upload(&b, &i32s(&[me as i32 * 10 + 3]))?;
    let b_out = upload(&b, &vec![0xA5; n * 4])?;
    let b_ring_in = upload(&b, &f32s(&(0..cnt).map(|i| me as f32 * 1000.0 + i as f32).collect::<Vec<_>>()))?;
    let b_ring_out = upload(&b, &vec![0xA5; cnt * 4])?;
    let h_in = upload(&h, &f32s(&(0..7).map(|i| (me * 7 + i) as f32).collect::<Vec<_>>()))?;
    let h_out = upload(&h, &vec![0xA5; 7 * 4])?;
    let c_bc = upload(&c, &if me == n - 1 { i32s(&(0..cnt as i32).map(|i| i * 3 - 77).collect::<Vec<_>>()) } else { vec![0xA5; cnt * 4] })?;
    let c_rs_in = upload(&c, &i32s(&(0..n * 5).map(|i| (i as i32) * (me as i32 + 1)).collect::<Vec<_>>()))?;
    let c_rs_out = upload(&c, &vec![0xA5; 5 * 4])?;
    let a_ring_in = upload(&a, &i32s(&[me as i32; 300_000]))?;
    let a_ring_out = upload(&a, &vec![0xA5; 300_000 * 4])?;

    group_start();
    let calls = (|| {
        a.all_reduce(a_in, a_out, cnt, DataType::Int32, ReduceOp::Sum, S)?;
        b.all_gather(b_in, b_out, 1, DataType::Int32, S)?;
        b.send(b_ring_in, cnt, DataType::Float32, ((bme + 1) % n) as i32, S)?;
        b.recv(b_ring_out, cnt, DataType::Float32, ((bme + n - 1) % n) as i32, S)?;
        h.all_reduce(h_in, h_out, 7, DataType::Float32, ReduceOp::Max, S)?;
        c.broadcast(c_bc, c_bc, cnt, DataType::Int32, (n - 1) as i32, S)?;
        c.reduce_scatter(c_rs_in, c_rs_out, 5, DataType::Int32, ReduceOp::Sum, S)?;
        a.send(a_ring_in, 300_000, DataType::Int32, ((me + 1) % n) as i32, S)?;
        a.recv(a_ring_out, 300_000, DataType::Int32, ((me + n - 1) % n) as i32, S)
    })();
    let end = group_end();
    calls.and(end)?;

    let tri = (n * (n + 1) / 2) as i32;
    check_eq("A all_reduce", download(&a, a_out, cnt * 4)?, i32s(&(0..cnt).map(|i| tri * (i as i32 % 13 - 6)).collect::<Vec<_>>()))?;
    // B's rank k is A's rank n-1-k.
    check_eq("B all_gather", download(&b, b_out, n * 4)?, i32s(&(0..n).map(|k| (n - 1 - k) as i32 * 10 + 3).collect::<Vec<_>>()))?;
    let b_prev_a = n - 1 - ((bme + n - 1) % n);
    check_eq(
        "B ring",
        download(&b, b_ring_out, cnt * 4)?,
        f32s(&(0..cnt).map(|i| b_prev_a as f32 * 1000.0 + i as f32).collect::<Vec<_>>()),
    )?;
    // H: ranks of my parity; max over them of (r*7 + i).
    let top = (0..n).filter(|r| r % 2 == me % 2).max().unwrap();
    check_eq("H all_reduce", download(&h, h_out, 28)?, f32s(&(0..7).map(|i| (top * 7 + i) as f32).collect::<Vec<_>>()))?;
    check_eq("C broadcast", download(&c, c_bc, cnt * 4)?, i32s(&(0..cnt as i32).map(|i| i * 3 - 77).collect::<Vec<_>>()))?;
    check_eq("C reduce_scatter", download(&c, c_rs_out, 20)?, i32s(&(0..5).map(|i| ((me * 5 + i) as i32) * tri).collect::<Vec<_>>()))?;
    check_eq("A ring", download(&a, a_ring_out, 300_000 * 4)?, i32s(&[((me + n - 1) % n) as i32; 300_000]))?;

    // Second group: A and C interleaved, each twice.
    let x = upload(&a, &f32s(&[me as f32 + 0.5; 33]))?;
    let y = upload(&c, &f32s(&[2.0; 33]))?;
    let xo = upload(&a, &vec![0; 33 * 4])?;
    let yo = upload(&c, &vec![0; 33 * 4])?;
    group_start();
    let calls = (|| {
        a.all_reduce(x, xo, 33, DataType::Float32, ReduceOp::Sum, S)?;
        c.all_reduce(y, yo, 33, DataType::Float32, ReduceOp::Prod, S)?;
        a.all_reduce(x, x, 33, DataType::Float32, ReduceOp::Min, S)?;
        c.all_reduce(y, y, 33, DataType::Float32, ReduceOp::Sum, S)
    })();
    let end = group_end();
    calls.and(end)?;
    check_eq("2nd A sum", download(&a, xo, 132)?, f32s(&[(n * n) as f32 / 2.0; 33]))?;
    check_eq("2nd C prod", download(&c, yo, 132)?, f32s(&[2f32.powi(n as i32); 33]))?;
    check_eq("2nd A min", download(&a, x, 132)?, f32s(&[0.5; 33]))?;
    check_eq("2nd C sum", download(&c, y, 132)?, f32s(&[2.0 * n as f32; 33]))?;

    for comm in [&h, &b, &c, &a] {
        comm.destroy()?;
    }
    println!("RESULT two-comms ok");
    Ok(())
}

/// The device a rank uses: on a device backend (several GPUs), `rank % device count`, so
/// that ranks on one machine use different GPUs; device 0 where devices are virtual (the host
/// backend).
pub fn test_device(rank: i32) -> i32 {
    match rustccl::backend::select_backend() {
        Ok(b) if !b.capabilities().virtual_devices => {
            let n = b.device_count().unwrap_or(1).max(1) as i32;
            rank % n
        }
        _ => 0,
    }
}

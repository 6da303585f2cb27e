//! Predictable data, nccl-tests' `verifiable/` idea done on the host: every rank fills its
//! input from (rank, seed, index) with small integers that every element type holds exactly,
//! chosen so that any reduction order gives the same bits; the expected output of every
//! element is computed here and compared with what the operation wrote.
//!
//! Per element type there is a capacity `K` (every integer of magnitude up to `K` is exact and
//! never looks like the poison pattern): int8 100, uint8 200, half 2048, bfloat16 256,
//! f8e4m3 16, f8e5m2 8, the others 2^20.
//!
//! * Sum, Min, Max, integer Avg, and Avg on floats with a power-of-two rank count: values in
//!   `[-m, m]` (`[0, m]` unsigned) with `m = K / nranks`, so every partial sum is exact; when
//!   `m` would be 0, only `K` ranks contribute to each element (the others give 0). Avg on
//!   floats divides by a power of two, exactly; integer Avg truncates toward zero (C's
//!   division, NCCL's SumPostDiv).
//! * PreMulSum: rank r multiplies by 1 (even r) or 2 (odd r), and `m = K / (2 nranks)`.
//! * Avg on floats with another rank count: one rank contributes to each element (the others
//!   give 0), so the result is that value times `1/nranks` rounded to the type, rounded once.
//! * Prod: factors in {1, 2} (and their negatives for signed types), at most log2(K) of them
//!   2 per element.
//! * Copies (broadcast, gathers, alltoall, scatter, sendrecv): values in `[-K, K]`.
//!
//! The conversions to and from the element types are this module's own (not the core's), so
//! a conversion bug in the core cannot hide itself. Buffers are in native byte order, which
//! this module assumes is little-endian (as on every platform rustccl runs on).

#[cfg(target_endian = "big")]
compile_error!("rustccl-bench's reference data assumes a little-endian host");

use rustccl::testing::reference::{self, Pattern, Source};
use rustccl::types::DataType;

use crate::ops::{a2av_counts, premul_scalar, Coll, Layout, Redop};

// ---- element codecs ------------------------------------------------------------------------

/// (exponent bits, mantissa bits, bias) of the small float formats.
fn small_float(t: DataType) -> Option<(u32, u32, i32)> {
    match t {
        DataType::Float16 => Some((5, 10, 15)),
        DataType::Bfloat16 => Some((8, 7, 127)),
        DataType::Float8e4m3 => Some((4, 3, 7)),
        DataType::Float8e5m2 => Some((5, 2, 15)),
        _ => None,
    }
}

/// `v` rounded to nearest even into a small float format; finite values in range only.
fn encode_small(v: f64, eb: u32, mb: u32, bias: i32) -> u32 {
    let sign = if v.is_sign_negative() {
        1u32 << (eb + mb)
    } else {
        0
    };
    let a = v.abs();
    if a == 0.0 {
        return sign;
    }
    let min_exp = 1 - bias;
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    if e < min_exp {
        // Subnormal: units of 2^(min_exp - mb); a carry into 2^mb is the smallest normal.
        let q = (a * 2f64.powi(mb as i32 - min_exp)).round_ties_even() as u32;
        return sign | q;
    }
    let mut e = e;
    let mut q = (a * 2f64.powi(mb as i32 - e)).round_ties_even() as u64;
    if q == 1 << (mb + 1) {
        e += 1;
        q = 1 << mb;
    }
    sign | (((e + bias) as u32) << mb) | (q as u32 - (1 << mb))
}

fn decode_small(bits: u32, t: DataType, eb: u32, mb: u32, bias: i32) -> f64 {
    let sign = if bits >> (eb + mb) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let ef = (bits >> mb) & ((1 << eb) - 1);
    let mf = bits & ((1 << mb) - 1);
    let all_ones = (1 << eb) - 1;
    if t == DataType::Float8e4m3 {
        if ef == all_ones && mf == (1 << mb) - 1 {
            return f64::NAN;
        }
    } else if ef == all_ones {
        return if mf == 0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    let v = if ef == 0 {
        mf as f64 * 2f64.powi(1 - bias - mb as i32)
    } else {
        (f64::from(mf) + f64::from(1u32 << mb)) * 2f64.powi(ef as i32 - bias - mb as i32)
    };
    sign * v
}

/// The bits of `v` as one element of `t`, in the low `t.size()` bytes (rounded to nearest
/// even for the float types, truncated toward zero for integers).
#[inline]
pub fn encode_bits(t: DataType, v: f64) -> u64 {
    match t {
        DataType::Float32 => u64::from((v as f32).to_bits()),
        DataType::Float64 => v.to_bits(),
        DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2 => {
            let (eb, mb, bias) = small_float(t).unwrap();
            u64::from(encode_small(v, eb, mb, bias))
        }
        _ => (v as i64 as u64) & (u64::MAX >> (64 - 8 * t.size())),
    }
}

/// The low `len` bytes of native-order element bytes as a number.
#[inline]
fn load_bits(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Writes `v` as one element of `t` (native byte order; see [`encode_bits`]).
#[inline]
pub fn encode(t: DataType, v: f64, out: &mut [u8]) {
    let n = t.size();
    out[..n].copy_from_slice(&encode_bits(t, v).to_le_bytes()[..n]);
}

/// The value of one element of `t` (integers exactly up to 2^53).
pub fn decode(t: DataType, b: &[u8]) -> f64 {
    let mut a = [0u8; 8];
    a[..t.size()].copy_from_slice(&b[..t.size()]);
    match t {
        DataType::Int8 => f64::from(a[0] as i8),
        DataType::Uint8 => f64::from(a[0]),
        DataType::Int32 => f64::from(i32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Uint32 => f64::from(u32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Int64 => i64::from_ne_bytes(a) as f64,
        DataType::Uint64 => u64::from_ne_bytes(a) as f64,
        DataType::Float32 => f64::from(f32::from_ne_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Float64 => f64::from_ne_bytes(a),
        _ => {
            let (eb, mb, bias) = small_float(t).unwrap();
            let bits = if t.size() == 1 {
                u32::from(a[0])
            } else {
                u32::from(u16::from_ne_bytes([a[0], a[1]]))
            };
            decode_small(bits, t, eb, mb, bias)
        }
    }
}

/// `v` rounded to the nearest value of `t`.
pub fn round_to(t: DataType, v: f64) -> f64 {
    let mut b = [0u8; 8];
    encode(t, v, &mut b);
    decode(t, &b)
}

/// The byte that fills receive buffers before a checked run: no expected value ever has it
/// (NaN or a huge value for the float types, -1/255/... out of range for the integers).
pub fn poison_byte(t: DataType) -> u8 {
    match t {
        DataType::Uint8 | DataType::Uint32 | DataType::Uint64 => 0xff,
        _ => 0x7f,
    }
}

/// The capacity `K` of a type (see the module docs) and whether it has negative values.
pub fn capacity(t: DataType) -> (i64, bool) {
    match t {
        DataType::Int8 => (100, true),
        DataType::Uint8 => (200, false),
        DataType::Int32 | DataType::Int64 => (1 << 20, true),
        DataType::Uint32 | DataType::Uint64 => (1 << 20, false),
        DataType::Float16 => (2048, true),
        DataType::Bfloat16 => (256, true),
        DataType::Float8e4m3 => (16, true),
        DataType::Float8e5m2 => (8, true),
        DataType::Float32 | DataType::Float64 => (1 << 20, true),
    }
}

// ---- inputs ----------------------------------------------------------------------------------

#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed from the parameters of one run.
pub fn seed_of(parts: &[u64]) -> u64 {
    parts.iter().fold(0x5eed_u64, |s, &p| splitmix64(s ^ p))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Values in [-m, m] from `contributors` ranks per element.
    Dense,
    /// One rank per element (`index % nranks`) gives a value in [-m, m].
    Sparse,
    /// Factors in {±1, ±2}, at most `contributors` of them 2.
    Prod,
}

/// The input generator of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Gen {
    pub dtype: DataType,
    pub mode: Mode,
    pub nranks: usize,
    pub seed: u64,
    pub m: i64,
    pub contributors: usize,
    pub signed: bool,
}

impl Gen {
    /// The generator for `coll` with operator `redop` (`None` for the copies).
    pub fn new(coll: Coll, dtype: DataType, redop: Option<Redop>, nranks: usize, seed: u64) -> Gen {
        let (k, signed) = capacity(dtype);
        let n = nranks.max(1);
        let dense = |scale: i64| {
            let m = k / (n as i64 * scale);
            if m >= 1 {
                (Mode::Dense, m, n)
            } else {
                (Mode::Dense, 1, ((k / scale) as usize).clamp(1, n))
            }
        };
        let (mode, m, contributors) = match (coll.has_redop(), redop) {
            (false, _) | (true, None) => (Mode::Dense, k, n),
            (true, Some(Redop::Prod)) => {
                let twos = (63 - (k as u64).leading_zeros()) as usize;
                (Mode::Prod, 2, twos.min(20).min(n))
            }
            (true, Some(Redop::PreMulSum)) => dense(2),
            (true, Some(Redop::Avg)) if dtype.is_float() && !n.is_power_of_two() => {
                (Mode::Sparse, k, 1)
            }
            (true, Some(_)) => dense(1),
        };
        Gen {
            dtype,
            mode,
            nranks: n,
            seed,
            m,
            contributors,
            signed,
        }
    }

    /// The hash of element `i`, shared by every rank (see [`Gen::x_with`]).
    #[inline]
    pub fn base(&self, i: usize) -> u64 {
        splitmix64(self.seed ^ i as u64)
    }

    /// Rank `p`'s input element `i`.
    #[inline]
    pub fn x(&self, p: usize, i: usize) -> f64 {
        self.x_with(self.base(i), p, i)
    }

    /// Rank `p`'s input element `i`, given `base = self.base(i)`: one multiply per rank on
    /// top of one hash per element, so the expected value of a reduction over many ranks is
    /// cheap.
    #[inline]
    pub fn x_with(&self, base: u64, p: usize, i: usize) -> f64 {
        let n = self.nranks;
        let h = (base ^ (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xd6e8_feb8_6659_fd93);
        let h = h ^ (h >> 29);
        match self.mode {
            Mode::Dense | Mode::Sparse => {
                let active = match self.mode {
                    Mode::Dense => self.contributors >= n || (p + i) % n < self.contributors,
                    _ => p == i % n,
                };
                if !active {
                    return 0.0;
                }
                // A value in [-m, m] (or [0, m]) from the top 32 bits: multiply and shift,
                // cheaper than a 64-bit modulo (m < 2^31).
                let top = h >> 32;
                if self.signed {
                    ((top * (2 * self.m as u64 + 1)) >> 32) as i64 as f64 - self.m as f64
                } else {
                    ((top * (self.m as u64 + 1)) >> 32) as f64
                }
            }
            Mode::Prod => {
                let mag = if (p + i) % n < self.contributors && h & 1 == 1 {
                    2.0
                } else {
                    1.0
                };
                if self.signed && (h >> 1) & 1 == 1 {
                    -mag
                } else {
                    mag
                }
            }
        }
    }

    /// Writes rank `p`'s elements `first..first + out.len()/size` into `out`.
    pub fn fill(&self, p: usize, first: usize, out: &mut [u8]) {
        let e = self.dtype.size();
        for (k, chunk) in out.chunks_exact_mut(e).enumerate() {
            encode(self.dtype, self.x(p, first + k), chunk);
        }
    }
}

// ---- expected outputs ------------------------------------------------------------------------

/// What one output element must hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Want {
    Value(f64),
    /// Untouched: still the poison bytes.
    Poison,
}

/// Everything that determines the expected output of one rank in one run.
#[derive(Clone, Debug)]
pub struct Expect {
    pub coll: Coll,
    pub gen: Gen,
    pub redop: Option<Redop>,
    pub layout: Layout,
    pub rank: usize,
    pub nranks: usize,
    pub root: usize,
    pub in_place: bool,
    /// AlltoAllv: for each source rank, (where its block starts in this rank's receive
    /// buffer, its elements, where it starts in the source's send buffer).
    a2av_blocks: Vec<(usize, usize, usize)>,
    /// Avg on floats: 1/nranks in the type.
    avg_scalar: f64,
}

impl Expect {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        coll: Coll,
        gen: Gen,
        redop: Option<Redop>,
        layout: Layout,
        rank: usize,
        nranks: usize,
        root: usize,
        in_place: bool,
    ) -> Expect {
        let mut a2av_blocks = Vec::new();
        if coll == Coll::AlltoAllv {
            let base = layout.param_count / nranks.max(1);
            let me = a2av_counts(base, nranks, rank);
            a2av_blocks = (0..nranks)
                .map(|p| {
                    let from = a2av_counts(base, nranks, p).send_displs[rank];
                    (me.recv_displs[p], me.recv_counts[p], from)
                })
                .collect();
        }
        let avg_scalar = round_to(gen.dtype, 1.0 / nranks.max(1) as f64);
        Expect {
            coll,
            gen,
            redop,
            layout,
            rank,
            nranks,
            root,
            in_place,
            a2av_blocks,
            avg_scalar,
        }
    }

    /// The reduction over every rank of input element `i` (the shared reference model's
    /// arithmetic; the inputs are small integers, so integer types reduce exactly as `i128`).
    fn reduced(&self, i: usize) -> f64 {
        let n = self.nranks;
        let g = &self.gen;
        let b = g.base(i);
        let x = |p: usize| g.x_with(b, p, i);
        let op = match self.redop.unwrap_or(Redop::Sum) {
            Redop::Sum => reference::Op::Sum,
            Redop::Prod => reference::Op::Prod,
            Redop::Max => reference::Op::Max,
            Redop::Min => reference::Op::Min,
            Redop::Avg => reference::Op::Avg,
            Redop::PreMulSum => reference::Op::PreMulSum,
        };
        if g.dtype.is_float() {
            // Avg: the value times the rounded scalar (exact in f64), rounded once by encode.
            reference::reduce_floats(op, n, x, premul_scalar, self.avg_scalar)
        } else {
            reference::reduce_ints(op, n, |p| x(p) as i128, |p| premul_scalar(p) as i128) as f64
        }
    }

    /// The expected output element `j` (of `layout.recv_count`).
    pub fn want(&self, j: usize) -> Want {
        let pattern = match self.coll {
            Coll::AlltoAllv => Pattern::AlltoAllv { blocks: &self.a2av_blocks },
            Coll::SendRecv => Pattern::SendRecv { from: (self.rank + self.nranks - 1) % self.nranks },
            c => Pattern::Collective { coll: c.spec().expect("a spec").coll, root: self.root },
        };
        let call = reference::Call { pattern, count: self.layout.param_count, nranks: self.nranks, rank: self.rank, in_place: self.in_place };
        match call.source(j) {
            Source::Reduced(i) => Want::Value(self.reduced(i)),
            Source::Input { rank, index } => Want::Value(self.gen.x(rank, index)),
            Source::Untouched => Want::Poison,
        }
    }

    /// Compares `out` (the receive buffer, `recv_count` elements) with the expected values;
    /// calls `report(index, want, got_bytes)` for the first `max_reports` mismatches and
    /// returns the number of mismatching elements.
    pub fn count_wrong(
        &self,
        out: &[u8],
        max_reports: usize,
        mut report: impl FnMut(usize, Want, &[u8]),
    ) -> u64 {
        let t = self.gen.dtype;
        let e = t.size();
        let poison = load_bits(&[poison_byte(t); 8][..e]);
        let mut wrong = 0u64;
        for (j, got) in out.chunks_exact(e).enumerate().take(self.layout.recv_count) {
            let w = self.want(j);
            let g = load_bits(got);
            let ok = match w {
                Want::Poison => g == poison,
                Want::Value(v) => {
                    let want = encode_bits(t, v);
                    // +0 and -0 are the same result.
                    g == want || (t.is_float() && decode(t, got) == 0.0 && v == 0.0)
                }
            };
            if !ok {
                if (wrong as usize) < max_reports {
                    report(j, w, got);
                }
                wrong += 1;
            }
        }
        wrong
    }
}

//! Elementwise reductions on byte buffers: what a `Step::Reduce` computes, on the CPU.
//!
//! Semantics follow the GPU kernels: integer arithmetic wraps; float Min/Max ignore a NaN
//! operand like `fminf`/`fmaxf`; Avg sums then divides by the number of inputs (truncating
//! for integers); PreMulSum multiplies every input by the scalar (first converted to the
//! element type, as NCCL stores it) and sums. Float16 and Bfloat16 are widened to `f32`, the
//! whole reduction of one element is computed in `f32`, and the result is rounded back to
//! nearest even. Values are in native byte order.
//!
//! Not implemented yet: the fp8 types (`Float8e4m3`, `Float8e5m2`), which a later issue adds;
//! [`check_supported`] reports them as `InvalidUsage`.

use super::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::error::{Error, Result};
use crate::types::{DataType, RedOp};

/// `Ok` when the host backend can reduce `dtype`.
pub fn check_supported(dtype: DataType) -> Result<()> {
    match dtype {
        DataType::Float8e4m3 | DataType::Float8e5m2 => Err(Error::invalid_usage(format!(
            "reduction on {dtype}: fp8 reductions are not implemented on the host backend yet"
        ))),
        _ => Ok(()),
    }
}

/// The arithmetic a reduction needs, on the type it computes in.
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    /// `self / n`, truncating for integers.
    fn div_count(self, n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max(self, o: Self) -> Self { Ord::max(self, o) }
            fn min(self, o: Self) -> Self { Ord::min(self, o) }
            // In i128 so that a count beyond the type's range divides correctly.
            fn div_count(self, n: usize) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            // `max`/`min` of std return the other operand when one is NaN, like fmaxf/fminf.
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            fn div_count(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
float_arith!(f32, f64);

/// How one element type is stored and what it computes in.
struct Codec<A> {
    size: usize,
    load: fn(&[u8]) -> A,
    store: fn(A, &mut [u8]),
    /// The PreMulSum scalar in the element type, widened to the compute type.
    scalar: fn(f64) -> A,
}

macro_rules! native_codec {
    ($t:ty) => {
        Codec::<$t> {
            size: std::mem::size_of::<$t>(),
            load: |b| <$t>::from_ne_bytes(b.try_into().expect("element size")),
            store: |v, b| b.copy_from_slice(&v.to_ne_bytes()),
            // `as` saturates (NaN gives 0): the scalar in the element type.
            scalar: |s| s as $t,
        }
    };
}

const F16: Codec<f32> = Codec {
    size: 2,
    load: |b| f16_to_f32(u16::from_ne_bytes([b[0], b[1]])),
    store: |v, b| b.copy_from_slice(&f32_to_f16(v).to_ne_bytes()),
    scalar: |s| f16_to_f32(f32_to_f16(s as f32)),
};

const BF16: Codec<f32> = Codec {
    size: 2,
    load: |b| bf16_to_f32(u16::from_ne_bytes([b[0], b[1]])),
    store: |v, b| b.copy_from_slice(&f32_to_bf16(v).to_ne_bytes()),
    scalar: |s| bf16_to_f32(f32_to_bf16(s as f32)),
};

/// `out[i] = op(inputs[0][i], inputs[1][i], ...)` over elements of `dtype`. Every input is as
/// long as `out`, a whole number of elements; `scalar` is set exactly for PreMulSum (the
/// plan's `check` ensures both).
pub fn reduce(dtype: DataType, op: RedOp, scalar: Option<f64>, inputs: &[&[u8]], out: &mut [u8]) -> Result<()> {
    check_supported(dtype)?;
    if inputs.is_empty() || inputs.iter().any(|i| i.len() != out.len()) || out.len() % dtype.size() != 0 {
        return Err(Error::internal(format!(
            "host reduce of {dtype}: {} inputs, buffer lengths not matching the {}-byte output",
            inputs.len(),
            out.len()
        )));
    }
    let scalar = match (op, scalar) {
        (RedOp::PreMulSum, Some(s)) => Some(s),
        (RedOp::PreMulSum, None) => return Err(Error::invalid_argument("premulsum without a scalar")),
        _ => None,
    };
    match dtype {
        DataType::Int8 => run(&native_codec!(i8), op, scalar, inputs, out),
        DataType::Uint8 => run(&native_codec!(u8), op, scalar, inputs, out),
        DataType::Int32 => run(&native_codec!(i32), op, scalar, inputs, out),
        DataType::Uint32 => run(&native_codec!(u32), op, scalar, inputs, out),
        DataType::Int64 => run(&native_codec!(i64), op, scalar, inputs, out),
        DataType::Uint64 => run(&native_codec!(u64), op, scalar, inputs, out),
        DataType::Float32 => run(&native_codec!(f32), op, scalar, inputs, out),
        DataType::Float64 => run(&native_codec!(f64), op, scalar, inputs, out),
        DataType::Float16 => run(&F16, op, scalar, inputs, out),
        DataType::Bfloat16 => run(&BF16, op, scalar, inputs, out),
        DataType::Float8e4m3 | DataType::Float8e5m2 => unreachable!("rejected by check_supported"),
    }
    Ok(())
}

fn run<A: Arith>(c: &Codec<A>, op: RedOp, scalar: Option<f64>, inputs: &[&[u8]], out: &mut [u8]) {
    let scalar = scalar.map(c.scalar);
    let pre = |x: A| match scalar {
        Some(s) => x.mul(s),
        None => x,
    };
    let combine: fn(A, A) -> A = match op {
        RedOp::Sum | RedOp::Avg | RedOp::PreMulSum => A::add,
        RedOp::Prod => A::mul,
        RedOp::Max => A::max,
        RedOp::Min => A::min,
    };
    let n = inputs.len();
    for (i, o) in out.chunks_exact_mut(c.size).enumerate() {
        let at = i * c.size..(i + 1) * c.size;
        let mut acc = pre((c.load)(&inputs[0][at.clone()]));
        for input in &inputs[1..] {
            acc = combine(acc, pre((c.load)(&input[at.clone()])));
        }
        if op == RedOp::Avg {
            acc = acc.div_count(n);
        }
        (c.store)(acc, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode;

    /// Reduces `inputs` (byte buffers) and returns the output bytes.
    fn red(dtype: DataType, op: RedOp, scalar: Option<f64>, inputs: &[Vec<u8>]) -> Vec<u8> {
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0xAAu8; inputs[0].len()];
        reduce(dtype, op, scalar, &refs, &mut out).unwrap();
        out
    }

    macro_rules! bytes_of {
        ($t:ty, $v:expr) => {
            $v.iter().flat_map(|x: &$t| x.to_ne_bytes()).collect::<Vec<u8>>()
        };
    }

    #[test]
    fn int8_all_ops_wrap() {
        let a = bytes_of!(i8, [100i8, -128, 7, -3]);
        let b = bytes_of!(i8, [100i8, -1, -9, -3]);
        let c = bytes_of!(i8, [1i8, 2, 5, 4]);
        let ins = [a, b, c];
        let t = DataType::Int8;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(i8, [-55i8, -127, 3, -2]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(i8, [16i8, 0, -59, 36]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(i8, [100i8, 2, 7, 4]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(i8, [1i8, -128, -9, -3]));
        // Avg: wrapped sum, then truncating division by 3.
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(i8, [-18i8, -42, 1, 0]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(2.0), &ins), bytes_of!(i8, [-110i8, 2, 6, -4]));
    }

    #[test]
    fn uint8_all_ops_wrap() {
        let ins = [bytes_of!(u8, [200u8, 3, 0]), bytes_of!(u8, [100u8, 5, 255])];
        let t = DataType::Uint8;
        assert_eq!(red(t, RedOp::Sum, None, &ins), vec![44, 8, 255]);
        assert_eq!(red(t, RedOp::Prod, None, &ins), vec![32, 15, 0]);
        assert_eq!(red(t, RedOp::Max, None, &ins), vec![200, 5, 255]);
        assert_eq!(red(t, RedOp::Min, None, &ins), vec![100, 3, 0]);
        assert_eq!(red(t, RedOp::Avg, None, &ins), vec![22, 4, 127]);
        assert_eq!(red(t, RedOp::PreMulSum, Some(3.0), &ins), vec![132, 24, 253]);
    }

    #[test]
    fn int32_and_uint32() {
        let ins = [bytes_of!(i32, [i32::MAX, -10, 6]), bytes_of!(i32, [1i32, 4, -7])];
        let t = DataType::Int32;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(i32, [i32::MIN, -6, -1]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(i32, [i32::MAX, -40, -42]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(i32, [i32::MAX, 4, 6]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(i32, [1i32, -10, -7]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(i32, [i32::MIN / 2, -3, 0]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(-2.0), &ins), bytes_of!(i32, [0i32, 12, 2]));

        let ins = [bytes_of!(u32, [u32::MAX, 10]), bytes_of!(u32, [2u32, 3])];
        let t = DataType::Uint32;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(u32, [1u32, 13]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(u32, [u32::MAX - 1, 30]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(u32, [u32::MAX, 10]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(u32, [2u32, 3]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(u32, [0u32, 6]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(4.0), &ins), bytes_of!(u32, [4u32, 52]));
    }

    #[test]
    fn int64_and_uint64() {
        let big = 1i64 << 40;
        let ins = [bytes_of!(i64, [big, -5]), bytes_of!(i64, [big, 2]), bytes_of!(i64, [-1i64, 9])];
        let t = DataType::Int64;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(i64, [2 * big - 1, 6]));
        // 2^80 wraps to 0.
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(i64, [0i64, -90]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(i64, [big, 9]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(i64, [-1i64, -5]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(i64, [(2 * big - 1) / 3, 2]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(3.0), &ins), bytes_of!(i64, [6 * big - 3, 18]));

        let ins = [bytes_of!(u64, [u64::MAX, 1 << 33]), bytes_of!(u64, [u64::MAX, 1 << 33])];
        let t = DataType::Uint64;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(u64, [u64::MAX - 1, 1 << 34]));
        // (2^64 - 1)^2 = 1 and (2^33)^2 = 0 modulo 2^64.
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(u64, [1u64, 0]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(u64, [u64::MAX, 1 << 33]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(u64, [u64::MAX, 1 << 33]));
        // The sum wraps first: (2^64 - 2) / 2.
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(u64, [u64::MAX / 2, 1 << 33]));
    }

    #[test]
    fn float32_and_float64() {
        let ins = [bytes_of!(f32, [1.5f32, -2.0, 1e30]), bytes_of!(f32, [2.25f32, 8.0, 1e30])];
        let t = DataType::Float32;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(f32, [3.75f32, 6.0, 2e30]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(f32, [3.375f32, -16.0, f32::INFINITY]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(f32, [2.25f32, 8.0, 1e30]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(f32, [1.5f32, -2.0, 1e30]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(f32, [1.875f32, 3.0, 1e30]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(0.5), &ins), bytes_of!(f32, [1.875f32, 3.0, 1e30]));

        let ins = [bytes_of!(f64, [0.5f64, -4.0]), bytes_of!(f64, [0.25f64, 3.0])];
        let t = DataType::Float64;
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(f64, [0.75f64, -1.0]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(f64, [0.125f64, -12.0]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(f64, [0.5f64, 3.0]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(f64, [0.25f64, -4.0]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(f64, [0.375f64, -0.5]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(10.0), &ins), bytes_of!(f64, [7.5f64, -10.0]));
    }

    #[test]
    fn float_min_max_ignore_nan_like_fminf() {
        let ins = [bytes_of!(f32, [f32::NAN, 3.0]), bytes_of!(f32, [3.0f32, f32::NAN])];
        assert_eq!(red(DataType::Float32, RedOp::Max, None, &ins), bytes_of!(f32, [3.0f32, 3.0]));
        assert_eq!(red(DataType::Float32, RedOp::Min, None, &ins), bytes_of!(f32, [3.0f32, 3.0]));
        let sum = red(DataType::Float32, RedOp::Sum, None, &ins);
        assert!(f32::from_ne_bytes(sum[0..4].try_into().unwrap()).is_nan());
    }

    #[test]
    fn float16_by_bit_pattern() {
        // 1.0, 3.0, 65504 (largest half), -2.0   and   1 + 2^-10, 0.5, 65504, 1.0
        let ins =
            [bytes_of!(u16, [0x3c00u16, 0x4200, 0x7bff, 0xc000]), bytes_of!(u16, [0x3c01u16, 0x3800, 0x7bff, 0x3c00])];
        let t = DataType::Float16;
        // 2 + 2^-10 is a tie between 2.0 and 2 + 2^-9: even is 2.0. 65504 * 2 overflows to inf.
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(u16, [0x4000u16, 0x4300, 0x7c00, 0xbc00]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(u16, [0x3c01u16, 0x3e00, 0x7c00, 0xc000]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(u16, [0x3c01u16, 0x4200, 0x7bff, 0x3c00]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(u16, [0x3c00u16, 0x3800, 0x7bff, 0xc000]));
        // Computed in f32: (65504 + 65504) / 2 does not overflow; 1 + 2^-11 ties to 1.0.
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(u16, [0x3c00u16, 0x3f00, 0x7bff, 0xb800]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(0.5), &ins), bytes_of!(u16, [0x3c00u16, 0x3f00, 0x7bff, 0xb800]));
    }

    #[test]
    fn bfloat16_by_bit_pattern() {
        // 1.0, 3.0, largest bf16, -2.0   and   1 + 2^-7, 0.5, largest bf16, 1.0
        let ins =
            [bytes_of!(u16, [0x3f80u16, 0x4040, 0x7f7f, 0xc000]), bytes_of!(u16, [0x3f81u16, 0x3f00, 0x7f7f, 0x3f80])];
        let t = DataType::Bfloat16;
        // 2 + 2^-7 ties between 2.0 and 2 + 2^-6: even is 2.0. Twice the largest is inf in f32.
        assert_eq!(red(t, RedOp::Sum, None, &ins), bytes_of!(u16, [0x4000u16, 0x4060, 0x7f80, 0xbf80]));
        assert_eq!(red(t, RedOp::Prod, None, &ins), bytes_of!(u16, [0x3f81u16, 0x3fc0, 0x7f80, 0xc000]));
        assert_eq!(red(t, RedOp::Max, None, &ins), bytes_of!(u16, [0x3f81u16, 0x4040, 0x7f7f, 0x3f80]));
        assert_eq!(red(t, RedOp::Min, None, &ins), bytes_of!(u16, [0x3f80u16, 0x3f00, 0x7f7f, 0xc000]));
        assert_eq!(red(t, RedOp::Avg, None, &ins), bytes_of!(u16, [0x3f80u16, 0x3fe0, 0x7f80, 0xbf00]));
        assert_eq!(red(t, RedOp::PreMulSum, Some(0.5), &ins), bytes_of!(u16, [0x3f80u16, 0x3fe0, 0x7f7f, 0xbf00]));
    }

    #[test]
    fn premulsum_scalar_is_rounded_to_the_type() {
        // 2.9 as an int32 scalar is 2 (NCCL passes the scalar in the element type).
        let ins = [bytes_of!(i32, [5i32]), bytes_of!(i32, [7i32])];
        assert_eq!(red(DataType::Int32, RedOp::PreMulSum, Some(2.9), &ins), bytes_of!(i32, [24i32]));
        // 1.0008 as a half is 1 + 2^-10; times 3.0 that is 3 + 1.5 ulps, a tie that rounds to
        // even 0x4202. (With the unrounded scalar, 3.0024 would round to 0x4201.)
        let ins = [bytes_of!(u16, [0x4200u16])];
        assert_eq!(red(DataType::Float16, RedOp::PreMulSum, Some(1.0008), &ins), bytes_of!(u16, [0x4202u16]));
    }

    #[test]
    fn fp8_is_not_implemented_yet() {
        for t in [DataType::Float8e4m3, DataType::Float8e5m2] {
            let mut out = [0u8; 2];
            let e = reduce(t, RedOp::Sum, None, &[&[1, 2]], &mut out).unwrap_err();
            assert_eq!(e.code, ResultCode::InvalidUsage);
            assert!(e.message.contains("fp8 reductions are not implemented"), "{}", e.message);
            assert_eq!(check_supported(t).unwrap_err().code, ResultCode::InvalidUsage);
        }
    }

    #[test]
    fn single_input_is_identity_except_avg_divides_by_one() {
        let ins = [bytes_of!(i64, [-3i64, 9])];
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
            assert_eq!(red(DataType::Int64, op, None, &ins), ins[0], "{op}");
        }
    }
}

//! Element types: the Rust types a buffer of the typed API may hold, each mapped to its
//! NCCL [`DataType`] at compile time.

use crate::types::DataType;

pub use float8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
}

/// A type the collectives can move and reduce: `f32`, `f64`, [`f16`](struct@f16), [`bf16`], `i8`, `u8`,
/// `i32`, `u32`, `i64`, `u64`, [`F8E4M3`] and [`F8E5M2`]. Sealed: the set is NCCL's.
///
/// The fp8 types are the `float8` crate's (one byte each, converted as CUDA's `cuda_fp8.h`
/// does with saturation to the largest finite value), the half types the `half` crate's.
///
/// ```
/// use rustccl::typed::{Element, F8E4M3, bf16};
/// use rustccl::types::DataType;
/// assert_eq!(f32::DATA_TYPE, DataType::Float32);
/// assert_eq!(bf16::DATA_TYPE, DataType::Bfloat16);
/// assert_eq!(F8E4M3::DATA_TYPE.size(), 1);
/// assert_eq!(F8E4M3::from_f64(2.0).to_scalar(), 2.0);
/// ```
pub trait Element: sealed::Sealed + bytemuck::Pod + Send + Sync + std::fmt::Debug + 'static {
    /// The NCCL type of this element.
    const DATA_TYPE: DataType;

    /// The value as the `f64` a PreMulSum scalar travels as (exact for every type but
    /// 64-bit integers beyond 2^53).
    fn to_scalar(self) -> f64;
}

macro_rules! element {
    ($t:ty, $dt:ident, |$v:ident| $to:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = DataType::$dt;
            fn to_scalar(self) -> f64 {
                let $v = self;
                $to
            }
        }
    };
}

element!(i8, Int8, |v| v as f64);
element!(u8, Uint8, |v| v as f64);
element!(i32, Int32, |v| v as f64);
element!(u32, Uint32, |v| v as f64);
element!(i64, Int64, |v| v as f64);
element!(u64, Uint64, |v| v as f64);
element!(f16, Float16, |v| v.to_f64());
element!(f32, Float32, |v| v as f64);
element!(f64, Float64, |v| v);
element!(bf16, Bfloat16, |v| v.to_f64());
element!(F8E4M3, Float8e4m3, |v| v.to_f64());
element!(F8E5M2, Float8e5m2, |v| v.to_f64());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nccl_type_has_exactly_one_element_of_its_size() {
        fn info<T: Element>() -> (DataType, usize) {
            (T::DATA_TYPE, std::mem::size_of::<T>())
        }
        let all = [
            info::<i8>(),
            info::<u8>(),
            info::<i32>(),
            info::<u32>(),
            info::<i64>(),
            info::<u64>(),
            info::<f16>(),
            info::<f32>(),
            info::<f64>(),
            info::<bf16>(),
            info::<F8E4M3>(),
            info::<F8E5M2>(),
        ];
        for (i, (dt, size)) in all.iter().enumerate() {
            assert_eq!(*dt, DataType::ALL[i], "NCCL value order");
            assert_eq!(*size, dt.size(), "{dt}: Rust size matches NCCL size");
        }
    }

    #[test]
    fn fp8_bits_match_the_reduction_code() {
        // The float8 crate's encoding is the one the reduction kernels use.
        for x in [-448.0f64, -1.5, -0.0, 0.0, 0.125, 1.0, 3.5, 448.0, 1000.0] {
            assert_eq!(F8E4M3::from_f64(x).to_bits(), crate::reduce::fp8::f64_to_e4m3(x), "e4m3 {x}");
            assert_eq!(F8E5M2::from_f64(x).to_bits(), crate::reduce::fp8::f64_to_e5m2(x), "e5m2 {x}");
        }
        assert_eq!(f16::from_f32(2.5).to_scalar(), 2.5);
    }
}

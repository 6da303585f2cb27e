//! How a collective's reduction reaches the kernel: the kernel's operator (which
//! instantiation of `exec.cu`), the PreMulSum scalar as the element type's bits, and the
//! divisor of SumPostDiv — the same conversions the host reference (`crate::reduce`) makes.

use rustccl_kernels::DeviceOp;

use crate::reduce::DevOp;
use crate::types::DataType;

/// The PreMulSum scalar converted to `dtype` as the host reference does (`Elem::scalar`),
/// as the bits the kernel reads (zero-extended).
pub fn scalar_bits(dtype: DataType, s: f64) -> u64 {
    use crate::reduce::{float, fp8};
    match dtype {
        DataType::Int8 => (s as i8) as u8 as u64,
        DataType::Uint8 => (s as u8) as u64,
        DataType::Int32 => (s as i32) as u32 as u64,
        DataType::Uint32 => (s as u32) as u64,
        DataType::Int64 => (s as i64) as u64,
        DataType::Uint64 => s as u64,
        DataType::Float16 => float::f64_to_f16(s) as u64,
        DataType::Float32 => (s as f32).to_bits() as u64,
        DataType::Float64 => s.to_bits(),
        DataType::Bfloat16 => float::f64_to_bf16(s) as u64,
        DataType::Float8e4m3 => fp8::f64_to_e4m3(s) as u64,
        DataType::Float8e5m2 => fp8::f64_to_e5m2(s) as u64,
    }
}

/// The kernel operator, scalar bits and divisor of a collective's device operator.
pub fn coll_device_op(op: DevOp, dtype: DataType) -> (DeviceOp, u64, u64) {
    match op {
        DevOp::Sum => (DeviceOp::Sum, 0, 1),
        DevOp::Prod => (DeviceOp::Prod, 0, 1),
        DevOp::Min => (DeviceOp::Min, 0, 1),
        DevOp::Max => (DeviceOp::Max, 0, 1),
        DevOp::PreMulSum { scalar } => (DeviceOp::PreMulSum, scalar_bits(dtype, scalar), 1),
        DevOp::SumPostDiv { n } => (DeviceOp::SumPostDiv, 0, n),
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{float, fp8};

    #[test]
    fn scalar_bits_convert_like_the_host_reference() {
        assert_eq!(scalar_bits(DataType::Int8, -1.0), 0xff);
        assert_eq!(scalar_bits(DataType::Int8, 300.0), 0x7f, "saturates like Rust's as");
        assert_eq!(scalar_bits(DataType::Uint8, -3.0), 0);
        assert_eq!(scalar_bits(DataType::Int32, -2.7), (-2i32) as u32 as u64);
        assert_eq!(scalar_bits(DataType::Int64, -5.0), (-5i64) as u64);
        assert_eq!(scalar_bits(DataType::Uint64, 7.9), 7);
        assert_eq!(scalar_bits(DataType::Float32, 0.25), 0.25f32.to_bits() as u64);
        assert_eq!(scalar_bits(DataType::Float64, 1.0 / 3.0), (1.0f64 / 3.0).to_bits());
        assert_eq!(scalar_bits(DataType::Float16, 1.0 / 3.0), float::f64_to_f16(1.0 / 3.0) as u64);
        assert_eq!(scalar_bits(DataType::Bfloat16, 0.1), float::f64_to_bf16(0.1) as u64);
        assert_eq!(scalar_bits(DataType::Float8e4m3, 1000.0), fp8::E4M3_MAX as u64);
        assert_eq!(scalar_bits(DataType::Float8e5m2, 0.5), fp8::f64_to_e5m2(0.5) as u64);
    }

    #[test]
    fn avg_maps_like_nccl() {
        use crate::types::RedOp;
        let device_op =
            |op, scalar, dtype, n| DevOp::from_user(op, scalar, dtype, n).map(|d| coll_device_op(d, dtype));
        let (op, s, d) = device_op(RedOp::Avg, None, DataType::Float32, 4).unwrap();
        assert_eq!((op, s, d), (DeviceOp::PreMulSum, 0.25f32.to_bits() as u64, 1));
        let (op, s, d) = device_op(RedOp::Avg, None, DataType::Int32, 3).unwrap();
        assert_eq!((op, s, d), (DeviceOp::SumPostDiv, 0, 3));
        assert_eq!(device_op(RedOp::Max, None, DataType::Uint8, 2).unwrap().0, DeviceOp::Max);
        let (op, s, _) = device_op(RedOp::PreMulSum, Some(2.0), DataType::Float16, 2).unwrap();
        assert_eq!((op, s), (DeviceOp::PreMulSum, float::f64_to_f16(2.0) as u64));
        assert!(device_op(RedOp::PreMulSum, None, DataType::Float16, 2).is_err());
    }
}

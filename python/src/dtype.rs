//! Element types: NCCL's data types by their Python names, and as the buffer protocol's
//! struct format characters and DLPack's type codes give them.

use rustccl::types::DataType;

use crate::errors::invalid_argument;
use pyo3::PyResult;

/// The Python names (`Buffer.from_ptr`'s `dtype`), one per NCCL type.
pub const NAMES: [(&str, DataType); 12] = [
    ("int8", DataType::Int8),
    ("uint8", DataType::Uint8),
    ("int32", DataType::Int32),
    ("uint32", DataType::Uint32),
    ("int64", DataType::Int64),
    ("uint64", DataType::Uint64),
    ("float16", DataType::Float16),
    ("float32", DataType::Float32),
    ("float64", DataType::Float64),
    ("bfloat16", DataType::Bfloat16),
    ("float8_e4m3", DataType::Float8e4m3),
    ("float8_e5m2", DataType::Float8e5m2),
];

pub fn name(dtype: DataType) -> &'static str {
    NAMES.iter().find(|(_, d)| *d == dtype).map_or("?", |(n, _)| n)
}

pub fn from_name(name: &str) -> PyResult<DataType> {
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d).ok_or_else(|| {
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        invalid_argument(format!("unknown dtype {name:?}: pass one of {}", names.join(", ")))
    })
}

/// The type of a buffer-protocol format (`"f"`, `"<q"`, `"e"`, ...) with `itemsize` bytes per
/// element; native (`@`, `=`) or little-endian (`<`, the byte order of every platform rustccl
/// runs on) only.
pub fn from_format(format: &str, itemsize: usize) -> PyResult<DataType> {
    let code = format.trim_start_matches(['@', '=', '<']);
    let dtype = match (code, itemsize) {
        ("b", 1) => Some(DataType::Int8),
        ("B", 1) => Some(DataType::Uint8),
        ("i" | "l" | "q" | "n", 4) => Some(DataType::Int32),
        ("i" | "l" | "q" | "n", 8) => Some(DataType::Int64),
        ("I" | "L" | "Q" | "N", 4) => Some(DataType::Uint32),
        ("I" | "L" | "Q" | "N", 8) => Some(DataType::Uint64),
        ("e", 2) => Some(DataType::Float16),
        ("f", 4) => Some(DataType::Float32),
        ("d", 8) => Some(DataType::Float64),
        _ => None,
    };
    dtype.ok_or_else(|| {
        invalid_argument(format!(
            "a buffer of format {format:?} ({itemsize} bytes per element) has no NCCL data type; pass int8, uint8, int32, uint32, \
             int64, uint64, float16, float32 or float64 elements (bfloat16 and float8 through DLPack or Buffer.from_ptr)"
        ))
    })
}

/// DLPack's `DLDataType` codes (dlpack.h).
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_FLOAT8_E4M3FN: u8 = 10;
const DL_FLOAT8_E5M2: u8 = 12;

/// The type of a DLPack tensor's `(code, bits, lanes)`.
pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> PyResult<DataType> {
    let dtype = match (code, bits, lanes) {
        (DL_INT, 8, 1) => Some(DataType::Int8),
        (DL_UINT, 8, 1) => Some(DataType::Uint8),
        (DL_INT, 32, 1) => Some(DataType::Int32),
        (DL_UINT, 32, 1) => Some(DataType::Uint32),
        (DL_INT, 64, 1) => Some(DataType::Int64),
        (DL_UINT, 64, 1) => Some(DataType::Uint64),
        (DL_FLOAT, 16, 1) => Some(DataType::Float16),
        (DL_FLOAT, 32, 1) => Some(DataType::Float32),
        (DL_FLOAT, 64, 1) => Some(DataType::Float64),
        (DL_BFLOAT, 16, 1) => Some(DataType::Bfloat16),
        (DL_FLOAT8_E4M3FN, 8, 1) => Some(DataType::Float8e4m3),
        (DL_FLOAT8_E5M2, 8, 1) => Some(DataType::Float8e5m2),
        _ => None,
    };
    dtype.ok_or_else(|| {
        invalid_argument(format!(
            "a DLPack tensor of type code {code}, {bits} bits, {lanes} lanes has no NCCL data type; pass int8, uint8, int32, \
             uint32, int64, uint64, float16, float32, float64, bfloat16, float8_e4m3fn or float8_e5m2 elements"
        ))
    })
}

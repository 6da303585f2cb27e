//! NCCL's ABI enums: the element types (`ncclDataType_t`) and reduction operators
//! (`ncclRedOp_t`), value for value, so the C API can pass them straight through.

/// An element type, `ncclDataType_t` value for value.
///
/// NCCL's aliases map onto these: `ncclChar` = [`DataType::Int8`], `ncclInt` =
/// [`DataType::Int32`], `ncclHalf` = [`DataType::Float16`], `ncclFloat` = [`DataType::Float32`],
/// `ncclDouble` = [`DataType::Float64`].
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl DataType {
    /// Every type, in value order (`ALL[i] as i32 == i`).
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// `ncclNumTypes`.
    pub const NUM_TYPES: i32 = 12;

    /// The type with NCCL value `v`, or `None` when `v` names no type.
    pub fn from_i32(v: i32) -> Option<DataType> {
        usize::try_from(v).ok().and_then(|i| DataType::ALL.get(i).copied())
    }

    /// The size of one element in bytes.
    pub fn size(self) -> usize {
        use DataType::*;
        match self {
            Int8 | Uint8 | Float8e4m3 | Float8e5m2 => 1,
            Float16 | Bfloat16 => 2,
            Int32 | Uint32 | Float32 => 4,
            Int64 | Uint64 | Float64 => 8,
        }
    }

    /// The lower-case name used in logs ("int8", "float16", ...).
    pub fn name(self) -> &'static str {
        use DataType::*;
        match self {
            Int8 => "int8",
            Uint8 => "uint8",
            Int32 => "int32",
            Uint32 => "uint32",
            Int64 => "int64",
            Uint64 => "uint64",
            Float16 => "float16",
            Float32 => "float32",
            Float64 => "float64",
            Bfloat16 => "bfloat16",
            Float8e4m3 => "float8e4m3",
            Float8e5m2 => "float8e5m2",
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        use DataType::*;
        matches!(self, Float16 | Float32 | Float64 | Bfloat16 | Float8e4m3 | Float8e5m2)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
///
/// The built-in ones have NCCL's fixed values (Sum 0, Prod 1, Max 2, Min 3, Avg 4).
/// [`RedOp::PreMulSum`] has no fixed value: NCCL creates it per communicator with
/// `ncclRedOpCreatePreMulSum`, which hands out values from `ncclNumOps` up; the scalar it
/// multiplies by travels separately (see [`crate::reduce::DevOp::from_user`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum,
}

impl RedOp {
    /// `ncclNumOps`: the number of built-in operators; dynamic operators start here.
    pub const NUM_BUILTIN: i32 = 5;

    /// The built-in operator with NCCL value `v` (0..=4); `None` for anything else,
    /// including the values of dynamically created operators.
    pub fn from_i32(v: i32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }

    /// The NCCL value of a built-in operator; `None` for [`RedOp::PreMulSum`].
    pub fn builtin_value(self) -> Option<i32> {
        Some(match self {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Max => 2,
            RedOp::Min => 3,
            RedOp::Avg => 4,
            RedOp::PreMulSum => return None,
        })
    }

    /// The lower-case name used in logs ("sum", "premulsum", ...).
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::PreMulSum => "premulsum",
        }
    }
}

impl std::fmt::Display for RedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatype_values_match_nccl_and_round_trip() {
        assert_eq!(DataType::ALL.len() as i32, DataType::NUM_TYPES);
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(*t as i32, i as i32);
            assert_eq!(DataType::from_i32(i as i32), Some(*t));
        }
        assert_eq!(DataType::Float32 as i32, 7);
        assert_eq!(DataType::Bfloat16 as i32, 9);
        assert_eq!(DataType::Float8e5m2 as i32, 11);
        assert_eq!(DataType::from_i32(12), None);
        assert_eq!(DataType::from_i32(-1), None);
    }

    #[test]
    fn datatype_sizes_and_names() {
        let expect = [
            ("int8", 1),
            ("uint8", 1),
            ("int32", 4),
            ("uint32", 4),
            ("int64", 8),
            ("uint64", 8),
            ("float16", 2),
            ("float32", 4),
            ("float64", 8),
            ("bfloat16", 2),
            ("float8e4m3", 1),
            ("float8e5m2", 1),
        ];
        for (t, (name, size)) in DataType::ALL.iter().zip(expect) {
            assert_eq!(t.name(), name);
            assert_eq!(t.size(), size, "{name}");
            assert_eq!(t.to_string(), name);
        }
        assert!(DataType::Bfloat16.is_float());
        assert!(!DataType::Uint64.is_float());
    }

    #[test]
    fn redop_values_match_nccl() {
        let builtin = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];
        for (v, op) in builtin.iter().enumerate() {
            assert_eq!(RedOp::from_i32(v as i32), Some(*op));
            assert_eq!(op.builtin_value(), Some(v as i32));
        }
        assert_eq!(RedOp::from_i32(RedOp::NUM_BUILTIN), None);
        assert_eq!(RedOp::from_i32(-1), None);
        assert_eq!(RedOp::PreMulSum.builtin_value(), None);
        assert_eq!(RedOp::PreMulSum.to_string(), "premulsum");
    }
}

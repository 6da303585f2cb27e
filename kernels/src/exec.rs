//! The host's side of `exec.cu`, the collective interpreter: the layout of what a launch
//! reads (steps, items, contexts, connections, the control block) and the kernel's
//! parameter. Each struct is `#[repr(C)]` and the twin of the C struct of the same name
//! in `device/exec.cu`; the sizes are checked below.

/// The compilation unit.
pub const EXEC_SOURCE: &str = "exec.cu";
/// The kernel's name.
pub const EXEC_KERNEL: &str = "rustccl_exec";
/// Threads per block.
pub const EXEC_THREADS: u32 = 512;
/// Work items one block runs, interleaved (`RUSTCCL_EXEC_MAX_ITEMS`).
pub const EXEC_MAX_ITEMS_PER_BLOCK: usize = 16;
/// Blocks of one launch at most.
pub const EXEC_MAX_BLOCKS: usize = 128;
/// Connections one launch uses at most (`RUSTCCL_EXEC_MAX_CONNS`).
pub const EXEC_MAX_CONNS: usize = 256;
/// Receive (or send) connections of one step at most.
pub const EXEC_MAX_PEERS: usize = 2;

pub const STEP_SRC: u8 = 1;
pub const STEP_DST: u8 = 2;
pub const STEP_REDUCE: u8 = 4;
pub const STEP_POST: u8 = 8;
pub const STEP_SRC_IN_DST: u8 = 16;

pub const PROTO_SIMPLE: u8 = 0;
pub const PROTO_LL: u8 = 1;
pub const PROTO_LL128: u8 = 2;

pub const CONN_SEND: u32 = 1;
/// NVLink P2P: 128-byte stores reach the peer whole and LL/LL128 have slots of their own, so
/// consumers wait on the line flags.
pub const CONN_LINES_WHOLE: u32 = 2;

/// `ExecControl::error`: a peer's slot held a different number of bytes than the step.
pub const EXEC_ERR_SIZE: u32 = 1;
/// `ExecControl::error`: a peer's slot came from another operation (`expected` is this
/// rank's signature, `got` the peer's).
pub const EXEC_ERR_SIG: u32 = 2;
/// Byte offsets in the FIFO header (`transport::fifo::FifoHeader`) the kernel reads and writes.
pub const FIFO_HEAD: usize = 0;
pub const FIFO_TAIL: usize = 64;
pub const FIFO_SIZES: usize = 128;
pub const FIFO_SIGS: usize = 192;

/// Bytes a step of `bytes` payload bytes occupies in a slot with protocol `proto`.
pub fn wire_bytes(proto: u8, bytes: usize) -> usize {
    let words = bytes.div_ceil(8);
    match proto {
        PROTO_LL => words * 16,
        PROTO_LL128 => words.div_ceil(15) * 128,
        _ => bytes,
    }
}

/// The most payload bytes a slot of `slot_bytes` carries with protocol `proto`.
pub fn payload_capacity(proto: u8, slot_bytes: usize) -> usize {
    match proto {
        PROTO_LL => slot_bytes / 16 * 8,
        PROTO_LL128 => slot_bytes / 128 * 120,
        _ => slot_bytes,
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecStep {
    pub src: u64,
    pub dst: u64,
    pub bytes: u32,
    pub ctx: u16,
    pub flags: u8,
    pub proto: u8,
    pub nrecv: u8,
    pub nsend: u8,
    pub recv: [u8; EXEC_MAX_PEERS],
    pub send: [u8; EXEC_MAX_PEERS],
    pub pad: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecItem {
    pub first: u32,
    pub count: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecCtx {
    pub src: u64,
    pub dst: u64,
    /// PreMulSum: the scalar's bits in the element type.
    pub scalar: u64,
    /// SumPostDiv: the divisor.
    pub divisor: u64,
    /// The operation's signature (`rustccl::coll::check::OpSig`; 0: not checked), published
    /// with every slot and folded into LL/LL128 line flags.
    pub sig: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecConn {
    pub slots: u64,
    pub header: u64,
    pub slot_bytes: u32,
    pub flags: u32,
    /// With [`CONN_LINES_WHOLE`]: the LL and LL128 slots.
    pub ll_slots: u64,
    pub ll128_slots: u64,
    pub ll_slot_bytes: u32,
    pub ll128_slot_bytes: u32,
    pub pad: [u64; 2],
}

/// Host memory the kernel polls and writes (mapped into the device).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecControl {
    pub abort: u32,
    pub error: u32,
    pub conn: u32,
    pub pad: u32,
    pub expected: u64,
    pub got: u64,
}

/// The kernel's one parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecArgs {
    pub steps: u64,
    pub items: u64,
    pub ctxs: u64,
    pub conns: u64,
    pub control: u64,
    pub nitems: u32,
    pub nconns: u32,
}

/// Anything made of these plain structs as bytes (for the program image).
pub fn as_bytes<T: Copy>(items: &[T]) -> &[u8] {
    // SAFETY: the types used here are #[repr(C)] integers without padding bytes (the sizes
    // below prove it), so every byte is initialised.
    unsafe { std::slice::from_raw_parts(items.as_ptr() as *const u8, std::mem::size_of_val(items)) }
}

/// The `-D` options that build `exec.cu` for `op` on elements of `ncclDataType_t` value
/// `dtype`; `None` for an unknown type and for SumPostDiv on a floating type.
pub fn exec_defines(op: crate::DeviceOp, dtype: i32) -> Option<Vec<String>> {
    const ELEMS: [&str; 12] = [
        "RustcclElemI8",
        "RustcclElemU8",
        "RustcclElemI32",
        "RustcclElemU32",
        "RustcclElemI64",
        "RustcclElemU64",
        "RustcclElemF16",
        "RustcclElemF32",
        "RustcclElemF64",
        "RustcclElemBF16",
        "RustcclElemF8E4M3",
        "RustcclElemF8E5M2",
    ];
    let elem = ELEMS.get(usize::try_from(dtype).ok()?)?;
    op.supports(dtype).then_some(())?;
    let op = match op {
        crate::DeviceOp::Sum => "RUSTCCL_OP_SUM",
        crate::DeviceOp::Prod => "RUSTCCL_OP_PROD",
        crate::DeviceOp::Min => "RUSTCCL_OP_MIN",
        crate::DeviceOp::Max => "RUSTCCL_OP_MAX",
        crate::DeviceOp::PreMulSum => "RUSTCCL_OP_PREMULSUM",
        crate::DeviceOp::SumPostDiv => "RUSTCCL_OP_SUMPOSTDIV",
    };
    Some(vec![format!("-DRUSTCCL_EXEC_ELEM={elem}"), format!("-DRUSTCCL_EXEC_OP={op}")])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_exec_cu() {
        assert_eq!(std::mem::size_of::<ExecStep>(), 32);
        assert_eq!(std::mem::size_of::<ExecItem>(), 8);
        assert_eq!(std::mem::size_of::<ExecCtx>(), 40);
        assert_eq!(std::mem::size_of::<ExecConn>(), 64);
        assert_eq!(std::mem::size_of::<ExecControl>(), 32);
        assert_eq!(std::mem::size_of::<ExecArgs>(), 48);
        let src = include_str!("device/exec.cu");
        for (name, value) in [
            ("RUSTCCL_EXEC_THREADS", EXEC_THREADS as usize),
            ("RUSTCCL_EXEC_MAX_ITEMS", EXEC_MAX_ITEMS_PER_BLOCK),
            ("RUSTCCL_EXEC_MAX_CONNS", EXEC_MAX_CONNS),
            ("RUSTCCL_EXEC_MAX_PEERS", EXEC_MAX_PEERS),
        ] {
            assert!(src.contains(&format!("#define {name} {value} ")), "{name} differs from exec.cu");
        }
        for (name, value) in [
            ("RUSTCCL_FIFO_HEAD", FIFO_HEAD),
            ("RUSTCCL_FIFO_TAIL", FIFO_TAIL),
            ("RUSTCCL_FIFO_SIZES", FIFO_SIZES),
            ("RUSTCCL_FIFO_SIGS", FIFO_SIGS),
        ] {
            assert!(src.contains(&format!("#define {name} {value}\n")), "{name} differs from exec.cu");
        }
        for (name, value) in [("RUSTCCL_EXEC_ERR_SIZE", EXEC_ERR_SIZE), ("RUSTCCL_EXEC_ERR_SIG", EXEC_ERR_SIG)] {
            assert!(src.contains(&format!("#define {name} {value}u\n")), "{name} differs from exec.cu");
        }
    }

    #[test]
    fn wire_sizes() {
        assert_eq!(wire_bytes(PROTO_SIMPLE, 13), 13);
        assert_eq!(wire_bytes(PROTO_LL, 13), 32);
        assert_eq!(wire_bytes(PROTO_LL128, 120), 128);
        assert_eq!(wire_bytes(PROTO_LL128, 121), 256);
        for p in [PROTO_SIMPLE, PROTO_LL, PROTO_LL128] {
            let cap = payload_capacity(p, 1 << 20);
            assert!(wire_bytes(p, cap) <= 1 << 20);
            assert!(wire_bytes(p, cap + 8) > 1 << 20);
        }
    }
}

//! The host's side of `exec.cu`, the collective interpreter, and the one definition of the
//! ABI between them: the constants (slots per FIFO, launch limits, step flags, protocols,
//! connection flags, FIFO header offsets, error codes) and the layout of what a launch reads
//! (steps, items, contexts, connections, the control block) and of the kernel's parameter.
//!
//! The kernel does not define any of these itself: [`abi_header`] writes them as the C header
//! [`ABI_HEADER`] (`#define`s, the structs, and `static_assert`s of every struct's size and
//! every field's offset and size, computed here), which `exec.cu` includes; the kernel sources
//! ([`crate::sources`]) carry it, so NVRTC compiles it and the kernel cache's key covers it. A
//! C layout that drifted from these structs does not compile.

mod abi_header;

pub use abi_header::{abi_header, AbiConst, AbiField, AbiStruct, CElem, CType};

/// The compilation unit.
pub const EXEC_SOURCE: &str = "exec.cu";
/// The generated header `exec.cu` includes (see [`abi_header`]).
pub const ABI_HEADER: &str = "rustccl_exec_abi.h";
/// The name of the kernel entry point that runs steps of every protocol.
pub const EXEC_KERNEL: &str = "rustccl_exec";

/// The kernel's entry points. Each is the same interpreter built for a set of protocols: a
/// launch whose steps all use one protocol takes that protocol's entry, whose registers go to
/// that protocol's data loop alone (with every loop in one function, the heaviest makes the
/// others spill); a launch that mixes protocols takes [`ExecEntry::Mixed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecEntry {
    Mixed,
    Simple,
    Ll,
    Ll128,
}

impl ExecEntry {
    /// Every entry point, in the order the host loads them.
    pub const ALL: [ExecEntry; 4] = [ExecEntry::Mixed, ExecEntry::Simple, ExecEntry::Ll, ExecEntry::Ll128];

    /// The entry point's name in `exec.cu`.
    pub fn name(self) -> &'static str {
        match self {
            ExecEntry::Mixed => EXEC_KERNEL,
            ExecEntry::Simple => "rustccl_exec_simple",
            ExecEntry::Ll => "rustccl_exec_ll",
            ExecEntry::Ll128 => "rustccl_exec_ll128",
        }
    }

    /// Position in [`ExecEntry::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The entry point for a launch whose steps use the protocols in `protocols` (a bit
    /// `1 << PROTO_*` each).
    pub fn for_protocols(protocols: u8) -> ExecEntry {
        match protocols {
            p if p == 1 << PROTO_SIMPLE => ExecEntry::Simple,
            p if p == 1 << PROTO_LL => ExecEntry::Ll,
            p if p == 1 << PROTO_LL128 => ExecEntry::Ll128,
            _ => ExecEntry::Mixed,
        }
    }
}
/// Blocks of one launch at most (the host's limit; the kernel takes the grid it is given).
pub const EXEC_MAX_BLOCKS: usize = 128;

/// Defines the constants shared with the kernel, and [`ABI_CONSTANTS`], the table
/// [`abi_header`] writes them from: `NAME: type = value => C_NAME "C literal suffix";`.
macro_rules! abi_constants {
    ($($(#[doc = $doc:literal])* $name:ident: $ty:ty = $value:expr => $cname:ident $suffix:literal;)*) => {
        $($(#[doc = $doc])* pub const $name: $ty = $value;)*
        /// Every constant shared with the kernel, as the header defines it.
        pub const ABI_CONSTANTS: &[AbiConst] = &[$(AbiConst {
            c_name: stringify!($cname),
            value: $name as u64,
            suffix: $suffix,
            doc: concat!($($doc),*),
        }),*];
    };
}

/// Defines the `#[repr(C)]` structs shared with the kernel, and [`abi_structs`], their C
/// names, sizes and fields for [`abi_header`]: `pub struct Name => CName { pub field: type, }`.
macro_rules! abi_structs {
    ($($(#[doc = $doc:literal])* pub struct $name:ident => $cname:ident {
        $($(#[doc = $fdoc:literal])* pub $field:ident: $fty:ty,)*
    })*) => {
        $(
            $(#[doc = $doc])*
            #[doc = ""]
            #[doc = concat!("The twin of `", stringify!($cname), "` in the generated [`ABI_HEADER`].")]
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
            pub struct $name {
                $($(#[doc = $fdoc])* pub $field: $fty,)*
            }

            impl CElem for $name {
                const C: &'static str = stringify!($cname);
            }
        )*
        /// Every struct shared with the kernel, with its layout as Rust lays it out.
        pub fn abi_structs() -> Vec<AbiStruct> {
            vec![$(AbiStruct {
                c_name: stringify!($cname),
                rust_name: stringify!($name),
                doc: concat!($($doc),*),
                size: std::mem::size_of::<$name>(),
                align: std::mem::align_of::<$name>(),
                fields: vec![$(AbiField {
                    name: stringify!($field),
                    decl: <$fty as CType>::decl(stringify!($field)),
                    offset: std::mem::offset_of!($name, $field),
                    size: std::mem::size_of::<$fty>(),
                    doc: concat!($($fdoc),*),
                }),*],
            }),*]
        }
    };
}

abi_constants! {
    /// Slots per FIFO (NCCL_STEPS; `transport::fifo::STEPS`).
    FIFO_STEPS: usize = 8 => RUSTCCL_EXEC_STEPS "ull";
    /// Threads per block.
    EXEC_THREADS: u32 = 512 => RUSTCCL_EXEC_THREADS "";
    /// Work items one block runs, interleaved.
    EXEC_MAX_ITEMS_PER_BLOCK: usize = 16 => RUSTCCL_EXEC_MAX_ITEMS "";
    /// Connections one launch uses at most.
    EXEC_MAX_CONNS: usize = 256 => RUSTCCL_EXEC_MAX_CONNS "";
    /// Receive (or send) connections of one step at most.
    EXEC_MAX_PEERS: usize = 2 => RUSTCCL_EXEC_MAX_PEERS "";
    /// Operation contexts whose per-call values (`ExecCall`) the kernel parameter carries;
    /// contexts from this index on keep theirs in the program image.
    EXEC_ARG_CTXS: usize = 8 => RUSTCCL_EXEC_ARG_CTXS "";

    /// Step flag: `src` is an input.
    STEP_SRC: u8 = 1 => RUSTCCL_STEP_SRC "u";
    /// Step flag: the result goes to `dst`.
    STEP_DST: u8 = 2 => RUSTCCL_STEP_DST "u";
    /// Step flag: the inputs are combined with the operator.
    STEP_REDUCE: u8 = 4 => RUSTCCL_STEP_REDUCE "u";
    /// Step flag: the post-op (SumPostDiv's division) is applied to the result.
    STEP_POST: u8 = 8 => RUSTCCL_STEP_POST "u";
    /// Step flag: `src` is an offset into the destination buffer.
    STEP_SRC_IN_DST: u8 = 16 => RUSTCCL_STEP_SRC_IN_DST "u";
    /// Step flag: the first of `run` receive steps of one operation on a P2P connection
    /// (plain receives into `dst`, Simple): the receiver posts their positions and its
    /// buffer's address in the sender's process (`ExecCtx::dst_remote`) in the FIFO header
    /// (FIFO_DIRECT), so the sender may write them straight into it (zero-copy receive).
    STEP_DIRECT_START: u8 = 32 => RUSTCCL_STEP_DIRECT_START "u";

    /// Protocol: the payload as is, waited for through `tail`.
    PROTO_SIMPLE: u8 = 0 => RUSTCCL_PROTO_SIMPLE "";
    /// Protocol: 16-byte lines of 8 payload bytes and two flags.
    PROTO_LL: u8 = 1 => RUSTCCL_PROTO_LL "";
    /// Protocol: 128-byte lines of 120 payload bytes and an 8-byte flag.
    PROTO_LL128: u8 = 2 => RUSTCCL_PROTO_LL128 "";

    /// Connection flag: this side sends.
    CONN_SEND: u32 = 1 => RUSTCCL_CONN_SEND "u";
    /// Connection flag: NVLink P2P: 128-byte stores reach the peer whole and LL/LL128 have
    /// slots of their own, so consumers wait on the line flags.
    CONN_LINES_WHOLE: u32 = 2 => RUSTCCL_CONN_LINES_WHOLE "u";
    /// Connection flag: P2P between processes or devices that map each other's registered
    /// buffers: a sender reads the receiver's posts (FIFO_DIRECT) and may write Simple steps
    /// straight into the receiver's buffer.
    CONN_DIRECT: u32 = 4 => RUSTCCL_CONN_DIRECT "u";

    /// Byte offset of `head` in the FIFO header (`transport::fifo::FifoHeader`).
    FIFO_HEAD: usize = 0 => RUSTCCL_FIFO_HEAD "";
    /// Byte offset of `tail` in the FIFO header.
    FIFO_TAIL: usize = 64 => RUSTCCL_FIFO_TAIL "";
    /// Byte offset of the slots' sizes in the FIFO header.
    FIFO_SIZES: usize = 128 => RUSTCCL_FIFO_SIZES "";
    /// Byte offset of the slots' signatures in the FIFO header.
    FIFO_SIGS: usize = 192 => RUSTCCL_FIFO_SIGS "";
    /// Byte offset of the receiver's direct post in the FIFO header: four u64, `[tag, base,
    /// sig, tag]`, tag = `first position << 16 | steps` (written first and last, so a reader
    /// that sees both equal saw one post whole), base = where the posted steps' message starts
    /// in the sender's process, sig = the receiving operation's signature.
    FIFO_DIRECT: usize = 256 => RUSTCCL_FIFO_DIRECT "";
    /// Bit of a slot's published size: the sender wrote the step straight into the
    /// receiver's buffer (a direct post covered it); the slot holds nothing.
    FIFO_SIZE_DIRECT: u64 = 1 << 63 => RUSTCCL_FIFO_SIZE_DIRECT "ull";
    /// A slot's published size when the network plugin did not report how many bytes it
    /// received (some never do): the consumer takes the step's own size, as NCCL does.
    FIFO_SIZE_UNREPORTED: u64 = 1 << 62 => RUSTCCL_FIFO_SIZE_UNREPORTED "ull";

    /// `ExecControl::error`: a peer's slot held a different number of bytes than the step.
    EXEC_ERR_SIZE: u32 = 1 => RUSTCCL_EXEC_ERR_SIZE "u";
    /// `ExecControl::error`: a peer's slot came from another operation (`expected` is this
    /// rank's signature, `got` the peer's).
    EXEC_ERR_SIG: u32 = 2 => RUSTCCL_EXEC_ERR_SIG "u";
    /// `ExecControl::error`: a step's protocol is not one the launched entry point was built
    /// for (`expected` is the entry's protocol mask, `got` the step's protocol).
    EXEC_ERR_PROTO: u32 = 3 => RUSTCCL_EXEC_ERR_PROTO "u";

    /// Symmetric kernels (`symmetric.h`): threads per block.
    SYM_THREADS: u32 = 512 => RUSTCCL_SYM_THREADS "";
    /// Symmetric kernels: blocks of one launch at most.
    SYM_MAX_BLOCKS: u32 = 32 => RUSTCCL_SYM_MAX_BLOCKS "";
    /// Symmetric resource memory: byte offset of the launch epoch (u32; the next u32 counts
    /// the blocks that finished the launch).
    SYM_RES_EPOCH: u64 = 0 => RUSTCCL_SYM_RES_EPOCH "ull";
    /// Symmetric resource memory: byte offset of this rank's PreMulSum scalar of the running
    /// launch (u64), which peers read after the entry barrier (each rank scales its own input).
    SYM_RES_SCALAR: u64 = 64 => RUSTCCL_SYM_RES_SCALAR "ull";
    /// Symmetric resource memory: byte offset of the barrier inboxes, u32
    /// `[SYM_MAX_BLOCKS][nranks]`: rank p's arrival for block b is at `b * nranks + p`.
    SYM_RES_INBOX: u64 = 128 => RUSTCCL_SYM_RES_INBOX "ull";
    /// Symmetric resource memory: byte offset of the one-sided operations' signal counters
    /// (`ncclPutSignal`, `ncclSignal`), u64 `[nranks]`: counter p counts the signals rank p
    /// sent this rank (only p adds to it, with release order; `one_sided.cu`). After the
    /// barrier inboxes (`[SYM_MAX_BLOCKS][nranks]` u32 end below it up to 4095 ranks).
    SYM_RES_SIGNALS: u64 = 512 << 10 => RUSTCCL_SYM_RES_SIGNALS "ull";
    /// Symmetric resource memory: byte offset of the one-sided waits' running expected
    /// counts, u64 `[nranks]`: the signals from rank p this rank's waits (`ncclWaitSignal`)
    /// consumed so far, kept on the device so that a wait replayed in a graph counts on.
    SYM_RES_SIGNALS_SEEN: u64 = 640 << 10 => RUSTCCL_SYM_RES_SIGNALS_SEEN "ull";
    /// One-sided waits: peers one wait launch waits for at most (its threads).
    SIGNAL_WAIT_MAX: usize = 32 => RUSTCCL_SIGNAL_WAIT_MAX "";
    /// Symmetric resource memory: byte offset of the copy-engine collectives' flags, u32
    /// `[nranks]` (rank p's arrival at `p`), written and waited for by stream memory
    /// operations (`coll::symmetric`; the kernels do not touch them).
    SYM_RES_CE: u64 = 768 << 10 => RUSTCCL_SYM_RES_CE "ull";
    /// Symmetric resource memory: byte offset of the one-shot LL scratch (two halves, by the
    /// epoch's parity, each cut into one region per source rank).
    SYM_RES_LL: u64 = 1 << 20 => RUSTCCL_SYM_RES_LL "ull";
    /// Symmetric resource memory: bytes of one half of the LL scratch.
    SYM_LL_HALF: u64 = 4 << 20 => RUSTCCL_SYM_LL_HALF "ull";
    /// Symmetric resource memory: bytes per rank in all.
    SYM_RES_BYTES: u64 = 10 << 20 => RUSTCCL_SYM_RES_BYTES "ull";
}

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

abi_structs! {
    /// One step of a work item's program.
    pub struct ExecStep => RustcclExecStep {
        /// Byte offset into the source (the destination with SRC_IN_DST).
        pub src: u64,
        /// Byte offset into the destination.
        pub dst: u64,
        /// Payload bytes.
        pub bytes: u32,
        /// Index into the contexts.
        pub ctx: u16,
        pub flags: u8,
        pub proto: u8,
        pub nrecv: u8,
        pub nsend: u8,
        pub recv: [u8; EXEC_MAX_PEERS],
        pub send: [u8; EXEC_MAX_PEERS],
        /// With STEP_DIRECT_START: the receive steps the post covers (this one and the next
        /// `run - 1` of the item).
        pub run: u16,
    }

    /// A work item: `count` steps from `first`.
    pub struct ExecItem => RustcclExecItem {
        pub first: u32,
        pub count: u32,
    }

    /// What the steps of one operation share: its buffers and scalars.
    pub struct ExecCtx => RustcclExecCtx {
        pub src: u64,
        pub dst: u64,
        /// PreMulSum: the scalar's bits in the element type.
        pub scalar: u64,
        /// SumPostDiv: the divisor.
        pub divisor: u64,
        /// The operation's signature (`rustccl::coll::check::OpSig`; 0: not checked),
        /// published with every slot and folded into LL/LL128 line flags.
        pub sig: u64,
        /// PreMulSum with the scalar in device memory (`ncclScalarDevice`): its address, read
        /// by the kernel when it starts (0: `scalar` holds it).
        pub scalar_ptr: u64,
        /// A receive from a P2P peer into a registered buffer (`ncclCommRegister`): `dst` as
        /// the sending peer's process addresses it (0: none; the sender copies through the
        /// FIFO).
        pub dst_remote: u64,
    }

    /// One connection: its slots and its FIFO header, in device addresses.
    pub struct ExecConn => RustcclExecConn {
        /// Device address of slot 0.
        pub slots: u64,
        /// Device address of the FIFO header.
        pub header: u64,
        pub slot_bytes: u32,
        pub flags: u32,
        /// With CONN_LINES_WHOLE: the LL and LL128 slots (of their own, so that a line is
        /// never mistaken for one because stale data of another format matches its flag).
        pub ll_slots: u64,
        pub ll128_slots: u64,
        pub ll_slot_bytes: u32,
        pub ll128_slot_bytes: u32,
        /// Simple slots in use (a power of two up to FIFO_STEPS): a Simple step at position `p` uses slot
        /// `p % simple_steps` and may start once the consumer is fewer than that many behind;
        /// LL and LL128 use all FIFO_STEPS of theirs. The header's sizes stay per FIFO_STEPS.
        pub simple_steps: u32,
        pub pad: [u32; 3],
    }

    /// Host memory the kernel polls and writes (mapped into the device).
    pub struct ExecControl => RustcclExecControl {
        pub abort: u32,
        pub error: u32,
        pub conn: u32,
        /// Receive steps the senders wrote straight into this rank's buffers (zero-copy),
        /// counted by the kernels without atomics: a lower bound when blocks race (for tests
        /// and logs).
        pub direct_steps: u32,
        pub expected: u64,
        pub got: u64,
    }

    /// What changes from call to call of one operation: its buffers and its PreMulSum
    /// scalar (the fields of the same names in `ExecCtx`, which the kernel takes from here
    /// for the first `ExecArgs::ncalls` contexts), so that the program image depends only on
    /// the shape of the work and is reused by calls on other buffers.
    pub struct ExecCall => RustcclExecCall {
        pub src: u64,
        pub dst: u64,
        pub scalar: u64,
        pub scalar_ptr: u64,
        pub dst_remote: u64,
    }

    /// The parameter of the symmetric kernels (`symmetric.h`). Addresses are this rank's in
    /// the communicator's flat window range: rank r's copy of one is `addr + (r - rank) *
    /// stride`.
    pub struct SymArgs => RustcclSymArgs {
        /// The send buffer (flat range; the one-shot LL kernel reads only its own).
        pub send: u64,
        /// The receive buffer (flat range).
        pub recv: u64,
        /// The resource memory (flat range): epoch, barrier inboxes, LL scratch.
        pub res: u64,
        pub stride: u64,
        /// all_reduce: the bytes of the buffer; all_gather and reduce_scatter: the bytes of
        /// one rank's part.
        pub bytes: u64,
        /// PreMulSum: the scalar's bits (or its address in `scalar_ptr`); SumPostDiv: the divisor.
        pub scalar: u64,
        pub scalar_ptr: u64,
        pub divisor: u64,
        /// The control block (`ExecControl`: the abort flag is polled while waiting).
        pub control: u64,
        pub rank: u32,
        pub nranks: u32,
    }

    /// The parameter of `rustccl_signal` (`one_sided.cu`): one signal to a peer.
    pub struct SignalArgs => RustcclSignalArgs {
        /// The peer's counter for this rank (flat range: `SYM_RES_SIGNALS + 8 * rank` of the
        /// peer's resource memory), which the kernel adds 1 to, release at system scope.
        pub counter: u64,
        /// The control block (unused by the signal, which never waits; kept for symmetry).
        pub control: u64,
    }

    /// The parameter of `rustccl_wait_signal` (`one_sided.cu`): waits for `counts[i]` more
    /// signals from each `peers[i]` (distinct peers) than this rank's waits consumed so far.
    pub struct WaitSignalArgs => RustcclWaitSignalArgs {
        /// This rank's counters (flat range: `SYM_RES_SIGNALS` of its resource memory).
        pub counters: u64,
        /// This rank's running expected counts (`SYM_RES_SIGNALS_SEEN`).
        pub seen: u64,
        /// The control block (`ExecControl`: the abort flag is polled while waiting).
        pub control: u64,
        /// Entries of `peers` and `counts` in use (1 to SIGNAL_WAIT_MAX).
        pub n: u32,
        pub pad: u32,
        pub peers: [u32; SIGNAL_WAIT_MAX],
        pub counts: [u32; SIGNAL_WAIT_MAX],
    }

    /// The kernel's one parameter.
    pub struct ExecArgs => RustcclExecArgs {
        pub steps: u64,
        pub items: u64,
        pub ctxs: u64,
        pub conns: u64,
        pub control: u64,
        pub nitems: u32,
        pub nconns: u32,
        /// Contexts whose per-call values are in `calls` (at most EXEC_ARG_CTXS): context `i <
        /// ncalls` takes `src`, `dst`, `scalar`, `scalar_ptr` and `dst_remote` from `calls[i]`, not from the
        /// image (whose copies of those fields are then 0).
        pub ncalls: u32,
        pub pad: u32,
        pub calls: [ExecCall; EXEC_ARG_CTXS],
    }
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

    /// `exec.cu` and the headers of its own that it includes (its protocols, memory access).
    const EXEC_CU: &str = concat!(
        include_str!("device/exec.cu"),
        include_str!("device/memory.h"),
        include_str!("device/symmetric.h"),
        include_str!("device/proto_simple.h"),
        include_str!("device/proto_ll.h"),
        include_str!("device/proto_ll128.h"),
        // The one-sided kernels' unit uses the header too (its own structs' fields).
        include_str!("device/one_sided.cu"),
    );

    /// The prefixes of the ABI's macros: only the generated header defines them.
    const ABI_PREFIXES: [&str; 5] =
        ["RUSTCCL_EXEC_", "RUSTCCL_FIFO_", "RUSTCCL_STEP_", "RUSTCCL_PROTO_", "RUSTCCL_CONN_"];

    #[test]
    fn every_entry_point_is_defined_in_the_kernel_and_chosen_by_protocols() {
        for e in ExecEntry::ALL {
            assert!(EXEC_CU.contains(&format!("RUSTCCL_ENTRY({},", e.name())), "{e:?} not defined in exec.cu");
            assert_eq!(ExecEntry::ALL[e.index()], e);
        }
        assert_eq!(ExecEntry::for_protocols(1 << PROTO_SIMPLE), ExecEntry::Simple);
        assert_eq!(ExecEntry::for_protocols(1 << PROTO_LL), ExecEntry::Ll);
        assert_eq!(ExecEntry::for_protocols(1 << PROTO_LL128), ExecEntry::Ll128);
        assert_eq!(ExecEntry::for_protocols((1 << PROTO_LL) | (1 << PROTO_SIMPLE)), ExecEntry::Mixed);
        assert_eq!(ExecEntry::for_protocols(0), ExecEntry::Mixed);
    }

    #[test]
    fn layouts_are_the_ones_the_kernel_was_written_for() {
        assert_eq!(std::mem::size_of::<ExecStep>(), 32);
        assert_eq!(std::mem::size_of::<ExecItem>(), 8);
        assert_eq!(std::mem::size_of::<ExecCtx>(), 56);
        assert_eq!(std::mem::size_of::<ExecConn>(), 64);
        assert_eq!(std::mem::size_of::<ExecControl>(), 32);
        assert_eq!(std::mem::size_of::<ExecCall>(), 40);
        assert_eq!(std::mem::size_of::<ExecArgs>(), 56 + 40 * EXEC_ARG_CTXS);
        // The kernel parameter stays far below the driver's limit (4 KiB on every target).
        assert!(std::mem::size_of::<ExecArgs>() <= 1024);
        let names: Vec<&str> = abi_structs().iter().map(|s| s.c_name).collect();
        assert_eq!(
            names,
            [
                "RustcclExecStep",
                "RustcclExecItem",
                "RustcclExecCtx",
                "RustcclExecConn",
                "RustcclExecControl",
                "RustcclExecCall",
                "RustcclSymArgs",
                "RustcclSignalArgs",
                "RustcclWaitSignalArgs",
                "RustcclExecArgs"
            ]
        );
        assert_eq!(std::mem::size_of::<SymArgs>(), 80);
        assert_eq!(std::mem::size_of::<SignalArgs>(), 16);
        assert_eq!(std::mem::size_of::<WaitSignalArgs>(), 32 + 8 * SIGNAL_WAIT_MAX);
        // The signals fit between the inboxes and the copy-engine flags.
        const { assert!(SYM_RES_INBOX + 4 * SYM_MAX_BLOCKS as u64 * 4095 <= SYM_RES_SIGNALS) };
        const { assert!(SYM_RES_SIGNALS_SEEN + 8 * 16384 <= SYM_RES_CE) };
        // No padding bytes: `as_bytes` relies on it.
        for s in abi_structs() {
            assert_eq!(s.fields.iter().map(|f| f.size).sum::<usize>(), s.size, "{}", s.c_name);
        }
    }

    #[test]
    fn exec_cu_defines_no_abi_of_its_own() {
        assert!(EXEC_CU.contains(&format!("#include \"{ABI_HEADER}\"")));
        for line in EXEC_CU.lines() {
            let line = line.trim_start();
            if let Some(def) = line.strip_prefix('#').map(str::trim_start).and_then(|l| l.strip_prefix("define")) {
                let name = def.trim_start();
                assert!(!ABI_PREFIXES.iter().any(|p| name.starts_with(p)), "exec.cu defines ABI macro: {line}");
            }
            assert!(
                !line.starts_with("typedef unsigned long long u64"),
                "exec.cu defines the header's typedef: {line}"
            );
            assert!(!line.starts_with("typedef unsigned int u32"), "exec.cu defines the header's typedef: {line}");
        }
        let compact: String = EXEC_CU.split_whitespace().collect::<Vec<_>>().join(" ");
        for s in abi_structs() {
            for def in [format!("struct {} {{", s.c_name), format!("struct {}{{", s.c_name)] {
                assert!(!compact.contains(&def), "exec.cu defines {}", s.c_name);
            }
        }
    }

    /// Every ABI macro exec.cu uses is one the header defines (or a -D option of
    /// `exec_defines`), and every field of the shared structs is used under its name: a
    /// constant or a field renamed, added or dropped on the Rust side fails here as well as
    /// under NVRTC.
    #[test]
    fn exec_cu_uses_the_header_names() {
        let header = abi_header();
        let options = exec_defines(crate::DeviceOp::Sum, 0).unwrap();
        let mut used = 0;
        for (i, _) in EXEC_CU.match_indices("RUSTCCL_") {
            let name: String = EXEC_CU[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !ABI_PREFIXES.iter().any(|p| name.starts_with(p)) {
                continue;
            }
            used += 1;
            let defined = header.contains(&format!("#define {name} "))
                || options.iter().any(|o| o.starts_with(&format!("-D{name}=")));
            assert!(defined, "exec.cu uses {name}, which neither the generated header nor the -D options define");
        }
        assert!(used > 50, "{used}");
        for s in abi_structs() {
            for f in s.fields.iter().filter(|f| f.name != "pad") {
                let name = f.name;
                let is_use = |(i, _): (usize, &str)| {
                    let rest = &EXEC_CU[i + name.len()..];
                    let before = &EXEC_CU[..i];
                    (before.ends_with('.') || before.ends_with("->"))
                        && !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                };
                assert!(EXEC_CU.match_indices(name).any(is_use), "exec.cu never uses {}::{name}", s.c_name);
            }
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

//! The two ways of running the operations, behind one trait: [`rust::RustDriver`] (rustccl's
//! Rust API in this process, any backend) and [`cabi::CDriver`] (any libnccl-compatible
//! library through its C ABI, dlopened).

pub mod cabi;
pub mod rust;

use rustccl::types::DataType;

use crate::ops::{Coll, Redop, VCounts};

pub type Result<T> = std::result::Result<T, String>;

/// One operation call of one rank. Addresses are the driver's (device addresses, or host
/// addresses with host memory); counts are in elements, as the operation's API takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub coll: Coll,
    pub send: u64,
    pub recv: u64,
    /// The count argument ([`crate::ops::Layout::param_count`]).
    pub count: usize,
    pub dtype: DataType,
    /// The operator (Sum for the operations without one).
    pub redop: Redop,
    /// This rank's PreMulSum scalar.
    pub scalar: f64,
    pub root: i32,
    pub rank: usize,
    pub nranks: usize,
    /// AlltoAllv's counts and displacements.
    pub vcounts: Option<VCounts>,
}

/// A CUDA graph captured on a driver's stream and instantiated (`-G`): the raw `cudaGraph_t`
/// and `cudaGraphExec_t`. Opaque; not `Clone`, so that [`Driver::graph_destroy`] (which
/// takes it) destroys it once.
#[derive(Debug, PartialEq, Eq)]
pub struct GraphHandle {
    pub graph: u64,
    pub exec: u64,
}

/// The error of a driver that cannot capture CUDA graphs; `why` says what to change.
pub fn no_graphs(why: &str) -> String {
    format!("CUDA graphs (-G/--cudagraph) need a CUDA device and a CUDA stream: {why}")
}

/// The error of a driver that refuses `-R mode`; `why` says why (and what to change).
pub fn no_register(mode: u32, driver: &str, why: &str) -> String {
    format!(
        "-R {mode} ({}) is not available with {driver}: {why}",
        crate::opts::register_text(mode)
    )
}

/// A way of running operations (one rank per process).
pub trait Driver {
    /// One line saying what runs (library, backend), for the header.
    fn describe(&self) -> String;
    /// This rank's device, for the `# Using devices` list: `(device index, description)`.
    fn device(&self) -> (usize, String);
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;

    /// Device memory (host memory for host-memory drivers) of `bytes` bytes (at least 1).
    fn alloc(&mut self, bytes: usize) -> Result<u64>;
    /// Frees memory from [`alloc`](Driver::alloc) or
    /// [`alloc_registered`](Driver::alloc_registered) (deregistering it first).
    fn free(&mut self, ptr: u64) -> Result<()>;
    /// `-R` ([`crate::opts::Options::local_register`]): `bytes` bytes (at least 1) registered
    /// with the communicator. `mode` [`REGISTER_LOCAL`](crate::opts::REGISTER_LOCAL): plain
    /// memory and `ncclCommRegister`; [`REGISTER_SYMMETRIC`](crate::opts::REGISTER_SYMMETRIC):
    /// `ncclMemAlloc` memory registered as a symmetric window, collectively (every rank makes
    /// the same calls in the same order). [`free`](Driver::free) deregisters it first, and so
    /// does [`finish`](Driver::finish). Mode 0 is [`alloc`](Driver::alloc). Drivers that cannot
    /// register refuse with [`no_register`].
    fn alloc_registered(&mut self, bytes: usize, mode: u32) -> Result<u64> {
        if mode == crate::opts::REGISTER_NONE {
            return self.alloc(bytes);
        }
        let _ = bytes;
        Err(no_register(mode, &self.describe(), "it has no buffer registration"))
    }
    fn upload(&mut self, dst: u64, src: &[u8]) -> Result<()>;
    fn download(&mut self, dst: &mut [u8], src: u64) -> Result<()>;
    fn memset(&mut self, dst: u64, byte: u8, bytes: usize) -> Result<()>;

    /// Enqueues `call` `agg` times (in one group when `agg > 1`).
    fn launch(&mut self, call: &Call, agg: usize) -> Result<()>;
    /// Waits until everything enqueued has completed.
    fn sync(&mut self) -> Result<()>;

    /// Blocks until every rank is here.
    fn barrier(&mut self) -> Result<()>;
    /// Every rank's `mine` (all the same length), in rank order.
    fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Starts capturing what [`launch`](Driver::launch) enqueues on the driver's stream into a
    /// CUDA graph (`-G`). Drivers without CUDA streams refuse with [`no_graphs`].
    fn graph_begin(&mut self) -> Result<()> {
        Err(no_graphs(&format!("{} has none", self.describe())))
    }
    /// Ends the capture and instantiates the graph.
    fn graph_end(&mut self) -> Result<GraphHandle> {
        Err(no_graphs(&format!("{} has none", self.describe())))
    }
    /// Enqueues one replay of the graph on the driver's stream ([`sync`](Driver::sync)
    /// waits for it).
    fn graph_launch(&mut self, _g: &GraphHandle) -> Result<()> {
        Err(no_graphs(&format!("{} has none", self.describe())))
    }
    /// Destroys the graph and its instance.
    fn graph_destroy(&mut self, _g: GraphHandle) -> Result<()> {
        Err(no_graphs(&format!("{} has none", self.describe())))
    }

    /// Frees what the driver holds and destroys the communicator.
    fn finish(&mut self) -> Result<()>;
}

/// The bytes of `v` as element type `t` (a PreMulSum scalar handed over by pointer).
pub fn scalar_bytes(t: DataType, v: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    crate::data::encode(t, v, &mut b);
    b
}

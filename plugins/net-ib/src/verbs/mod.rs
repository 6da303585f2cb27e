//! rustccl's own thin binding of libibverbs (rdma-core), loaded at run time.
//!
//! * [`lib`]: dlopen of `libibverbs.so.1` (or `NCCL_IBVERBS_LIB`) and the exported
//!   functions, looked up by symbol version;
//! * [`types`]: the `#[repr(C)]` structures of verbs.h that the plugin touches (their
//!   offsets are checked against the C header by `tests/struct_offsets.rs`);
//! * [`inline`]: the verbs that verbs.h inlines (`ibv_post_send`, `ibv_post_recv`,
//!   `ibv_poll_cq`), called through the context's ops table as the header does;
//! * [`owned`]: owned handles (device list, context, PD, MR, CQ, QP, async event) that free
//!   their object on drop and return [`rustccl_plugin_api::PluginError`]s.
//!
//! Why not the `ibverbs` crate: it offers no RDMA write, write-with-immediate or read, it
//! cannot register memory it did not allocate, and its build compiles rdma-core from source
//! (cmake, libnl, clang, bindgen). The transport needs all three verbs and registers the
//! caller's buffers; a binding loaded at run time also needs nothing to build, lets a
//! userspace stand-in be chosen by path, and lets a machine without RDMA load the plugin and
//! report "no device" instead of failing to start.

pub mod inline;
pub mod lib;
pub mod owned;
pub mod types;

pub use lib::Verbs;
pub use owned::{AsyncEvent, Context, Cq, Device, DeviceList, Mr, Pd, Qp};

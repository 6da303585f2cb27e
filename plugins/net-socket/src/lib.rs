//! rustccl's TCP socket network transport: the net plugin "Socket".
//!
//! [`SocketNet`] implements [`rustccl_plugin_api::net::Net`] over TCP with `socket2`. The
//! host can use it directly as a built-in plugin ([`instance`]); the crate's `cdylib`
//! (`librustccl_net_socket.so`) exports the same plugin as `rustccl_net_v3` (which takes the
//! host's encryption key at init), `_v2` and `_v1`.
//!
//! * **Devices** ([`device`]): one per usable network interface, chosen with the bootstrap's
//!   rules (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`), loopback as the last resort.
//! * **Connections** ([`connect`]): `listen` binds a TCP listener on the device's address;
//!   the handle carries that address and a random magic. A connection is one control socket
//!   plus `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD` data sockets, set up without
//!   blocking: `connect` and `accept` return "not yet" until every socket is there.
//! * **Data** ([`comm`], [`worker`]): each message is announced by a header on the control
//!   socket (size, tag) and its bytes are striped over the data sockets ([`striping`]), moved
//!   by helper threads with non-blocking I/O, so `isend`, `irecv` and `test` never block.
//! * **Wire formats** ([`wire`]) and **handle tables** ([`registry`]).
//!
//! Host memory only (`PTR_HOST`); one buffer per receive (`max_recvs` = 1).

pub mod comm;
pub mod connect;
pub mod device;
pub mod plugin;
pub use rustccl_plugin_api::registry;
pub mod sealing;
pub mod striping;
pub mod wire;
pub mod worker;

pub use plugin::{instance, silent_log, SocketNet, SocketSettings};
pub use striping::{
    chunk_size, stripe, stripe_from, Chunk, Progress, Reassembly, ReassemblyError, SocketConfig,
    StripeError, DEFAULT_MIN_CHUNK, MAX_SOCKETS, MAX_THREADS,
};

// v3 for today's hosts (the encryption key at init), v2 for hosts that predate v3
// (make_vdevice: the trait's "not supported", sockets are not fused), v1 for hosts that
// predate v2. Each export builds its instance on first use, so a process has one.
rustccl_plugin_api::export_net!(v3, "Socket", SocketNet, SocketNet::new());
rustccl_plugin_api::export_net!(v2, "Socket", SocketNet, SocketNet::new());
rustccl_plugin_api::export_net!(v1, "Socket", SocketNet, SocketNet::new());

//! A communicator's engine: what runs its work, kept from call to call — the connections to
//! its peers and the proxy thread of the network ones, the device executor's state (program
//! images, the control block, the event of the last launch) with the observer's channels of
//! launched work, the planned route's memo ([`super::memo`]), and the description of its
//! executor ([`Executor`], made once from the backend's capabilities). The communicator
//! holds one (`comm` sits above `exec`) and hands it to coll, which runs work through it and
//! asks its executor where and how work runs; the engine knows nothing of either.
//!
//! Two locks, as before the engine existed: one for the connections and the memo (a memo's
//! entries name connections and go with them), one for the device executor's state (held
//! while a launch is enqueued and while the watchdog looks at the last launch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::executor::Executor;
use super::gpu::ExecState;
use super::memo::{Entry, Lookup, Memo, MemoKey};
use super::Links;
use crate::backend::DeviceBackend;
use crate::error::Result;
use crate::program::Link;
use crate::transport::proxy::Proxy;
use crate::transport::{Connection, Dir};

/// The connections made so far (on first use, kept until suspend or destroy), the proxy of the
/// network ones, and the memo whose entries use them.
#[derive(Default)]
pub(crate) struct Connections {
    pub conns: HashMap<(Link, Dir), Arc<Connection>>,
    pub proxy: Option<Proxy>,
    pub memo: Memo,
}

/// What the device executor keeps across operations (device backends).
#[derive(Default)]
pub(crate) struct DeviceExec {
    pub exec: ExecState,
    /// The observer's channels of launched work, completed when the watchdog sees the
    /// launches done (dropped, not completed, if the work fails).
    pub profiled: Vec<crate::observe::Channels>,
}

/// One communicator's engine (see the module's documentation).
pub(crate) struct Engine {
    backend: Arc<dyn DeviceBackend>,
    device: usize,
    executor: Executor,
    connections: Mutex<Connections>,
    device_exec: Mutex<DeviceExec>,
    /// Called once, when the first device work is handed to the executor: the communicator
    /// starts its watchdog there (the thread that sees launches complete or fail).
    on_first_device_work: Box<dyn Fn() + Send + Sync>,
}

impl Engine {
    /// The engine of a communicator on `device` of `backend`.
    pub(crate) fn new(backend: Arc<dyn DeviceBackend>, device: usize, on_first_device_work: Box<dyn Fn() + Send + Sync>) -> Engine {
        let executor = Executor::of(backend.capabilities());
        Engine { backend, device, executor, connections: Default::default(), device_exec: Default::default(), on_first_device_work }
    }

    /// What runs this communicator's work (made once, from the backend's capabilities): coll
    /// asks it where and how work runs.
    pub(crate) fn executor(&self) -> Executor {
        self.executor
    }

    /// The connections, the proxy and the memo, locked.
    pub(crate) fn connections(&self) -> MutexGuard<'_, Connections> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device executor's state, locked.
    pub(crate) fn device(&self) -> MutexGuard<'_, DeviceExec> {
        self.device_exec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with the backend, the device and the device executor's state: the way to the
    /// GPU executor's entry points (`gpu::launch`, `CachedLaunch::launch`, `run_symmetric`,
    /// `run_copy_engine`). The first call starts the communicator's watchdog.
    pub(crate) fn with_device<T>(&self, f: impl FnOnce(&Arc<dyn DeviceBackend>, usize, &mut ExecState) -> Result<T>) -> Result<T> {
        let mut d = self.device();
        if !d.exec.watching {
            d.exec.watching = true;
            (self.on_first_device_work)();
        }
        f(&self.backend, self.device, &mut d.exec)
    }

    /// Keeps the observer's channels of device work just launched until it completes.
    pub(crate) fn profiled_launch(&self, channels: crate::observe::Channels) {
        if !channels.is_empty() {
            self.device().profiled.push(channels);
        }
    }

    /// The connections of `wanted` already made, and those still to make.
    pub(crate) fn cached_connections(&self, wanted: &[(Link, Dir)]) -> (Links, Vec<(Link, Dir)>) {
        let t = self.connections();
        let mut have = HashMap::new();
        let mut missing = Vec::new();
        for key in wanted {
            match t.conns.get(key) {
                Some(c) => {
                    have.insert(*key, Arc::clone(c));
                }
                None => missing.push(*key),
            }
        }
        (have, missing)
    }

    /// Keeps a connection just made.
    pub(crate) fn keep_connection(&self, link: Link, dir: Dir, conn: Arc<Connection>) {
        self.connections().conns.insert((link, dir), conn);
    }

    /// Takes the memo's entry of `key` out while it runs (see [`Memo::take`]).
    pub(crate) fn take_plan(&self, key: &MemoKey) -> Lookup {
        self.connections().memo.take(key)
    }

    /// Puts an entry (back) into the memo it was taken from, if that is still this one's.
    pub(crate) fn keep_plan(&self, entry: Entry, epoch: u64) {
        self.connections().memo.put(entry, epoch);
    }

    /// The memo serves nothing from now on (a tuner is asked on every call).
    pub(crate) fn bypass_plans(&self) {
        self.connections().memo.set_bypass();
    }
}

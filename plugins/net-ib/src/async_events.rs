//! The async-event thread (NCCL's `ibAsyncThread`): one thread per opened device context
//! reads the device's asynchronous events (`ibv_get_async_event`) and turns the fatal ones
//! into connection errors:
//!
//! * `IBV_EVENT_DEVICE_FATAL` fails every connection on the device;
//! * `IBV_EVENT_PORT_ERR` every connection on that port;
//! * `IBV_EVENT_QP_FATAL`, `_QP_REQ_ERR`, `_QP_ACCESS_ERR` and `IBV_EVENT_CQ_ERR` the connection
//!   that owns the QP or CQ the event names;
//! * any other event is logged (INFO, or WARN for the error kinds) and acknowledged.
//!
//! A failed connection reports the event from then on (every `isend`/`irecv`/`test`), naming
//! the device, the port and the event, and shuts its out-of-band socket so that its peer fails
//! too instead of waiting for data that will not come. A fatal device or port stays failed for
//! connections made later (a port that reports `IBV_EVENT_PORT_ACTIVE` again takes new ones).
//!
//! Each event is acknowledged after the connections it names have been failed, as verbs
//! wants (an object's destroy waits for the acks of its events), so the failure is recorded
//! before the device's flushed completions can be mistaken for the cause.
//!
//! **Lifetime.** The thread waits in `poll` on the context's `async_fd` (half a second at a
//! time) and ends once the plugin instance that started it is gone; it holds the device
//! context open until then, and a plugin's devices are never closed before (NCCL never closes
//! its own either). Starting it pins the plugin library in memory (`RTLD_NODELETE`), so a host
//! that unloads the plugin cannot pull the thread's code from under it. It neither keeps the
//! process alive (it is not joined) nor runs anything at exit.
//!
//! Not seen: events that arrive between a connection's QPs being created and the connection
//! being watched (during `connect`/`accept`); a fatal device or port is still seen then, as
//! it is remembered.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use rustccl_plugin_api::{subsys, LogFn, PluginError};

use crate::comm::Comm;
use crate::device::IbDevice;
use crate::verbs::types::*;
use crate::verbs::{AsyncEvent, Context};

/// How long the thread sleeps in `poll` before it checks that the plugin is still there.
const POLL_MS: i32 = 500;

/// `enum ibv_event_type`: names and what each means, for messages.
const EVENTS: [(&str, &str); 20] = [
    ("IBV_EVENT_CQ_ERR", "completion queue error (overrun)"),
    ("IBV_EVENT_QP_FATAL", "fatal queue pair error"),
    ("IBV_EVENT_QP_REQ_ERR", "invalid request on a queue pair"),
    (
        "IBV_EVENT_QP_ACCESS_ERR",
        "access violation on a queue pair",
    ),
    ("IBV_EVENT_COMM_EST", "communication established"),
    ("IBV_EVENT_SQ_DRAINED", "send queue drained"),
    ("IBV_EVENT_PATH_MIG", "path migrated"),
    ("IBV_EVENT_PATH_MIG_ERR", "path migration failed"),
    ("IBV_EVENT_DEVICE_FATAL", "fatal device error"),
    ("IBV_EVENT_PORT_ACTIVE", "port active"),
    ("IBV_EVENT_PORT_ERR", "port error: the link went down"),
    ("IBV_EVENT_LID_CHANGE", "LID changed"),
    ("IBV_EVENT_PKEY_CHANGE", "P_Key table changed"),
    ("IBV_EVENT_SM_CHANGE", "subnet manager changed"),
    ("IBV_EVENT_SRQ_ERR", "shared receive queue error"),
    (
        "IBV_EVENT_SRQ_LIMIT_REACHED",
        "shared receive queue limit reached",
    ),
    ("IBV_EVENT_QP_LAST_WQE_REACHED", "last work request reached"),
    ("IBV_EVENT_CLIENT_REREGISTER", "client re-register request"),
    ("IBV_EVENT_GID_CHANGE", "GID table changed"),
    ("IBV_EVENT_WQ_FATAL", "fatal work queue error"),
];

/// The event's name and meaning, e.g. `("IBV_EVENT_PORT_ERR", "port error: ...")`.
pub fn describe(event_type: u32) -> (&'static str, &'static str) {
    EVENTS
        .get(event_type as usize)
        .copied()
        .unwrap_or(("unknown async event", "not in libibverbs 1.14's list"))
}

/// What an event does to the connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Fail every connection on the device.
    FailDevice,
    /// Fail every connection on this port.
    FailPort(u8),
    /// Fail the connection owning this QP (its address).
    FailQp(usize),
    /// Fail the connection owning this CQ (its address).
    FailCq(usize),
    /// Log at INFO.
    Info,
    /// Log at WARN.
    Warn,
}

/// What `event` calls for.
pub fn action(event: &ibv_async_event) -> Action {
    // Verbs sets the member of `element` that the event's type names (`ibv_get_async_event(3)`):
    // `qp` for QP events, `cq` for CQ_ERR, `port_num` for port events.
    match event.event_type {
        IBV_EVENT_DEVICE_FATAL => Action::FailDevice,
        IBV_EVENT_PORT_ERR => {
            // SAFETY: a port event: `port_num` is the member set (a plain integer).
            let port = unsafe { event.element.port_num };
            u8::try_from(port).map_or(Action::Warn, Action::FailPort)
        }
        IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
            // SAFETY: a QP event: `qp` is the member set; the address is only compared.
            Action::FailQp(unsafe { event.element.qp } as usize)
        }
        // SAFETY: a CQ event: `cq` is the member set; the address is only compared.
        IBV_EVENT_CQ_ERR => Action::FailCq(unsafe { event.element.cq } as usize),
        // Path migration failed, SRQ / WQ errors (this transport has neither), a changed GID
        // table (a RoCE address went or moved), and anything unknown: worth a warning.
        7 | 14 | 18 | 19 => Action::Warn,
        t if t as usize >= EVENTS.len() => Action::Warn,
        _ => Action::Info,
    }
}

/// The verbs objects of one watched connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Objects {
    /// The device context (its address).
    pub ctx: usize,
    pub port: u8,
    /// The QPs: address and number.
    pub qps: Vec<(usize, u32)>,
    /// The CQ (its address).
    pub cq: usize,
}

impl Objects {
    /// Whether `action` (on context `ctx`) concerns these objects; the QP it names if any.
    pub fn hit_by(&self, ctx: usize, action: Action) -> Option<Option<u32>> {
        if self.ctx != ctx {
            return None;
        }
        match action {
            Action::FailDevice => Some(None),
            Action::FailPort(p) => (p == self.port).then_some(None),
            Action::FailQp(qp) => self
                .qps
                .iter()
                .find(|&&(addr, _)| addr == qp)
                .map(|&(_, num)| Some(num)),
            Action::FailCq(cq) => (cq == self.cq).then_some(None),
            Action::Info | Action::Warn => None,
        }
    }
}

/// The error a connection on `device` port `port` reports after event `event_type`
/// (`qpn`: the QP it named, if one of the connection's).
pub fn connection_error(device: &str, port: u8, event_type: u32, qpn: Option<u32>) -> PluginError {
    let (name, meaning) = describe(event_type);
    let on = match qpn {
        Some(n) => format!("on its queue pair {n:#x}"),
        None if event_type == IBV_EVENT_CQ_ERR => "on its completion queue".to_string(),
        None if event_type == IBV_EVENT_PORT_ERR => format!("on {device} port {port}"),
        None => format!("on {device}"),
    };
    PluginError::system(format!(
        "NET/IB : the connection on {device} port {port} failed: the device reported {name} ({meaning}) {on}; check the NIC and its link (ibv_devinfo)"
    ))
}

struct Watched {
    objects: Objects,
    device: String,
    comm: Weak<Comm>,
}

#[derive(Default)]
struct State {
    watched: Vec<Watched>,
    /// Contexts that reported DEVICE_FATAL: connections made later fail at once.
    fatal_devices: HashSet<usize>,
    /// Ports (context, port) down since a PORT_ERR.
    ports_down: HashSet<(usize, u8)>,
}

/// The connections the async-event threads may fail, shared by the threads and the plugin.
#[derive(Default)]
pub struct AsyncEvents {
    state: Mutex<State>,
}

impl AsyncEvents {
    /// Starts one thread per distinct device context of `devices` (ports of one device share
    /// it). A thread that cannot start is a warning: fatal events of that device then go
    /// unseen, and connections still fail on their error completions.
    pub fn start(devices: &[IbDevice], log: LogFn) -> Arc<AsyncEvents> {
        let events = Arc::new(AsyncEvents::default());
        let mut started = HashSet::new();
        for d in devices {
            if !started.insert(d.context.as_ptr() as usize) {
                continue;
            }
            if started.len() == 1 {
                pin_this_library(&log);
            }
            let ctx = Arc::clone(&d.context);
            let weak = Arc::downgrade(&events);
            let spawned = std::thread::Builder::new()
                .name("rustccl-ib-async".into())
                .spawn(move || read_events(&ctx, &weak, log));
            if let Err(e) = spawned {
                log.warn(
                    subsys::INIT | subsys::NET,
                    &format!(
                        "NET/IB : no async-event thread for {} ({e}): its fatal device and port events will not be seen",
                        d.name
                    ),
                );
            }
        }
        events
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `comm`'s objects on its physical device `member`, `dev`, from now on (a
    /// connection on a merged device is watched once per member). A connection on a device
    /// or port that already failed fails at once.
    pub fn watch(&self, comm: &Arc<Comm>, dev: &IbDevice, member: usize) {
        let (qps, cq) = comm.verbs_objects(member);
        let objects = Objects {
            ctx: dev.context.as_ptr() as usize,
            port: dev.port,
            qps,
            cq,
        };
        let early = {
            let mut st = self.lock();
            st.watched.retain(|w| w.comm.strong_count() > 0);
            let early = if st.fatal_devices.contains(&objects.ctx) {
                Some(IBV_EVENT_DEVICE_FATAL)
            } else if st.ports_down.contains(&(objects.ctx, objects.port)) {
                Some(IBV_EVENT_PORT_ERR)
            } else {
                None
            };
            st.watched.push(Watched {
                objects,
                device: dev.name.clone(),
                comm: Arc::downgrade(comm),
            });
            early
        };
        if let Some(event_type) = early {
            let e = connection_error(&dev.name, dev.port, event_type, None);
            Comm::fail_together(&[(Arc::clone(comm), e)]);
        }
    }

    /// Handles one event of context `ctx`: fails the connections it names, logs it, then
    /// acknowledges it (by dropping it).
    fn handle(&self, ctx: &Context, event: AsyncEvent<'_>, log: &LogFn) {
        let event_type = event.event.event_type;
        let (name, meaning) = describe(event_type);
        let action = action(&event.event);
        let key = ctx.as_ptr() as usize;
        let targets: Vec<(Arc<Comm>, PluginError)> = {
            let mut st = self.lock();
            match action {
                Action::FailDevice => {
                    st.fatal_devices.insert(key);
                }
                Action::FailPort(p) => {
                    st.ports_down.insert((key, p));
                }
                _ if event_type == IBV_EVENT_PORT_ACTIVE => {
                    // SAFETY: a port event: `port_num` is the member set.
                    let port = unsafe { event.event.element.port_num };
                    if let Ok(p) = u8::try_from(port) {
                        st.ports_down.remove(&(key, p));
                    }
                }
                _ => {}
            }
            st.watched.retain(|w| w.comm.strong_count() > 0);
            let mut targets: Vec<(Arc<Comm>, PluginError)> = st
                .watched
                .iter()
                .filter_map(|w| {
                    let qpn = w.objects.hit_by(key, action)?;
                    let comm = w.comm.upgrade()?;
                    let e = connection_error(&w.device, w.objects.port, event_type, qpn);
                    Some((comm, e))
                })
                .collect();
            // A connection on a merged device is watched once per member; several members
            // on this context name it more than once: it fails once, with its first
            // member's error.
            let mut seen = HashSet::new();
            targets.retain(|(c, _)| seen.insert(Arc::as_ptr(c) as usize));
            targets
        };
        let text = format!("NET/IB : {}: async event {name} ({meaning})", ctx.name());
        match action {
            Action::Info => log.info(subsys::NET, &text),
            Action::Warn => log.warn(subsys::NET, &text),
            _ => log.warn(
                subsys::NET,
                &format!("{text}: {} connection(s) failed", targets.len()),
            ),
        }
        Comm::fail_together(&targets);
        // Acknowledged only now, and before `targets` may drop the last reference to a
        // connection (whose QP destroy would wait for this very acknowledgement).
        drop(event);
        drop(targets);
    }
}

/// The thread's body: events of `ctx` until the plugin instance (`events`) is gone or the
/// context cannot be read any more.
fn read_events(ctx: &Context, events: &Weak<AsyncEvents>, log: LogFn) {
    loop {
        let next = ctx.next_async_event(POLL_MS);
        let Some(watcher) = events.upgrade() else {
            return; // an event read here is acknowledged as it drops
        };
        match next {
            Ok(Some(event)) => watcher.handle(ctx, event, &log),
            Ok(None) => {}
            Err(e) => {
                log.warn(
                    subsys::NET,
                    &format!(
                        "NET/IB : async events of {} can no longer be read ({e}); its fatal device and port events will not be seen",
                        ctx.name()
                    ),
                );
                return;
            }
        }
    }
}

/// Keeps the library holding this code mapped for the rest of the process (`RTLD_NODELETE`
/// on the already loaded object), so that a host unloading the plugin leaves the thread's
/// code in place. Code linked into the program itself needs nothing.
fn pin_this_library(log: &LogFn) {
    // SAFETY: all-zero is a valid Dl_info; dladdr fills it for an address of this code.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = pin_this_library as *const libc::c_void;
    // SAFETY: `here` is an address in this object; `info` is written by dladdr.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        log.warn(
            subsys::INIT | subsys::NET,
            "NET/IB : cannot find the plugin library (dladdr failed); do not unload it while its async-event threads run",
        );
        return;
    }
    // SAFETY: dli_fname names the loaded object; RTLD_NOLOAD only flags it (nothing is
    // loaded), and the handle is deliberately never closed.
    let pinned = !unsafe {
        libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    }
    .is_null();
    // SAFETY: dladdr's file name is a NUL-terminated string of the loaded object.
    let file = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let in_program = std::fs::canonicalize(&*file).ok() == std::env::current_exe().ok();
    if !pinned && !in_program {
        log.warn(
            subsys::INIT | subsys::NET,
            &format!(
                "NET/IB : cannot pin {file} in memory (dlopen with RTLD_NODELETE failed); do not unload it while its async-event threads run"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: u32, element: ibv_async_event_element) -> ibv_async_event {
        ibv_async_event {
            element,
            event_type,
        }
    }

    #[test]
    fn fatal_events_fail_connections_others_are_logged() {
        let port = |p| ibv_async_event_element { port_num: p };
        let qp = ibv_async_event_element {
            qp: 0x1000 as *mut ibv_qp,
        };
        let cq = ibv_async_event_element {
            cq: 0x2000 as *mut ibv_cq,
        };
        assert_eq!(
            action(&event(IBV_EVENT_DEVICE_FATAL, port(0))),
            Action::FailDevice
        );
        assert_eq!(
            action(&event(IBV_EVENT_PORT_ERR, port(2))),
            Action::FailPort(2)
        );
        assert_eq!(action(&event(IBV_EVENT_PORT_ERR, port(-1))), Action::Warn);
        for t in [
            IBV_EVENT_QP_FATAL,
            IBV_EVENT_QP_REQ_ERR,
            IBV_EVENT_QP_ACCESS_ERR,
        ] {
            assert_eq!(action(&event(t, qp)), Action::FailQp(0x1000));
        }
        assert_eq!(action(&event(IBV_EVENT_CQ_ERR, cq)), Action::FailCq(0x2000));
        assert_eq!(action(&event(IBV_EVENT_PORT_ACTIVE, port(1))), Action::Info);
        assert_eq!(action(&event(4, qp)), Action::Info, "COMM_EST");
        assert_eq!(action(&event(18, port(1))), Action::Warn, "GID_CHANGE");
        assert_eq!(action(&event(99, port(1))), Action::Warn, "unknown");
        assert_eq!(describe(10).0, "IBV_EVENT_PORT_ERR");
        assert_eq!(describe(8).0, "IBV_EVENT_DEVICE_FATAL");
        assert_eq!(describe(19).0, "IBV_EVENT_WQ_FATAL");
        assert_eq!(describe(20).0, "unknown async event");
    }

    #[test]
    fn events_hit_the_right_connections() {
        let conn = Objects {
            ctx: 1,
            port: 1,
            qps: vec![(0x100, 0x10002), (0x200, 0x10003)],
            cq: 0x300,
        };
        assert_eq!(conn.hit_by(1, Action::FailDevice), Some(None));
        assert_eq!(conn.hit_by(2, Action::FailDevice), None, "another device");
        assert_eq!(conn.hit_by(1, Action::FailPort(1)), Some(None));
        assert_eq!(conn.hit_by(1, Action::FailPort(2)), None, "another port");
        assert_eq!(conn.hit_by(1, Action::FailQp(0x200)), Some(Some(0x10003)));
        assert_eq!(conn.hit_by(1, Action::FailQp(0x400)), None, "another QP");
        assert_eq!(conn.hit_by(1, Action::FailCq(0x300)), Some(None));
        assert_eq!(conn.hit_by(1, Action::FailCq(0x100)), None);
        assert_eq!(conn.hit_by(1, Action::Info), None);
        assert_eq!(conn.hit_by(1, Action::Warn), None);
    }

    #[test]
    fn errors_name_device_port_and_event() {
        let e = connection_error("mlx5_0", 1, IBV_EVENT_PORT_ERR, None);
        assert_eq!(e.code, PluginError::SYSTEM);
        assert_eq!(
            e.message,
            "NET/IB : the connection on mlx5_0 port 1 failed: the device reported IBV_EVENT_PORT_ERR (port error: the link went down) on mlx5_0 port 1; check the NIC and its link (ibv_devinfo)"
        );
        let e = connection_error("mlx5_0", 2, IBV_EVENT_QP_FATAL, Some(0x1234));
        assert!(
            e.message.contains("port 2 failed")
                && e.message.contains(
                    "IBV_EVENT_QP_FATAL (fatal queue pair error) on its queue pair 0x1234;"
                ),
            "{e}"
        );
        let e = connection_error("mlx5_0", 1, IBV_EVENT_CQ_ERR, None);
        assert!(e.message.contains("on its completion queue;"), "{e}");
        let e = connection_error("mlx5_0", 1, IBV_EVENT_DEVICE_FATAL, None);
        assert!(e.message.contains("(fatal device error) on mlx5_0;"), "{e}");
    }
}

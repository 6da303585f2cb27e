//! The event model: the kinds of events of NCCL's profiler v5 and how they nest
//! ([`EventKind`]), the id of a recorded event ([`EventId`]), and why a recorder call is
//! refused ([`TraceError`]).

use std::fmt;

use serde::Serialize;

/// The kinds of events of NCCL's profiler v5 that this recorder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum EventKind {
    /// A group of operations (between group start and end).
    Group,
    /// One collective operation.
    Coll,
    /// One point-to-point operation.
    P2p,
    /// The proxy thread's work for one operation on one channel and peer.
    ProxyOp,
    /// One step (chunk) of a proxy op.
    ProxyStep,
    /// One GPU channel's part of a kernel.
    KernelCh,
    /// The proxy thread's own activity (idle, active, sleep, ...); has no parent.
    ProxyCtrl,
    /// An event defined by the net plugin (e.g. one network request).
    Net,
    /// The application's outermost group call.
    GroupApi,
    /// One collective API call.
    CollApi,
    /// One send / receive API call.
    P2pApi,
    /// One launch of device work.
    KernelLaunch,
}

impl EventKind {
    /// Every kind, outermost first.
    pub const ALL: [EventKind; 12] = [
        EventKind::GroupApi,
        EventKind::CollApi,
        EventKind::P2pApi,
        EventKind::KernelLaunch,
        EventKind::Group,
        EventKind::Coll,
        EventKind::P2p,
        EventKind::ProxyOp,
        EventKind::ProxyStep,
        EventKind::ProxyCtrl,
        EventKind::KernelCh,
        EventKind::Net,
    ];

    /// The kind of a single NCCL event-type bit (see [`EventKind::mask_bit`]).
    pub fn from_mask_bit(bit: u64) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.mask_bit() == bit)
    }

    /// The bit of NCCL's profiler event-activation mask for this kind
    /// (`ncclProfileGroup` = 1<<0 … `ncclProfileKernelLaunch` = 1<<11).
    pub fn mask_bit(self) -> u64 {
        match self {
            EventKind::Group => 1 << 0,
            EventKind::Coll => 1 << 1,
            EventKind::P2p => 1 << 2,
            EventKind::ProxyOp => 1 << 3,
            EventKind::ProxyStep => 1 << 4,
            EventKind::ProxyCtrl => 1 << 5,
            EventKind::KernelCh => 1 << 6,
            EventKind::Net => 1 << 7,
            EventKind::GroupApi => 1 << 8,
            EventKind::CollApi => 1 << 9,
            EventKind::P2pApi => 1 << 10,
            EventKind::KernelLaunch => 1 << 11,
        }
    }

    /// The trace category (`cat`) written for this kind.
    pub fn category(self) -> &'static str {
        match self {
            EventKind::Group => "group",
            EventKind::Coll => "coll",
            EventKind::P2p => "p2p",
            EventKind::ProxyOp => "proxy_op",
            EventKind::ProxyStep => "proxy_step",
            EventKind::ProxyCtrl => "proxy_ctrl",
            EventKind::KernelCh => "kernel_ch",
            EventKind::Net => "net",
            EventKind::GroupApi => "group_api",
            EventKind::CollApi => "coll_api",
            EventKind::P2pApi => "p2p_api",
            EventKind::KernelLaunch => "kernel_launch",
        }
    }

    /// Kinds allowed as this kind's parent.
    pub fn parent_kinds(self) -> &'static [EventKind] {
        match self {
            EventKind::Group | EventKind::ProxyCtrl | EventKind::GroupApi => &[],
            EventKind::CollApi | EventKind::P2pApi | EventKind::KernelLaunch => &[EventKind::GroupApi],
            EventKind::Coll => &[EventKind::Group, EventKind::CollApi],
            EventKind::P2p => &[EventKind::Group, EventKind::P2pApi],
            EventKind::ProxyOp | EventKind::KernelCh => &[EventKind::Coll, EventKind::P2p],
            EventKind::ProxyStep => &[EventKind::ProxyOp],
            EventKind::Net => &[EventKind::ProxyStep],
        }
    }

    /// Whether an event of this kind must have a parent (in a strict recorder). Groups and
    /// proxy-control events never have one; collectives, p2p operations and API events may
    /// stand alone.
    pub fn requires_parent(self) -> bool {
        !matches!(
            self,
            EventKind::Group
                | EventKind::ProxyCtrl
                | EventKind::Coll
                | EventKind::P2p
                | EventKind::GroupApi
                | EventKind::CollApi
                | EventKind::P2pApi
                | EventKind::KernelLaunch
        )
    }
}

/// Identifies a recorded event within its [`Recorder`](crate::Recorder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub(crate) u64);

impl EventId {
    /// The number written as `args.id` in the trace.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Why a recorder call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceError {
    /// The id was not issued by this recorder.
    UnknownEvent(EventId),
    /// The event was already stopped.
    AlreadyStopped(EventId),
    /// The parent id was not issued by this recorder.
    UnknownParent(EventId),
    /// The parent's kind cannot contain the child's kind.
    WrongParentKind {
        /// Kind of the event being started.
        child: EventKind,
        /// Kind of the given parent.
        parent: EventKind,
    },
    /// This kind needs a parent and none was given.
    MissingParent(EventKind),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::UnknownEvent(id) => write!(f, "unknown event id {}", id.0),
            TraceError::AlreadyStopped(id) => write!(f, "event {} was already stopped", id.0),
            TraceError::UnknownParent(id) => write!(f, "unknown parent event id {}", id.0),
            TraceError::WrongParentKind { child, parent } => {
                write!(
                    f,
                    "a {child:?} event cannot be a child of a {parent:?} event"
                )
            }
            TraceError::MissingParent(kind) => write!(f, "a {kind:?} event needs a parent event"),
        }
    }
}

impl std::error::Error for TraceError {}

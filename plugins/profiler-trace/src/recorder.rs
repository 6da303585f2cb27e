//! [`Recorder`]: a thread-safe recorder of profiler events. Events are started and stopped by
//! id from any thread, parents are checked against the hierarchy ([`EventKind::parent_kinds`]),
//! and state changes are kept as marks; [`crate::chrome_trace`] writes it all out.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{Map, Value};

use crate::event::{EventId, EventKind, TraceError};

/// A small, stable number for the calling thread (1, 2, … in order of first use).
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// One started event.
#[derive(Debug)]
pub(crate) struct Span {
    pub(crate) kind: EventKind,
    pub(crate) name: String,
    pub(crate) parent: Option<EventId>,
    pub(crate) tid: u64,
    pub(crate) start_us: f64,
    pub(crate) end_us: Option<f64>,
    pub(crate) args: Map<String, Value>,
}

/// One state change of an event.
#[derive(Debug)]
pub(crate) struct StateMark {
    pub(crate) event: EventId,
    pub(crate) state: String,
    pub(crate) tid: u64,
    pub(crate) ts_us: f64,
    pub(crate) args: Map<String, Value>,
}

#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) next_id: u64,
    pub(crate) spans: BTreeMap<EventId, Span>,
    pub(crate) marks: Vec<StateMark>,
}

/// A thread-safe recorder of profiler events.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    pub(crate) pid: u32,
    /// Whether kinds that [require a parent](EventKind::requires_parent) may start without.
    allow_orphans: bool,
    inner: Mutex<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty recorder; timestamps count from now.
    pub fn new() -> Self {
        Recorder {
            origin: Instant::now(),
            pid: std::process::id(),
            allow_orphans: false,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// An empty recorder that lets any event start without a parent (for when the parent's
    /// kind is not recorded); a parent, when given, is still checked.
    pub fn allowing_orphans() -> Self {
        Recorder {
            allow_orphans: true,
            ..Self::new()
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not stop profiling; the data stays consistent
        // because every update is a single insert or field write.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_us(&self) -> f64 {
        self.origin.elapsed().as_nanos() as f64 / 1000.0
    }

    /// Starts an event of `kind` named `name` under `parent`, on the calling thread.
    pub fn start(
        &self,
        kind: EventKind,
        name: impl Into<String>,
        parent: Option<EventId>,
    ) -> Result<EventId, TraceError> {
        self.start_with_args(kind, name, parent, Map::new())
    }

    /// Like [`Recorder::start`], with extra `args` shown in the trace viewer
    /// (e.g. `count`, `datatype`, `peer`). The keys `id` and `parent` are reserved.
    pub fn start_with_args(
        &self,
        kind: EventKind,
        name: impl Into<String>,
        parent: Option<EventId>,
        args: Map<String, Value>,
    ) -> Result<EventId, TraceError> {
        let tid = thread_number();
        let mut inner = self.lock();
        match parent {
            Some(pid) => {
                let parent_kind = inner
                    .spans
                    .get(&pid)
                    .ok_or(TraceError::UnknownParent(pid))?
                    .kind;
                if !kind.parent_kinds().contains(&parent_kind) {
                    return Err(TraceError::WrongParentKind {
                        child: kind,
                        parent: parent_kind,
                    });
                }
            }
            None if kind.requires_parent() && !self.allow_orphans => {
                return Err(TraceError::MissingParent(kind))
            }
            None => {}
        }
        inner.next_id += 1;
        let id = EventId(inner.next_id);
        let span = Span {
            kind,
            name: name.into(),
            parent,
            tid,
            start_us: self.now_us(),
            end_us: None,
            args,
        };
        inner.spans.insert(id, span);
        Ok(id)
    }

    /// Stops a running event.
    pub fn stop(&self, id: EventId) -> Result<(), TraceError> {
        let now = self.now_us();
        let mut inner = self.lock();
        let span = inner
            .spans
            .get_mut(&id)
            .ok_or(TraceError::UnknownEvent(id))?;
        if span.end_us.is_some() {
            return Err(TraceError::AlreadyStopped(id));
        }
        span.end_us = Some(now);
        Ok(())
    }

    /// Records that event `id` entered `state` (NCCL's `recordEventState`, e.g.
    /// a proxy step's "SendWait"), with optional extra `args`.
    pub fn record_state(
        &self,
        id: EventId,
        state: impl Into<String>,
        args: Map<String, Value>,
    ) -> Result<(), TraceError> {
        let tid = thread_number();
        let ts_us = self.now_us();
        let mut inner = self.lock();
        let span = inner.spans.get(&id).ok_or(TraceError::UnknownEvent(id))?;
        if span.end_us.is_some() {
            return Err(TraceError::AlreadyStopped(id));
        }
        inner.marks.push(StateMark {
            event: id,
            state: state.into(),
            tid,
            ts_us,
            args,
        });
        Ok(())
    }

    /// Number of events started so far.
    pub fn len(&self) -> usize {
        self.lock().spans.len()
    }

    /// Whether no event was started.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::parse;
    use serde_json::json;

    fn interval(e: &Value) -> (f64, f64) {
        let ts = e["ts"].as_f64().unwrap();
        (ts, ts + e["dur"].as_f64().unwrap())
    }

    /// Whether child interval `c` lies inside parent interval `p` (ts + dur is
    /// recomputed in floating point, so allow a rounding error far below 1 ns).
    fn inside(p: (f64, f64), c: (f64, f64)) -> bool {
        p.0 <= c.0 && c.1 <= p.1 + 1e-6
    }

    #[test]
    fn nested_events_give_matching_intervals() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        let mut args = Map::new();
        args.insert("count".into(), json!(1024));
        let coll = rec
            .start_with_args(EventKind::Coll, "AllReduce", Some(group), args)
            .unwrap();
        let kch = rec
            .start(EventKind::KernelCh, "KernelCh", Some(coll))
            .unwrap();
        let op = rec
            .start(EventKind::ProxyOp, "ProxyOp", Some(coll))
            .unwrap();
        let step = rec
            .start(EventKind::ProxyStep, "ProxyStep", Some(op))
            .unwrap();
        rec.record_state(step, "SendWait", Map::new()).unwrap();
        let net = rec.start(EventKind::Net, "isend", Some(step)).unwrap();
        for id in [net, step, op, kch, coll, group] {
            rec.stop(id).unwrap();
        }
        assert_eq!(rec.len(), 6);

        let (events, spans) = parse(&rec);
        assert_eq!(events.len(), 7);
        let pid = std::process::id() as u64;
        for e in spans.values() {
            assert_eq!(e["ph"], "X");
            assert_eq!(e["pid"].as_u64(), Some(pid));
            assert!(e["tid"].as_u64().unwrap() >= 1);
            assert!(e["dur"].as_f64().unwrap() >= 0.0);
            // Each child lies inside its parent.
            if let Some(parent) = e["args"]["parent"].as_u64() {
                assert!(
                    inside(interval(&spans[&parent]), interval(e)),
                    "{e} not inside {}",
                    spans[&parent]
                );
            }
        }
        let c = &spans[&coll.get()];
        assert_eq!(
            (c["name"].as_str(), c["cat"].as_str()),
            (Some("AllReduce"), Some("coll"))
        );
        assert_eq!(c["args"]["count"], 1024);
        assert_eq!(c["args"]["parent"].as_u64(), Some(group.get()));
        assert!(spans[&group.get()]["args"].get("parent").is_none());
        assert_eq!(
            spans[&net.get()]["args"]["parent"].as_u64(),
            Some(step.get())
        );
        let mark = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(
            (
                mark["name"].as_str(),
                mark["s"].as_str(),
                mark["cat"].as_str()
            ),
            (Some("SendWait"), Some("t"), Some("proxy_step"))
        );
        assert_eq!(mark["args"]["id"].as_u64(), Some(step.get()));
        // Sorted by time.
        let ts: Vec<f64> = events.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn running_events_are_begin_only() {
        let rec = Recorder::new();
        let p2p = rec.start(EventKind::P2p, "Send", None).unwrap();
        let op = rec.start(EventKind::ProxyOp, "ProxyOp", Some(p2p)).unwrap();
        rec.stop(op).unwrap();
        let (_, spans) = parse(&rec);
        assert_eq!(spans[&p2p.get()]["ph"], "B");
        assert!(spans[&p2p.get()].get("dur").is_none());
        assert_eq!(spans[&op.get()]["ph"], "X");
        rec.stop(p2p).unwrap();
        assert_eq!(parse(&rec).1[&p2p.get()]["ph"], "X");
    }

    #[test]
    fn hierarchy_and_misuse_are_rejected() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        assert_eq!(
            rec.start(EventKind::ProxyStep, "s", Some(group)),
            Err(TraceError::WrongParentKind {
                child: EventKind::ProxyStep,
                parent: EventKind::Group
            })
        );
        assert_eq!(
            rec.start(EventKind::Net, "n", None),
            Err(TraceError::MissingParent(EventKind::Net))
        );
        assert_eq!(
            rec.start(EventKind::Coll, "c", Some(EventId(99))),
            Err(TraceError::UnknownParent(EventId(99)))
        );
        assert!(rec.start(EventKind::Coll, "standalone", None).is_ok());
        assert_eq!(
            rec.stop(EventId(42)),
            Err(TraceError::UnknownEvent(EventId(42)))
        );
        rec.stop(group).unwrap();
        assert_eq!(rec.stop(group), Err(TraceError::AlreadyStopped(group)));
        assert_eq!(
            rec.record_state(group, "x", Map::new()),
            Err(TraceError::AlreadyStopped(group))
        );
        assert_eq!(rec.len(), 2);
        for kind in EventKind::ALL {
            for parent in kind.parent_kinds() {
                assert!(
                    EventKind::ALL.iter().position(|k| k == parent)
                        < EventKind::ALL.iter().position(|k| *k == kind)
                );
            }
        }
        let bits: u64 = EventKind::ALL.iter().map(|k| k.mask_bit()).sum();
        assert_eq!(bits, 0xfff);
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_mask_bit(kind.mask_bit()), Some(kind));
        }
        assert_eq!(EventKind::from_mask_bit(3), None);
        // Proxy-control events stand alone; a lenient recorder accepts orphans.
        assert!(rec.start(EventKind::ProxyCtrl, "ProxyCtrl", None).is_ok());
        let lenient = Recorder::allowing_orphans();
        assert!(lenient.start(EventKind::ProxyStep, "s", None).is_ok());
        assert!(lenient
            .start(EventKind::ProxyStep, "s", Some(EventId(99)))
            .is_err());
    }

    #[test]
    fn many_threads_record_consistently() {
        let rec = Recorder::new();
        let group = rec.start(EventKind::Group, "Group", None).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let rec = &rec;
                s.spawn(move || {
                    for i in 0..50 {
                        let coll = rec
                            .start(EventKind::Coll, format!("AllReduce{t}.{i}"), Some(group))
                            .unwrap();
                        let op = rec
                            .start(EventKind::ProxyOp, "ProxyOp", Some(coll))
                            .unwrap();
                        rec.stop(op).unwrap();
                        rec.stop(coll).unwrap();
                    }
                });
            }
        });
        rec.stop(group).unwrap();
        let (events, spans) = parse(&rec);
        assert_eq!(events.len(), 1 + 4 * 50 * 2);
        assert_eq!(spans.len(), events.len(), "ids are unique");
        let tids: std::collections::HashSet<u64> = spans
            .values()
            .filter(|e| e["cat"] == "coll")
            .map(|e| e["tid"].as_u64().unwrap())
            .collect();
        assert_eq!(tids.len(), 4);
        for e in spans.values().filter(|e| e["cat"] == "proxy_op") {
            let parent = &spans[&e["args"]["parent"].as_u64().unwrap()];
            assert_eq!(parent["tid"], e["tid"]);
            assert!(inside(interval(parent), interval(e)));
        }
    }
}

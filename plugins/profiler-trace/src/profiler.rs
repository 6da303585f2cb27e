//! [`TraceProfiler`]: the [`Profiler`] interface on top of one [`Recorder`] — the event mask
//! ([`EVENT_MASK_ENV`]), one context per communicator, each event's name and `args`, and the
//! trace written when the last live communicator is finalised.

use std::sync::Mutex;

use rustccl_plugin_api::profiler::{event_type, state, EventDescr, Profiler, StateArgs};
use rustccl_plugin_api::{subsys, HandleRegistry, LogFn, PluginError, PluginHandle};
use serde_json::{Map, Value};

use crate::chrome_trace::TRACE_FILE_ENV;
use crate::event::{EventId, EventKind, TraceError};
use crate::export::PLUGIN_NAME;
use crate::recorder::Recorder;

/// Environment variable with the event types to record (NCCL's example profiler's name).
pub const EVENT_MASK_ENV: &str = "NCCL_PROFILE_EVENT_MASK";

/// The event types recorded when [`EVENT_MASK_ENV`] is unset: Group | Coll | P2p | ProxyOp.
pub const DEFAULT_EVENT_MASK: u32 =
    event_type::GROUP | event_type::COLL | event_type::P2P | event_type::PROXY_OP;

/// Parses a value of [`EVENT_MASK_ENV`]: decimal or `0x` hex; bits this ABI does not know
/// are dropped.
pub fn parse_event_mask(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse::<u64>(),
    };
    value
        .map(|v| (v & u64::from(event_type::ALL)) as u32)
        .map_err(|_| format!("{EVENT_MASK_ENV}={text} is not a number (decimal or 0x hex)"))
}

/// One communicator using the profiler.
#[derive(Debug, Clone)]
struct Context {
    /// `comm` in the events' args: the name, or the id in hex.
    comm: String,
    mask: u32,
    log: LogFn,
}

/// The profiler: one recorder for the whole process, and the live communicators.
#[derive(Debug)]
pub struct TraceProfiler {
    recorder: Recorder,
    contexts: HandleRegistry<Context>,
    /// Serialises finalize (remove + "was it the last?" + write).
    finalizing: Mutex<()>,
}

impl Default for TraceProfiler {
    fn default() -> Self {
        Self::new()
    }
}

fn args_of(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

impl TraceProfiler {
    /// A profiler with an empty trace (its recorder accepts events whose parent is not
    /// tracked).
    pub fn new() -> Self {
        TraceProfiler {
            recorder: Recorder::allowing_orphans(),
            contexts: HandleRegistry::new(),
            finalizing: Mutex::new(()),
        }
    }

    /// The recorder holding the trace.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    fn event_name(kind: EventKind, d: &EventDescr<'_>) -> String {
        let func = d.func.as_str();
        match kind {
            EventKind::Coll | EventKind::P2p | EventKind::CollApi | EventKind::P2pApi
                if !func.is_empty() =>
            {
                func.to_string()
            }
            _ => event_type::name(d.event_type)
                .unwrap_or("Event")
                .to_string(),
        }
    }

    fn event_args(ctx: &Context, kind: EventKind, d: &EventDescr<'_>) -> Map<String, Value> {
        let mut args = args_of([("rank", d.rank.into()), ("comm", ctx.comm.clone().into())]);
        let s = |r: abi_stable::std_types::RStr<'_>| Value::from(r.as_str());
        let more: Vec<(&'static str, Value)> = match kind {
            EventKind::Coll => vec![
                ("seq", d.seq_number.into()),
                ("count", d.count.into()),
                ("datatype", s(d.datatype)),
                ("root", d.root.into()),
                ("algo", s(d.algo)),
                ("proto", s(d.proto)),
                ("nChannels", d.n_channels.into()),
                ("nWarps", d.n_warps.into()),
            ],
            EventKind::P2p => vec![
                ("count", d.count.into()),
                ("datatype", s(d.datatype)),
                ("peer", d.peer.into()),
                ("nChannels", d.n_channels.into()),
            ],
            EventKind::ProxyOp => vec![
                ("channel", d.channel_id.into()),
                ("peer", d.peer.into()),
                ("nSteps", d.n_steps.into()),
                ("chunkSize", d.chunk_size.into()),
                ("isSend", d.is_send.into()),
            ],
            EventKind::ProxyStep => vec![("step", d.step.into())],
            EventKind::KernelCh => vec![("channel", d.channel_id.into())],
            EventKind::Net => vec![("pluginId", d.net_plugin_id.into())],
            EventKind::CollApi | EventKind::P2pApi => vec![
                ("count", d.count.into()),
                ("datatype", s(d.datatype)),
                ("root", d.root.into()),
            ],
            EventKind::GroupApi => vec![("depth", d.group_depth.into())],
            EventKind::Group | EventKind::ProxyCtrl | EventKind::KernelLaunch => vec![],
        };
        args.extend(more.into_iter().map(|(k, v)| (k.to_string(), v)));
        // The caller's profiler tag (rustccl profiler ABI v3, NCCL's v7 `userTag`), when set.
        if d.user_tag != 0 {
            args.insert("userTag".into(), d.user_tag.into());
        }
        args
    }

    fn trace_error(e: TraceError) -> PluginError {
        PluginError::invalid_usage(format!("{PLUGIN_NAME} profiler: {e}"))
    }
}

impl Profiler for TraceProfiler {
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        _nnodes: usize,
        _nranks: usize,
        rank: usize,
        log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError> {
        let mask = match std::env::var(EVENT_MASK_ENV) {
            Ok(text) if !text.trim().is_empty() => parse_event_mask(&text).unwrap_or_else(|e| {
                log.warn(
                    subsys::PROFILE,
                    &format!("{PLUGIN_NAME} profiler: {e}; using {DEFAULT_EVENT_MASK:#x}"),
                );
                DEFAULT_EVENT_MASK
            }),
            _ => DEFAULT_EVENT_MASK,
        };
        let comm = if comm_name.is_empty() {
            format!("{comm_id:#x}")
        } else {
            comm_name.to_string()
        };
        log.info(
            subsys::PROFILE,
            &format!("{PLUGIN_NAME} profiler: rank {rank} of {comm}, event mask {mask:#x}"),
        );
        let ctx = self.contexts.insert(Context { comm, mask, log });
        Ok((ctx, mask))
    }

    fn start_event(
        &self,
        ctx: PluginHandle,
        d: &EventDescr<'_>,
    ) -> Result<PluginHandle, PluginError> {
        let context = self.contexts.with(ctx, |c| c.clone()).ok_or_else(|| {
            PluginError::invalid_argument(format!(
                "{PLUGIN_NAME} profiler: unknown context {}",
                ctx.id
            ))
        })?;
        let kind = match EventKind::from_mask_bit(u64::from(d.event_type)) {
            Some(kind) if d.event_type & context.mask != 0 => kind,
            _ => return Ok(PluginHandle { id: 0 }),
        };
        // A collective's parent is its API event (NCCL's v5); when that is not tracked, its
        // group.
        let parent = d
            .parent()
            .or_else(|| (d.parent_group.id != 0).then_some(d.parent_group))
            .map(|p| EventId(p.id));
        let id = self
            .recorder
            .start_with_args(
                kind,
                Self::event_name(kind, d),
                parent,
                Self::event_args(&context, kind, d),
            )
            .map_err(Self::trace_error)?;
        Ok(PluginHandle { id: id.get() })
    }

    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
        if event.id == 0 {
            return Ok(());
        }
        self.recorder
            .stop(EventId(event.id))
            .map_err(Self::trace_error)
    }

    fn record_event_state(
        &self,
        event: PluginHandle,
        st: u32,
        args: &StateArgs,
    ) -> Result<(), PluginError> {
        if event.id == 0 {
            return Ok(());
        }
        let name = state::name(st).map_or_else(|| format!("State{st}"), str::to_string);
        let mut extra = Map::new();
        if args.trans_size != 0 {
            extra.insert("transSize".into(), args.trans_size.into());
        }
        if args.appended_proxy_ops != 0 {
            extra.insert("appendedProxyOps".into(), args.appended_proxy_ops.into());
        }
        if args.p_timer != 0 {
            extra.insert("pTimer".into(), args.p_timer.into());
        }
        self.recorder
            .record_state(EventId(event.id), name, extra)
            .map_err(Self::trace_error)
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        let _serial = self.finalizing.lock().unwrap_or_else(|p| p.into_inner());
        let context = self.contexts.remove(ctx).ok_or_else(|| {
            PluginError::invalid_argument(format!(
                "{PLUGIN_NAME} profiler: unknown context {}",
                ctx.id
            ))
        })?;
        if !self.contexts.is_empty() {
            return Ok(());
        }
        match self.recorder.write_to_env_file() {
            Ok(Some(path)) => {
                context.log.info(
                    subsys::PROFILE,
                    &format!(
                        "{PLUGIN_NAME} profiler: wrote {} events to {}",
                        self.recorder.len(),
                        path.display()
                    ),
                );
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(PluginError::system(format!(
                "{PLUGIN_NAME} profiler: cannot write the trace ({TRACE_FILE_ENV}): {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::parse;
    use serde_json::json;

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: abi_stable::std_types::RStr<'_>) {}

    #[test]
    fn event_mask_parsing() {
        assert_eq!(parse_event_mask("15"), Ok(15));
        assert_eq!(parse_event_mask(" 0xFF "), Ok(0xff));
        assert_eq!(parse_event_mask("0x1ff"), Ok(0x1ff));
        assert_eq!(parse_event_mask("0xffff"), Ok(0xfff), "unknown bits dropped");
        assert!(parse_event_mask("all")
            .unwrap_err()
            .contains("NCCL_PROFILE_EVENT_MASK=all"));
        assert_eq!(DEFAULT_EVENT_MASK, 0b1111);
    }

    #[test]
    fn a_tagged_call_carries_its_tag_in_the_trace() {
        use abi_stable::std_types::RStr;
        let p = TraceProfiler::new();
        let (ctx, _) = p.init(0x43, "tags", 1, 2, 0, LogFn { log: quiet }).unwrap();
        let coll = |user_tag| EventDescr {
            func: RStr::from_str("AllReduce"),
            count: 8,
            user_tag,
            ..EventDescr::new(event_type::COLL, PluginHandle { id: 0 }, 0)
        };
        let tagged = p.start_event(ctx, &coll(42)).unwrap();
        let plain = p.start_event(ctx, &coll(0)).unwrap();
        for h in [tagged, plain] {
            p.stop_event(h).unwrap();
        }
        let (_, spans) = parse(p.recorder());
        assert_eq!(spans[&tagged.id]["args"]["userTag"], 42);
        assert!(spans[&plain.id]["args"].get("userTag").is_none(), "untagged: no userTag");
    }

    #[test]
    fn profiler_records_masked_events_with_args() {
        use abi_stable::std_types::RStr;
        let p = TraceProfiler::new();
        let log = LogFn { log: quiet };
        // (Reads NCCL_PROFILE_EVENT_MASK, which no unit test sets: the default mask.)
        let (ctx, mask) = p.init(0x42, "", 1, 2, 1, log).unwrap();
        assert_eq!(mask, DEFAULT_EVENT_MASK);
        let none = PluginHandle { id: 0 };
        let group = p
            .start_event(ctx, &EventDescr::new(event_type::GROUP, none, 1))
            .unwrap();
        let coll = p
            .start_event(
                ctx,
                &EventDescr {
                    func: RStr::from_str("AllReduce"),
                    seq_number: 3,
                    count: 256,
                    datatype: RStr::from_str("ncclFloat32"),
                    algo: RStr::from_str("RING"),
                    proto: RStr::from_str("LL"),
                    n_channels: 2,
                    ..EventDescr::new(event_type::COLL, group, 1)
                },
            )
            .unwrap();
        let op = p
            .start_event(
                ctx,
                &EventDescr {
                    channel_id: 1,
                    peer: 0,
                    n_steps: 4,
                    chunk_size: 1024,
                    is_send: true,
                    ..EventDescr::new(event_type::PROXY_OP, coll, 1)
                },
            )
            .unwrap();
        // Not in the mask: not tracked, and calls on handle 0 are accepted.
        let step = p
            .start_event(ctx, &EventDescr::new(event_type::PROXY_STEP, op, 1))
            .unwrap();
        assert_eq!(step.id, 0);
        p.record_event_state(step, state::PROXY_STEP_SEND_WAIT, &StateArgs::default())
            .unwrap();
        p.stop_event(step).unwrap();
        p.record_event_state(
            op,
            state::PROXY_OP_IN_PROGRESS,
            &StateArgs {
                trans_size: 64,
                ..Default::default()
            },
        )
        .unwrap();
        // A wrong parent kind is refused.
        let wrong = EventDescr::new(event_type::PROXY_OP, group, 1);
        assert_eq!(
            p.start_event(ctx, &wrong).unwrap_err().code,
            PluginError::INVALID_USAGE
        );
        for h in [op, coll, group] {
            p.stop_event(h).unwrap();
        }
        assert_eq!(
            p.stop_event(op).unwrap_err().code,
            PluginError::INVALID_USAGE
        );
        assert!(p
            .start_event(
                PluginHandle { id: 999 },
                &EventDescr::new(event_type::GROUP, none, 1)
            )
            .is_err());

        let (events, spans) = parse(p.recorder());
        let c = &spans[&coll.id];
        assert_eq!(c["name"], "AllReduce");
        assert_eq!(c["args"]["parent"].as_u64(), Some(group.id));
        assert_eq!(
            (
                &c["args"]["count"],
                &c["args"]["algo"],
                &c["args"]["comm"],
                &c["args"]["seq"],
                &c["args"]["rank"]
            ),
            (
                &json!(256),
                &json!("RING"),
                &json!("0x42"),
                &json!(3),
                &json!(1)
            )
        );
        let o = &spans[&op.id];
        assert_eq!(
            (o["name"].as_str(), o["cat"].as_str()),
            (Some("ProxyOp"), Some("proxy_op"))
        );
        assert_eq!(
            (&o["args"]["isSend"], &o["args"]["chunkSize"]),
            (&json!(true), &json!(1024))
        );
        let mark = events.iter().find(|e| e["ph"] == "i").unwrap();
        assert_eq!(mark["name"], "ProxyOpInProgress");
        assert_eq!(mark["args"]["transSize"], 64);
        p.finalize(ctx).unwrap();
        assert!(p.finalize(ctx).is_err());
    }
}

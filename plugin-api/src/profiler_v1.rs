//! Profiler ABI v1 (`rustccl_profiler_v1`), kept so that plugins built before v2 still load,
//! and so that a plugin can stay loadable by hosts that know only v1.
//!
//! v1 knew the event types up to `NetPlugin` ([`V1_EVENT_TYPES`]) and its descriptor
//! ([`EventDescrV1`]) ends at `net_data`; a Coll / P2p's parent was its Group. So:
//! - [`ProfilerV1Client`] (a v1 table seen through the current [`Profiler`] trait) cuts the
//!   mask the plugin asks for to [`V1_EVENT_TYPES`], never starts other types, and gives a
//!   Coll / P2p whose API event is not tracked its Group as parent;
//! - [`ProfilerV1::table`] (a current plugin exported as v1) fills the fields v1 lacks with
//!   [`EventDescr::new`]'s "does not apply" values.

use abi_stable::std_types::RStr;
use abi_stable::StableAbi;

use crate::profiler::{
    event_type, finalize_shim, init_shim, into, record_event_state_shim, stop_event_shim, EventDescr, Profiler,
    ProfilerProvider, StateArgs,
};
use crate::{call_guarded, LogFn, PResult, PluginError, PluginHandle};

/// The event types a v1 plugin may be sent.
pub const V1_EVENT_TYPES: u32 = 0xff;

/// The descriptor of v1: [`EventDescr`]'s fields up to `net_data`, in the same order.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct EventDescrV1<'a> {
    pub event_type: u32,
    pub rank: i32,
    pub parent: PluginHandle,
    pub func: RStr<'a>,
    pub seq_number: u64,
    pub count: usize,
    pub datatype: RStr<'a>,
    pub root: i32,
    pub peer: i32,
    pub algo: RStr<'a>,
    pub proto: RStr<'a>,
    pub n_channels: i32,
    pub n_warps: i32,
    pub channel_id: i32,
    pub n_steps: i32,
    pub chunk_size: i32,
    pub step: i32,
    pub is_send: bool,
    pub net_plugin_id: i64,
    pub net_data: usize,
}

impl<'a> EventDescrV1<'a> {
    /// What a v1 plugin is told of `d`: a Coll / P2p without a tracked API parent hangs
    /// under its Group, as v1 defined.
    pub fn from_current(d: &EventDescr<'a>) -> EventDescrV1<'a> {
        let is_task = d.event_type == event_type::COLL || d.event_type == event_type::P2P;
        let parent = if is_task && d.parent.id == 0 { d.parent_group } else { d.parent };
        EventDescrV1 {
            event_type: d.event_type,
            rank: d.rank,
            parent,
            func: d.func,
            seq_number: d.seq_number,
            count: d.count,
            datatype: d.datatype,
            root: d.root,
            peer: d.peer,
            algo: d.algo,
            proto: d.proto,
            n_channels: d.n_channels,
            n_warps: d.n_warps,
            channel_id: d.channel_id,
            n_steps: d.n_steps,
            chunk_size: d.chunk_size,
            step: d.step,
            is_send: d.is_send,
            net_plugin_id: d.net_plugin_id,
            net_data: d.net_data,
        }
    }

    /// The current descriptor with v1's fields (the rest "does not apply").
    pub fn to_current(&self) -> EventDescr<'a> {
        EventDescr {
            func: self.func,
            seq_number: self.seq_number,
            count: self.count,
            datatype: self.datatype,
            root: self.root,
            peer: self.peer,
            algo: self.algo,
            proto: self.proto,
            n_channels: self.n_channels,
            n_warps: self.n_warps,
            channel_id: self.channel_id,
            n_steps: self.n_steps,
            chunk_size: self.chunk_size,
            step: self.step,
            is_send: self.is_send,
            net_plugin_id: self.net_plugin_id,
            net_data: self.net_data,
            ..EventDescr::new(self.event_type, self.parent, self.rank)
        }
    }
}

/// The exported table of profiler ABI v1 (`rustccl_profiler_v1`).
#[repr(C)]
#[derive(StableAbi)]
pub struct ProfilerV1 {
    pub name: RStr<'static>,
    pub init: extern "C" fn(
        comm_id: u64,
        comm_name: RStr<'_>,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
        event_mask: &mut u32,
    ) -> PResult<PluginHandle>,
    pub start_event: extern "C" fn(ctx: PluginHandle, descr: &EventDescrV1<'_>) -> PResult<PluginHandle>,
    pub stop_event: extern "C" fn(event: PluginHandle) -> PResult<()>,
    pub record_event_state: extern "C" fn(event: PluginHandle, state: u32, args: &StateArgs) -> PResult<()>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

extern "C" fn v1_start_event_shim<P: ProfilerProvider>(ctx: PluginHandle, descr: &EventDescrV1<'_>) -> PResult<PluginHandle> {
    call_guarded(|| P::get().start_event(ctx, &descr.to_current()))
}

impl ProfilerV1 {
    /// The v1 table whose functions call `P::get()`.
    pub const fn table<P: ProfilerProvider>(name: &'static str) -> ProfilerV1 {
        ProfilerV1 {
            name: RStr::from_str(name),
            init: init_shim::<P>,
            start_event: v1_start_event_shim::<P>,
            stop_event: stop_event_shim::<P>,
            record_event_state: record_event_state_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

/// A loaded library's v1 table, seen through the [`Profiler`] trait.
pub struct ProfilerV1Client {
    pub table: &'static ProfilerV1,
}

impl ProfilerV1Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

impl Profiler for ProfilerV1Client {
    fn init(
        &self,
        comm_id: u64,
        comm_name: &str,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
    ) -> Result<(PluginHandle, u32), PluginError> {
        let mut mask = 0;
        let ctx = into((self.table.init)(comm_id, RStr::from_str(comm_name), nnodes, nranks, rank, log, &mut mask))?;
        Ok((ctx, mask & V1_EVENT_TYPES))
    }
    fn start_event(&self, ctx: PluginHandle, descr: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
        if descr.event_type & !V1_EVENT_TYPES != 0 {
            return Ok(PluginHandle { id: 0 });
        }
        into((self.table.start_event)(ctx, &EventDescrV1::from_current(descr)))
    }
    fn stop_event(&self, event: PluginHandle) -> Result<(), PluginError> {
        into((self.table.stop_event)(event))
    }
    fn record_event_state(&self, event: PluginHandle, state: u32, args: &StateArgs) -> Result<(), PluginError> {
        into((self.table.record_event_state)(event, state, args))
    }
    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        into((self.table.finalize)(ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records (type, parent, func, group depth) of every event; wants everything.
    struct Recorder(Mutex<Vec<(u32, u64, String, i32)>>);

    impl Profiler for Recorder {
        fn init(&self, _: u64, _: &str, _: usize, _: usize, _: usize, _: LogFn) -> Result<(PluginHandle, u32), PluginError> {
            Ok((PluginHandle { id: 1 }, event_type::ALL))
        }
        fn start_event(&self, _: PluginHandle, d: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
            let mut v = self.0.lock().unwrap();
            v.push((d.event_type, d.parent.id, d.func.to_string(), d.group_depth));
            Ok(PluginHandle { id: 100 + v.len() as u64 })
        }
        fn stop_event(&self, _: PluginHandle) -> Result<(), PluginError> {
            Ok(())
        }
        fn record_event_state(&self, _: PluginHandle, _: u32, _: &StateArgs) -> Result<(), PluginError> {
            Ok(())
        }
        fn finalize(&self, _: PluginHandle) -> Result<(), PluginError> {
            Ok(())
        }
    }

    static RECORDER: Recorder = Recorder(Mutex::new(Vec::new()));
    struct Provider;
    impl ProfilerProvider for Provider {
        fn get() -> &'static dyn Profiler {
            &RECORDER
        }
    }
    static V1: ProfilerV1 = ProfilerV1::table::<Provider>("old-prof");
    crate::export_profiler!(v1, "old-prof", provider = Provider);

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}

    #[test]
    fn a_v1_plugin_sees_only_what_v1_knew() {
        let client = ProfilerV1Client { table: &V1 };
        assert_eq!(client.name(), "old-prof");
        let (ctx, mask) = client.init(1, "c", 1, 2, 0, LogFn { log: quiet }).unwrap();
        assert_eq!(mask, V1_EVENT_TYPES, "the v2 types are cut from the mask");
        let api = client.start_event(ctx, &EventDescr::new(event_type::COLL_API, PluginHandle { id: 0 }, 0)).unwrap();
        assert_eq!(api.id, 0, "a v2-only type is not sent");
        let coll = EventDescr {
            func: RStr::from_str("AllReduce"),
            parent_group: PluginHandle { id: 7 },
            group_depth: 3,
            ..EventDescr::new(event_type::COLL, PluginHandle { id: 0 }, 0)
        };
        assert_ne!(client.start_event(ctx, &coll).unwrap().id, 0);
        let seen = RECORDER.0.lock().unwrap().clone();
        assert_eq!(seen, vec![(event_type::COLL, 7, "AllReduce".to_string(), 0)], "parent = its group; v2 fields dropped");
    }

    #[test]
    fn v1_descriptor_is_the_prefix_of_the_current_one() {
        let d = EventDescr { seq_number: 5, step: 2, net_data: 9, ..EventDescr::new(event_type::PROXY_STEP, PluginHandle { id: 3 }, 1) };
        let old = EventDescrV1::from_current(&d);
        assert_eq!(old.to_current(), d);
        assert_eq!(
            std::mem::offset_of!(EventDescrV1<'_>, net_data),
            std::mem::offset_of!(EventDescr<'_>, net_data),
            "the fields v1 has sit where v2 has them"
        );
    }
}

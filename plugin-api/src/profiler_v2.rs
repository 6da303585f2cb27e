//! Profiler ABI v2 (`rustccl_profiler_v2`), kept so that plugins built before v3 still load,
//! and so that a plugin can stay loadable by hosts that know only v2.
//!
//! v2 knew every event type v3 knows; its descriptor ([`EventDescrV2`]) ends at
//! `group_depth`, without v3's `user_tag` (the caller's profiler tag, NCCL's profiler v7
//! `userTag`). An appended field changes the layout the host checks at load (see
//! [`crate::export`]), so the tag came with a new table version rather than in v2's. So:
//! - [`ProfilerV2Client`] (a v2 table seen through the current [`Profiler`] trait) hands the
//!   plugin v2's descriptor: the tag is not told;
//! - [`ProfilerV2::table`] (a current plugin exported as v2) sees `user_tag` 0 ("untagged").

use abi_stable::std_types::RStr;
use abi_stable::StableAbi;

use crate::profiler::{
    finalize_shim, init_shim, into, record_event_state_shim, stop_event_shim, EventDescr, Profiler, ProfilerProvider,
    StateArgs,
};
use crate::{call_guarded, LogFn, PResult, PluginError, PluginHandle};

/// The descriptor of v2: [`EventDescr`]'s fields up to `group_depth`, in the same order.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct EventDescrV2<'a> {
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
    pub parent_group: PluginHandle,
    pub send_buff: usize,
    pub recv_buff: usize,
    pub stream: usize,
    pub graph_captured: bool,
    pub group_depth: i32,
}

impl<'a> EventDescrV2<'a> {
    /// What a v2 plugin is told of `d` (everything but the tag).
    pub fn from_current(d: &EventDescr<'a>) -> EventDescrV2<'a> {
        EventDescrV2 {
            event_type: d.event_type,
            rank: d.rank,
            parent: d.parent,
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
            parent_group: d.parent_group,
            send_buff: d.send_buff,
            recv_buff: d.recv_buff,
            stream: d.stream,
            graph_captured: d.graph_captured,
            group_depth: d.group_depth,
        }
    }

    /// The current descriptor with v2's fields (untagged).
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
            parent_group: self.parent_group,
            send_buff: self.send_buff,
            recv_buff: self.recv_buff,
            stream: self.stream,
            graph_captured: self.graph_captured,
            group_depth: self.group_depth,
            ..EventDescr::new(self.event_type, self.parent, self.rank)
        }
    }
}

/// The exported table of profiler ABI v2 (`rustccl_profiler_v2`).
#[repr(C)]
#[derive(StableAbi)]
pub struct ProfilerV2 {
    /// The plugin's name, for log lines.
    pub name: RStr<'static>,
    /// Writes the wanted event type mask to `event_mask`.
    pub init: extern "C" fn(
        comm_id: u64,
        comm_name: RStr<'_>,
        nnodes: usize,
        nranks: usize,
        rank: usize,
        log: LogFn,
        event_mask: &mut u32,
    ) -> PResult<PluginHandle>,
    /// Handle id 0: not tracked.
    pub start_event: extern "C" fn(ctx: PluginHandle, descr: &EventDescrV2<'_>) -> PResult<PluginHandle>,
    pub stop_event: extern "C" fn(event: PluginHandle) -> PResult<()>,
    pub record_event_state: extern "C" fn(event: PluginHandle, state: u32, args: &StateArgs) -> PResult<()>,
    pub finalize: extern "C" fn(ctx: PluginHandle) -> PResult<()>,
}

extern "C" fn v2_start_event_shim<P: ProfilerProvider>(ctx: PluginHandle, descr: &EventDescrV2<'_>) -> PResult<PluginHandle> {
    call_guarded(|| P::get().start_event(ctx, &descr.to_current()))
}

impl ProfilerV2 {
    /// The v2 table whose functions call `P::get()`.
    pub const fn table<P: ProfilerProvider>(name: &'static str) -> ProfilerV2 {
        ProfilerV2 {
            name: RStr::from_str(name),
            init: init_shim::<P>,
            start_event: v2_start_event_shim::<P>,
            stop_event: stop_event_shim::<P>,
            record_event_state: record_event_state_shim::<P>,
            finalize: finalize_shim::<P>,
        }
    }
}

/// A loaded library's v2 table, seen through the [`Profiler`] trait.
pub struct ProfilerV2Client {
    pub table: &'static ProfilerV2,
}

impl ProfilerV2Client {
    pub fn name(&self) -> &'static str {
        self.table.name.as_str()
    }
}

impl Profiler for ProfilerV2Client {
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
        Ok((ctx, mask))
    }
    fn start_event(&self, ctx: PluginHandle, descr: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
        into((self.table.start_event)(ctx, &EventDescrV2::from_current(descr)))
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
    use crate::profiler::event_type;
    use std::sync::Mutex;

    /// Records (type, func, tag) of every event.
    struct Recorder(Mutex<Vec<(u32, String, u64)>>);

    impl Profiler for Recorder {
        fn init(&self, _: u64, _: &str, _: usize, _: usize, _: usize, _: LogFn) -> Result<(PluginHandle, u32), PluginError> {
            Ok((PluginHandle { id: 1 }, event_type::ALL))
        }
        fn start_event(&self, _: PluginHandle, d: &EventDescr<'_>) -> Result<PluginHandle, PluginError> {
            let mut v = self.0.lock().unwrap();
            v.push((d.event_type, d.func.to_string(), d.user_tag));
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
    static V2: ProfilerV2 = ProfilerV2::table::<Provider>("v2-prof");
    crate::export_profiler!(v2, "v2-prof", provider = Provider);

    extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}

    #[test]
    fn a_v2_plugin_gets_everything_but_the_tag() {
        let client = ProfilerV2Client { table: &V2 };
        assert_eq!(client.name(), "v2-prof");
        let (ctx, mask) = client.init(1, "c", 1, 2, 0, LogFn { log: quiet }).unwrap();
        assert_eq!(mask, event_type::ALL, "v2 knew every type");
        let api = EventDescr {
            func: RStr::from_str("AllReduce"),
            group_depth: 2,
            user_tag: 42,
            ..EventDescr::new(event_type::COLL_API, PluginHandle { id: 0 }, 0)
        };
        assert_ne!(client.start_event(ctx, &api).unwrap().id, 0);
        let seen = RECORDER.0.lock().unwrap().clone();
        assert_eq!(seen, vec![(event_type::COLL_API, "AllReduce".to_string(), 0)], "v2 has no tag");
    }

    #[test]
    fn v2_descriptor_is_the_prefix_of_the_current_one() {
        let d = EventDescr { stream: 5, group_depth: 2, graph_captured: true, ..EventDescr::new(event_type::P2P_API, PluginHandle { id: 3 }, 1) };
        let old = EventDescrV2::from_current(&d);
        assert_eq!(old.to_current(), d);
        assert_eq!(
            std::mem::offset_of!(EventDescrV2<'_>, group_depth),
            std::mem::offset_of!(EventDescr<'_>, group_depth),
            "the fields v2 has sit where v3 has them"
        );
        assert!(
            std::mem::offset_of!(EventDescr<'_>, user_tag) >= std::mem::offset_of!(EventDescrV2<'_>, group_depth) + 4,
            "v3's tag comes after all of v2"
        );
    }
}

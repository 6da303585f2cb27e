//! Loads this package's own `cdylib` with libloading, finds `rustccl_profiler_v3` with
//! `rustccl_plugin_api::export::find` as rustccl will, and drives it through the stable ABI
//! for two communicators; the trace file appears when the last one is finalised.
//!
//! One test only: it sets environment variables for the whole process.

use std::path::PathBuf;

use abi_stable::std_types::RStr;
use rustccl_plugin_api::export::{find, PluginKind};
use rustccl_plugin_api::profiler::{event_type, state, EventDescr, Profiler, ProfilerV3, ProfilerV3Client, StateArgs};
use rustccl_plugin_api::profiler_v1::ProfilerV1;
use rustccl_plugin_api::profiler_v2::ProfilerV2;
use rustccl_plugin_api::tuner::TunerV2;
use rustccl_plugin_api::{LogFn, PluginHandle};
use serde_json::Value;

fn cdylib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let file = format!(
        "{}rustccl_profiler_trace{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.parent().map(|p| p.join(&file)), Some(deps.join(&file))]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found next to {}", exe.display()))
}

extern "C" fn quiet(_level: i32, _subsys: u64, _message: RStr<'_>) {}
const LOG: LogFn = LogFn { log: quiet };
const NONE: PluginHandle = PluginHandle { id: 0 };

#[test]
fn dlopen_round_trip_writes_trace_at_last_finalize() {
    let dir = std::env::temp_dir().join(format!("rustccl-profiler-dlopen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace-%p.json");
    let written = dir.join(format!("trace-{}.json", std::process::id()));
    std::env::set_var("RUSTCCL_PROFILER_TRACE_FILE", &trace);
    std::env::remove_var("NCCL_PROFILE_EVENT_MASK");

    // SAFETY: loading our own plugin; its initialisers have no requirements.
    let lib: &'static libloading::Library =
        Box::leak(Box::new(unsafe { libloading::Library::new(cdylib_path()) }.unwrap()));
    let table = find::<ProfilerV3>(lib, PluginKind::Profiler, 3).unwrap().expect("rustccl_profiler_v3");
    assert!(find::<ProfilerV2>(lib, PluginKind::Profiler, 2).unwrap().is_some(), "also exported as v2 for older hosts");
    assert!(find::<ProfilerV1>(lib, PluginKind::Profiler, 1).unwrap().is_some(), "and as v1");
    assert!(find::<TunerV2>(lib, PluginKind::Tuner, 2).unwrap().is_none());
    let p = ProfilerV3Client { table };
    assert_eq!(p.name(), "trace");

    let (ctx0, mask) = p.init(0x10, "world", 1, 2, 0, LOG).unwrap();
    assert_eq!(mask, event_type::GROUP | event_type::COLL | event_type::P2P | event_type::PROXY_OP);
    std::env::set_var("NCCL_PROFILE_EVENT_MASK", "0x1e"); // Coll | P2p | ProxyOp | ProxyStep
    let (ctx1, mask1) = p.init(0x10, "world", 1, 2, 1, LOG).unwrap();
    assert_eq!(mask1, 0x1e);

    // Rank 0: a group with an allreduce and its proxy op.
    let group = p.start_event(ctx0, &EventDescr::new(event_type::GROUP, NONE, 0)).unwrap();
    let func = String::from("AllReduce");
    let coll = p
        .start_event(
            ctx0,
            &EventDescr {
                func: RStr::from_str(&func),
                count: 1 << 20,
                datatype: RStr::from_str("ncclFloat32"),
                algo: RStr::from_str("RING"),
                proto: RStr::from_str("SIMPLE"),
                user_tag: 42,
                ..EventDescr::new(event_type::COLL, group, 0)
            },
        )
        .unwrap();
    drop(func);
    let op = p
        .start_event(ctx0, &EventDescr { channel_id: 0, peer: 1, n_steps: 2, is_send: true, ..EventDescr::new(event_type::PROXY_OP, coll, 0) })
        .unwrap();
    p.record_event_state(op, state::PROXY_OP_IN_PROGRESS, &StateArgs::default()).unwrap();
    let step = p.start_event(ctx0, &EventDescr { step: 0, ..EventDescr::new(event_type::PROXY_STEP, op, 0) }).unwrap();
    assert_eq!(step.id, 0, "ProxyStep is not in rank 0's mask");
    for h in [op, coll, group] {
        p.stop_event(h).unwrap();
    }

    // Rank 1: groups are not tracked, so its recv stands alone; its proxy step is tracked.
    let g1 = p.start_event(ctx1, &EventDescr::new(event_type::GROUP, NONE, 1)).unwrap();
    assert_eq!(g1.id, 0);
    let recv = p
        .start_event(ctx1, &EventDescr { func: RStr::from_str("Recv"), peer: 0, count: 8, ..EventDescr::new(event_type::P2P, g1, 1) })
        .unwrap();
    let op1 = p.start_event(ctx1, &EventDescr::new(event_type::PROXY_OP, recv, 1)).unwrap();
    let step1 = p.start_event(ctx1, &EventDescr { step: 7, ..EventDescr::new(event_type::PROXY_STEP, op1, 1) }).unwrap();
    p.record_event_state(step1, state::PROXY_STEP_RECV_WAIT, &StateArgs { trans_size: 32, ..Default::default() })
        .unwrap();
    for h in [step1, op1, recv] {
        p.stop_event(h).unwrap();
    }

    p.finalize(ctx0).unwrap();
    assert!(!written.exists(), "written only when the last context is finalised");
    p.finalize(ctx1).unwrap();
    let doc: Value = serde_json::from_slice(&std::fs::read(&written).expect("trace written")).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let span = |h: PluginHandle| {
        events
            .iter()
            .find(|e| e["ph"] == "X" && e["args"]["id"].as_u64() == Some(h.id))
            .unwrap_or_else(|| panic!("event {} in {doc}", h.id))
    };
    assert_eq!(events.iter().filter(|e| e["ph"] == "X").count(), 6);
    assert_eq!(span(coll)["name"], "AllReduce");
    assert_eq!(span(coll)["args"]["comm"], "world");
    assert_eq!(span(coll)["args"]["parent"].as_u64(), Some(group.id));
    assert_eq!(span(coll)["args"]["userTag"], 42, "the caller's tag crosses the v3 table");
    assert!(span(op)["args"].get("userTag").is_none(), "untagged events have none");
    assert_eq!(span(op)["args"]["parent"].as_u64(), Some(coll.id));
    assert_eq!(span(recv)["name"], "Recv");
    assert_eq!(span(recv)["args"]["rank"], 1);
    assert!(span(recv)["args"].get("parent").is_none());
    assert_eq!(span(step1)["args"]["step"], 7);
    let marks: Vec<&str> = events.iter().filter(|e| e["ph"] == "i").map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(marks, ["ProxyOpInProgress", "ProxyStepRecvWait"]);

    // Unknown handles are errors (which the host ignores), not crashes.
    assert!(p.stop_event(PluginHandle { id: 12345 }).is_err());
    assert!(p.finalize(ctx1).is_err());
    std::env::remove_var("RUSTCCL_PROFILER_TRACE_FILE");
    std::env::remove_var("NCCL_PROFILE_EVENT_MASK");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The core's profiler events, seen by real profiler plugins in rank processes (host backend,
//! `NCCL_SHM_DISABLE=1` so that the network transport's proxy runs): NCCL's C profiler ABI v5
//! through a C plugin compiled here from `plugins/testing/c-profiler/` (it counts the events
//! started and stopped per type), one whose init fails, one whose init returns a NULL context,
//! one that keeps the pointers NCCL lets it keep, and rustccl's trace plugin.

use std::time::Duration;

use rustccl_tests::*;

/// Compiles the C profiler (with `defines`) next to the rank worker; returns its path.
fn c_profiler(variant: &str, defines: &[&str]) -> String {
    let out = worker_path().parent().unwrap().join(format!("librustccl_test_c_profiler_{variant}_{}.so", std::process::id()));
    let mut options = vec!["-std=gnu99", "-Wall", "-Werror"];
    options.extend_from_slice(defines);
    compile_c_plugin(&["c-profiler/profiler_v5.c"], &out, &options);
    out.to_string_lossy().into_owned()
}

fn temp(name: &str) -> String {
    std::env::temp_dir().join(format!("rustccl-{name}-{}", std::process::id())).to_string_lossy().into_owned()
}

/// Runs the `profiled` scenario on 2 ranks with `env`; returns each rank's log.
fn profiled(env: &[(&str, &str)]) -> Vec<String> {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![
        ("RUSTCCL_BACKEND", "host"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,PROFILE,PLUGIN"),
    ];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("profiled", 2, &[0, 1], &ids, &all), Duration::from_secs(120));
    assert_all_ok(&outs);
    for o in &outs {
        assert!(o.results().contains(&"profiled ok"), "{o:?}");
    }
    outs.into_iter().map(|o| o.stderr).collect()
}

#[test]
fn a_c_profiler_v5_sees_every_event_open_and_close_in_balance() {
    let lib = c_profiler("v5", &[]);
    let out = temp("c-profiler-counts");
    let logs = profiled(&[("NCCL_PROFILER_PLUGIN", &lib), ("RUSTCCL_C_PROFILER_OUT", &out)]);
    for (rank, log) in logs.iter().enumerate() {
        let using: Vec<&str> = log.lines().filter(|l| l.contains("PROFILER/Plugin: using")).collect();
        assert_eq!(using.len(), 1, "{log}");
        assert!(using[0].contains("c-counter (NCCL C profiler ABI v5) from") && using[0].contains(&lib), "{log}");
        assert!(using[0].contains(&format!("NCCL_PROFILER_PLUGIN={lib}")), "the line says why: {log}");
        assert!(log.contains(&format!("c-profiler: init rank {rank} of 2")), "its logger works: {log}");
        let path = format!("{out}.{rank}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e} (finalize wrote nothing)\n{log}"));
        let _ = std::fs::remove_file(&path);
        let count = |what: &str| -> (u64, u64) {
            let line = text.lines().find(|l| l.split(' ').next() == Some(what)).unwrap_or_else(|| panic!("{what}: {text}"));
            let v: Vec<u64> = line.split(' ').skip(1).map(|x| x.parse().unwrap()).collect();
            (v[0], v.get(1).copied().unwrap_or(0))
        };
        for t in ["Group", "Coll", "P2p", "ProxyOp", "ProxyStep", "ProxyCtrl", "KernelCh", "NetPlugin", "GroupApi", "CollApi", "P2pApi", "KernelLaunch"] {
            let (started, stopped) = count(t);
            assert_eq!(started, stopped, "rank {rank}: {t} events started and stopped:\n{text}");
        }
        // Three calls outside groups and one group of three; the all-reduces and the
        // broadcast as Coll, the send and receive as P2p; each over the network.
        assert_eq!(count("GroupApi").0, 3, "{text}");
        assert_eq!(count("CollApi").0, 3, "{text}");
        assert_eq!(count("P2pApi").0, 2, "{text}");
        assert_eq!(count("Group").0, 3, "{text}");
        assert_eq!(count("Coll").0, 3, "{text}");
        assert_eq!(count("P2p").0, 2, "{text}");
        assert!(count("ProxyOp").0 >= 5, "{text}");
        assert!(count("ProxyStep").0 > count("ProxyOp").0, "{text}");
        assert_eq!(count("KernelLaunch").0, 0, "no device work on the host backend");
        assert_eq!(count("bad").0, 0, "every handle stopped was one it gave: {text}");
        assert_eq!(count("named_colls").0, 3, "Coll descriptors carry names and the group: {text}");
        assert_eq!(count("group_states"), (3, 3), "GroupStartApiStop and GroupEndApiStart: {text}");
    }
}

#[test]
fn a_c_profiler_whose_init_fails_is_skipped_with_one_line() {
    let lib = c_profiler("init_fails", &["-DPROFILER_INIT_FAILS"]);
    let ids = ids_arg(&[new_id()]);
    let env = [
        ("RUSTCCL_BACKEND", "host"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "INIT,PROFILE,PLUGIN"),
        ("NCCL_PROFILER_PLUGIN", lib.as_str()),
    ];
    let out = spawn("plugins", 1, &[0], &ids, &env).pop().unwrap().finish(Duration::from_secs(60));
    assert!(out.ok(), "{out:?}");
    assert!(out.results().contains(&"profiler none"), "{out:?}");
    let lines: Vec<&str> = out.stderr.lines().filter(|l| l.contains("c-counter-broken")).collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].contains("NCCL C profiler ABI v5") && lines[0].contains("init failed: ncclProfiler_v5.init returned ncclInternalError"),
        "{}",
        lines[0]
    );
}

#[test]
fn a_c_profiler_whose_init_returns_a_null_context_is_never_called_again() {
    // Built so: init succeeds with a NULL context and asks for every event (NVIDIA's Inspector
    // when switched off); any later call aborts the rank.
    let lib = c_profiler("null_context", &["-DPROFILER_NULL_CONTEXT"]);
    let logs = profiled(&[("NCCL_PROFILER_PLUGIN", &lib)]);
    for (rank, log) in logs.iter().enumerate() {
        assert!(log.contains(&format!("c-profiler: init rank {rank} returns a NULL context")), "{log}");
        let off: Vec<&str> = log.lines().filter(|l| l.contains("switched itself off")).collect();
        assert_eq!(off.len(), 1, "one INFO line: {log}");
        assert!(off[0].contains("INFO") && off[0].contains("c-null-context (NCCL C profiler ABI v5) from"), "{}", off[0]);
        assert!(off[0].contains("no events, no finalize"), "{}", off[0]);
        assert!(!log.contains("PROFILER/Plugin: using"), "{log}");
    }
}

#[test]
fn a_c_profiler_may_keep_the_comm_name_and_event_strings_until_finalize() {
    // Built so: it keeps init's commName pointer and the descriptors' string pointers, and
    // reads them at stop and at finalize.
    let lib = c_profiler("keeps_pointers", &["-DPROFILER_KEEPS_POINTERS"]);
    let out = temp("c-profiler-kept");
    let name = format!("rustccl-profiled-comm-{}", std::process::id());
    profiled(&[("NCCL_PROFILER_PLUGIN", &lib), ("RUSTCCL_C_PROFILER_OUT", &out), ("RUSTCCL_TEST_COMM_NAME", &name)]);
    for rank in 0..2 {
        let path = format!("{out}.{rank}");
        // Lossy: a freed name reads as garbage.
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (finalize wrote nothing)"));
        let text = String::from_utf8_lossy(&bytes);
        let _ = std::fs::remove_file(&path);
        let line = |what: &str| text.lines().find_map(|l| l.strip_prefix(what)).unwrap_or_else(|| panic!("{what}: {text}")).to_string();
        assert_eq!(line("comm_name "), name, "rank {rank}: init's commName read at finalize:\n{text}");
        let coll: Vec<String> = line("first_coll ").split(' ').map(String::from).collect();
        assert_eq!(&coll[..2], ["AllReduce", "ncclInt32"], "rank {rank}: the first Coll's strings read at finalize:\n{text}");
        assert!(coll[2..].iter().all(|s| !s.is_empty() && s != "(null)"), "rank {rank}: its algorithm and protocol:\n{text}");
        let strings: Vec<u64> = line("strings ").split(' ').map(|x| x.parse().unwrap()).collect();
        assert!(strings[0] > 0, "rank {rank}: events kept strings:\n{text}");
        assert_eq!(strings[1], 0, "rank {rank}: every kept string still read the same at stop:\n{text}");
    }
}

#[test]
fn the_trace_profiler_records_api_group_collective_and_proxy_events() {
    let dir = worker_path().parent().unwrap().to_path_buf();
    let lib = [dir.join("librustccl_profiler_trace.so"), dir.join("deps/librustccl_profiler_trace.so")]
        .into_iter()
        .find(|p| p.exists())
        .expect("librustccl_profiler_trace.so is built (cargo build)");
    let trace = temp("trace-%p.json");
    let logs = profiled(&[
        ("NCCL_PROFILER_PLUGIN", lib.to_str().unwrap()),
        ("NCCL_PROFILE_EVENT_MASK", "0xfff"),
        ("RUSTCCL_PROFILER_TRACE_FILE", &trace),
    ]);
    let written: Vec<String> = logs
        .iter()
        .filter_map(|log| log.lines().find_map(|l| l.split(" events to ").nth(1).map(|p| p.trim().to_string())))
        .collect();
    assert_eq!(written.len(), 2, "each rank wrote its trace: {logs:?}");
    for path in written {
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let spans = |cat: &str| events.iter().filter(|e| e["cat"] == cat && e["ph"] == "X").count();
        for cat in ["group_api", "coll_api", "p2p_api", "group", "coll", "p2p", "proxy_op", "proxy_step"] {
            assert!(spans(cat) > 0, "no {cat} event in {path}");
        }
        assert!(!events.iter().any(|e| e["ph"] == "B"), "an event was never stopped: {path}");
        // A collective's parent is its API event; a proxy op's, its collective or p2p.
        let by_id = |id: &serde_json::Value| events.iter().find(|e| e["args"]["id"] == *id && e["ph"] == "X");
        for e in events.iter().filter(|e| e["ph"] == "X" && (e["cat"] == "coll" || e["cat"] == "proxy_op")) {
            let parent = by_id(&e["args"]["parent"]).unwrap_or_else(|| panic!("{e} has no parent"));
            let want: &[&str] = if e["cat"] == "coll" { &["coll_api"] } else { &["coll", "p2p"] };
            assert!(want.contains(&parent["cat"].as_str().unwrap()), "{e} under {parent}");
        }
    }
}

/// Runs the `profiled` scenario under the C profiler that asks for Coll and P2p only (built
/// with -DPROFILER_COLL_P2P_ONLY) with `env`; returns each rank's counts (`name → numbers`).
fn coll_p2p_only(lib: &str, env: &[(&str, &str)]) -> Vec<std::collections::HashMap<String, Vec<u64>>> {
    let out = temp(&format!("c-profiler-coll-p2p-{}", new_id_suffix()));
    let mut all = vec![("NCCL_PROFILER_PLUGIN", lib), ("RUSTCCL_C_PROFILER_OUT", out.as_str())];
    all.extend_from_slice(env);
    profiled(&all);
    (0..2)
        .map(|rank| {
            let path = format!("{out}.{rank}");
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e} (finalize wrote nothing)"));
            let _ = std::fs::remove_file(&path);
            text.lines()
                .filter_map(|l| {
                    let mut w = l.split(' ');
                    let name = w.next()?.to_string();
                    Some((name, w.map(|x| x.parse().unwrap()).collect()))
                })
                .collect()
        })
        .collect()
}

fn new_id_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The ways the Coll/P2p profiler scenario runs (`coll_p2p_only`), with its Coll and P2p
/// operations and how many of them go around the planner: over the network; over shared
/// memory; over shared memory with a small all-reduce last (the host backend's board of small
/// collectives); copied straight between the ranks' buffers (the host backend's single
/// copies, on by default: the two large all-reduces and the broadcast).
const PATHS: [(&str, &[(&str, &str)], u64, u64); 4] = [
    ("network", &[("NCCL_SHM_DISABLE", "1")], 5, 0),
    ("shared memory", &[("NCCL_SHM_DISABLE", "0"), ("RUSTCCL_HOST_SINGLE_COPY_BYTES", "0")], 5, 0),
    ("shared memory and the board", &[("NCCL_SHM_DISABLE", "0"), ("RUSTCCL_HOST_SINGLE_COPY_BYTES", "0"), ("RUSTCCL_TEST_PROFILED_SMALL", "1")], 6, 1),
    ("single copies between the ranks' buffers", &[("NCCL_SHM_DISABLE", "0")], 5, 3),
];

#[test]
fn a_profiler_asking_for_coll_and_p2p_gets_them_under_api_events_and_completes_each_on_its_kernel_channels() {
    let lib = c_profiler("coll_p2p_only", &["-DPROFILER_COLL_P2P_ONLY"]);
    for (what, env, ops, unplanned) in PATHS {
        for (rank, c) in coll_p2p_only(&lib, env).iter().enumerate() {
            let at = |k: &str, i: usize| c.get(k).and_then(|v| v.get(i).copied()).unwrap_or_else(|| panic!("{what}: no {k}: {c:?}"));
            // Three all-reduces and a broadcast (the last all-reduce only with the board), a
            // send and a receive.
            assert_eq!(at("ops", 0), ops, "{what}, rank {rank}: Coll and P2p events: {c:?}");
            assert_eq!(at("parents", 0), ops, "{what}, rank {rank}: each under its CollApi / P2pApi event: {c:?}");
            assert_eq!(at("parents", 1), 0, "{what}, rank {rank}: none under anything else: {c:?}");
            assert_eq!(at("ops", 1), ops, "{what}, rank {rank}: every operation completed on its KernelCh stops: {c:?}");
            assert!(at("channels", 0) >= ops, "{what}, rank {rank}: KernelCh events: {c:?}");
            assert_eq!(at("channels", 1), at("channels", 0), "{what}, rank {rank}: each with its timers: {c:?}");
            assert_eq!(at("channels", 2), 0, "{what}, rank {rank}: no KernelCh without a parent or timers: {c:?}");
            assert_eq!(at("bad", 0), 0, "{what}, rank {rank}: every handle stopped once: {c:?}");
            assert_eq!(at("unplanned", 0), unplanned, "{what}, rank {rank}: the small all-reduce took the board, the large all-reduces and broadcast single copies: {c:?}");
            for t in ["Group", "Coll", "P2p", "KernelCh", "CollApi", "P2pApi", "GroupApi"] {
                assert_eq!(at(t, 0), at(t, 1), "{what}, rank {rank}: {t} started and stopped: {c:?}");
            }
        }
    }
}

#[test]
fn a_profiler_completing_operations_on_proxy_op_stops_sees_every_operation_complete_on_every_path() {
    // Google's CoMMA ends an operation only when a ProxyOp under it stops: whatever way the
    // data moves, each Coll / P2p must get one (transport of no network included).
    let lib = c_profiler("proxy_ops", &["-DPROFILER_PROXY_OPS"]);
    for (what, env, ops, unplanned) in PATHS {
        for (rank, c) in coll_p2p_only(&lib, env).iter().enumerate() {
            let at = |k: &str, i: usize| c.get(k).and_then(|v| v.get(i).copied()).unwrap_or_else(|| panic!("{what}: no {k}: {c:?}"));
            assert_eq!(at("ops", 0), ops, "{what}, rank {rank}: Coll and P2p events: {c:?}");
            assert_eq!(at("ops", 1), ops, "{what}, rank {rank}: every operation completed by a ProxyOp stop under it: {c:?}");
            assert_eq!(at("proxyops", 1), at("proxyops", 0), "{what}, rank {rank}: every ProxyOp counts: {c:?}");
            assert_eq!(at("proxyops", 2), 0, "{what}, rank {rank}: no ProxyOp with a wrong parent, pid, channel or steps: {c:?}");
            assert_eq!(at("parents", 1), 0, "{what}, rank {rank}: each Coll / P2p under its API event: {c:?}");
            assert_eq!(at("unplanned", 0), unplanned, "{what}, rank {rank}: the small all-reduce took the board, the large all-reduces and broadcast single copies: {c:?}");
            assert_eq!(at("bad", 0), 0, "{what}, rank {rank}: every handle stopped once: {c:?}");
            for t in ["Group", "Coll", "P2p", "ProxyOp", "ProxyStep"] {
                assert_eq!(at(t, 0), at(t, 1), "{what}, rank {rank}: {t} started and stopped: {c:?}");
            }
        }
    }
}

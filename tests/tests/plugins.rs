//! Plugin discovery with real shared libraries, each rule in a process of its own (the rules
//! read the environment): defaults, `none`, a path, a name expanded to both file-name patterns,
//! a list, a missing plugin, a plugin whose init fails, a library that is not a plugin, one
//! whose table layout is wrong, `NCCL_NET` choosing by name, NCCL's order (the IB transport
//! before Socket when it has a device; found under cargo's name too, and beside the worker, where
//! without RDMA it is passed over quietly), a tuner of the older ABI, and a profiler. Each run's log must say what was chosen and why, in one line.

use std::time::Duration;

use rustccl_tests::*;


/// Runs a one-rank communicator with `env` and returns (RESULT lines, log).
fn run(env: &[(&str, &str)]) -> (Vec<String>, String, Outcome) {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET,TUNING,PROFILE,PLUGIN")];
    all.extend_from_slice(env);
    let out = spawn("plugins", 1, &[0], &ids, &all).pop().unwrap().finish(Duration::from_secs(60));
    let results = out.results().iter().map(|s| s.to_string()).collect();
    let log = out.stderr.clone();
    (results, log, out)
}

fn ok_run(env: &[(&str, &str)]) -> (Vec<String>, String) {
    let (r, log, out) = run(env);
    assert!(out.ok(), "{out:?}");
    (r, log)
}

#[test]
fn default_is_the_built_in_socket_with_one_line_saying_why() {
    let (r, log) = ok_run(&[]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert_eq!(r[1], "tuner none");
    assert!(log.contains("NET/Plugin: could not find: librustccl-net.so, libnccl-net.so"), "{log}");
    let using: Vec<&str> = log.lines().filter(|l| l.contains("NET/Plugin: using")).collect();
    assert_eq!(using.len(), 1, "{log}");
    assert!(using[0].contains("Socket (rustccl net ABI v3) from built in"), "{log}");
    assert!(!log.contains("WARN"), "nothing worth a warning happened:\n{log}");
    assert!(!log.to_lowercase().contains("failed to find symbol"));
}

#[test]
fn none_disables_external_plugins() {
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", "none"), ("NCCL_TUNER_PLUGIN", "none")]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("external plugins disabled (NCCL_NET_PLUGIN=none)"), "{log}");
}

#[test]
fn a_path_loads_that_library() {
    let path = built_lib("librustccl_test_net_named.so");
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", &path)]);
    assert!(r[0].starts_with("net Loopback v1 /"), "{r:?}");
    assert!(r[0].ends_with("librustccl_test_net_named.so"));
    assert!(log.contains(&format!("NCCL_NET_PLUGIN={path}")), "the log says why: {log}");
}

#[test]
fn a_name_is_found_under_both_file_name_patterns() {
    let dir = std::env::temp_dir().join(format!("rustccl-plugin-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = built_lib("librustccl_test_net_named.so");
    for link in ["librustccl-net-loopy.so", "libnccl-net-viancclname.so"] {
        let _ = std::fs::remove_file(dir.join(link));
        std::os::unix::fs::symlink(&target, dir.join(link)).unwrap();
    }
    let ld = dir.to_string_lossy().into_owned();
    for name in ["loopy", "viancclname"] {
        let (r, _) = ok_run(&[("NCCL_NET_PLUGIN", name), ("LD_LIBRARY_PATH", &ld)]);
        assert!(r[0].starts_with("net Loopback v1"), "{name}: {r:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_plugin_warns_once_and_falls_back() {
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", "nosuchplugin")]);
    assert_eq!(r[0], "net Socket v3 built in");
    let warn: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warn.len(), 1, "{log}");
    assert!(warn[0].contains("skipped nosuchplugin: no such library (tried nosuchplugin, librustccl-net-nosuchplugin.so, libnccl-net-nosuchplugin.so)"), "{log}");
}

#[test]
fn a_plugin_whose_init_fails_is_skipped_for_the_next() {
    let list = format!("{},{}", built_lib("librustccl_test_net_init_fails.so"), built_lib("librustccl_test_net_named.so"));
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", &list)]);
    assert!(r[0].starts_with("net Loopback"), "{r:?}");
    assert!(log.contains("init failed: test plugin: init fails on purpose"), "{log}");
    let (r, _) = ok_run(&[("NCCL_NET_PLUGIN", &built_lib("librustccl_test_net_init_fails.so"))]);
    assert_eq!(r[0], "net Socket v3 built in", "falls back to the built-in");
}

#[test]
fn libraries_that_are_not_plugins_are_refused_with_the_reason() {
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", &built_lib("librustccl_test_not_a_plugin.so"))]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("exports no rustccl net plugin"), "{log}");
    let (r, log) = ok_run(&[("NCCL_NET_PLUGIN", &built_lib("librustccl_test_bad_layout.so"))]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("does not match this rustccl's net v1 ABI"), "{log}");
    let (_, log) = ok_run(&[("NCCL_NET_PLUGIN", "/etc/hostname")]);
    assert!(log.contains("skipped /etc/hostname"), "{log}");
}

#[test]
fn nccl_net_picks_by_name_and_an_unknown_name_fails_init_clearly() {
    let named = built_lib("librustccl_test_net_named.so");
    let (r, _) = ok_run(&[("NCCL_NET_PLUGIN", &named), ("NCCL_NET", "socket")]);
    assert_eq!(r[0], "net Socket v3 built in", "case-insensitive name match skips Loopback");
    let (_, _, out) = run(&[("NCCL_NET", "IB")]);
    let (code, msg) = out.error().expect("init must fail");
    assert_eq!(code, "InvalidUsage");
    assert!(msg.contains("no network plugin named \"IB\""), "{msg}");
}

#[test]
fn a_tuner_built_for_the_older_abi_still_loads() {
    let (r, log) = ok_run(&[("NCCL_TUNER_PLUGIN", &built_lib("librustccl_test_tuner_v1.so"))]);
    assert!(r[1].starts_with("tuner old-tuner v1 "), "{r:?}");
    assert_eq!(r[2], "best RING SIMPLE", "the v1 tuner's choice reaches the host");
    assert!(log.contains("TUNER/Plugin: using old-tuner (rustccl tuner ABI v1)"), "{log}");
    let (r, _) = ok_run(&[("NCCL_TUNER_PLUGIN", &built_lib("librustccl_tuner_default.so"))]);
    assert!(r[1].starts_with("tuner csv-table v2 "), "{r:?}");
}

#[test]
fn the_table_tuner_applies_its_rules() {
    let conf = std::env::temp_dir().join(format!("rustccl-tuner-{}.conf", std::process::id()));
    std::fs::write(&conf, "# rules\nallreduce,0,4294967295,tree,ll128,-1,-1,-1\n").unwrap();
    let conf_s = conf.to_string_lossy().into_owned();
    let (r, _) = ok_run(&[("NCCL_TUNER_PLUGIN", &built_lib("librustccl_tuner_default.so")), ("NCCL_TUNER_CONFIG_FILE", &conf_s)]);
    assert_eq!(r[2], "best TREE LL128", "{r:?}");
    let _ = std::fs::remove_file(conf);
}

#[test]
fn a_profiler_plugin_is_initialised_with_its_event_mask() {
    let trace = std::env::temp_dir().join(format!("rustccl-trace-{}.json", std::process::id()));
    let trace_s = trace.to_string_lossy().into_owned();
    let (r, _) = ok_run(&[
        ("NCCL_PROFILER_PLUGIN", &built_lib("librustccl_profiler_trace.so")),
        ("NCCL_PROFILE_EVENT_MASK", "0x3"),
        ("RUSTCCL_PROFILER_TRACE_FILE", &trace_s),
    ]);
    assert!(r.iter().any(|l| l == "profiler trace v3 mask 0x3"), "{r:?}");
    let text = std::fs::read_to_string(&trace).expect("the profiler wrote its trace at finalize");
    assert!(text.contains("traceEvents"), "{text}");
    let _ = std::fs::remove_file(trace);
}


/// A directory on `LD_LIBRARY_PATH` where the IB stub (a plugin named "IB",
/// `RUSTCCL_TEST_IB_DEVICES` devices) is the IB transport's library, `librustccl-net-ib.so`.
fn ib_transport_dir(test: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("rustccl-ib-order-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("librustccl-net-ib.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(built_lib("librustccl_test_net_ib_stub.so"), &link).unwrap();
    let ld = dir.to_string_lossy().into_owned();
    (dir, ld)
}

/// NCCL's order: with `NCCL_NET` unset, an IB transport with a usable device comes before
/// Socket; with no device it is passed over for Socket; `NCCL_NET` picks IB or Socket (any
/// case) whatever the devices; a name that is not there is an error listing what is.
#[test]
fn ib_comes_before_socket_when_it_has_a_device_and_nccl_net_chooses() {
    let (dir, ld) = ib_transport_dir("nccl-net");
    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld)]);
    assert!(r[0].starts_with("net IB v2 ") && r[0].ends_with("librustccl-net-ib.so"), "IB before Socket: {r:?}\n{log}");
    assert!(log.contains("NET/Plugin: using IB (rustccl net ABI v2)"), "{log}");
    assert!(log.contains("2 device(s): the IB transport (librustccl-net-ib.so), tried after external plugins and before Socket"), "{log}");
    assert!(!log.contains("WARN"), "{log}");

    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("RUSTCCL_TEST_IB_DEVICES", "0")]);
    assert_eq!(r[0], "net Socket v3 built in", "IB without a device is passed over: {log}");
    assert!(log.contains("it has no usable device (devices() = 0)"), "the log says why: {log}");
    assert!(!log.contains("WARN"), "an IB transport without a port is no warning: {log}");

    for name in ["Socket", "socket"] {
        let (r, _) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET", name)]);
        assert_eq!(r[0], "net Socket v3 built in", "NCCL_NET={name} even though IB has devices");
    }
    let (r, _) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET", "ib")]);
    assert!(r[0].starts_with("net IB v2 "), "NCCL_NET=ib: {r:?}");

    let (_, _, out) = run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET", "Libfabric")]);
    let (code, msg) = out.error().expect("init must fail");
    assert_eq!(code, "InvalidUsage");
    assert!(msg.contains("no network plugin named \"Libfabric\" is available"), "{msg}");
    assert!(msg.contains("the networks here are: IB (") && msg.contains("librustccl-net-ib.so), Socket (built in)"), "{msg}");

    let (_, _, out) = run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET", "IB"), ("RUSTCCL_TEST_IB_DEVICES", "0")]);
    let (_, msg) = out.error().expect("IB asked for but without a device: init must fail");
    assert!(msg.contains("no network plugin named \"IB\" could be used") && msg.contains("it has no usable device"), "{msg}");
    let _ = std::fs::remove_dir_all(dir);
}

/// External plugins (`NCCL_NET_PLUGIN`) still come before the IB transport, and `none` leaves
/// out only them, as in NCCL.
#[test]
fn external_plugins_come_before_the_ib_transport() {
    let (dir, ld) = ib_transport_dir("external");
    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET_PLUGIN", &built_lib("librustccl_test_net_named.so"))]);
    assert!(r[0].starts_with("net Loopback v1 "), "{r:?}\n{log}");
    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("NCCL_NET_PLUGIN", "none")]);
    assert!(r[0].starts_with("net IB v2 "), "none leaves out external plugins only: {r:?}\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The IB transport as cargo builds it, `librustccl_net_ib.so`, is found on the loader's path
/// too (the stub under that name here).
#[test]
fn the_ib_transport_is_found_under_cargos_name_on_the_loader_path() {
    let dir = std::env::temp_dir().join(format!("rustccl-ib-cargo-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("librustccl_net_ib.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(built_lib("librustccl_test_net_ib_stub.so"), &link).unwrap();
    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &dir.to_string_lossy())]);
    assert_eq!(r[0], format!("net IB v2 {}", link.display()), "{log}");
    assert!(log.contains("2 device(s): the IB transport (librustccl_net_ib.so), tried after external plugins and before Socket"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// With nothing on the loader's path, the IB transport cargo built beside the worker
/// (`target/release/librustccl_net_ib.so`) is the one tried; on a machine without RDMA (no
/// device, no `ib_uverbs`, or no libibverbs) it is passed over for Socket with one INFO line
/// and no warning, as NCCL passes over its IB. `NCCL_NET=IB` then fails, saying why.
#[test]
fn the_ib_transport_beside_the_worker_is_passed_over_quietly_without_rdma() {
    if std::path::Path::new("/sys/class/infiniband").exists() {
        println!("SKIPPED: this machine has RDMA devices (/sys/class/infiniband), so IB may be usable here");
        return;
    }
    let beside = worker_path().parent().unwrap().join("librustccl_net_ib.so");
    let (r, log) = ok_run(&[]);
    assert_eq!(r[0], "net Socket v3 built in", "{log}");
    let skipped: Vec<&str> = log.lines().filter(|l| l.contains(&format!("NET/Plugin: skipped IB ({})", beside.display()))).collect();
    assert_eq!(skipped.len(), 1, "one line says why IB was passed over: {log}");
    assert!(skipped[0].contains("INFO"), "{log}");
    assert!(!log.contains("WARN"), "no RDMA here is no warning:\n{log}");
    let (_, _, out) = run(&[("NCCL_NET", "IB")]);
    let (code, msg) = out.error().expect("IB asked for without RDMA: init must fail");
    assert_eq!(code, "InvalidUsage");
    assert!(msg.contains(&format!("no network plugin named \"IB\" could be used (IB ({})", beside.display())), "{msg}");
}

/// An IB transport nobody asked for (`NCCL_NET` unset) that turns out unusable logs its
/// warnings as INFO (the usual case without RDMA); one that is used, or asked for by
/// `NCCL_NET=IB`, keeps them as warnings.
#[test]
fn the_ib_transports_warnings_are_info_only_when_it_was_probed_unasked_and_unusable() {
    let (dir, ld) = ib_transport_dir("warnings");
    let warn = ("RUSTCCL_TEST_IB_WARN", "IB stub: no RDMA stack here");
    let lines = |log: &str| log.lines().filter(|l| l.contains(warn.1)).map(str::to_string).collect::<Vec<_>>();

    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld), ("RUSTCCL_TEST_IB_DEVICES", "0"), warn]);
    assert_eq!(r[0], "net Socket v3 built in");
    let l = lines(&log);
    assert!(l.len() == 1 && l[0].contains(" INFO "), "unasked and unusable: INFO\n{log}");
    assert!(!log.contains("WARN"), "{log}");

    let (r, log) = ok_run(&[("LD_LIBRARY_PATH", &ld), warn]);
    assert!(r[0].starts_with("net IB v2 "), "{r:?}");
    let l = lines(&log);
    assert!(l.len() == 1 && l[0].contains(" WARN "), "used: its warning stays\n{log}");

    let (_, _, out) = run(&[("LD_LIBRARY_PATH", &ld), ("RUSTCCL_TEST_IB_DEVICES", "0"), ("NCCL_NET", "IB"), warn]);
    let l = lines(&out.stderr);
    assert!(l.len() == 1 && l[0].contains(" WARN "), "asked for by NCCL_NET: its warning stays\n{}", out.stderr);
    let _ = std::fs::remove_dir_all(dir);
}

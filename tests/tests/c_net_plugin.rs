//! NCCL C net plugins, loaded through the host's C adapter: the C test plugin "CTcp"
//! (`plugins/testing/c-net-tcp`, compiled here with `cc`) and its broken builds.
//!
//! Loader rules, each in a one-rank process of its own (they read the environment): the
//! newest table a library exports wins and the INFO line names its ABI; a v6-only library
//! loads as v6; a plugin whose init fails, whose table is malformed (NULL member, NULL name),
//! that only exports a version newer than rustccl knows, or whose device offloads to the GPU is
//! refused with one line and the next candidate is used; a library that also exports CollNet
//! gets one line saying CollNet is not supported. Then real traffic: the collective matrix over
//! the C plugin (v11 and v6 builds) with shared memory disabled, as processes of one host and
//! across two network namespaces; a short all_reduce between two processes over each of the
//! builds whose newest table is v7, v8, v9, v10 and v12. Virtual devices: with
//! `NCCL_NET_FORCE_MERGE` naming CTcp's two devices the communicator runs over the virtual
//! device the plugin made; a spec naming an unknown device, or a plugin that cannot fuse, gets
//! one warning and runs unmerged.

use std::time::Duration;

use rustccl_tests::*;

fn ctcp(variant: &str) -> String {
    c_net_plugin(variant).to_string_lossy().into_owned()
}

/// A one-rank communicator with `env`; returns (RESULT lines, log).
fn run(env: &[(&str, &str)]) -> (Vec<String>, String) {
    let ids = ids_arg(&[new_id()]);
    let mut all = vec![("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET,PLUGIN")];
    all.extend_from_slice(env);
    let out = spawn("plugins", 1, &[0], &ids, &all).pop().unwrap().finish(Duration::from_secs(60));
    assert!(out.ok(), "{out:?}");
    (out.results().iter().map(|s| s.to_string()).collect(), out.stderr.clone())
}

fn using_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("NET/Plugin: using")).collect()
}

#[test]
fn the_newest_table_wins_and_the_log_names_its_abi() {
    let path = ctcp("v11");
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &path)]);
    assert_eq!(r[0], format!("net CTcp v11 {path}"), "v11 is chosen over the v6 table the library also exports");
    let using = using_lines(&log);
    assert_eq!(using.len(), 1, "{log}");
    assert!(using[0].contains(&format!("using CTcp (NCCL C net ABI v11) from {path}")), "{log}");
    assert!(using[0].contains(&format!("NCCL_NET_PLUGIN={path}")), "the line says why: {log}");
    // The plugin's own lines came through the variadic logger, formatted.
    assert!(log.contains("CTcp: net ABI v11 initialised on lo"), "{log}");
    assert!(log.contains("traffic class -1"), "{log}");
}

#[test]
fn a_v6_only_library_loads_as_v6() {
    let path = ctcp("v6");
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &path)]);
    assert_eq!(r[0], format!("net CTcp v6 {path}"));
    assert!(using_lines(&log)[0].contains("CTcp (NCCL C net ABI v6)"), "{log}");
    assert!(log.contains("CTcp: net ABI v6 initialised"), "{log}");
}

#[test]
fn a_plugin_whose_init_fails_is_skipped_for_the_next() {
    let list = format!("{},{}", ctcp("init-fails"), ctcp("v6"));
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &list)]);
    assert!(r[0].starts_with("net CTcp v6 ") && r[0].ends_with("libctcp-v6.so"), "{r:?}");
    assert!(log.contains("CTcp: init fails on purpose (test build, net ABI v11)"), "the plugin's own warning: {log}");
    let skipped: Vec<&str> = log.lines().filter(|l| l.contains("skipped") && l.contains("libctcp-init-fails.so")).collect();
    assert_eq!(skipped.len(), 1, "{log}");
    assert!(skipped[0].contains("init failed: NET/CTcp: init returned ncclSystemError"), "{log}");
}

#[test]
fn malformed_tables_are_refused_with_the_reason() {
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &ctcp("malformed"))]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("its ncclNetPlugin_v11 table (CTcp) is malformed: NULL test"), "{log}");
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &ctcp("null-name"))]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("its ncclNetPlugin_v11 table is malformed: its name is NULL"), "{log}");
}

#[test]
fn a_version_newer_than_known_is_refused_and_the_next_candidate_used() {
    let list = format!("{},{}", ctcp("only-v13"), ctcp("v11"));
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &list)]);
    assert!(r[0].starts_with("net CTcp v11 "), "{r:?}");
    assert!(log.contains("it exports only ncclNetPlugin_v13, newer than the NCCL C net ABIs this rustccl knows (v6..v12)"), "{log}");
}

#[test]
fn a_device_offload_network_is_refused() {
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &ctcp("offload"))]);
    assert_eq!(r[0], "net Socket v3 built in");
    assert!(log.contains("device 0 is a device-offload network (netDeviceType 1)"), "{log}");
}

#[test]
fn collnet_is_noted_once_and_the_net_table_still_loads() {
    let (r, log) = run(&[("NCCL_NET_PLUGIN", &ctcp("collnet"))]);
    assert!(r[0].starts_with("net CTcp v11 "), "{r:?}");
    let notes: Vec<&str> = log.lines().filter(|l| l.contains("CollNet is not supported")).collect();
    assert_eq!(notes.len(), 1, "{log}");
    assert!(notes[0].contains("ncclCollNetPlugin_v11"), "{log}");
}

/// Every rank succeeded, checked the same non-zero number of cases, and used CTcp `abi`.
fn check_matrix(what: &str, out: &[Outcome], abi: &str) {
    let mut cases = Vec::new();
    for o in out {
        assert!(o.ok(), "{what}: rank {} failed\nstdout:\n{}\nstderr:\n{}", o.rank, o.stdout, o.stderr);
        assert!(o.stderr.contains(&format!("using CTcp ({abi})")), "{what}: rank {} did not use CTcp: {}", o.rank, o.stderr);
        assert!(!o.stderr.contains("receives in flight"), "{what}: rank {} closed a connection with receives posted: {}", o.rank, o.stderr);
        let line = o.results().into_iter().find(|l| l.starts_with("checked ")).expect("a result line");
        let n: usize = line.split_whitespace().nth(1).and_then(|w| w.parse().ok()).expect("case count");
        cases.push(n);
    }
    assert!(cases[0] > 0 && cases.iter().all(|&n| n == cases[0]), "{what}: {cases:?}");
}

#[test]
fn the_matrix_runs_over_the_c_plugin_between_processes() {
    for (variant, abi, nranks, colls) in
        [("v11", "NCCL C net ABI v11", 3, None), ("v6", "NCCL C net ABI v6", 2, Some("AllReduce,AllGather,SendRecv"))]
    {
        let path = ctcp(variant);
        let ids = ids_arg(&[new_id()]);
        let mut env = vec![
            ("NCCL_NET_PLUGIN", path.as_str()),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "NET"),
            ("COLL_ROOTS", "one"),
            // NCCL closes no connection with receives posted; nor may rustccl (issue 31).
            ("CTCP_CHECK_CLOSE", "1"),
        ];
        if let Some(c) = colls {
            env.push(("COLL_COLLS", c));
        }
        let ranks: Vec<i32> = (0..nranks).collect();
        let out = finish_all(spawn("coll-matrix", nranks, &ranks, &ids, &env), Duration::from_secs(180));
        check_matrix(&format!("CTcp {variant}, {nranks} ranks"), &out, abi);
    }
}

#[test]
fn the_matrix_runs_over_the_c_plugin_across_two_namespaces() {
    let Some(nodes) = Nodes::for_test("rctc", 215) else { return };
    let path = ctcp("v11");
    let comm_id = format!("{}:29519", nodes.addr[0]);
    let mut procs = Vec::new();
    for rank in 0..4 {
        let mut cmd = nodes.rank_command("coll-matrix", 4, rank, &comm_id);
        cmd.env("NCCL_NET_PLUGIN", &path)
            .env("NCCL_SHM_DISABLE", "1")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "NET")
            .env("COLL_ROOTS", "one")
            .env("CTCP_CHECK_CLOSE", "1")
            .env("COLL_EXPECT_HOSTS", "2");
        procs.push(spawn_command(rank, cmd));
    }
    let out = finish_all(procs, Duration::from_secs(180));
    check_matrix("CTcp across two namespaces", &out, "NCCL C net ABI v11");
    for (rank, o) in out.iter().enumerate() {
        let dev = &nodes.dev[rank / 2];
        assert!(o.stderr.contains(&format!("CTcp: net ABI v11 initialised on {dev}")), "rank {rank}: {}", o.stderr);
    }
}

/// A short all_reduce (sum, float32, three sizes) between two processes over CTcp `variant`,
/// with shared memory disabled so that every byte crosses the plugin (`extra` adds to or
/// overrides the environment).
fn short_all_reduce(variant: &str, extra: &[(&str, &str)]) -> Vec<Outcome> {
    let path = ctcp(variant);
    let ids = ids_arg(&[new_id()]);
    let mut env = vec![
        ("NCCL_NET_PLUGIN", path.as_str()),
        ("NCCL_SOCKET_IFNAME", "lo"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "NET"),
        ("COLL_COLLS", "AllReduce"),
        ("COLL_OPS", "sum"),
        ("COLL_DTYPES", "float32"),
        ("COLL_COUNTS", "1,1001,262144"),
        ("COLL_LARGE", "none"),
        ("COLL_ROOTS", "one"),
    ];
    env.extend_from_slice(extra);
    finish_all(spawn("coll-matrix", 2, &[0, 1], &ids, &env), Duration::from_secs(120))
}

fn count_lines(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// nccl-fastsocket's connection setup and completion, reproduced by CTcp's `async-setup`
/// build: connect returns no comm at first and connects in the background, accept blocks
/// until the peer has connected (10 s at most, then fails), test never writes the sizes
/// received. Two processes, shared memory disabled: all_reduce over sizes from one element to
/// several FIFO slots and channels, sendrecv, and a suspend/resume halfway (whose connections
/// are made again the same way); every result checked.
#[test]
fn asynchronous_setup_a_blocking_accept_and_unreported_sizes_run_the_collectives() {
    let out = short_all_reduce(
        "async-setup",
        &[
            ("COLL_COLLS", "AllReduce,SendRecv"),
            ("COLL_COUNTS", "1,1001,262144,1048583"),
            ("COLL_SUSPEND", "1"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ],
    );
    check_matrix("CTcp async-setup", &out, "NCCL C net ABI v11");
    for o in &out {
        assert!(!o.stderr.contains("accept waited"), "rank {}: an accept came before the peer's connect: {}", o.rank, o.stderr);
        assert!(o.stderr.contains("resumed"), "rank {}: the suspend/resume did not run: {}", o.rank, o.stderr);
    }
}

#[test]
fn each_table_version_loads_and_all_reduces_between_two_processes() {
    for v in [7, 8, 9, 10, 12] {
        let abi = format!("NCCL C net ABI v{v}");
        let out = short_all_reduce(&format!("v{v}"), &[]);
        check_matrix(&format!("CTcp v{v}"), &out, &abi);
        for o in &out {
            assert!(o.stderr.contains(&format!("CTcp: net ABI v{v} initialised on lo")), "v{v}: {}", o.stderr);
            assert!(o.stderr.contains(&format!("using CTcp ({abi}) from {}, 2 device(s)", ctcp(&format!("v{v}")))), "{}", o.stderr);
        }
    }
}

#[test]
fn force_merge_fuses_the_two_devices_and_the_all_reduce_runs_over_the_virtual_one() {
    for (variant, abi) in [("v12", "NCCL C net ABI v12"), ("v11", "NCCL C net ABI v11")] {
        let out = short_all_reduce(variant, &[("NCCL_NET_FORCE_MERGE", "lo,ctcp-lo")]);
        check_matrix(&format!("CTcp {variant} fused"), &out, abi);
        for o in &out {
            let log = &o.stderr;
            let made = "NCCL_NET_FORCE_MERGE=lo,ctcp-lo: made virtual device 2 'lo+ctcp-lo' of devices 0 'lo', 1 'ctcp-lo' \
                        (its vProps list [0, 1]); the network's devices are now the plugin's [2]";
            assert_eq!(count_lines(log, made), 1, "{variant} rank {}: {log}", o.rank);
            assert!(log.contains(&format!("using CTcp ({abi}) from {}, 1 device(s)", ctcp(variant))), "{log}");
            // The transport's connections listen on the virtual device (on each member in turn).
            assert!(log.contains("CTcp: virtual device 2 (lo+ctcp-lo) listens on its member 0 (lo)"), "{log}");
            assert!(log.contains("CTcp: virtual device 2 (lo+ctcp-lo) listens on its member 1 (ctcp-lo)"), "{log}");
            assert!(!log.lines().any(|l| l.contains("WARN") && l.contains("FORCE_MERGE")), "{log}");
        }
    }
}

#[test]
fn a_bad_force_merge_gets_one_warning_and_runs_unmerged() {
    let cases = [
        ("v12", "lo,eth9", "is ignored: no device is named \"eth9\" (its devices, name:port, are lo:0, ctcp-lo:0)"),
        ("v12", "lo,lo", "is ignored: device \"lo\" is named twice"),
        ("no-vdevice", "lo,ctcp-lo", "is ignored: this plugin cannot fuse devices (its ncclNetPlugin_v11 table's makeVDevice is NULL)"),
        ("v8", "lo,ctcp-lo", "is ignored: this plugin cannot fuse devices (NCCL C net ABI v8 predates makeVDevice)"),
    ];
    for (variant, spec, why) in cases {
        let out = short_all_reduce(variant, &[("NCCL_NET_FORCE_MERGE", spec)]);
        let abi = if variant == "no-vdevice" { "NCCL C net ABI v11".to_string() } else { format!("NCCL C net ABI v{}", &variant[1..]) };
        check_matrix(&format!("CTcp {variant} with {spec}"), &out, &abi);
        for o in &out {
            let log = &o.stderr;
            let warns: Vec<&str> = log.lines().filter(|l| l.contains("NCCL_NET_FORCE_MERGE")).collect();
            assert_eq!(warns.len(), 1, "{variant} {spec}: {log}");
            assert!(warns[0].contains("WARN") && warns[0].contains(why), "{variant} {spec}: {log}");
            assert!(warns[0].contains("running on its 2 device(s) unmerged"), "{log}");
            assert!(log.contains("2 device(s)"), "{log}");
            assert!(!log.contains("virtual device"), "{log}");
        }
    }
}

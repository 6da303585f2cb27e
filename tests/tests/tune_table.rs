//! `rustccl-bench --tune` end to end on the host backend: a tiny sweep on 2 ranks writes the
//! table as CSV and JSON, and a communicator whose `csv-table` tuner reads either file makes
//! the table's choice at each size (the planner's choice, printed by the rank worker).
//! Channels are swept at 3 only, which the cost model alone never picks below 2 MiB, so a
//! table that was not applied cannot pass.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use rustccl_tests::*;

const SIZES: [u64; 3] = [4096, 65536, 1048576];

fn target_file(name: &str) -> PathBuf {
    let dir = worker_path().parent().unwrap().to_path_buf();
    let path = [dir.join(name), dir.join("deps").join(name)].into_iter().find(|p| p.exists());
    path.unwrap_or_else(|| panic!("{name} is not built in {}; run `cargo build --release` first", dir.display()))
}

/// The planner's choice per size (`<ALGO> <PROTO> <channels>`) for 2 ranks with `env`.
fn choices(env: &[(&str, &str)]) -> Vec<String> {
    let sizes: Vec<String> = SIZES.iter().map(u64::to_string).collect();
    let sizes = sizes.join(",");
    let mut all = vec![("RUSTCCL_TEST_SIZES", sizes.as_str()), ("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "TUNING")];
    all.extend_from_slice(env);
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids_arg(&[new_id()]), &all), Duration::from_secs(90));
    assert_all_ok(&outs);
    assert!(outs[0].stderr.contains("csv-table") || !env.iter().any(|(k, _)| *k == "NCCL_TUNER_CONFIG_FILE"), "{}", outs[0].stderr);
    outs[0]
        .results()
        .iter()
        .filter_map(|l| l.strip_prefix("choice "))
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect()
}

/// What the CSV table says for an all-reduce of `bytes` on 2 ranks, as the planner prints it.
fn table_choice(csv: &str, bytes: u64) -> String {
    for line in csv.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split(',').collect();
        let (min, max): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        if f[0] == "allreduce" && (min..=max).contains(&bytes) {
            assert_eq!((f[6], f[7]), ("1", "2"), "measured on one node, 2 ranks: {line}");
            return format!("{} {} {}", f[3].to_uppercase(), f[4].to_uppercase(), f[5]);
        }
    }
    panic!("no allreduce rule covers {bytes} in\n{csv}");
}

#[test]
fn the_bench_writes_a_table_that_the_table_tuner_applies() {
    let dir = std::env::temp_dir().join(format!("rustccl-tune-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("table");
    let out = Command::new(target_file("rustccl-bench"))
        .args(["--tune", "all_reduce", "-N", "2", "-b", "4K", "-e", "1M", "-f", "16", "-n", "2", "-w", "1"])
        .args(["--tune-channels", "3", "--tune-out"])
        .arg(&prefix)
        .env("RUSTCCL_BACKEND", "host")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .expect("run rustccl-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for candidate in ["all_reduce ring/ll x3", "all_reduce tree/simple x3"] {
        assert!(stdout.contains(&format!("# {candidate}: 3 sizes")), "every candidate measured: {stdout}");
    }
    let csv_path = prefix.with_extension("csv");
    let json_path = prefix.with_extension("json");
    let csv = std::fs::read_to_string(&csv_path).expect("the CSV table");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the JSON table")).unwrap();
    let rules = json["rules"].as_array().unwrap();
    assert_eq!(rules.len(), csv.lines().filter(|l| !l.starts_with('#')).count(), "{csv}\n{json}");
    assert_eq!(json["measurements"].as_array().unwrap().len(), 2 * 3 * SIZES.len(), "ring and tree x 3 protocols x 3 sizes");
    let want: Vec<String> = SIZES.iter().map(|&b| table_choice(&csv, b)).collect();

    let base = choices(&[("NCCL_TUNER_PLUGIN", "none")]);
    assert!(base.iter().all(|c| c.ends_with(" 1")), "the cost model alone uses 1 channel here: {base:?}");
    let plugin = target_file("librustccl_tuner_default.so");
    let plugin = plugin.to_string_lossy();
    for table in [&csv_path, &json_path] {
        let table = table.to_string_lossy();
        let got = choices(&[("NCCL_TUNER_PLUGIN", &plugin), ("NCCL_TUNER_CONFIG_FILE", &table)]);
        assert_eq!(got, want, "{table}:\n{csv}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `COLL` TRACE line of rank `rank`'s all-reduce of `bytes`: its way and who chose it.
fn way_of(log: &str, bytes: usize) -> String {
    let key = format!("AllReduce {bytes} B: way=");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&key)).collect();
    assert_eq!(lines.len(), 1, "one way line for {bytes} B:\n{log}");
    lines[0].split_once(&key).unwrap().1.trim().to_string()
}

/// Issue 31 item 6: where a tuner's table speaks for a call (Tree/Simple on 2 channels for
/// all-reduces of 4-64 KiB), the ways around the planner step aside — the board of small
/// calls in shared memory would take 4-32 KiB on 2 ranks as processes — and the planner runs
/// the tuner's choice at every size of the range; outside it rustccl's own way runs (the
/// board below, single copies between the ranks' buffers above). Each rank's TRACE `COLL` lines say so; the worker
/// checks every result.
#[test]
fn a_tuner_table_decides_every_way_inside_its_range_only() {
    let dir = std::env::temp_dir().join(format!("rustccl-tune-ways-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("ways.csv");
    std::fs::write(&table, "allreduce,4096,65536,tree,simple,2,-1,-1,-1,-1\n").unwrap();
    let plugin = target_file("librustccl_tuner_default.so");
    let sizes = [1024usize, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 1048576];
    let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let list = list.join(",");
    let env = [
        ("RUSTCCL_TEST_SIZES", list.as_str()),
        ("NCCL_DEBUG", "TRACE"),
        ("NCCL_DEBUG_SUBSYS", "COLL"),
        ("NCCL_TUNER_PLUGIN", &*plugin.to_string_lossy()),
        ("NCCL_TUNER_CONFIG_FILE", &*table.to_string_lossy()),
    ];
    let outs = finish_all(spawn("tuned-sizes", 2, &[0, 1], &ids_arg(&[new_id()]), &env), Duration::from_secs(90));
    assert_all_ok(&outs);
    for out in &outs {
        for bytes in sizes {
            let way = way_of(&out.stderr, bytes);
            if (4096..=65536).contains(&bytes) {
                assert_eq!(way, "planner TREE/SIMPLE 2 ch chosen by tuner csv-table", "{bytes} B, inside the table's range");
            } else if bytes <= 2048 {
                assert_eq!(way, "board chosen by rustccl", "{bytes} B, below the range: the board, as without a tuner");
            } else {
                assert_eq!(way, "single-copy chosen by rustccl", "{bytes} B, above the range: a single copy between the buffers, as without a tuner");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every `COLL` TRACE way line of `log`, as (collective, way and who chose).
fn ways(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter_map(|l| {
            let (head, way) = l.split_once(" B: way=")?;
            let kind = head.rsplit(' ').nth(1)?;
            Some((kind.to_string(), way.trim().to_string()))
        })
        .collect()
}

/// The symmetric paths' CPU twin and the single copies step aside too: a table that speaks
/// for every all-gather (Ring/Simple/2) sends each one to the planner, on symmetric windows
/// and off them (where large parts would be single copies), while the all-reduces, for which
/// it is silent, take rustccl's ways. Without the table the same all-gathers take the board
/// or the symmetric path, so the check means something. The matrix worker checks every result.
#[test]
fn a_tuner_table_steps_the_symmetric_paths_the_board_and_single_copies_aside() {
    let dir = std::env::temp_dir().join(format!("rustccl-tune-aside-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("aside.csv");
    std::fs::write(&table, "allgather,0,18446744073709551615,ring,simple,2,-1,-1,-1,-1\n").unwrap();
    let plugin = target_file("librustccl_tuner_default.so");
    let (plugin, table_s) = (plugin.to_string_lossy(), table.to_string_lossy());
    for windows in ["0", "1"] {
        let run = |tuner: &[(&str, &str)]| {
            let mut env = vec![
                ("COLL_COLLS", "AllGather,AllReduce"),
                ("COLL_OPS", "sum"),
                ("COLL_DTYPES", "float32"),
                ("COLL_COUNTS", "1,1001"),
                ("COLL_LARGE", "float32"),
                ("COLL_WINDOWS", windows),
                ("NCCL_DEBUG", "TRACE"),
                ("NCCL_DEBUG_SUBSYS", "COLL"),
            ];
            env.extend_from_slice(tuner);
            let outs = finish_all(spawn("coll-matrix", 2, &[0, 1], &ids_arg(&[new_id()]), &env), Duration::from_secs(90));
            assert_all_ok(&outs);
            outs.iter().map(|o| ways(&o.stderr)).collect::<Vec<_>>()
        };
        let usual = if windows == "1" { "symmetric-cpu chosen by rustccl" } else { "board chosen by rustccl" };
        for rank in run(&[("NCCL_TUNER_PLUGIN", "none")]) {
            assert!(rank.iter().any(|(k, w)| k == "AllGather" && w == usual), "windows={windows}, no tuner: {rank:?}");
        }
        for rank in run(&[("NCCL_TUNER_PLUGIN", &plugin), ("NCCL_TUNER_CONFIG_FILE", &table_s)]) {
            let gathers: Vec<&String> = rank.iter().filter(|(k, _)| k == "AllGather").map(|(_, w)| w).collect();
            assert!(gathers.len() >= 3, "windows={windows}: {rank:?}");
            assert!(gathers.iter().all(|w| *w == "planner RING/SIMPLE 2 ch chosen by tuner csv-table"), "windows={windows}: {rank:?}");
            let reduces: Vec<&String> = rank.iter().filter(|(k, _)| k == "AllReduce").map(|(_, w)| w).collect();
            assert!(reduces.iter().all(|w| w.ends_with("chosen by rustccl")), "windows={windows}: {rank:?}");
            assert!(reduces.iter().any(|w| *w == usual), "windows={windows}: the table is silent for all-reduces: {rank:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

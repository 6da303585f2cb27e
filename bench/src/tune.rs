//! `rustccl-bench --tune`: measures, on the machine it runs on, every algorithm × protocol ×
//! channel count for each tuned collective over the size ladder, and writes the fastest per
//! size range as a rule table for the `csv-table` tuner (`plugins/tuner-default`), in NCCL's
//! CSV form and as JSON (`--tune-out <prefix>` → `<prefix>.csv`, `<prefix>.json`).
//!
//! Each candidate is one ordinary sweep (this program started again, ranks and all) with the
//! choice forced the way an operator would force it: `NCCL_ALGO`, `NCCL_PROTO`, and
//! `NCCL_MIN_CTAS` = `NCCL_MAX_CTAS` = the channel count; `NCCL_TUNER_PLUGIN=none` so that an
//! installed tuner does not skew it. A candidate whose sweep fails (a pairing the library
//! cannot run) is left out with a line saying so. Per size the lowest out-of-place time wins;
//! neighbouring sizes with the same winner become one rule. A rule covers the sizes above the
//! measured size below it up to its own size; the first starts at 0 and the last runs to
//! the largest size (u64::MAX), so every message size matches one rule. Rules carry
//! `nNodes` = 1 and `nRanks` = the ranks measured: a table applies to the shape it was
//! measured on (edit them to `-1` to apply it more widely).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::ops::Coll;
use crate::opts::Options;

/// The collectives a tuner sees (NCCL tunes these five).
pub const TUNED: [Coll; 5] = [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast, Coll::Reduce];

const PROTOCOLS: [&str; 3] = ["ll", "ll128", "simple"];

/// One measured (collective, size) point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub coll: Coll,
    pub size: u64,
    pub algo: &'static str,
    pub proto: &'static str,
    pub channels: u32,
    pub time_us: f64,
}

/// One rule of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub coll: Coll,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub algo: &'static str,
    pub proto: &'static str,
    pub channels: u32,
    pub time_us: f64,
}

/// The name the rule tables use for a collective (`allreduce`).
pub fn table_name(c: Coll) -> String {
    c.name().replace('_', "")
}

/// The algorithms worth measuring for a collective: tree exists for all-reduce only.
pub fn algorithms(c: Coll) -> &'static [&'static str] {
    match c {
        Coll::AllReduce => &["ring", "tree"],
        _ => &["ring"],
    }
}

/// The channel counts to try: `--tune-channels`, else powers of two up to the backend's
/// most channels (32 with `--lib`, whose library decides).
fn channel_counts(o: &Options) -> Result<Vec<u32>, String> {
    if !o.tune_channels.is_empty() {
        return Ok(o.tune_channels.clone());
    }
    let most = match &o.lib {
        Some(_) => 32,
        None => rustccl::backend::select_backend().map_err(|e| format!("backend: {e}"))?.capabilities().max_channels,
    };
    Ok(std::iter::successors(Some(1u32), |c| Some(c * 2)).take_while(|&c| c <= most.max(1)).collect())
}

/// The fastest candidate per (collective, size), in collective then size order.
pub fn winners(points: &[Point]) -> Vec<Point> {
    let mut best: Vec<Point> = Vec::new();
    for p in points {
        match best.iter_mut().find(|b| b.coll == p.coll && b.size == p.size) {
            Some(b) if p.time_us < b.time_us => *b = p.clone(),
            Some(_) => {}
            None => best.push(p.clone()),
        }
    }
    best.sort_by_key(|p| (TUNED.iter().position(|c| *c == p.coll), p.size));
    best
}

/// Merges each collective's winners into size ranges covering 0..=u64::MAX.
pub fn rules(winners: &[Point]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    for (i, w) in winners.iter().enumerate() {
        let first = i == 0 || winners[i - 1].coll != w.coll;
        let last = i + 1 == winners.len() || winners[i + 1].coll != w.coll;
        let max_bytes = if last { u64::MAX } else { w.size };
        match out.last_mut() {
            Some(r) if !first && (r.algo, r.proto, r.channels) == (w.algo, w.proto, w.channels) => {
                r.max_bytes = max_bytes;
                r.time_us = r.time_us.max(w.time_us);
            }
            _ => out.push(Rule {
                coll: w.coll,
                min_bytes: if first { 0 } else { winners[i - 1].size + 1 },
                max_bytes,
                algo: w.algo,
                proto: w.proto,
                channels: w.channels,
                time_us: w.time_us,
            }),
        }
    }
    out
}

/// The table in NCCL's CSV rule format.
pub fn csv(rules: &[Rule], nranks: usize) -> String {
    let mut s = String::from(
        "# Made by rustccl-bench --tune. collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n",
    );
    for r in rules {
        s += &format!(
            "{},{},{},{},{},{},1,{nranks},-1,-1\n",
            table_name(r.coll),
            r.min_bytes,
            r.max_bytes,
            r.algo,
            r.proto,
            r.channels
        );
    }
    s
}

/// The table as JSON: the rules (the CSV's columns as fields) and every measurement.
pub fn json(rules: &[Rule], points: &[Point], nranks: usize, driver: &str) -> Value {
    json!({
        "generator": "rustccl-bench --tune",
        "driver": driver,
        "nNodes": 1,
        "nRanks": nranks,
        "rules": rules.iter().map(|r| json!({
            "collective": table_name(r.coll), "min_bytes": r.min_bytes, "max_bytes": r.max_bytes,
            "algorithm": r.algo, "protocol": r.proto, "channels": r.channels,
            "nNodes": 1, "nRanks": nranks, "numPipeOps": -1, "regBuff": -1,
        })).collect::<Vec<_>>(),
        "measurements": points.iter().map(|p| json!({
            "collective": table_name(p.coll), "size": p.size, "algorithm": p.algo,
            "protocol": p.proto, "channels": p.channels, "time_us": p.time_us,
        })).collect::<Vec<_>>(),
    })
}

/// The arguments of one candidate's sweep: the user's sweep settings, one collective,
/// float sums, a JSON report to `report`.
fn sweep_args(o: &Options, coll: Coll, report: &Path) -> Vec<String> {
    let mut a = vec![
        coll.name().to_string(),
        "-b".into(),
        o.min_bytes.to_string(),
        "-e".into(),
        o.max_bytes.to_string(),
        "-w".into(),
        o.warmup.to_string(),
        "-c".into(),
        o.check.to_string(),
        "-o".into(),
        "sum".into(),
        "-d".into(),
        "float".into(),
        "-r".into(),
        "0".into(),
        "-J".into(),
        report.to_string_lossy().into_owned(),
    ];
    if o.step_factor > 1 {
        a.extend(["-f".into(), o.step_factor.to_string()]);
    } else {
        a.extend(["-i".into(), o.step_bytes.to_string()]);
    }
    if !o.auto_iters {
        a.extend(["-n".into(), o.iters.to_string()]);
    }
    if o.nranks_given {
        a.extend(["-N".into(), o.nranks.to_string()]);
    }
    if o.timeout_s > 0 {
        a.extend(["-T".into(), o.timeout_s.to_string()]);
    }
    if o.local_register != 0 {
        a.extend(["-R".into(), o.local_register.to_string()]);
    }
    if let Some(l) = &o.lib {
        a.extend(["--lib".into(), l.clone()]);
    }
    if let Some(c) = &o.cudart {
        a.extend(["--cudart".into(), c.clone()]);
    }
    if o.host_memory {
        a.push("--host-memory".into());
    }
    a
}

/// A sweep's report: (ranks, driver, (size, out-of-place time) per row).
type Report = (usize, String, Vec<(u64, f64)>);

/// Reads a sweep's JSON report.
fn read_report(path: &Path) -> Result<Report, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("no report {}: {e}", path.display()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows = doc["results"].as_array().ok_or("the report has no results")?;
    let mut out = Vec::new();
    for r in rows {
        let size = r["size"].as_u64().ok_or("a row without a size")?;
        let t = r["out_of_place"]["time_us"].as_f64().ok_or("a row without a time")?;
        out.push((size, t));
    }
    let nranks = doc["nranks"].as_u64().unwrap_or(0) as usize;
    Ok((nranks, doc["driver"].as_str().unwrap_or("").to_string(), out))
}

/// Runs the whole sweep and writes the table. Returns the exit status.
pub fn run(o: &Options) -> i32 {
    match tune(o) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rustccl-bench --tune: {e}");
            1
        }
    }
}

fn tune(o: &Options) -> Result<(), String> {
    let prefix = o.tune_out.clone().unwrap_or_else(|| "rustccl-tuner".into());
    let colls: Vec<Coll> = o.ops.iter().copied().filter(|c| TUNED.contains(c)).collect();
    if colls.is_empty() {
        return Err(format!("none of {} is a tuned collective (all_reduce, all_gather, reduce_scatter, broadcast, reduce)", o.op_arg));
    }
    let channels = channel_counts(o)?;
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let tmp = std::env::temp_dir().join(format!("rustccl-tune-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let (mut points, mut nranks, mut driver) = (Vec::new(), 0, String::new());
    for &coll in &colls {
        for &algo in algorithms(coll) {
            for proto in PROTOCOLS {
                for &ch in &channels {
                    let report: PathBuf = tmp.join(format!("{}-{algo}-{proto}-{ch}.json", coll.name()));
                    let label = format!("{} {algo}/{proto} x{ch}", coll.name());
                    let status = Command::new(&exe)
                        .args(sweep_args(o, coll, &report))
                        .env("NCCL_ALGO", algo)
                        .env("NCCL_PROTO", proto)
                        .env("NCCL_MIN_CTAS", ch.to_string())
                        .env("NCCL_MAX_CTAS", ch.to_string())
                        .env("NCCL_TUNER_PLUGIN", "none")
                        .stdout(Stdio::null())
                        .status()
                        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
                    let rows = match status.success().then(|| read_report(&report)) {
                        Some(Ok(r)) => r,
                        Some(Err(e)) => {
                            println!("# {label}: left out ({e})");
                            continue;
                        }
                        None => {
                            println!("# {label}: left out (the sweep failed: {status})");
                            continue;
                        }
                    };
                    let _ = std::fs::remove_file(&report);
                    (nranks, driver) = (rows.0, rows.1);
                    let sum: f64 = rows.2.iter().map(|r| r.1).sum();
                    println!("# {label}: {} sizes, {sum:.1} us in all", rows.2.len());
                    points.extend(rows.2.into_iter().map(|(size, time_us)| Point { coll, size, algo, proto, channels: ch, time_us }));
                }
            }
        }
    }
    let _ = std::fs::remove_dir(&tmp);
    if points.is_empty() {
        return Err("no candidate ran; nothing to write".into());
    }
    let rules = rules(&winners(&points));
    let (csv_path, json_path) = (format!("{prefix}.csv"), format!("{prefix}.json"));
    std::fs::write(&csv_path, csv(&rules, nranks)).map_err(|e| format!("cannot write {csv_path}: {e}"))?;
    let doc = json(&rules, &points, nranks, &driver);
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
    std::fs::write(&json_path, text).map_err(|e| format!("cannot write {json_path}: {e}"))?;
    for r in &rules {
        println!(
            "# rule {} {}..={}: {}/{} x{} ({:.1} us at most)",
            table_name(r.coll),
            r.min_bytes,
            r.max_bytes,
            r.algo,
            r.proto,
            r.channels,
            r.time_us
        );
    }
    println!("# wrote {csv_path} and {json_path}: {} rules; use with NCCL_TUNER_PLUGIN=tuner-default NCCL_TUNER_CONFIG_FILE=<file>", rules.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(coll: Coll, size: u64, algo: &'static str, proto: &'static str, channels: u32, time_us: f64) -> Point {
        Point { coll, size, algo, proto, channels, time_us }
    }

    #[test]
    fn the_fastest_wins_and_neighbours_merge() {
        let pts = [
            p(Coll::AllReduce, 8, "ring", "simple", 1, 9.0),
            p(Coll::AllReduce, 8, "tree", "ll", 2, 3.0),
            p(Coll::AllReduce, 64, "tree", "ll", 2, 4.0),
            p(Coll::AllReduce, 64, "ring", "simple", 1, 5.0),
            p(Coll::AllReduce, 512, "ring", "simple", 1, 6.0),
            p(Coll::AllReduce, 512, "tree", "ll", 2, 8.0),
            p(Coll::Broadcast, 8, "ring", "ll", 1, 1.0),
        ];
        let r = rules(&winners(&pts));
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!((r[0].min_bytes, r[0].max_bytes, r[0].algo, r[0].proto, r[0].channels), (0, 64, "tree", "ll", 2));
        assert_eq!((r[1].min_bytes, r[1].max_bytes, r[1].algo), (65, u64::MAX, "ring"));
        assert_eq!((r[2].coll, r[2].min_bytes, r[2].max_bytes), (Coll::Broadcast, 0, u64::MAX));
        let text = csv(&r, 2);
        assert!(text.lines().nth(1) == Some("allreduce,0,64,tree,ll,2,1,2,-1,-1"), "{text}");
        let j = json(&r, &pts, 2, "test");
        assert_eq!(j["rules"][1]["min_bytes"], 65);
        assert_eq!(j["measurements"].as_array().unwrap().len(), pts.len());
    }
}

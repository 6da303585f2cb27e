//! `--plot`: the sweep of every library of the run as one SVG, time and bus bandwidth against
//! size (log-log, out-of-place), side by side, one line per library (and operation).
//!
//! With several `--lib`s the launcher runs the sweep once per library ([`series_runs`]); each
//! run's rank 0 writes its JSON document (the `--json` one) to the file [`ROWS_VAR`] names, and
//! the launcher reads them back ([`series_from_doc`]) and draws ([`write_svg`]).

use plotters::prelude::*;
use serde_json::Value;

use crate::opts::RUST_API_LIB;

/// The file a rank 0 writes its JSON document to, for the launcher's plot.
pub const ROWS_VAR: &str = "RUSTCCL_BENCH_ROWS";

/// One line of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    /// (size in bytes, time in us, bus bandwidth in GB/s), out-of-place.
    pub points: Vec<(f64, f64, f64)>,
}

/// One run of the sweep: the name its series get, and the arguments its ranks get.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesRun {
    pub label: String,
    /// `None`: the Rust API.
    pub lib: Option<String>,
    pub args: Vec<String>,
}

/// A short name for a `--lib` value: `rustccl` for the Rust API, else the path's last two
/// components (`build/libnccl.so.2`), which keep two builds of `libnccl.so.2` apart.
pub fn label(lib: &str) -> String {
    if lib == RUST_API_LIB {
        return "rustccl (Rust API)".into();
    }
    let parts: Vec<&str> = lib.trim_end_matches('/').rsplit('/').take(2).collect();
    format!("{} (C ABI)", parts.into_iter().rev().collect::<Vec<_>>().join("/"))
}

/// The flags the launcher handles itself and the ranks must not see again.
fn strip(args: &[String], drop_c_flags: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        i += 1;
        let with_value = |f: &str| a == f;
        let inline = |f: &str| a.starts_with(&format!("{f}="));
        if with_value("--lib") || with_value("--plot") || (drop_c_flags && with_value("--cudart")) {
            i += 1;
            continue;
        }
        if inline("--lib") || inline("--plot") || (drop_c_flags && (inline("--cudart") || a == "--host-memory")) {
            continue;
        }
        out.push(a.to_string());
    }
    out
}

/// One run per library of `libs` (just one, the Rust API, when none was given), each with
/// the arguments its ranks need: every `--lib` and `--plot` removed, its own `--lib` added
/// (and the C-only `--cudart` and `--host-memory` removed for the Rust API).
pub fn series_runs(libs: &[String], args: &[String]) -> Vec<SeriesRun> {
    let libs: Vec<String> = if libs.is_empty() { vec![RUST_API_LIB.to_string()] } else { libs.to_vec() };
    libs.iter()
        .map(|l| {
            let rust = l == RUST_API_LIB;
            let mut a = strip(args, rust);
            if !rust {
                a.push(format!("--lib={l}"));
            }
            SeriesRun { label: label(l), lib: (!rust).then(|| l.clone()), args: a }
        })
        .collect()
}

/// The series of one run's JSON document: one per operation (named `label` alone when the run
/// had one operation, `label op` otherwise); rows of other types and operators than the first
/// of each operation are left out, so that each line is one sweep.
pub fn series_from_doc(label: &str, doc: &Value) -> Vec<Series> {
    let rows = doc["results"].as_array().cloned().unwrap_or_default();
    let mut ops: Vec<String> = Vec::new();
    for r in &rows {
        let op = r["op"].as_str().unwrap_or("?").to_string();
        if !ops.contains(&op) {
            ops.push(op);
        }
    }
    ops.iter()
        .map(|op| {
            let mine: Vec<&Value> = rows.iter().filter(|r| r["op"].as_str() == Some(op.as_str())).collect();
            let first = mine.first().map(|r| (r["type"].clone(), r["redop"].clone(), r["root"].clone()));
            let points = mine
                .iter()
                .filter(|r| Some((r["type"].clone(), r["redop"].clone(), r["root"].clone())) == first)
                .filter_map(|r| {
                    let half = &r["out_of_place"];
                    Some((r["size"].as_f64()?, half["time_us"].as_f64()?, half["busbw_gbs"].as_f64()?))
                })
                .collect();
            let name = if ops.len() == 1 { label.to_string() } else { format!("{label} {op}") };
            Series { name, points }
        })
        .collect()
}

/// The range of positive values, widened to whole decades (a log axis needs both ends > 0).
fn decades(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi == 0.0 {
        return 0.1..10.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    lo..hi
}

/// The range of positive sizes, widened to powers of 4 (the size axis ticks at those).
fn octaves(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.filter(|v| v.is_finite() && *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi == 0.0 {
        return 1.0..4.0;
    }
    let lo = 4f64.powf((lo.log2() / 2.0).floor());
    let hi = 4f64.powf((hi.log2() / 2.0).ceil()).max(lo * 4.0);
    lo..hi
}

/// A size as an axis label: 8 B, 64 KiB, 16 MiB.
fn size_label(bytes: f64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in units {
        if bytes >= m as f64 {
            return format!("{} {u}", fmt_num(bytes / m as f64));
        }
    }
    format!("{} B", fmt_num(bytes))
}

fn fmt_num(v: f64) -> String {
    if v >= 10.0 || (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Writes `series` as two log-log panels (time, bus bandwidth) to `path`, under `title`.
pub fn write_svg(path: &str, title: &str, series: &[Series]) -> Result<(), String> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Err("--plot: the run produced no rows to plot".into());
    }
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 20))?;
        let panels = root.split_evenly((1, 2));
        let sizes = octaves(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
        type Pick = fn(&(f64, f64, f64)) -> f64;
        let panel_specs: [(&str, &str, Pick); 2] = [
            ("time", "time (us)", |p| p.1),
            ("bus bandwidth", "bus bandwidth (GB/s)", |p| p.2),
        ];
        for (area, (name, y_desc, pick)) in panels.iter().zip(panel_specs) {
            let ys = decades(series.iter().flat_map(|s| s.points.iter().map(pick)));
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{name} against size"), ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(sizes.clone().log_scale().base(4.0), ys.log_scale())?;
            chart
                .configure_mesh()
                .x_desc("size (bytes)")
                .y_desc(y_desc)
                .x_label_formatter(&|v| size_label(*v))
                .y_label_formatter(&|v| format!("{v}"))
                .draw()?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let pts: Vec<(f64, f64)> =
                    s.points.iter().map(|p| (p.0, pick(p))).filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite()).collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .position(if name == "time" { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::LowerRight })
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("--plot {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn each_run_gets_its_own_lib_and_no_plot() {
        let args = s(&["-N", "2", "--lib", "rustccl", "--lib=/x/build/libnccl.so.2", "--plot", "p.svg", "--host-memory", "--cudart=c.so"]);
        let runs = series_runs(&s(&["rustccl", "/x/build/libnccl.so.2"]), &args);
        assert_eq!(runs[0].label, "rustccl (Rust API)");
        assert_eq!(runs[0].lib, None);
        assert_eq!(runs[0].args, s(&["-N", "2"]));
        assert_eq!(runs[1].label, "build/libnccl.so.2 (C ABI)");
        assert_eq!(runs[1].args, s(&["-N", "2", "--host-memory", "--cudart=c.so", "--lib=/x/build/libnccl.so.2"]));
        assert_eq!(series_runs(&[], &s(&["--plot=a.svg"]))[0].args, Vec::<String>::new());
    }

    #[test]
    fn series_take_out_of_place_rows_per_operation() {
        let doc = serde_json::json!({"results": [
            {"op": "all_reduce", "size": 8, "type": "float", "redop": "sum", "root": -1,
             "out_of_place": {"time_us": 5.0, "busbw_gbs": 0.001}, "in_place": {"time_us": 9.0, "busbw_gbs": 9.0}},
            {"op": "all_reduce", "size": 8, "type": "int32", "redop": "sum", "root": -1,
             "out_of_place": {"time_us": 7.0, "busbw_gbs": 0.002}, "in_place": {"time_us": 9.0, "busbw_gbs": 9.0}},
            {"op": "broadcast", "size": 16, "type": "float", "redop": "none", "root": 0,
             "out_of_place": {"time_us": 6.0, "busbw_gbs": 0.003}, "in_place": {"time_us": 9.0, "busbw_gbs": 9.0}},
        ]});
        let got = series_from_doc("L", &doc);
        assert_eq!(got, vec![
            Series { name: "L all_reduce".into(), points: vec![(8.0, 5.0, 0.001)] },
            Series { name: "L broadcast".into(), points: vec![(16.0, 6.0, 0.003)] },
        ]);
    }

    #[test]
    fn axes_are_whole_decades_and_sizes_read_well() {
        assert_eq!(decades([3.0, 250.0].into_iter()), 1.0..1000.0);
        assert_eq!(decades([0.0].into_iter()), 0.1..10.0);
        assert_eq!(octaves([8.0, 64.0 * 1048576.0].into_iter()), 4.0..67108864.0);
        assert_eq!(size_label(8.0), "8 B");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(1.5 * 1048576.0), "1.5 MiB");
    }
}

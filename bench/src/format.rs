//! The report in nccl-tests' layout (`common.cu`'s format strings), and its JSON twin.

use rustccl::types::DataType;
use serde_json::{json, Value};

use crate::ops::{type_name, Coll, Redop};

/// One half of a row (out-of-place or in-place).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Half {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Mismatching elements over every rank; `None` when not checked (`N/A`).
    pub wrong: Option<u64>,
    /// Timed iterations it ran.
    pub iters: usize,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub coll: Coll,
    pub size: usize,
    pub count: usize,
    pub dtype: DataType,
    pub redop: Option<Redop>,
    pub root: i32,
    pub out_of_place: Half,
    pub in_place: Half,
}

/// The time as nccl-tests prints it: `%7.0f` from 10 ms, `%7.1f` from 100 us, else `%7.2f`.
pub fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// C's `%g`: 6 significant digits, trailing zeros dropped, exponent form below 1e-4 and from
/// 1e6.
pub fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mant), exp.abs())
    } else {
        strip(&format!("{:.*}", (5 - exp) as usize, x))
    }
}

/// The three lines of column titles.
pub fn table_header() -> [String; 3] {
    [
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
            "", "", "", "", ""
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  {:>5}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        ),
    ]
}

fn half_str(h: &Half) -> String {
    let wrong = match h.wrong {
        Some(w) => w.to_string(),
        None => "N/A".to_string(),
    };
    format!(
        "  {:>7}  {:>6.2}  {:>6.2}  {:>5}",
        time_str(h.time_us),
        h.algbw,
        h.busbw,
        wrong
    )
}

pub fn redop_name(r: Option<Redop>) -> &'static str {
    r.map(|r| r.name()).unwrap_or("none")
}

/// One table line.
pub fn row_line(r: &Row) -> String {
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        r.size,
        r.count,
        type_name(r.dtype),
        redop_name(r.redop),
        r.root,
        half_str(&r.out_of_place),
        half_str(&r.in_place)
    )
}

/// The footer: out-of-bounds count and average bus bandwidth.
pub fn footer(errors: u64, avg_busbw: f64) -> [String; 3] {
    [
        format!(
            "# Out of bounds values : {} {}",
            errors,
            if errors > 0 { "FAILED" } else { "OK" }
        ),
        format!("# Avg bus bandwidth    : {} ", fmt_g(avg_busbw)),
        "#".to_string(),
    ]
}

fn half_json(h: &Half) -> Value {
    json!({"time_us": h.time_us, "algbw_gbs": h.algbw, "busbw_gbs": h.busbw, "wrong": h.wrong, "iters": h.iters})
}

pub fn row_json(r: &Row) -> Value {
    json!({
        "op": r.coll.name(),
        "size": r.size,
        "count": r.count,
        "type": type_name(r.dtype),
        "redop": redop_name(r.redop),
        "root": r.root,
        "out_of_place": half_json(&r.out_of_place),
        "in_place": half_json(&r.in_place),
    })
}

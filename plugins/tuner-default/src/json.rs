//! The JSON form of the rule table (a file whose name ends in `.json`), as
//! `rustccl-bench --tune` writes it:
//!
//! ```json
//! { "rules": [ { "collective": "allreduce", "min_bytes": 0, "max_bytes": 65536,
//!                "algorithm": "tree", "protocol": "ll", "channels": 2,
//!                "nNodes": 1, "nRanks": 8, "numPipeOps": -1, "regBuff": -1 } ] }
//! ```
//!
//! A bare array of rules is accepted too; other top-level fields are ignored. Each rule has
//! the CSV columns as fields, with the same meaning and checks; `channels`, `nNodes`,
//! `nRanks`, `numPipeOps` and `regBuff` may be left out (`-1`). A rule that does not pass
//! is skipped with its position in `rules` (1-based) in place of a line number; a file
//! that is not JSON of this shape is an error.

use serde_json::Value;

use super::{parse_rule, LineError, ParsedConfig};

/// Columns in CSV order, and whether a rule may leave them out (then `-1`).
const COLUMNS: [(&str, bool); 10] = [
    ("collective", false),
    ("min_bytes", false),
    ("max_bytes", false),
    ("algorithm", false),
    ("protocol", false),
    ("channels", true),
    ("nNodes", true),
    ("nRanks", true),
    ("numPipeOps", true),
    ("regBuff", true),
];

/// One rule object as the CSV line it stands for.
fn as_line(rule: &Value) -> Result<String, String> {
    let obj = rule.as_object().ok_or("a rule must be an object")?;
    let mut fields = Vec::with_capacity(COLUMNS.len());
    for (name, optional) in COLUMNS {
        let field = match obj.get(name) {
            None if optional => "-1".to_string(),
            None => return Err(format!("missing \"{name}\"")),
            Some(Value::String(s)) if !s.contains(',') => s.clone(),
            Some(Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
            Some(other) => return Err(format!("\"{name}\" must be a string or an integer, got {other}")),
        };
        fields.push(field);
    }
    Ok(fields.join(","))
}

/// Parses a JSON rule table. `Err` when the text is not JSON or holds no `rules` array;
/// otherwise bad rules are reported in `errors`, as for the CSV form.
pub fn parse_config(text: &str) -> Result<ParsedConfig, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let rules = match &doc {
        Value::Array(a) => a,
        Value::Object(o) => o.get("rules").and_then(Value::as_array).ok_or("no \"rules\" array")?,
        _ => return Err("expected an object with a \"rules\" array, or an array of rules".into()),
    };
    let mut parsed = ParsedConfig::default();
    for (index, rule) in rules.iter().enumerate() {
        let line = index + 1;
        match as_line(rule).and_then(|l| parse_rule(&l, line)) {
            Ok(rule) => parsed.rules.push(rule),
            Err(message) => parsed.errors.push(LineError { line, message }),
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustccl_plugin_api::{Algorithm, CollType, Protocol};

    #[test]
    fn reads_what_the_bench_writes_and_skips_bad_rules() {
        let text = r#"{"generator": "x", "rules": [
            {"collective": "allreduce", "min_bytes": 0, "max_bytes": 65536, "algorithm": "tree",
             "protocol": "ll", "channels": 2, "nNodes": 1, "nRanks": 2, "numPipeOps": -1, "regBuff": -1},
            {"collective": "allgather", "min_bytes": 0, "max_bytes": 18446744073709551615,
             "algorithm": "ring", "protocol": "simple"},
            {"collective": "allreduce", "min_bytes": 0, "algorithm": "ring", "protocol": "ll"},
            {"collective": "allreduce", "min_bytes": 0, "max_bytes": 1, "algorithm": "ring", "protocol": "ll", "channels": 1.5},
            {"collective": "alltoall", "min_bytes": 0, "max_bytes": 1, "algorithm": "ring", "protocol": "ll"}
        ]}"#;
        let p = parse_config(text).unwrap();
        assert_eq!(p.rules.len(), 2, "{p:?}");
        let r = &p.rules[0];
        assert_eq!((r.coll, r.max_bytes, r.algo, r.proto, r.channels, r.n_ranks), (CollType::AllReduce, 65536, Algorithm::Tree, Protocol::Ll, Some(2), Some(2)));
        assert_eq!((p.rules[1].max_bytes, p.rules[1].channels, p.rules[1].line), (u64::MAX, None, 2));
        let lines: Vec<usize> = p.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [3, 4, 5]);
        assert!(p.errors[0].message.contains("missing \"max_bytes\""), "{:?}", p.errors);
        assert!(p.errors[1].message.contains("\"channels\" must be"), "{:?}", p.errors);
        // A bare array works; what is not a table is an error.
        assert_eq!(parse_config(r#"[{"collective":"reduce","min_bytes":0,"max_bytes":9,"algorithm":"ring","protocol":"ll"}]"#).unwrap().rules.len(), 1);
        assert!(parse_config("allreduce,0,1,ring,ll,-1,-1,-1").unwrap_err().contains("not valid JSON"));
        assert!(parse_config(r#"{"rule": []}"#).unwrap_err().contains("no \"rules\" array"));
    }
}

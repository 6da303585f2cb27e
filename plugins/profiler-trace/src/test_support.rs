//! Helpers of the unit tests.

use std::collections::HashMap;

use serde_json::Value;

use crate::recorder::Recorder;

/// Parses the recorder's output text back and indexes the spans by id.
pub(crate) fn parse(rec: &Recorder) -> (Vec<Value>, HashMap<u64, Value>) {
    let mut text = Vec::new();
    rec.write_json(&mut text).unwrap();
    let doc: Value = serde_json::from_slice(&text).expect("valid JSON");
    let events = doc["traceEvents"]
        .as_array()
        .expect("traceEvents array")
        .clone();
    let spans = events
        .iter()
        .filter(|e| e["ph"] != "i")
        .map(|e| (e["args"]["id"].as_u64().unwrap(), e.clone()))
        .collect();
    (events, spans)
}

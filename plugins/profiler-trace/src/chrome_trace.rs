//! The trace writer: a [`Recorder`]'s events as Chrome trace-event JSON
//! (`{"traceEvents":[...]}`, see the crate's "Output format"), written to a writer, a path,
//! or the file named by [`TRACE_FILE_ENV`].

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::event::EventKind;
use crate::recorder::Recorder;

/// Environment variable naming the trace output file (`%p` = process id).
pub const TRACE_FILE_ENV: &str = "RUSTCCL_PROFILER_TRACE_FILE";

/// One entry of `traceEvents`.
#[derive(Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    cat: &'static str,
    ph: &'static str,
    pid: u32,
    tid: u64,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    /// Scope of an instant event ("t" = thread).
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    args: Map<String, Value>,
}

impl Recorder {
    /// The whole trace as a JSON value `{"traceEvents":[...]}`, sorted by time.
    pub fn to_json(&self) -> Value {
        let inner = self.lock();
        let mut events: Vec<TraceEvent<'_>> =
            Vec::with_capacity(inner.spans.len() + inner.marks.len());
        for (id, span) in &inner.spans {
            let mut args = span.args.clone();
            args.insert("id".into(), id.0.into());
            if let Some(parent) = span.parent {
                args.insert("parent".into(), parent.0.into());
            }
            events.push(TraceEvent {
                name: &span.name,
                cat: span.kind.category(),
                ph: if span.end_us.is_some() { "X" } else { "B" },
                pid: self.pid,
                tid: span.tid,
                ts: span.start_us,
                dur: span.end_us.map(|end| end - span.start_us),
                s: None,
                args,
            });
        }
        for mark in &inner.marks {
            let mut args = mark.args.clone();
            args.insert("id".into(), mark.event.0.into());
            let kind = inner
                .spans
                .get(&mark.event)
                .map_or(EventKind::Group, |s| s.kind);
            events.push(TraceEvent {
                name: &mark.state,
                cat: kind.category(),
                ph: "i",
                pid: self.pid,
                tid: mark.tid,
                ts: mark.ts_us,
                dur: None,
                s: Some("t"),
                args,
            });
        }
        // Stable sort: at equal times spans (in id order, parents first) precede marks.
        events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" })
    }

    /// Writes the trace as JSON to `out`.
    pub fn write_json(&self, mut out: impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut out, &self.to_json()).map_err(io::Error::other)?;
        out.flush()
    }

    /// Writes the trace to the file at `path` (replacing it).
    pub fn write_to_path(&self, path: &Path) -> io::Result<()> {
        let file = std::fs::File::create(path)?;
        self.write_json(io::BufWriter::new(file))
    }

    /// Writes the trace to the file named by [`TRACE_FILE_ENV`], if set and not
    /// empty; returns the path written.
    pub fn write_to_env_file(&self) -> io::Result<Option<PathBuf>> {
        match trace_file_from(std::env::var_os(TRACE_FILE_ENV), self.pid) {
            Some(path) => self.write_to_path(&path).map(|()| Some(path)),
            None => Ok(None),
        }
    }
}

/// The output path for a value of [`TRACE_FILE_ENV`]: `None` if unset or empty;
/// `%p` is replaced by `pid`.
pub fn trace_file_from(value: Option<std::ffi::OsString>, pid: u32) -> Option<PathBuf> {
    let value = value.filter(|v| !v.is_empty())?;
    let text = value.to_string_lossy();
    if text.contains("%p") {
        Some(PathBuf::from(text.replace("%p", &pid.to_string())))
    } else {
        Some(PathBuf::from(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_file_path_and_write() {
        assert_eq!(trace_file_from(None, 7), None);
        assert_eq!(trace_file_from(Some("".into()), 7), None);
        assert_eq!(
            trace_file_from(Some("/tmp/t-%p.json".into()), 77),
            Some(PathBuf::from("/tmp/t-77.json"))
        );
        assert_eq!(
            trace_file_from(Some("/tmp/t.json".into()), 77),
            Some(PathBuf::from("/tmp/t.json"))
        );

        let rec = Recorder::new();
        let g = rec.start(EventKind::Group, "Group", None).unwrap();
        rec.stop(g).unwrap();
        let path = std::env::temp_dir().join(format!("rustccl-trace-{}.json", std::process::id()));
        rec.write_to_path(&path).unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(doc["traceEvents"][0]["name"], "Group");
        assert_eq!(doc["traceEvents"][0]["cat"], "group");
    }
}

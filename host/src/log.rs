//! Logging through `tracing`, filtered and formatted the way NCCL does it.
//!
//! rustccl logs with the ordinary `tracing` macros, naming the NCCL subsystem as the target:
//! `tracing::info!(target: "INIT", "...")`. [`init`] installs a global subscriber whose one
//! layer ([`NcclLayer`]) honours NCCL's variables:
//!
//! - `NCCL_DEBUG`: `NONE`/`VERSION` (errors only), `WARN` (the default), `INFO`, `ABORT`
//!   (treated as `INFO`), `TRACE` (also debug and trace events).
//! - `NCCL_DEBUG_SUBSYS`: a comma list of subsystems (`INIT,COLL,...,ALL`); a leading `^`
//!   means "all but these". It filters INFO, DEBUG and TRACE events; warnings and errors are
//!   always shown. Events whose target is not a subsystem name count as `INIT`.
//! - `NCCL_DEBUG_FILE`: where to write, `%h` standing for the host name and `%p` for the pid.
//!
//! Each event becomes one line, `host:pid:tid [rank] NCCL LEVEL message`, written with one
//! write call. The configuration lives in a lock the layer reads for every event, so
//! [`reload_from_env`] (`ncclResetDebugInit`) takes effect at once.

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// NCCL's subsystem names, in the order of their bits in [`SubsysMask`].
pub const SUBSYSTEMS: [&str; 17] = [
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "PLUGIN",
];

/// The subsystems shown when `NCCL_DEBUG_SUBSYS` is unset.
pub const DEFAULT_SUBSYS: &str = "INIT,BOOTSTRAP,ENV,PLUGIN";

/// A set of subsystems, one bit per entry of [`SUBSYSTEMS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubsysMask(pub u32);

impl SubsysMask {
    /// Every subsystem.
    pub const ALL: SubsysMask = SubsysMask((1 << SUBSYSTEMS.len()) - 1);

    /// The bit of a subsystem name (case-insensitive), `None` for an unknown name.
    fn bit(name: &str) -> Option<u32> {
        SUBSYSTEMS.iter().position(|s| s.eq_ignore_ascii_case(name)).map(|i| 1 << i)
    }

    /// Parses `NCCL_DEBUG_SUBSYS` syntax: `A,B,C`, `ALL`, or `^A,B` for all but A and B.
    /// Unknown names are ignored.
    pub fn parse(list: &str) -> SubsysMask {
        let list = list.trim();
        let (invert, list) = match list.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let mut bits = 0;
        for name in list.split(',').map(str::trim) {
            if name.eq_ignore_ascii_case("ALL") {
                bits |= SubsysMask::ALL.0;
            } else if let Some(bit) = SubsysMask::bit(name) {
                bits |= bit;
            }
        }
        if invert {
            bits = SubsysMask::ALL.0 & !bits;
        }
        SubsysMask(bits)
    }

    /// Whether the event target `target` is in the set; a target that is not a subsystem
    /// name (a module path, say) counts as `INIT`.
    pub fn contains_target(self, target: &str) -> bool {
        let bit = SubsysMask::bit(target).unwrap_or(1);
        self.0 & bit != 0
    }
}

/// Where log lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    Stderr,
    /// A file, its name already expanded (`%h`, `%p`).
    File(PathBuf),
}

/// The logging configuration: what NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// The most verbose level shown.
    pub level: Level,
    /// Subsystems whose INFO/DEBUG/TRACE events are shown.
    pub subsys: SubsysMask,
    pub destination: Destination,
    /// `NCCL_DEBUG` is `VERSION`, `INFO`, `ABORT` or `TRACE`: the version line is shown.
    pub version: bool,
}

impl LogConfig {
    /// The configuration the three variables' values give (`None` when unset).
    pub fn from_vars(debug: Option<&str>, subsys: Option<&str>, file: Option<&str>) -> LogConfig {
        let subsys = non_empty(subsys).unwrap_or(DEFAULT_SUBSYS);
        let destination = match non_empty(file) {
            Some(pattern) => {
                let name = expand_file_name(pattern, host_name(), std::process::id());
                Destination::File(PathBuf::from(name))
            }
            None => Destination::Stderr,
        };
        let version = non_empty(debug)
            .is_some_and(|d| matches!(d.to_ascii_uppercase().as_str(), "VERSION" | "INFO" | "ABORT" | "TRACE"));
        LogConfig { level: parse_level(debug), subsys: SubsysMask::parse(subsys), destination, version }
    }

    /// The configuration the parameters give (through the env plugin when one is in use).
    pub fn from_env() -> LogConfig {
        // params::resolve, not env_str: that logs, and logging is not set up yet. The first
        // lookup loads the env plugin, whose own lines wait for this configuration.
        let var = |name| crate::params::resolve(name).value;
        let (debug, subsys, file) =
            (var("NCCL_DEBUG"), var("NCCL_DEBUG_SUBSYS"), var("NCCL_DEBUG_FILE"));
        LogConfig::from_vars(debug.as_deref(), subsys.as_deref(), file.as_deref())
    }

    /// Whether an event of `level` with `target` is shown. Warnings and errors pass whatever
    /// the subsystem mask, as long as the level allows them.
    pub fn enabled(&self, level: Level, target: &str) -> bool {
        if level > self.level {
            return false;
        }
        level <= Level::WARN || self.subsys.contains_target(target)
    }
}

/// `Some(s)` unless `s` is unset or blank.
fn non_empty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// The most verbose level `NCCL_DEBUG` allows; unset or unknown means WARN.
fn parse_level(debug: Option<&str>) -> Level {
    let Some(value) = non_empty(debug) else { return Level::WARN };
    match value.to_ascii_uppercase().as_str() {
        "NONE" | "VERSION" => Level::ERROR,
        "WARN" => Level::WARN,
        // NCCL orders ABORT above INFO (it shows INFO and aborts on warnings); we show INFO.
        "INFO" | "ABORT" => Level::INFO,
        "TRACE" => Level::TRACE,
        _ => Level::WARN,
    }
}

/// Expands an `NCCL_DEBUG_FILE` pattern: `%h` → host name, `%p` → pid, `%%` → `%`; any
/// other `%` is kept as is.
pub fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            _ => {
                out.push('%');
                continue;
            }
        }
        chars.next();
    }
    out
}

/// The host name up to its first dot (as NCCL prints it), computed once.
fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let full = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".to_string());
        full.split('.').next().unwrap_or_default().to_string()
    })
}

thread_local! {
    static THREAD_ID: i32 = nix::unistd::gettid().as_raw();
    static THREAD_RANK: Cell<Option<i32>> = const { Cell::new(None) };
}

/// This thread's Linux thread id.
fn thread_id() -> i32 {
    THREAD_ID.with(|t| *t)
}

/// Sets the rank shown in this thread's log lines (`None` shows `[-]`).
pub fn set_thread_rank(rank: Option<i32>) {
    THREAD_RANK.with(|r| r.set(rank));
}

/// The rank set for this thread, if any.
pub fn thread_rank() -> Option<i32> {
    THREAD_RANK.with(|r| r.get())
}

/// Restores the thread's previous rank when dropped; see [`rank_scope`]. It stays on the
/// thread that made it (it is not `Send`).
#[must_use = "the rank is restored as soon as the guard is dropped"]
pub struct RankGuard {
    previous: Option<i32>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for RankGuard {
    fn drop(&mut self) {
        set_thread_rank(self.previous);
    }
}

/// Shows `rank` in this thread's log lines until the returned guard is dropped.
pub fn rank_scope(rank: i32) -> RankGuard {
    let previous = thread_rank();
    set_thread_rank(Some(rank));
    RankGuard { previous, _not_send: PhantomData }
}

/// The word NCCL prints for a level: errors print as WARN, debug as TRACE.
fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR | Level::WARN => "WARN",
        Level::INFO => "INFO",
        _ => "TRACE",
    }
}

/// One log line, newline included: `host:pid:tid [rank] NCCL LEVEL message`.
pub fn format_line(
    host: &str,
    pid: u32,
    tid: i32,
    rank: Option<i32>,
    level: Level,
    message: &str,
) -> String {
    let rank = match rank {
        Some(r) => r.to_string(),
        None => "-".to_string(),
    };
    let message = message.trim_end_matches('\n');
    format!("{host}:{pid}:{tid} [{rank}] NCCL {} {message}\n", level_word(level))
}

/// Collects an event's fields: the `message` first, the others as ` key=value`.
#[derive(Default)]
struct MessageVisitor {
    message: String,
    fields: String,
}

impl Visit for MessageVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={:?}", field.name(), value);
        }
    }
}

/// Where the layer writes.
enum Output {
    Stderr,
    File(File),
    /// An in-memory buffer, for tests.
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Output {
    /// Opens the configured destination; a file that cannot be opened is reported on stderr
    /// and replaced by stderr.
    fn open(destination: &Destination) -> Output {
        let Destination::File(path) = destination else { return Output::Stderr };
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(file) => Output::File(file),
            Err(err) => {
                let message = format!(
                    "could not open NCCL_DEBUG_FILE {}: {err}; logging to stderr",
                    path.display()
                );
                let line = format_line(
                    host_name(),
                    std::process::id(),
                    thread_id(),
                    thread_rank(),
                    Level::WARN,
                    &message,
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                Output::Stderr
            }
        }
    }

    /// Writes one whole line with one write call (stderr is unbuffered; files are in append
    /// mode), so lines from different threads do not interleave.
    fn write_line(&self, line: &str) {
        let _ = match self {
            Output::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
            Output::File(file) => (&*file).write_all(line.as_bytes()),
            Output::Buffer(buf) => {
                buf.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(line.as_bytes());
                Ok(())
            }
        };
    }
}

/// The configuration and the open destination, swapped as a whole on reload.
struct LogState {
    config: LogConfig,
    output: Output,
}

/// The `tracing` layer that filters and writes NCCL-style lines.
pub struct NcclLayer {
    state: Arc<RwLock<LogState>>,
}

impl NcclLayer {
    /// A layer that writes into `buffer` instead of the configured destination (for tests:
    /// use it with `tracing::subscriber::with_default`).
    pub fn capture(config: LogConfig, buffer: Arc<Mutex<Vec<u8>>>) -> NcclLayer {
        let state = LogState { config, output: Output::Buffer(buffer) };
        NcclLayer { state: Arc::new(RwLock::new(state)) }
    }

    fn config_enabled(&self, metadata: &Metadata<'_>) -> bool {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.config.enabled(*metadata.level(), metadata.target())
    }
}

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn register_callsite(&self, _metadata: &'static Metadata<'static>) -> Interest {
        // The configuration can change at run time: ask `enabled` every time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        self.config_enabled(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        Some(LevelFilter::from_level(state.config.level))
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let metadata = event.metadata();
        let mut visitor = MessageVisitor::default();
        event.record(&mut visitor);
        visitor.message.push_str(&visitor.fields);
        let line = format_line(
            host_name(),
            std::process::id(),
            thread_id(),
            thread_rank(),
            *metadata.level(),
            &visitor.message,
        );
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.output.write_line(&line);
    }
}

/// The state of the layer [`init`] installed (or tried to install).
static GLOBAL: OnceLock<Arc<RwLock<LogState>>> = OnceLock::new();

/// Whether [`init`] installed its subscriber (false when the program had one already).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Sets logging up from the environment and installs the global subscriber, unless the
/// embedding program installed one already (then its subscriber is left alone). Only the
/// first call does anything (but lines kept by [`emit_when_ready`] are logged by whichever
/// call finds them).
pub fn init() {
    GLOBAL.get_or_init(|| {
        let config = LogConfig::from_env();
        let output = Output::open(&config.destination);
        let state = Arc::new(RwLock::new(LogState { config, output }));
        let layer = NcclLayer { state: state.clone() };
        // An error means a global subscriber exists already: keep it.
        let installed =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .is_ok();
        INSTALLED.store(installed, Ordering::Relaxed);
        state
    });
    let pending = std::mem::take(&mut *PENDING.lock().unwrap_or_else(|p| p.into_inner()));
    replay(pending);
}

/// Whether [`init`] has set logging up (the log level is known).
pub fn is_initialized() -> bool {
    GLOBAL.get().is_some()
}

/// One event [`capture`] kept: its level, target (subsystem) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Captured {
    pub level: Level,
    pub target: String,
    pub message: String,
}

/// Keeps every event of the calling thread, whatever its level, while `f` runs.
struct CaptureLayer(Arc<Mutex<Vec<Captured>>>);

impl<S: Subscriber> Layer<S> for CaptureLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut visitor = MessageVisitor { message: String::new(), fields: String::new() };
        event.record(&mut visitor);
        let meta = event.metadata();
        let line = Captured { level: *meta.level(), target: meta.target().to_string(), message: visitor.message + &visitor.fields };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }
}

/// Runs `f` and returns what it logged on this thread instead of logging it. For what runs
/// before logging can be set up: the env plugin is loaded by the first parameter lookup, which
/// is the lookup of `NCCL_DEBUG` itself, so its lines wait for the level it helps decide.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<Captured>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(CaptureLayer(lines.clone()));
    let out = tracing::subscriber::with_default(subscriber, f);
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(|p| p.into_inner()));
    (out, lines)
}

/// Lines waiting for [`init`].
static PENDING: Mutex<Vec<Captured>> = Mutex::new(Vec::new());

/// Logs `lines` now if logging is set up, else as soon as [`init`] sets it up.
pub fn emit_when_ready(lines: Vec<Captured>) {
    if lines.is_empty() {
        return;
    }
    {
        let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
        if !is_initialized() {
            pending.extend(lines);
            return;
        }
    }
    replay(lines);
}

/// Logs captured lines again, each at its level and under its subsystem (an unknown target
/// is logged as `ENV`: tracing needs targets known when the program is built).
fn replay(lines: Vec<Captured>) {
    macro_rules! at {
        ($lvl:ident, $line:expr, [$($name:literal),*]) => {
            match $line.target.as_str() {
                $($name => tracing::$lvl!(target: $name, "{}", $line.message),)*
                _ => tracing::$lvl!(target: "ENV", "{}", $line.message),
            }
        };
    }
    macro_rules! by_target {
        ($lvl:ident, $line:expr) => {
            at!($lvl, $line, ["INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ALLOC", "CALL", "PROXY",
                "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "PLUGIN"])
        };
    }
    for line in lines {
        match line.level {
            Level::ERROR => by_target!(error, line),
            Level::WARN => by_target!(warn, line),
            Level::INFO => by_target!(info, line),
            Level::DEBUG => by_target!(debug, line),
            _ => by_target!(trace, line),
        }
    }
}

/// NCCL's version line (`NCCL version 2.32.3 ...`), once per process, when `NCCL_DEBUG` asks
/// for it (`VERSION` or more): the first communicator's init calls this, as NCCL does, so that
/// a user sees which library a program loaded.
pub fn version_banner(line: impl FnOnce() -> String) {
    static SHOWN: AtomicBool = AtomicBool::new(false);
    init();
    let Some(state) = GLOBAL.get() else { return };
    let state = state.read().unwrap_or_else(|p| p.into_inner());
    if !state.config.version || SHOWN.swap(true, Ordering::AcqRel) {
        return;
    }
    let text = format_line(host_name(), std::process::id(), thread_id(), thread_rank(), Level::INFO, &line());
    state.output.write_line(&text);
}

/// Reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE again (`ncclResetDebugInit`).
pub fn reload_from_env() {
    let Some(state) = GLOBAL.get() else {
        init();
        return;
    };
    let config = LogConfig::from_env();
    let output = Output::open(&config.destination);
    *state.write().unwrap_or_else(|p| p.into_inner()) = LogState { config, output };
    // The most verbose level may have changed: let tracing ask `max_level_hint` again.
    tracing::callsite::rebuild_interest_cache();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(debug: Option<&str>, subsys: Option<&str>) -> LogConfig {
        LogConfig::from_vars(debug, subsys, None)
    }

    #[test]
    fn the_version_line_shows_from_nccl_debug_version_on() {
        for (debug, shown) in [("VERSION", true), ("version", true), ("INFO", true), ("TRACE", true), ("WARN", false), ("NONE", false), ("", false)] {
            assert_eq!(LogConfig::from_vars(Some(debug), None, None).version, shown, "NCCL_DEBUG={debug}");
        }
        assert!(!LogConfig::from_vars(None, None, None).version);
    }

    #[test]
    fn levels_parse_case_insensitively_with_warn_default() {
        assert_eq!(config(None, None).level, Level::WARN);
        assert_eq!(config(Some(""), None).level, Level::WARN);
        assert_eq!(config(Some("version"), None).level, Level::ERROR);
        assert_eq!(config(Some("NONE"), None).level, Level::ERROR);
        assert_eq!(config(Some("Warn"), None).level, Level::WARN);
        assert_eq!(config(Some("info"), None).level, Level::INFO);
        assert_eq!(config(Some("ABORT"), None).level, Level::INFO);
        assert_eq!(config(Some("TRACE"), None).level, Level::TRACE);
        assert_eq!(config(Some("loud"), None).level, Level::WARN);
    }

    #[test]
    fn subsystem_lists_parse() {
        let bit = |n: &str| SubsysMask::bit(n).unwrap();
        assert_eq!(
            config(None, None).subsys.0,
            bit("INIT") | bit("BOOTSTRAP") | bit("ENV") | bit("PLUGIN")
        );
        assert_eq!(SubsysMask::parse("coll, net").0, bit("COLL") | bit("NET"));
        assert_eq!(SubsysMask::parse("ALL"), SubsysMask::ALL);
        assert_eq!(SubsysMask::parse("^ALL").0, 0);
        assert_eq!(
            SubsysMask::parse("^INIT,NET").0,
            SubsysMask::ALL.0 & !(bit("INIT") | bit("NET"))
        );
        // Unknown names are ignored, in plain and inverted lists.
        assert_eq!(SubsysMask::parse("COLL,BOGUS").0, bit("COLL"));
        assert_eq!(SubsysMask::parse("^BOGUS"), SubsysMask::ALL);
        assert_eq!(SubsysMask::ALL.0.count_ones() as usize, SUBSYSTEMS.len());
    }

    #[test]
    fn enabled_filters_by_level_then_subsystem() {
        let c = config(Some("INFO"), Some("COLL"));
        assert!(c.enabled(Level::INFO, "COLL"));
        assert!(!c.enabled(Level::INFO, "NET"));
        assert!(!c.enabled(Level::DEBUG, "COLL"), "INFO does not show debug");
        // Warnings and errors pass whatever the mask.
        assert!(c.enabled(Level::WARN, "NET"));
        assert!(c.enabled(Level::ERROR, "rustccl::comm"));
        // Targets that are not subsystem names count as INIT.
        assert!(!c.enabled(Level::INFO, "rustccl::comm"));
        assert!(config(Some("INFO"), None).enabled(Level::INFO, "rustccl::comm"));
        assert!(config(Some("info"), Some("init")).enabled(Level::INFO, "Init"));

        let version = config(Some("VERSION"), Some("ALL"));
        assert!(!version.enabled(Level::WARN, "INIT"));
        assert!(version.enabled(Level::ERROR, "INIT"));

        let trace = config(Some("TRACE"), Some("^NET"));
        assert!(trace.enabled(Level::TRACE, "P2P"));
        assert!(trace.enabled(Level::DEBUG, "P2P"));
        assert!(!trace.enabled(Level::TRACE, "NET"));

        let default = config(None, None);
        assert!(default.enabled(Level::WARN, "COLL"));
        assert!(!default.enabled(Level::INFO, "INIT"));
    }

    #[test]
    fn file_names_expand_host_and_pid() {
        assert_eq!(
            expand_file_name("/tmp/nccl.%h.%p.log", "node7", 4242),
            "/tmp/nccl.node7.4242.log"
        );
        assert_eq!(expand_file_name("100%%-%x-%", "h", 1), "100%-%x-%");
        assert_eq!(expand_file_name("plain", "h", 1), "plain");
        let c = LogConfig::from_vars(None, None, Some("/tmp/d.%p"));
        assert_eq!(
            c.destination,
            Destination::File(PathBuf::from(format!("/tmp/d.{}", std::process::id())))
        );
        assert_eq!(LogConfig::from_vars(None, None, Some(" ")).destination, Destination::Stderr);
    }

    #[test]
    fn lines_look_like_nccls() {
        assert_eq!(
            format_line("node1", 10, 11, Some(3), Level::INFO, "hello"),
            "node1:10:11 [3] NCCL INFO hello\n"
        );
        assert_eq!(
            format_line("node1", 10, 11, None, Level::ERROR, "bad\n"),
            "node1:10:11 [-] NCCL WARN bad\n"
        );
        assert_eq!(format_line("n", 1, 2, Some(0), Level::DEBUG, "x"), "n:1:2 [0] NCCL TRACE x\n");
        assert_eq!(format_line("n", 1, 2, Some(0), Level::WARN, "x"), "n:1:2 [0] NCCL WARN x\n");
    }

    #[test]
    fn rank_scope_restores_the_previous_rank() {
        set_thread_rank(None);
        {
            let _outer = rank_scope(1);
            assert_eq!(thread_rank(), Some(1));
            {
                let _inner = rank_scope(2);
                assert_eq!(thread_rank(), Some(2));
            }
            assert_eq!(thread_rank(), Some(1));
        }
        assert_eq!(thread_rank(), None);
    }

    /// Runs `f` with a subscriber whose layer writes into a buffer; returns what it wrote.
    fn capture(config: LogConfig, f: impl FnOnce()) -> String {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let layer = NcclLayer::capture(config, buffer.clone());
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
        let bytes = buffer.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn layer_filters_and_formats_events() {
        let out = capture(config(Some("INFO"), Some("INIT,COLL")), || {
            let _rank = rank_scope(5);
            tracing::info!(target: "INIT", "comm {} ready", 7);
            tracing::info!(target: "NET", "hidden: NET not in the mask");
            tracing::debug!(target: "INIT", "hidden: level too verbose");
            tracing::warn!(target: "NET", nbytes = 64, peer = "node2", "shown: warnings pass");
            tracing::error!("shown: an error");
        });
        let prefix = format!("{}:{}:{} ", host_name(), std::process::id(), thread_id());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            vec![
                format!("{prefix}[5] NCCL INFO comm 7 ready"),
                format!("{prefix}[5] NCCL WARN shown: warnings pass nbytes=64 peer=node2"),
                format!("{prefix}[5] NCCL WARN shown: an error"),
            ]
        );
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn layer_trace_level_shows_debug_and_trace_without_rank() {
        let out = capture(config(Some("TRACE"), Some("ALL")), || {
            set_thread_rank(None);
            tracing::debug!(target: "P2P", "d");
            tracing::trace!(target: "PROXY", "t");
        });
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].ends_with(" [-] NCCL TRACE d"), "{out}");
        assert!(lines[1].ends_with(" [-] NCCL TRACE t"), "{out}");
    }

    #[test]
    fn unopenable_file_falls_back_to_stderr() {
        let output = Output::open(&Destination::File(PathBuf::from("/nonexistent-dir/x/nccl.log")));
        assert!(matches!(output, Output::Stderr));
        let path = std::env::temp_dir().join(format!("rustccl-log-test-{}", std::process::id()));
        let output = Output::open(&Destination::File(path.clone()));
        assert!(matches!(output, Output::File(_)));
        output.write_line("one\n");
        Output::open(&Destination::File(path.clone())).write_line("two\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n", "append, not truncate");
        let _ = std::fs::remove_file(&path);
    }

    /// The only test that touches the process: the global subscriber and NCCL_DEBUG*.
    #[test]
    fn init_installs_and_reload_rereads_the_environment() {
        init();
        init();
        if !INSTALLED.load(Ordering::Relaxed) {
            return; // another subscriber was installed first; nothing of ours to observe
        }
        let path = std::env::temp_dir().join(format!("rustccl-log-reload-%p-{}", thread_id()));
        std::env::set_var("NCCL_DEBUG", "INFO");
        std::env::set_var("NCCL_DEBUG_SUBSYS", "COLL");
        std::env::set_var("NCCL_DEBUG_FILE", &path);
        reload_from_env();
        tracing::info!(target: "COLL", "reload-test shown");
        tracing::info!(target: "NET", "reload-test hidden");
        for name in ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"] {
            std::env::remove_var(name);
        }
        reload_from_env();
        tracing::info!(target: "COLL", "reload-test after reset");
        let path = expand_file_name(path.to_str().unwrap(), host_name(), std::process::id());
        let written = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(written.contains("NCCL INFO reload-test shown\n"), "{written}");
        assert!(!written.contains("reload-test hidden"), "{written}");
        assert!(!written.contains("after reset"), "{written}");
    }
}

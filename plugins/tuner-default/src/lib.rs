//! rustccl's default tuner plugin, `csv-table`: per-size overrides from an NCCL-style CSV
//! rule table.
//!
//! It is a `cdylib` (`librustccl_tuner_default.so`) exporting one [`CsvTuner`] instance as
//! both tuner ABI versions, `rustccl_tuner_v2` and `rustccl_tuner_v1`
//! ([`rustccl_plugin_api::tuner`]), under the name [`PLUGIN_NAME`] (`"csv-table"`). At
//! `init` it reads the rule table named by `NCCL_TUNER_CONFIG_FILE` (if that variable is
//! set and not empty; a file that cannot be read makes `init` fail); for each collective the
//! first matching rule makes its (algorithm, protocol) the cheapest entry of the cost table
//! (cost `0.0`) and, unless the rule says `-1`, sets the channel count. Without a file it
//! changes nothing, so the host's own model decides. Malformed lines are reported through
//! the host's logger (WARN, TUNING subsystem). It has no chunk-size rules: `get_chunk_size`
//! leaves the choice to the host.
//!
//! Not yet: NCCL's `numPipeOps` / `regBuff` columns as real match criteria, chunk-size
//! rules, and the tuner constants of NCCL's tuner v5.
//!
//! # Rule file format
//!
//! The format of NCCL's example tuner. One rule per line:
//!
//! ```text
//! # collective,minbytes,maxbytes,algorithm,protocol,channels,nNodes,nRanks
//! allreduce,0,65535,tree,ll,-1,-1,-1
//! allreduce,65536,4294967295,ring,simple,16,2,-1
//! ```
//!
//! * `collective`: broadcast, reduce, allgather, reducescatter, allreduce.
//! * `minbytes..=maxbytes`: the message-size range, both ends included.
//! * `algorithm`: tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat.
//! * `protocol`: ll, ll128, simple.
//! * `channels`, `nNodes`, `nRanks`: a positive number, or `-1` for "any" (for
//!   `channels`: "leave the host's choice").
//! * Everything after `#` is a comment; blank lines are ignored. NCCL's optional
//!   9th and 10th columns (`numPipeOps`, `regBuff`) are accepted when they are `-1`.
//!
//! A file whose name ends in `.json` is read as the JSON form of the same table (see
//! [`json`]; `rustccl-bench --tune` writes both forms).
//!
//! Malformed lines are skipped with a message on stderr naming the file and line.
//! A rule whose (algorithm, protocol) is disabled in the host's table (or missing
//! from it) is passed over, and the next matching rule is tried.

pub mod json;

use std::ffi::OsString;
use std::fmt;
use std::path::Path;

use rustccl_plugin_api::tuner::{Tuner, TunerProvider};
use rustccl_plugin_api::{
    subsys, Algorithm, CollType, CostTable, HandleRegistry, LogFn, PluginError, PluginHandle, Protocol,
};

/// Environment variable naming the rule file (same name as NCCL's example tuner).
pub const CONFIG_ENV: &str = "NCCL_TUNER_CONFIG_FILE";

/// Name reported by the plugin (in both exported tables).
pub const PLUGIN_NAME: &str = "csv-table";

/// One line of the rule table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The collective it applies to.
    pub coll: CollType,
    /// Smallest message size (bytes) it applies to.
    pub min_bytes: u64,
    /// Largest message size (bytes) it applies to, included.
    pub max_bytes: u64,
    /// Algorithm to prefer.
    pub algo: Algorithm,
    /// Protocol to prefer.
    pub proto: Protocol,
    /// Channel count to set; `None` leaves the host's choice.
    pub channels: Option<u32>,
    /// Node count it applies to; `None` for any.
    pub n_nodes: Option<usize>,
    /// Rank count it applies to; `None` for any.
    pub n_ranks: Option<usize>,
    /// 1-based line number in the file, for messages.
    pub line: usize,
}

impl Rule {
    /// Whether this rule applies to a `coll` of `nbytes` on a communicator of
    /// `n_ranks` ranks over `n_nodes` nodes.
    pub fn matches(&self, coll: CollType, nbytes: u64, n_nodes: usize, n_ranks: usize) -> bool {
        self.coll == coll
            && (self.min_bytes..=self.max_bytes).contains(&nbytes)
            && any_or_eq(self.n_nodes, n_nodes)
            && any_or_eq(self.n_ranks, n_ranks)
    }
}

/// Whether a rule column (`None` = any) accepts `value`.
fn any_or_eq(want: Option<usize>, value: usize) -> bool {
    match want {
        None => true,
        Some(w) => w == value,
    }
}

/// A line of the rule table that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// The result of parsing a rule table: the good rules, in file order, and the
/// lines that were skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedConfig {
    /// Usable rules, in file order.
    pub rules: Vec<Rule>,
    /// Skipped malformed lines.
    pub errors: Vec<LineError>,
}

/// Parses a "-1 means any" column: `Ok(None)` for -1, `Ok(Some(n))` for n ≥ 1.
fn parse_optional(field: &str, what: &str) -> Result<Option<u64>, String> {
    match field.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if n >= 1 => Ok(Some(n as u64)),
        _ => Err(format!(
            "{what} must be -1 or a positive integer, got '{field}'"
        )),
    }
}

/// Parses one non-comment line (already stripped of comments and blank-checked).
fn parse_rule(text: &str, line: usize) -> Result<Rule, String> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    if !(8..=10).contains(&fields.len()) {
        return Err(format!(
            "expected 8 comma-separated fields \
             (collective,minbytes,maxbytes,algorithm,protocol,channels,nNodes,nRanks), got {}",
            fields.len()
        ));
    }
    for (extra, name) in fields[8..].iter().zip(["numPipeOps", "regBuff"]) {
        if *extra != "-1" {
            return Err(format!(
                "{name} '{extra}' is not supported yet (only -1, meaning any)"
            ));
        }
    }
    let coll: CollType = fields[0].parse()?;
    if !coll.is_tuned() {
        return Err(format!("collective '{}' is not tuned (only broadcast, reduce, allgather, reducescatter, allreduce)", fields[0]));
    }
    let bytes = |s: &str, what: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("{what} must be a non-negative integer, got '{s}'"))
    };
    let min_bytes = bytes(fields[1], "minbytes")?;
    let max_bytes = bytes(fields[2], "maxbytes")?;
    if min_bytes > max_bytes {
        return Err(format!(
            "minbytes {min_bytes} is larger than maxbytes {max_bytes}"
        ));
    }
    let channels = parse_optional(fields[5], "channels")?
        .map(|n| {
            u32::try_from(n)
                .ok()
                .filter(|&c| c <= i32::MAX as u32)
                .ok_or("channels is too large")
        })
        .transpose()?;
    Ok(Rule {
        coll,
        min_bytes,
        max_bytes,
        algo: fields[3].parse()?,
        proto: fields[4].parse()?,
        channels,
        n_nodes: parse_optional(fields[6], "nNodes")?.map(|n| n as usize),
        n_ranks: parse_optional(fields[7], "nRanks")?.map(|n| n as usize),
        line,
    })
}

/// Parses a whole rule table. Never fails: bad lines are reported in `errors`.
pub fn parse_config(text: &str) -> ParsedConfig {
    let mut parsed = ParsedConfig::default();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        match parse_rule(content, line) {
            Ok(rule) => parsed.rules.push(rule),
            Err(message) => parsed.errors.push(LineError { line, message }),
        }
    }
    parsed
}

/// Reads and parses the rule file at `path` — the JSON form ([`json`]) when its name ends in
/// `.json`, the CSV form otherwise — calling `warn` with one message per skipped line (JSON:
/// rule). An unreadable file, or a `.json` file that is not a rule table, is an error.
pub fn load_config(path: &Path, mut warn: impl FnMut(&str)) -> Result<Vec<Rule>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{PLUGIN_NAME}: cannot read {CONFIG_ENV}={}: {e}",
            path.display()
        )
    })?;
    let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let parsed = if is_json {
        json::parse_config(&text).map_err(|e| format!("{PLUGIN_NAME}: {CONFIG_ENV}={}: {e}", path.display()))?
    } else {
        parse_config(&text)
    };
    for error in &parsed.errors {
        warn(&format!(
            "{PLUGIN_NAME}: {}: skipped malformed {error}",
            path.display()
        ));
    }
    Ok(parsed.rules)
}

/// The per-communicator state of the tuner.
#[derive(Debug, Clone)]
pub struct TunerState {
    /// Ranks in the communicator.
    pub n_ranks: usize,
    /// Nodes in the communicator.
    pub n_nodes: usize,
    /// Rules, in file order.
    pub rules: Vec<Rule>,
}

impl TunerState {
    /// State for a communicator, with rules from the file named by `config`
    /// (the value of [`CONFIG_ENV`]; unset or empty means no rules); `warn` gets the
    /// messages about skipped lines.
    pub fn new(
        n_ranks: usize,
        n_nodes: usize,
        config: Option<OsString>,
        warn: impl FnMut(&str),
    ) -> Result<Self, String> {
        let rules = match config.filter(|p| !p.is_empty()) {
            Some(path) => load_config(Path::new(&path), warn)?,
            None => Vec::new(),
        };
        Ok(TunerState {
            n_ranks,
            n_nodes,
            rules,
        })
    }

    /// Applies the first matching rule whose (algorithm, protocol) is usable in
    /// `table`: sets that entry to `0.0` and, if the rule has a channel count,
    /// `*n_channels`. Returns the applied rule, or `None` (table untouched).
    pub fn apply(
        &self,
        coll: CollType,
        nbytes: usize,
        table: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Option<&Rule> {
        let nbytes = nbytes as u64;
        let rule = self
            .rules
            .iter()
            .filter(|r| r.matches(coll, nbytes, self.n_nodes, self.n_ranks))
            .find(|r| table.is_enabled(r.algo, r.proto))?;
        table.set(rule.algo, rule.proto, 0.0);
        if let Some(channels) = rule.channels {
            // Fits: parse_rule keeps channels <= i32::MAX.
            *n_channels = channels as i32;
        }
        Some(rule)
    }
}

/// The tuner: the states of the communicators using it.
#[derive(Debug, Default)]
pub struct CsvTuner {
    states: HandleRegistry<TunerState>,
}

impl CsvTuner {
    /// A tuner with no communicator (usable in a `static`).
    pub const fn new() -> Self {
        CsvTuner {
            states: HandleRegistry::new(),
        }
    }

    /// Number of communicators initialised and not finalised.
    pub fn live_contexts(&self) -> usize {
        self.states.len()
    }

    fn unknown(ctx: PluginHandle) -> PluginError {
        PluginError::invalid_argument(format!("{PLUGIN_NAME}: unknown context {}", ctx.id))
    }
}

impl Tuner for CsvTuner {
    fn init(
        &self,
        comm_id: u64,
        nranks: usize,
        nnodes: usize,
        log: LogFn,
    ) -> Result<PluginHandle, PluginError> {
        let warn = |m: &str| log.warn(subsys::TUNING, m);
        let state = TunerState::new(nranks, nnodes, std::env::var_os(CONFIG_ENV), warn)
            .map_err(PluginError::invalid_usage)?;
        log.info(
            subsys::TUNING,
            &format!(
                "{PLUGIN_NAME}: communicator {comm_id:#x} ({nranks} ranks, {nnodes} nodes): {} rules",
                state.rules.len()
            ),
        );
        Ok(self.states.insert(state))
    }

    fn get_coll_info(
        &self,
        ctx: PluginHandle,
        coll: CollType,
        nbytes: usize,
        _num_pipe_ops: i32,
        costs: &mut CostTable<'_>,
        n_channels: &mut i32,
    ) -> Result<(), PluginError> {
        self.states
            .with(ctx, |state| {
                state.apply(coll, nbytes, costs, n_channels);
            })
            .ok_or_else(|| Self::unknown(ctx))
    }

    fn finalize(&self, ctx: PluginHandle) -> Result<(), PluginError> {
        self.states
            .remove(ctx)
            .map(drop)
            .ok_or_else(|| Self::unknown(ctx))
    }
}

/// The instance both exported tables use.
pub static TUNER: CsvTuner = CsvTuner::new();

/// Gives the exported tables [`TUNER`].
pub struct Provider;

impl TunerProvider for Provider {
    fn get() -> &'static dyn Tuner {
        &TUNER
    }
}

rustccl_plugin_api::export_tuner_v2!("csv-table", provider = Provider);
rustccl_plugin_api::export_tuner_v1!("csv-table", provider = Provider);

/// Entry point for the fuzz target in `fuzz/` and the corpus regression test: a rule table
/// through the parser, then its rules applied to a cost table. Panics only if the parser
/// breaks a promise. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    pub fn rule_table(text: &str) {
        let parsed = parse_config(text);
        let lines = text.lines().count();
        let mut last = 0;
        for rule in &parsed.rules {
            assert!(rule.line > last && rule.line <= lines, "rule lines out of order: {rule:?}");
            last = rule.line;
            assert!(rule.min_bytes <= rule.max_bytes, "{rule:?}");
            assert!(rule.channels.is_none_or(|c| c >= 1 && c <= i32::MAX as u32), "{rule:?}");
            assert!(rule.n_nodes != Some(0) && rule.n_ranks != Some(0), "{rule:?}");
        }
        for e in &parsed.errors {
            assert!(e.line >= 1 && e.line <= lines && !e.message.is_empty(), "{e:?}");
        }
        let (n_algo, n_proto) = (Algorithm::ALL.len(), Protocol::ALL.len());
        let state = TunerState { n_ranks: 8, n_nodes: 2, rules: parsed.rules };
        for &coll in CollType::ALL {
            for nbytes in [0, 1, 4096, 1 << 20, usize::MAX] {
                let mut costs = vec![1.0f32; n_algo * n_proto];
                let mut table = CostTable::new(&mut costs, n_algo, n_proto).expect("sized table");
                let mut channels = -7;
                let applied = state.apply(coll, nbytes, &mut table, &mut channels).cloned();
                match applied {
                    Some(rule) => {
                        assert!(rule.matches(coll, nbytes as u64, 2, 8));
                        assert_eq!(channels, rule.channels.map_or(-7, |c| c as i32));
                        assert_eq!(costs.iter().filter(|&&c| c == 0.0).count(), 1);
                    }
                    None => assert!(channels == -7 && costs.iter().all(|&c| c == 1.0)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustccl_plugin_api::ALGO_PROTO_IGNORE;

    const GOOD: &str = "\
# collective,minbytes,maxbytes,algorithm,protocol,channels,nNodes,nRanks
allreduce,0,65535,tree,ll,-1,-1,-1

allreduce, 65536, 4294967295, ring, simple, 16, 2, -1   # two nodes, large
allgather,0,1024,nvls_tree,LL128,4,-1,8
broadcast,0,100,pat,simple,-1,-1,-1,-1,-1
";

    #[test]
    fn parses_good_lines() {
        let parsed = parse_config(GOOD);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert_eq!(parsed.rules.len(), 4);
        assert_eq!(
            parsed.rules[0],
            Rule {
                coll: CollType::AllReduce,
                min_bytes: 0,
                max_bytes: 65535,
                algo: Algorithm::Tree,
                proto: Protocol::Ll,
                channels: None,
                n_nodes: None,
                n_ranks: None,
                line: 2,
            }
        );
        let r = &parsed.rules[1];
        assert_eq!(
            (r.algo, r.proto, r.channels, r.n_nodes, r.line),
            (Algorithm::Ring, Protocol::Simple, Some(16), Some(2), 4)
        );
        assert_eq!(r.max_bytes, 4_294_967_295);
        let r = &parsed.rules[2];
        assert_eq!(
            (r.coll, r.algo, r.proto, r.n_ranks),
            (
                CollType::AllGather,
                Algorithm::NvlsTree,
                Protocol::Ll128,
                Some(8)
            )
        );
        assert_eq!(parsed.rules[3].algo, Algorithm::Pat);
    }

    #[test]
    fn skips_bad_lines_with_line_numbers() {
        let text = "\
allreduce,0,10,tree,ll,-1,-1,-1
allreduce,0,10,tree,ll,-1,-1
allreduce,0,10,warp,ll,-1,-1,-1
allreduce,20,10,tree,ll,-1,-1,-1
allreduce,0,10,tree,ll,0,-1,-1
allreduce,-5,10,tree,ll,-1,-1,-1
sendrecv,0,10,tree,ll,-1,-1,-1
allreduce,0,10,tree,ll,-1,-1,-1,2
gather,0,10,ring,simple,-1,-1,-1
allreduce,0,10,ring,simple,-1,abc,-1
ring,0,10,ring,simple,-1,-1,-1
";
        let parsed = parse_config(text);
        assert_eq!(parsed.rules.len(), 1);
        assert_eq!(parsed.rules[0].line, 1);
        let lines: Vec<usize> = parsed.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, (2..=11).collect::<Vec<_>>());
        let msg = |line: usize| {
            parsed
                .errors
                .iter()
                .find(|e| e.line == line)
                .unwrap()
                .to_string()
        };
        assert!(
            msg(2).starts_with("line 2: expected 8 comma-separated fields"),
            "{}",
            msg(2)
        );
        assert!(msg(3).contains("unknown Algorithm 'warp'"), "{}", msg(3));
        assert!(
            msg(4).contains("minbytes 20 is larger than maxbytes 10"),
            "{}",
            msg(4)
        );
        assert!(
            msg(5).contains("channels must be -1 or a positive integer"),
            "{}",
            msg(5)
        );
        assert!(
            msg(6).contains("minbytes must be a non-negative integer"),
            "{}",
            msg(6)
        );
        assert!(msg(7).contains("not tuned"), "{}", msg(7));
        assert!(msg(8).contains("numPipeOps '2'"), "{}", msg(8));
        assert!(msg(9).contains("unknown CollType 'gather'"), "{}", msg(9));
        assert!(msg(10).contains("nNodes"), "{}", msg(10));
    }

    #[test]
    fn load_config_reads_file_and_rejects_missing_file() {
        let dir = std::env::temp_dir().join(format!("rustccl-tuner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuner.conf");
        std::fs::write(&path, "allreduce,0,10,ring,ll,2,-1,-1\nbad line\n").unwrap();
        let mut warnings = Vec::new();
        let rules = load_config(&path, |m| warnings.push(m.to_string())).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("tuner.conf: skipped malformed line 2: expected 8"),
            "{warnings:?}"
        );
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].channels, Some(2));
        let err = load_config(&dir.join("missing.conf"), |_| ()).unwrap_err();
        assert!(
            err.contains("cannot read NCCL_TUNER_CONFIG_FILE=") && err.contains("missing.conf"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        // Unset or empty variable: no rules, no error.
        assert!(TunerState::new(4, 1, None, |_| ()).unwrap().rules.is_empty());
        assert!(TunerState::new(4, 1, Some(OsString::new()), |_| ())
            .unwrap()
            .rules
            .is_empty());
    }

    fn table() -> Vec<f32> {
        (0..21).map(|i| 10.0 + i as f32).collect()
    }

    fn state(text: &str, n_ranks: usize, n_nodes: usize) -> TunerState {
        TunerState {
            n_ranks,
            n_nodes,
            rules: parse_config(text).rules,
        }
    }

    #[test]
    fn matches_by_size_nodes_and_ranks() {
        let s = state(GOOD, 16, 2);
        let run = |s: &TunerState, coll, nbytes| {
            let mut raw = table();
            let mut t = CostTable::new(&mut raw, 7, 3).unwrap();
            let mut ch = -1;
            let line = s.apply(coll, nbytes, &mut t, &mut ch).map(|r| r.line);
            (line, t.best(), ch, raw)
        };
        // Small allreduce: tree/ll, channels untouched; everything else unchanged.
        let (line, best, ch, raw) = run(&s, CollType::AllReduce, 100);
        assert_eq!((line, ch), (Some(2), -1));
        assert_eq!(best, Some((Algorithm::Tree, Protocol::Ll, 0.0)));
        assert_eq!(raw[1..], table()[1..]);
        // Range ends are inclusive.
        assert_eq!(run(&s, CollType::AllReduce, 65535).0, Some(2));
        let (line, best, ch, _) = run(&s, CollType::AllReduce, 65536);
        assert_eq!((line, ch), (Some(4), 16));
        assert_eq!(best, Some((Algorithm::Ring, Protocol::Simple, 0.0)));
        // The large rule is for 2 nodes only.
        assert_eq!(run(&state(GOOD, 16, 4), CollType::AllReduce, 65536).0, None);
        // The allgather rule is for 8 ranks only.
        assert_eq!(run(&s, CollType::AllGather, 10).0, None);
        let (line, best, ch, _) = run(&state(GOOD, 8, 1), CollType::AllGather, 1024);
        assert_eq!((line, ch), (Some(5), 4));
        assert_eq!(best, Some((Algorithm::NvlsTree, Protocol::Ll128, 0.0)));
        assert_eq!(run(&state(GOOD, 8, 1), CollType::AllGather, 1025).0, None);
        // No rule for reduce: table untouched.
        let (line, _, ch, raw) = run(&s, CollType::Reduce, 10);
        assert_eq!((line, ch, raw), (None, -1, table()));
    }

    #[test]
    fn disabled_pair_falls_through_to_next_rule() {
        let s = state(
            "allreduce,0,100,nvls,simple,8,-1,-1\nallreduce,0,100,ring,ll128,-1,-1,-1\n",
            8,
            1,
        );
        let mut raw = table();
        raw[Algorithm::Nvls.index() * 3 + Protocol::Simple.index()] = ALGO_PROTO_IGNORE;
        let mut t = CostTable::new(&mut raw, 7, 3).unwrap();
        let mut ch = 3;
        assert_eq!(
            s.apply(CollType::AllReduce, 50, &mut t, &mut ch)
                .map(|r| r.line),
            Some(2)
        );
        assert_eq!(ch, 3, "the skipped rule's channels are not applied");
        assert_eq!(
            t.get(Algorithm::Nvls, Protocol::Simple),
            Some(ALGO_PROTO_IGNORE)
        );
        assert_eq!(t.best(), Some((Algorithm::Ring, Protocol::Ll128, 0.0)));
        // A host table with fewer algorithms than the rule names: no match.
        let s = state("allreduce,0,100,pat,simple,8,-1,-1\n", 8, 1);
        let mut raw = vec![1.0; 2 * 3];
        let mut t = CostTable::new(&mut raw, 2, 3).unwrap();
        assert!(s.apply(CollType::AllReduce, 50, &mut t, &mut ch).is_none());
        assert_eq!(raw, vec![1.0; 6]);
    }

    #[test]
    fn exported_tables_without_config_leave_table_alone() {
        // Calls the tables in-process through the clients (no env var involved: the state
        // is inserted directly, as `init` would with the variable unset).
        use rustccl_plugin_api::tuner::{TunerV1, TunerV2, TunerV1Client, TunerV2Client};
        static V2: TunerV2 = TunerV2::table::<Provider>(PLUGIN_NAME);
        static V1: TunerV1 = TunerV1::table::<Provider>(PLUGIN_NAME);
        let v2 = TunerV2Client { table: &V2 };
        let v1 = TunerV1Client { table: &V1 };
        assert_eq!((v1.name(), v2.name()), ("csv-table", "csv-table"));
        let handle = TUNER.states.insert(
            TunerState::new(4, 1, None, |_| ()).unwrap(),
        );
        for client in [&v1 as &dyn Tuner, &v2] {
            let mut raw = table();
            let mut ch = -1;
            let mut t = CostTable::new(&mut raw, 7, 3).unwrap();
            client
                .get_coll_info(handle, CollType::AllReduce, 1 << 20, 1, &mut t, &mut ch)
                .unwrap();
            assert_eq!((raw, ch), (table(), -1));
            assert_eq!(
                client.get_chunk_size(handle, CollType::AllReduce, 1, Algorithm::Ring, Protocol::Simple, 2),
                Ok(None)
            );
        }
        v2.finalize(handle).unwrap();
        let err = v1.finalize(handle).unwrap_err();
        assert!(err.message.contains("unknown context"), "{err}");
        assert_eq!(err.code, PluginError::INVALID_ARGUMENT);
    }
}

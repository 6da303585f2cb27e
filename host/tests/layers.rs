//! The layer order of the host crate (`host/src`), enforced.
//!
//! docs/ARCHITECTURE.md states the order of `host/src`'s top-level modules in a fenced
//! `layers` block, top to bottom; this test reads that block (so the document and the test
//! cannot drift apart), finds every path into the crate in `host/src/**/*.rs` (`crate::`,
//! `$crate::` in macros, and `super::` chains that climb out of a top-level module), and fails
//! on any import from a module to one on a higher line, naming the file and line, both modules
//! and what to do.
//!
//! The imports against the order that exist today are the debt issue 32 removes: [`DEBT`]
//! lists each one (file, path as written, and the issue item whose change removes it). A listed
//! import passes; the test also fails when a listed import is gone (or no longer against the
//! order), so the list can only shrink.
//!
//! Test modules (`#[cfg(test)]`) count like the rest: they are compiled into the crate. Comments
//! and string literals are ignored: a doc link to a higher module is no import. The crate root
//! (lib.rs) re-exports from any module; a path through a re-export (`crate::Communicator`)
//! counts as an import of the module it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Upward imports that exist today: (file under host/src, the path as written, what removes
/// it). One entry covers every occurrence of that path in that file. The issue-32 items named:
/// 4 = executors own execution (exec/host/, exec/gpu/ behind one interface); 5 = a
/// communicator core (identity, config, bootstrap, failure state) and an exec-owned engine
/// (connections, executor, plan cache, board): "coll gets both; nothing below coll imports
/// it". (Item 6, the profiler's events through an observer interface, `observe`, paid off
/// its entries.)
const DEBT: &[(&str, &str, &str)] = &[
    // Every parameter is resolved through the env plugin, whose loader lives in plugin (it
    // reads no parameter itself, so nothing recurses at run time).
    ("params.rs", "crate::plugin::env::{self as env_plugin,Answer}", "not in issue 32: the env plugin's loader would move below params"),
];

/// Where the order is stated, relative to the workspace root.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

fn host_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The order read from ARCHITECTURE.md: each module's rank (0 = top). Modules of the `base:`
/// line share the bottom rank: they are usable by every module and may use each other.
#[derive(Debug)]
struct Order {
    rank: BTreeMap<String, usize>,
    base: BTreeSet<String>,
}

impl Order {
    fn parse(doc: &str) -> Order {
        let start = doc.find("```layers\n").expect("docs/ARCHITECTURE.md has no ```layers block (the layer order this test checks)");
        let body = &doc[start + "```layers\n".len()..];
        let body = &body[..body.find("```").expect("the ```layers block in docs/ARCHITECTURE.md is not closed")];
        let mut order = Order { rank: BTreeMap::new(), base: BTreeSet::new() };
        let mut next = 0;
        for line in body.lines() {
            let line = line.split('#').next().unwrap().trim();
            if line.is_empty() {
                continue;
            }
            let (names, base) = match line.strip_prefix("base:") {
                Some(rest) => (rest, true),
                None => (line, false),
            };
            let names: Vec<&str> = names.split_whitespace().collect();
            assert!(base || names.len() == 1, "layers block line {line:?}: one module per line (or `base: a b c`)");
            for name in names {
                let old = order.rank.insert(name.to_string(), if base { usize::MAX } else { next });
                assert!(old.is_none(), "layers block names {name} twice");
                if base {
                    order.base.insert(name.to_string());
                }
            }
            next += 1;
        }
        order
    }

    /// Whether `from` may use `to`.
    fn allows(&self, from: &str, to: &str) -> bool {
        from == to || self.base.contains(to) || (!self.base.contains(from) && self.rank[from] < self.rank[to])
    }
}

/// One path into the crate found in a source file.
#[derive(Debug, Clone)]
struct Import {
    /// Relative to host/src, with `/`.
    file: String,
    line: usize,
    /// The file's top-level module.
    from: String,
    /// The top-level module the path goes into.
    to: String,
    /// The path as written (whitespace removed), one per item of a `{...}` group.
    path: String,
}

/// The source with comments, string and char literals blanked (newlines kept, so lines and
/// offsets stay the same).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'r' && (i == 0 || !is_ident(b[i - 1])) && matches!(b.get(i + 1), Some(b'"' | b'#')) {
            // A raw string r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = i + 2 + hashes;
            let end = b[body..].windows(close.len()).position(|w| w == close.as_slice()).map_or(b.len(), |n| body + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, (j + 1).min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', b'x' too) or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                let end = b[i + 2..].iter().position(|&c| c == b'\'').map_or(b.len(), |n| i + 2 + n + 1);
                blank(&mut out, i, end);
                i = end;
            } else if b.get(i + 2) == Some(&b'\'') || (b.get(i + 1).is_some_and(|&c| c >= 0x80)) {
                let end = b[i + 1..].iter().position(|&c| c == b'\'').map_or(b.len(), |n| i + 1 + n + 1);
                blank(&mut out, i, end);
                i = end;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The module path of a file: host/src/coll/group.rs is [coll, group], coll/mod.rs is [coll].
fn module_of(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap();
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Skips spaces from `i`.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The items of a path's rest starting at `i` (after `crate::` or the last `super::`): for a
/// `{a::b, c}` group each item's text, else the one path's text; with where the rest ends.
fn path_items(b: &[u8], i: usize) -> (Vec<String>, usize) {
    let i = skip_ws(b, i);
    if b.get(i) == Some(&b'{') {
        let (mut depth, mut j, mut item, mut items) = (0, i, String::new(), Vec::new());
        loop {
            let c = b[j];
            match c {
                b'{' => {
                    depth += 1;
                    if depth > 1 {
                        item.push('{');
                    }
                }
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        items.push(std::mem::take(&mut item).trim_end().to_string());
                        break;
                    }
                    item.push('}');
                }
                b',' if depth == 1 => items.push(std::mem::take(&mut item).trim_end().to_string()),
                // Spaces matter only between words (`self as env_plugin`).
                c if c.is_ascii_whitespace() => {
                    if item.ends_with(|c: char| is_ident(c as u8)) {
                        item.push(' ');
                    }
                }
                c => {
                    if item.ends_with(' ') && !is_ident(c) {
                        item.pop();
                    }
                    item.push(c as char);
                }
            }
            j += 1;
        }
        (items.into_iter().filter(|s| !s.is_empty()).collect(), j + 1)
    } else {
        let mut j = i;
        let mut text = String::new();
        while j < b.len() && (is_ident(b[j]) || b[j] == b':' || b[j] == b'{' || b[j] == b'*') {
            if b[j] == b'{' {
                // `crate::a::{b, c}`: the group belongs to module a; keep the text whole.
                let (inner, end) = path_items(b, j);
                text.push_str(&format!("{{{}}}", inner.join(",")));
                j = end;
                break;
            }
            text.push(b[j] as char);
            j += 1;
        }
        (vec![text.trim_end_matches(':').to_string()], j)
    }
}

/// Every path into the crate in one file, placed by top-level module.
fn imports_of(rel: &str, src: &str, modules: &BTreeSet<String>, reexports: &BTreeMap<String, String>) -> Result<Vec<Import>, String> {
    let code = code_only(src);
    let b = code.as_bytes();
    let file_module = module_of(rel);
    let Some(from) = file_module.first().cloned() else { return Ok(Vec::new()) };
    let line_at = |at: usize| 1 + code[..at].bytes().filter(|&c| c == b'\n').count();
    let mut found = Vec::new();
    // Inline modules (`mod tests { ... }`) deepen the module path for `super::`.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == b'}' {
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        let starts_word = i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b':');
        if starts_word && b[i..].starts_with(b"mod ") {
            let name_at = skip_ws(b, i + 4);
            let name_end = name_at + b[name_at..].iter().take_while(|&&c| is_ident(c)).count();
            let after = skip_ws(b, name_end);
            if b.get(after) == Some(&b'{') {
                inline.push((code[name_at..name_end].to_string(), depth + 1));
            }
            i = name_end;
            continue;
        }
        let (base, rest_at, written) = if starts_word && b[i..].starts_with(b"crate::") {
            (Vec::new(), i + "crate::".len(), "crate::".to_string())
        } else if starts_word && b[i..].starts_with(b"super::") {
            let mut k = 0;
            let mut j = i;
            while b[j..].starts_with(b"super::") {
                k += 1;
                j = skip_ws(b, j + "super::".len());
            }
            let mut path: Vec<String> = file_module.clone();
            path.extend(inline.iter().map(|(n, _)| n.clone()));
            if k > path.len() {
                return Err(format!("{rel}:{}: super:: climbs above the crate root", line_at(i)));
            }
            path.truncate(path.len() - k);
            (path, j, "super::".repeat(k))
        } else {
            i += 1;
            continue;
        };
        let (items, end) = path_items(b, rest_at);
        for item in items {
            let to = match base.first() {
                Some(top) => top.clone(),
                None => {
                    let first = item.split("::").next().unwrap();
                    if modules.contains(first) {
                        first.to_string()
                    } else if let Some(m) = reexports.get(first) {
                        m.clone()
                    } else {
                        return Err(format!("{rel}:{}: cannot place `{written}{item}` in a module (neither a module nor a re-export of lib.rs)", line_at(i)));
                    }
                }
            };
            // Paths that stay inside the file's own module are no import.
            if to != from {
                let path = if base.is_empty() { format!("crate::{item}") } else { format!("crate::{}::{item}", base.join("::")) };
                found.push(Import { file: rel.to_string(), line: line_at(i), from: from.clone(), to, path });
            }
        }
        i = end.max(i + 1);
    }
    Ok(found)
}

/// The top-level modules lib.rs declares and the names it re-exports (name -> module).
fn crate_root(lib: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let code = code_only(lib);
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    for line in code.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod ")) {
            modules.insert(name.trim_end_matches(';').trim().to_string());
        } else if let Some(rest) = line.strip_prefix("pub use ") {
            let rest = rest.trim_end_matches(';');
            let (module, names) = rest.split_once("::").unwrap();
            for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
                let name = name.split(" as ").last().unwrap().trim();
                reexports.insert(name.to_string(), module.to_string());
            }
        }
    }
    (modules, reexports)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every import between top-level modules in host/src.
fn all_imports() -> Vec<Import> {
    let src = host_dir().join("src");
    let (modules, reexports) = crate_root(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut all = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap();
        all.extend(imports_of(&rel, &text, &modules, &reexports).unwrap_or_else(|e| panic!("{e}")));
    }
    all
}

/// The documented order, checked to place every module lib.rs declares (and only those).
fn order() -> Order {
    let doc = std::fs::read_to_string(host_dir().join("..").join(ARCHITECTURE)).unwrap();
    let order = Order::parse(&doc);
    let (modules, _) = crate_root(&std::fs::read_to_string(host_dir().join("src/lib.rs")).unwrap());
    let missing: Vec<_> = modules.iter().filter(|m| !order.rank.contains_key(*m)).collect();
    let unknown: Vec<_> = order.rank.keys().filter(|m| !modules.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "modules of host/src/lib.rs with no place in the ```layers block of {ARCHITECTURE}: {missing:?}; \
         add each on the line of its layer (or to `base:` if every module may use it and it uses only base modules)"
    );
    assert!(unknown.is_empty(), "the ```layers block of {ARCHITECTURE} names modules host/src/lib.rs does not declare: {unknown:?}; remove them");
    order
}

/// The imports against the order, by (file, path), each with its first line.
fn upward(order: &Order, imports: &[Import]) -> BTreeMap<(String, String), Import> {
    let mut out = BTreeMap::new();
    for i in imports {
        if !order.allows(&i.from, &i.to) {
            out.entry((i.file.clone(), i.path.clone())).or_insert_with(|| i.clone());
        }
    }
    out
}

#[test]
fn every_module_is_in_the_documented_order() {
    let order = order();
    assert!(order.rank.contains_key("coll") && !order.base.is_empty());
}

#[test]
fn no_module_imports_a_higher_layer() {
    let order = order();
    let imports = all_imports();
    let found = upward(&order, &imports);
    let debt: BTreeMap<(String, String), &str> = DEBT.iter().map(|(f, p, why)| ((f.to_string(), p.to_string()), *why)).collect();
    assert_eq!(debt.len(), DEBT.len(), "DEBT lists an import twice");
    let mut new = Vec::new();
    for ((file, path), i) in &found {
        if !debt.contains_key(&(file.clone(), path.clone())) {
            new.push((file.clone(), i.line, format!("host/src/{file}:{}: {} imports {} (`{path}`)", i.line, i.from, i.to)));
        }
    }
    new.sort();
    let mut stale = Vec::new();
    for ((file, path), why) in &debt {
        if !found.contains_key(&(file.clone(), path.clone())) {
            let still = imports.iter().any(|i| &i.file == file && &i.path == path);
            let now = if still { "is no longer against the order" } else { "is no longer in the sources" };
            stale.push(format!("host/src/{file}: `{path}` ({why}) {now}"));
        }
    }
    let mut report = String::new();
    if !new.is_empty() {
        report += &format!(
            "{} import(s) from a module to a higher layer (the order is the ```layers block of {ARCHITECTURE}):\n{}\n\
             A module uses only modules on lower lines and the `base:` line. Move what the lower module needs \
             down (into it or a module below it), or let the higher module pass it in (a value, a trait \
             object, a callback). Do not add the import to DEBT: that list only shrinks.\n",
            new.len(),
            new.iter().map(|(_, _, m)| m.as_str()).collect::<Vec<_>>().join("\n")
        );
    }
    if !stale.is_empty() {
        report += &format!(
            "{} DEBT entr(y/ies) in host/tests/layers.rs no longer needed: remove them (the list only shrinks):\n{}\n",
            stale.len(),
            stale.join("\n")
        );
    }
    assert!(report.is_empty(), "{report}");
}

/// The scanner itself: groups, `super::` climbs, `$crate::` and re-exports count; comments
/// and strings do not.
#[test]
fn the_scanner_finds_paths_as_written() {
    let modules: BTreeSet<String> = ["coll", "comm", "exec", "error"].iter().map(|s| s.to_string()).collect();
    let reexports: BTreeMap<String, String> = [("Communicator".to_string(), "comm".to_string())].into();
    let src = r#"
//! Talks about [`crate::coll::Task`] in a doc comment.
use crate::{coll::{plan, Task}, error::Result};
use super::super::Links;
/* crate::comm::Inner in a block comment */
fn f() -> &'static str { let c = 'x'; let _ = crate::Communicator::new; "crate::coll::in_a_string" }
macro_rules! m { () => { $crate::comm::note() } }
mod tests {
    use super::super::super::super::coll::Task;
    use super::*;
}
"#;
    let found = imports_of("exec/gpu/encode.rs", src, &modules, &reexports).unwrap();
    let got: Vec<(usize, &str, &str)> = found.iter().map(|i| (i.line, i.to.as_str(), i.path.as_str())).collect();
    assert_eq!(
        got,
        [
            (3, "coll", "crate::coll::{plan,Task}"),
            (3, "error", "crate::error::Result"),
            (6, "comm", "crate::Communicator::new"),
            (7, "comm", "crate::comm::note"),
            (9, "coll", "crate::coll::Task"),
        ]
    );
}

/// The folders of host/src that ask the communicator's executor (`exec::executor::Executor`,
/// `comm.engine().executor()`) how work runs, never the backend whose memory it is
/// (issue 32 item 4: executors own execution).
const ASK_THE_EXECUTOR: &[&str] = &["coll", "comm"];

/// Where `src` reads `host_addressable` in code (comments and strings aside): 1-based lines.
fn host_addressable_reads(src: &str) -> Vec<usize> {
    let code = code_only(src);
    let word = "host_addressable";
    let mut lines = Vec::new();
    for (at, _) in code.match_indices(word) {
        let before = code.as_bytes()[..at].last().copied();
        let after = code.as_bytes().get(at + word.len()).copied();
        if before.is_some_and(is_ident) || after.is_some_and(is_ident) {
            continue;
        }
        lines.push(code[..at].matches('\n').count() + 1);
    }
    lines.dedup();
    lines
}

/// coll and comm ask the executor where and how work runs (`runs_on_host`, `symmetric`,
/// `cpu_reads_buffers`, ...): a read of the backend's `Capabilities::host_addressable` there
/// fails, naming its file and line.
#[test]
fn coll_and_comm_ask_the_executor_not_host_addressable() {
    let src = host_dir().join("src");
    let mut found = Vec::new();
    for dir in ASK_THE_EXECUTOR {
        let mut files = Vec::new();
        rust_files(&src.join(dir), &mut files);
        files.sort();
        for path in files {
            let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&path).unwrap();
            found.extend(host_addressable_reads(&text).into_iter().map(|line| format!("host/src/{rel}:{line}")));
        }
    }
    assert!(
        found.is_empty(),
        "{} read(s) of the backend's host_addressable in {ASK_THE_EXECUTOR:?}:\n{}\n\
         Ask the communicator's executor instead (`comm.engine().executor()`, exec/executor.rs), with a \
         question named for what the code needs to know (where work runs, how symmetric collectives run, \
         what the planner's programs need); add one there if none fits.",
        found.len(),
        found.join("\n")
    );
}

/// The scan finds reads in code, by whole word, and not in comments or strings.
#[test]
fn the_host_addressable_scan_reads_code_only() {
    let src = "// caps.host_addressable in a comment\nlet a = caps.host_addressable;\nlet s = \"host_addressable\";\nlet b = not_host_addressable_at_all;\nif x.capabilities().host_addressable {}\nlet host_addressable = c.host_addressable;\n";
    assert_eq!(host_addressable_reads(src), vec![2, 5, 6]);
}

//! Which library files to try for a plugin kind, from NCCL's rules (plugin-abi.md §1.2):
//!
//! - variable unset: the default names `librustccl-<kind>.so`, then `libnccl-<kind>.so`;
//! - `none` (any case): no external plugin;
//! - otherwise a comma list (the net accepts several; tuner and profiler take the first); each
//!   entry is tried verbatim (a path or a library file name), then, when it has no `/` and is
//!   not a `lib*.so` name, as `librustccl-<kind>-<entry>.so` and `libnccl-<kind>-<entry>.so`.
//!
//! Pure functions, so that each rule is tested without a library in sight.

use rustccl_plugin_api::export::PluginKind;

/// One thing the user asked for (or a default), and the file names that may satisfy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What the user wrote, or the default name.
    pub request: String,
    /// Whether the user named it (failures of user choices are warnings; of defaults, not).
    pub explicit: bool,
    pub files: Vec<String>,
}

/// What the variable asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `none`: built-in plugins only.
    Disabled,
    Candidates(Vec<Candidate>),
}

fn names_for(kind: PluginKind, entry: &str) -> Vec<String> {
    let mut files = vec![entry.to_string()];
    let is_lib_name = entry.starts_with("lib") && entry.contains(".so");
    if !entry.contains('/') && !is_lib_name {
        files.push(format!("librustccl-{}-{entry}.so", kind.name()));
        files.push(format!("libnccl-{}-{entry}.so", kind.name()));
    }
    files
}

/// The candidates for `kind` given the variable's value.
pub fn candidates(kind: PluginKind, value: Option<&str>) -> Request {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    let Some(value) = value else {
        let files = vec![format!("librustccl-{}.so", kind.name()), format!("libnccl-{}.so", kind.name())];
        return Request::Candidates(vec![Candidate { request: files[0].clone(), explicit: false, files }]);
    };
    if value.eq_ignore_ascii_case("none") {
        return Request::Disabled;
    }
    let entries: Vec<&str> = value.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    let take = if kind == PluginKind::Net { entries.len() } else { entries.len().min(1) };
    Request::Candidates(
        entries[..take]
            .iter()
            .map(|e| Candidate { request: e.to_string(), explicit: true, files: names_for(kind, e) })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(r: &Request) -> Vec<Vec<String>> {
        match r {
            Request::Disabled => vec![],
            Request::Candidates(c) => c.iter().map(|c| c.files.clone()).collect(),
        }
    }

    #[test]
    fn unset_tries_default_names() {
        let r = candidates(PluginKind::Net, None);
        assert_eq!(files(&r), vec![vec!["librustccl-net.so".to_string(), "libnccl-net.so".to_string()]]);
        assert_eq!(candidates(PluginKind::Tuner, Some("  ")), candidates(PluginKind::Tuner, None));
    }

    #[test]
    fn none_disables_in_any_case() {
        assert_eq!(candidates(PluginKind::Net, Some("NONE")), Request::Disabled);
        assert_eq!(candidates(PluginKind::Profiler, Some("none")), Request::Disabled);
    }

    #[test]
    fn a_name_expands_to_both_prefixes() {
        let r = candidates(PluginKind::Net, Some("ofi"));
        assert_eq!(files(&r), vec![vec!["ofi", "librustccl-net-ofi.so", "libnccl-net-ofi.so"]]);
        let r = candidates(PluginKind::Tuner, Some("example"));
        assert_eq!(files(&r)[0][2], "libnccl-tuner-example.so");
    }

    #[test]
    fn paths_and_library_names_are_taken_verbatim() {
        assert_eq!(files(&candidates(PluginKind::Net, Some("/opt/x/libfoo.so"))), vec![vec!["/opt/x/libfoo.so"]]);
        assert_eq!(files(&candidates(PluginKind::Net, Some("libfoo.so"))), vec![vec!["libfoo.so"]]);
        assert_eq!(files(&candidates(PluginKind::Net, Some("./rel/libfoo.so"))), vec![vec!["./rel/libfoo.so"]]);
    }

    #[test]
    fn net_takes_a_list_others_the_first_entry() {
        let r = candidates(PluginKind::Net, Some("a, /p/libb.so,,c"));
        assert_eq!(files(&r).len(), 3);
        let r = candidates(PluginKind::Tuner, Some("a,b"));
        assert_eq!(files(&r).len(), 1);
        match candidates(PluginKind::Net, Some("a")) {
            Request::Candidates(c) => assert!(c[0].explicit),
            _ => unreachable!(),
        }
    }
}

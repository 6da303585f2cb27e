//! NCCL's configuration files: `NCCL_CONF_FILE` (else `~/.nccl.conf`, the home directory of
//! the user the process runs as), then `/etc/nccl.conf`. Each holds `NAME=VALUE` lines; a line
//! starting with `#` is a comment, a line without `=` is skipped, and the value is everything
//! after the first `=` (spaces included), as NCCL reads them.
//!
//! NCCL copies the files into the process environment before it reads anything, without
//! overwriting: a variable the environment holds keeps its value, and the first file that
//! sets a name wins. rustccl does not change the process environment (other threads of the
//! program may be reading it); it reads the files once, at the first lookup, and
//! [`super::resolve`] takes a file's value where the environment has none, reporting it as
//! coming from the configuration file ([`super::Source::ConfigFile`]). With an env plugin in
//! use the plugin's answer is final and the files are not consulted: a site that uses a plugin
//! resolves its own sources there.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One setting of a file: the name, the value and the file it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    pub file: PathBuf,
}

/// The settings of `text`, in file order.
pub fn parse(text: &str, file: &Path) -> Vec<Setting> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, value)| Setting { name: name.to_string(), value: value.to_string(), file: file.to_path_buf() })
        .collect()
}

/// The files NCCL reads, in order of precedence: `NCCL_CONF_FILE` (read from the process
/// environment, as NCCL does) or `~/.nccl.conf`, then `/etc/nccl.conf`.
pub fn files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    match std::env::var_os("NCCL_CONF_FILE").filter(|v| !v.is_empty()) {
        Some(user) => files.push(PathBuf::from(user)),
        None => {
            if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::getuid()) {
                files.push(user.dir.join(".nccl.conf"));
            }
        }
    }
    files.push(PathBuf::from("/etc/nccl.conf"));
    files
}

/// Every setting of the files, first file first (a file that cannot be read sets nothing).
fn settings() -> &'static [Setting] {
    static SETTINGS: OnceLock<Vec<Setting>> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        files().into_iter().flat_map(|f| std::fs::read_to_string(&f).map(|t| parse(&t, &f)).unwrap_or_default()).collect()
    })
}

/// The value the files give `name` (the first file that sets it), blank values left out.
pub fn get(name: &str) -> Option<&'static Setting> {
    settings().iter().find(|s| s.name == name && !s.value.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_as_nccl_reads_them() {
        let f = Path::new("/x/nccl.conf");
        let s = parse("# comment\nNCCL_PROTO=LL\nno equals sign\nNCCL_ALGO=Ring,Tree = x\n=orphan\n#NCCL_DEBUG=INFO\nNCCL_X=\n", f);
        let pairs: Vec<(&str, &str)> = s.iter().map(|s| (s.name.as_str(), s.value.as_str())).collect();
        assert_eq!(pairs, [("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring,Tree = x"), ("NCCL_X", "")]);
        assert!(s.iter().all(|s| s.file == f));
    }

    #[test]
    fn the_system_file_comes_last() {
        let files = files();
        assert_eq!(files.last().map(PathBuf::as_path), Some(Path::new("/etc/nccl.conf")));
        assert_eq!(files.len(), 2);
    }
}

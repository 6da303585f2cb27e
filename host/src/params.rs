//! Parameters. NCCL's own names (`NCCL_*`) keep their NCCL meaning; rustccl's own knobs are
//! `RUSTCCL_*`. Every parameter the library reads goes through [`resolve`] (and the helpers
//! built on it: [`env_str`], [`env_int`], [`env_int_or`], [`env_seconds_or`]), which asks the
//! env plugin when one is in use ([`crate::plugin::env`]), else the process environment, then
//! NCCL's configuration files ([`conf_file`]), and says where the value came from
//! ([`Source`]). Each value set by the user, a file or the plugin is logged once (ENV).
//! [`table`] lists them all, for the parameter query API (NCCL 2.30's `ncclParam*`).

pub mod conf_file;
pub mod table;

pub use table::{lookup, Param, ParamType, ParamValue};

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::plugin::env::{self as env_plugin, Answer};

/// Where a parameter's value came from (NCCL 2.30's `ncclParamSource_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Not set: the parameter's default applies.
    Default,
    /// The process environment (with an env plugin in use: the plugin answered the
    /// environment's own value).
    Environment,
    /// The env plugin answered a value the environment does not hold.
    Plugin,
    /// A configuration file ([`conf_file`]): the environment does not set it and no env
    /// plugin is in use.
    ConfigFile,
}

impl Source {
    /// NCCL's name, as `ncclParamDumpAll` prints it (`set_by=`).
    pub fn nccl_name(self) -> &'static str {
        match self {
            Source::Default => "Default",
            Source::Environment => "EnvVar",
            Source::Plugin => "EnvPlugin",
            Source::ConfigFile => "ConfigFile",
        }
    }
}

/// A parameter's value as the library sees it, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// `None`: unset (or set to blanks), so the default applies.
    pub value: Option<String>,
    pub source: Source,
    /// The env plugin that was asked, if one is in use.
    pub plugin: Option<&'static str>,
    /// The environment holds a value that the env plugin left unset.
    pub hidden_by_plugin: bool,
    /// The configuration file the value came from ([`Source::ConfigFile`]).
    pub file: Option<&'static std::path::Path>,
}

/// The variable of the process environment, `None` when unset or blank.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The one function through which the library reads a parameter, without logging it.
///
/// With an env plugin in use, its answer decides (see [`crate::plugin::env`]): a value equal
/// to the environment's counts as [`Source::Environment`] (the plugin passed it through), any
/// other as [`Source::Plugin`], and no value as unset even where the environment has one.
/// Without one, the environment decides, then the configuration files ([`conf_file`]).
/// `NCCL_ENV_PLUGIN` and `NCCL_CONF_FILE` themselves are read from the environment (they say
/// where the others come from).
pub fn resolve(name: &str) -> Resolved {
    let unset = Resolved { value: None, source: Source::Default, plugin: None, hidden_by_plugin: false, file: None };
    let from_env = || match process_env(name) {
        Some(v) => Resolved { value: Some(v), source: Source::Environment, ..unset.clone() },
        None => unset.clone(),
    };
    if name == "NCCL_ENV_PLUGIN" || name == "NCCL_CONF_FILE" {
        return from_env();
    }
    match env_plugin::get(name) {
        Answer::NoPlugin => match (from_env(), conf_file::get(name)) {
            (r, Some(s)) if r.value.is_none() => {
                Resolved { value: Some(s.value.clone()), source: Source::ConfigFile, file: Some(&s.file), ..unset }
            }
            (r, _) => r,
        },
        Answer::Plugin { plugin, value } => {
            let value = value.filter(|v| !v.trim().is_empty());
            let env = process_env(name);
            let source = match (&value, &env) {
                (None, _) => Source::Default,
                (Some(v), Some(e)) if v == e => Source::Environment,
                (Some(_), _) => Source::Plugin,
            };
            Resolved { hidden_by_plugin: value.is_none() && env.is_some(), value, source, plugin: Some(plugin), file: None }
        }
    }
}

static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn log_once(name: &str, r: &Resolved) {
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if !logged.get_or_insert_with(HashSet::new).insert(name.to_string()) {
        return;
    }
    let plugin = r.plugin.unwrap_or("?");
    match (&r.value, r.source) {
        (Some(v), Source::Plugin) => tracing::info!(target: "ENV", "{name} set by env plugin {plugin} to {v}"),
        (Some(v), Source::ConfigFile) => {
            let file = r.file.map(|f| f.display().to_string()).unwrap_or_default();
            tracing::info!(target: "ENV", "{name} set by configuration file {file} to {v}")
        }
        (Some(v), _) => tracing::info!(target: "ENV", "{name} set by environment to {v}"),
        (None, _) if r.hidden_by_plugin => {
            tracing::info!(target: "ENV", "{name} is set in the environment but env plugin {plugin} leaves it unset: the default applies")
        }
        (None, _) => {}
    }
}

/// The parameter's value, or `None` when unset or empty; the first value seen is logged.
pub fn env_str(name: &str) -> Option<String> {
    let r = resolve(name);
    log_once(name, &r);
    r.value
}

/// An integer parameter: `None` when unset, an error naming the variable when it does not parse.
pub fn env_int(name: &str) -> Result<Option<i64>> {
    match env_str(name) {
        None => Ok(None),
        Some(v) => parse_int(v.trim())
            .map(Some)
            .ok_or_else(|| Error::invalid_argument(format!("{name}={v:?} is not an integer"))),
    }
}

/// An integer parameter with a default; a value that does not parse is reported and ignored.
pub fn env_int_or(name: &str, default: i64) -> i64 {
    match env_int(name) {
        Ok(Some(v)) => v,
        Ok(None) => default,
        Err(e) => {
            tracing::warn!(target: "ENV", "{}; using the default {default}", e.message);
            default
        }
    }
}

/// A duration given in (possibly fractional) seconds, with a default.
pub fn env_seconds_or(name: &str, default: Duration) -> Duration {
    match env_str(name) {
        None => default,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
            _ => {
                tracing::warn!(target: "ENV", "{name}={v:?} is not a positive number of seconds; using {default:?}");
                default
            }
        },
    }
}

/// Parses decimal or 0x-prefixed hexadecimal, with an optional sign.
fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => digits.parse::<i64>().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// How long bootstrap waits (rendezvous, and each bootstrap operation after it) before it
/// gives up: `RUSTCCL_BOOTSTRAP_TIMEOUT` seconds, 120 by default.
pub fn bootstrap_timeout() -> Duration {
    env_seconds_or("RUSTCCL_BOOTSTRAP_TIMEOUT", Duration::from_secs(120))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_hex_and_signs() {
        assert_eq!(parse_int("42"), Some(42));
        assert_eq!(parse_int("-7"), Some(-7));
        assert_eq!(parse_int("0x10"), Some(16));
        assert_eq!(parse_int("+3"), Some(3));
        assert_eq!(parse_int("abc"), None);
        assert_eq!(parse_int(""), None);
    }

    #[test]
    fn without_an_env_plugin_the_environment_decides_and_says_so() {
        // No env plugin is installed where unit tests run (the lookup finds none).
        std::env::set_var("RUSTCCL_TEST_PARAM_SOURCE", " 7 ");
        let r = resolve("RUSTCCL_TEST_PARAM_SOURCE");
        assert_eq!((r.value.as_deref(), r.source, r.plugin), (Some(" 7 "), Source::Environment, None));
        std::env::set_var("RUSTCCL_TEST_PARAM_SOURCE", "  ");
        assert_eq!(resolve("RUSTCCL_TEST_PARAM_SOURCE").source, Source::Default, "blank is unset");
        assert_eq!(resolve("RUSTCCL_TEST_PARAM_NEVER_SET").value, None);
        assert_eq!(
            [Source::Default, Source::Environment, Source::Plugin, Source::ConfigFile].map(Source::nccl_name),
            ["Default", "EnvVar", "EnvPlugin", "ConfigFile"]
        );
    }

    #[test]
    fn bad_integer_names_the_variable() {
        std::env::set_var("RUSTCCL_TEST_PARAM_BAD", "twelve");
        let e = env_int("RUSTCCL_TEST_PARAM_BAD").unwrap_err();
        assert!(e.message.contains("RUSTCCL_TEST_PARAM_BAD"));
        assert_eq!(env_int_or("RUSTCCL_TEST_PARAM_BAD", 5), 5);
        std::env::set_var("RUSTCCL_TEST_PARAM_OK", "0x20");
        assert_eq!(env_int_or("RUSTCCL_TEST_PARAM_OK", 5), 32);
        assert_eq!(env_int("RUSTCCL_TEST_PARAM_UNSET").unwrap(), None);
    }
}

//! Parameters from the environment. NCCL's own names (`NCCL_*`) keep their NCCL meaning;
//! rustccl's own knobs are `RUSTCCL_*`. Each value set by the user is logged once (ENV).
//! [`table`] lists them all, for the parameter query API (NCCL 2.30's `ncclParam*`).

pub mod table;

pub use table::{lookup, Param, ParamType, ParamValue};

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};

static LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn log_once(name: &str, value: &str) {
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if logged.get_or_insert_with(HashSet::new).insert(name.to_string()) {
        tracing::info!(target: "ENV", "{name} set by environment to {value}");
    }
}

/// The variable's value, or `None` when unset or empty.
pub fn env_str(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            log_once(name, &v);
            Some(v)
        }
        _ => None,
    }
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

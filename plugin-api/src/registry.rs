//! Handle tables for net plugins. Every object a plugin hands out (context, listener, send and receive
//! connection, registration, request) is a number in one of these tables; the number's top
//! byte says which table, so a handle of the wrong kind (a listener passed as a connection)
//! is unknown rather than confused with another object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::{PluginError, PluginHandle};

/// The kinds of handle, as the top byte of their number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Context = 1,
    Listen = 2,
    Send = 3,
    Recv = 4,
    Mr = 5,
    Request = 6,
}

impl Kind {
    /// What a handle of this kind names, as errors say it ("send connection").
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Context => "net context",
            Kind::Listen => "listen",
            Kind::Send => "send connection",
            Kind::Recv => "receive connection",
            Kind::Mr => "memory registration",
            Kind::Request => "request",
        }
    }
}

/// The error for a handle that names no live `what` ("send connection", or "connection"
/// where either kind would do): an invalid argument, since the caller passed a handle the
/// plugin never gave out or has closed already.
pub fn unknown(what: &str, handle: PluginHandle) -> PluginError {
    PluginError::invalid_argument(format!(
        "unknown {what} handle {:#x}: closed already, or not one this plugin gave out",
        handle.id
    ))
}

/// One table of `T` by handle number.
#[derive(Debug)]
pub struct Registry<T> {
    kind: Kind,
    next: AtomicU64,
    items: Mutex<HashMap<u64, T>>,
}

impl<T> Registry<T> {
    pub fn new(kind: Kind) -> Self {
        Registry {
            kind,
            next: AtomicU64::new(1),
            items: Mutex::new(HashMap::new()),
        }
    }

    /// A poisoned lock is recovered: the tables stay consistent (every change is one
    /// insert or remove), and a plugin must not panic across the ABI.
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, T>> {
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh handle of this table's kind, not yet holding anything.
    pub fn reserve(&self) -> PluginHandle {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        PluginHandle {
            id: (self.kind as u64) << 56 | (n & ((1 << 56) - 1)),
        }
    }

    /// Stores `item` under a handle from [`Registry::reserve`].
    pub fn insert_at(&self, handle: PluginHandle, item: T) {
        self.lock().insert(handle.id, item);
    }

    pub fn insert(&self, item: T) -> PluginHandle {
        let h = self.reserve();
        self.insert_at(h, item);
        h
    }

    pub fn with<R>(&self, handle: PluginHandle, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.lock().get_mut(&handle.id).map(f)
    }

    pub fn remove(&self, handle: PluginHandle) -> Option<T> {
        self.lock().remove(&handle.id)
    }

    /// [`Registry::remove`], or the [`unknown`] error naming this table's kind.
    pub fn remove_or_unknown(&self, handle: PluginHandle) -> Result<T, PluginError> {
        self.remove(handle).ok_or_else(|| self.unknown(handle))
    }

    /// The [`unknown`] error for `handle`, named by this table's kind.
    pub fn unknown(&self, handle: PluginHandle) -> PluginError {
        unknown(self.kind.noun(), handle)
    }

    /// Removes and returns every item for which `pred` holds, with its handle number.
    pub fn remove_where(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<(u64, T)> {
        let mut items = self.lock();
        let ids: Vec<u64> = items
            .iter()
            .filter(|(_, v)| pred(v))
            .map(|(k, _)| *k)
            .collect();
        ids.into_iter()
            .filter_map(|id| items.remove(&id).map(|v| (id, v)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Clone> Registry<T> {
    pub fn get(&self, handle: PluginHandle) -> Option<T> {
        self.lock().get(&handle.id).cloned()
    }

    /// [`Registry::get`], or the [`unknown`] error naming this table's kind: the lookup
    /// of every plugin call that takes a handle.
    pub fn get_or_unknown(&self, handle: PluginHandle) -> Result<T, PluginError> {
        self.get(handle).ok_or_else(|| self.unknown(handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_per_kind() {
        let a: Registry<&str> = Registry::new(Kind::Send);
        let b: Registry<&str> = Registry::new(Kind::Recv);
        let ha = a.insert("a");
        let hb = b.insert("b");
        assert_ne!(ha, hb);
        assert_eq!(
            a.get(hb),
            None,
            "a receive handle is unknown to the send table"
        );
        assert_eq!(a.get(ha), Some("a"));
        assert_eq!(a.get(PluginHandle { id: 0 }), None);
        let r = a.reserve();
        assert_eq!(a.get(r), None);
        a.insert_at(r, "r");
        assert_eq!(a.len(), 2);
        assert_eq!(a.remove_where(|v| *v == "r"), vec![(r.id, "r")]);
        assert_eq!(a.remove(ha), Some("a"));
        assert_eq!(a.remove(ha), None);
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn unknown_handles_are_errors_naming_the_kind() {
        let sends: Registry<&str> = Registry::new(Kind::Send);
        let h = sends.insert("a");
        assert_eq!(sends.get_or_unknown(h), Ok("a"));
        let e = sends.get_or_unknown(PluginHandle { id: 0x42 }).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_ARGUMENT);
        assert!(
            e.message
                .starts_with("unknown send connection handle 0x42: "),
            "{e}"
        );
        assert_eq!(sends.remove_or_unknown(h), Ok("a"));
        let e = sends.remove_or_unknown(h).unwrap_err();
        assert!(
            e.message
                .starts_with(&format!("unknown send connection handle {:#x}: ", h.id)),
            "{e}"
        );
        let mrs: Registry<()> = Registry::new(Kind::Mr);
        assert!(mrs
            .get_or_unknown(h)
            .unwrap_err()
            .message
            .starts_with("unknown memory registration handle "));
    }
}

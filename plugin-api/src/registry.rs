//! Handle tables for net plugins. Every object a plugin hands out (context, listener, send and receive
//! connection, registration, request) is a number in one of these tables; the number's top
//! byte says which table, so a handle of the wrong kind (a listener passed as a connection)
//! is unknown rather than confused with another object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::PluginHandle;

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
}

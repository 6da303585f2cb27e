//! The registration cache: NCCL registers page ranges and shares a registration between
//! buffers whose pages it covers, counting references, because `ibv_reg_mr` pins memory and
//! costs far more than a lookup. `regMr` of a range inside a cached one takes a reference;
//! `deregMr` drops one, and the last one deregisters.
//!
//! The cache is generic over the registration (`R`), so its bookkeeping is tested without
//! a device.

use std::sync::Arc;

/// The page-aligned range `[start, end)` covering `size` bytes at `addr` (at least one
/// page, so a 0-byte buffer still has a registration).
pub fn page_range(addr: usize, size: usize, page: usize) -> (usize, usize) {
    let start = addr & !(page - 1);
    let end = (addr + size.max(1)).div_ceil(page) * page;
    (start, end)
}

struct Entry<R> {
    id: u64,
    start: usize,
    end: usize,
    refs: usize,
    reg: Arc<R>,
}

/// Cached registrations of one protection domain.
pub struct MrCache<R> {
    page: usize,
    next_id: u64,
    entries: Vec<Entry<R>>,
}

impl<R> MrCache<R> {
    /// A cache for pages of `page` bytes (a power of two).
    pub fn new(page: usize) -> Self {
        assert!(page.is_power_of_two());
        MrCache {
            page,
            next_id: 1,
            entries: Vec::new(),
        }
    }

    /// A reference to a registration covering `addr..addr + size`: a cached one, or a new
    /// one of the covering pages made by `register(start, len)`. Returns the entry's id (for
    /// [`MrCache::release`]) and the registration.
    pub fn acquire<E>(
        &mut self,
        addr: usize,
        size: usize,
        register: impl FnOnce(usize, usize) -> Result<R, E>,
    ) -> Result<(u64, Arc<R>), E> {
        let (start, end) = page_range(addr, size, self.page);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.start <= start && end <= e.end)
        {
            e.refs += 1;
            return Ok((e.id, Arc::clone(&e.reg)));
        }
        let reg = Arc::new(register(start, end - start)?);
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            start,
            end,
            refs: 1,
            reg: Arc::clone(&reg),
        });
        Ok((id, reg))
    }

    /// Drops a reference to entry `id`; the last one removes the entry (its registration
    /// goes when the last `Arc` does). `false` if there is no such entry.
    pub fn release(&mut self, id: u64) -> bool {
        let Some(at) = self.entries.iter().position(|e| e.id == id) else {
            return false;
        };
        self.entries[at].refs -= 1;
        if self.entries[at].refs == 0 {
            self.entries.swap_remove(at);
        }
        true
    }

    /// References held on entry `id` (0 if gone).
    pub fn refs(&self, id: u64) -> usize {
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map_or(0, |e| e.refs)
    }

    /// Registrations cached now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges() {
        assert_eq!(page_range(0x1000, 1, 4096), (0x1000, 0x2000));
        assert_eq!(page_range(0x1fff, 2, 4096), (0x1000, 0x3000));
        assert_eq!(page_range(0x1234, 0, 4096), (0x1000, 0x2000));
        assert_eq!(page_range(0x2000, 0x2000, 4096), (0x2000, 0x4000));
    }

    #[test]
    fn counts_references_by_page_range() {
        let mut cache: MrCache<(usize, usize)> = MrCache::new(4096);
        let mut made = Vec::new();
        let mut reg = |s: usize, l: usize| -> Result<(usize, usize), ()> {
            made.push((s, l));
            Ok((s, l))
        };
        let (a, ra) = cache.acquire(0x10010, 0x3000, &mut reg).unwrap();
        assert_eq!(*ra, (0x10000, 0x4000));
        // Inside the same pages: shared, no new registration.
        let (b, rb) = cache.acquire(0x11000, 0x100, &mut reg).unwrap();
        assert_eq!(a, b);
        assert!(Arc::ptr_eq(&ra, &rb));
        assert_eq!(cache.refs(a), 2);
        // Reaching past them: a registration of its own.
        let (c, _) = cache.acquire(0x13000, 0x2000, &mut reg).unwrap();
        assert_ne!(a, c);
        assert_eq!(made, vec![(0x10000, 0x4000), (0x13000, 0x2000)]);
        assert!(cache.release(a));
        assert_eq!(cache.refs(a), 1);
        assert_eq!(cache.len(), 2);
        assert!(cache.release(b));
        assert_eq!(cache.refs(a), 0);
        assert_eq!(cache.len(), 1);
        assert!(!cache.release(a), "a released entry is gone");
        // A failed registration leaves nothing behind.
        let e = cache.acquire(0x900000, 1, |_, _| Err::<(usize, usize), _>("ENOMEM"));
        assert_eq!(e.err(), Some("ENOMEM"));
        assert_eq!(cache.len(), 1);
    }
}

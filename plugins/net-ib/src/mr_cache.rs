//! The registration cache: NCCL registers page ranges and shares a registration between
//! buffers whose pages it covers, counting references, because `ibv_reg_mr` pins memory and
//! costs far more than a lookup. `regMr` of a range inside a cached one takes a reference;
//! `deregMr` drops one, and the last one deregisters.
//!
//! Each entry also records what memory backs it ([`Backing`]): NCCL keys its cache by address
//! alone, relying on unified addressing to keep GPU and host ranges apart; here a dma-buf
//! registration only serves a buffer of the same dma-buf at the matching file offset, and a
//! host registration only host buffers, even for the same addresses (a test maps a memfd
//! where it also registers host memory, and an unmapped-then-remapped range may change
//! backing).
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

/// What memory a registration maps, part of the cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Process memory registered by address (`ibv_reg_mr`).
    Host,
    /// A dma-buf (`ibv_reg_dmabuf_mr`): the file (its `st_dev`, `st_ino`: a dma-buf's identity
    /// whatever fd number names it) and the file offset of the range's first byte.
    DmaBuf { dev: u64, ino: u64, offset: u64 },
}

impl Backing {
    /// Whether a registration backed by `self` from address `start` also holds the bytes
    /// that `other` names from address `other_start` (`>= start`): same kind, same file,
    /// and the file offsets differ as the addresses do.
    fn holds(&self, start: usize, other: &Backing, other_start: usize) -> bool {
        match (self, other) {
            (Backing::Host, Backing::Host) => true,
            (
                Backing::DmaBuf { dev, ino, offset },
                Backing::DmaBuf {
                    dev: d2,
                    ino: i2,
                    offset: o2,
                },
            ) => {
                (dev, ino) == (d2, i2)
                    && o2.checked_sub(*offset) == u64::try_from(other_start - start).ok()
            }
            _ => false,
        }
    }
}

struct Entry<R> {
    id: u64,
    backing: Backing,
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
        self.acquire_backed(Backing::Host, addr, size, register)
    }

    /// [`MrCache::acquire`] for memory backed by `backing`, whose offset (for a dma-buf) is
    /// that of the first byte of the covering pages ([`page_range`]'s start).
    pub fn acquire_backed<E>(
        &mut self,
        backing: Backing,
        addr: usize,
        size: usize,
        register: impl FnOnce(usize, usize) -> Result<R, E>,
    ) -> Result<(u64, Arc<R>), E> {
        let (start, end) = page_range(addr, size, self.page);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.start <= start && end <= e.end && e.backing.holds(e.start, &backing, start))
        {
            e.refs += 1;
            return Ok((e.id, Arc::clone(&e.reg)));
        }
        let reg = Arc::new(register(start, end - start)?);
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            backing,
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

    #[test]
    fn dmabuf_and_host_registrations_of_the_same_pages_are_apart() {
        let mut cache: MrCache<(Backing, usize, usize)> = MrCache::new(4096);
        let buf = |offset| Backing::DmaBuf {
            dev: 9,
            ino: 77,
            offset,
        };
        let host = cache
            .acquire(0x10000, 0x4000, |s, l| Ok::<_, ()>((Backing::Host, s, l)))
            .unwrap();
        // The same pages as a dma-buf: a registration of their own, both ways round.
        let dma = cache
            .acquire_backed(buf(0x2000), 0x10000, 0x4000, |s, l| {
                Ok::<_, ()>((buf(0x2000), s, l))
            })
            .unwrap();
        assert_ne!(host.0, dma.0);
        assert_eq!(dma.1 .0, buf(0x2000));
        let again = cache
            .acquire(0x11000, 0x100, |_, _| Err(()))
            .expect("host pages inside the host registration are cached");
        assert_eq!(again.0, host.0);
        // Inside the dma-buf one at the matching file offset (0x2000 + 0x1000): shared.
        let inner = cache
            .acquire_backed(buf(0x3000), 0x11000, 0x100, |_, _| Err(()))
            .expect("cached");
        assert_eq!(inner.0, dma.0);
        // Same pages, another offset of the file, or another file: new registrations.
        let mut made = 0;
        for other in [
            buf(0x9000),
            Backing::DmaBuf {
                dev: 9,
                ino: 78,
                offset: 0x3000,
            },
        ] {
            let r = cache
                .acquire_backed(other, 0x11000, 0x100, |s, l| {
                    made += 1;
                    Ok::<_, ()>((other, s, l))
                })
                .unwrap();
            assert_ne!(r.0, dma.0);
        }
        assert_eq!(made, 2);
        assert_eq!(cache.refs(dma.0), 2);
        assert_eq!(cache.refs(host.0), 2);
    }
}

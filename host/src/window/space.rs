//! Offsets in a communicator's symmetric space: every rank makes the same sequence of window
//! registrations, so a first-fit allocator over the same range gives every rank the same
//! offset for the same window (NCCL's "big space"; offsets are never exchanged).

use std::collections::BTreeMap;

/// Free ranges of `[0, size)`, by start.
#[derive(Debug)]
pub struct Space {
    size: u64,
    free: BTreeMap<u64, u64>,
}

impl Space {
    pub fn new(size: u64) -> Space {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Space { size, free }
    }

    /// The lowest offset, a multiple of `align` (a power of two), where `bytes` fit; `None`
    /// when none is left.
    pub fn alloc(&mut self, bytes: u64, align: u64) -> Option<u64> {
        debug_assert!(align.is_power_of_two());
        if bytes == 0 {
            return None;
        }
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            (at.checked_add(bytes)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + bytes < start + len {
            self.free.insert(at + bytes, start + len - at - bytes);
        }
        Some(at)
    }

    /// Gives `[off, off + bytes)` back (it must have come from `alloc`), merged with its free
    /// neighbours.
    pub fn free(&mut self, off: u64, bytes: u64) {
        let (mut start, mut end) = (off, off + bytes);
        debug_assert!(end <= self.size);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            debug_assert!(s + l <= start, "freeing a free range");
            if s + l == start {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(&l) = self.free.get(&end) {
            self.free.remove(&end);
            end += l;
        }
        self.free.insert(start, end - start);
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.free.get(&0) == Some(&self.size) || self.size == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_aligned_and_merged_back() {
        let mut s = Space::new(1 << 20);
        let a = s.alloc(5000, 4096).unwrap();
        let b = s.alloc(4096, 4096).unwrap();
        let c = s.alloc(100, 65536).unwrap();
        assert_eq!((a, b, c), (0, 8192, 65536));
        // The hole left by `a` takes a small allocation first.
        s.free(a, 5000);
        assert_eq!(s.alloc(4096, 4096), Some(0));
        s.free(0, 4096);
        s.free(b, 4096);
        s.free(c, 100);
        assert!(s.is_empty());
        assert_eq!(s.alloc(1 << 20, 4096), Some(0));
        assert_eq!(s.alloc(1, 1), None);
    }

    #[test]
    fn same_sequence_same_offsets() {
        // Two ranks doing the same registrations and deregistrations agree on every offset.
        let run = || {
            let mut s = Space::new(64 << 20);
            let mut got = Vec::new();
            let x = s.alloc(3 << 20, 2 << 20).unwrap();
            let y = s.alloc(1 << 20, 2 << 20).unwrap();
            s.free(x, 3 << 20);
            got.extend([x, y, s.alloc(2 << 20, 2 << 20).unwrap(), s.alloc(5 << 20, 2 << 20).unwrap()]);
            got
        };
        assert_eq!(run(), run());
        assert_eq!(run(), vec![0, 4 << 20, 0, 6 << 20]);
    }

    #[test]
    fn too_large_or_empty_is_none() {
        let mut s = Space::new(8192);
        assert_eq!(s.alloc(8193, 1), None);
        assert_eq!(s.alloc(0, 1), None);
        assert_eq!(s.alloc(8192, 1), Some(0));
        assert_eq!(s.alloc(1, 1), None);
    }
}

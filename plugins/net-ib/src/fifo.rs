//! The clear-to-send (CTS) FIFO, NCCL's way of telling a sender where to write, and the size
//! records through which a multi-receive learns what arrived.
//!
//! Each send connection owns [`FIFO_ROWS`] rows of [`MAX_RECVS`] [`CtsEntry`]s in registered
//! memory (256 entries). For its `seq`-th receive (from 0) of `n` buffers, the receiver fills
//! entries `0..n` of row [`row_of`]`(seq)` (buffer address, rkey, size, tag; `nreqs` = `n`,
//! `idx` = [`idx_of`]`(seq)` in every one) and RDMA-writes those `n` entries into the
//! sender's row with one write. The sender never calls verbs to learn of it: it reads the row
//! in its own memory ([`Fifo::posted`]) and treats it as posted once **every** entry's `idx`
//! is the one its `seq`-th row expects: the parts of one write may land in any order, so
//! entry 0 being there proves nothing about entry 7. `idx` counts on past the row number, so
//! a row written 32 receives ago (same row, older `idx`) is never taken for the current one.
//!
//! The same registered block holds [`FIFO_ROWS`] × [`MAX_RECVS`] `u32` **size records**: a
//! receive of `n > 1` buffers cannot learn its sizes from one 32-bit immediate, so the sender
//! RDMA-writes the `n` sizes into the receiver's record row (from its own copy, the staging
//! of that write) before the write-with-immediate that completes the receive. On the sending
//! side the block's entries are written by the peer and its records are staging; on the
//! receiving side it is the other way round ([`Fifo::inbox_addr`]).
//!
//! **A row is never overwritten before it was read.** Rows are used in order on both sides,
//! and a connection keeps at most [`FIFO_ROWS`] receives in flight (`qp::MAX_INFLIGHT`). The
//! receiver reuses row `r` for receive `seq + 32` only after one of the 32 receives
//! `seq..seq + 32` was completed and tested; receives complete in row order (the sender
//! posts rows in order on in-order QPs), so receive `seq` completed, which needs the sender
//! to have read row `seq` and posted its data, and the sender's writes from its size-record
//! staging for `seq` (ordered before that completion on QP 0) to be done too. The same
//! argument covers the receiver's staging copy of the row, read by its CTS write.

/// Rows of a FIFO: receives a connection keeps in flight (NCCL's `MAX_REQUESTS`).
pub const FIFO_ROWS: usize = 32;

/// Buffers one receive may have (NCCL's `NCCL_NET_IB_MAX_RECVS`): the plugin's `max_recvs`.
pub const MAX_RECVS: usize = 8;

/// Entries of a FIFO: [`FIFO_ROWS`] × [`MAX_RECVS`].
pub const FIFO_ENTRIES: usize = FIFO_ROWS * MAX_RECVS;

/// Physical devices a merged (virtual) device may have (NCCL's `NCCL_IB_MAX_DEVS_PER_NIC`).
pub const MAX_DEVS_PER_NIC: usize = 4;

/// One CTS entry, as written into the sender's memory (fixed layout, 64 bytes: both ends
/// read it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsEntry {
    /// Receive buffer address (in the receiver's registration).
    pub addr: u64,
    /// Receive buffer size: the most the sender may write.
    pub size: u64,
    /// rkeys of the receive buffer's registration, one per physical device of the
    /// connection (a merged device registers the buffer on each); entry 0 otherwise.
    pub rkeys: [u32; MAX_DEVS_PER_NIC],
    /// The receive's tag.
    pub tag: i32,
    /// Buffers of the receive this entry belongs to (1 to the plugin's `max_recvs`).
    pub nreqs: u32,
    /// [`idx_of`] the receive's sequence number; 0 = never written.
    pub idx: u64,
    pub _pad: [u64; 2],
}

/// Bytes of one entry.
pub const CTS_BYTES: usize = std::mem::size_of::<CtsEntry>();

/// Bytes of one row of size records.
pub const SIZES_ROW_BYTES: usize = MAX_RECVS * std::mem::size_of::<u32>();

/// The row of the `seq`-th receive (from 0).
pub fn row_of(seq: u64) -> usize {
    (seq % FIFO_ROWS as u64) as usize
}

/// The `idx` value that marks row [`row_of`]`(seq)` as holding the `seq`-th receive:
/// `seq + 1`, so that a zeroed FIFO holds nothing.
pub fn idx_of(seq: u64) -> u64 {
    seq + 1
}

/// Byte offset of row [`row_of`]`(seq)`'s entries from the start of the entries (for the
/// receiver's RDMA write).
pub fn row_offset(seq: u64) -> u64 {
    (row_of(seq) * MAX_RECVS * CTS_BYTES) as u64
}

/// Byte offset of row [`row_of`]`(seq)`'s size records from the start of the records (for
/// the sender's RDMA write).
pub fn sizes_offset(seq: u64) -> u64 {
    (row_of(seq) * SIZES_ROW_BYTES) as u64
}

/// The registered block: the entries, then the size records.
#[repr(C)]
struct Block {
    entries: [CtsEntry; FIFO_ENTRIES],
    sizes: [[u32; MAX_RECVS]; FIFO_ROWS],
}

/// A connection's FIFO and size records in this process's memory, a heap block that does
/// not move, so it can be registered once for the connection's life.
pub struct Fifo {
    block: Box<Block>,
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo {
            block: Box::new(Block {
                entries: [CtsEntry::default(); FIFO_ENTRIES],
                sizes: [[0; MAX_RECVS]; FIFO_ROWS],
            }),
        }
    }
}

impl Fifo {
    /// Start address of the block (for registration).
    pub fn addr(&self) -> *mut u8 {
        std::ptr::addr_of!(*self.block) as *mut u8
    }

    /// Bytes of the block.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Block>()
    }

    /// Address of the entries.
    pub fn entries_addr(&self) -> u64 {
        std::ptr::addr_of!(self.block.entries) as u64
    }

    /// Address of the size records.
    pub fn sizes_addr(&self) -> u64 {
        std::ptr::addr_of!(self.block.sizes) as u64
    }

    /// The address of the inbox, the region the peer RDMA-writes into, which this side
    /// announces in its connection info: a sender's FIFO entries (the receiver writes CTS
    /// rows there), a receiver's size records (the sender writes multi-receive sizes there).
    pub fn inbox_addr(&self, sender: bool) -> u64 {
        if sender {
            self.entries_addr()
        } else {
            self.sizes_addr()
        }
    }

    fn entry_ptr(&self, seq: u64, i: usize) -> *const CtsEntry {
        std::ptr::addr_of!(self.block.entries[row_of(seq) * MAX_RECVS + i])
    }

    /// The entries of receive `seq` (sender side) once the peer has written all of them,
    /// else `Ok(None)`; an error if the row announces an impossible buffer count. Reads are
    /// volatile: the NIC writes this memory behind the compiler's back.
    pub fn posted(&self, seq: u64) -> Result<Option<Vec<CtsEntry>>, String> {
        let idx = |i: usize| {
            // SAFETY: entry_ptr is inside the block (i < MAX_RECVS), aligned; CtsEntry is
            // plain data, read volatile as the NIC may write it concurrently.
            unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.entry_ptr(seq, i)).idx)) }
        };
        if idx(0) != idx_of(seq) {
            return Ok(None);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above.
        let n =
            unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*self.entry_ptr(seq, 0)).nreqs)) }
                as usize;
        if n == 0 || n > MAX_RECVS {
            return Err(format!(
                "the receiver's clear-to-send row {} announces {n} buffers (1 to {MAX_RECVS})",
                row_of(seq)
            ));
        }
        if (1..n).any(|i| idx(i) != idx_of(seq)) {
            return Ok(None);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above.
        Ok(Some(
            (0..n)
                .map(|i| unsafe { std::ptr::read_volatile(self.entry_ptr(seq, i)) })
                .collect(),
        ))
    }

    /// Fills row [`row_of`]`(seq)` of the receiver's staging copy with `entries` (`nreqs`
    /// and `idx` set here); returns the address and length of what to RDMA-write.
    pub fn fill(&mut self, seq: u64, entries: &[CtsEntry]) -> (u64, usize) {
        assert!(!entries.is_empty() && entries.len() <= MAX_RECVS);
        let row = row_of(seq) * MAX_RECVS;
        for (slot, e) in self.block.entries[row..].iter_mut().zip(entries) {
            *slot = CtsEntry {
                nreqs: entries.len() as u32,
                idx: idx_of(seq),
                ..*e
            };
        }
        (self.entry_ptr(seq, 0) as u64, entries.len() * CTS_BYTES)
    }

    /// Stages `sizes` in record row [`row_of`]`(seq)` (sender side); returns the address and
    /// length of what to RDMA-write.
    pub fn stage_sizes(&mut self, seq: u64, sizes: &[u32]) -> (u64, usize) {
        let row = &mut self.block.sizes[row_of(seq)];
        row[..sizes.len()].copy_from_slice(sizes);
        (row.as_ptr() as u64, std::mem::size_of_val(sizes))
    }

    /// The first `n` size records of row [`row_of`]`(seq)` (receiver side, once the receive
    /// completed), read volatile: the NIC wrote them.
    pub fn sizes(&self, seq: u64, n: usize) -> Vec<usize> {
        let row = std::ptr::addr_of!(self.block.sizes[row_of(seq)]) as *const u32;
        (0..n.min(MAX_RECVS))
            // SAFETY: i < MAX_RECVS is inside the row; plain u32s.
            .map(|i| unsafe { std::ptr::read_volatile(row.add(i)) } as usize)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_wrap_and_idx_tells_rounds_apart() {
        assert_eq!(CTS_BYTES, 64);
        assert_eq!(FIFO_ENTRIES, 256);
        assert_eq!(row_of(0), 0);
        assert_eq!(row_of(31), 31);
        assert_eq!(row_of(32), 0);
        assert_eq!(row_of(33 + 32), 1);
        assert_eq!(row_offset(3), 3 * 8 * 64);
        assert_eq!(row_offset(32 + 3), 3 * 8 * 64);
        assert_eq!(sizes_offset(3), 3 * 32);
        assert_ne!(idx_of(5), idx_of(5 + 32));
        let f = Fifo::default();
        assert_eq!(f.bytes(), 256 * 64 + 32 * 8 * 4);
        assert_eq!(f.entries_addr(), f.addr() as u64);
        assert_eq!(f.sizes_addr(), f.addr() as u64 + 256 * 64);
        assert_eq!(f.inbox_addr(true), f.entries_addr());
        assert_eq!(f.inbox_addr(false), f.sizes_addr());
    }

    fn entry(tag: i32) -> CtsEntry {
        CtsEntry {
            addr: 0x1000 * tag as u64,
            size: 64,
            rkeys: [7, 0, 0, 0],
            tag,
            ..CtsEntry::default()
        }
    }

    /// Copies `len` bytes from `src` to the same offset of `dst`'s block, as an RDMA write
    /// from one FIFO into another would.
    fn rdma_copy(src: &Fifo, from: u64, len: usize, dst: &Fifo) {
        let offset = from - src.addr() as u64;
        // SAFETY: both ranges are inside live blocks of the same layout.
        unsafe {
            std::ptr::copy_nonoverlapping(from as *const u8, dst.addr().add(offset as usize), len)
        };
    }

    #[test]
    fn a_row_is_posted_only_for_its_round_and_when_whole() {
        let mut staging = Fifo::default();
        let fifo = Fifo::default();
        assert_eq!(fifo.posted(0), Ok(None), "a zeroed FIFO holds nothing");
        // The receiver's 33rd receive (3 buffers) lands in row 0.
        let (from, len) = staging.fill(32, &[entry(1), entry(2), entry(3)]);
        assert_eq!(len, 3 * 64);
        // Only entry 0 has landed: not posted yet.
        rdma_copy(&staging, from, 64, &fifo);
        assert_eq!(fifo.posted(32), Ok(None), "entries 1 and 2 are not there");
        // Entries 0 and 2 landed, 1 not: still not posted.
        rdma_copy(&staging, from + 128, 64, &fifo);
        assert_eq!(fifo.posted(32), Ok(None));
        rdma_copy(&staging, from + 64, 64, &fifo);
        let row = fifo.posted(32).unwrap().expect("the whole row");
        assert_eq!(row.len(), 3);
        for (i, e) in row.iter().enumerate() {
            assert_eq!(
                *e,
                CtsEntry {
                    nreqs: 3,
                    idx: 33,
                    ..entry(i as i32 + 1)
                }
            );
        }
        assert_eq!(
            fifo.posted(0),
            Ok(None),
            "receive 0's row now holds receive 32"
        );
        assert_eq!(fifo.posted(1), Ok(None));
    }

    #[test]
    fn an_impossible_buffer_count_is_an_error() {
        let mut staging = Fifo::default();
        let fifo = Fifo::default();
        let (from, len) = staging.fill(0, &[entry(1)]);
        rdma_copy(&staging, from, len, &fifo);
        // SAFETY: entry 0 of row 0 of a live block.
        unsafe { (*(fifo.addr() as *mut CtsEntry)).nreqs = 9 };
        assert!(fifo.posted(0).unwrap_err().contains("announces 9 buffers"));
    }

    #[test]
    fn size_records_stage_and_read_back() {
        let mut sender = Fifo::default();
        let receiver = Fifo::default();
        let (from, len) = sender.stage_sizes(32 + 5, &[10, 0, 7]);
        assert_eq!(from, sender.sizes_addr() + sizes_offset(5));
        assert_eq!(len, 12);
        rdma_copy(&sender, from, len, &receiver);
        assert_eq!(receiver.sizes(5, 3), vec![10, 0, 7]);
    }
}

//! The clear-to-send (CTS) FIFO, NCCL's way of telling a sender where to write.
//!
//! Each send connection owns [`FIFO_SLOTS`] [`CtsEntry`]s in registered memory. For its
//! `n`-th receive (`n` from 0), the receiver fills an entry (buffer address, rkey, size, tag)
//! and RDMA-writes it into slot [`slot_of`]`(n)` of the sender's FIFO, with `idx` =
//! [`idx_of`]`(n)`. The sender never calls verbs to learn of it: it reads the slot in its
//! own memory and treats it as posted once `idx` equals the value its `n`-th send expects.
//! `idx` counts on past the slot number, so a slot written 256 receives ago (same slot,
//! older `idx`) is never mistaken for the current one.
//!
//! A slot is reused only after the sender has consumed it: the receiver keeps fewer than
//! [`FIFO_SLOTS`] receives outstanding, and receive `n` completes only after the sender read
//! slot `n`.

/// Slots of a FIFO (NCCL's `MAX_REQUESTS` × `NCCL_NET_IB_MAX_RECVS` is 256 as well).
pub const FIFO_SLOTS: usize = 256;

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

/// The slot of the `seq`-th receive (from 0).
pub fn slot_of(seq: u64) -> usize {
    (seq % FIFO_SLOTS as u64) as usize
}

/// The `idx` value that marks slot [`slot_of`]`(seq)` as holding the `seq`-th receive:
/// `seq + 1`, so that a zeroed FIFO holds nothing.
pub fn idx_of(seq: u64) -> u64 {
    seq + 1
}

/// Byte offset of slot [`slot_of`]`(seq)` from the FIFO's start (for the receiver's RDMA
/// write).
pub fn slot_offset(seq: u64) -> u64 {
    (slot_of(seq) * CTS_BYTES) as u64
}

/// A FIFO in this process's memory (sender side, and the receiver's staging copy), a heap
/// block that does not move, so it can be registered once for the connection's life.
pub struct Fifo {
    entries: Box<[CtsEntry]>,
}

impl Default for Fifo {
    fn default() -> Self {
        Fifo {
            entries: vec![CtsEntry::default(); FIFO_SLOTS].into_boxed_slice(),
        }
    }
}

impl Fifo {
    /// Start address (for registration and the peer's RDMA writes).
    pub fn addr(&self) -> *mut CtsEntry {
        self.entries.as_ptr() as *mut CtsEntry
    }

    /// Bytes of the FIFO.
    pub fn bytes(&self) -> usize {
        FIFO_SLOTS * CTS_BYTES
    }

    /// The entry of receive `seq` if the peer has written it, else `None`. The read is
    /// volatile: the NIC writes this memory behind the compiler's back.
    pub fn posted(&self, seq: u64) -> Option<CtsEntry> {
        let slot = self.entries.as_ptr().wrapping_add(slot_of(seq));
        // SAFETY: `slot` is inside the boxed slice (slot_of < FIFO_SLOTS), aligned, and
        // CtsEntry is plain data; the NIC may write it concurrently, hence volatile reads
        // with `idx` read first and the rest after an acquire fence.
        let idx = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*slot).idx)) };
        if idx != idx_of(seq) {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above.
        Some(unsafe { std::ptr::read_volatile(slot) })
    }

    /// Fills the entry of receive `seq` (receiver's staging copy); returns its address.
    pub fn fill(&mut self, seq: u64, entry: CtsEntry) -> *const CtsEntry {
        let slot = &mut self.entries[slot_of(seq)];
        *slot = CtsEntry {
            idx: idx_of(seq),
            ..entry
        };
        slot as *const CtsEntry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_wrap_and_idx_tells_rounds_apart() {
        assert_eq!(CTS_BYTES, 64);
        assert_eq!(slot_of(0), 0);
        assert_eq!(slot_of(255), 255);
        assert_eq!(slot_of(256), 0);
        assert_eq!(slot_of(257 + 256), 1);
        assert_eq!(slot_offset(3), 192);
        assert_eq!(slot_offset(256 + 3), 192);
        assert_ne!(idx_of(5), idx_of(5 + 256));
    }

    #[test]
    fn a_slot_is_posted_only_for_its_round() {
        let mut staging = Fifo::default();
        let fifo = Fifo::default();
        assert_eq!(fifo.posted(0), None, "a zeroed FIFO holds nothing");
        let entry = CtsEntry {
            addr: 0x1000,
            size: 64,
            rkeys: [7, 0, 0, 0],
            tag: 3,
            nreqs: 1,
            ..CtsEntry::default()
        };
        // The receiver's 257th receive lands in slot 0 (as an RDMA write would copy it).
        let src = staging.fill(256, entry);
        // SAFETY: both point at one CtsEntry of live FIFOs.
        unsafe { std::ptr::copy_nonoverlapping(src, fifo.addr(), 1) };
        assert_eq!(
            fifo.posted(0),
            None,
            "receive 0's slot now holds receive 256"
        );
        assert_eq!(fifo.posted(256), Some(CtsEntry { idx: 257, ..entry }));
        assert_eq!(fifo.posted(1), None);
    }
}

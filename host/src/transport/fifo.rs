//! The FIFO between a producer and a consumer of fixed-size slots, in memory both can see:
//! `STEPS` slots of `slot_bytes`, a `tail` the producer advances after filling a slot and a
//! `head` the consumer advances after emptying one, and the byte count of each slot.
//!
//! Every transport is one of these: over shared memory the producer is one rank and the
//! consumer another; over the network the proxy thread is the consumer of the sender's FIFO
//! and the producer of the receiver's. The executor only ever sees FIFOs.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per FIFO (NCCL_STEPS), as the device kernels have it.
pub const STEPS: usize = rustccl_kernels::exec::FIFO_STEPS;
/// The size the proxy publishes for a received slot whose size the network plugin did not
/// report (device kernels know it too): the consumer takes its step's size.
const SIZE_UNREPORTED: u64 = rustccl_kernels::exec::FIFO_SIZE_UNREPORTED;

/// The control block at the start of a FIFO's memory. The device kernels reach its fields at
/// the offsets `rustccl_kernels::exec::FIFO_HEAD`, `FIFO_TAIL`, `FIFO_SIZES`, `FIFO_SIGS` and `FIFO_DIRECT`
/// (checked by a test below).
#[repr(C)]
pub struct FifoHeader {
    /// Slots the consumer has emptied.
    pub head: AtomicU64,
    _pad0: [u64; 7],
    /// Slots the producer has filled.
    pub tail: AtomicU64,
    _pad1: [u64; 7],
    /// Bytes in each slot.
    pub sizes: [AtomicU64; STEPS],
    /// The signature of the operation that filled each slot (0: not known), which the
    /// consumer compares with its own (`coll::check`). Device kernels leave it 0.
    pub sigs: [AtomicU64; STEPS],
    /// A device receiver's post of the steps its sender may write straight into its buffer
    /// (zero-copy receives into registered buffers over P2P; see `exec.cu`). Only kernels
    /// use it.
    pub direct: [AtomicU64; 4],
}

/// Bytes of memory a FIFO with slots of `slot_bytes` needs.
pub fn fifo_bytes(slot_bytes: usize) -> usize {
    header_bytes() + STEPS * slot_bytes
}

/// Bytes before the first slot (the header, padded to 4 KiB).
pub fn header_bytes() -> usize {
    // Slots start on a 4 KiB boundary.
    std::mem::size_of::<FifoHeader>().div_ceil(4096) * 4096
}

/// A view of a FIFO at a fixed address. The memory is owned by the connection that holds
/// this view, which keeps it mapped for the view's lifetime.
pub struct Fifo {
    base: *mut u8,
    /// Address of slot 0 as the executor uses it: right after the header in host memory, or
    /// device memory.
    slots: u64,
    /// Host address of slot 0 when the slots are host memory mapped into a device (the proxy
    /// hands them to the network); equal to `slots` for host FIFOs.
    host_slots: u64,
    /// Device address of the header (0 when no device maps it).
    device_header: u64,
    slot_bytes: usize,
    /// Slots in use, at most `STEPS` (fewer, larger slots for device-only FIFOs); `sizes` and
    /// `sigs` are indexed modulo `STEPS` whatever it is.
    steps: usize,
}

// SAFETY: the header is atomics; slot contents are handed over through the head/tail protocol
// (a slot is written only by the producer between acquiring it and advancing tail, and read
// only by the consumer between seeing tail and advancing head).
unsafe impl Send for Fifo {}
unsafe impl Sync for Fifo {}

impl Fifo {
    /// A FIFO over `fifo_bytes(slot_bytes)` bytes at `base`, zeroed by the creator.
    ///
    /// # Safety
    /// `base` must point to that many bytes, 8-byte aligned, valid while the `Fifo` exists,
    /// used by at most one producer and one consumer.
    pub unsafe fn new(base: *mut u8, slot_bytes: usize) -> Fifo {
        // SAFETY: within the region (see above).
        let slots = unsafe { base.add(header_bytes()) } as u64;
        Fifo { base, slots, host_slots: slots, device_header: 0, slot_bytes, steps: STEPS }
    }

    /// A FIFO in host memory (`fifo_bytes(slot_bytes)` at `base`) that a device reaches at
    /// `device_base` (the same memory, registered with the device backend).
    ///
    /// # Safety
    /// As for [`Fifo::new`]; `device_base` must map the whole FIFO while the `Fifo` exists.
    pub unsafe fn with_mapped_slots(base: *mut u8, device_base: u64, slot_bytes: usize) -> Fifo {
        // SAFETY: within the region (see above).
        let host_slots = unsafe { base.add(header_bytes()) } as u64;
        let slots = device_base + header_bytes() as u64;
        Fifo { base, slots, host_slots, device_header: device_base, slot_bytes, steps: STEPS }
    }

    /// A FIFO whose header is at `header` (host memory both sides map; devices reach it at
    /// `device_header`) and whose `steps` slots (at most `STEPS`) are at `slots` in device
    /// memory. The CPU cannot touch the slots: only the counters and `slot_addr` may be used on
    /// this side.
    ///
    /// # Safety
    /// As for [`Fifo::new`], for `header_bytes()` bytes at `header`; `slots` must hold
    /// `steps * slot_bytes` bytes of device memory, and `device_header` map the header, while
    /// the `Fifo` exists.
    pub unsafe fn with_device_slots(header: *mut u8, device_header: u64, slots: u64, slot_bytes: usize, steps: usize) -> Fifo {
        assert!(steps.is_power_of_two() && steps <= STEPS, "a FIFO has a power of two of slots up to {STEPS}, not {steps}");
        Fifo { base: header, slots, host_slots: 0, device_header, slot_bytes, steps }
    }

    /// Device address of the header (0 for FIFOs no device maps).
    pub fn device_header(&self) -> u64 {
        self.device_header
    }

    /// Address of slot `index` (host or device).
    pub fn slot_addr(&self, index: u64) -> u64 {
        self.slots + (index % self.steps as u64) * self.slot_bytes as u64
    }

    fn header(&self) -> &FifoHeader {
        // SAFETY: `new`'s contract: the header is at `base`.
        unsafe { &*(self.base as *const FifoHeader) }
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slots in use (the producer may run this many ahead of the consumer).
    pub fn steps(&self) -> usize {
        self.steps
    }

    fn slot_ptr(&self, index: u64) -> *mut u8 {
        self.slot_addr(index) as *mut u8
    }

    /// Producer: the next free slot (its index and memory), if any. The slice is mutable
    /// through `&self` because the FIFO protocol, not the borrow checker, gives the producer
    /// exclusive use of that slot until it calls `push`.
    #[allow(clippy::mut_from_ref)]
    pub fn free_slot(&self) -> Option<(u64, &mut [u8])> {
        let h = self.header();
        let tail = h.tail.load(Ordering::Relaxed);
        if tail - h.head.load(Ordering::Acquire) >= self.steps as u64 {
            return None;
        }
        // SAFETY: the slot is the producer's until it advances tail (see the type's SAFETY).
        Some((tail, unsafe { std::slice::from_raw_parts_mut(self.slot_ptr(tail), self.slot_bytes) }))
    }

    /// Producer: publishes slot `index` holding `bytes`.
    pub fn push(&self, index: u64, bytes: usize) {
        self.push_signed(index, bytes, 0);
    }

    /// Producer: publishes slot `index` holding `bytes` of the operation signed `sig`.
    pub fn push_signed(&self, index: u64, bytes: usize, sig: u64) {
        let h = self.header();
        let i = (index % STEPS as u64) as usize;
        h.sizes[i].store(bytes as u64, Ordering::Relaxed);
        h.sigs[i].store(sig, Ordering::Relaxed);
        h.tail.store(index + 1, Ordering::Release);
    }

    /// Producer for the proxy: publishes received slot `index` holding `bytes`, or, when the
    /// network plugin did not report a size (`None`), as many as the consumer's step expects.
    pub fn push_received(&self, index: u64, bytes: Option<usize>) {
        match bytes {
            Some(b) => self.push(index, b),
            None => self.push(index, SIZE_UNREPORTED as usize),
        }
    }

    /// Consumer: whether filled slot `index` says how many bytes it holds (see
    /// [`push_received`](Self::push_received)); when not, [`ready_slot`](Self::ready_slot)
    /// gives the whole slot and the step's size applies.
    pub fn size_reported(&self, index: u64) -> bool {
        self.header().sizes[(index % STEPS as u64) as usize].load(Ordering::Relaxed) != SIZE_UNREPORTED
    }

    /// Consumer: the signature of filled slot `index` (0 when the producer gave none).
    pub fn sig_of(&self, index: u64) -> u64 {
        self.header().sigs[(index % STEPS as u64) as usize].load(Ordering::Relaxed)
    }

    /// Consumer: the oldest filled slot, if any.
    pub fn ready_slot(&self) -> Option<(u64, &[u8])> {
        let h = self.header();
        let head = h.head.load(Ordering::Relaxed);
        if h.tail.load(Ordering::Acquire) <= head {
            return None;
        }
        let len = h.sizes[(head % STEPS as u64) as usize].load(Ordering::Relaxed) as usize;
        // SAFETY: filled and published by the producer; the consumer's until head advances.
        Some((head, unsafe { std::slice::from_raw_parts(self.slot_ptr(head), len.min(self.slot_bytes)) }))
    }

    /// Consumer: slot `index` (and all before it) may be reused.
    pub fn pop(&self, index: u64) {
        self.header().head.store(index + 1, Ordering::Release);
    }

    /// Filled slots not yet consumed, and the index of the oldest.
    pub fn pending(&self) -> (u64, u64) {
        let h = self.header();
        let head = h.head.load(Ordering::Acquire);
        (h.tail.load(Ordering::Acquire) - head, head)
    }

    /// Host address and capacity of slot `index` (for the proxy, which hands slots to the
    /// network).
    pub fn slot_raw(&self, index: u64) -> (*mut u8, usize) {
        let i = index % self.steps as u64;
        ((self.host_slots + i * self.slot_bytes as u64) as *mut u8, self.slot_bytes)
    }

    /// Host address and length of the slot area (registered with the network once).
    pub fn slots_region(&self) -> (*mut u8, usize) {
        (self.host_slots as *mut u8, self.steps * self.slot_bytes)
    }

    /// Producer side for the proxy: the slot count filled so far.
    pub fn tail(&self) -> u64 {
        self.header().tail.load(Ordering::Acquire)
    }

    pub fn head(&self) -> u64 {
        self.header().head.load(Ordering::Acquire)
    }

    /// Size recorded for slot `index`.
    pub fn size_of(&self, index: u64) -> usize {
        self.header().sizes[(index % STEPS as u64) as usize].load(Ordering::Acquire) as usize
    }
}

/// Zeroed, 4 KiB-aligned memory owned by this process (FIFOs the proxy shares with the executor).
pub struct LocalMemory {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: plain memory; access is coordinated by the FIFO protocol.
unsafe impl Send for LocalMemory {}
unsafe impl Sync for LocalMemory {}

impl LocalMemory {
    pub fn new(bytes: usize) -> LocalMemory {
        let layout = std::alloc::Layout::from_size_align(bytes.max(4096), 4096).expect("FIFO layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        LocalMemory { ptr, layout }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for LocalMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_offsets_are_those_the_kernels_use() {
        use rustccl_kernels::exec as k;
        use std::mem::offset_of;
        assert_eq!(
            [
                offset_of!(FifoHeader, head),
                offset_of!(FifoHeader, tail),
                offset_of!(FifoHeader, sizes),
                offset_of!(FifoHeader, sigs),
                offset_of!(FifoHeader, direct)
            ],
            [k::FIFO_HEAD, k::FIFO_TAIL, k::FIFO_SIZES, k::FIFO_SIGS, k::FIFO_DIRECT]
        );
        // The kernel indexes `sizes` and `sigs` by slot: eight bytes each, STEPS of them.
        assert_eq!(std::mem::size_of::<[AtomicU64; STEPS]>(), 8 * k::FIFO_STEPS);
        assert!(k::FIFO_SIZES + 8 * k::FIFO_STEPS <= k::FIFO_SIGS);
        assert_eq!(k::FIFO_SIGS + 8 * k::FIFO_STEPS, k::FIFO_DIRECT);
        assert_eq!(std::mem::size_of::<FifoHeader>(), k::FIFO_DIRECT + 32);
        assert!(std::mem::size_of::<FifoHeader>() <= header_bytes());
    }

    #[test]
    fn slots_flow_in_order_and_fill_up() {
        let mem = LocalMemory::new(fifo_bytes(64));
        // SAFETY: `mem` outlives the FIFO and is zeroed.
        let f = unsafe { Fifo::new(mem.ptr(), 64) };
        assert!(f.ready_slot().is_none());
        for i in 0..STEPS as u64 {
            let (idx, slot) = f.free_slot().expect("free");
            assert_eq!(idx, i);
            slot[0] = i as u8;
            f.push(idx, 1 + i as usize);
        }
        assert!(f.free_slot().is_none(), "full after STEPS pushes");
        let (idx, data) = f.ready_slot().unwrap();
        assert_eq!((idx, data.len(), data[0]), (0, 1, 0));
        f.pop(idx);
        assert_eq!(f.free_slot().unwrap().0, STEPS as u64);
        assert_eq!(f.pending(), (STEPS as u64 - 1, 1));
    }

    #[test]
    fn a_received_slot_without_a_reported_size_gives_the_whole_slot_and_says_so() {
        let mem = LocalMemory::new(fifo_bytes(64));
        // SAFETY: `mem` outlives the FIFO and is zeroed.
        let f = unsafe { Fifo::new(mem.ptr(), 64) };
        f.push_received(0, Some(5));
        f.push_received(1, None);
        let (idx, data) = f.ready_slot().unwrap();
        assert_eq!((idx, data.len(), f.size_reported(idx)), (0, 5, true));
        f.pop(idx);
        let (idx, data) = f.ready_slot().unwrap();
        assert_eq!((idx, data.len(), f.size_reported(idx)), (1, 64, false));
    }

    #[test]
    fn threads_pass_many_messages() {
        let mem = LocalMemory::new(fifo_bytes(16));
        // SAFETY: as above; the scope ends before `mem` is dropped.
        let f = unsafe { Fifo::new(mem.ptr(), 16) };
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..10_000u64 {
                    loop {
                        if let Some((idx, slot)) = f.free_slot() {
                            slot[..8].copy_from_slice(&i.to_le_bytes());
                            f.push(idx, 8);
                            break;
                        }
                        std::hint::spin_loop();
                    }
                }
            });
            for i in 0..10_000u64 {
                loop {
                    if let Some((idx, d)) = f.ready_slot() {
                        assert_eq!(u64::from_le_bytes(d.try_into().unwrap()), i);
                        f.pop(idx);
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
        });
    }
}

//! The host backend's table of live memory: every allocation, host-mapped buffer, shared
//! mapping and registered buffer, by base address. Frees and every pointer range are checked
//! against it, so a bad pointer is an error instead of undefined behaviour.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use super::shm::SharedRegion;
use crate::backend::DevicePtr;
use crate::error::{Error, Result};

/// The alignment of host-backend allocations (what `cudaMalloc` guarantees).
pub const ALIGN: usize = 256;

/// What a table entry is, which decides how it is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `alloc`: "device" memory.
    Device,
    /// `alloc_host_mapped`.
    HostMapped,
    /// `alloc_shareable`: a /dev/shm file this process created.
    Exported,
    /// `import`: a mapping of another allocation's /dev/shm file.
    Imported,
    /// `register_host`: caller-owned memory.
    Registered,
    /// `map_shared_at`: a shareable allocation (this process's or a peer's) mapped at a fixed
    /// address of a reserved space, for a symmetric window.
    Window,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Device => "device memory",
            Kind::HostMapped => "host-mapped memory",
            Kind::Exported => "shareable memory",
            Kind::Imported => "imported shared memory",
            Kind::Registered => "registered host memory",
            Kind::Window => "window mapping",
        }
    }

    /// The call that releases this kind.
    fn release_call(self) -> &'static str {
        match self {
            Kind::Device | Kind::Exported => "free",
            Kind::HostMapped => "free_host_mapped",
            Kind::Imported => "close_import",
            Kind::Registered => "unregister_host",
            Kind::Window => "unmap_at",
        }
    }
}

/// Where an entry's bytes come from; dropping it releases them.
#[derive(Debug)]
enum Backing {
    /// From `std::alloc` with this layout.
    Heap(Layout),
    /// A shared file mapping, held for its `Drop` (which unmaps, and unlinks if exported).
    Shared(#[allow(dead_code)] SharedRegion),
    /// The caller's; nothing to release.
    Borrowed,
}

/// One live entry.
#[derive(Debug)]
pub struct Allocation {
    base: NonNull<u8>,
    bytes: usize,
    kind: Kind,
    device: Option<usize>,
    backing: Backing,
}

// SAFETY: an Allocation owns its bytes (or, for registered memory, the caller promised they
// stay valid); the raw base pointer is only dereferenced by the backend after a range check,
// under the table's lock, and the memory is not tied to the thread that allocated it.
unsafe impl Send for Allocation {}
// SAFETY: `&Allocation` gives out only the address and sizes; writes through the address are
// the backend's checked, unsafe operations.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// `bytes` of zeroed heap memory aligned to [`ALIGN`] (at least one byte is reserved, so
    /// even an empty allocation has its own address).
    pub fn heap(bytes: usize, kind: Kind, device: Option<usize>) -> Result<Allocation> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|_| Error::invalid_argument(format!("cannot allocate {bytes} bytes: too large")))?;
        // SAFETY: the layout has a non-zero size, as `alloc_zeroed` requires.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let base =
            NonNull::new(raw).ok_or_else(|| Error::system(format!("out of host memory allocating {bytes} bytes")))?;
        Ok(Allocation { base, bytes, kind, device, backing: Backing::Heap(layout) })
    }

    /// A shared mapping (exported or imported).
    pub fn shared(region: SharedRegion, kind: Kind, device: Option<usize>) -> Allocation {
        Allocation { base: region.ptr(), bytes: region.len(), kind, device, backing: Backing::Shared(region) }
    }

    /// A window mapping the caller made at `ptr` and unmaps itself (nothing to release here).
    pub fn window(ptr: NonNull<u8>, bytes: usize, device: Option<usize>) -> Allocation {
        Allocation { base: ptr, bytes, kind: Kind::Window, device, backing: Backing::Borrowed }
    }

    /// The file name of an exported allocation (what peers map), if it is one.
    pub fn exported_name(&self) -> Option<&str> {
        match (&self.kind, &self.backing) {
            (Kind::Exported, Backing::Shared(region)) => Some(region.name()),
            _ => None,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Caller-owned memory.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must stay valid for reads and writes while the entry is in a table.
    pub unsafe fn borrowed(ptr: *mut u8, bytes: usize) -> Result<Allocation> {
        let base = NonNull::new(ptr).ok_or_else(|| Error::invalid_argument("cannot register a null pointer"))?;
        if bytes == 0 {
            return Err(Error::invalid_argument(format!("cannot register 0 bytes at {ptr:p}")));
        }
        Ok(Allocation { base, bytes, kind: Kind::Registered, device: None, backing: Backing::Borrowed })
    }

    pub fn address(&self) -> DevicePtr {
        DevicePtr(self.base.as_ptr() as u64)
    }

    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// What this entry is, for messages: "device memory on device 2".
    fn describe(&self) -> String {
        match self.device {
            Some(d) => format!("{} on device {d}", self.kind.describe()),
            None => self.kind.describe().to_string(),
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: `base` came from `alloc_zeroed` with exactly this layout, and the entry
            // is dropped once (it has left the table).
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.base.as_ptr(), *layout) },
            // The region unmaps (and unlinks) itself when dropped.
            Backing::Shared(_) | Backing::Borrowed => {}
        }
    }
}

/// The live entries, by base address.
#[derive(Default)]
pub struct Table {
    live: BTreeMap<u64, Allocation>,
}

/// Bumped by every change of any table (under its write lock) and when one is dropped: a
/// lookup remembered at one generation holds while the generation is unchanged.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// An entry the calling thread resolved lately: (table, generation, entry base, entry bytes,
/// entry host address). Calls pass the same buffers (a send and a receive buffer) again and
/// again: they skip the lock and the tree.
#[derive(Clone, Copy, Default)]
struct Hit {
    table: usize,
    generation: u64,
    base: u64,
    bytes: u64,
    host: usize,
}

const NO_HIT: Hit = Hit { table: 0, generation: 0, base: 0, bytes: 0, host: 0 };

thread_local! {
    /// The two entries resolved last, the latest first.
    static HITS: std::cell::Cell<[Hit; 2]> = const { std::cell::Cell::new([NO_HIT; 2]) };
}

impl Drop for Table {
    fn drop(&mut self) {
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// [`Table::resolve`] on the table behind `lock`, without the lock when the calling thread
/// resolved inside the same entry last and no table changed since.
pub fn resolve_locked(lock: &RwLock<Table>, ptr: DevicePtr, bytes: usize, what: &str) -> Result<*mut u8> {
    let id = lock as *const RwLock<Table> as usize;
    let generation = GENERATION.load(Ordering::Acquire);
    if bytes > 0 {
        let hits = HITS.with(|c| c.get());
        let fits = |h: &Hit| {
            h.table == id && h.generation == generation && ptr.0 >= h.base && (ptr.0 - h.base) as u128 + bytes as u128 <= h.bytes as u128
        };
        if let Some(h) = hits.iter().find(|h| fits(h)) {
            // SAFETY: the same check as `resolve`, against the entry it found at this
            // generation, which is still live (any removal changes the generation).
            return Ok(unsafe { (h.host as *mut u8).add((ptr.0 - h.base) as usize) });
        }
    }
    let table = lock.read().unwrap_or_else(|p| p.into_inner());
    let host = table.resolve(ptr, bytes, what)?;
    if bytes > 0 {
        // Read under the lock: no change can happen between the lookup and this.
        let generation = GENERATION.load(Ordering::Acquire);
        if let Some((base, a)) = table.containing(ptr.0) {
            let hit = Hit { table: id, generation, base, bytes: a.bytes as u64, host: a.base() as usize };
            HITS.with(|c| {
                let [latest, _] = c.get();
                c.set([hit, latest]);
            });
        }
    }
    Ok(host)
}

impl Table {
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// The entry whose range holds `addr`, if any.
    pub fn containing(&self, addr: u64) -> Option<(u64, &Allocation)> {
        let (&base, a) = self.live.range(..=addr).next_back()?;
        ((addr - base) < a.bytes.max(1) as u64).then_some((base, a))
    }

    /// The first entry that overlaps `[start, end)`, if any.
    pub fn first_in(&self, start: u64, end: u64) -> Option<(u64, &Allocation)> {
        self.containing(start).or_else(|| self.live.range(start..end).next().map(|(&b, a)| (b, a)))
    }

    /// Adds an entry; refuses one that overlaps a live entry (only registration can).
    pub fn insert(&mut self, a: Allocation) -> Result<DevicePtr> {
        let ptr = a.address();
        let end = ptr.0 as u128 + a.bytes.max(1) as u128;
        let clash = self
            .containing(ptr.0)
            .map(|(base, _)| base)
            .or_else(|| self.live.range(ptr.0..).next().map(|(&b, _)| b).filter(|&b| (b as u128) < end));
        if let Some(base) = clash {
            let other = &self.live[&base];
            return Err(Error::invalid_argument(format!(
                "{} at {ptr} ({} bytes) overlaps the {} at {:#x} ({} bytes)",
                a.describe(),
                a.bytes,
                other.describe(),
                base,
                other.bytes
            )));
        }
        self.live.insert(ptr.0, a);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        Ok(ptr)
    }

    /// Removes and returns the entry starting at `ptr`, which must be one of the `allowed`
    /// kinds; `op` names the call for the error message.
    pub fn remove(&mut self, ptr: DevicePtr, op: &str, allowed: &[Kind]) -> Result<Allocation> {
        let Some(a) = self.live.get(&ptr.0) else {
            return Err(Error::invalid_argument(match self.containing(ptr.0) {
                Some((base, a)) => format!(
                    "{op}({ptr}): not the start of an allocation (it is {} bytes into the \
                     {}-byte {} at {base:#x})",
                    ptr.0 - base,
                    a.bytes,
                    a.describe()
                ),
                None => format!("{op}({ptr}): no live allocation starts there (never allocated, or already freed)"),
            }));
        };
        if !allowed.contains(&a.kind) {
            return Err(Error::invalid_argument(format!(
                "{op}({ptr}): that is {}, which is released with {}",
                a.describe(),
                a.kind.release_call()
            )));
        }
        GENERATION.fetch_add(1, Ordering::AcqRel);
        Ok(self.live.remove(&ptr.0).expect("entry found above"))
    }

    /// The host address of `ptr..ptr+bytes`, which must lie inside one live entry; `what`
    /// names the operand for the error message. Zero bytes never touch memory and always
    /// succeed (with a dangling, non-null address).
    pub fn resolve(&self, ptr: DevicePtr, bytes: usize, what: &str) -> Result<*mut u8> {
        if bytes == 0 {
            return Ok(NonNull::dangling().as_ptr());
        }
        if let Some((base, a)) = self.live.range(..=ptr.0).next_back() {
            let offset = ptr.0 - base;
            if offset as u128 + bytes as u128 <= a.bytes as u128 {
                // SAFETY: offset + bytes <= a.bytes, so the result stays inside the entry.
                return Ok(unsafe { a.base().add(offset as usize) });
            }
        }
        let nearest = match self.live.range(..=ptr.0).next_back() {
            Some((base, a)) => {
                format!(" (the nearest one below starts at {base:#x} and holds {} bytes of {})", a.bytes, a.describe())
            }
            None => String::new(),
        };
        Err(Error::invalid_argument(format!(
            "{what}: the range {ptr}..{:#x} ({bytes} bytes) is not inside a live allocation{nearest}",
            ptr.0 as u128 + bytes as u128
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ResultCode::InvalidArgument;

    #[test]
    fn remembered_lookups_end_with_the_entry() {
        let lock = RwLock::new(Table::default());
        let a = lock.write().unwrap().insert(Allocation::heap(4096, Kind::Device, Some(0)).unwrap()).unwrap();
        let b = lock.write().unwrap().insert(Allocation::heap(4096, Kind::Device, Some(0)).unwrap()).unwrap();
        let ha = resolve_locked(&lock, a, 4096, "a").unwrap();
        let hb = resolve_locked(&lock, b.offset(8), 8, "b").unwrap();
        // Both remembered: the same answers as the table's, and the same limits.
        for _ in 0..2 {
            assert_eq!(resolve_locked(&lock, a.offset(100), 10, "a").unwrap() as usize, ha as usize + 100);
            assert_eq!(resolve_locked(&lock, b.offset(8), 8, "b").unwrap(), hb);
            assert_eq!(resolve_locked(&lock, a.offset(4000), 97, "a").unwrap_err().code, InvalidArgument);
        }
        lock.write().unwrap().remove(a, "free", &[Kind::Device]).unwrap();
        assert_eq!(resolve_locked(&lock, a, 8, "a").unwrap_err().code, InvalidArgument);
        assert_eq!(resolve_locked(&lock, b.offset(8), 8, "b").unwrap(), hb);
    }

    #[test]
    fn heap_entries_are_aligned_zeroed_and_resolvable() {
        let mut t = Table::default();
        let p = t.insert(Allocation::heap(1000, Kind::Device, Some(0)).unwrap()).unwrap();
        assert_eq!(p.0 % ALIGN as u64, 0);
        let host = t.resolve(p, 1000, "x").unwrap();
        // SAFETY: resolve checked that 1000 bytes at `host` are live.
        let bytes = unsafe { std::slice::from_raw_parts(host, 1000) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(t.resolve(p.offset(10), 990, "x").unwrap() as usize, host as usize + 10);
        assert_eq!(t.resolve(p.offset(10), 991, "x").unwrap_err().code, InvalidArgument);
        assert_eq!(t.resolve(DevicePtr(8), 1, "x").unwrap_err().code, InvalidArgument);
        assert!(t.resolve(DevicePtr(u64::MAX), 0, "x").is_ok(), "zero bytes never touch memory");
        assert_eq!(t.remove(p, "free", &[Kind::Device]).unwrap().address(), p);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn remove_checks_start_and_kind() {
        let mut t = Table::default();
        let p = t.insert(Allocation::heap(64, Kind::HostMapped, None).unwrap()).unwrap();
        let e = t.remove(p.offset(8), "free", &[Kind::Device]).unwrap_err();
        assert!(e.message.contains("8 bytes into"), "{}", e.message);
        let e = t.remove(p, "free", &[Kind::Device]).unwrap_err();
        assert!(e.message.contains("free_host_mapped"), "{}", e.message);
        t.remove(p, "free_host_mapped", &[Kind::HostMapped]).unwrap();
        let e = t.remove(p, "free_host_mapped", &[Kind::HostMapped]).unwrap_err();
        assert!(e.message.contains("already freed"), "{}", e.message);
    }

    #[test]
    fn overlapping_registration_is_refused() {
        let mut buf = vec![0u8; 128];
        let mut t = Table::default();
        // SAFETY: `buf` outlives the table entries (removed before it is dropped).
        let whole = t.insert(unsafe { Allocation::borrowed(buf.as_mut_ptr(), 128) }.unwrap()).unwrap();
        // SAFETY: as above.
        let inner = unsafe { Allocation::borrowed(buf.as_mut_ptr().add(64), 8) }.unwrap();
        assert_eq!(t.insert(inner).unwrap_err().code, InvalidArgument);
        t.remove(whole, "unregister_host", &[Kind::Registered]).unwrap();
        assert_eq!(buf.len(), 128);
    }
}

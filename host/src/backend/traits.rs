//! The traits a backend implements, one per concern (wgpu-hal's small traits): what every
//! backend has — [`Memory`], [`Streams`], [`Sharing`] — is a supertrait of
//! [`DeviceBackend`], the handle the rest of rustccl holds (`Arc<dyn DeviceBackend>`); what
//! only some backends have — [`Kernels`], [`SymmetricKernels`], [`WindowMemory`],
//! [`BufferSharing`], [`HostAccess`] — is an optional group reached through an accessor that
//! returns `None` where the backend lacks it. A backend implements only what it can do: no
//! method of these traits exists to refuse.
//!
//! A caller that needs an optional group asks for it with the `_or_err` helpers on
//! `dyn DeviceBackend` (`backend.kernels_or_err("what")?`, and one per group), which give one
//! error naming the backend, the operation and what it lacks (`InvalidUsage`). Callers that can
//! do without (a choice between two ways) match on the accessor, or ask [`Capabilities`].

use std::sync::Arc;

use super::{BackendKind, Capabilities, DevicePtr, Event, ExecKernel, ExecLaunch, HostCallback, HostMapped, ShareHandle, Stream, SymmetricMemory};
use crate::error::{Error, Result};

/// A device backend. Devices are numbered `0..device_count()`.
///
/// Work taking a [`Stream`] is enqueued on it and runs in stream order; a backend may run it
/// before returning (the host backend does) or later (CUDA does), so results are only
/// guaranteed after [`synchronize`](Streams::synchronize) or an event. The exceptions are
/// [`copy_to_device`](Memory::copy_to_device) and [`copy_from_device`](Memory::copy_from_device),
/// which borrow host slices and so return only when the copy is complete.
///
/// Every pointer range a backend is given must lie inside memory it allocated, imported or
/// registered; backends that can check this (the host backend) report a bad range as
/// `InvalidArgument` instead of touching memory.
///
/// Every backend has [`Memory`], [`Streams`] and [`Sharing`]; the optional groups are reached
/// through the accessors below (each returns `Some(self)` where the backend implements the
/// group, `None` where it does not).
pub trait DeviceBackend: Memory + Streams + Sharing + Send + Sync + std::fmt::Debug {
    // ---- identity ----

    /// Which implementation this is: for logs and messages. What a backend can do is asked of
    /// [`capabilities`](DeviceBackend::capabilities) and the group accessors, never of this.
    fn kind(&self) -> BackendKind;

    /// What the backend offers the planner and the transports (they ask this, never
    /// [`kind`](DeviceBackend::kind)).
    fn capabilities(&self) -> &Capabilities;

    /// The device the calling thread has made current (CUDA's `cudaSetDevice`), if the backend
    /// has such a notion; `None` otherwise.
    fn current_device(&self) -> Result<Option<i32>> {
        Ok(None)
    }

    /// The number of devices this process can use.
    fn device_count(&self) -> Result<usize>;

    /// A human-readable name of `device` (for logs).
    fn device_name(&self, device: usize) -> Result<String>;

    // ---- optional groups ----

    /// The collective interpreter's launches and the stream operations that go with them
    /// (device backends; the host backend runs collectives on CPU threads).
    fn kernels(&self) -> Option<&dyn Kernels>;

    /// The symmetric kernels, on windows (device backends with [`WindowMemory`]).
    fn symmetric_kernels(&self) -> Option<&dyn SymmetricKernels>;

    /// Memory windows are made of: allocations mappable at fixed addresses of a reserved
    /// space by every process of the host.
    fn window_memory(&self) -> Option<&dyn WindowMemory>;

    /// Registered buffers exported to peers, which write into them directly (zero-copy
    /// point-to-point).
    fn buffer_sharing(&self) -> Option<&dyn BufferSharing>;

    /// Host addresses of the backend's memory, for backends whose memory the CPU addresses
    /// (then [`Capabilities::host_addressable`] is true).
    fn host_access(&self) -> Option<&dyn HostAccess>;

    /// Recording events the backend did not make (the caller's `cudaEvent_t`), for
    /// `ncclCollConfig_t.launchCompletionEvent` (CUDA; the host backend has no events to give).
    fn foreign_events(&self) -> Option<&dyn ForeignEvents>;
}

/// The optional groups, named in the error of a caller that needs one the backend lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Kernels,
    SymmetricKernels,
    WindowMemory,
    BufferSharing,
    HostAccess,
    ForeignEvents,
}

impl Group {
    /// What the group is, and what a backend without it does instead (for the error).
    fn missing_text(self) -> &'static str {
        match self {
            Group::Kernels => "device kernels (its collectives run on CPU threads)",
            Group::SymmetricKernels => "symmetric kernels (collectives on windows take the usual path there)",
            Group::WindowMemory => "symmetric memory for windows (RUSTCCL_BACKEND=host or cuda has it)",
            Group::BufferSharing => {
                "zero-copy point-to-point (registered buffers are received through the connections' buffers there)"
            }
            Group::HostAccess => "host-addressable memory (its memory is a device's: copy it to the host to read it)",
            Group::ForeignEvents => "recording a caller's event (it has no such events: its operations are done when their call returns, or its API has none)",
        }
    }
}

/// The one error of a caller that needs an optional group `group` the backend (`kind`) lacks,
/// for operation `what`: `InvalidUsage`, naming all three.
fn missing_group(kind: BackendKind, group: Group, what: &str) -> Error {
    Error::invalid_usage(format!("{what}: the {kind} backend has no {}", group.missing_text()))
}

/// The optional groups, or the error of `missing_group`: for callers that cannot go on
/// without the group (`backend.kernels_or_err("launch")?.launch_exec(..)`).
impl dyn DeviceBackend + '_ {
    fn group_or_err<'a, T: ?Sized>(&self, group: Option<&'a T>, which: Group, what: &str) -> Result<&'a T> {
        group.ok_or_else(|| missing_group(self.kind(), which, what))
    }

    /// [`DeviceBackend::kernels`], or the error that `what` needs device kernels.
    pub fn kernels_or_err(&self, what: &str) -> Result<&dyn Kernels> {
        self.group_or_err(self.kernels(), Group::Kernels, what)
    }

    /// [`DeviceBackend::symmetric_kernels`], or the error that `what` needs them.
    pub fn symmetric_kernels_or_err(&self, what: &str) -> Result<&dyn SymmetricKernels> {
        self.group_or_err(self.symmetric_kernels(), Group::SymmetricKernels, what)
    }

    /// [`DeviceBackend::window_memory`], or the error that `what` needs it.
    pub fn window_memory_or_err(&self, what: &str) -> Result<&dyn WindowMemory> {
        self.group_or_err(self.window_memory(), Group::WindowMemory, what)
    }

    /// [`DeviceBackend::buffer_sharing`], or the error that `what` needs it.
    pub fn buffer_sharing_or_err(&self, what: &str) -> Result<&dyn BufferSharing> {
        self.group_or_err(self.buffer_sharing(), Group::BufferSharing, what)
    }

    /// [`DeviceBackend::host_access`], or the error that `what` needs host addresses.
    pub fn host_access_or_err(&self, what: &str) -> Result<&dyn HostAccess> {
        self.group_or_err(self.host_access(), Group::HostAccess, what)
    }

    /// [`DeviceBackend::foreign_events`], or the error that `what` needs to record a caller's event.
    pub fn foreign_events_or_err(&self, what: &str) -> Result<&dyn ForeignEvents> {
        self.group_or_err(self.foreign_events(), Group::ForeignEvents, what)
    }
}

/// Memory: allocation, host memory devices reach, registration, copies and fills. Every
/// backend has it.
pub trait Memory {
    /// Allocates `bytes` of device memory on `device`, zero-filled on the host backend (not
    /// guaranteed elsewhere).
    fn alloc(&self, device: usize, bytes: usize) -> Result<DevicePtr>;

    /// Frees memory from [`alloc`](Memory::alloc), [`alloc_shareable`](Sharing::alloc_shareable)
    /// or [`alloc_symmetric`](WindowMemory::alloc_symmetric). Unknown pointers and double frees
    /// are `InvalidArgument`.
    fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Allocates pinned host memory that every device can access (see [`HostMapped`]).
    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped>;

    /// Frees memory from [`alloc_host_mapped`](Memory::alloc_host_mapped).
    fn free_host_mapped(&self, mem: HostMapped) -> Result<()>;

    /// Makes caller-owned host memory usable by devices and the backend's copies and fills
    /// (`cuMemHostRegister` with `DEVICEMAP`), returning its device address. This is how
    /// buffers a C caller allocated itself reach a backend.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must be valid for reads and writes until
    /// [`unregister_host`](Memory::unregister_host) is called.
    unsafe fn register_host(&self, ptr: *mut u8, bytes: usize) -> Result<DevicePtr>;

    /// Ends a [`register_host`](Memory::register_host) registration (the memory stays the
    /// caller's).
    fn unregister_host(&self, ptr: DevicePtr) -> Result<()>;

    /// Free and total bytes of `device`'s memory (`cuMemGetInfo`), where the backend knows
    /// them; `None` where it does not (the host backend).
    fn memory_info(&self, device: usize) -> Result<Option<(usize, usize)>>;

    /// Sets `bytes` bytes at `dst` to `value`, in stream order.
    fn memset(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()>;

    /// Copies `bytes` bytes from `src` to `dst` in stream order, in any direction (device,
    /// host-mapped, imported or registered memory on either side). The ranges must not
    /// overlap.
    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()>;

    /// Copies `src` from the host to `dst`; returns when the copy is complete.
    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()>;

    /// Copies `dst.len()` bytes from `src` to the host; returns when the copy is complete.
    fn copy_from_device(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()>;

    /// Enqueues a copy of `bytes` from pinned host memory at `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// `src` must be page-locked memory of this backend ([`Memory::alloc_host_mapped`]) that
    /// stays allocated and unchanged until the copy has run (for a captured stream: as long as
    /// the graph may be replayed).
    unsafe fn copy_from_pinned_async(&self, dst: DevicePtr, src: *const u8, bytes: usize, stream: Stream) -> Result<()>;
}

/// Streams, events, and stream capture. Every backend has it.
pub trait Streams {
    /// Creates a stream on `device`.
    fn create_stream(&self, device: usize) -> Result<Stream>;

    /// Destroys a stream from [`create_stream`](Streams::create_stream) (never the default
    /// stream).
    fn destroy_stream(&self, stream: Stream) -> Result<()>;

    /// Waits until all work enqueued on `stream` is complete.
    fn synchronize(&self, stream: Stream) -> Result<()>;

    /// Whether all work enqueued on `stream` is complete.
    fn query(&self, stream: Stream) -> Result<bool>;

    /// Creates an event on `device`.
    fn create_event(&self, device: usize) -> Result<Event>;

    /// Records `event` at the current end of `stream`.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()>;

    /// Makes work enqueued on `stream` from now on wait until `event` is complete.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()>;

    /// Whether the work before the last record of `event` is complete (true if never recorded).
    fn query_event(&self, event: Event) -> Result<bool>;

    /// Waits until the work before the last record of `event` is complete.
    fn synchronize_event(&self, event: Event) -> Result<()>;

    fn destroy_event(&self, event: Event) -> Result<()>;

    /// Runs `f` with this thread's stream-capture mode relaxed, so that the allocations and
    /// registrations an operation makes while a graph is being captured (programs, and
    /// connections made on first use) are allowed, as NCCL does.
    fn with_relaxed_capture(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<()>;

    /// Whether work enqueued on `stream` is being captured into a graph (then it is recorded,
    /// not run, and may be replayed any number of times later).
    fn is_capturing(&self, stream: Stream) -> Result<bool>;
}

/// Memory shared between processes: what the transports' connections are made of. Every
/// backend has it.
pub trait Sharing {
    /// Allocates `bytes` of device memory on `device` that other processes can map, with the
    /// handle to send them. [`free`](Memory::free) it like any allocation; importers keep
    /// their mappings.
    fn alloc_shareable(&self, device: usize, bytes: usize) -> Result<(DevicePtr, ShareHandle)>;

    /// Maps memory another process (or this one) exported, for use on `device`; its size is
    /// [`ShareHandle::bytes`]. A handle made by another backend kind is `InvalidArgument`.
    fn import(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr>;

    /// As [`import`](Sharing::import), by the last process that will import `handle`: the
    /// backend may then withdraw what names the memory, so that it goes away with the last
    /// mapping however the processes end (the host backend unlinks its /dev/shm file; others
    /// need nothing more, and keep this default).
    fn import_last(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr> {
        self.import(device, handle)
    }

    /// Unmaps memory from [`import`](Sharing::import).
    fn close_import(&self, ptr: DevicePtr) -> Result<()>;
}

/// The collective interpreter (`kernels/src/device/exec.cu`) and the stream operations of
/// device work. Device backends ([`DeviceBackend::kernels`]).
pub trait Kernels {
    /// Launches the collective interpreter on `stream`: the program of `launch.args` must stay
    /// in device memory until the launch completes. It does what
    /// [`check_exec_buffer`](Kernels::check_exec_buffer) (each buffer),
    /// [`reach_exec_memory`](Kernels::reach_exec_memory) (the slots),
    /// [`exec_kernel`](Kernels::exec_kernel) and
    /// [`launch_exec_kernel`](Kernels::launch_exec_kernel) do one by one; a repeated collective
    /// (`exec::gpu::cached`) does the first and the last per call only.
    fn launch_exec(&self, launch: &ExecLaunch, stream: Stream) -> Result<()>;

    /// The collective interpreter for `op` on `dtype`, loaded on `device` (compiled, or read
    /// from the kernel cache, on first use), to launch with
    /// [`launch_exec_kernel`](Kernels::launch_exec_kernel).
    fn exec_kernel(
        &self,
        device: usize,
        op: rustccl_kernels::DeviceOp,
        dtype: crate::types::DataType,
        entry: rustccl_kernels::exec::ExecEntry,
    ) -> Result<ExecKernel>;

    /// Launches `kernel` with the parameter `args` on `blocks` blocks on `stream`, which must
    /// run on the kernel's device; the buffers must have passed
    /// [`check_exec_buffer`](Kernels::check_exec_buffer) and the program `args` points to must
    /// stay in device memory until the launch completes.
    fn launch_exec_kernel(&self, kernel: &ExecKernel, args: &rustccl_kernels::exec::ExecArgs, blocks: u32, stream: Stream) -> Result<()>;

    /// Checks that the user buffer `ptr..ptr+bytes` is memory the backend or its driver knows
    /// (`InvalidArgument` if not), and makes it reachable from kernels on `device`; an empty
    /// range passes. What a launch does for each buffer it touches, call by call (a buffer
    /// may be freed and its address reused).
    fn check_exec_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<()>;

    /// Makes the memory at each of `ptrs` (an address in a connection's slots) reachable from
    /// kernels on `device` (peer access to the device that owns it). Done once per
    /// connection: what it enables stays.
    fn reach_exec_memory(&self, device: usize, ptrs: &[DevicePtr]) -> Result<()>;

    /// Writes `value` to the 4 bytes at `addr` (device memory, a peer's window included) in
    /// stream order, after the work before it is done and visible (`cuStreamWriteValue32`).
    fn stream_write_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()>;

    /// Makes the work enqueued on `stream` from now on wait until the 4 bytes at `addr` hold
    /// at least `value`, compared with wrap-around as the driver does (`(int32_t)(word -
    /// value) >= 0`; `cuStreamWaitValue32` with GEQ).
    fn stream_wait_u32(&self, addr: DevicePtr, value: u32, stream: Stream) -> Result<()>;

    /// Enqueues `callback` on `stream`: a driver thread runs it once the work enqueued before
    /// it is done, and the work enqueued after it waits for it (`cuLaunchHostFunc`). On a
    /// captured stream it becomes a host node of the graph and runs at every replay. The
    /// callback must not call the backend.
    ///
    /// # Safety
    /// `callback` must stay alive (the caller keeps a clone of the `Arc`) as long as the
    /// stream may run it: until it ran, or, captured, as long as the graph may be replayed.
    unsafe fn launch_host_callback(&self, callback: &Arc<HostCallback>, stream: Stream) -> Result<()>;
}

/// The symmetric kernels (`kernels/src/device/symmetric.h`), which read and write the peers'
/// windows directly ([`DeviceBackend::symmetric_kernels`]).
pub trait SymmetricKernels {
    /// Launches symmetric kernel `kernel` for `op` on `dtype` with `blocks` blocks on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn launch_symmetric(
        &self,
        device: usize,
        op: rustccl_kernels::DeviceOp,
        dtype: crate::types::DataType,
        kernel: rustccl_kernels::symmetric::SymKernel,
        args: &rustccl_kernels::exec::SymArgs,
        blocks: u32,
        stream: Stream,
    ) -> Result<()>;

    /// Launches the one-sided signal (`kernels/src/device/one_sided.cu`) on `stream`: adds 1
    /// to the peer's counter at `args.counter` (release, system scope) once the work before
    /// it on the stream is done (a put's copy).
    fn launch_signal(&self, device: usize, args: &rustccl_kernels::exec::SignalArgs, stream: Stream) -> Result<()>;

    /// Launches the one-sided wait on `stream`: the work after it waits until each of
    /// `args.peers` sent `args.counts` more signals than this rank's waits consumed so far,
    /// or the control block says abort.
    fn launch_wait_signal(&self, device: usize, args: &rustccl_kernels::exec::WaitSignalArgs, stream: Stream) -> Result<()>;
}

/// Symmetric memory, what windows (`crate::window`) are made of: allocations every process of
/// the host maps at a fixed offset of a reserved address space ([`DeviceBackend::window_memory`]).
pub trait WindowMemory {
    /// Allocates `bytes` of memory on `device` that windows can be made of (`ncclMemAlloc`):
    /// shareable, and mappable at a fixed address of a reserved space by every process of the
    /// host. [`free`](Memory::free) it like any allocation.
    fn alloc_symmetric(&self, device: usize, bytes: usize) -> Result<DevicePtr>;

    /// The allocation from [`alloc_symmetric`](WindowMemory::alloc_symmetric) that holds `ptr`,
    /// with the handle peers map it with; other memory is `InvalidArgument`.
    fn symmetric_memory(&self, ptr: DevicePtr) -> Result<SymmetricMemory>;

    /// Reserves `bytes` of address space (no memory behind it) for window mappings.
    fn reserve_space(&self, bytes: usize) -> Result<DevicePtr>;

    /// Gives back a space from [`reserve_space`](WindowMemory::reserve_space) (its mappings
    /// unmapped first).
    fn release_space(&self, base: DevicePtr, bytes: usize) -> Result<()>;

    /// Maps the allocation `handle` names (this process's or a peer's) at `at`, inside a
    /// reserved space, for `device`.
    fn map_shared_at(&self, device: usize, handle: &ShareHandle, at: DevicePtr) -> Result<()>;

    /// Unmaps what [`map_shared_at`](WindowMemory::map_shared_at) mapped at `at` (the space
    /// stays reserved).
    fn unmap_at(&self, at: DevicePtr) -> Result<()>;
}

/// Registered buffers (`ncclCommRegister`) a peer process maps to write into directly:
/// zero-copy point-to-point ([`DeviceBackend::buffer_sharing`]).
pub trait BufferSharing {
    /// The allocation holding the `bytes` at `ptr` (a registered buffer), with a handle a peer
    /// process maps it with ([`import_buffer`](BufferSharing::import_buffer)).
    fn export_buffer(&self, device: usize, ptr: DevicePtr, bytes: usize) -> Result<SymmetricMemory>;

    /// Maps a peer's allocation from [`export_buffer`](BufferSharing::export_buffer) into this
    /// process for `device`: where it starts here. Undone by
    /// [`close_buffer`](BufferSharing::close_buffer).
    fn import_buffer(&self, device: usize, handle: &ShareHandle) -> Result<DevicePtr>;

    /// Unmaps what [`import_buffer`](BufferSharing::import_buffer) mapped at `at`.
    fn close_buffer(&self, at: DevicePtr) -> Result<()>;
}

/// Host addresses of device memory, for backends whose memory the CPU addresses (the host
/// backend, whose collectives CPU threads run; [`DeviceBackend::host_access`]).
/// Events the caller made (a `cudaEvent_t` given to an `nccl*Config` call as
/// `launchCompletionEvent`), recorded on the caller's stream.
pub trait ForeignEvents {
    /// Records the caller's `event` at the current end of `stream`, on the stream's device.
    /// While `stream` is being captured the record becomes a node of the graph (CUDA's external
    /// event record), so that every replay records it, as the caller of a captured call expects.
    fn record_foreign_event(&self, event: Event, stream: Stream) -> Result<()>;
}

pub trait HostAccess {
    /// The host address of device memory `ptr..ptr+bytes`; the range must lie in one live
    /// allocation (else `InvalidArgument`).
    fn host_address(&self, ptr: DevicePtr, bytes: usize) -> Result<usize>;
}

#[cfg(test)]
mod tests;

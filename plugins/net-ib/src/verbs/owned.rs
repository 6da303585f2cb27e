//! Owned verbs objects: each wraps one pointer the library returned and frees it on drop.
//! A child keeps its parent alive (`Arc`), so a device context is closed only after its
//! PDs, CQs, MRs and QPs are gone, in the order verbs requires.
//!
//! Errors become [`PluginError`]s naming the verb, the device and the errno text.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use rustccl_plugin_api::PluginError;

use super::inline;
use super::lib::{c_text, Verbs};
use super::types::*;

/// The errno of the last failed call, for verbs that return NULL or -1.
fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A system error for verb `what` on `device` that failed with errno `err`.
pub fn verbs_error(what: &str, device: &str, err: c_int) -> PluginError {
    let text = std::io::Error::from_raw_os_error(err);
    let hint = match err {
        libc::ENOMEM | libc::EAGAIN => {
            "; check `ulimit -l` (locked memory) and the device's resource limits"
        }
        libc::EPERM | libc::EACCES => "; check access to /dev/infiniband/uverbs*",
        _ => "",
    };
    PluginError::system(format!("{what} on {device} failed: {text}{hint}"))
}

/// The verb's error from an int return value: rdma-core returns the errno, older providers
/// -1 with errno set.
fn check(rc: c_int, what: &str, device: &str) -> Result<(), PluginError> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(verbs_error(what, device, rc)),
        _ => Err(verbs_error(what, device, errno())),
    }
}

/// The array of `ibv_get_device_list`, freed on drop.
pub struct DeviceList {
    verbs: &'static Verbs,
    list: NonNull<*mut ibv_device>,
    len: usize,
}

impl DeviceList {
    /// The RDMA devices the library sees (possibly none).
    pub fn get(verbs: &'static Verbs) -> Result<DeviceList, PluginError> {
        let mut n: c_int = 0;
        // SAFETY: writes the count; returns a NULL-terminated array or NULL with errno.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        let Some(list) = NonNull::new(list) else {
            let err = errno();
            let why = if err == libc::ENOSYS {
                "this kernel has no RDMA support (no ib_uverbs); "
            } else {
                ""
            };
            return Err(PluginError::system(format!(
                "cannot list RDMA devices ({why}ibv_get_device_list failed: {})",
                std::io::Error::from_raw_os_error(err)
            )));
        };
        Ok(DeviceList {
            verbs,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The devices, in the library's order.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(move |i| {
            // SAFETY: `i < len`, the array's length as the library reported it.
            let dev = unsafe { *self.list.as_ptr().add(i) };
            NonNull::new(dev).map(|ptr| Device { list: self, ptr })
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the array ibv_get_device_list returned, freed once. Contexts opened from
        // its devices stay valid (libibverbs keeps the devices they use referenced).
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) }
    }
}

/// One device of a [`DeviceList`].
#[derive(Clone, Copy)]
pub struct Device<'a> {
    list: &'a DeviceList,
    ptr: NonNull<ibv_device>,
}

impl Device<'_> {
    /// The kernel's name of the device, e.g. `mlx5_0`.
    pub fn name(&self) -> String {
        // SAFETY: a device of the live list; the name is a NUL-terminated string it owns.
        unsafe { c_text((self.list.verbs.get_device_name)(self.ptr.as_ptr())) }
    }

    /// The node GUID (host value).
    pub fn guid(&self) -> u64 {
        // SAFETY: a device of the live list.
        u64::from_be(unsafe { (self.list.verbs.get_device_guid)(self.ptr.as_ptr()) })
    }

    /// Opens the device.
    pub fn open(&self) -> Result<Arc<Context>, PluginError> {
        let name = self.name();
        // SAFETY: a device of the live list; returns a context or NULL with errno.
        let ctx = unsafe { (self.list.verbs.open_device)(self.ptr.as_ptr()) };
        let ptr =
            NonNull::new(ctx).ok_or_else(|| verbs_error("ibv_open_device", &name, errno()))?;
        Ok(Arc::new(Context {
            verbs: self.list.verbs,
            ptr,
            name,
        }))
    }
}

/// An open device (`ibv_context`), closed on drop.
pub struct Context {
    verbs: &'static Verbs,
    ptr: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts and the objects made from them may be used from any thread
// (the library and providers lock internally).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn as_ptr(&self) -> *mut ibv_context {
        self.ptr.as_ptr()
    }

    pub fn verbs(&self) -> &'static Verbs {
        self.verbs
    }

    pub fn query_device(&self) -> Result<ibv_device_attr, PluginError> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the library fills `attr`.
        check(
            unsafe { (self.verbs.query_device)(self.as_ptr(), &mut attr) },
            "ibv_query_device",
            &self.name,
        )?;
        Ok(attr)
    }

    /// The port's attributes, through the exported (compat) `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<ibv_port_attr, PluginError> {
        let mut attr = ibv_port_attr::default();
        let what = format!("ibv_query_port (port {port})");
        // SAFETY: live context; the compat call fills `attr` up to `flags`.
        check(
            unsafe { (self.verbs.query_port)(self.as_ptr(), port, &mut attr) },
            &what,
            &self.name,
        )?;
        Ok(attr)
    }

    /// GID `index` of `port`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<ibv_gid, PluginError> {
        let mut gid = ibv_gid::default();
        let what = format!("ibv_query_gid (port {port}, index {index})");
        let index =
            c_int::try_from(index).map_err(|_| verbs_error(&what, &self.name, libc::EINVAL))?;
        // SAFETY: live context; the library writes 16 bytes into `gid`.
        check(
            unsafe { (self.verbs.query_gid)(self.as_ptr(), port, index, &mut gid) },
            &what,
            &self.name,
        )?;
        Ok(gid)
    }

    /// GID `index` of `port` with its type, where the library has `_ibv_query_gid_ex`
    /// (`Ok(None)` when it has not). An unused entry is an error (`ENODATA`).
    pub fn query_gid_entry(
        &self,
        port: u8,
        index: u32,
    ) -> Result<Option<ibv_gid_entry>, PluginError> {
        let Some(query) = self.verbs.query_gid_ex else {
            return Ok(None);
        };
        let mut entry = ibv_gid_entry::default();
        let what = format!("ibv_query_gid_ex (port {port}, index {index})");
        // SAFETY: live context; `entry` has the size passed, as verbs.h's inline wrapper does.
        let rc = unsafe {
            query(
                self.as_ptr(),
                port.into(),
                index,
                &mut entry,
                0,
                std::mem::size_of::<ibv_gid_entry>(),
            )
        };
        check(rc, &what, &self.name)?;
        Ok(Some(entry))
    }

    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<Pd>, PluginError> {
        // SAFETY: live context; returns a PD or NULL with errno.
        let pd = unsafe { (self.verbs.alloc_pd)(self.as_ptr()) };
        let ptr =
            NonNull::new(pd).ok_or_else(|| verbs_error("ibv_alloc_pd", &self.name, errno()))?;
        Ok(Arc::new(Pd {
            ctx: Arc::clone(self),
            ptr,
        }))
    }

    /// A CQ of at least `entries` entries, without a completion channel (polled).
    pub fn create_cq(self: &Arc<Self>, entries: u32) -> Result<Arc<Cq>, PluginError> {
        let what = format!("ibv_create_cq ({entries} entries)");
        let n =
            c_int::try_from(entries).map_err(|_| verbs_error(&what, &self.name, libc::EINVAL))?;
        // SAFETY: live context; no channel, vector 0; returns a CQ or NULL with errno.
        let cq = unsafe {
            (self.verbs.create_cq)(
                self.as_ptr(),
                n,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let ptr = NonNull::new(cq).ok_or_else(|| verbs_error(&what, &self.name, errno()))?;
        Ok(Arc::new(Cq {
            ctx: Arc::clone(self),
            ptr,
        }))
    }

    /// Waits for the device's next asynchronous event (blocks unless the context's
    /// `async_fd` was made non-blocking, then `EAGAIN` is an error).
    pub fn get_async_event(&self) -> Result<AsyncEvent<'_>, PluginError> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the library fills `event`.
        check(
            unsafe { (self.verbs.get_async_event)(self.as_ptr(), &mut event) },
            "ibv_get_async_event",
            &self.name,
        )?;
        Ok(AsyncEvent { ctx: self, event })
    }

    /// The device's next asynchronous event if one comes within `timeout_ms` (`Ok(None)`
    /// otherwise). The context's `async_fd` is made non-blocking first, as
    /// `ibv_get_async_event(3)` shows, so that a wake-up without an event never blocks.
    pub fn next_async_event(
        &self,
        timeout_ms: i32,
    ) -> Result<Option<AsyncEvent<'_>>, PluginError> {
        // SAFETY: live context; the library set `async_fd` at open and keeps it open.
        let fd = unsafe { (*self.as_ptr()).async_fd };
        // SAFETY: fcntl on the context's own descriptor, changing only its O_NONBLOCK flag.
        let nonblocking = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0
                && (flags & libc::O_NONBLOCK != 0
                    || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0)
        };
        if !nonblocking {
            return Err(verbs_error("fcntl(async_fd, O_NONBLOCK)", &self.name, errno()));
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, timeout_ms) } <= 0 {
            return Ok(None);
        }
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the library fills `event`.
        if unsafe { (self.verbs.get_async_event)(self.as_ptr(), &mut event) } == 0 {
            return Ok(Some(AsyncEvent { ctx: self, event }));
        }
        match errno() {
            libc::EAGAIN | libc::EINTR => Ok(None),
            err => Err(verbs_error("ibv_get_async_event", &self.name, err)),
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context ibv_open_device returned, closed once, after every child (each
        // holds an Arc to it).
        unsafe { (self.verbs.close_device)(self.as_ptr()) };
    }
}

/// An async event, acknowledged on drop (verbs requires one ack per event before the
/// objects it names can be destroyed).
pub struct AsyncEvent<'a> {
    ctx: &'a Context,
    pub event: ibv_async_event,
}

impl Drop for AsyncEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: an event ibv_get_async_event returned on this live context, acked once.
        unsafe { (self.ctx.verbs.ack_async_event)(&mut self.event) }
    }
}

/// A protection domain, deallocated on drop.
pub struct Pd {
    ctx: Arc<Context>,
    ptr: NonNull<ibv_pd>,
}

// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn as_ptr(&self) -> *mut ibv_pd {
        self.ptr.as_ptr()
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`). Flags from the
    /// optional range (relaxed ordering) go through `ibv_reg_mr_iova2` when the library
    /// has it, and are dropped otherwise, as verbs.h's `ibv_reg_mr` does on old kernels.
    ///
    /// # Safety
    /// `addr..addr+len` is memory of this process that stays mapped until the [`Mr`] drops;
    /// the device may read and write it (as `access` allows) meanwhile.
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> Result<Mr, PluginError> {
        let optional = access & !(IBV_ACCESS_RELAXED_ORDERING - 1) != 0;
        let mr = match (optional, self.ctx.verbs.reg_mr_iova2) {
            // SAFETY: live PD; the caller's promise on the range; iova = the address.
            (true, Some(iova2)) => unsafe {
                iova2(self.as_ptr(), addr, len, addr as u64, access as u32)
            },
            // SAFETY: as above, without the optional flags the plain export rejects.
            _ => unsafe {
                (self.ctx.verbs.reg_mr)(
                    self.as_ptr(),
                    addr,
                    len,
                    access & (IBV_ACCESS_RELAXED_ORDERING - 1),
                )
            },
        };
        let what = format!("ibv_reg_mr ({len} bytes at {addr:p})");
        let ptr = NonNull::new(mr).ok_or_else(|| verbs_error(&what, self.ctx.name(), errno()))?;
        Ok(Mr {
            pd: Arc::clone(self),
            ptr,
        })
    }

    /// Registers `len` bytes at `offset` of dma-buf `fd`, mapped at `iova`; an error when
    /// the library lacks `ibv_reg_dmabuf_mr` (rdma-core before 34).
    pub fn reg_dmabuf_mr(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: c_int,
        access: c_int,
    ) -> Result<Mr, PluginError> {
        let what = format!("ibv_reg_dmabuf_mr ({len} bytes of dma-buf fd {fd})");
        let Some(reg) = self.ctx.verbs.reg_dmabuf_mr else {
            return Err(PluginError::system(format!(
                "{what}: {} has no ibv_reg_dmabuf_mr (rdma-core 34 or later has); set NCCL_DMABUF_ENABLE=0 or update rdma-core",
                self.ctx.verbs.path
            )));
        };
        // SAFETY: live PD; the kernel checks the fd and range (dma-buf memory is not ours to
        // access, so no aliasing promise is needed).
        let mr = unsafe { reg(self.as_ptr(), offset, len, iova, fd, access) };
        let ptr = NonNull::new(mr).ok_or_else(|| verbs_error(&what, self.ctx.name(), errno()))?;
        Ok(Mr {
            pd: Arc::clone(self),
            ptr,
        })
    }

    /// NCCL's dma-buf probe: `ibv_reg_dmabuf_mr` of nothing with fd -1, which a kernel (or
    /// stand-in) with dma-buf support refuses with `EBADF`, and one without with `EOPNOTSUPP`
    /// or `EPROTONOSUPPORT`. Returns that errno (0 should a registration come back; it is
    /// released); `None` when the library lacks the call.
    pub fn probe_dmabuf(&self) -> Option<c_int> {
        let reg = self.ctx.verbs.reg_dmabuf_mr?;
        // SAFETY: live PD; fd -1 names no memory, so nothing can be mapped.
        let mr = unsafe { reg(self.as_ptr(), 0, 0, 0, -1, 0) };
        if mr.is_null() {
            return Some(errno());
        }
        // SAFETY: the MR just returned, deregistered once.
        unsafe { (self.ctx.verbs.dereg_mr)(mr) };
        Some(0)
    }

    /// An RC QP on `send_cq` / `recv_cq` with `cap`.
    pub fn create_rc_qp(
        self: &Arc<Self>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        cap: ibv_qp_cap,
    ) -> Result<Qp, PluginError> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_ptr(),
            recv_cq: recv_cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQs of the same context; returns a QP or NULL with errno.
        let qp = unsafe { (self.ctx.verbs.create_qp)(self.as_ptr(), &mut init) };
        let ptr = NonNull::new(qp)
            .ok_or_else(|| verbs_error("ibv_create_qp (RC)", self.ctx.name(), errno()))?;
        Ok(Qp {
            pd: Arc::clone(self),
            _cqs: [Arc::clone(send_cq), Arc::clone(recv_cq)],
            ptr,
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: the PD ibv_alloc_pd returned, freed once after its MRs and QPs (they hold
        // an Arc to it).
        unsafe { (self.ctx.verbs.dealloc_pd)(self.as_ptr()) };
    }
}

/// A registered memory region, deregistered on drop.
pub struct Mr {
    pd: Arc<Pd>,
    ptr: NonNull<ibv_mr>,
}

// SAFETY: see Context.
unsafe impl Send for Mr {}
// SAFETY: see Context.
unsafe impl Sync for Mr {}

impl Mr {
    pub fn as_ptr(&self) -> *mut ibv_mr {
        self.ptr.as_ptr()
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR; the library set its keys at registration.
        unsafe { (*self.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR a registration returned, deregistered once.
        unsafe { (self.pd.ctx.verbs.dereg_mr)(self.as_ptr()) };
    }
}

/// A completion queue, destroyed on drop.
pub struct Cq {
    ctx: Arc<Context>,
    ptr: NonNull<ibv_cq>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

impl Cq {
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.ptr.as_ptr()
    }

    /// Moves up to `wc.len()` completions into `wc`; returns how many.
    pub fn poll(&self, wc: &mut [ibv_wc]) -> Result<usize, PluginError> {
        let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ; `wc` has room for `n` entries.
        let got = unsafe { inline::poll_cq(self.as_ptr(), n, wc.as_mut_ptr()) };
        usize::try_from(got).map_err(|_| verbs_error("ibv_poll_cq", self.ctx.name(), errno()))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the CQ ibv_create_cq returned, destroyed once after its QPs (they hold an
        // Arc to it).
        unsafe { (self.ctx.verbs.destroy_cq)(self.as_ptr()) };
    }
}

/// A queue pair, destroyed on drop.
pub struct Qp {
    pd: Arc<Pd>,
    _cqs: [Arc<Cq>; 2],
    ptr: NonNull<ibv_qp>,
}

// SAFETY: see Context.
unsafe impl Send for Qp {}
// SAFETY: see Context.
unsafe impl Sync for Qp {}

impl Qp {
    pub fn as_ptr(&self) -> *mut ibv_qp {
        self.ptr.as_ptr()
    }

    fn device(&self) -> &str {
        self.pd.ctx.name()
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: a live QP; the library set its number at creation.
        unsafe { (*self.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp` with the fields of `attr` that `mask` (`IBV_QP_*`) names.
    pub fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), PluginError> {
        // SAFETY: live QP; the library reads the fields `mask` names.
        let rc = unsafe { (self.pd.ctx.verbs.modify_qp)(self.as_ptr(), attr, mask) };
        check(
            rc,
            &format!("ibv_modify_qp (to state {})", attr.qp_state),
            self.device(),
        )
    }

    /// Posts a chain of send work requests.
    ///
    /// # Safety
    /// The chain is valid; its SGEs name registered memory (of this QP's PD) that stays
    /// valid until the completion, and its remote address/key pairs are the peer's.
    pub unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), PluginError> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the caller's promise on the chain.
        check(
            unsafe { inline::post_send(self.as_ptr(), wr, &mut bad) },
            "ibv_post_send",
            self.device(),
        )
    }

    /// Posts a chain of receive work requests.
    ///
    /// # Safety
    /// As [`Qp::post_send`], for receive buffers.
    pub unsafe fn post_recv(&self, wr: &mut ibv_recv_wr) -> Result<(), PluginError> {
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; the caller's promise on the chain.
        check(
            unsafe { inline::post_recv(self.as_ptr(), wr, &mut bad) },
            "ibv_post_recv",
            self.device(),
        )
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the QP ibv_create_qp returned, destroyed once, before its PD and CQs.
        unsafe { (self.pd.ctx.verbs.destroy_qp)(self.as_ptr()) };
    }
}

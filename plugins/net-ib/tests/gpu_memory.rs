//! GPU memory on the verbs stand-in: dma-buf registration and the flush.
//!
//! The stand-in's `ibv_reg_dmabuf_mr` maps the fd it is given, so a memfd serves as the
//! dma-buf of a GPU buffer: the test maps it itself at address `A`, registers `A` (+ an
//! offset) with `reg_mr_dmabuf`, receives into it, and reads the bytes through `A`; the
//! stand-in wrote them through its own mapping. `IBV_DOUBLE_VERBOSE=1` makes the stand-in log
//! each RDMA read it serves, which is how the flush's 1-byte read is counted.
//! What only a GPU shows (a real exporter's dma-buf, the flush's effect on the GPU's view) is
//! in `verbs-double/README.md` and `docs/STATUS.md`.
//! Each case runs in a child process with its own environment and a time limit; all are
//! skipped, with the reason printed, when the stand-in cannot be built (see `common`).

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use common::*;
use rustccl_plugin_api::net::{Net, RecvBuffer, PTR_DEVICE, PTR_DMABUF, PTR_HOST};
use rustccl_plugin_api::{PluginError, PluginHandle};

/// A memfd of `len` bytes mapped shared at `addr`: what a GPU buffer's dma-buf stands for.
struct StandIn {
    fd: OwnedFd,
    addr: usize,
    len: usize,
}

impl StandIn {
    fn new(len: usize) -> StandIn {
        // SAFETY: a NUL-terminated name; memfd_create has no other precondition.
        let fd = unsafe { libc::memfd_create(c"rustccl-gpu-stand-in".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscalls on our fd; the mapping is ours until Drop unmaps it.
        let addr = unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "mmap the memfd");
        StandIn {
            fd,
            addr: addr as usize,
            len,
        }
    }

    /// Registers bytes `offset..offset + len` (at address `addr + offset`) with `p`'s
    /// receiving connection through `reg_mr_dmabuf`, as pointer type `ptr_type`.
    fn reg(
        &self,
        p: &Pair,
        offset: usize,
        len: usize,
        ptr_type: u32,
    ) -> Result<PluginHandle, PluginError> {
        p.net.reg_mr_dmabuf(
            p.recv,
            self.addr + offset,
            len,
            ptr_type,
            offset as u64,
            self.fd.as_raw_fd(),
        )
    }

    /// The bytes at `offset..offset + n`, read through this process's mapping.
    fn bytes(&self, offset: usize, n: usize) -> Vec<u8> {
        assert!(offset + n <= self.len);
        // SAFETY: inside the live mapping; no request writes it now (all completed).
        unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, n) }.to_vec()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), unmapped once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn recv_buf(data: usize, size: usize, mr: PluginHandle) -> [RecvBuffer; 1] {
    [RecvBuffer {
        data,
        size,
        tag: 7,
        mr,
    }]
}

/// `iflush` of a receive of `size` bytes at `data`, registered as `mr`.
fn flush(
    p: &Pair,
    data: usize,
    size: usize,
    mr: PluginHandle,
) -> Result<Option<PluginHandle>, PluginError> {
    p.net.iflush(p.recv, &recv_buf(data, size, mr))
}

/// Polls flush `req` until done, checking that `test` leaves `sizes` alone.
fn wait_flush(p: &Pair, req: PluginHandle) -> Result<(), PluginError> {
    let mut sizes = [77usize];
    p.poll(req, &mut sizes)?;
    assert_eq!(sizes, [77], "a flush reports no size");
    Ok(())
}

/// Sends `src` from host memory into a receive of `src.len()` bytes at `data`, registered
/// as `mr`; checks the size received.
fn send_into(p: &Pair, src: &[u8], data: usize, mr: PluginHandle) {
    let smr = p.reg(p.send, src);
    // SAFETY: the buffers outlive the requests (waited for below).
    let r = unsafe { p.net.irecv(p.recv, &recv_buf(data, src.len(), mr)) }
        .unwrap()
        .expect("a receive slot");
    // SAFETY: as above.
    let s = unsafe {
        p.net
            .isend(p.send, src.as_ptr() as usize, src.len(), 7, smr)
    }
    .unwrap()
    .expect("a send slot");
    p.wait(s).expect("send");
    assert_eq!(p.wait(r).expect("receive"), src.len());
    p.net.dereg_mr(p.send, smr).unwrap();
}

/// RDMA reads the stand-in served, as its verbose log shows them.
fn reads(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.contains(": RDMA read of "))
        .collect()
}

#[test]
fn dmabuf_memory_receives_and_is_flushed_by_one_1_byte_read() {
    let child = || {
        let p = Pair::connect();
        let props = p.net.properties(p.ctx, 0).unwrap();
        assert_eq!(props.ptr_support, PTR_HOST | PTR_DEVICE | PTR_DMABUF);
        assert!(!props.force_flush);

        let pg = page();
        let gpu = StandIn::new(4 * pg);
        // Host registrations of the same pages first (the buffer's own pages and all of
        // them).
        let host_mr = p.net.reg_mr(p.recv, gpu.addr, gpu.len, PTR_HOST).unwrap();
        let host_inner = p
            .net
            .reg_mr(p.recv, gpu.addr + pg, 2 * pg, PTR_HOST)
            .unwrap();
        // The receive buffer: the memfd's bytes pg..3pg, at A + pg. A second registration
        // inside it (same file, matching offset) shares the dma-buf one.
        let (data, size) = (gpu.addr + pg, 2 * pg);
        let dmr = gpu.reg(&p, pg, size, PTR_DEVICE).unwrap();
        let dmr_inner = gpu.reg(&p, pg + 100, 10, PTR_DEVICE).unwrap();

        let src: Vec<u8> = (0..size).map(|i| (i * 13 + 5) as u8).collect();
        send_into(&p, &src, data, dmr);
        assert!(
            gpu.bytes(pg, size) == src,
            "the bytes seen through the test's own mapping of the memfd differ from those sent"
        );
        assert!(
            gpu.bytes(0, pg).iter().all(|&b| b == 0),
            "nothing lands before the buffer"
        );

        // The flush: a request that completes.
        let f = flush(&p, data, size, dmr)
            .unwrap()
            .expect("a flush request for device memory");
        wait_flush(&p, f).expect("the flush read completes");
        // Nothing to flush: host memory (same pages), or a receive of nothing.
        assert!(flush(&p, data, size, host_inner).unwrap().is_none());
        assert!(flush(&p, data, 0, dmr_inner).unwrap().is_none());

        // Bad fds: a clear error before any verbs call.
        for fd in [-1, 987_654] {
            let e = p
                .net
                .reg_mr_dmabuf(p.recv, data, size, PTR_DEVICE, pg as u64, fd)
                .unwrap_err();
            assert_eq!(e.code, PluginError::INVALID_ARGUMENT, "{e}");
            assert!(
                e.message
                    .contains(&format!("fd {fd} is not an open dma-buf file descriptor")),
                "{e}"
            );
        }
        // Device memory through reg_mr: refused, naming the way that works.
        let e = p.net.reg_mr(p.recv, data, size, PTR_DEVICE).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_USAGE, "{e}");
        assert!(e.message.contains("reg_mr_dmabuf"), "{e}");

        for mr in [dmr_inner, dmr, host_inner, host_mr] {
            p.net.dereg_mr(p.recv, mr).unwrap();
        }
        p.close();
    };
    let Some(out) = in_child(
        "dmabuf_memory_receives_and_is_flushed_by_one_1_byte_read",
        &[("IBV_DOUBLE_VERBOSE", "1")],
        child,
    ) else {
        return;
    };
    assert!(
        out.contains("NET/IB : dbl_0:1 : GPU memory through dma-buf: available"),
        "{out}"
    );
    // One flush of device memory, none for host memory or an empty receive.
    let reads = reads(&out);
    assert_eq!(reads.len(), 1, "RDMA reads: {reads:#?}");
    assert!(reads[0].contains("RDMA read of 1 bytes"), "{reads:?}");
    // The dma-buf registration was made although host registrations of the same pages
    // were cached: the cache tells them apart.
    assert_eq!(
        out.matches("reg_dmabuf_mr fd").count(),
        1,
        "one dma-buf registration:\n{out}"
    );
}

#[test]
fn flush_disabled_means_nothing_to_flush() {
    let child = || {
        let p = Pair::connect();
        let gpu = StandIn::new(page());
        let dmr = gpu.reg(&p, 0, gpu.len, PTR_DMABUF).unwrap();
        assert!(flush(&p, gpu.addr, gpu.len, dmr).unwrap().is_none());
        p.net.dereg_mr(p.recv, dmr).unwrap();
        p.close();
    };
    let Some(out) = in_child(
        "flush_disabled_means_nothing_to_flush",
        &[("NCCL_GDR_FLUSH_DISABLE", "1"), ("IBV_DOUBLE_VERBOSE", "1")],
        child,
    ) else {
        return;
    };
    assert_eq!(reads(&out), Vec::<&str>::new());
}

#[test]
fn a_failed_flush_read_is_an_error() {
    // Every send WR of the child fails (the flush read included) with
    // IBV_WC_RETRY_EXC_ERR; no data moves, so nothing else posts one.
    in_child(
        "a_failed_flush_read_is_an_error",
        &[("IBV_DOUBLE_FAIL_AFTER", "0")],
        || {
            let p = Pair::connect();
            let gpu = StandIn::new(page());
            let dmr = gpu.reg(&p, 0, gpu.len, PTR_DEVICE).unwrap();
            let f = flush(&p, gpu.addr, gpu.len, dmr)
                .unwrap()
                .expect("a flush request");
            let e = wait_flush(&p, f).unwrap_err();
            assert!(
                e.message
                    .contains("flush read on dbl_0:1 failed: transport retry counter exceeded"),
                "{e}"
            );
            // The flush QP is in error: later flushes fail at once, with the same error.
            let again = flush(&p, gpu.addr, gpu.len, dmr).unwrap_err();
            assert_eq!(again.message, e.message);
            p.net.dereg_mr(p.recv, dmr).unwrap();
            p.close();
        },
    );
}

#[test]
fn without_dmabuf_only_host_memory() {
    for (var, says) in [
        // The library's probe answers EOPNOTSUPP (a kernel without dma-buf support).
        ("IBV_DOUBLE_DMABUF", "ibv_reg_dmabuf_mr answers EOPNOTSUPP"),
        ("NCCL_DMABUF_ENABLE", "NCCL_DMABUF_ENABLE=0"),
    ] {
        let Some(out) = in_child("without_dmabuf_only_host_memory", &[(var, "0")], host_only)
        else {
            return;
        };
        assert!(
            out.contains(&format!(
                "NET/IB : dbl_0:1 : GPU memory through dma-buf: not available ({says}"
            )),
            "{var}=0:\n{out}"
        );
    }
}

/// The child of [`without_dmabuf_only_host_memory`]: device memory refused both ways, host
/// memory fine (and nothing to flush).
fn host_only() {
    let p = Pair::connect();
    assert_eq!(p.net.properties(p.ctx, 0).unwrap().ptr_support, PTR_HOST);
    let gpu = StandIn::new(page());
    let e = p
        .net
        .reg_mr(p.recv, gpu.addr, gpu.len, PTR_DEVICE)
        .unwrap_err();
    assert_eq!(e.code, PluginError::INVALID_USAGE, "{e}");
    assert!(e.message.contains("has no dma-buf support"), "{e}");
    let e = gpu.reg(&p, 0, gpu.len, PTR_DEVICE).unwrap_err();
    assert_eq!(e.code, PluginError::INVALID_USAGE, "{e}");
    assert!(e.message.contains("offers no dma-buf registration"), "{e}");
    // Host memory: nothing to flush.
    let mr = p.net.reg_mr(p.recv, gpu.addr, gpu.len, PTR_HOST).unwrap();
    assert!(flush(&p, gpu.addr, gpu.len, mr).unwrap().is_none());
    p.net.dereg_mr(p.recv, mr).unwrap();
    p.close();
}

#[test]
fn a_merged_device_flushes_through_each_member() {
    // The stand-in's dual-port device is one merged device of two members: the dma-buf
    // registration is made on both members' PDs, the data comes over QPs of both ports, and
    // the flush reads through each member's loopback QP (as NCCL: the writes may have come
    // through either), each with the rkey of the buffer's registration on that member.
    let env = [
        ("IBV_DOUBLE_PORTS", "2"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("IBV_DOUBLE_VERBOSE", "1"),
    ];
    let child = || {
        let p = Pair::connect();
        let props = p.net.properties(p.ctx, 0).unwrap();
        assert_eq!(props.name.as_str(), "dbl_0+dbl_0");
        assert_eq!(props.ptr_support, PTR_HOST | PTR_DEVICE | PTR_DMABUF);
        let pg = page();
        let gpu = StandIn::new(3 * pg);
        let (data, size) = (gpu.addr + pg, 2 * pg - 3);
        let dmr = gpu.reg(&p, pg, size, PTR_DEVICE).unwrap();
        let src: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
        send_into(&p, &src, data, dmr);
        assert!(
            gpu.bytes(pg, size) == src,
            "the bytes in the memfd differ from those sent"
        );
        let f = flush(&p, data, size, dmr)
            .unwrap()
            .expect("a flush request for device memory");
        wait_flush(&p, f).expect("the flush reads complete");
        p.net.dereg_mr(p.recv, dmr).unwrap();
        p.close();
    };
    let Some(out) = in_child("a_merged_device_flushes_through_each_member", &env, child) else {
        return;
    };
    let reads = reads(&out);
    assert_eq!(reads.len(), 2, "one 1-byte read per member: {reads:#?}");
    assert!(
        reads.iter().all(|r| r.contains("RDMA read of 1 bytes")),
        "{reads:?}"
    );
    assert_eq!(
        out.matches("reg_dmabuf_mr fd").count(),
        2,
        "the dma-buf registered on each member's PD:\n{out}"
    );
}

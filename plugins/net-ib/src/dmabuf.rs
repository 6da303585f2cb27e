//! GPU memory through dma-buf: whether a device offers it, and registering a dma-buf.
//!
//! rustccl reaches GPU memory from the NIC only through dma-buf (`ibv_reg_dmabuf_mr`, the
//! kernel's own path for device memory), never through nvidia-peermem. A device offers it, as
//! NCCL decides, when `NCCL_DMABUF_ENABLE` is not 0, the library has `ibv_reg_dmabuf_mr`
//! (rdma-core 34), and a probe registration with fd -1 fails with `EBADF` (the kernel looked
//! at the fd) rather than `EOPNOTSUPP` / `EPROTONOSUPPORT` (no dma-buf support in the kernel
//! or the driver). Such a device reports `PTR_HOST | PTR_DEVICE | PTR_DMABUF`, others
//! `PTR_HOST`.
//!
//! A registration covers whole pages, as a host one: the buffer `data..data + size` at file
//! offset `offset` becomes the pages around it, at the file offset of their first byte, with
//! the pages' address as iova (the address the peer writes to). It is cached like host
//! registrations, under a key that names the dma-buf and the offset ([`Backing::DmaBuf`]).

use std::os::raw::c_int;
use std::sync::Arc;

use rustccl_plugin_api::net::{PTR_DEVICE, PTR_DMABUF, PTR_HOST};
use rustccl_plugin_api::PluginError;

use crate::comm::{page_size, Comm, Registration};
use crate::device::IbDevice;
use crate::mr_cache::{page_range, Backing};
use crate::verbs::types::*;

/// Whether a device offers dma-buf registration, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmaBufSupport {
    Available,
    /// `NCCL_DMABUF_ENABLE=0`.
    Disabled,
    /// The library has no `ibv_reg_dmabuf_mr` (rdma-core before 34); its path.
    NoLibraryCall(String),
    /// The probe's errno said "not supported" (or the probe could not run: the reason).
    Unsupported(String),
}

impl DmaBufSupport {
    pub fn available(&self) -> bool {
        *self == DmaBufSupport::Available
    }

    /// The pointer types a device with this support registers (`properties().ptr_support`).
    pub fn ptr_support(&self) -> u32 {
        if self.available() {
            PTR_HOST | PTR_DEVICE | PTR_DMABUF
        } else {
            PTR_HOST
        }
    }

    /// Why GPU memory cannot be registered (for logs and errors).
    pub fn why_not(&self) -> String {
        match self {
            DmaBufSupport::Available => "dma-buf is available".into(),
            DmaBufSupport::Disabled => "NCCL_DMABUF_ENABLE=0".into(),
            DmaBufSupport::NoLibraryCall(lib) => {
                format!("{lib} has no ibv_reg_dmabuf_mr; rdma-core 34 or later has")
            }
            DmaBufSupport::Unsupported(why) => why.clone(),
        }
    }
}

/// Decides, as NCCL does, whether `dev` offers dma-buf registration (`enabled`:
/// `NCCL_DMABUF_ENABLE`).
pub fn probe(dev: &IbDevice, enabled: bool) -> DmaBufSupport {
    if !enabled {
        return DmaBufSupport::Disabled;
    }
    let verbs = dev.context.verbs();
    if verbs.reg_dmabuf_mr.is_none() {
        return DmaBufSupport::NoLibraryCall(verbs.path.clone());
    }
    let pd = match dev.context.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => return DmaBufSupport::Unsupported(format!("the probe could not run: {e}")),
    };
    match pd.probe_dmabuf() {
        Some(err) if err == libc::EOPNOTSUPP || err == libc::EPROTONOSUPPORT => {
            let name = if err == libc::EOPNOTSUPP {
                "EOPNOTSUPP"
            } else {
                "EPROTONOSUPPORT"
            };
            DmaBufSupport::Unsupported(format!(
                "ibv_reg_dmabuf_mr answers {name}: the kernel or driver has no dma-buf support"
            ))
        }
        Some(_) => DmaBufSupport::Available,
        None => DmaBufSupport::NoLibraryCall(verbs.path.clone()),
    }
}

/// The INFO line for a device's support.
pub fn log_line(device: &str, support: &DmaBufSupport) -> String {
    if support.available() {
        format!("NET/IB : {device} : GPU memory through dma-buf: available")
    } else {
        format!(
            "NET/IB : {device} : GPU memory through dma-buf: not available ({}); host memory only",
            support.why_not()
        )
    }
}

/// The error of `reg_mr` for a pointer type other than host memory.
pub fn reg_mr_refused(ptr_type: u32, device: &str, dmabuf: bool) -> PluginError {
    if dmabuf {
        PluginError::invalid_usage(format!(
            "NET/IB : reg_mr registers host memory only (pointer type {ptr_type}); register GPU memory on {device} with reg_mr_dmabuf and its dma-buf fd (rustccl does not use peer-memory registration)"
        ))
    } else {
        PluginError::invalid_usage(format!(
            "NET/IB : {device} cannot register GPU memory (pointer type {ptr_type}): it has no dma-buf support; only host memory goes over this device"
        ))
    }
}

/// The (device, inode) of open file `fd`: the identity of its dma-buf.
fn file_identity(fd: c_int) -> Result<(u64, u64), PluginError> {
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`; any fd value is acceptable to it.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(PluginError::invalid_argument(format!(
            "reg_mr_dmabuf: fd {fd} is not an open dma-buf file descriptor ({})",
            std::io::Error::last_os_error()
        )));
    }
    Ok((st.st_dev, st.st_ino))
}

/// Registers `data..data + size`, which is `offset..offset + size` of dma-buf `fd`, on
/// connection `comm` (through its cache). Returns the cache entry and the registration.
pub fn register(
    comm: &Comm,
    data: usize,
    size: usize,
    offset: u64,
    fd: c_int,
) -> Result<(u64, Arc<Registration>), PluginError> {
    if !comm.dmabuf {
        return Err(PluginError::invalid_usage(format!(
            "NET/IB : reg_mr_dmabuf on {}: this device offers no dma-buf registration (its properties say PTR_HOST only)",
            comm.device
        )));
    }
    if data == 0 {
        return Err(PluginError::invalid_argument(
            "reg_mr_dmabuf of a null address",
        ));
    }
    let (dev, ino) = file_identity(fd)?;
    let (start, _) = page_range(data, size, page_size());
    let lead = (data - start) as u64;
    let first = offset.checked_sub(lead).ok_or_else(|| {
        PluginError::invalid_argument(format!(
            "reg_mr_dmabuf: buffer {data:#x} is {lead} bytes into its page but at dma-buf offset {offset}; a dma-buf maps whole pages, so the offset must be at least {lead}"
        ))
    })?;
    let backing = Backing::DmaBuf {
        dev,
        ino,
        offset: first,
    };
    comm.with_cache(|pds, cache| {
        cache.acquire_backed(backing, data, size, |start, len| {
            // One MR per physical device of the connection (a merged device's members).
            let mrs = pds
                .iter()
                .map(|pd| {
                    pd.reg_dmabuf_mr(
                        first,
                        len,
                        start as u64,
                        fd,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                    )
                })
                .collect::<Result<Vec<_>, PluginError>>()?;
            Ok(Registration { mrs, start, len })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_types_and_reasons() {
        assert_eq!(
            DmaBufSupport::Available.ptr_support(),
            PTR_HOST | PTR_DEVICE | PTR_DMABUF
        );
        for no in [
            DmaBufSupport::Disabled,
            DmaBufSupport::NoLibraryCall("libibverbs.so.1".into()),
            DmaBufSupport::Unsupported("EOPNOTSUPP".into()),
        ] {
            assert_eq!(no.ptr_support(), PTR_HOST);
            assert!(
                log_line("mlx5_0:1", &no).contains("not available ("),
                "{no:?}"
            );
        }
        assert!(DmaBufSupport::Disabled
            .why_not()
            .contains("NCCL_DMABUF_ENABLE=0"));
        assert!(log_line("mlx5_0:1", &DmaBufSupport::Available).ends_with(": available"));
    }

    #[test]
    fn a_closed_fd_is_named() {
        let e = file_identity(-1).unwrap_err();
        assert_eq!(e.code, PluginError::INVALID_ARGUMENT);
        assert!(e.message.contains("fd -1 is not an open"), "{e}");
    }
}

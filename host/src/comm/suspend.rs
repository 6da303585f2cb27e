//! Suspending a communicator's memory (NCCL 2.29's `ncclCommSuspend` / `ncclCommResume`) and
//! what it holds (`ncclCommMemStats`).
//!
//! Both calls are collective, as NCCL's: every rank of the communicator makes them. Suspend
//! waits until this rank's work has completed and every rank has arrived (a barrier, so no
//! peer still uses a FIFO), then frees the connections' FIFOs (the memory this rank exported
//! to its peers, its mappings of theirs, network FIFOs and the proxy) and the device
//! executor's image arena. Until resume, every operation is refused with `InvalidUsage`.
//! Resume makes the same connections again (with every peer at once, as the first operation
//! made them); the image arena comes back with the next launch.
//!
//! Kept across a suspend, and counted as persistent: the control block device kernels poll
//! and the program images of captured launches (a CUDA graph may replay them after resume).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Communicator;
use crate::error::{Error, Result};
use crate::program::Link;
use crate::transport::{establish_all, Dir, Wanted};

/// `NCCL_SUSPEND_MEM`: release the memory the communicator allocated.
pub const SUSPEND_MEM: i32 = 0x01;

/// `ncclCommMemStat_t`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemStat {
    /// `ncclStatGpuMemSuspend`: bytes held now that a suspend would free.
    GpuMemSuspend = 0,
    /// `ncclStatGpuMemSuspended`: 1 while suspended, else 0.
    GpuMemSuspended = 1,
    /// `ncclStatGpuMemPersist`: bytes held that a suspend keeps.
    GpuMemPersist = 2,
    /// `ncclStatGpuMemTotal`: every byte held.
    GpuMemTotal = 3,
}

impl MemStat {
    pub fn from_i32(v: i32) -> Result<MemStat> {
        Ok(match v {
            0 => MemStat::GpuMemSuspend,
            1 => MemStat::GpuMemSuspended,
            2 => MemStat::GpuMemPersist,
            3 => MemStat::GpuMemTotal,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "memory statistic {v} is not an ncclCommMemStat_t (ncclStatGpuMemSuspend 0 .. ncclStatGpuMemTotal 3)"
                )))
            }
        })
    }
}

/// The memory a communicator holds on this rank: what it allocated itself (FIFOs it exported
/// or keeps locally, images, the control block), not what it maps from its peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Bytes a suspend frees (0 while suspended: they are freed).
    pub suspendable: u64,
    /// Bytes a suspend keeps.
    pub persistent: u64,
    pub suspended: bool,
}

impl MemStats {
    pub fn total(&self) -> u64 {
        self.suspendable + self.persistent
    }

    /// The value `ncclCommMemStats` reports for `stat`.
    pub fn get(&self, stat: MemStat) -> u64 {
        match stat {
            MemStat::GpuMemSuspend => self.suspendable,
            MemStat::GpuMemSuspended => self.suspended as u64,
            MemStat::GpuMemPersist => self.persistent,
            MemStat::GpuMemTotal => self.total(),
        }
    }
}

impl Communicator {
    /// Whether the communicator is suspended.
    pub fn is_suspended(&self) -> bool {
        self.lock_suspended().is_some()
    }

    fn lock_suspended(&self) -> std::sync::MutexGuard<'_, Option<Vec<(Link, Dir)>>> {
        self.inner.suspended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ncclCommSuspend`: collective. With [`SUSPEND_MEM`] frees the memory the communicator
    /// allocated (see the module documentation); flags 0 suspend nothing (as NCCL).
    pub fn suspend(&self, flags: i32) -> Result<()> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        if flags & !SUSPEND_MEM != 0 {
            return self.fail(Error::invalid_argument(format!(
                "suspend flags {flags:#x}: only NCCL_SUSPEND_MEM ({SUSPEND_MEM:#x}) is defined"
            )));
        }
        let bs = self.operational("suspend")?;
        if flags & SUSPEND_MEM == 0 {
            tracing::info!(target: "INIT", "rank {}: suspend with flags 0: nothing to suspend", self.inner.rank);
            return Ok(());
        }
        // Operations queued (non-blocking) and device work complete first; then every rank.
        self.inner.jobs.wait_idle(None);
        self.wait_device_idle().or_else(|e| self.fail(e.context("suspend")))?;
        bs.barrier().or_else(|e| self.fail(e.context("suspend")))?;
        let before = self.mem_stats_now();
        let transports = std::mem::take(&mut *self.lock_transports());
        let mut keys: Vec<(Link, Dir)> = transports.conns.keys().copied().collect();
        keys.sort();
        if let Some(p) = &transports.proxy {
            p.stop();
        }
        drop(transports);
        self.device_cache().exec.suspend(&self.inner.shared.backend);
        *self.lock_suspended() = Some(keys);
        tracing::info!(
            target: "INIT",
            "rank {}: communicator {:016x} suspended: {} bytes freed, {} kept",
            self.inner.rank, self.inner.comm_hash, before.suspendable, before.persistent
        );
        Ok(())
    }

    /// `ncclCommResume`: collective. Makes the connections the suspend freed again; the
    /// communicator is then usable as before.
    pub fn resume(&self) -> Result<()> {
        let _g = crate::log::rank_scope(self.inner.rank as i32);
        let bs = self.ready("resume")?;
        if let Err(e) = self.check_running("resume") {
            return self.fail(e);
        }
        let Some(keys) = self.lock_suspended().clone() else {
            return self.fail(Error::invalid_usage(
                "resume: the communicator is not suspended (ncclCommResume follows ncclCommSuspend with NCCL_SUSPEND_MEM)",
            ));
        };
        bs.barrier().or_else(|e| self.fail(e.context("resume")))?;
        if let Err(e) = self.reconnect(&keys) {
            let e = self.record_error(e.context("resume"));
            self.mark_broken(&e);
            return Err(e);
        }
        *self.lock_suspended() = None;
        tracing::info!(
            target: "INIT",
            "rank {}: communicator {:016x} resumed ({} connections made again)",
            self.inner.rank, self.inner.comm_hash, keys.len()
        );
        Ok(())
    }

    /// Makes the connections `keys` again, all at once and in the order the first operation
    /// made them (`transport::establish_all`; each peer makes its ends meanwhile).
    fn reconnect(&self, keys: &[(Link, Dir)]) -> Result<()> {
        let wanted = keys.iter().map(|&(l, d)| Wanted::new((l, d), l, d)).collect();
        let deadline = Instant::now() + crate::params::bootstrap_timeout();
        establish_all(
            wanted,
            |&(link, _), est| {
                self.with_transport(|cx| est.poll(cx)).map_err(|e| e.context(format!("connecting to rank {}", link.peer)))
            },
            |(link, dir), conn| self.engine().keep_connection(link, dir, conn),
            |&(link, _)| {
                if Instant::now() > deadline {
                    return Err(Error::remote(format!(
                        "connecting to rank {}: timed out (RUSTCCL_BOOTSTRAP_TIMEOUT); did every rank call resume?",
                        link.peer
                    )));
                }
                self.check_running("resume")
            },
        )
    }

    /// `ncclCommMemStats`: the memory the communicator holds on this rank.
    pub fn mem_stats(&self) -> Result<MemStats> {
        self.ready("mem_stats")?;
        Ok(self.mem_stats_now())
    }

    fn mem_stats_now(&self) -> MemStats {
        let fifos: usize = self.lock_transports().conns.values().map(|c| c.allocated_bytes()).sum();
        let (arena, kept) = self.device_cache().exec.held_bytes();
        MemStats {
            suspendable: (fifos + arena) as u64,
            persistent: kept as u64,
            suspended: self.is_suspended(),
        }
    }

    /// Refuses operations while suspended (part of the gate of operations).
    pub(super) fn check_not_suspended(&self, what: &str) -> Result<()> {
        if self.is_suspended() && !self.inner.stop.abort.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(format!(
                "{what}: the communicator is suspended (ncclCommSuspend); call ncclCommResume on every rank first"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_follow_nccl_selectors() {
        let s = MemStats { suspendable: 10, persistent: 5, suspended: false };
        assert_eq!(s.get(MemStat::GpuMemSuspend), 10);
        assert_eq!(s.get(MemStat::GpuMemPersist), 5);
        assert_eq!(s.get(MemStat::GpuMemTotal), 15);
        assert_eq!(s.get(MemStat::GpuMemSuspended), 0);
        for v in 0..4 {
            assert_eq!(MemStat::from_i32(v).unwrap() as i32, v);
        }
        let e = MemStat::from_i32(4).unwrap_err();
        assert!(e.message.contains("ncclCommMemStat_t"), "{}", e.message);
    }

    #[test]
    fn one_rank_suspends_refuses_work_and_resumes() {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        let id = crate::get_unique_id().unwrap();
        let c = Communicator::init_rank(1, &id, 0).unwrap();
        assert_eq!(c.resume().unwrap_err().code, crate::ResultCode::InvalidUsage);
        assert_eq!(c.suspend(0x10).unwrap_err().code, crate::ResultCode::InvalidArgument);
        c.suspend(SUSPEND_MEM).unwrap();
        assert!(c.mem_stats().unwrap().suspended);
        let e = c.barrier().unwrap_err();
        assert_eq!(e.code, crate::ResultCode::InvalidUsage);
        assert!(e.message.contains("suspended"), "{}", e.message);
        assert!(c.last_error().contains("suspended"));
        c.resume().unwrap();
        assert!(!c.mem_stats().unwrap().suspended);
        c.barrier().unwrap();
        // One grow id at a time; a grow to fewer ranks is refused (and does not consume it).
        c.grow_unique_id().unwrap();
        assert_eq!(c.grow_unique_id().unwrap_err().code, crate::ResultCode::InvalidUsage);
        assert_eq!(c.grow(1, None, None).unwrap_err().code, crate::ResultCode::InvalidArgument);
        c.destroy().unwrap();
    }
}

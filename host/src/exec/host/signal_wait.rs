//! The one-sided operations' wait on the host backend (`ncclWaitSignal`): this rank's signal
//! counters (`window::signals`, in its symmetric resource memory) polled until each reaches
//! its target, under the driver, whose checks end the wait when the communicator fails (a
//! dead peer, an abort) or at `NCCL_OP_TIMEOUT_MS`: an error, never a hang.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{HostOp, Progress, Wait};
use crate::error::Result;

/// Spinning rounds before the wait naps (as the symmetric barriers).
const SPIN: u32 = 4096;

/// Waits until each counter reaches its target.
pub struct SignalWait {
    /// (peer, the counter's address in this process, the value to reach).
    targets: Vec<(usize, u64, u64)>,
    /// The next target to wait for (those before it were reached).
    next: usize,
}

impl SignalWait {
    /// `targets`: (peer, counter address, value). The addresses are 8-aligned 64-bit counters
    /// in this rank's resource memory, mapped while the communicator's windows exist.
    pub fn new(targets: Vec<(usize, u64, u64)>) -> SignalWait {
        SignalWait { targets, next: 0 }
    }

    fn counter(&self, addr: u64) -> &AtomicU64 {
        // SAFETY: `addr` is a counter of this rank's resource memory (see `new`), aligned,
        // mapped for as long as the communicator (which outlives the wait) holds its windows,
        // and only accessed atomically.
        unsafe { &*(addr as *const AtomicU64) }
    }
}

impl HostOp for SignalWait {
    fn poll(&mut self) -> Result<Progress> {
        let start = self.next;
        while let Some(&(_, addr, target)) = self.targets.get(self.next) {
            // Acquire: the bytes of the puts before the signals are seen after the wait.
            if self.counter(addr).load(Ordering::Acquire) < target {
                return Ok(if self.next > start { Progress::Moved } else { Progress::Waiting });
            }
            self.next += 1;
        }
        Ok(Progress::Done)
    }

    fn check_peers(&self) -> Result<()> {
        Ok(())
    }

    fn wait(&self) -> Wait {
        Wait { spin: SPIN, naps: true }
    }

    fn what(&self) -> String {
        match self.targets.get(self.next) {
            Some((peer, _, target)) => format!("WaitSignal (signal {target} from rank {peer})"),
            None => "WaitSignal".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait completes once every counter reaches its target, not before.
    #[test]
    fn waits_until_every_counter_reaches_its_target() {
        let counters = [AtomicU64::new(0), AtomicU64::new(0)];
        let addr = |i: usize| std::ptr::addr_of!(counters[i]) as u64;
        let mut w = SignalWait::new(vec![(0, addr(0), 2), (1, addr(1), 1)]);
        assert_eq!(w.poll().unwrap(), Progress::Waiting);
        counters[0].store(2, Ordering::Release);
        assert_eq!(w.poll().unwrap(), Progress::Moved);
        counters[1].store(3, Ordering::Release);
        assert_eq!(w.poll().unwrap(), Progress::Done);
    }
}

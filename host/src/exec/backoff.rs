//! How a CPU thread waits for a word another thread or process writes (a FIFO step of the
//! host executor, a call on the small collectives' board): spin a while (the writer may be
//! running on another core right now), then give the CPU away for up to 2 ms (the writer may
//! need this core), then nap 20 µs at a time (a long wait must not hold a core). The host
//! executor's one wait loop (`exec::host`) waits this way for the FIFOs and the board; the
//! symmetric collectives' barriers (`exec::host::symmetric`) ask for naps instead of yields
//! once the spin is over ([`Backoff::napping`]: 1 µs naps, then 50 µs ones), their own
//! measured choice, and so do the FIFOs and the board where the host's ranks outnumber its
//! cores ([`oversubscribed`]).

use std::time::{Duration, Instant};

/// Busy rounds at most when the host's ranks outnumber its cores (each spinning round then
/// keeps a rank that has work off a core).
const OVERSUBSCRIBED_SPIN: u32 = 16;
/// Spinning and yielding, before the naps.
const YIELD: Duration = Duration::from_millis(2);
const NAP: Duration = Duration::from_micros(20);
/// [`Backoff::napping`]: short naps for this many rounds after the spin, then long ones.
const SHORT_NAPS: u32 = 4096;
const SHORT_NAP: Duration = Duration::from_micros(1);
const LONG_NAP: Duration = Duration::from_micros(50);

/// One wait's state (see the module docs).
#[derive(Debug)]
pub(crate) struct Backoff {
    spin: u32,
    rounds: u32,
    since: Option<Instant>,
    /// Naps instead of yields after the spin ([`Backoff::napping`]).
    naps: bool,
}

impl Backoff {
    /// A wait that spins `spin` rounds before it yields.
    pub(crate) fn new(spin: u32) -> Backoff {
        Backoff { spin, rounds: 0, since: None, naps: false }
    }

    /// A wait that spins `spin` rounds, then naps 1 µs a round for 4096 rounds, then 50 µs
    /// (never yields): the symmetric collectives' barriers, where every rank of the host
    /// waits at once and a yield would hand the core to another waiter.
    pub(crate) fn napping(spin: u32) -> Backoff {
        Backoff { naps: true, ..Backoff::new(spin) }
    }

    /// What arrived ends the wait: the next pause starts spinning again.
    pub(crate) fn reset(&mut self) {
        self.rounds = 0;
        self.since = None;
    }

    /// One round of waiting: a spin, a yield or a nap.
    pub(crate) fn pause(&mut self) {
        self.rounds += 1;
        if self.rounds <= self.spin {
            std::hint::spin_loop();
            return;
        }
        if self.naps {
            std::thread::sleep(if self.rounds - self.spin <= SHORT_NAPS { SHORT_NAP } else { LONG_NAP });
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }

    /// Whether the waiter should look at failures and timeouts now: every 64th round once
    /// the spinning is over (a look costs more than a spin).
    pub(crate) fn check_now(&self) -> bool {
        self.rounds > self.spin && self.rounds.is_multiple_of(64)
    }
}

/// Spinning rounds for a wait among `local_ranks` ranks of this host: `spin`, or at most
/// [`OVERSUBSCRIBED_SPIN`] when they outnumber its cores.
pub(crate) fn spin_for(local_ranks: usize, spin: u32) -> u32 {
    if oversubscribed(local_ranks) {
        OVERSUBSCRIBED_SPIN.min(spin)
    } else {
        spin
    }
}

/// Whether `local_ranks` ranks outnumber this host's cores: then the host executor's waits
/// nap after their spin instead of yielding ([`Backoff::napping`]). A yield hands the core to
/// any runnable process for its time slice, and with more ranks than cores the rank whose
/// data this one waits for may then wait behind several others. Measured with 8 ranks on 2
/// cores (torch.distributed, 2026-12-07, one run each): all_reduce of 256 B 3,109 µs with
/// yields against 452 with naps, of 8 KiB 1,440 against 565; all_gather of 8 B–256 KiB
/// 1.7–5.6x faster. (Shorter naps, with the thread's timer slack at 1 µs
/// instead of Linux's 50, made every size 2–20x slower: the ranks then wake each other far
/// more often than they can run.)
pub(crate) fn oversubscribed(local_ranks: usize) -> bool {
    local_ranks > super::host::cores()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_spins_then_yields_then_naps_and_checks_every_64th_round_after_the_spin() {
        let mut w = Backoff::new(100);
        let mut checks = Vec::new();
        for _ in 0..300 {
            w.pause();
            if w.check_now() {
                checks.push(w.rounds);
            }
        }
        assert_eq!(checks, vec![128, 192, 256], "no checks while spinning (rounds 1..=100)");
        assert!(w.since.is_some(), "yielding started after the spin");
        w.reset();
        assert_eq!((w.rounds, w.since), (0, None));
        // Past the yielding time, a pause is a nap.
        w.since = Some(Instant::now() - YIELD);
        w.rounds = w.spin;
        let t = Instant::now();
        w.pause();
        assert!(t.elapsed() >= NAP, "{:?}", t.elapsed());
        assert_eq!(spin_for(1, 2048), 2048);
        assert_eq!(spin_for(usize::MAX, 2048), OVERSUBSCRIBED_SPIN);
        assert_eq!(spin_for(usize::MAX, 4), 4);
    }

    #[test]
    fn a_napping_wait_naps_after_the_spin_and_never_yields() {
        let mut w = Backoff::napping(2);
        w.pause();
        w.pause();
        let t = Instant::now();
        w.pause();
        assert!(t.elapsed() >= SHORT_NAP && w.since.is_none(), "a nap, not a yield");
        w.rounds = w.spin + SHORT_NAPS;
        let t = Instant::now();
        w.pause();
        assert!(t.elapsed() >= LONG_NAP);
    }
}

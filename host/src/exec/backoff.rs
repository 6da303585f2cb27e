//! How a CPU thread waits for a word another thread or process writes (a FIFO step of the
//! host executor, a call on the small collectives' board): spin a while (the writer may be
//! running on another core right now), then give the CPU away for up to 2 ms (the writer may
//! need this core), then nap 20 µs at a time (a long wait must not hold a core). The host
//! executor (`exec::host`) and the board (`coll::small`) wait this way; the symmetric
//! collectives' barrier (`coll::symmetric::host`) naps from its first pause on (1 µs naps,
//! no yields), its own measured choice.

use std::time::{Duration, Instant};

/// Busy rounds at most when the host's ranks outnumber its cores (each spinning round then
/// keeps a rank that has work off a core).
const OVERSUBSCRIBED_SPIN: u32 = 16;
/// Spinning and yielding, before the naps.
const YIELD: Duration = Duration::from_millis(2);
const NAP: Duration = Duration::from_micros(20);

/// One wait's state (see the module docs).
#[derive(Debug)]
pub(crate) struct Backoff {
    spin: u32,
    rounds: u32,
    since: Option<Instant>,
}

impl Backoff {
    /// A wait that spins `spin` rounds before it yields.
    pub(crate) fn new(spin: u32) -> Backoff {
        Backoff { spin, rounds: 0, since: None }
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
    if local_ranks > super::host::cores() {
        OVERSUBSCRIBED_SPIN.min(spin)
    } else {
        spin
    }
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
}

//! Where the host's time goes when it enqueues operations: per-stage totals, kept only when
//! `RUSTCCL_PROFILE_ENQUEUE=1` (read once), reported by [`report`]. For tuning the enqueue
//! path; off, a stage costs one relaxed load.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub enum Stage {
    Plan,
    Connect,
    Capture,
    Encode,
    Image,
    Kernel,
    /// Device copies enqueued besides kernels (a one-rank operation's copy).
    Copy,
    /// Recording the event that marks the communicator's last launch.
    Event,
    Total,
}

const STAGES: [&str; 9] = ["plan", "connect", "capture-check", "encode", "image", "kernel-launch", "copy", "event", "total"];

static NS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
static COUNT: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
/// 0 unknown, 1 off, 2 on.
static STATE: AtomicU8 = AtomicU8::new(0);

fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        0 => {
            let on = crate::params::resolve("RUSTCCL_PROFILE_ENQUEUE").value.is_some_and(|v| v.trim() == "1");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        s => s == 2,
    }
}

/// Adds the time since `start` to `stage`.
pub fn record(stage: Stage, start: Instant) {
    if enabled() {
        NS[stage as usize].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        COUNT[stage as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Now, when profiling is on (so that a stage costs no clock read when it is off).
#[inline]
pub fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Adds the time since `start` (from [`start`]) to `stage`.
#[inline]
pub fn stage(stage: Stage, start: Option<Instant>) {
    if let Some(t) = start {
        record(stage, t);
    }
}

/// Mean microseconds per stage so far (empty when profiling is off).
pub fn report() -> String {
    if !enabled() {
        return String::new();
    }
    let mut out = Vec::new();
    for (i, name) in STAGES.iter().enumerate() {
        let n = COUNT[i].load(Ordering::Relaxed);
        if n > 0 {
            out.push(format!("{name} {:.2} us", NS[i].load(Ordering::Relaxed) as f64 / n as f64 / 1e3));
        }
    }
    out.join(", ")
}

/// Forgets the totals so far (after a warm-up).
pub fn reset() {
    for i in 0..STAGES.len() {
        NS[i].store(0, Ordering::Relaxed);
        COUNT[i].store(0, Ordering::Relaxed);
    }
}

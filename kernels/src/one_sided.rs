//! The one-sided operations' kernels (`device/one_sided.cu`, a compilation unit of its own:
//! no operator or element type): a signal to a peer (the end of `ncclPutSignal`, and
//! `ncclSignal`) and a wait for signals (`ncclWaitSignal`). Their parameters are
//! [`crate::exec::SignalArgs`] and [`crate::exec::WaitSignalArgs`]; where the counters live,
//! `crate::exec::SYM_RES_SIGNALS` and `SYM_RES_SIGNALS_SEEN`.

/// The compilation unit.
pub const SOURCE: &str = "one_sided.cu";
/// The signal's entry point: one thread, one release add to the peer's counter.
pub const SIGNAL_KERNEL: &str = "rustccl_signal";
/// Threads of a signal launch (one does the work).
pub const SIGNAL_THREADS: u32 = 32;
/// The wait's entry point: a thread per peer, `crate::exec::SIGNAL_WAIT_MAX` at most.
pub const WAIT_KERNEL: &str = "rustccl_wait_signal";

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit is among the sources, defines both entry points and no ABI of its own.
    #[test]
    fn the_unit_has_both_entry_points() {
        let text = crate::source(SOURCE).expect("one_sided.cu is embedded");
        for k in [SIGNAL_KERNEL, WAIT_KERNEL] {
            assert!(text.contains(&format!(" {k}(")), "{k}");
        }
        assert!(text.contains(&format!("#include \"{}\"", crate::exec::ABI_HEADER)));
    }
}

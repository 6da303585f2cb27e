//! What runs a communicator's work, described once: made from the backend's capabilities by
//! the communicator's engine (`Engine::new`) and asked by coll (`comm.engine().executor()`),
//! so that coll asks where and how its work runs — never what the backend's memory is.
//! Which executor runs is the backend's capabilities' choice, made here and nowhere above.

use crate::backend::Capabilities;

/// How the symmetric collectives (collectives on buffers in symmetric windows, `coll::symmetric`)
/// run on a communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymmetricExec {
    /// Not at all: such collectives take the usual ways.
    None,
    /// Device kernels and copy engines (`exec::gpu::symmetric`, `exec::gpu::copy_engine`).
    Kernels,
    /// The kernels' CPU twins: the calling thread loads and stores in the mapped windows
    /// (`exec::host::symmetric`).
    Cpu,
}

/// The executor of a communicator's work (see the module's documentation). Copy: asked on
/// every call, with no lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executor {
    /// The host executor (`exec::host`): the calling thread runs every way, in the backend's
    /// memory, which the CPU addresses.
    Host { symmetric: bool },
    /// The device executor (`exec::gpu`): launches on the device's streams, completion seen by
    /// the communicator's watchdog.
    Gpu { symmetric: bool },
}

impl Executor {
    /// The executor for a backend with `caps`: the host executor where the CPU addresses the
    /// backend's memory, the device executor otherwise; symmetric collectives where the
    /// backend has them.
    pub fn of(caps: &Capabilities) -> Executor {
        let symmetric = caps.symmetric_kernels;
        if caps.host_addressable {
            Executor::Host { symmetric }
        } else {
            Executor::Gpu { symmetric }
        }
    }

    /// Work runs on the calling thread, done when the call returns (not launched on a device
    /// and seen done later by the watchdog).
    pub fn runs_on_host(self) -> bool {
        matches!(self, Executor::Host { .. })
    }

    /// The executor's CPU reads and writes the users' buffers itself, so the planner hands it
    /// their host addresses (`HostAccess::host_address`) rather than the device addresses the
    /// device executor takes. A memory question, asked here because only the executor's way of
    /// running makes it coll's business.
    pub fn cpu_reads_buffers(self) -> bool {
        self.runs_on_host()
    }

    /// A program's steps carry their payload in the protocol's slot format (LL flags, LL128
    /// lines), so a step holds what one slot's format holds; the host executor's steps carry
    /// bytes as they are, a whole slot's worth.
    pub fn steps_use_protocol_format(self) -> bool {
        !self.runs_on_host()
    }

    /// How the symmetric collectives run.
    pub fn symmetric(self) -> SymmetricExec {
        match self {
            Executor::Host { symmetric: true } => SymmetricExec::Cpu,
            Executor::Gpu { symmetric: true } => SymmetricExec::Kernels,
            Executor::Host { symmetric: false } | Executor::Gpu { symmetric: false } => SymmetricExec::None,
        }
    }

    /// Collectives may run on the copy engines, whose stream waits a failure must release
    /// (`window::Windows::release_copy_engine_waits`).
    pub fn uses_copy_engines(self) -> bool {
        self.symmetric() == SymmetricExec::Kernels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host backend's capabilities make the host executor with the CPU twins; a GPU's, the
    /// device executor with kernels and copy engines; without symmetric collectives, none.
    #[test]
    fn the_executor_follows_the_capabilities() {
        let host = Executor::of(&Capabilities::host());
        assert_eq!(host, Executor::Host { symmetric: true });
        assert!(host.runs_on_host() && host.cpu_reads_buffers() && !host.steps_use_protocol_format());
        assert_eq!(host.symmetric(), SymmetricExec::Cpu);
        assert!(!host.uses_copy_engines());

        let gpu = Executor::of(&Capabilities::gpu());
        assert_eq!(gpu, Executor::Gpu { symmetric: true });
        assert!(!gpu.runs_on_host() && !gpu.cpu_reads_buffers() && gpu.steps_use_protocol_format());
        assert_eq!(gpu.symmetric(), SymmetricExec::Kernels);
        assert!(gpu.uses_copy_engines());

        let plain = Executor::of(&Capabilities { symmetric_kernels: false, ..Capabilities::gpu() });
        assert_eq!(plain.symmetric(), SymmetricExec::None);
        assert!(!plain.uses_copy_engines());
    }
}

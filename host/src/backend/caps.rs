//! What a backend offers the planner and the transports. They ask for these capabilities,
//! never for which backend it is (wgpu-hal's adapter limits and features).

use rustccl_plugin_api::Protocol;

/// The cost model of one protocol.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProtocolCost {
    /// Time of one step, microseconds.
    pub latency_us: f32,
    /// Bandwidth, GB/s (per channel when [`Capabilities::bandwidth_per_channel`]).
    pub gbps: f32,
    /// Payload bytes one step carries; 0: as much as a slot holds in the protocol's format.
    pub chunk_bytes: usize,
}

/// What a backend offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Capabilities {
    /// The CPU can address the backend's memory: operations run on CPU threads (the host
    /// executor) and buffers are host addresses. Otherwise they run on the device (the
    /// collective interpreter) and connections between devices of one host can be P2P.
    pub host_addressable: bool,
    /// Devices are numbers, not hardware (the host backend's): each is the same memory and
    /// the same CPUs, so a process needs no device of its own (a launcher's local rank picks
    /// none: `Communicator::from_env` gives every process device 0).
    pub virtual_devices: bool,
    /// Streams and device addresses are the CUDA driver's own (`CUstream`, `CUdeviceptr`), so
    /// CUDA libraries' values — cudarc's streams and buffers, a `cudaStream_t` to capture a
    /// graph on — can be used with the backend as they are.
    pub cuda_handles: bool,
    /// The cost model, by [`Protocol::index`].
    pub protocols: [ProtocolCost; 3],
    /// Bandwidth grows with the channels (each channel is a block of its own).
    pub bandwidth_per_channel: bool,
    /// Channels chosen by size: one per `channel_bytes`, between 1 and `size_channels`.
    pub channel_bytes: usize,
    pub size_channels: u32,
    /// The most channels a collective may use (a tuner's or the config's choice included).
    pub max_channels: u32,
    /// Point-to-point messages and local copies: one channel per `p2p_channel_bytes` up to
    /// `p2p_max_channels`, and `p2p_channel_budget` channels shared among the peers; 0: one.
    pub p2p_channel_bytes: usize,
    pub p2p_max_channels: u32,
    pub p2p_channel_budget: u32,
    /// Bytes of each Simple FIFO slot; connections whose lines arrive whole (P2P) also have
    /// LL and LL128 slots of these sizes.
    pub slot_bytes: usize,
    pub ll_slot_bytes: usize,
    pub ll128_slot_bytes: usize,
    /// When `NCCL_ALGO`/`NCCL_PROTO` leave nothing for a collective, run Ring/Simple anyway
    /// (rather than refusing): the device path has no tree for every collective.
    pub ring_simple_fallback: bool,
    /// Ring/LL is the one-shot exchange (`program::direct`): each rank's input goes in one hop
    /// to every rank that needs it, and each reducing rank reduces all of them itself. The host
    /// backend's choice for small and middle sizes: one hop of latency instead of the ring's
    /// `n - 1` or `2(n - 1)`. NCCL's names are kept so that `NCCL_PROTO` (`LL` forces it, `^LL`
    /// turns it off), `NCCL_ALGO` and tuners work unchanged; Tree/LL stays a tree in LL-sized
    /// chunks. Device backends run a ring in the LL line format instead.
    pub one_shot_ll: bool,
    /// Repeated single collectives reuse their plan, kept by shape (the planned route's memo, `coll::planned`): a call
    /// only resolves its buffers. On device backends the plan's launch is kept with it (its
    /// program image in device memory, its kernel), so a call checks its buffers and
    /// launches.
    pub plan_cache: bool,
    /// Collectives on buffers in symmetric windows run the symmetric collectives
    /// (`coll::symmetric`), which read and write the peers' windows directly (kernels on
    /// GPUs, the calling thread on the host backend).
    pub symmetric_kernels: bool,
    /// NCCL's channel rule (`thread_threshold` non-zero): channels are dropped while the
    /// operation has fewer than channels x threads x threshold bytes. Bytes per thread, per
    /// protocol (LL, LL128, Simple); the ring's LL threshold is multiplied by the rank count,
    /// as NCCL does. Zero: one channel per `channel_bytes` (the host backend).
    pub thread_threshold: [usize; 3],
    /// Threads per channel (the kernel's block).
    pub channel_threads: usize,
    /// Point-to-point messages of at most this many bytes go as LL (NCCL's
    /// `NCCL_P2P_LL_THRESHOLD`, 16 KiB); 0: never.
    pub p2p_ll_bytes: usize,
}

impl Capabilities {
    pub fn protocol(&self, p: Protocol) -> ProtocolCost {
        self.protocols[p.index()]
    }

    /// Channels for a collective of `bytes` by size alone.
    pub fn channels_by_size(&self, bytes: usize) -> u32 {
        self.channels_of(bytes, self.channel_bytes)
    }

    /// One channel per `per_channel` bytes, at least one, at most `size_channels`.
    fn channels_of(&self, bytes: usize, per_channel: usize) -> u32 {
        ((bytes / per_channel.max(1)) as u64).clamp(1, self.size_channels.max(1) as u64) as u32
    }

    /// Channels for a ring or tree collective of `bytes` with protocol `p` among `nranks`:
    /// NCCL's rule where the backend has thresholds (`NCCL_THREAD_THRESHOLDS` replaces them:
    /// three numbers, LL LL128 Simple, a negative one keeps the default), else by size.
    pub fn channels_for(&self, p: Protocol, bytes: usize, nranks: u32) -> u32 {
        let mut thr = self.thread_threshold;
        if let Some(set) = threshold_setting() {
            for (t, v) in thr.iter_mut().zip(set) {
                if let Some(v) = v {
                    *t = *v;
                }
            }
        }
        let t = thr[p.index()] * if p == Protocol::Ll { nranks.max(1) as usize } else { 1 };
        if t == 0 {
            return self.channels_by_size(bytes);
        }
        // NCCL drops a channel while bytes < channels x threads x threshold: the most channels
        // that each get threads x threshold bytes.
        self.channels_of(bytes, self.channel_threads * t)
    }

    /// Channels a point-to-point message (or local copy) of `bytes` is spread over with
    /// `nranks` ranks (each channel of each peer is a connection with slots of its own).
    pub fn p2p_channels(&self, bytes: usize, nranks: u32) -> u32 {
        if self.p2p_channel_bytes == 0 {
            return 1;
        }
        let most = (self.p2p_channel_budget / nranks.saturating_sub(1).max(1)).clamp(1, self.p2p_max_channels.max(1));
        ((bytes / self.p2p_channel_bytes) as u64).clamp(1, most as u64) as u32
    }

    /// The host backend: CPU threads poll FIFOs in shared memory.
    pub fn host() -> Capabilities {
        const SLOT: usize = 512 * 1024;
        Capabilities {
            host_addressable: true,
            virtual_devices: true,
            cuda_handles: false,
            protocols: [
                // LL: the one-shot exchange (`one_shot_ll`), in 64 KiB pieces; it moves n - 1 copies of
                // each input, so it gives way to the ring from about 32-128 KiB (measured).
                ProtocolCost { latency_us: 2.0, gbps: 2.0, chunk_bytes: 64 * 1024 },
                ProtocolCost { latency_us: 6.0, gbps: 3.0, chunk_bytes: 128 * 1024 },
                ProtocolCost { latency_us: 12.0, gbps: 6.0, chunk_bytes: SLOT },
            ],
            bandwidth_per_channel: false,
            // One thread polls every channel: a second one helps overlap from 4 MiB on.
            channel_bytes: 2 << 20,
            size_channels: 2,
            max_channels: 4,
            p2p_channel_bytes: 0,
            p2p_max_channels: 1,
            p2p_channel_budget: 1,
            slot_bytes: SLOT,
            ll_slot_bytes: 0,
            ll128_slot_bytes: 0,
            ring_simple_fallback: false,
            one_shot_ll: true,
            plan_cache: true,
            symmetric_kernels: true,
            thread_threshold: [0; 3],
            channel_threads: 1,
            p2p_ll_bytes: 0,
        }
    }

    /// GPUs running the collective interpreter (`kernels/src/device/exec.cu`), measured on
    /// H200s over NVLink, per channel: LL needs no fence nor counter round trip but moves half
    /// its bytes as flags; LL128 loses 1/16; Simple waits for a counter at each step.
    pub fn gpu() -> Capabilities {
        let p2p_channels = max_p2p_channels().unwrap_or(32);
        Capabilities {
            host_addressable: false,
            virtual_devices: false,
            cuda_handles: true,
            // Per channel: bus bandwidth measured with one channel on an H200 (session 6,
            // docs/data/h200-1gpu-2ranks-2026-12-02, the large-size plateaus of the ch1 runs;
            // Simple from session 7's 1 MiB slots, docs/data/h200-1gpu-2ranks-2026-12-02-s7);
            // latencies from the first two-GPU runs.
            protocols: [
                ProtocolCost { latency_us: 2.0, gbps: 4.8, chunk_bytes: 0 },
                ProtocolCost { latency_us: 3.0, gbps: 9.4, chunk_bytes: 0 },
                ProtocolCost { latency_us: 6.0, gbps: 21.5, chunk_bytes: 0 },
            ],
            bandwidth_per_channel: true,
            // One channel (a block with its own connections) per 128 KiB, up to 32.
            channel_bytes: 128 << 10,
            size_channels: 32,
            max_channels: 32,
            // One per MiB, up to 32 shared among the peers, as NCCL's p2p channels over NVLink
            // (measured on one H200, 2 ranks, session 7: sendrecv 1 GiB 254 / 393 / 487 GB/s
            // with 8 / 16 / 32); NCCL_MAX_P2P_NCHANNELS (1 to 32) sets both limits.
            p2p_channel_bytes: 1 << 20,
            p2p_max_channels: p2p_channels,
            p2p_channel_budget: p2p_channels,
            // NCCL_BUFFSIZE over RUSTCCL_SIMPLE_STEPS (4 MiB in 1 MiB slots unless set).
            slot_bytes: gpu_slot_bytes(),
            ll_slot_bytes: 64 << 10,
            ll128_slot_bytes: 256 << 10,
            ring_simple_fallback: true,
            one_shot_ll: false,
            plan_cache: true,
            symmetric_kernels: true,
            // NCCL's thresholds: 8 bytes per thread for LL (times the ranks) and LL128, 64
            // for Simple.
            thread_threshold: [8, 8, 64],
            channel_threads: rustccl_kernels::exec::EXEC_THREADS as usize,
            p2p_ll_bytes: crate::params::env_int_or("NCCL_P2P_LL_THRESHOLD", 16384).max(0) as usize,
        }
    }
}

impl Capabilities {
    /// AMD GPUs (the hip backend): the GPU model with two differences, until the GPU checks
    /// have run on one. LL128 is left out of the automatic choice (it stays available to
    /// `NCCL_PROTO`): it relies on a 128-byte line written by eight lanes arriving whole,
    /// which NVIDIA's GPUs give and AMD's do not promise (RCCL enables it only on the GPUs it
    /// has validated). No symmetric kernels: the hip backend has no symmetric memory yet. Its
    /// handles are HIP's, not CUDA's.
    pub fn gpu_amd() -> Capabilities {
        let mut c = Capabilities::gpu();
        c.protocols[Protocol::Ll128.index()].latency_us = 1e6;
        c.symmetric_kernels = false;
        c.cuda_handles = false;
        c
    }
}

/// `NCCL_MAX_P2P_NCHANNELS`: the channels point-to-point messages may use, per peer and in
/// all (1 to 32; out of range: the nearest limit), if set.
fn max_p2p_channels() -> Option<u32> {
    let v = crate::params::env_int("NCCL_MAX_P2P_NCHANNELS").unwrap_or_else(|e| {
        tracing::warn!(target: "ENV", "{}; using the default", e.message);
        None
    })?;
    Some(v.clamp(1, 32) as u32)
}

/// `NCCL_THREAD_THRESHOLDS` (LL LL128 Simple; negative or missing: the default), read once.
fn threshold_setting() -> Option<&'static [Option<usize>; 3]> {
    static V: std::sync::OnceLock<Option<[Option<usize>; 3]>> = std::sync::OnceLock::new();
    V.get_or_init(|| crate::params::env_str("NCCL_THREAD_THRESHOLDS").map(|s| parse_thresholds(&s))).as_ref()
}

fn parse_thresholds(s: &str) -> [Option<usize>; 3] {
    let mut out = [None; 3];
    for (o, v) in out.iter_mut().zip(s.split_whitespace()) {
        *o = v.parse::<i64>().ok().filter(|v| *v >= 0).map(|v| v as usize);
    }
    out
}

/// The host backend's capabilities, made once.
pub fn host_static() -> &'static Capabilities {
    static C: std::sync::OnceLock<Capabilities> = std::sync::OnceLock::new();
    C.get_or_init(Capabilities::host)
}

/// AMD GPUs' capabilities ([`Capabilities::gpu_amd`]), made once.
pub fn gpu_amd_static() -> &'static Capabilities {
    static C: std::sync::OnceLock<Capabilities> = std::sync::OnceLock::new();
    C.get_or_init(Capabilities::gpu_amd)
}

/// The GPU backends' capabilities, made once.
pub fn gpu_static() -> &'static Capabilities {
    static C: std::sync::OnceLock<Capabilities> = std::sync::OnceLock::new();
    C.get_or_init(Capabilities::gpu)
}

/// The Simple FIFO of device connections (P2P and SHM between GPUs; network FIFOs keep all
/// `FIFO_STEPS` slots, of the same size): how many slots, of how many bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleFifo {
    pub slot_bytes: usize,
    pub steps: usize,
}

impl SimpleFifo {
    /// Bytes of all the slots.
    pub fn bytes(&self) -> usize {
        self.steps * self.slot_bytes
    }

    /// NCCL's Simple buffer: 4 MiB per connection.
    pub const DEFAULT_BUFFER: usize = 4 << 20;
    /// Slots the buffer is cut into unless `RUSTCCL_SIMPLE_STEPS` says otherwise: 1 MiB steps
    /// (NCCL keeps 512 KiB steps but posts every second one; a step is what we post).
    pub const DEFAULT_STEPS: usize = 4;

    /// From `NCCL_BUFFSIZE` (bytes per connection) and `RUSTCCL_SIMPLE_STEPS` (2, 4 or 8
    /// slots): slots in whole 4 KiB pages of 64 KiB to 8 MiB; a value out of range is reported
    /// and its default used.
    pub fn from_settings(
        buffer: crate::error::Result<Option<i64>>,
        steps: crate::error::Result<Option<i64>>,
    ) -> SimpleFifo {
        let steps = match steps {
            Ok(None) => Self::DEFAULT_STEPS,
            Ok(Some(n)) if matches!(n, 2 | 4 | 8) => n as usize,
            Ok(Some(n)) => {
                tracing::warn!(target: "ENV", "RUSTCCL_SIMPLE_STEPS={n} is not 2, 4 or 8; using {}", Self::DEFAULT_STEPS);
                Self::DEFAULT_STEPS
            }
            Err(e) => {
                tracing::warn!(target: "ENV", "{}; using {}", e.message, Self::DEFAULT_STEPS);
                Self::DEFAULT_STEPS
            }
        };
        const PAGE: usize = 4096;
        let (min, max) = (64 << 10, 8 << 20);
        let buffer = match buffer {
            Ok(None) => Self::DEFAULT_BUFFER,
            Ok(Some(b)) if b > 0 && (min..=max).contains(&(b as usize / steps)) => b as usize,
            Ok(Some(b)) => {
                tracing::warn!(
                    target: "ENV",
                    "NCCL_BUFFSIZE={b} is outside {} to {} bytes ({steps} slots of 64 KiB to 8 MiB); using {}",
                    min * steps,
                    max * steps,
                    Self::DEFAULT_BUFFER
                );
                Self::DEFAULT_BUFFER
            }
            Err(e) => {
                tracing::warn!(target: "ENV", "{}; using {}", e.message, Self::DEFAULT_BUFFER);
                Self::DEFAULT_BUFFER
            }
        };
        SimpleFifo {
            slot_bytes: buffer / steps / PAGE * PAGE,
            steps,
        }
    }
}

/// The Simple FIFO of device connections, from the environment, read once per process. Every
/// rank must use the same settings (a step of another size is reported as mismatched calls).
pub fn gpu_simple_fifo() -> SimpleFifo {
    static F: std::sync::OnceLock<SimpleFifo> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        SimpleFifo::from_settings(
            crate::params::env_int("NCCL_BUFFSIZE"),
            crate::params::env_int("RUSTCCL_SIMPLE_STEPS"),
        )
    })
}

/// Bytes of each Simple FIFO slot of device connections (the planner's Simple chunk).
pub fn gpu_slot_bytes() -> usize {
    gpu_simple_fifo().slot_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffsize_and_steps_set_the_simple_fifo_within_limits() {
        let f = |b: Option<i64>, n: Option<i64>| SimpleFifo::from_settings(Ok(b), Ok(n));
        let d = SimpleFifo::DEFAULT_BUFFER;
        assert_eq!(
            f(None, None),
            SimpleFifo {
                slot_bytes: d / SimpleFifo::DEFAULT_STEPS,
                steps: SimpleFifo::DEFAULT_STEPS
            }
        );
        assert_eq!(
            f(Some(8 << 20), Some(8)),
            SimpleFifo {
                slot_bytes: 1 << 20,
                steps: 8
            }
        );
        assert_eq!(
            f(None, Some(2)),
            SimpleFifo {
                slot_bytes: 2 << 20,
                steps: 2
            }
        );
        // Rounded down to whole pages.
        assert_eq!(f(Some((1 << 20) * 4 + 100), Some(4)).slot_bytes, 1 << 20);
        assert_eq!(
            f(Some(((64 << 10) + 5000) * 8), Some(8)).slot_bytes,
            (64 << 10) + 4096
        );
        // Out of range: the default buffer (over the steps asked for), or the default steps.
        for bad in [0, -1, (64 << 10) * 8 - 1, (8 << 20) * 8 + 8 * 4096] {
            assert_eq!(
                f(Some(bad), Some(8)),
                SimpleFifo {
                    slot_bytes: d / 8,
                    steps: 8
                },
                "{bad}"
            );
        }
        for bad in [0, 1, 3, 16, -4] {
            assert_eq!(f(None, Some(bad)).steps, SimpleFifo::DEFAULT_STEPS, "{bad}");
        }
        let unparsed = || {
            Err(crate::error::Error::invalid_argument(
                "NCCL_BUFFSIZE=\"x\" is not an integer",
            ))
        };
        assert_eq!(
            SimpleFifo::from_settings(unparsed(), Ok(None)),
            f(None, None)
        );
        assert_eq!(
            SimpleFifo::from_settings(Ok(None), unparsed()),
            f(None, None)
        );
    }

    #[test]
    fn channel_rules_are_the_ones_the_planner_used() {
        let (h, g) = (Capabilities::host(), Capabilities::gpu());
        for (bytes, host, gpu) in [(0, 1, 1), (1 << 20, 1, 8), ((4 << 20) - 1, 1, 31), (4 << 20, 2, 32), (1 << 30, 2, 32)] {
            assert_eq!((h.channels_by_size(bytes), g.channels_by_size(bytes)), (host, gpu), "{bytes}");
        }
        assert_eq!(h.p2p_channels(1 << 30, 2), 1);
        assert_eq!(g.p2p_channels(3 << 20, 2), 3);
        assert_eq!(g.p2p_channels(1 << 30, 2), 32);
        assert_eq!(g.p2p_channels(1 << 30, 5), 8);
        assert_eq!(g.p2p_channels(1 << 30, 64), 1);
    }

    #[test]
    fn gpus_drop_channels_as_nccl_does() {
        let g = Capabilities::gpu();
        // Simple: 64 bytes x 512 threads = 32 KiB per channel.
        assert_eq!(g.channels_for(Protocol::Simple, 8, 2), 1);
        assert_eq!(g.channels_for(Protocol::Simple, 256 << 10, 2), 8);
        assert_eq!(g.channels_for(Protocol::Simple, (256 << 10) - 1, 2), 7);
        assert_eq!(g.channels_for(Protocol::Simple, 1 << 30, 2), 32);
        // LL on a ring of 4: 8 x 4 bytes per thread.
        assert_eq!(g.channels_for(Protocol::Ll, 64 << 10, 4), 4);
        assert_eq!(g.channels_for(Protocol::Ll128, 64 << 10, 4), 16);
        // The host backend keeps its rule.
        let h = Capabilities::host();
        assert_eq!(h.channels_for(Protocol::Simple, 4 << 20, 2), h.channels_by_size(4 << 20));
        assert_eq!(parse_thresholds("8 -1 256"), [Some(8), None, Some(256)]);
        assert_eq!(parse_thresholds("x"), [None, None, None]);
    }
}

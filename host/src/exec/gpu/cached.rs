//! A device launch made once and repeated: what a single collective called again with the same
//! shape (the planned route's memo, `exec::memo`) reuses on a device backend — its program image (encoded once, kept in
//! the image arena and found there again by generation and offset, not by content), the
//! interpreter kernel (looked up once), and the peer access of its connections' slots (set up
//! once). The image depends only on the shape (the buffers and the PreMulSum scalar travel in
//! the kernel parameter, see [`super::encode`]), so a call with other buffers reuses it as is.
//!
//! Per call the launch only goes through the launch sequence (`super::sequence`: asks whether
//! the stream is being captured; waits for the communicator's last launch when it was on
//! another stream; records the communicator's event after the launch) and, inside it, checks
//! the two user buffers (and makes them reachable), fills the kernel parameter and launches.
//! No encode, no upload, no allocation — except when the arena was emptied since (the image
//! goes up again, not re-encoded) and when the stream is being captured (the launch gets an
//! image of its own that lives as long as the communicator, as uncached captured launches
//! do).
//!
//! About the event: it is recorded after every launch because the next launch of this
//! communicator may come on another stream and must wait for this one, the watchdog and
//! `wait_device_idle` ask it whether the device work completed, and a full arena waits for it
//! before its images are overwritten. Recording it lazily — on the old stream when a later
//! call comes on another — is not safe: the caller may have destroyed that stream in
//! between. What would let the launch skip it: the kernel writing a launch sequence number
//! into the control block (host-mapped) when its last block finishes, completion read from
//! that number, and a stream change answered by `cuStreamWaitValue64` on it on the new
//! stream (which needs nothing of the old stream); that is a change of `exec.cu` and of the
//! backend trait, left for later.

use std::sync::Arc;

use super::encode::{self, Encoded};
use super::sequence::Engine;
use super::state::{fits_arena, ArenaImage};
use super::ExecState;
use crate::backend::{DeviceBackend, DevicePtr, ExecKernel};
use crate::error::Result;
use crate::exec::{Links, NetReceives};
use crate::profile::{self, Stage};
use crate::work::Work;

/// One launch of the interpreter, ready to repeat for calls of one shape.
pub(crate) struct CachedLaunch {
    /// The program image (its bytes are kept to upload it again after the arena is emptied).
    enc: Encoded,
    /// Where it was put in the arena last (None: not yet).
    image: Option<ArenaImage>,
    kernel: ExecKernel,
    /// The connections the image names (kept alive with it).
    links: Links,
    /// The network receives each launch consumes (told to the proxy at launch).
    receives: NetReceives,
}

impl CachedLaunch {
    /// Prepares the launch of `run`'s work on `device` (its connections in `links`): encodes
    /// it, looks its kernel up, makes its connections' slots reachable. `None` when the work
    /// is not one launch with nothing else to do (no copies, one kernel, an image that fits
    /// the arena): it then goes the uncached way every time.
    pub(crate) fn new(backend: &Arc<dyn DeviceBackend>, device: usize, run: &Work, links: &Links) -> Result<Option<CachedLaunch>> {
        if !run.copies.is_empty() || run.items.is_empty() {
            return Ok(None);
        }
        let segments = encode::segments(run);
        let [seg] = segments.as_slice() else { return Ok(None) };
        let Some(enc) = encode::encode(run, links, seg.ctxs.clone())? else { return Ok(None) };
        if !fits_arena(enc.bytes.len()) {
            return Ok(None);
        }
        let kernel = backend.kernels_or_err("cached launch")?.exec_kernel(device, seg.op, seg.dtype, enc.entry)?;
        backend.kernels_or_err("cached launch")?.reach_exec_memory(device, &enc.slots)?;
        Ok(Some(CachedLaunch { enc, image: None, kernel, links: links.clone(), receives: NetReceives::of(run, links) }))
    }

    /// The connections the image names.
    pub(crate) fn links(&self) -> &Links {
        &self.links
    }

    /// The program image's bytes.
    #[cfg(test)]
    pub(crate) fn image_bytes(&self) -> &[u8] {
        &self.enc.bytes
    }

    /// Launches `run` (this launch's work, its contexts pointed at this call's buffers) on its
    /// stream; returns once it is enqueued.
    pub(crate) fn launch(&mut self, backend: &Arc<dyn DeviceBackend>, device: usize, state: &mut ExecState, run: &Work) -> Result<()> {
        state.launch(backend, device, Engine::Kernel(run.stream), |state, at| {
            let (stream, capturing) = (at.stream, at.capturing);
            // Clock reads only when RUSTCCL_PROFILE_ENQUEUE=1.
            let t = profile::start();
            let base = if capturing {
                // A graph may replay it at any time: an image of its own, kept with the
                // communicator (allocated with the capture mode relaxed, as uncached launches).
                let mut base = DevicePtr::NULL;
                backend.with_relaxed_capture(&mut || {
                    base = state.image(backend, device, &self.enc.bytes, true, stream)?;
                    Ok(())
                })?;
                base
            } else {
                match self.image.and_then(|at| state.arena_at(at)) {
                    Some(base) => base,
                    None => {
                        let (base, at) = state.arena_image(backend, device, &self.enc.bytes, stream)?;
                        self.image = Some(at);
                        base
                    }
                }
            };
            profile::stage(Stage::Image, t);
            super::announce_receives(backend, state, &self.receives, capturing, stream)?;
            let t = profile::start();
            for c in &run.ctxs {
                for (ptr, bytes) in [(c.src, c.src_len), (c.dst, c.dst_len)] {
                    if bytes > 0 && ptr != 0 {
                        backend.kernels_or_err("cached launch")?.check_exec_buffer(device, DevicePtr(ptr as u64), bytes)?;
                    }
                }
            }
            let args = self.enc.args(base, at.control, &encode::calls(run));
            backend.kernels_or_err("cached launch")?.launch_exec_kernel(&self.kernel, &args, self.enc.blocks, stream)?;
            profile::stage(Stage::Kernel, t);
            Ok(())
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::fake::{links_for, links_of_kind, FakeDevice, RingSum};
    use super::*;
    use crate::backend::Stream;
    use crate::reduce::DevOp;

    const COUNT: usize = 1000;

    /// A sum of `count` floats from `src` into `dst`.
    fn task(count: usize, src: u64, dst: u64) -> RingSum {
        RingSum::new(count, src, dst)
    }

    pub(crate) fn backend() -> (Arc<FakeDevice>, Arc<dyn DeviceBackend>) {
        let fake = Arc::new(FakeDevice::default());
        let dynb: Arc<dyn DeviceBackend> = fake.clone();
        (fake, dynb)
    }

    /// A sum of COUNT floats planned on buffers at 0xa000_0000 / 0xa100_0000, its launch made
    /// on a fresh fake device with fresh executor state.
    struct Made {
        fake: Arc<FakeDevice>,
        backend: Arc<dyn DeviceBackend>,
        state: ExecState,
        work: Work,
        links: Links,
        cached: CachedLaunch,
    }

    fn made() -> Made {
        let work = task(COUNT, 0xa000_0000, 0xa100_0000).work();
        let links = links_for(&work);
        let (fake, backend) = backend();
        let cached = CachedLaunch::new(&backend, 0, &work, &links).unwrap().expect("one launch");
        Made { fake, backend, state: ExecState::default(), work, links, cached }
    }

    /// Kernel parameters with the call values left out.
    fn without_calls(mut a: rustccl_kernels::exec::ExecArgs) -> rustccl_kernels::exec::ExecArgs {
        a.calls = Default::default();
        a
    }

    #[test]
    fn a_cached_launch_uploads_and_launches_what_the_uncached_path_does() {
        let a = task(COUNT, 0xa000_0000, 0xa100_0000);
        let b = task(COUNT, 0xb000_0000, 0xb100_0000);
        let work_a = a.work();
        let links = links_for(&work_a);
        // The uncached path, fresh state, buffers of a.
        let (fake1, b1) = backend();
        super::super::launch(&b1, 0, &mut ExecState::default(), &work_a, &links).unwrap();
        // The cached path: made from a plan on b's buffers, called with a's.
        let (fake2, b2) = backend();
        let mut cached = CachedLaunch::new(&b2, 0, &b.work(), &links).unwrap().expect("one launch");
        cached.launch(&b2, 0, &mut ExecState::default(), &a.point(b.work())).unwrap();
        let (l1, l2) = (fake1.log(), fake2.log());
        assert_eq!(l1.uploads.len(), 1);
        assert_eq!(l1.uploads, l2.uploads, "the same image, at the same place");
        assert_eq!(l1.launches.len(), 1);
        assert_eq!(l1.launches, l2.launches, "the same kernel and parameter");
        assert_eq!(l1.checked, l2.checked, "the same buffers checked");
        let args = l2.launches[0].args;
        assert_eq!((args.ncalls, args.calls[0].src, args.calls[0].dst), (1, 0xa000_0000, 0xa100_0000));
        // The image holds no buffer: a's and b's are the same bytes.
        let enc = |w: &Work| encode::encode(w, &links, 0..1).unwrap().unwrap().bytes;
        assert_eq!(enc(&work_a), enc(&b.work()));
        assert_eq!(cached.image_bytes(), &enc(&work_a)[..]);
        assert_eq!(l2.uploads[0].1, enc(&work_a));
    }

    #[test]
    fn a_second_call_with_other_buffers_uploads_nothing() {
        let b = task(COUNT, 0xb000_0000, 0xb100_0000);
        let Made { fake, backend, mut state, work, links, mut cached } = made();
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        let work = b.point(work);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert_eq!(state.uploads(), 1);
        assert_eq!(state.lookups(), 1, "the second call does not look its image up by content");
        let log = fake.log();
        assert_eq!(log.uploads.len(), 1, "one upload for both calls");
        assert_eq!((log.kernel_lookups, log.reach_calls), (1, 1), "kernel and peers once");
        assert_eq!(log.events_recorded, 2, "an event after each launch");
        let bytes = COUNT * 4;
        assert_eq!(
            log.checked,
            [(0xa000_0000, bytes), (0xa100_0000, bytes), (0xb000_0000, bytes), (0xb100_0000, bytes)]
                .map(|(p, n)| (DevicePtr(p), n))
        );
        let (first, second) = (log.launches[0].args, log.launches[1].args);
        assert_eq!((second.calls[0].src, second.calls[0].dst), (0xb000_0000, 0xb100_0000));
        assert_eq!(without_calls(first), without_calls(second), "only the call values differ");
        drop(log);
        // The uncached path on the same shape finds the image too (it holds no buffer).
        let c = task(COUNT, 0xc000_0000, 0xc100_0000);
        super::super::launch(&backend, 0, &mut state, &c.work(), &links).unwrap();
        assert_eq!(state.uploads(), 1);
        assert_eq!(fake.log().launches[2].args.items, first.items);
    }

    #[test]
    fn an_emptied_arena_invalidates_the_cached_image() {
        let Made { fake, backend, mut state, work, mut cached, .. } = made();
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        // Other images fill the arena (8 MiB) until it starts again.
        for i in 1..=3u8 {
            state.image(&backend, 0, &vec![i; 3 << 20], false, Stream(7)).unwrap();
        }
        assert_eq!(state.uploads(), 4);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert_eq!(state.uploads(), 5, "uploaded again");
        {
            let log = fake.log();
            let (at, bytes) = log.uploads.last().unwrap();
            assert_eq!(&bytes[..], cached.image_bytes());
            assert_eq!(log.launches.last().unwrap().args.items, at.0, "the launch reads the new copy");
            assert_ne!(log.launches[0].args.items, at.0, "not the old place, which the filler took");
        }
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert_eq!(state.uploads(), 5, "found again");
        // Suspend frees the arena: the next launch uploads again.
        state.suspend(&backend);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert_eq!(state.uploads(), 6);
    }

    #[test]
    fn premulsum_scalars_are_call_values_and_the_count_is_shape() {
        let host = |scalar: f64| RingSum { op: DevOp::PreMulSum { scalar }, ..task(COUNT, 0xa000_0000, 0xa100_0000) };
        let half = host(0.5).work();
        let links = links_for(&half);
        let enc = |w: &Work| encode::encode(w, &links, 0..1).unwrap().unwrap().bytes;
        assert_eq!(enc(&half), enc(&host(2.0).work()), "the scalar is not in the image");
        // A scalar given by address: the planner's reducer holds 1.0, the address travels.
        let device = RingSum { scalar_at: 0xd000_0000, ..host(1.0) };
        assert_eq!(enc(&half), enc(&device.work()));
        let other_count = RingSum { count: 2 * COUNT, ..host(0.5) };
        assert_ne!(enc(&half), enc(&other_count.work()), "the count is");
        // Made with 0.5, called with 2.0 and with a device scalar: the uncached parameters.
        for call in [host(2.0), device] {
            let (fake1, b1) = backend();
            super::super::launch(&b1, 0, &mut ExecState::default(), &call.work(), &links).unwrap();
            let (fake2, b2) = backend();
            let mut cached = CachedLaunch::new(&b2, 0, &half, &links).unwrap().unwrap();
            cached.launch(&b2, 0, &mut ExecState::default(), &call.point(host(0.5).work())).unwrap();
            let (l1, l2) = (fake1.log(), fake2.log());
            assert_eq!(l1.launches, l2.launches);
            let c = l2.launches[0].args.calls[0];
            match call.scalar_at {
                0 => assert_eq!((c.scalar, c.scalar_ptr), (2.0f32.to_bits() as u64, 0)),
                _ => assert_eq!(c.scalar_ptr, 0xd000_0000),
            }
        }
    }

    #[test]
    fn a_captured_call_gets_an_image_of_its_own_and_no_event() {
        let Made { fake, backend, mut state, work, mut cached, .. } = made();
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        fake.capturing.store(true, std::sync::atomic::Ordering::Relaxed);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        let log = fake.log();
        assert_eq!(log.uploads.len(), 3, "each captured launch uploads its own image");
        assert_eq!(log.relaxed, 2, "allocated with the capture mode relaxed");
        assert_eq!(log.events_recorded, 1, "no event for captured launches");
        for i in 1..3 {
            assert_eq!(log.launches[i].args.items, log.uploads[i].0 .0);
            assert_eq!(log.uploads[i].1, log.uploads[0].1);
        }
        assert_ne!(log.uploads[1].0, log.uploads[2].0);
        let image = log.uploads[0].1.len();
        assert!(state.held_bytes().1 >= 2 * 2 * image, "both captured images are kept (host and device copies)");
        assert!(log.host_callbacks.is_empty(), "no network connection: nothing to tell a proxy");
    }

    #[test]
    fn launches_announce_their_network_receives_and_captured_ones_do_so_at_each_replay() {
        use crate::transport::{Dir, Kind};
        let work = task(COUNT, 0xa000_0000, 0xa100_0000).work();
        let links = links_of_kind(&work, Kind::Net);
        let (fake, backend) = backend();
        let mut state = ExecState::default();
        let mut cached = CachedLaunch::new(&backend, 0, &work, &links).unwrap().expect("one launch");
        // What one launch consumes from each receiving connection: a slot per step that
        // receives on it (the kernel's positions move by one per step).
        let recvs: Vec<_> = links.values().filter(|c| c.dir == Dir::Recv).cloned().collect();
        assert!(!recvs.is_empty());
        let per_launch = |c: &Arc<crate::transport::Connection>| -> u64 {
            work.items.iter().flat_map(|i| i.steps.iter()).filter(|(_, s)| s.recv.contains(&c.link)).count() as u64
        };
        let expected = |n: u64| recvs.iter().all(|c| c.expected() == n * per_launch(c));
        assert!(recvs.iter().all(|c| per_launch(c) > 0));
        assert!(expected(0));
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert!(expected(1), "a cached launch tells the proxy at once");
        super::super::launch(&backend, 0, &mut state, &work, &links).unwrap();
        assert!(expected(2), "an uncached launch too");
        fake.capturing.store(true, std::sync::atomic::Ordering::Relaxed);
        cached.launch(&backend, 0, &mut state, &work).unwrap();
        assert!(expected(2), "a captured launch tells nothing at capture");
        let (callback, launches_before) = {
            let log = fake.log();
            assert_eq!(log.host_callbacks.len(), 1);
            (Arc::clone(&log.host_callbacks[0].0), log.host_callbacks[0].1)
        };
        assert_eq!(launches_before, 2, "the host node comes before the captured kernel");
        for replay in 1..=3 {
            (callback.0)();
            assert!(expected(2 + replay), "each replay tells the proxy of its receives");
        }
        assert!(Arc::strong_count(&callback) >= 3, "the communicator's state keeps the callback");
        state.release(&backend);
        assert_eq!(Arc::strong_count(&callback), 2, "released with the communicator's state");
    }
}

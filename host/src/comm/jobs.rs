//! Background work of non-blocking communicators (`ncclConfig_t.blocking = 0`), as NCCL's
//! group job thread. An operation called on one outside a group, or the end of a group that
//! holds them, becomes a *job* (planning, connecting and running the group's operations; on
//! the host backend the whole execution) that runs on a thread of its own, while the call
//! returns `InProgress` at once.
//!
//! Order: a job starts only when the previous job of every communicator it involves has
//! finished, so the work of one communicator runs in call order however many calls are
//! queued; jobs of unrelated communicators run side by side (ranks of one process driven by
//! different threads need that to meet). Jobs are ordered by one process-wide lock when they
//! are queued, so two jobs never wait for each other.
//!
//! Each communicator keeps a [`CommJobs`]: how many of its jobs are queued or running (its
//! asynchronous error is `InProgress` while any is) and the first error one ended with (then
//! its asynchronous error, and the reason later calls are refused). Abort stops a running job
//! through the communicator's stop flag, which the executor checks while it waits; a queued
//! job that starts after an abort ends at once.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::comm::Communicator;
use crate::error::{Error, Result};

/// The end of one job: something to wait for, and work to do once it has finished (the C
/// API ends its buffer registrations there).
#[derive(Default)]
pub struct Completion {
    state: Mutex<CompletionState>,
    done_cv: Condvar,
}

type Callback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct CompletionState {
    done: bool,
    on_done: Vec<Callback>,
}

impl Completion {
    fn lock(&self) -> MutexGuard<'_, CompletionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the job has finished.
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    /// Runs `f` once the job has finished (at once, on this thread, if it has).
    pub fn on_done(&self, f: impl FnOnce() + Send + 'static) {
        let mut s = self.lock();
        if s.done {
            drop(s);
            f();
        } else {
            s.on_done.push(Box::new(f));
        }
    }

    /// Blocks until the job has finished.
    pub fn wait(&self) {
        let mut s = self.lock();
        while !s.done {
            s = self.done_cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn finish(&self) {
        let callbacks = {
            let mut s = self.lock();
            s.done = true;
            std::mem::take(&mut s.on_done)
        };
        self.done_cv.notify_all();
        for f in callbacks {
            f();
        }
    }
}

/// One communicator's background jobs.
#[derive(Default)]
pub struct CommJobs {
    state: Mutex<JobsState>,
    idle_cv: Condvar,
}

#[derive(Default)]
struct JobsState {
    /// Jobs queued or running that involve this communicator.
    pending: usize,
    /// The job queued last, which the next one waits for.
    last: Option<Arc<Completion>>,
    /// The first error a job of this communicator ended with.
    error: Option<Error>,
}

impl CommJobs {
    fn lock(&self) -> MutexGuard<'_, JobsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a job is queued or running.
    pub fn busy(&self) -> bool {
        self.lock().pending > 0
    }

    /// The first error a job ended with (it stays: the communicator's asynchronous error).
    pub fn error(&self) -> Option<Error> {
        self.lock().error.clone()
    }

    /// Waits until no job is queued or running, at most until `deadline`; whether it is idle.
    pub fn wait_idle(&self, deadline: Option<Instant>) -> bool {
        let mut s = self.lock();
        while s.pending > 0 {
            s = match deadline {
                None => self.idle_cv.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else { return false };
                    self.idle_cv.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
        true
    }

    fn job_ended(&self, result: &Result<()>) {
        let mut s = self.lock();
        if let Err(e) = result {
            s.error.get_or_insert_with(|| e.clone());
        }
        s.pending -= 1;
        drop(s);
        self.idle_cv.notify_all();
    }
}

/// Keeps the order in which jobs are queued one order for every communicator.
static QUEUE_ORDER: Mutex<()> = Mutex::new(());

thread_local! {
    /// The job this thread queued last, until someone takes it (see [`take_launched`]).
    static LAUNCHED: RefCell<Option<Arc<Completion>>> = const { RefCell::new(None) };
}

/// The job the calling thread queued last, if not taken yet: the C API hands it the buffers
/// the job's operations use, to release once it has finished.
pub fn take_launched() -> Option<Arc<Completion>> {
    LAUNCHED.with(|l| l.borrow_mut().take())
}

/// How long abort waits for a stopped job to notice.
const ABORT_WAIT: Duration = Duration::from_secs(5);

/// Queues `work` as a job of `comms` (distinct communicators) and returns at once; the
/// calling thread's [`take_launched`] gives its completion. A job's error is recorded as the
/// asynchronous error of every communicator it involves.
pub(crate) fn launch(comms: Vec<Communicator>, work: impl FnOnce() -> Result<()> + Send + 'static) -> Arc<Completion> {
    let done = Arc::new(Completion::default());
    let mut before = Vec::new();
    {
        let _order = QUEUE_ORDER.lock().unwrap_or_else(|p| p.into_inner());
        for c in &comms {
            let mut s = c.background_jobs().lock();
            s.pending += 1;
            before.extend(s.last.replace(Arc::clone(&done)));
        }
    }
    let job = {
        let done = Arc::clone(&done);
        move || {
            let _g = comms.first().map(|c| crate::log::rank_scope(c.rank_unchecked() as i32));
            for b in &before {
                b.wait();
            }
            drop(before);
            // A job queued before an abort or a failure that stopped the communicator ends
            // here instead of planning (and perhaps connecting) first.
            let result = comms
                .iter()
                .try_for_each(|c| c.check_running("queued operation").map_err(|e| c.record_error(e)))
                .and_then(|_| work());
            done.finish();
            for c in &comms {
                c.background_jobs().job_ended(&result);
            }
        }
    };
    // The thread gets the job through a channel, so that the job is still here to run on
    // this thread, to completion, when no thread can be started: slower, never wrong.
    let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
    let spawned = std::thread::Builder::new().name("rustccl-group-job".into()).spawn(move || {
        if let Ok(job) = rx.recv() {
            job();
        }
    });
    match spawned {
        Ok(_) => {
            let _ = tx.send(Box::new(job));
        }
        Err(e) => {
            tracing::warn!(target: "COLL", "no thread for a non-blocking group job ({e}); it runs on the calling thread");
            job();
        }
    }
    LAUNCHED.with(|l| *l.borrow_mut() = Some(Arc::clone(&done)));
    done
}

impl Communicator {
    /// Waits until this communicator's non-blocking init and every operation queued on it
    /// have finished, then returns what its asynchronous error says: `Ok` for `Success`.
    /// (A non-blocking communicator's operations return `InProgress`; this is the blocking
    /// way to wait for them. It waits as long as they take: to give up on stuck work, poll
    /// [`async_error`](Self::async_error) and [`abort`](Self::abort).)
    pub fn wait_idle(&self) -> Result<()> {
        self.wait_ready()?;
        self.background_jobs().wait_idle(None);
        match self.async_error_detail() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// After abort set the stop flag: waits (briefly) for running jobs to notice.
    pub(crate) fn stop_background_jobs(&self) {
        if !self.background_jobs().wait_idle(Some(Instant::now() + ABORT_WAIT)) {
            tracing::warn!(
                target: "INIT",
                "rank {}: a queued operation did not stop within {} s of abort",
                self.rank_unchecked(),
                ABORT_WAIT.as_secs()
            );
        }
    }
}

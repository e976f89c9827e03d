//! [`Team`]: the fork-join of a CPU stream's computes. A compute's thread and `threads - 1` helper
//! threads of its own run the parallel loops of every node of the compute ([`par_tasks`]); between
//! loops the helpers spin on one atomic word instead of going back to rayon (whose idle workers
//! yield and then sleep on a futex, so that a decode's ~400 short ops a token each paid a wake-up).
//! An op is handed over by one release store and joined by one counter; helpers take its tasks
//! from a shared counter, so results never depend on which thread ran a task.
//!
//! Outside a team's compute (kernels called directly, a second compute on a busy team, nested
//! loops inside a task) [`par_tasks`] runs on the current rayon pool as before. After a compute the
//! helpers keep spinning for [`IDLE_SPIN`] (the gap between a decode's tokens), then sleep until
//! the next one.
//!
//! Any thread may join an open op the way a team's helpers do ([`help`]): a meta device's driver
//! that has finished its CPU device's share of a stage runs tasks of the other devices' ops while
//! it waits for them, so that a stage cut unevenly between devices (whole GQA groups) still keeps
//! every core busy. A team with no helpers of its own still hands its ops over for that.

use ggml_core::Result;
use parking_lot::{Condvar, Mutex, RwLock};
use rayon::prelude::*;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long helpers spin after a compute before they sleep.
const IDLE_SPIN: Duration = Duration::from_millis(2);
/// Spins between `yield_now` calls of a helper with nothing to do (kind to other processes on a
/// busy machine, rare enough not to delay a hand-over on an idle one).
const SPINS_PER_YIELD: u32 = 1 << 16;

/// Bit of [`Shared::state`] set while the current op takes helpers.
const OPEN: u64 = 1 << 31;
/// Bits of [`Shared::state`] counting the helpers inside the current op.
const ACTIVE: u64 = OPEN - 1;

/// The op being handed over: `n` tasks of `f`.
#[derive(Clone, Copy)]
struct Op {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

/// What the compute's thread and the helpers share.
struct Shared {
    /// Op counter (high 32 bits), [`OPEN`], and the helpers inside the op ([`ACTIVE`]).
    state: AtomicU64,
    /// Written by the compute's thread only while no helper is inside an op (see [`Team::run`]).
    op: UnsafeCell<Op>,
    /// The next task of the current op.
    next: AtomicUsize,
    /// The tasks of the current op (`op.n`), readable without joining it: a thread outside the
    /// team looks whether any task is left before it joins ([`Shared::help`]).
    tasks: AtomicUsize,
    /// True while a compute runs.
    session: AtomicBool,
    shutdown: AtomicBool,
    /// Helpers asleep (guarded) and their wake-up.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

// SAFETY: `op` is written only while no helper reads it (the `state` protocol of `Team::run`), and
// the closure it points to is `Sync`.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

fn noop(_: usize) {}

impl Shared {
    /// Runs tasks of the op `op` until none is left; returns how many this thread ran.
    fn work(&self, op: Op) -> usize {
        let mut ran = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= op.n {
                return ran;
            }
            // SAFETY: the closure outlives the op (`Team::run` waits for every helper inside it).
            unsafe { (*op.f)(i) };
            ran += 1;
        }
    }

    /// Joins the op of state `s` (an open one) and runs its tasks until none is left; the tasks
    /// this thread ran, `None` when the op was no longer open (or another thread joined or left
    /// it just then).
    fn join(&self, s: u64) -> Option<usize> {
        self.state
            .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        /// Leaves the op even if a task panics, so that the compute's thread does not wait forever.
        struct Leave<'a>(&'a AtomicU64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        let _leave = Leave(&self.state);
        // SAFETY: the op was published before the state store this join acquired, and is not
        // rewritten until this thread leaves.
        let op = unsafe { *self.op.get() };
        Some(self.work(op))
    }

    /// Joins the current op if it is open and not yet joined (`last`: the op counter of the last
    /// one joined); true when it did.
    fn try_join(&self, last: &mut u64) -> bool {
        let s = self.state.load(Ordering::Acquire);
        if s & OPEN == 0 || s >> 32 == *last || self.join(s).is_none() {
            return false;
        }
        *last = s >> 32;
        true
    }

    /// Joins the current op from outside the team if it is open with tasks left; true when this
    /// thread ran any of them.
    fn help(&self) -> bool {
        let s = self.state.load(Ordering::Acquire);
        s & OPEN != 0
            && self.next.load(Ordering::Relaxed) < self.tasks.load(Ordering::Relaxed)
            && self.join(s).is_some_and(|ran| ran > 0)
    }

    /// A helper's life: join ops while computes run, spin a while after each, sleep in between.
    fn helper(&self) {
        let mut last = self.state.load(Ordering::Relaxed) >> 32;
        let mut idle_since: Option<Instant> = None;
        let mut spins = 0u32;
        while !self.shutdown.load(Ordering::Relaxed) {
            if self.try_join(&mut last) {
                spins = 0;
                continue;
            }
            if self.session.load(Ordering::Relaxed) {
                idle_since = None;
            } else if idle_since.get_or_insert_with(Instant::now).elapsed() > IDLE_SPIN {
                self.sleep();
                idle_since = None;
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Sleeps until a compute starts or the team shuts down.
    fn sleep(&self) {
        let mut sleepers = self.sleepers.lock();
        *sleepers += 1;
        while !self.session.load(Ordering::SeqCst) && !self.shutdown.load(Ordering::SeqCst) {
            self.wake.wait(&mut sleepers);
        }
        *sleepers -= 1;
    }

    /// Wakes the sleeping helpers.
    fn wake_all(&self) {
        let sleepers = self.sleepers.lock();
        if *sleepers > 0 {
            self.wake.notify_all();
        }
    }
}

/// Every team alive in this process (each CPU stream's), for [`help`].
static TEAMS: RwLock<Vec<Arc<Shared>>> = parking_lot::const_rwlock(Vec::new());

/// Runs tasks of the open ops of any team's compute (the CPU streams of this host) on the calling
/// thread, which must be outside every task; true when it ran any. Tasks are indexed and every
/// task count is fixed by the op's own team, so results do not change with who helps.
pub fn help() -> bool {
    TEAMS.read().iter().fold(false, |ran, s| s.help() | ran)
}

/// The helper threads of one CPU stream (started on its first compute).
pub struct Team {
    name: String,
    helpers: usize,
    shared: Arc<Shared>,
    threads: OnceLock<Vec<JoinHandle<()>>>,
    /// Held by the compute that uses the team.
    busy: Mutex<()>,
}

thread_local! {
    /// The team whose compute runs on this thread (null elsewhere, and inside a task).
    static CURRENT: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

impl Team {
    /// A team for computes of `threads` threads: the compute's own and `threads - 1` helpers named
    /// after the stream `name`.
    pub fn new(name: &str, threads: usize) -> Team {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            op: UnsafeCell::new(Op {
                f: &noop as &(dyn Fn(usize) + Sync),
                n: 0,
            }),
            next: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            session: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        });
        TEAMS.write().push(shared.clone());
        Team {
            name: name.to_string(),
            helpers: threads.saturating_sub(1),
            shared,
            threads: OnceLock::new(),
            busy: Mutex::new(()),
        }
    }

    /// Helper threads besides the compute's own.
    pub fn helpers(&self) -> usize {
        self.helpers
    }

    /// Runs `f` (a compute) with this team's helpers (and any thread that [`help`]s) running its
    /// [`par_tasks`] loops; on the current rayon pool instead when the team is busy with another
    /// compute or its threads cannot start.
    pub fn compute<R>(&self, f: impl FnOnce() -> R) -> R {
        if !CURRENT.with(|c| c.get()).is_null() {
            return f();
        }
        let Some(_busy) = self.busy.try_lock() else {
            return f();
        };
        if self.start_threads().is_none() {
            return f();
        }
        /// Ends the session (and leaves the thread-local) however `f` returns.
        struct Session<'a>(&'a Shared);
        impl Drop for Session<'_> {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(std::ptr::null()));
                self.0.session.store(false, Ordering::Relaxed);
            }
        }
        self.shared.session.store(true, Ordering::SeqCst);
        self.shared.wake_all();
        let _session = Session(&self.shared);
        CURRENT.with(|c| c.set(self));
        f()
    }

    /// The helper threads, started once; `None` when they could not be.
    fn start_threads(&self) -> Option<&Vec<JoinHandle<()>>> {
        let threads = self.threads.get_or_init(|| {
            (1..=self.helpers)
                .map_while(|i| {
                    let shared = self.shared.clone();
                    std::thread::Builder::new()
                        .name(format!("{}-team-{i}", self.name))
                        .spawn(move || shared.helper())
                        .ok()
                })
                .collect()
        });
        (threads.len() == self.helpers).then_some(threads)
    }

    /// Runs tasks `0..n` of `f` on this thread and the helpers; returns when all are done.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        // SAFETY: only the lifetime is erased; the pointer is dereferenced only until every
        // helper inside this op has left it, which `Close` waits for before `run` returns.
        let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        let op = Op { f, n };
        // SAFETY: no helper is inside an op (the previous `run` waited), and none can join before
        // the release store below publishes the op.
        unsafe { *s.op.get() = op };
        s.next.store(0, Ordering::Relaxed);
        s.tasks.store(n, Ordering::Relaxed);
        let count = ((s.state.load(Ordering::Relaxed) >> 32) + 1) & u64::from(u32::MAX);
        s.state.store(count << 32 | OPEN, Ordering::Release);
        /// Closes the op and waits for the helpers inside it, however the tasks end.
        struct Close<'a>(&'a AtomicU64);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                self.0.fetch_and(!OPEN, Ordering::AcqRel);
                while self.0.load(Ordering::Acquire) & ACTIVE != 0 {
                    std::hint::spin_loop();
                }
            }
        }
        let _close = Close(&s.state);
        s.work(op);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _sleepers = self.shared.sleepers.lock();
            self.shared.wake.notify_all();
        }
        for t in self.threads.take().into_iter().flatten() {
            let _ = t.join();
        }
        TEAMS.write().retain(|s| !Arc::ptr_eq(s, &self.shared));
    }
}

/// The threads that [`par_tasks`] spreads tasks over here: the current team's, else the rayon pool's.
pub fn threads() -> usize {
    let team = CURRENT.with(|c| c.get());
    if team.is_null() {
        rayon::current_num_threads()
    } else {
        // SAFETY: CURRENT points to the team of the compute running on this thread.
        unsafe { (*team).helpers + 1 }
    }
}

/// Runs `f(0) .. f(n - 1)` in parallel, each task once: on the team of the compute that runs on
/// this thread, else on the current rayon pool. Returns the first error of any task (the others
/// still run).
pub fn par_tasks<F>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Result<()> + Sync + Send,
{
    let team = CURRENT.with(|c| c.get());
    if n <= 1 || team.is_null() {
        return match n {
            0 => Ok(()),
            1 => f(0),
            _ => (0..n).into_par_iter().try_for_each(f),
        };
    }
    let first_err = Mutex::new(None);
    let task = |i: usize| {
        if let Err(e) = f(i) {
            first_err.lock().get_or_insert(e);
        }
    };
    /// Puts the team back on this thread after the op (loops nested in a task use rayon).
    struct Restore(*const Team);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    CURRENT.with(|c| c.set(std::ptr::null()));
    let _restore = Restore(team);
    // SAFETY: CURRENT points to the team of the compute running on this thread (`Team::compute`
    // clears it before the team can go).
    unsafe { (*team).run(n, &task) };
    first_err.into_inner().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Every task runs exactly once, inside and outside a team's compute, nested loops included,
    /// and the first error comes back.
    #[test]
    fn team_runs_every_task_once() {
        let team = Team::new("test", 3);
        for in_team in [false, true] {
            let run = || {
                for n in [0usize, 1, 2, 7, 1000] {
                    let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                    par_tasks(n, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        par_tasks(3, |_| Ok(()))
                    })
                    .unwrap();
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
                let err = par_tasks(64, |i| {
                    if i == 40 {
                        Err(ggml_core::Error::Backend {
                            backend: "cpu".into(),
                            msg: "task 40".into(),
                        })
                    } else {
                        Ok(())
                    }
                });
                assert!(
                    matches!(err, Err(ggml_core::Error::Backend { msg, .. }) if msg == "task 40")
                );
            };
            if in_team {
                team.compute(run);
            } else {
                run();
            }
        }
    }

    /// A thread outside a team (a meta driver waiting at a stage's end) runs tasks of the team's
    /// open op through [`help`], even of a team with no helpers of its own, and every task still
    /// runs once with the result its index gives. The team's thread does not finish its first
    /// task before the outside thread has run one, so the test needs no timing.
    #[test]
    fn a_thread_outside_the_team_helps_with_its_op() {
        let team = Team::new("helped", 1);
        let n = 64;
        let out: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        let runs: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        let helped = AtomicU32::new(0);
        let owner = std::thread::current().id();
        std::thread::scope(|s| {
            s.spawn(|| {
                while helped.load(Ordering::Acquire) == 0 {
                    help();
                }
            });
            team.compute(|| {
                par_tasks(n, |i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                    out[i].store(
                        (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        Ordering::Relaxed,
                    );
                    if std::thread::current().id() == owner {
                        while helped.load(Ordering::Acquire) == 0 {
                            std::hint::spin_loop();
                        }
                    } else {
                        helped.fetch_add(1, Ordering::Release);
                    }
                    Ok(())
                })
                .unwrap()
            });
        });
        assert!(
            helped.load(Ordering::Relaxed) >= 1,
            "the outside thread ran no task"
        );
        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        for (i, o) in out.iter().enumerate() {
            assert_eq!(
                o.load(Ordering::Relaxed),
                (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            );
        }
    }
}

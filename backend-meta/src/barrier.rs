//! [`RankBarrier`]: the meeting point of the threads that drive a meta device's devices (one per
//! device) between stages. A join costs a few of these, so a waiter spins first (on an idle host the
//! stages of a decode step end within microseconds of each other) and parks only when that fails.
//! After a few microseconds the spinner also yields its core at each look at the clock, so that on a
//! host busy with other work the thread it waits for (often ready but not running) can have it. The
//! spin time adapts to how long waits take: it doubles after a wait that ended within the longest spin
//! time (spinning longer would have avoided parking) and halves after a longer one, so that where
//! waits are long the drivers park almost at once. The barrier can be broken: a driver that fails or
//! panics releases every waiter, now and later, with an error.

use ggml_core::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// Longest spin before parking, in nanoseconds.
const SPIN_MAX_NS: u64 = 50_000;
/// Shortest spin before parking, in nanoseconds.
const SPIN_MIN_NS: u64 = 1_000;
/// After this long spinning, the spinner also yields its core between looks at the clock.
const YIELD_AFTER_NS: u128 = 5_000;
/// Spins between two looks at the clock.
const SPINS_PER_CHECK: u32 = 32;

/// A reusable barrier for a fixed number of threads, spinning then parking, that can be broken.
pub(crate) struct RankBarrier {
    ranks: usize,
    arrived: AtomicUsize,
    /// Bumped each time every rank has arrived.
    generation: AtomicUsize,
    broken: AtomicBool,
    /// Current spin time in nanoseconds.
    spin_ns: AtomicU64,
    /// Threads parked (or about to park) under `lock`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The spin time after a wait of `waited_ns` with a spin time of `spin_ns`.
fn adapt(spin_ns: u64, waited_ns: u64) -> u64 {
    if waited_ns <= SPIN_MAX_NS {
        (spin_ns * 2).min(SPIN_MAX_NS)
    } else {
        (spin_ns / 2).max(SPIN_MIN_NS)
    }
}

fn broken_error() -> Error {
    Error::Other("meta: another device's driver failed".into())
}

impl RankBarrier {
    pub fn new(ranks: usize) -> RankBarrier {
        RankBarrier {
            ranks,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            spin_ns: AtomicU64::new(SPIN_MAX_NS),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Makes a barrier that was broken (or left mid-round by failed ranks) whole again. Only while no
    /// thread uses it.
    pub fn reset(&mut self) {
        *self.arrived.get_mut() = 0;
        *self.broken.get_mut() = false;
    }

    /// Waits until every rank has arrived; an error once the barrier is broken.
    pub fn wait(&self) -> Result<()> {
        self.wait_then(|| Ok(()))
    }

    /// Waits until every rank has arrived; the last to arrive runs `last` before it releases the
    /// others, so they see its effects. A join done this way costs one meeting instead of two (one
    /// to know that every rank is done, one to know that the join is), and the rank that is there
    /// anyway does it. When `last` fails, the barrier breaks and that rank returns the failure.
    pub fn wait_then(&self, last: impl FnOnce() -> Result<()>) -> Result<()> {
        let generation = self.generation.load(Ordering::Acquire);
        if self.broken.load(Ordering::Acquire) {
            return Err(broken_error());
        }
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.ranks {
            // Last to arrive: reset the count for the next round before anyone can leave this one.
            self.arrived.store(0, Ordering::Relaxed);
            if let Err(e) = last() {
                self.break_all();
                return Err(e);
            }
            self.advance();
            return Ok(());
        }
        self.wait_while(generation)
    }

    /// The number of completed rounds (and [`RankBarrier::advance`] calls) so far.
    pub fn generation(&self) -> usize {
        self.generation.load(Ordering::Acquire)
    }

    /// Completes a round without waiting for ranks: releases every thread in
    /// [`RankBarrier::wait_while`] the current generation (used as an event counter by drivers that
    /// share out work themselves).
    pub fn advance(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.wake_sleepers();
    }

    /// Waits (spinning, then parked) while the generation is `generation`; an error once the
    /// barrier is broken.
    pub fn wait_while(&self, generation: usize) -> Result<()> {
        self.wait_while_helping(generation, &|| false)
    }

    /// [`RankBarrier::wait_while`], running `help` meanwhile (a piece of the work waited for,
    /// true when it found any): the waiter spins as long as it keeps finding work, each piece
    /// restarting the longest spin time, and parks only after a spin without any.
    pub fn wait_while_helping(&self, generation: usize, help: &dyn Fn() -> bool) -> Result<()> {
        let released = || {
            self.generation.load(Ordering::Acquire) != generation
                || self.broken.load(Ordering::Acquire)
        };
        if !released() {
            let mut start = Instant::now();
            let spin = self.spin_ns.load(Ordering::Relaxed);
            if !self.spin(spin, &mut start, &released, help) {
                self.park(generation);
            }
            // The wait since the last piece of help is what spinning longer would have saved.
            let waited = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            self.spin_ns.store(adapt(spin, waited), Ordering::Relaxed);
        }
        if self.generation.load(Ordering::Acquire) != generation {
            Ok(())
        } else {
            Err(broken_error())
        }
    }

    /// Spins until `released` or `spin_ns` after `start`, running `help` at each spin; a turn of
    /// spins where it helped moves `start` to its end and gives the spin [`SPIN_MAX_NS`] from
    /// there, so only a turn without help can end the spin. True when released.
    fn spin(
        &self,
        spin_ns: u64,
        start: &mut Instant,
        released: &dyn Fn() -> bool,
        help: &dyn Fn() -> bool,
    ) -> bool {
        let mut budget = spin_ns as u128;
        loop {
            let mut helped = false;
            for _ in 0..SPINS_PER_CHECK {
                if released() {
                    return true;
                }
                if help() {
                    helped = true;
                } else {
                    std::hint::spin_loop();
                }
            }
            if helped {
                *start = Instant::now();
                budget = SPIN_MAX_NS as u128;
                continue;
            }
            let elapsed = start.elapsed().as_nanos();
            if elapsed >= budget {
                return false;
            }
            if elapsed >= YIELD_AFTER_NS {
                std::thread::yield_now();
            }
        }
    }

    fn park(&self, generation: usize) {
        let mut guard = self.lock.lock();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        while self.generation.load(Ordering::SeqCst) == generation
            && !self.broken.load(Ordering::SeqCst)
        {
            self.wake.wait(&mut guard);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Releases every waiter with an error, and every later [`RankBarrier::wait`].
    pub fn break_all(&self) {
        self.broken.store(true, Ordering::SeqCst);
        self.wake_sleepers();
    }

    fn wake_sleepers(&self) {
        // A sleeper registers under the lock before it checks the generation, and the generation (or
        // `broken`) changed before this load: either it sees the change or it is counted here.
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock();
            self.wake.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn no_rank_leaves_a_round_before_all_arrived() {
        for ranks in [1usize, 2, 3, 5] {
            let barrier = RankBarrier::new(ranks);
            let counters: Vec<AtomicU64> = (0..ranks).map(|_| AtomicU64::new(0)).collect();
            let rounds = 2000u64;
            std::thread::scope(|s| {
                for r in 0..ranks {
                    let (barrier, counters) = (&barrier, &counters);
                    s.spawn(move || {
                        for round in 0..rounds {
                            counters[r].store(round + 1, Ordering::SeqCst);
                            barrier.wait().unwrap();
                            // Everyone finished this round's store before anyone passed the barrier.
                            for c in counters {
                                let seen = c.load(Ordering::SeqCst);
                                assert!(seen == round + 1 || seen == round + 2, "{seen} {round}");
                            }
                            // Some rounds sleep past the spin time so that waiters park.
                            if round % 500 == r as u64 {
                                std::thread::sleep(Duration::from_nanos(SPIN_MAX_NS * 4));
                            }
                        }
                    });
                }
            });
        }
    }

    #[test]
    fn the_last_rank_runs_the_join_before_anyone_leaves() {
        for ranks in [1usize, 2, 3] {
            let barrier = RankBarrier::new(ranks);
            let rounds = 1000u64;
            // Written only by the rank that arrives last, read by every rank after the barrier.
            let joined = AtomicU64::new(0);
            let runners = AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..ranks {
                    let (barrier, joined, runners) = (&barrier, &joined, &runners);
                    s.spawn(move || {
                        for round in 0..rounds {
                            barrier
                                .wait_then(|| {
                                    runners.fetch_add(1, Ordering::Relaxed);
                                    joined.store(round + 1, Ordering::Relaxed);
                                    Ok(())
                                })
                                .unwrap();
                            let seen = joined.load(Ordering::Relaxed);
                            assert!(seen == round + 1 || seen == round + 2, "{seen} {round}");
                        }
                    });
                }
            });
            assert_eq!(
                runners.load(Ordering::Relaxed),
                rounds,
                "one runner per round"
            );
        }
    }

    #[test]
    fn a_failed_join_breaks_the_barrier_for_every_rank() {
        let barrier = RankBarrier::new(2);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let waiters: Vec<_> = (0..2)
                .map(|_| s.spawn(|| barrier.wait_then(|| Err(Error::Other("join failed".into())))))
                .collect();
            waiters.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let failed: Vec<String> = results
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            failed.iter().any(|e| e.contains("join failed")),
            "{failed:?}"
        );
        assert!(
            failed.iter().any(|e| e.contains("another device")),
            "{failed:?}"
        );
        assert!(barrier.wait().is_err(), "broken until reset");
    }

    #[test]
    fn spin_time_halves_after_long_waits_and_doubles_after_short_ones() {
        let long = SPIN_MAX_NS * 10;
        let mut spin = SPIN_MAX_NS;
        let mut waits = 0;
        while spin > SPIN_MIN_NS {
            spin = adapt(spin, long);
            waits += 1;
        }
        assert!(
            waits <= 6,
            "a busy host stops spinning after a few long waits"
        );
        assert_eq!(adapt(SPIN_MIN_NS, long), SPIN_MIN_NS);
        // A wait that parked but would have ended while spinning longer grows the spin time.
        assert_eq!(adapt(SPIN_MIN_NS, SPIN_MAX_NS / 2), SPIN_MIN_NS * 2);
        let back = (0..8).fold(spin, |s, _| adapt(s, SPIN_MIN_NS / 2));
        assert_eq!(back, SPIN_MAX_NS);
        assert_eq!(adapt(SPIN_MAX_NS, 0), SPIN_MAX_NS);
    }

    /// A waiter runs `help` while it waits, and does not park while `help` finds work: here the
    /// help itself completes the round (a parked waiter would never be released).
    #[test]
    fn a_helping_waiter_helps_until_released() {
        let barrier = RankBarrier::new(2);
        let calls = AtomicUsize::new(0);
        let generation = barrier.generation();
        let help = || {
            if calls.fetch_add(1, Ordering::Relaxed) + 1 == 1000 {
                barrier.advance();
            }
            true
        };
        barrier.wait_while_helping(generation, &help).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 1000);
        assert_eq!(barrier.generation(), generation + 1);
    }

    #[test]
    fn breaking_releases_parked_and_later_waiters_until_reset() {
        let mut barrier = RankBarrier::new(3);
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| barrier.wait())).collect();
            std::thread::sleep(Duration::from_nanos(SPIN_MAX_NS * 20));
            barrier.break_all();
            for w in waiters {
                assert!(w.join().unwrap().is_err());
            }
        });
        assert!(barrier.wait().is_err());
        barrier.reset();
        std::thread::scope(|s| {
            let waiters: Vec<_> = (0..2).map(|_| s.spawn(|| barrier.wait())).collect();
            barrier.wait().unwrap();
            for w in waiters {
                w.join().unwrap().unwrap();
            }
        });
    }
}

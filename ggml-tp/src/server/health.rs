//! The inference worker's liveness as `/health` reports it: dead (its thread ended, by a panic or
//! otherwise) or stuck (work pending and no progress for longer than a bound).
//!
//! The HTTP side counts the commands it sends; the worker counts those it takes and beats after
//! each command and each step, saying whether it still has work. Work is pending when a command is
//! not taken yet or the worker said it is busy; an idle worker blocked on its channel is never
//! stuck. A panic the worker caught and survived (see [`super::engine`]) is counted as a recovery.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shared by the worker and the HTTP side.
#[derive(Debug)]
pub struct WorkerHealth {
    epoch: Instant,
    alive: AtomicBool,
    busy: AtomicBool,
    sent: AtomicU64,
    taken: AtomicU64,
    /// Milliseconds since `epoch` at the last beat.
    beat_ms: AtomicU64,
    /// Panics caught by the worker so far.
    recoveries: AtomicU64,
}

/// Marks the worker dead when dropped: held by the worker thread, so it also fires when the thread
/// unwinds from a panic.
pub struct AliveGuard(pub Arc<WorkerHealth>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

impl WorkerHealth {
    pub fn new() -> Arc<WorkerHealth> {
        Arc::new(WorkerHealth {
            epoch: Instant::now(),
            alive: AtomicBool::new(true),
            busy: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            beat_ms: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The HTTP side is about to send a command. Work arriving at an idle worker starts the clock
    /// of its wait (an idle worker's last beat may be long ago).
    pub fn sent(&self) {
        let before = self.sent.fetch_add(1, Ordering::AcqRel);
        if !self.busy.load(Ordering::Acquire) && before <= self.taken.load(Ordering::Acquire) {
            self.beat_ms.store(self.now_ms(), Ordering::Release);
        }
    }

    /// The worker took a command.
    pub fn taken(&self) {
        self.taken.fetch_add(1, Ordering::AcqRel);
        self.beat_ms.store(self.now_ms(), Ordering::Release);
    }

    /// The worker made progress; `busy`: it has requests in slots or queue.
    pub fn beat(&self, busy: bool) {
        self.beat_ms.store(self.now_ms(), Ordering::Release);
        self.busy.store(busy, Ordering::Release);
    }

    /// The worker caught a panic and goes on.
    pub fn recovered(&self) {
        self.recoveries.fetch_add(1, Ordering::AcqRel);
    }

    /// Panics the worker caught and survived.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    /// `Ok` when the worker is alive and not stuck for longer than `stuck_after`; else why not.
    pub fn check(&self, stuck_after: Duration) -> Result<(), String> {
        if !self.alive.load(Ordering::Acquire) {
            return Err("the inference worker has stopped".into());
        }
        let pending = self.busy.load(Ordering::Acquire)
            || self.sent.load(Ordering::Acquire) > self.taken.load(Ordering::Acquire);
        let idle_ms = self
            .now_ms()
            .saturating_sub(self.beat_ms.load(Ordering::Acquire));
        if pending && idle_ms > stuck_after.as_millis() as u64 {
            return Err(format!(
                "the inference worker made no progress on pending work for {:.1} s",
                idle_ms as f64 / 1000.0
            ));
        }
        Ok(())
    }
}

/// The message of a caught panic's payload (a `&str` or `String`, as `panic!` makes them).
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_without_progress_is_stuck() {
        let h = WorkerHealth::new();
        assert!(h.check(Duration::ZERO).is_ok());
        h.sent();
        std::thread::sleep(Duration::from_millis(5));
        assert!(h.check(Duration::ZERO).unwrap_err().contains("no progress"));
        h.taken();
        h.beat(false);
        assert!(h.check(Duration::ZERO).is_ok());
        assert_eq!(h.recoveries(), 0);
        h.recovered();
        assert_eq!(h.recoveries(), 1);
        assert!(h.check(Duration::ZERO).is_ok());
        drop(AliveGuard(h.clone()));
        assert!(h
            .check(Duration::from_secs(1))
            .unwrap_err()
            .contains("stopped"));
    }

    #[test]
    fn panic_payloads_give_their_message() {
        let text = std::panic::catch_unwind(|| panic!("fixed text")).unwrap_err();
        assert_eq!(panic_message(&*text), "fixed text");
        let n = 7;
        let formatted = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(&*formatted), "formatted 7");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(3u8)).unwrap_err();
        assert_eq!(panic_message(&*other), "a panic without a message");
    }
}

//! [`Claims`]: who computes which device's share of each stage when any driver may compute any
//! device's share (devices of one host, such as CPU devices, whose memory every thread reads). Each
//! driver claims its own device's share of a stage first, then the shares no driver has started
//! (a device whose thread the host is not running just then), so a stage waits for the slowest
//! share's work and not for a thread to be scheduled; the driver that finishes a stage's last share
//! performs the stage's joins and opens the next stage.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The claims of one run of a program.
pub(crate) struct Claims {
    /// Per device: the first of its stages' shares not claimed yet.
    next: Vec<AtomicUsize>,
    /// Shares of the current stage not finished yet.
    remaining: AtomicUsize,
}

impl Claims {
    pub fn new(devices: usize) -> Claims {
        Claims {
            next: (0..devices).map(|_| AtomicUsize::new(0)).collect(),
            remaining: AtomicUsize::new(devices),
        }
    }

    /// Claims device `d`'s share of stage `stage` (the current stage); false when another driver
    /// has claimed it.
    pub fn claim(&self, d: usize, stage: usize) -> bool {
        self.next[d]
            .compare_exchange(stage, stage + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Records a finished share of the current stage; true for its last share, whose driver then
    /// owns the stage's joins (it sees every other share's writes) and must open the next stage.
    pub fn finish(&self) -> bool {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            // No share of the next stage can be claimed before the stage is opened.
            self.remaining.store(self.next.len(), Ordering::Relaxed);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_share_is_claimed_once_and_the_last_finisher_is_told() {
        let claims = Claims::new(3);
        for stage in 0..4 {
            assert!(claims.claim(1, stage));
            assert!(!claims.claim(1, stage), "claimed twice");
            assert!(claims.claim(0, stage));
            assert!(claims.claim(2, stage));
            assert!(!claims.finish());
            assert!(!claims.finish());
            assert!(claims.finish(), "the third share of three is the last");
        }
    }
}

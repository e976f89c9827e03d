//! Programs kept as recordings: where every stage's joins are stream-ordered AllReduces and the
//! communicator can keep the work queued on its participants' streams ([`Recorder`], a CUDA graph
//! over one GPU's logical devices), a program issued from one thread
//! (`GGML_TP_META_DRIVERS`) is recorded after its first few runs, and each later run queues the
//! recording again (one launch for every device's stages and every join) instead of issuing its
//! stages and joins call by call. Its first runs are issued as usual: what the stages allocate on
//! first use (scratch, workspaces, compiled kernels) exists before the recording, and only a
//! program that keeps coming back is recorded (a decode step is; a prompt's micro-batches mostly
//! are not, and recording one costs about as much as running it: BENCHMARKS.md). A program whose
//! recording fails is issued call by call from then on. The recording lives with its program: the
//! program's per-device graphs keep their memory as long as both do.

use ggml_core::backend::{Recorder, Recording};
use ggml_core::Result;

/// Runs of a program issued call by call before it is recorded.
pub const RUNS_BEFORE_RECORDING: u32 = 4;

/// A program's recording and what one of its runs adds to the counters it cannot count itself.
struct Kept {
    recording: Box<dyn Recording>,
    reductions: u64,
    reduced_bytes: u64,
}

/// Where a program stands with recordings.
#[derive(Default)]
pub(crate) struct Recorded {
    runs: u32,
    kept: Option<Kept>,
    refused: bool,
}

/// What a run of a program does.
pub(crate) enum Step {
    /// Issue its stages and joins call by call.
    Issue,
    /// Record them, then replay the recording.
    Record,
    /// Replay the recording.
    Replay,
}

impl Recorded {
    /// What this run of the program does, and counts it.
    pub fn next_step(&mut self) -> Step {
        let step = if self.kept.is_some() {
            Step::Replay
        } else if self.refused || self.runs < RUNS_BEFORE_RECORDING {
            Step::Issue
        } else {
            Step::Record
        };
        self.runs = self.runs.saturating_add(1);
        step
    }

    /// Records what `issue` queues through `recorder`; a failure refuses recordings of this
    /// program from then on (nothing was kept or run: the caller issues the run call by call).
    /// `counted` tells what a run adds to the reduction counters, read after `issue`.
    pub fn record(
        &mut self,
        recorder: &dyn Recorder,
        issue: &mut dyn FnMut() -> Result<()>,
        counted: impl FnOnce() -> (u64, u64),
    ) -> Result<()> {
        match recorder.record(issue) {
            Ok(recording) => {
                let (reductions, reduced_bytes) = counted();
                self.kept = Some(Kept {
                    recording,
                    reductions,
                    reduced_bytes,
                });
                Ok(())
            }
            Err(e) => {
                self.refused = true;
                Err(e)
            }
        }
    }

    /// Queues the recording again; returns what the run adds to the reduction counters (calls,
    /// bytes).
    pub fn replay(&self) -> Result<(u64, u64)> {
        let kept = self.kept.as_ref().expect("replay follows a recording");
        kept.recording.replay()?;
        Ok((kept.reductions, kept.reduced_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Keeps nothing but counts replays; fails when asked to.
    struct Counting {
        fail: bool,
        replays: Arc<AtomicUsize>,
    }

    struct CountingRecording(Arc<AtomicUsize>);

    impl Recording for CountingRecording {
        fn replay(&self) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    impl Recorder for Counting {
        fn record(&self, issue: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Recording>> {
            issue()?;
            if self.fail {
                return Err(ggml_core::Error::Other("cannot keep a host wait".into()));
            }
            Ok(Box::new(CountingRecording(self.replays.clone())))
        }
    }

    #[test]
    fn issues_first_then_records_then_replays() {
        let replays = Arc::new(AtomicUsize::new(0));
        let recorder = Counting {
            fail: false,
            replays: replays.clone(),
        };
        let mut r = Recorded::default();
        for _ in 0..RUNS_BEFORE_RECORDING {
            assert!(matches!(r.next_step(), Step::Issue));
        }
        assert!(matches!(r.next_step(), Step::Record));
        let mut issued = 0;
        let mut issue = || {
            issued += 1;
            Ok(())
        };
        r.record(&recorder, &mut issue, || (4, 64)).unwrap();
        assert_eq!(issued, 1);
        for _ in 0..3 {
            assert!(matches!(r.next_step(), Step::Replay));
            assert_eq!(r.replay().unwrap(), (4, 64));
        }
        assert_eq!(replays.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_failed_recording_issues_call_by_call_from_then_on() {
        let recorder = Counting {
            fail: true,
            replays: Arc::new(AtomicUsize::new(0)),
        };
        let mut r = Recorded::default();
        for _ in 0..RUNS_BEFORE_RECORDING {
            r.next_step();
        }
        assert!(matches!(r.next_step(), Step::Record));
        assert!(r.record(&recorder, &mut || Ok(()), || (0, 0)).is_err());
        for _ in 0..3 {
            assert!(matches!(r.next_step(), Step::Issue));
        }
    }
}

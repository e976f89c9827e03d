//! `MetaBackend`: the stream of a meta device. Computing a graph builds the graph's program or finds
//! it in the stream's cache of programs per graph shape ([`crate::cache`]), copies inputs, runs each
//! stage on every device at once, joins partial and split results between stages, and writes
//! outputs back whole. Every program of a stream places its per-device graphs in the same compute
//! memory (one scheduler per device), since one program runs at a time.
//!
//! Each device has a driver thread for the whole program (inside the device's own workers where its
//! stream offers that, [`Backend::drive`]): it issues the device's share of each stage and meets the
//! other drivers at a spinning barrier for each join, so a join costs no hand-over of work between
//! threads; the last driver to arrive performs the join and releases the others, so a join is one
//! meeting. On CPU devices (one host) a driver also computes the shares of devices whose driver
//! has not started them ([`crate::takeover`]): a stage then never waits for a thread that the host
//! is not running; and a driver with no share left to start runs tasks of the shares still
//! running while it waits for them ([`Backend::help`]), so that an uneven cut (whole GQA groups)
//! leaves no core idle. With a stream-ordered communicator ([`Communicator::is_stream_ordered`]) the drivers do
//! not synchronize their devices around the AllReduce: they only make sure that every device's
//! `compute` call has returned; they synchronize where the host reads device data (gathers, the
//! generic AllReduce, outputs). Where every device's stream only queues its work (GPUs,
//! [`Backend::queues_work`]) and the communicator is stream-ordered, `GGML_TP_META_DRIVERS=one`
//! ([`crate::settings`]) has the calling thread issue every device's share of each stage and the
//! joins instead, so that no driver thread wakes up or meets the others per join; where the
//! communicator can also keep that work ([`Communicator::recorder`]: one GPU's logical devices),
//! a program is issued that way for its first few runs, then recorded and replayed from then on
//! ([`crate::record`]), and that is the default (`auto`).

use crate::barrier::RankBarrier;
use crate::cache::{Lookup, ProgramCache};
use crate::collective::{all_gather, all_reduce, assemble};
use crate::device::MetaDevice;
use crate::program::{build, Boundary, Program};
use crate::record::{Recorded, Step};
use crate::settings::Drivers;
use crate::takeover::Claims;
use ggml_core::backend::{Backend, Communicator, Device, DeviceKind, Event, Recorder};
use ggml_core::sched::Scheduler;
use ggml_core::{DataRef, Error, Graph, Result, TensorId};
use parking_lot::Mutex;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Counters of a meta stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Programs built from scratch.
    pub builds: u64,
    /// Graph computations that reused a cached program (same cut, subgraphs and ids).
    pub hits: u64,
    /// Programs dropped from the cache (least recently used) to make room for a new one.
    pub evictions: u64,
    /// AllReduce calls and the bytes each device contributed to them.
    pub reductions: u64,
    pub reduced_bytes: u64,
    /// Gathers of split tensors.
    pub gathers: u64,
    /// Stage shares of one device computed by another device's driver (CPU devices, when a
    /// device's thread was not running; see `takeover`).
    pub taken_over: u64,
    /// Where any driver may compute any share (CPU devices) and the counters are on: the thread
    /// CPU time of every stage share, summed, and of each stage's longest share, summed (the
    /// stages' critical path). `devices * critical_ns / share_ns` is how much longer the stages
    /// take than evenly cut ones would: 1.0 for an even cut, 1.33 for a 2:1 cut of two devices.
    pub share_ns: u64,
    pub critical_ns: u64,
    /// Where any driver may compute any share and the counters are on: the wall time of the
    /// drivers' runs, summed over drivers; of it, the time they waited at the ends of stages; and
    /// of that, the time they ran tasks of the shares still running (`Backend::help`). The rest of
    /// the wait (`wait_ns - helped_ns`) left a core idle, which is what an uneven cut costs where
    /// drivers help (see [`MetaStats::idle_share`]).
    pub drive_ns: u64,
    pub wait_ns: u64,
    pub helped_ns: u64,
    /// Programs kept as recordings, runs that replayed one, and recordings that failed (their
    /// programs are issued call by call) ([`crate::record`]).
    pub recordings: u64,
    pub replays: u64,
    pub refused_recordings: u64,
}

impl MetaStats {
    /// The counters of two streams together.
    pub fn plus(&self, other: &MetaStats) -> MetaStats {
        MetaStats {
            builds: self.builds + other.builds,
            hits: self.hits + other.hits,
            evictions: self.evictions + other.evictions,
            reductions: self.reductions + other.reductions,
            reduced_bytes: self.reduced_bytes + other.reduced_bytes,
            gathers: self.gathers + other.gathers,
            taken_over: self.taken_over + other.taken_over,
            share_ns: self.share_ns + other.share_ns,
            critical_ns: self.critical_ns + other.critical_ns,
            drive_ns: self.drive_ns + other.drive_ns,
            wait_ns: self.wait_ns + other.wait_ns,
            helped_ns: self.helped_ns + other.helped_ns,
            recordings: self.recordings + other.recordings,
            replays: self.replays + other.replays,
            refused_recordings: self.refused_recordings + other.refused_recordings,
        }
    }

    /// How much longer the stages of a meta device of `devices` devices took than evenly cut
    /// ones would have (`devices * critical_ns / share_ns`), where share times were measured.
    pub fn stage_balance(&self, devices: usize) -> Option<f64> {
        (self.share_ns > 0).then(|| devices as f64 * self.critical_ns as f64 / self.share_ns as f64)
    }

    /// The share of the drivers' time spent waiting at the ends of stages without work to help
    /// with (spinning or parked), where it was measured: 0.0 when no driver ever waited idle.
    pub fn idle_share(&self) -> Option<f64> {
        (self.drive_ns > 0)
            .then(|| self.wait_ns.saturating_sub(self.helped_ns) as f64 / self.drive_ns as f64)
    }

    /// Adds one stage's per-device share times.
    fn add_stage(&mut self, times: &[u64]) {
        self.share_ns += times.iter().sum::<u64>();
        self.critical_ns += times.iter().max().copied().unwrap_or(0);
    }
}

/// A stream over every device of a meta device. Partial sums are joined by the family's communicator;
/// without one (or when [`ReduceOptions::generic`](crate::device::ReduceOptions) asks) by recursive
/// doubling on the devices (`doubling`).
pub struct MetaBackend {
    device: Arc<MetaDevice>,
    backends: Vec<Arc<dyn Backend>>,
    comm: Option<Arc<dyn Communicator>>,
    /// Any driver may compute any device's share of a stage (CPU devices joined by a
    /// stream-ordered communicator: one host's memory and threads), see [`crate::takeover`].
    takeover: bool,
    /// Every device's stream queues its work and the communicator is ordered on the streams, so
    /// that one thread can issue all of it ([`MetaBackend::run_from_one_thread`]).
    one_driver_fits: bool,
    /// The calling thread issues every device's work (`GGML_TP_META_DRIVERS`, where it fits).
    one_driver: AtomicBool,
    /// Programs issued from one thread are kept as recordings where the communicator can
    /// (`GGML_TP_META_RECORD`, [`crate::record`]).
    record: AtomicBool,
    /// The programs per graph shape, and each device's scheduler (the compute memory they share).
    programs: Mutex<Programs>,
    stats: Mutex<MetaStats>,
    /// Threads that drive devices 1.. (thread `i` drives device `i + 1`) while the calling thread
    /// drives device 0.
    driver: rayon::ThreadPool,
    /// Where the drivers meet (kept across runs: it learns how long to spin).
    barrier: Mutex<RankBarrier>,
}

impl MetaBackend {
    pub(crate) fn new(device: Arc<MetaDevice>) -> Result<MetaBackend> {
        let backends = device
            .devices()
            .iter()
            .map(|d| d.new_backend())
            .collect::<Result<Vec<_>>>()?;
        let family = device.devices()[0].family();
        let comm = match ggml_core::registry::backend(family)
            .filter(|_| !device.reduce_options().generic)
            .and_then(|r| r.new_communicator(&backends))
        {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return Err(e),
            None => None,
        };
        // One thread per device beyond the first (a pool needs at least one).
        let driver = rayon::ThreadPoolBuilder::new()
            .num_threads(backends.len().saturating_sub(1).max(1))
            .thread_name(|i| format!("meta-driver-{i}"))
            .build()
            .map_err(|e| Error::Other(format!("meta: driver threads: {e}")))?;
        let takeover =
            comm.is_some() && device.devices().iter().all(|d| d.kind() == DeviceKind::Cpu);
        let one_driver_fits = comm.as_ref().is_some_and(|c| c.is_stream_ordered())
            && backends.iter().all(|b| b.queues_work());
        let settings = crate::settings::settings();
        let records = settings.record && comm.as_ref().is_some_and(|c| c.recorder().is_some());
        let one_driver = AtomicBool::new(
            one_driver_fits
                && match settings.drivers {
                    Drivers::Each => false,
                    Drivers::One => true,
                    Drivers::Auto => records,
                },
        );
        let record = AtomicBool::new(settings.record);
        let programs = Programs {
            scheds: backends
                .iter()
                .map(|b| Scheduler::new(vec![b.clone()]))
                .collect(),
            cache: ProgramCache::default(),
        };
        Ok(MetaBackend {
            barrier: Mutex::new(RankBarrier::new(backends.len())),
            device,
            backends,
            comm,
            takeover,
            one_driver_fits,
            one_driver,
            record,
            programs: Mutex::new(programs),
            stats: Mutex::new(MetaStats::default()),
            driver,
        })
    }

    /// Issues every device's work from the calling thread (`on`) or from a driver thread per
    /// device; true when one thread does, which needs streams that queue their work and a
    /// stream-ordered communicator. The default is `GGML_TP_META_DRIVERS` ([`crate::settings`]).
    pub fn set_one_driver(&self, on: bool) -> bool {
        let one = on && self.one_driver_fits;
        self.one_driver.store(one, Ordering::Relaxed);
        one
    }

    /// Keeps programs issued from one thread as recordings where the communicator can (`on`);
    /// the default is `GGML_TP_META_RECORD` ([`crate::settings`]).
    pub fn set_recording(&self, on: bool) {
        self.record.store(on, Ordering::Relaxed);
    }

    pub fn stats(&self) -> MetaStats {
        *self.stats.lock()
    }

    /// Compute-buffer bytes each device needs for the last computed program (each plans its own
    /// share).
    pub fn device_compute_memory(&self) -> Vec<usize> {
        self.programs
            .lock()
            .cache
            .last()
            .map(|p| p.compute_bytes.clone())
            .unwrap_or_default()
    }

    /// Programs held in the cache now.
    pub fn cached_programs(&self) -> usize {
        self.programs.lock().cache.len()
    }

    /// The per-device streams.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// True when partial sums are joined by the family's communicator rather than host staging.
    pub fn has_communicator(&self) -> bool {
        self.comm.is_some()
    }

    fn run(&self, prog: &Program, meta: &Graph) -> Result<()> {
        for (t, copies) in &prog.inputs {
            let bytes = meta.get_bytes(*t)?;
            for (d, c) in copies.iter().enumerate() {
                if let Some(c) = c {
                    prog.graphs[d].set_bytes(*c, &bytes)?;
                }
            }
        }
        let _exclusive = lock_devices(self.device.devices());
        if self.one_driver.load(Ordering::Relaxed) {
            self.run_from_one_thread(prog)?;
        } else {
            self.run_drivers(prog)?;
        }
        for o in &prog.outputs {
            let bytes = assemble(&prog.graphs, &o.locals, *meta.layout(o.meta), &o.state)?;
            let dst = meta.data(o.meta)?;
            dst.buffer.set(dst.offset, &bytes)?;
        }
        Ok(())
    }

    /// Every device's driver at once, device 0's on this thread.
    fn run_drivers(&self, prog: &Program) -> Result<()> {
        let mut barrier = self.barrier.lock();
        barrier.reset();
        let crew = Crew::new(&barrier, self.backends.len());
        if self.backends.len() == 1 {
            self.drive(0, prog, &crew);
        } else {
            // Device 0's driver runs on this thread, each other one on a driver thread of its own.
            self.driver.in_place_scope(|s| {
                s.spawn_broadcast(|_, ctx| self.drive(ctx.index() + 1, prog, &crew));
                self.drive(0, prog, &crew);
            });
        }
        crew.result()
    }

    /// The whole program issued from this thread: each stage's share of every device, then its
    /// joins, which a stream-ordered communicator queues behind that work, so that the host waits
    /// for the devices only at the end (or where a join reads device data). Where every stream
    /// queues its work this costs the host only the launches, and no driver thread has to wake up
    /// or meet the others at each join.
    fn run_from_one_thread(&self, prog: &Program) -> Result<()> {
        if let Some(recorder) = self.recorder_for(prog) {
            let mut recorded = prog.recorded.lock();
            let replay = match recorded.next_step() {
                Step::Issue => false,
                Step::Replay => true,
                Step::Record => self.record(prog, recorder, &mut recorded),
            };
            if replay {
                let (reductions, bytes) = recorded.replay()?;
                let mut s = self.stats.lock();
                s.replays += 1;
                s.reductions += reductions;
                s.reduced_bytes += bytes;
                drop(s);
                return self.synchronize();
            }
        }
        self.issue_from_one_thread(prog)?;
        self.synchronize()
    }

    /// Records `prog` issued from this thread; true when it was kept. Nothing recorded has run,
    /// so the joins counted while recording are taken back (each replay counts them).
    fn record(&self, prog: &Program, recorder: &dyn Recorder, recorded: &mut Recorded) -> bool {
        let before = self.stats();
        let kept = recorded.record(recorder, &mut || self.issue_from_one_thread(prog), || {
            let s = self.stats();
            (
                s.reductions - before.reductions,
                s.reduced_bytes - before.reduced_bytes,
            )
        });
        let mut s = self.stats.lock();
        s.reductions = before.reductions;
        s.reduced_bytes = before.reduced_bytes;
        s.recordings += u64::from(kept.is_ok());
        s.refused_recordings += u64::from(kept.is_err());
        kept.is_ok()
    }

    /// The recorder that can keep `prog` issued from one thread: every join of the program is a
    /// stream-ordered AllReduce (no host wait between stages) and the communicator has one.
    fn recorder_for(&self, prog: &Program) -> Option<&dyn Recorder> {
        let recorder = self.comm.as_ref()?.recorder()?;
        (self.record.load(Ordering::Relaxed)
            && prog.stages.iter().all(|s| self.queued_is_enough(&s.after)))
        .then_some(recorder)
    }

    /// Queues the whole program from this thread (see [`MetaBackend::run_from_one_thread`]).
    fn issue_from_one_thread(&self, prog: &Program) -> Result<()> {
        for stage in &prog.stages {
            for (d, backend) in self.backends.iter().enumerate() {
                if !stage.nodes[d].is_empty() {
                    backend.compute(&prog.graphs[d], &stage.nodes[d])?;
                }
            }
            if !self.queued_is_enough(&stage.after) {
                self.synchronize()?;
            }
            stage.after.iter().try_for_each(|b| self.join(prog, b))?;
        }
        Ok(())
    }

    /// Runs device `d`'s driver loop where its stream issues work best; failures go to `crew`.
    fn drive(&self, d: usize, prog: &Program, crew: &Crew) {
        let mut job = || {
            let _guard = PanicGuard(crew);
            let result = if self.takeover {
                self.run_shared(d, prog, crew)
            } else {
                self.run_device(d, prog, crew.barrier)
            };
            if let Err(e) = result {
                crew.fail(e);
            }
        };
        self.backends[d].drive(&mut job);
    }

    /// Device `d`'s part of the program: its share of each stage, then the joins.
    fn run_device(&self, d: usize, prog: &Program, barrier: &RankBarrier) -> Result<()> {
        let backend = &self.backends[d];
        for stage in &prog.stages {
            if !stage.nodes[d].is_empty() {
                backend.compute(&prog.graphs[d], &stage.nodes[d])?;
            }
            if stage.after.is_empty() {
                continue;
            }
            if !self.queued_is_enough(&stage.after) {
                backend.synchronize()?;
            }
            self.join_stage(d, prog, &stage.after, barrier)?;
        }
        // Every driver has queued all of its work before any waits for its device: a driver
        // blocked in a synchronize can hold up another driver's launches (on one GPU's logical
        // devices the last stage of a decode step was queued only once the first device had
        // finished its own, BENCHMARKS.md).
        barrier.wait()?;
        backend.synchronize()
    }

    /// Device `d`'s driver where any driver may compute any device's share ([`crate::takeover`]):
    /// per stage its own share, then any share no driver has started; the driver that finishes a
    /// stage's last share performs its joins and opens the next stage, which every driver waits for.
    fn run_shared(&self, d: usize, prog: &Program, crew: &Crew) -> Result<()> {
        let n = self.backends.len();
        let timed = crew.share_ns.is_some();
        let begun = Instant::now();
        let (mut wait_ns, helped_ns) = (0u64, Cell::new(0u64));
        for (s, stage) in prog.stages.iter().enumerate() {
            for dev in (0..n).map(|k| (d + k) % n) {
                if !crew.claims.claim(dev, s) {
                    continue;
                }
                let start = crew.share_ns.as_ref().and_then(|_| thread_cpu_ns());
                if !stage.nodes[dev].is_empty() {
                    self.backends[dev].compute(&prog.graphs[dev], &stage.nodes[dev])?;
                }
                if let (Some(times), Some(start), Some(end)) =
                    (&crew.share_ns, start, thread_cpu_ns())
                {
                    times[dev].store(end.saturating_sub(start), Ordering::Relaxed);
                }
                if dev != d {
                    self.stats.lock().taken_over += 1;
                }
                if crew.claims.finish() {
                    if let Some(times) = &crew.share_ns {
                        self.count_stage(times);
                    }
                    if !self.queued_is_enough(&stage.after) {
                        self.synchronize()?;
                    }
                    stage.after.iter().try_for_each(|b| self.join(prog, b))?;
                    crew.barrier.advance();
                }
            }
            // Meanwhile this thread runs tasks of the shares still running (CPU streams).
            let waiting = Instant::now();
            crew.barrier
                .wait_while_helping(crew.first_generation.wrapping_add(s), &|| {
                    if !timed {
                        return self.backends[d].help();
                    }
                    let start = Instant::now();
                    let helped = self.backends[d].help();
                    if helped {
                        helped_ns.set(helped_ns.get() + nanos_since(start));
                    }
                    helped
                })?;
            if timed {
                wait_ns += nanos_since(waiting);
            }
        }
        if timed {
            let mut stats = self.stats.lock();
            stats.drive_ns += nanos_since(begun);
            stats.wait_ns += wait_ns;
            stats.helped_ns += helped_ns.get();
        }
        self.backends[d].synchronize()
    }

    /// True when the joins `after` a stage may start once the stage's work is queued on every
    /// stream: every join is an AllReduce ordered on the streams. Otherwise the host (or a generic
    /// reduction) reads what the stage wrote, and the devices must be synchronized first.
    fn queued_is_enough(&self, after: &[Boundary]) -> bool {
        self.comm.as_ref().is_some_and(|c| c.is_stream_ordered())
            && after
                .iter()
                .all(|b| matches!(b, Boundary::Reduce { doubling: None, .. }))
    }

    /// Device `d`'s part in the joins after a stage. A run of joins that one thread performs for
    /// every device (communicator, gathers) is done by the last driver to reach the barrier, once
    /// every device's compute call has returned, and the others leave when it is done: one meeting
    /// per run. The generic AllReduce runs on every driver, after such a meeting.
    fn join_stage(
        &self,
        d: usize,
        prog: &Program,
        after: &[Boundary],
        barrier: &RankBarrier,
    ) -> Result<()> {
        let is_doubling = |b: &Boundary| {
            matches!(
                b,
                Boundary::Reduce {
                    doubling: Some(_),
                    ..
                }
            )
        };
        // Every driver is past the work before the joins still to do.
        let mut met = false;
        let mut rest = after;
        while let Some(first) = rest.first() {
            if let Boundary::Reduce {
                doubling: Some(dbl),
                ..
            } = first
            {
                if !met {
                    barrier.wait()?;
                }
                dbl.run_rank(d, &self.backends, barrier)?;
                if d == 0 {
                    self.count_reduction(dbl.transfer_bytes());
                }
                rest = &rest[1..];
            } else {
                let n = rest.iter().position(is_doubling).unwrap_or(rest.len());
                let (by_one, later) = rest.split_at(n);
                barrier.wait_then(|| by_one.iter().try_for_each(|b| self.join(prog, b)))?;
                rest = later;
            }
            met = true;
        }
        Ok(())
    }

    /// A join performed by one thread for every device: AllReduce through the communicator (or host
    /// memory), or a gather through host memory.
    fn join(&self, prog: &Program, boundary: &Boundary) -> Result<()> {
        match boundary {
            Boundary::Reduce { locals, .. } => {
                let bytes = all_reduce(&prog.graphs, locals, self.comm.as_deref())?;
                self.count_reduction(bytes);
            }
            Boundary::Gather {
                layout,
                state,
                locals,
                targets,
            } => {
                all_gather(&prog.graphs, locals, targets, *layout, state)?;
                self.stats.lock().gathers += 1;
            }
        }
        Ok(())
    }

    /// Adds a finished stage's share times (see [`MetaStats::critical_ns`]).
    fn count_stage(&self, times: &[AtomicU64]) {
        let times: Vec<u64> = times.iter().map(|t| t.swap(0, Ordering::Relaxed)).collect();
        self.stats.lock().add_stage(&times);
    }

    fn count_reduction(&self, bytes: usize) {
        let mut s = self.stats.lock();
        s.reductions += 1;
        s.reduced_bytes += bytes as u64;
    }
}

/// The program cache of a stream and the per-device schedulers its programs are placed by.
struct Programs {
    scheds: Vec<Scheduler>,
    cache: ProgramCache,
}

/// Locks that keep two runs sharing a device from running at once, whatever meta device or stream
/// they belong to: a driver may hold its device's only worker thread for a whole run while it waits
/// for the other drivers at the barrier, so two runs that each held a device the other needs would
/// wait for ever. Devices map (by address) to a fixed set of locks, always taken in index order.
static DEVICE_LOCKS: [Mutex<()>; 64] = [const { Mutex::new(()) }; 64];

/// Takes the locks of `devices` for one run.
fn lock_devices(devices: &[Arc<dyn Device>]) -> Vec<parking_lot::MutexGuard<'static, ()>> {
    let mut locks: Vec<usize> = devices
        .iter()
        .map(|d| (Arc::as_ptr(d) as *const () as usize >> 6) % DEVICE_LOCKS.len())
        .collect();
    locks.sort_unstable();
    locks.dedup();
    locks.into_iter().map(|i| DEVICE_LOCKS[i].lock()).collect()
}

/// What the drivers of one program run share: their barrier, the claims on stage shares (and the
/// barrier's generation when the run started: stage `s` is open while it is `s` more), the CPU
/// time of each device's share of the current stage (while the counters are on), and the first
/// failure.
struct Crew<'a> {
    barrier: &'a RankBarrier,
    claims: Claims,
    first_generation: usize,
    share_ns: Option<Vec<AtomicU64>>,
    error: Mutex<Option<Error>>,
}

impl<'a> Crew<'a> {
    fn new(barrier: &'a RankBarrier, devices: usize) -> Crew<'a> {
        let timed = crate::settings::settings().stats && thread_cpu_ns().is_some();
        Crew {
            barrier,
            claims: Claims::new(devices),
            first_generation: barrier.generation(),
            share_ns: timed.then(|| (0..devices).map(|_| AtomicU64::new(0)).collect()),
            error: Mutex::new(None),
        }
    }

    /// Records `e` (unless an earlier failure is recorded) and releases every driver.
    fn fail(&self, e: Error) {
        self.error.lock().get_or_insert(e);
        self.barrier.break_all();
    }

    fn result(self) -> Result<()> {
        self.error.into_inner().map_or(Ok(()), Err)
    }
}

/// Nanoseconds since `start`.
fn nanos_since(start: Instant) -> u64 {
    start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX)
}

/// The CPU time of the calling thread in nanoseconds, where the system tells it.
#[cfg(unix)]
fn thread_cpu_ns() -> Option<u64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    ok.then(|| t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
}

#[cfg(not(unix))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Releases the other drivers when this one panics (the panic then reaches the caller).
struct PanicGuard<'a, 'b>(&'a Crew<'b>);

impl Drop for PanicGuard<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .fail(Error::Other("meta: a device driver panicked".into()));
        }
    }
}

impl Backend for MetaBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        let mut staging = vec![0u8; len];
        src.buffer.get(src.offset, &mut staging)?;
        dst.buffer.set(dst.offset, &staging)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let mut programs = self.programs.lock();
        let Programs { scheds, cache } = &mut *programs;
        let key = cache.key(graph, nodes);
        let (program, lookup) = cache.get_or_build(key, || {
            build(
                graph,
                nodes,
                &self.device,
                &self.backends,
                scheds,
                key,
                self.comm.is_some(),
            )
        })?;
        {
            let mut stats = self.stats.lock();
            match lookup {
                Lookup::Hit => stats.hits += 1,
                Lookup::Built { evicted } => {
                    stats.builds += 1;
                    stats.evictions += u64::from(evicted);
                }
            }
        }
        self.run(program, graph)
    }
    fn synchronize(&self) -> Result<()> {
        self.backends.iter().try_for_each(|b| b.synchronize())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        self.synchronize()?;
        Ok(Arc::new(ggml_core::CompletedEvent))
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
    fn set_threads(&self, n: usize) {
        let per = (n / self.backends.len()).max(1);
        self.backends.iter().for_each(|b| b.set_threads(per));
    }
}

/// `GGML_TP_META_STATS` ([`crate::settings`]) prints the counters when the backend drops.
impl Drop for MetaBackend {
    fn drop(&mut self) {
        if crate::settings::settings().stats {
            let s = self.stats();
            let balance = s.stage_balance(self.backends.len());
            eprintln!(
                "{} meta: {s:?}, stage balance {}, drivers idle at stage ends {}",
                self.device.name(),
                balance.map_or("n/a".into(), |b| format!("{b:.3}")),
                s.idle_share()
                    .map_or("n/a".into(), |i| format!("{:.1}%", 100.0 * i))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_balance_is_the_critical_path_over_an_even_cut() {
        let mut s = MetaStats::default();
        assert_eq!(s.stage_balance(2), None);
        // Two devices: an even stage, then a 2:1 stage (three GQA groups over two devices).
        s.add_stage(&[100, 100]);
        assert_eq!(s.stage_balance(2), Some(1.0));
        s.add_stage(&[200, 100]);
        assert_eq!((s.share_ns, s.critical_ns), (500, 300));
        assert_eq!(s.stage_balance(2), Some(1.2));
        assert_eq!(s.plus(&s).stage_balance(2), Some(1.2));
    }

    #[test]
    fn idle_share_counts_the_waits_not_spent_helping() {
        let mut s = MetaStats::default();
        assert_eq!(s.idle_share(), None);
        // Two drivers of 1000 ns each; 300 ns waiting, 200 of them running the other's tasks.
        (s.drive_ns, s.wait_ns, s.helped_ns) = (2000, 300, 200);
        assert_eq!(s.idle_share(), Some(0.05));
        let twice = s.plus(&s);
        assert_eq!(
            (twice.drive_ns, twice.wait_ns, twice.helped_ns),
            (4000, 600, 400)
        );
        assert_eq!(twice.idle_share(), Some(0.05));
        // A wait spent helping throughout leaves no core idle.
        s.helped_ns = s.wait_ns;
        assert_eq!(s.idle_share(), Some(0.0));
    }
}

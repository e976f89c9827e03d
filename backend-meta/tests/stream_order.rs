//! The meta executor's contract with its devices' streams and communicators, checked with probe
//! families: CPU devices under another family name whose streams record what the executor does (the
//! second device's computes are slow, so that a join that does not wait for them shows). With a
//! stream-ordered communicator the AllReduce comes after every device's compute call has returned and
//! with no synchronize in between; with a plain one every device is synchronized first; without one
//! the generic AllReduce stages values through host memory between devices that cannot read each
//! other's buffers. A failing or panicking device stops the run with an error instead of hanging it,
//! and the next run works.

mod common;

use backend_cpu::{CpuCommunicator, CpuDevice};
use backend_meta::MetaDevice;
use common::{nmse, single, single_with_inputs, Dims, Harness, Place};
use ggml_core::backend::{
    Backend, Buffer, BufferType, Communicator, Device, Event, Recorder, Recording,
};
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{
    DType, DataRef, DeviceCaps, DeviceKind, Error, Graph, MemoryInfo, Result, TensorId,
};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

const DEVICES: usize = 2;

/// The probe families, one per test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A stream-ordered communicator; drivers run inside the CPU pools.
    Ordered,
    /// A communicator that needs synchronized streams; drivers run on the meta driver threads.
    Synchronous,
    /// No communicator, and devices that only reach their own memory.
    Generic,
    /// A stream-ordered communicator; device 1 fails or panics on request.
    Failing,
    /// A stream-ordered communicator and streams that say they queue their work (as GPU streams
    /// do), so that one thread may issue every device's work.
    Queued,
    /// As `Queued`, with a communicator that can keep what the streams queue ([`Recorder`]).
    Recorded,
}

const KINDS: [Kind; 6] = [
    Kind::Ordered,
    Kind::Synchronous,
    Kind::Generic,
    Kind::Failing,
    Kind::Queued,
    Kind::Recorded,
];

impl Kind {
    fn family(self) -> &'static str {
        match self {
            Kind::Ordered => "probeordered",
            Kind::Synchronous => "probesync",
            Kind::Generic => "probegeneric",
            Kind::Failing => "probefailing",
            Kind::Queued => "probequeued",
            Kind::Recorded => "proberecorded",
        }
    }
}

/// What one device's stream did.
#[derive(Default)]
struct Trace {
    in_compute: AtomicBool,
    computes: AtomicUsize,
    /// A synchronize since the last compute began.
    synced: AtomicBool,
}

/// Everything the streams and communicator of one family saw.
#[derive(Default)]
struct Log {
    devices: [Trace; DEVICES],
    reductions: AtomicUsize,
    /// The threads that called `compute` or `all_reduce`.
    threads: Mutex<HashSet<ThreadId>>,
    violations: Mutex<Vec<String>>,
    fail: AtomicBool,
    panic: AtomicBool,
    /// The calls kept while a recording is under way (`Kind::Recorded`).
    recording: Mutex<Option<Vec<Call>>>,
    replays: AtomicUsize,
}

/// A call kept by the probe recorder, replayed as it was made.
enum Call {
    Compute {
        backend: Arc<dyn Backend>,
        graph: Graph,
        nodes: Vec<TensorId>,
    },
    AllReduce {
        data: Vec<DataRef>,
        dtype: DType,
        count: usize,
    },
}

impl Log {
    fn violation(&self, what: String) {
        self.violations.lock().push(what);
    }
}

fn log(kind: Kind) -> &'static Log {
    static LOGS: OnceLock<[Log; 6]> = OnceLock::new();
    let logs = LOGS.get_or_init(Default::default);
    &logs[KINDS.iter().position(|&k| k == kind).expect("a probe kind")]
}

struct ProbeDevice {
    inner: Arc<CpuDevice>,
    kind: Kind,
    index: usize,
    me: std::sync::Weak<ProbeDevice>,
}

impl Device for ProbeDevice {
    fn name(&self) -> String {
        format!("{}:{}", self.kind.family(), self.index)
    }
    fn description(&self) -> String {
        self.inner.description()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn family(&self) -> &'static str {
        self.kind.family()
    }
    fn memory(&self) -> MemoryInfo {
        self.inner.memory()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        self.inner.supports_op(graph, node)
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        match self.kind {
            Kind::Generic => self.inner.owns(buffer),
            _ => self.inner.can_access(buffer),
        }
    }
    fn owns(&self, buffer: &dyn Buffer) -> bool {
        self.inner.owns(buffer)
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(ProbeBackend {
            inner: self.inner.new_backend()?,
            device: self.me.upgrade().expect("a probe device lives in an Arc"),
        }))
    }
}

struct ProbeBackend {
    inner: Arc<dyn Backend>,
    device: Arc<ProbeDevice>,
}

impl ProbeBackend {
    fn log(&self) -> &'static Log {
        log(self.device.kind)
    }
    fn trace(&self) -> &'static Trace {
        &self.log().devices[self.device.index]
    }
}

impl Backend for ProbeBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        if !self.device.can_access(src.buffer.as_ref()) {
            self.log()
                .violation(format!("{} copies from {}", self.name(), src.buffer.name()));
        }
        self.inner.copy_async(src, dst, len)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let (log, trace) = (self.log(), self.trace());
        if self.device.index == 1 && log.panic.load(Ordering::SeqCst) {
            panic!("probe device 1 panics on request");
        }
        log.threads.lock().insert(std::thread::current().id());
        if let Some(calls) = log.recording.lock().as_mut() {
            calls.push(Call::Compute {
                backend: self.inner.clone(),
                graph: graph.clone(),
                nodes: nodes.to_vec(),
            });
            return Ok(());
        }
        trace.in_compute.store(true, Ordering::SeqCst);
        trace.synced.store(false, Ordering::SeqCst);
        let result = if self.device.index == 1 && log.fail.load(Ordering::SeqCst) {
            Err(Error::Other("probe device 1 fails on request".into()))
        } else {
            if self.device.index == 1 {
                std::thread::sleep(Duration::from_micros(300));
            }
            self.inner.compute(graph, nodes)
        };
        trace.computes.fetch_add(1, Ordering::SeqCst);
        trace.in_compute.store(false, Ordering::SeqCst);
        result
    }
    fn synchronize(&self) -> Result<()> {
        if self.log().recording.lock().is_some() {
            self.log()
                .violation(format!("{} synchronized while recording", self.name()));
        }
        self.trace().synced.store(true, Ordering::SeqCst);
        self.inner.synchronize()
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        self.inner.record_event()
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        self.inner.wait_event(event)
    }
    fn drive(&self, job: &mut (dyn FnMut() + Send)) {
        match self.device.kind {
            // The CPU stream's own way: inside its pool.
            Kind::Ordered | Kind::Failing => self.inner.drive(job),
            // The default way: on the calling thread.
            Kind::Synchronous | Kind::Generic | Kind::Queued | Kind::Recorded => job(),
        }
    }
    fn queues_work(&self) -> bool {
        matches!(self.device.kind, Kind::Queued | Kind::Recorded)
    }
}

struct ProbeComm {
    kind: Kind,
    inner: CpuCommunicator,
}

impl Communicator for ProbeComm {
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        let log = log(self.kind);
        if let Some(calls) = log.recording.lock().as_mut() {
            calls.push(Call::AllReduce {
                data: data.to_vec(),
                dtype,
                count,
            });
            return Ok(());
        }
        let computes: Vec<usize> = log
            .devices
            .iter()
            .map(|t| t.computes.load(Ordering::SeqCst))
            .collect();
        if computes.iter().any(|&c| c != computes[0]) {
            log.violation(format!("all_reduce after unequal computes {computes:?}"));
        }
        for (d, t) in log.devices.iter().enumerate() {
            if t.in_compute.load(Ordering::SeqCst) {
                log.violation(format!("all_reduce while device {d} computes"));
            }
            let synced = t.synced.load(Ordering::SeqCst);
            if self.is_stream_ordered() && synced {
                log.violation(format!(
                    "device {d} synchronized before a stream-ordered all_reduce"
                ));
            }
            if !self.is_stream_ordered() && !synced {
                log.violation(format!("device {d} not synchronized before all_reduce"));
            }
        }
        log.threads.lock().insert(std::thread::current().id());
        log.reductions.fetch_add(1, Ordering::SeqCst);
        self.inner.all_reduce(data, dtype, count)
    }
    fn is_stream_ordered(&self) -> bool {
        self.kind != Kind::Synchronous
    }
    fn recorder(&self) -> Option<&dyn Recorder> {
        (self.kind == Kind::Recorded).then_some(self as &dyn Recorder)
    }
}

impl Recorder for ProbeComm {
    fn record(&self, issue: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Recording>> {
        let log = log(self.kind);
        *log.recording.lock() = Some(Vec::new());
        let issued = issue();
        let calls = log.recording.lock().take().expect("recording under way");
        issued?;
        Ok(Box::new(ProbeRecording {
            calls,
            inner: CpuCommunicator::new(self.inner.size()),
            kind: self.kind,
        }))
    }
}

/// The calls of one recording, made again on each replay (computes on the probe streams' inner
/// streams, AllReduces through a CPU communicator, each counted as the communicator counts them).
struct ProbeRecording {
    calls: Vec<Call>,
    inner: CpuCommunicator,
    kind: Kind,
}

impl Recording for ProbeRecording {
    fn replay(&self) -> Result<()> {
        let log = log(self.kind);
        log.replays.fetch_add(1, Ordering::SeqCst);
        for call in &self.calls {
            match call {
                Call::Compute {
                    backend,
                    graph,
                    nodes,
                } => backend.compute(graph, nodes)?,
                Call::AllReduce { data, dtype, count } => {
                    log.reductions.fetch_add(1, Ordering::SeqCst);
                    self.inner.all_reduce(data, *dtype, *count)?;
                }
            }
        }
        Ok(())
    }
}

struct ProbeReg(Kind);

impl BackendReg for ProbeReg {
    fn name(&self) -> &str {
        self.0.family()
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        Vec::new()
    }
    fn new_communicator(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        (self.0 != Kind::Generic).then(|| {
            Ok(Arc::new(ProbeComm {
                kind: self.0,
                inner: CpuCommunicator::new(backends.len()),
            }) as Arc<dyn Communicator>)
        })
    }
}

inventory::submit! {
    StaticBackend { name: "probeordered", create: || Box::new(ProbeReg(Kind::Ordered)) }
}
inventory::submit! {
    StaticBackend { name: "probesync", create: || Box::new(ProbeReg(Kind::Synchronous)) }
}
inventory::submit! {
    StaticBackend { name: "probegeneric", create: || Box::new(ProbeReg(Kind::Generic)) }
}
inventory::submit! {
    StaticBackend { name: "probefailing", create: || Box::new(ProbeReg(Kind::Failing)) }
}
inventory::submit! {
    StaticBackend { name: "probequeued", create: || Box::new(ProbeReg(Kind::Queued)) }
}
inventory::submit! {
    StaticBackend { name: "proberecorded", create: || Box::new(ProbeReg(Kind::Recorded)) }
}

/// A block harness on a meta device over two probe devices of `kind`.
fn probe_harness(kind: Kind, seed: u64, t: usize) -> (Harness, Arc<backend_meta::MetaBackend>) {
    let devices: Vec<Arc<dyn Device>> = backend_cpu::cpu_devices(DEVICES, DEVICES)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(index, inner)| {
            Arc::new_cyclic(|me| ProbeDevice {
                inner,
                kind,
                index,
                me: me.clone(),
            }) as Arc<dyn Device>
        })
        .collect();
    let meta = MetaDevice::new(devices, None).unwrap();
    let backend = meta.new_meta_backend().unwrap();
    let h = Harness::new(
        backend.clone(),
        Place::Meta(meta),
        Dims::TEST,
        seed,
        false,
        t,
    );
    (h, backend)
}

fn assert_clean(kind: Kind) {
    let violations = log(kind).violations.lock().clone();
    assert!(violations.is_empty(), "{kind:?}: {violations:?}");
}

#[test]
fn stream_ordered_all_reduce_waits_for_every_compute_call_and_no_synchronize() {
    let seed = rand::random::<u64>();
    let t = 3;
    let want = single(seed, false, t);
    let (mut h, backend) = probe_harness(Kind::Ordered, seed, t);
    runs_reduce_through_the_communicator(Kind::Ordered, &mut h, &backend, &want, seed);
    assert_clean(Kind::Ordered);
}

#[test]
fn plain_all_reduce_comes_after_every_device_synchronized() {
    let seed = rand::random::<u64>();
    let t = 2;
    let want = single(seed, false, t);
    let (mut h, backend) = probe_harness(Kind::Synchronous, seed, t);
    for _ in 0..2 {
        let e = nmse(&h.step(), &want);
        assert!(e <= 1e-6, "seed {seed}: nmse {e}");
    }
    let reductions = log(Kind::Synchronous).reductions.load(Ordering::SeqCst);
    assert!(reductions >= 2 * 4);
    assert_eq!(reductions as u64, backend.stats().reductions);
    assert_clean(Kind::Synchronous);
}

#[test]
fn generic_all_reduce_stages_through_host_memory_between_separate_devices() {
    let seed = rand::random::<u64>();
    let t = 4;
    let want = single(seed, false, t);
    let (mut h, backend) = probe_harness(Kind::Generic, seed, t);
    for _ in 0..2 {
        let e = nmse(&h.step(), &want);
        assert!(e <= 1e-6, "seed {seed}: nmse {e}");
    }
    let stats = backend.stats();
    assert!(stats.reductions >= 2 * 4, "{stats:?}");
    assert!(!backend.has_communicator());
    assert_clean(Kind::Generic);
}

/// Three runs, each equal to one device's result, whose reductions (4 a run at least) all went
/// through the communicator of `kind`.
fn runs_reduce_through_the_communicator(
    kind: Kind,
    h: &mut Harness,
    backend: &backend_meta::MetaBackend,
    want: &[f32],
    seed: u64,
) {
    for _ in 0..3 {
        let e = nmse(&h.step(), want);
        assert!(e <= 1e-6, "seed {seed}: nmse {e}");
    }
    let stats = backend.stats();
    assert!(stats.reductions >= 3 * 4, "{stats:?}");
    assert_eq!(
        log(kind).reductions.load(Ordering::SeqCst) as u64,
        stats.reductions,
        "every reduction went through the communicator"
    );
}

/// Device 1 fails on request: the run stops with its error, and the next run works.
fn a_failure_stops_the_run(h: &mut Harness, probe: &Log, want: &[f32]) {
    probe.fail.store(true, Ordering::SeqCst);
    let err = h.try_step().expect_err("device 1 failed");
    assert!(err.to_string().contains("fails on request"), "{err}");
    probe.fail.store(false, Ordering::SeqCst);
    assert!(nmse(&h.step(), want) <= 1e-6, "the run after a failure");
}

#[test]
fn a_failing_or_panicking_device_stops_the_run_and_the_next_run_works() {
    let seed = rand::random::<u64>();
    let t = 2;
    let want = single(seed, false, t);
    let (mut h, _) = probe_harness(Kind::Failing, seed, t);
    let probe = log(Kind::Failing);
    assert!(nmse(&h.step(), &want) <= 1e-6);
    a_failure_stops_the_run(&mut h, probe, &want);
    probe.panic.store(true, Ordering::SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.try_step()));
    assert!(panicked.is_err(), "the panic reaches the caller");
    probe.panic.store(false, Ordering::SeqCst);
    assert!(nmse(&h.step(), &want) <= 1e-6, "the run after a panic");
}

#[test]
fn one_thread_issues_every_device_share_and_join_where_streams_queue_their_work() {
    let seed = rand::random::<u64>();
    let t = 3;
    let want = single(seed, false, t);
    let (mut h, backend) = probe_harness(Kind::Queued, seed, t);
    assert!(
        backend.set_one_driver(true),
        "queued streams, stream-ordered communicator"
    );
    let probe = log(Kind::Queued);
    runs_reduce_through_the_communicator(Kind::Queued, &mut h, &backend, &want, seed);
    let threads = probe.threads.lock().clone();
    assert_eq!(
        threads,
        HashSet::from([std::thread::current().id()]),
        "every compute and join issued from the caller's thread"
    );
    assert_clean(Kind::Queued);
    a_failure_stops_the_run(&mut h, probe, &want);
    // Streams that compute in the call do not get one thread.
    let (_, ordered) = probe_harness(Kind::Ordered, seed, t);
    assert!(!ordered.set_one_driver(true));
}

#[test]
fn one_thread_records_a_program_and_replays_it_where_the_communicator_can_keep_the_work() {
    let seed = rand::random::<u64>();
    let t = 3;
    let (mut h, backend) = probe_harness(Kind::Recorded, seed, t);
    assert!(backend.set_one_driver(true));
    let probe = log(Kind::Recorded);
    // Each run on fresh inputs: a replay that ran nothing would return the run before's output.
    let issued = u64::from(backend_meta::record::RUNS_BEFORE_RECORDING);
    let runs = issued + 3;
    for run in 0..runs {
        let inputs = seed.wrapping_add(run);
        h.set_inputs(inputs);
        let e = nmse(&h.step(), &single_with_inputs(seed, inputs, false, t));
        assert!(e <= 1e-6, "seed {seed}, run {run}: nmse {e}");
    }
    let stats = backend.stats();
    assert_eq!(
        (
            stats.builds,
            stats.recordings,
            stats.replays,
            stats.refused_recordings
        ),
        (1, 1, 3, 0),
        "issued {issued} times, then recorded, then replayed: {stats:?}"
    );
    assert_eq!(probe.replays.load(Ordering::SeqCst), 3);
    assert!(stats.reductions >= runs * 4, "{stats:?}");
    assert_eq!(
        probe.reductions.load(Ordering::SeqCst) as u64,
        stats.reductions,
        "each run's reductions counted once, replayed or not"
    );
    assert_clean(Kind::Recorded);
    // Without one thread, or with recordings off, every run is issued call by call.
    backend.set_recording(false);
    h.step();
    assert_eq!(backend.stats().replays, 3);
    backend.set_recording(true);
    backend.set_one_driver(false);
    h.step();
    assert_eq!(backend.stats().replays, 3);
}

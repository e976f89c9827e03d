//! What the streams of one GPU's logical devices queue, kept as one CUDA graph ([`record`]): the
//! first stream captures, the others join its capture through an event recorded on it and rejoin it
//! before the capture ends, so that the graph holds every stream's launches and the same-GPU
//! AllReduces between them as dependencies. A replay launches that graph on the first stream
//! between the same joins: it follows what every stream queued before and precedes what they
//! queue after, as the calls it replaces did. While recording, the streams launch each `compute`
//! call's nodes straight into the capture (no graph of their own, no timing events).

use crate::comm::{gather_into_first, spread_from_first, stream_events};
use crate::memory::CaptureGuard;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::{sys, CudaEvent, CudaGraph};
use ggml_core::backend::Recording;
use ggml_core::Result;
use parking_lot::Mutex;
use std::sync::Arc;

/// Captures what `issue` queues on the streams of `backends` (logical devices of one GPU, one
/// context) into one CUDA graph; nothing of it runs. Err where `issue` failed or queued what a
/// capture cannot hold (a host wait), with the capture ended and the streams usable.
pub(crate) fn record(
    backends: &[Arc<CudaBackend>],
    issue: &mut dyn FnMut() -> Result<()>,
) -> Result<Box<dyn Recording>> {
    if backends.iter().any(|b| b.is_profiling()) {
        return Err(err("a profiled stream is not recorded"));
    }
    let events = stream_events(backends)?;
    let first = backends[0].stream();
    let _capturing = CaptureGuard::enter();
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    cu("begin capture", first.begin_capture(mode))?;
    let joined = spread_from_first(backends, &events);
    backends.iter().for_each(|b| b.set_recording(true));
    let issued = joined.and_then(|()| issue());
    backends.iter().for_each(|b| b.set_recording(false));
    let rejoined = gather_into_first(backends, &events);
    let captured = first.end_capture(sys::CUgraphInstantiate_flags(0));
    issued?;
    rejoined?;
    match cu("end capture", captured)? {
        Some(graph) => Ok(Box::new(CudaRecording {
            backends: backends.to_vec(),
            events,
            graph: Mutex::new(graph),
        })),
        None => Err(err("the capture kept no work")),
    }
}

/// A CUDA graph over the streams of `backends`, launched on the first.
struct CudaRecording {
    backends: Vec<Arc<CudaBackend>>,
    events: Vec<CudaEvent>,
    /// Launched under the lock: a graph runs as one instance at a time.
    graph: Mutex<CudaGraph>,
}

// SAFETY: the graph and the events are used only under the lock (a replay holds it throughout), in
// the one context of the streams they belong to; CUDA handles may be used from any thread.
unsafe impl Send for CudaRecording {}
unsafe impl Sync for CudaRecording {}

impl Recording for CudaRecording {
    fn replay(&self) -> Result<()> {
        let graph = self.graph.lock();
        gather_into_first(&self.backends, &self.events)?;
        cu("graph launch", graph.launch())?;
        spread_from_first(&self.backends, &self.events)
    }
}

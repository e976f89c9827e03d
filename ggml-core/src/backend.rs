//! The backend traits, one small trait per concept (after ggml-backend): a [`Device`] describes one
//! accelerator (or CPU share) and creates [`Backend`]s (streams) and [`BufferType`]s; a [`Buffer`] is a
//! block of device memory; an [`Event`] orders work between streams; a [`Communicator`] sums tensors
//! across the devices of one vendor (AllReduce).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{DataRef, TensorId};
use std::any::Any;
use std::sync::Arc;

/// Broad class of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    /// A composite device (the meta backend).
    Meta,
}

/// Free and total memory in bytes, and what this process holds in the backend's buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    pub free: usize,
    pub total: usize,
    /// Bytes of live buffers (weights, caches, compute and scratch) this process allocated on the
    /// device, where the backend counts them; `total - free` also holds the driver's and
    /// libraries' own memory (contexts, communicators).
    pub allocated: Option<usize>,
}

/// Optional capabilities of a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// `copy_async`/`set_async` return before the transfer completes.
    pub async_ops: bool,
    /// A host (pinned) buffer type is offered.
    pub host_buffer: bool,
    /// Events are real (not just synchronize calls).
    pub events: bool,
}

/// A block of memory owned by one device (or host memory).
///
/// Buffers hand out interior mutability: `set` and compute kernels write through shared references.
/// Ordering and exclusivity of accesses is the job of the scheduler and the streams, as in ggml.
pub trait Buffer: Send + Sync + Any {
    /// Bytes usable in the buffer.
    fn size(&self) -> usize;
    /// A name for messages (buffer type and device).
    fn name(&self) -> String;
    /// Host address of byte 0 when the memory is host-accessible.
    fn host_ptr(&self) -> Option<*mut u8>;
    /// Copies `data` to `offset`.
    fn set(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies `out.len()` bytes from `offset`.
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Fills `len` bytes at `offset` with `value`.
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()>;
    /// Writes `rows` rows of `row_len` bytes: row `r` goes from `data[r * src_stride..]` to
    /// `offset + r * dst_stride`.
    fn set_2d(
        &self,
        offset: usize,
        data: &[u8],
        rows: usize,
        row_len: usize,
        dst_stride: usize,
        src_stride: usize,
    ) -> Result<()> {
        check_2d(data.len(), rows, row_len, src_stride)?;
        for r in 0..rows {
            self.set(
                offset + r * dst_stride,
                &data[r * src_stride..r * src_stride + row_len],
            )?;
        }
        Ok(())
    }
    /// Reads `rows` rows of `row_len` bytes: row `r` comes from `offset + r * src_stride` and lands at
    /// `out[r * dst_stride..]`.
    fn get_2d(
        &self,
        offset: usize,
        out: &mut [u8],
        rows: usize,
        row_len: usize,
        src_stride: usize,
        dst_stride: usize,
    ) -> Result<()> {
        check_2d(out.len(), rows, row_len, dst_stride)?;
        for r in 0..rows {
            self.get(
                offset + r * src_stride,
                &mut out[r * dst_stride..r * dst_stride + row_len],
            )?;
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn Any;
}

/// Checks that `rows` rows of `row_len` bytes at `stride` fit in a host slice of `len` bytes.
pub fn check_2d(len: usize, rows: usize, row_len: usize, stride: usize) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let need = (rows - 1)
        .checked_mul(stride)
        .and_then(|v| v.checked_add(row_len));
    match need {
        Some(n) if n <= len && row_len <= stride.max(row_len) => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset: 0,
            len: need.unwrap_or(usize::MAX),
            size: len,
        }),
    }
}

/// Checks that `[offset, offset + len)` lies inside a buffer of `size` bytes.
pub fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfBounds { offset, len, size }),
    }
}

/// A kind of memory a device can allocate.
pub trait BufferType: Send + Sync {
    fn name(&self) -> String;
    /// Alignment of tensor offsets inside buffers of this type.
    fn alignment(&self) -> usize;
    /// Largest single allocation.
    fn max_size(&self) -> usize {
        usize::MAX
    }
    /// True for memory the host can address directly.
    fn is_host(&self) -> bool;
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>>;
}

/// A stream of work on one device.
pub trait Backend: Send + Sync {
    fn name(&self) -> String;
    fn device(&self) -> Arc<dyn Device>;
    /// Copies host bytes into `dst`. `data` is read before the call returns.
    fn set_async(&self, dst: &DataRef, data: &[u8]) -> Result<()> {
        dst.buffer.set(dst.offset, data)
    }
    /// Copies `out.len()` bytes from `src`; complete when the call returns.
    fn get_async(&self, src: &DataRef, out: &mut [u8]) -> Result<()> {
        self.synchronize()?;
        src.buffer.get(src.offset, out)
    }
    /// Copies `len` bytes between two buffers this stream can reach (its device's or host buffers).
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()>;
    /// Computes `nodes` of `graph` in order; layout ops are skipped.
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()>;
    /// Waits for all work queued on this stream.
    fn synchronize(&self) -> Result<()>;
    /// An event completed once the work queued so far is done.
    fn record_event(&self) -> Result<Arc<dyn Event>>;
    /// Makes later work on this stream wait for `event`.
    fn wait_event(&self, event: &dyn Event) -> Result<()>;
    /// Number of worker threads, where that applies.
    fn set_threads(&self, _n: usize) {}
    /// Runs `job`, a loop that issues work to this stream (a meta device's driver of this device), on
    /// the thread where issuing costs least, and returns when it has returned. A stream that computes
    /// on worker threads of its own (the CPU's) runs the job on one of them, so that each `compute`
    /// the job calls starts without handing work to another thread and waiting for it. The default
    /// runs the job on the calling thread.
    fn drive(&self, job: &mut (dyn FnMut() + Send)) {
        job()
    }
    /// True when `compute` only queues the work and returns before it is done (a GPU stream), so
    /// that one thread can issue the work of several such streams without waiting for any of them
    /// (a meta device's drivers under backend-meta's `GGML_TP_META_DRIVERS=one`).
    /// The default: false (the call computes).
    fn queues_work(&self) -> bool {
        false
    }
    /// Runs part of the work in flight on other streams of this stream's host on the calling
    /// thread, which would otherwise only wait (a meta device's driver that has finished its
    /// device's share of a stage while another device's share is still running); true when it ran
    /// any. A stream offers this only where results do not depend on which thread runs which part
    /// (the CPU's, whose ops are cut into indexed tasks). The default runs nothing.
    fn help(&self) -> bool {
        false
    }
}

/// A point in a stream's work.
pub trait Event: Send + Sync {
    fn synchronize(&self) -> Result<()>;
    fn is_done(&self) -> bool;
}

/// The event of a stream whose work is complete when it is queued (a synchronous stream): nothing
/// to wait for.
pub struct CompletedEvent;

impl Event for CompletedEvent {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_done(&self) -> bool {
        true
    }
}

/// One device: memory, capabilities, op support, streams.
pub trait Device: Send + Sync {
    /// Unique name, e.g. `cpu:0`, `cuda:1`.
    fn name(&self) -> String;
    fn description(&self) -> String;
    fn kind(&self) -> DeviceKind;
    /// The backend family, e.g. `cpu`, `cuda` (devices of one family can share a communicator).
    fn family(&self) -> &'static str;
    fn memory(&self) -> MemoryInfo;
    fn caps(&self) -> DeviceCaps;
    /// True when this device can compute `node` of `graph`.
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool;
    /// The type this device keeps weights of type `dtype` in, for rows of `ne0` elements: the
    /// file's type, or a layout of the same values that its kernels read faster (GPUs: the
    /// regrouped Q4_0 / Q8_0 of [`DType::grouped`], converted by [`crate::quant::regroup`]). The
    /// model loader asks before it uploads a weight.
    fn weight_dtype(&self, dtype: DType, _ne0: usize) -> DType {
        dtype
    }
    /// True when streams of this device can read and write `buffer` directly.
    fn can_access(&self, buffer: &dyn Buffer) -> bool;
    /// True when `buffer` was allocated from this device's memory (the scheduler runs nodes where their
    /// weights live, also when several devices can reach the same memory).
    fn owns(&self, _buffer: &dyn Buffer) -> bool {
        false
    }
    fn buffer_type(&self) -> Arc<dyn BufferType>;
    /// Pinned host memory for fast transfers, if any.
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        None
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>>;
    /// The runs of `nodes` (consecutive compute nodes of `graph` planned onto this device) that its
    /// streams compute as one launch, each in node order; nodes in no run are left out. The memory
    /// planner keeps every tensor such a run touches alive over the whole run, so that a fused
    /// kernel never finds a result placed over an operand it still reads. None by default.
    fn launch_groups(&self, _graph: &Graph, _nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
        Vec::new()
    }
}

/// Sums equally shaped tensors across the streams of one family, in place (AllReduce).
pub trait Communicator: Send + Sync {
    /// Number of participants.
    fn size(&self) -> usize;
    /// `data[i]` is on participant `i`; after the call every one holds the elementwise sum of all
    /// `count` elements of `dtype`.
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()>;
    /// Whether [`Communicator::all_reduce`] is ordered on the participants' streams: it starts only
    /// after the work already queued on each participant's backend, work queued later on those
    /// backends waits for it, and the call may return before the sum is complete. The caller then
    /// need not synchronize the participants around it. When `false` (the default), the caller
    /// synchronizes every participant before the call, and the sum is complete when it returns.
    fn is_stream_ordered(&self) -> bool {
        false
    }
    /// Where the family can keep the work queued on the participants' streams and queue it again
    /// as one unit ([`Recorder`]; a CUDA graph spanning the streams of one GPU's logical devices).
    /// None (the default) where it cannot.
    fn recorder(&self) -> Option<&dyn Recorder> {
        None
    }
}

/// Keeps the work that a stream-ordered [`Communicator`]'s participants queue (their backends'
/// `compute` calls and the communicator's `all_reduce` calls) so that it can be queued again as one
/// unit: one launch instead of a call per stage and per join.
pub trait Recorder: Send + Sync {
    /// Runs `issue`, which queues work on the participants' streams, and keeps that work instead of
    /// running it: nothing `issue` queued has run when this returns. Err where `issue` failed or
    /// queued something that cannot be kept (a host wait, a host read of device data); then
    /// nothing was kept or run either, and the streams are usable as before.
    fn record(&self, issue: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Recording>>;
}

/// Work kept by a [`Recorder`]. It names the memory the recorded calls named: a replay reads and
/// writes the same addresses, so it is valid while the recorded graphs' tensors keep their memory.
pub trait Recording: Send + Sync {
    /// Queues the kept work on the participants' streams again, ordered after the work queued
    /// on them before; returns before it runs.
    fn replay(&self) -> Result<()>;
}

//! `MetaDevice`: N devices of one family seen as one. Reports summed memory, the AND of capabilities,
//! supports an op only where every device does, allocates weights per device at slice size
//! ([`MetaDevice::alloc_tensor`]) and uses lazily committed host memory as its arena for graph
//! inputs and outputs.

use crate::buffer::MetaBuffer;
use crate::exec::{MetaBackend, MetaStats};
use crate::split::{segment, SplitError, SplitState};
use ggml_core::backend::{Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, MemoryInfo};
use ggml_core::host_buffer::HostBufferType;
use ggml_core::{Error, Graph, Layout, Result, TensorId};
use std::sync::{Arc, Weak};

/// How a model declares a weight's split when it creates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSplit {
    /// Whole on every device.
    Mirrored,
    /// Cut along `axis`; the axis is the concatenation of `(length, granularity)` segments, each cut
    /// separately (a fused QKV weight has three).
    Axis {
        axis: usize,
        segments: Vec<(usize, usize)>,
    },
    /// Cut along `axis` like [`WeightSplit::Axis`], but every segment with the same rotation, so
    /// that segments of as many units are cut alike: device by device they hold matching heads (a
    /// delta net's queries, keys and the value heads that read them).
    InStep {
        axis: usize,
        segments: Vec<(usize, usize)>,
    },
}

impl WeightSplit {
    /// One segment along `axis` cut in multiples of `granularity`.
    pub fn axis(axis: usize, len: usize, granularity: usize) -> WeightSplit {
        WeightSplit::Axis {
            axis,
            segments: vec![(len, granularity)],
        }
    }
}

/// Errors of building a meta device.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("a meta device needs at least one device")]
    Empty,
    #[error("a meta device needs devices of one family, got {0}")]
    MixedFamilies(String),
    #[error("a meta device needs distinct devices, {0} is given twice")]
    Duplicate(String),
    #[error("{n} devices but {m} tensor-split ratios")]
    RatioCount { n: usize, m: usize },
    #[error(transparent)]
    Split(#[from] SplitError),
    #[error("split of {name}: {msg}")]
    BadSplit { name: String, msg: String },
}

impl From<MetaError> for Error {
    fn from(e: MetaError) -> Error {
        Error::Other(e.to_string())
    }
}

/// One virtual device over several real ones.
pub struct MetaDevice {
    devices: Vec<Arc<dyn Device>>,
    ratios: Vec<f32>,
    family: &'static str,
    input_split: parking_lot::Mutex<Option<usize>>,
    reduce: parking_lot::Mutex<ReduceOptions>,
    /// The streams made by [`MetaDevice::new_meta_backend`] (for [`MetaDevice::stats`]).
    streams: parking_lot::Mutex<Vec<Weak<MetaBackend>>>,
    this: Weak<MetaDevice>,
}

/// How partial sums are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceOptions {
    /// Use the generic recursive-doubling AllReduce even when the family offers a communicator
    /// (default: `GGML_TP_META_GENERIC_REDUCE`, see [`crate::settings`]).
    pub generic: bool,
    /// Partial sums of at least this many bytes travel in BF16 in the generic AllReduce (default:
    /// `GGML_TP_ALLREDUCE_BF16_MIN_BYTES`, else never on CPU devices and 1 MiB elsewhere).
    pub bf16_min_bytes: usize,
}

impl ReduceOptions {
    /// Defaults for devices of `kind`. On CPU devices a "transfer" is a memory copy, where converting
    /// to BF16 costs more than it saves at every size (BENCHMARKS.md, `reduce_transport`), so partial
    /// sums stay F32 there unless `GGML_TP_ALLREDUCE_BF16_MIN_BYTES` says otherwise.
    pub fn for_kind(kind: DeviceKind) -> Self {
        let own = if kind == DeviceKind::Cpu {
            usize::MAX
        } else {
            1 << 20
        };
        ReduceOptions {
            generic: crate::settings::settings().generic_reduce,
            bf16_min_bytes: ggml_core::settings::settings()
                .allreduce_bf16_min_bytes
                .unwrap_or(own),
        }
    }
}

impl MetaDevice {
    /// A meta device over `devices` (one family) with tensor-split `ratios` (default: even).
    pub fn new(
        devices: Vec<Arc<dyn Device>>,
        ratios: Option<Vec<f32>>,
    ) -> std::result::Result<Arc<MetaDevice>, MetaError> {
        let first = devices.first().ok_or(MetaError::Empty)?;
        let family = first.family();
        let kind = first.kind();
        if devices.iter().any(|d| d.family() != family) {
            let names: Vec<String> = devices
                .iter()
                .map(|d| format!("{} ({})", d.name(), d.family()))
                .collect();
            return Err(MetaError::MixedFamilies(names.join(", ")));
        }
        if let Some((i, _)) = devices.iter().enumerate().find(|(i, d)| {
            devices[..*i]
                .iter()
                .any(|e| std::ptr::addr_eq(Arc::as_ptr(e), Arc::as_ptr(d)))
        }) {
            return Err(MetaError::Duplicate(devices[i].name()));
        }
        let ratios = ratios.unwrap_or_else(|| vec![1.0; devices.len()]);
        if ratios.len() != devices.len() {
            return Err(MetaError::RatioCount {
                n: devices.len(),
                m: ratios.len(),
            });
        }
        crate::split::split_sizes(0, 1, &ratios, 0)?;
        Ok(Arc::new_cyclic(|this| MetaDevice {
            devices,
            ratios,
            family,
            input_split: parking_lot::Mutex::new(None),
            reduce: parking_lot::Mutex::new(ReduceOptions::for_kind(kind)),
            streams: parking_lot::Mutex::new(Vec::new()),
            this: this.clone(),
        }))
    }

    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    pub fn ratios(&self) -> &[f32] {
        &self.ratios
    }

    /// Feeds graph inputs to the devices as slices along `axis` (where the input spans it), as if
    /// their producer had split them; `None` (the default) keeps inputs whole on every device. Used to
    /// drive every op's split rules with the conformance suite.
    pub fn set_input_split(&self, axis: Option<usize>) {
        *self.input_split.lock() = axis;
    }

    /// How streams created after this call join partial sums.
    pub fn set_reduce_options(&self, options: ReduceOptions) {
        *self.reduce.lock() = options;
    }

    pub fn reduce_options(&self) -> ReduceOptions {
        *self.reduce.lock()
    }

    pub(crate) fn input_split(&self) -> Option<usize> {
        *self.input_split.lock()
    }

    /// The split state of a weight declared with `spec`; `rotate` (the layer index) spreads the
    /// rounding remainder across layers.
    pub fn split_state(
        &self,
        layout: &Layout,
        spec: &WeightSplit,
        rotate: usize,
        name: &str,
    ) -> std::result::Result<SplitState, MetaError> {
        match spec {
            WeightSplit::Mirrored => Ok(SplitState::Mirrored),
            WeightSplit::Axis { axis, segments } | WeightSplit::InStep { axis, segments } => {
                // Successive segments of an axis split rotate their remainders on; in-step ones not.
                let step = usize::from(matches!(spec, WeightSplit::Axis { .. }));
                let bad = |msg: String| MetaError::BadSplit {
                    name: name.to_string(),
                    msg,
                };
                if *axis > 3 {
                    return Err(bad(format!("axis {axis}")));
                }
                let total: usize = segments.iter().map(|s| s.0).sum();
                if total != layout.ne[*axis] {
                    return Err(bad(format!(
                        "segments sum to {total}, axis {axis} has {}",
                        layout.ne[*axis]
                    )));
                }
                let block = if *axis == 0 {
                    layout.dtype.block_size()
                } else {
                    1
                };
                let segs = segments
                    .iter()
                    .enumerate()
                    .map(|(i, &(len, g))| {
                        segment(len, lcm(g.max(1), block), &self.ratios, rotate + i * step)
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok(SplitState::Split {
                    axis: *axis,
                    segments: segs,
                })
            }
        }
    }

    /// The type the devices keep a weight of `layout` split as `spec` in: the type every device
    /// asks for ([`Device::weight_dtype`]) for the rows it holds, where that layout cuts exactly as
    /// the file's type does (a regrouped layout's cuts along the rows fall on whole groups);
    /// else the file's type.
    pub fn split_weight_dtype(
        &self,
        layout: &Layout,
        spec: &WeightSplit,
        rotate: usize,
        name: &str,
    ) -> Result<ggml_core::DType> {
        let file = self.split_state(layout, spec, rotate, name)?;
        let local_ne0 = |d: usize| file.local_shape(layout.ne, d)[0];
        let want = self.devices[0].weight_dtype(layout.dtype, local_ne0(0));
        let agreed = self
            .devices
            .iter()
            .enumerate()
            .all(|(d, dev)| dev.weight_dtype(layout.dtype, local_ne0(d)) == want);
        if want == layout.dtype || !agreed || want.row_size(layout.ne[0]).is_none() {
            return Ok(layout.dtype);
        }
        let target = Layout::contiguous(want, layout.ne);
        let cuts_alike = self
            .split_state(&target, spec, rotate, name)
            .is_ok_and(|t| t == file);
        Ok(if cuts_alike { want } else { layout.dtype })
    }

    /// Allocates a weight (or cache) tensor split as declared: one buffer per device at slice size.
    pub fn alloc_tensor(
        &self,
        layout: Layout,
        spec: &WeightSplit,
        rotate: usize,
        name: &str,
    ) -> Result<Arc<MetaBuffer>> {
        let state = self.split_state(&layout, spec, rotate, name)?;
        let parts = self
            .devices
            .iter()
            .enumerate()
            .map(|(d, dev)| {
                dev.buffer_type().alloc(
                    Layout::contiguous(layout.dtype, state.local_shape(layout.ne, d)).nbytes(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(MetaBuffer::new(
            layout,
            state,
            parts,
            name.to_string(),
        )?))
    }

    /// A typed stream on this meta device.
    pub fn new_meta_backend(&self) -> Result<Arc<MetaBackend>> {
        let me = self
            .this
            .upgrade()
            .ok_or_else(|| Error::Other("meta device dropped".into()))?;
        let stream = Arc::new(MetaBackend::new(me)?);
        let mut streams = self.streams.lock();
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(&stream));
        Ok(stream)
    }

    /// The counters of every stream of this device still alive, summed (a model's session holds
    /// its stream behind the scheduler).
    pub fn stats(&self) -> MetaStats {
        self.streams
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .fold(MetaStats::default(), |sum, s| sum.plus(&s.stats()))
    }
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

impl Device for MetaDevice {
    fn name(&self) -> String {
        let names: Vec<String> = self.devices.iter().map(|d| d.name()).collect();
        format!("meta({})", names.join(","))
    }
    fn description(&self) -> String {
        format!(
            "{} devices of family {}, ratios {:?}",
            self.devices.len(),
            self.family,
            self.ratios
        )
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Meta
    }
    fn family(&self) -> &'static str {
        "meta"
    }
    fn memory(&self) -> MemoryInfo {
        self.devices
            .iter()
            .map(|d| d.memory())
            .fold(MemoryInfo::default(), |a, m| MemoryInfo {
                free: a.free + m.free,
                total: a.total + m.total,
                allocated: match (a.allocated, m.allocated) {
                    (Some(x), Some(y)) => Some(x + y),
                    (x, y) => x.or(y),
                },
            })
    }
    fn caps(&self) -> DeviceCaps {
        self.devices.iter().map(|d| d.caps()).fold(
            DeviceCaps {
                async_ops: true,
                host_buffer: true,
                events: true,
            },
            |a, c| DeviceCaps {
                async_ops: a.async_ops && c.async_ops,
                host_buffer: a.host_buffer && c.host_buffer,
                events: a.events && c.events,
            },
        )
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        self.devices.iter().all(|d| d.supports_op(graph, node))
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        buffer.as_any().is::<MetaBuffer>() || buffer.host_ptr().is_some()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(HostBufferType)
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        let first = self.devices[0].host_buffer_type()?;
        let name = first.name();
        self.devices
            .iter()
            .all(|d| d.host_buffer_type().is_some_and(|b| b.name() == name))
            .then_some(first)
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(self.new_meta_backend()?)
    }
}

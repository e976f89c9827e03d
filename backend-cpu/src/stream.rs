//! [`CpuBackend`]: the stream of a CPU device. Work runs synchronously inside the device's thread
//! pool, so `synchronize` has nothing to wait for and events are complete when recorded; a driver loop
//! ([`Backend::drive`]) runs on a thread of that pool, so its computes start there without a hand-over.
//! A compute issued from a worker of another CPU device's pool runs on that worker's pool: the CPU
//! devices share one host, so a meta device's driver can take over another device's share of a
//! stage (when that device's thread is not running) without handing it to a thread that is busy,
//! and a driver waiting for another device's share helps run its ops ([`Backend::help`]).

use crate::device::{build_pool, on_device_worker, CpuDevice};
use crate::kernels::{self, NodeViews};
use crate::team::Team;
use crate::view::TView;
use ggml_core::{Backend, DataRef, Device, Error, Event, Graph, Op, Result, TensorId};
use parking_lot::RwLock;
use rayon::ThreadPool;
use std::sync::Arc;

/// An event of a synchronous stream: always complete.
pub struct CpuEvent;

impl Event for CpuEvent {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_done(&self) -> bool {
        true
    }
}

/// A stream on one CPU device.
pub struct CpuBackend {
    device: Arc<CpuDevice>,
    pool: RwLock<Arc<ThreadPool>>,
    /// The fork-join of this stream's computes, as many threads as the pool.
    team: RwLock<Arc<Team>>,
}

impl CpuBackend {
    pub fn new(device: Arc<CpuDevice>) -> Self {
        let pool = device.pool();
        let team = RwLock::new(Arc::new(Team::new(
            &device.name(),
            pool.current_num_threads(),
        )));
        CpuBackend {
            device,
            pool: RwLock::new(pool),
            team,
        }
    }
}

/// The host view of tensor `id`: its data pointer (bounds-checked against its buffer) and layout.
pub fn host_view(graph: &Graph, id: TensorId) -> Result<TView> {
    let t = graph.tensor(id);
    let data = graph.data(id)?;
    let base = data.buffer.host_ptr().ok_or_else(|| Error::Backend {
        backend: "cpu".into(),
        msg: format!(
            "tensor {} lives in non-host buffer {}",
            t.name,
            data.buffer.name()
        ),
    })?;
    let end = data.offset.checked_add(t.nbytes());
    if end.is_none_or(|e| e > data.buffer.size()) {
        return Err(Error::OutOfBounds {
            offset: data.offset,
            len: t.nbytes(),
            size: data.buffer.size(),
        });
    }
    Ok(TView::new(base.wrapping_add(data.offset), t.layout))
}

/// Whether `node` launches nothing: views, leaves and empty tensors.
fn is_skipped(graph: &Graph, node: TensorId) -> bool {
    let t = graph.tensor(node);
    t.op.is_view() || t.is_leaf() || t.nelements() == 0
}

/// Most products [`product_group`] runs together.
const MAX_GROUP: usize = 4;

/// How many of `nodes` (non-skipped, in order), from the first, are adjacent products of one
/// activation with quantized weights of one type (a layer's q, k and v; gate and up: the model
/// builder puts them next to each other), which [`crate::matmul::mul_mat_group`] runs as one
/// call; 1 when the first node starts no such group. Quantized weights read their activations
/// from a quantized copy, so no product's result can overwrite what another still reads.
fn product_group(graph: &Graph, nodes: &[TensorId]) -> usize {
    let product = |n: TensorId| {
        let t = graph.tensor(n);
        let wt = graph.tensor(*t.src.first()?).dtype();
        (t.op == Op::MulMat
            && t.src.len() == 2
            && wt.is_quantized()
            && kernels::supports(
                &t.op,
                &[graph.layout(t.src[0]), graph.layout(t.src[1])],
                &t.layout,
            ))
        .then(|| (t.src[0], t.src[1], wt))
    };
    let Some((_, b, wt)) = nodes.first().and_then(|&n| product(n)) else {
        return 1;
    };
    let mut len = 1;
    while len < nodes.len().min(MAX_GROUP) {
        match product(nodes[len]) {
            Some((a, nb, nwt)) if nb == b && nwt == wt && !nodes[..len].contains(&a) => len += 1,
            _ => break,
        }
    }
    len
}

/// Runs the products `nodes` (a [`product_group`], whose kernels the CPU has) as one
/// [`crate::matmul::mul_mat_group`].
fn compute_products(graph: &Graph, nodes: &[TensorId]) -> Result<()> {
    let b = host_view(graph, graph.tensor(nodes[0]).src[1])?;
    let products = nodes
        .iter()
        .map(|&n| {
            Ok((
                host_view(graph, graph.tensor(n).src[0])?,
                host_view(graph, n)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    crate::matmul::mul_mat_group(&products, &b)
}

/// Computes `nodes` of `graph` in order on the current thread (kernels split their rows among the
/// threads of the current team or pool, see [`crate::team::par_tasks`]; adjacent products of one
/// activation as one call, see [`product_group`]).
fn compute_nodes(graph: &Graph, nodes: &[TensorId]) -> Result<()> {
    let live: Vec<TensorId> = nodes
        .iter()
        .copied()
        .filter(|&n| !is_skipped(graph, n))
        .collect();
    let mut i = 0;
    while i < live.len() {
        let group = product_group(graph, &live[i..]);
        if group > 1 {
            compute_products(graph, &live[i..i + group])?;
            i += group;
            continue;
        }
        let node = live[i];
        i += 1;
        let t = graph.tensor(node);
        let views = NodeViews {
            dst: host_view(graph, node)?,
            src: t
                .src
                .iter()
                .map(|&s| host_view(graph, s))
                .collect::<Result<_>>()?,
        };
        kernels::compute_node(graph, node, &views).map_err(|e| match e {
            Error::UnsupportedOp { op, backend } => Error::UnsupportedOp {
                op: format!("{op} at node {}", t.name),
                backend,
            },
            other => other,
        })?;
    }
    Ok(())
}

fn host_slice_err(what: &str) -> Error {
    Error::Backend {
        backend: "cpu".into(),
        msg: format!("copy_async: {what}"),
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        ggml_core::backend::check_range(src.offset, len, src.buffer.size())?;
        ggml_core::backend::check_range(dst.offset, len, dst.buffer.size())?;
        match (src.host_ptr(), dst.host_ptr()) {
            // SAFETY: both ranges are checked to lie in their buffers; `copy` allows overlap.
            (Some(s), Some(d)) => unsafe { std::ptr::copy(s, d, len) },
            // SAFETY: the source range lies in its host buffer.
            (Some(s), None) => dst
                .buffer
                .set(dst.offset, unsafe { std::slice::from_raw_parts(s, len) })?,
            // SAFETY: the destination range lies in its host buffer.
            (None, Some(d)) => src.buffer.get(src.offset, unsafe {
                std::slice::from_raw_parts_mut(d, len)
            })?,
            (None, None) => return Err(host_slice_err("neither buffer is host memory")),
        }
        Ok(())
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        // One hand-over to the pool for the whole node list; kernels then split their rows among
        // this thread and the team's spinning helpers, one atomic hand-over per node. On a device
        // worker (this device's or another's) the nodes run where they are.
        let team = self.team.read().clone();
        if on_device_worker() || team.helpers() > 0 {
            return team.compute(|| compute_nodes(graph, nodes));
        }
        let pool = self.pool.read().clone();
        pool.install(|| compute_nodes(graph, nodes))
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(CpuEvent))
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
    fn set_threads(&self, n: usize) {
        if let Ok(pool) = build_pool(&self.device.name(), n) {
            *self.team.write() =
                Arc::new(Team::new(&self.device.name(), pool.current_num_threads()));
            *self.pool.write() = pool;
        }
    }
    fn drive(&self, job: &mut (dyn FnMut() + Send)) {
        // On a thread of the pool, every `compute` of the job runs its kernels in place.
        let pool = self.pool.read().clone();
        pool.install(job)
    }
    fn help(&self) -> bool {
        // Any CPU stream's open op: the CPU devices share the host, and a team's tasks are
        // indexed, so which thread runs them changes no result.
        crate::team::help()
    }
}

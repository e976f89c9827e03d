//! Building a schedule: backend assignment per node, cross-backend copies, splits, lifetimes and
//! memory placement. The result is replayed on graphs of the same structure.

use super::memplan::{self, Lifetime};
use super::MemoryReport;
use crate::backend::{BufferType, Device};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{Tensor, TensorFlags, TensorId, ViewOf};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A run of consecutive nodes on one backend, with the copies that must land before it starts.
#[derive(Clone, Debug)]
pub(crate) struct Split {
    pub backend: usize,
    pub nodes: Vec<TensorId>,
    /// (source, destination) tensors; the destination lives on this split's backend.
    pub copies: Vec<(TensorId, TensorId)>,
}

pub(crate) struct Plan {
    pub key: u64,
    pub n_tensors_before: usize,
    /// Tensors the plan appends to the graph (copies and views of copies), in order.
    added: Vec<Tensor>,
    /// (node, source slot, replacement) rewrites pointing nodes at copies.
    rewrites: Vec<(TensorId, usize, TensorId)>,
    /// (tensor, backend, offset) in that backend's compute buffer.
    pub placements: Vec<(TensorId, usize, usize)>,
    pub splits: Vec<Split>,
    pub buffer_sizes: Vec<usize>,
    pub memory: Vec<MemoryReport>,
}

impl Plan {
    /// Appends the plan's extra tensors and rewrites sources on a graph of the planned structure.
    pub fn apply(&self, graph: &mut Graph) {
        for t in &self.added {
            graph.push_tensor(t.clone());
        }
        for &(node, slot, to) in &self.rewrites {
            graph.tensor_mut(node).src[slot] = to;
        }
    }
}

/// A hash of a graph's structure: everything a plan depends on: ops, parameters, layouts, sources, views, flags and which
/// buffer each bound tensor uses.
pub fn structure_key(graph: &Graph) -> u64 {
    let mut h = DefaultHasher::new();
    graph.len().hash(&mut h);
    graph.nodes().hash(&mut h);
    for t in graph.tensors() {
        t.op.hash(&mut h);
        t.layout.hash(&mut h);
        t.src.hash(&mut h);
        t.view.hash(&mut h);
        t.flags.hash(&mut h);
        match &t.data {
            Some(d) => (Arc::as_ptr(&d.buffer) as *const u8 as usize, d.offset).hash(&mut h),
            None => 0usize.hash(&mut h),
        }
    }
    h.finish()
}

/// Where a root tensor's memory is: a bound buffer, or a compute buffer of a backend.
#[derive(Clone, Copy, PartialEq)]
enum Home {
    Bound,
    Backend(usize),
}

/// Plans `graph` on `devices` (with their compute buffer types `bufts`): a backend per node, copies
/// where a backend cannot reach a source, the splits, and every unbound root's place in memory.
pub(crate) fn build(
    graph: &mut Graph,
    devices: &[Arc<dyn Device>],
    bufts: &[Arc<dyn BufferType>],
    key: u64,
) -> Result<Plan> {
    let n_tensors_before = graph.len();
    let compute: Vec<TensorId> = graph
        .nodes()
        .iter()
        .copied()
        .filter(|&n| !graph.tensor(n).op.is_view())
        .collect();
    let assignment = assign(graph, devices, &compute)?;
    let mut home = homes(graph, &compute, &assignment);
    let copies = insert_copies(graph, devices, bufts, &compute, &assignment, &mut home);
    let spans = launch_spans(graph, devices, &compute, &copies.splits);
    let per_backend = backend_lifetimes(graph, &compute, &copies, &spans, &mut home, devices.len());
    let placed = place(devices, bufts, &per_backend)?;
    Ok(Plan {
        key,
        n_tensors_before,
        added: copies.added,
        rewrites: copies.rewrites,
        placements: placed.placements,
        splits: copies.splits,
        buffer_sizes: placed.buffer_sizes,
        memory: placed.memory,
    })
}

/// Homes of roots: bound data, the backend of the producing node, or (inputs) of the first consumer.
fn homes(graph: &Graph, compute: &[TensorId], assignment: &[usize]) -> HashMap<TensorId, Home> {
    let mut home: HashMap<TensorId, Home> = HashMap::new();
    for (i, &n) in compute.iter().enumerate() {
        let t = graph.tensor(n);
        if t.view.is_none() {
            home.insert(n, Home::Backend(assignment[i]));
        }
        for &s in &t.src {
            let root = graph.storage_of(s).root;
            let rt = graph.tensor(root);
            let h = if rt.data.is_some() {
                Home::Bound
            } else {
                Home::Backend(assignment[i])
            };
            home.entry(root).or_insert(h);
        }
    }
    home
}

/// The copies and splits of a graph.
struct Copies {
    /// Tensors appended to the graph (copies and views of copies), in order.
    added: Vec<Tensor>,
    /// (node, source slot, replacement) rewrites pointing nodes at copies.
    rewrites: Vec<(TensorId, usize, TensorId)>,
    splits: Vec<Split>,
    /// The step (compute index) at which each copy lands: the first of its split.
    copy_step: HashMap<TensorId, usize>,
}

/// Cuts the compute order into splits (runs of one backend) and adds a copy wherever a node's
/// backend cannot reach a source, pointing the node at it.
fn insert_copies(
    graph: &mut Graph,
    devices: &[Arc<dyn Device>],
    bufts: &[Arc<dyn BufferType>],
    compute: &[TensorId],
    assignment: &[usize],
    home: &mut HashMap<TensorId, Home>,
) -> Copies {
    let mut added: Vec<Tensor> = Vec::new();
    let mut rewrites = Vec::new();
    let mut copy_of: HashMap<(TensorId, usize), TensorId> = HashMap::new();
    let mut splits: Vec<Split> = Vec::new();
    let mut split_first_step: Vec<usize> = Vec::new();
    let mut copy_step: HashMap<TensorId, usize> = HashMap::new();
    for (i, &n) in compute.iter().enumerate() {
        let b = assignment[i];
        if splits.last().is_none_or(|s| s.backend != b) {
            splits.push(Split {
                backend: b,
                nodes: Vec::new(),
                copies: Vec::new(),
            });
            split_first_step.push(i);
        }
        let srcs = graph.tensor(n).src.clone();
        for (slot, &s) in srcs.iter().enumerate() {
            let ViewOf { root, .. } = graph.storage_of(s);
            let reachable = match home[&root] {
                Home::Bound => {
                    let d = graph
                        .tensor(root)
                        .data
                        .as_ref()
                        .expect("bound root has data");
                    devices[b].can_access(d.buffer.as_ref())
                }
                Home::Backend(c) => c == b || (bufts[c].is_host() && bufts[b].is_host()),
            };
            if reachable {
                continue;
            }
            let copy = match copy_of.get(&(root, b)) {
                Some(&c) => c,
                None => {
                    let r = graph.tensor(root);
                    let t = Tensor {
                        name: format!("{}#copy{}", r.name, b),
                        layout: r.layout,
                        op: crate::op::Op::None,
                        src: vec![],
                        view: None,
                        flags: TensorFlags::default(),
                        data: None,
                    };
                    added.push(t.clone());
                    let c = graph.push_tensor(t);
                    copy_of.insert((root, b), c);
                    home.insert(c, Home::Backend(b));
                    copy_step.insert(c, *split_first_step.last().expect("split exists"));
                    splits
                        .last_mut()
                        .expect("split exists")
                        .copies
                        .push((root, c));
                    c
                }
            };
            let replacement = if s == root {
                copy
            } else {
                let mut v = graph.tensor(s).clone();
                let off = graph.storage_of(s).offset;
                v.view = Some(ViewOf {
                    root: copy,
                    offset: off,
                });
                v.src = vec![copy];
                v.data = None;
                added.push(v.clone());
                graph.push_tensor(v)
            };
            graph.tensor_mut(n).src[slot] = replacement;
            rewrites.push((n, slot, replacement));
        }
        splits.last_mut().expect("split exists").nodes.push(n);
    }
    Copies {
        added,
        rewrites,
        splits,
        copy_step,
    }
}

/// The steps (first, last) of the compute order over which each node of a device's
/// [`Device::launch_groups`] runs: those of its whole group.
fn launch_spans(
    graph: &Graph,
    devices: &[Arc<dyn Device>],
    compute: &[TensorId],
    splits: &[Split],
) -> HashMap<TensorId, (usize, usize)> {
    let step: HashMap<TensorId, usize> = compute.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut spans = HashMap::new();
    for split in splits {
        for group in devices[split.backend].launch_groups(graph, &split.nodes) {
            let steps = group.iter().filter_map(|n| step.get(n).copied());
            let (Some(first), Some(last)) = (steps.clone().min(), steps.max()) else {
                continue;
            };
            if first < last {
                spans.extend(group.iter().map(|&n| (n, (first, last))));
            }
        }
    }
    spans
}

/// Lifetimes of every unbound root, in steps of the compute order, grouped by the backend whose
/// compute buffer holds it (inputs live from the first step, outputs to the last); a node of a
/// launch group (`spans`) touches its tensors over the whole group.
fn backend_lifetimes(
    graph: &Graph,
    compute: &[TensorId],
    copies: &Copies,
    spans: &HashMap<TensorId, (usize, usize)>,
    home: &mut HashMap<TensorId, Home>,
    n_backends: usize,
) -> Vec<Vec<(TensorId, Lifetime)>> {
    let mut life: HashMap<TensorId, (usize, usize)> = HashMap::new();
    let last_step = compute.len().saturating_sub(1);
    let touch = |root: TensorId, step: usize, life: &mut HashMap<TensorId, (usize, usize)>| {
        let e = life.entry(root).or_insert((step, step));
        e.0 = e.0.min(step);
        e.1 = e.1.max(step);
    };
    for (i, &n) in compute.iter().enumerate() {
        let t = graph.tensor(n);
        let (first, last) = spans.get(&n).copied().unwrap_or((i, i));
        for root in std::iter::once(n).chain(t.src.iter().copied()) {
            let root = graph.storage_of(root).root;
            touch(root, first, &mut life);
            touch(root, last, &mut life);
        }
        if t.flags.output {
            // An output that is a view keeps its root alive to the end.
            touch(graph.storage_of(n).root, last_step.max(i), &mut life);
        }
    }
    for split in &copies.splits {
        for &(from, to) in &split.copies {
            let step = copies.copy_step[&to];
            touch(from, step, &mut life);
            touch(to, step, &mut life);
        }
    }
    // Inputs and outputs that no computed node touches still need memory (the caller writes or reads
    // them directly); they live on the first backend for the whole graph.
    for (i, t) in graph.tensors().iter().enumerate() {
        let id = TensorId(i as u32);
        if t.data.is_none()
            && t.view.is_none()
            && (t.flags.input || t.flags.output)
            && !life.contains_key(&id)
        {
            life.insert(id, (0, last_step));
            home.entry(id).or_insert(Home::Backend(0));
        }
    }
    let mut per_backend: Vec<Vec<(TensorId, Lifetime)>> = vec![Vec::new(); n_backends];
    let mut roots: Vec<TensorId> = life.keys().copied().collect();
    roots.sort();
    for root in roots {
        let t = graph.tensor(root);
        if t.data.is_some() || t.view.is_some() {
            continue;
        }
        let Home::Backend(b) = home[&root] else {
            continue;
        };
        let (mut first, mut last) = life[&root];
        if t.flags.input {
            first = 0;
        }
        if t.flags.output {
            last = last_step.max(last);
        }
        let size = t.nbytes();
        per_backend[b].push((root, Lifetime { size, first, last }));
    }
    per_backend
}

/// Where the roots of each backend go in its compute buffer.
struct Placed {
    /// (tensor, backend, offset) in that backend's compute buffer.
    placements: Vec<(TensorId, usize, usize)>,
    buffer_sizes: Vec<usize>,
    memory: Vec<MemoryReport>,
}

/// Places each backend's roots by their lifetimes; an error where a buffer would exceed its type's
/// largest size.
fn place(
    devices: &[Arc<dyn Device>],
    bufts: &[Arc<dyn BufferType>],
    per_backend: &[Vec<(TensorId, Lifetime)>],
) -> Result<Placed> {
    let mut placements = Vec::new();
    let mut buffer_sizes = vec![0usize; devices.len()];
    let mut memory = Vec::new();
    for (b, items) in per_backend.iter().enumerate() {
        let lifetimes: Vec<Lifetime> = items.iter().map(|x| x.1).collect();
        let align = bufts[b].alignment();
        let (offsets, total) = memplan::place(&lifetimes, align);
        if total > bufts[b].max_size() {
            return Err(Error::OutOfMemory {
                device: devices[b].name(),
                requested: total,
                available: bufts[b].max_size(),
            });
        }
        for (k, &(t, _)) in items.iter().enumerate() {
            placements.push((t, b, offsets[k]));
        }
        buffer_sizes[b] = total;
        memory.push(MemoryReport {
            backend: devices[b].name(),
            planned: total,
            lower_bound: memplan::lower_bound(&lifetimes, align),
        });
    }
    Ok(Placed {
        placements,
        buffer_sizes,
        memory,
    })
}

/// Picks a backend per compute node: where an in-place destination or a device-resident weight lives,
/// else the previous node's backend, else the first backend that supports the op.
fn assign(graph: &Graph, devices: &[Arc<dyn Device>], compute: &[TensorId]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(compute.len());
    let mut previous: Option<usize> = None;
    for &n in compute {
        let supported: Vec<usize> = (0..devices.len())
            .filter(|&b| devices[b].supports_op(graph, n))
            .collect();
        let t = graph.tensor(n);
        if supported.is_empty() {
            let srcs: Vec<String> = t
                .src
                .iter()
                .map(|&s| format!("{}{:?}", graph.tensor(s).dtype(), graph.tensor(s).ne()))
                .collect();
            let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
            return Err(Error::UnsupportedOp {
                op: format!(
                    "{} ({}) of sources [{}]",
                    t.op.name(),
                    t.name,
                    srcs.join(", ")
                ),
                backend: names.join(", "),
            });
        }
        let bound_home = |id: TensorId| -> Option<usize> {
            let root = graph.storage_of(id).root;
            let d = graph.tensor(root).data.as_ref()?;
            let owner = supported
                .iter()
                .copied()
                .find(|&b| devices[b].owns(d.buffer.as_ref()));
            if owner.is_some() || d.buffer.host_ptr().is_some() {
                return owner;
            }
            supported
                .iter()
                .copied()
                .find(|&b| devices[b].can_access(d.buffer.as_ref()))
        };
        let choice = if t.view.is_some() {
            bound_home(n)
        } else {
            None
        }
        .or_else(|| {
            t.src
                .iter()
                .filter(|&&s| graph.tensor(graph.storage_of(s).root).flags.weight)
                .find_map(|&s| bound_home(s))
        })
        .or_else(|| previous.filter(|p| supported.contains(p)))
        .unwrap_or(supported[0]);
        out.push(choice);
        previous = Some(choice);
    }
    Ok(out)
}

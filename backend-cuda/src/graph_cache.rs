//! CUDA graph capture and replay of [`CudaBackend::compute`](crate::CudaBackend) calls. Each call
//! gets a key: a hash of every launched node's op with its parameters, its layout and device
//! address, and the layouts and device addresses of its sources, which is everything the kernel
//! launches depend on. The first sighting of a key runs eagerly (so one-off graphs cost nothing and
//! scratch memory reaches its size), the second is captured into a CUDA graph and launched, later
//! ones replay it. A captured graph keeps the scratch buffers it uses alive; a capture that fails
//! (a launch that cannot be captured) marks the key eager for good. `GGML_TP_CUDA_GRAPHS=0` turns
//! capture off. Keys are remembered per graph state ([`GraphStamp`]) and node list, and so are the
//! runs a call is cut into ([`GraphCache::runs_of`]), so a graph computed again unchanged (every
//! decode step of one cache-length step) is neither hashed nor matched for fusions again.

use crate::memory::CudaBuffer;
use cudarc::driver::CudaGraph;
use ggml_core::{Graph, GraphStamp, TensorId};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

/// Most keys remembered (captured or not); the least recently used is forgotten beyond.
const MAX_ENTRIES: usize = 256;

/// Most remembered keys of graph states; all are forgotten beyond.
const MAX_MEMO: usize = 1024;

/// Counters of a backend's graph cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Calls launched node by node (first sightings, uncapturable keys, graphs off).
    pub eager: u64,
    /// Graphs captured and instantiated.
    pub captures: u64,
    /// Launches of a captured graph (the capturing call's own launch included).
    pub replays: u64,
    /// Captures that failed, after which the key runs eagerly.
    pub failed_captures: u64,
}

/// What to do with one `compute` call.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Eager,
    Capture,
    Replay,
}

enum State {
    Seen,
    Captured {
        graph: CudaGraph,
        _scratch: Vec<Arc<CudaBuffer>>,
    },
    Uncapturable,
}

struct Entry {
    state: State,
    last_use: u64,
}

/// The captured graphs of one stream.
pub struct GraphCache {
    enabled: bool,
    entries: HashMap<u64, Entry>,
    /// [`key`] of a graph state and a node list (by the hash of its ids).
    memo: HashMap<(GraphStamp, u64), Option<(u64, usize)>>,
    /// [`runs`] of a graph state and a node list, as index ranges of the list.
    runs_memo: HashMap<(GraphStamp, u64), Vec<Range<usize>>>,
    tick: u64,
    stats: GraphStats,
}

// SAFETY: the graphs are only touched under the owning backend's mutex.
unsafe impl Send for GraphCache {}

impl GraphCache {
    pub fn new(enabled: bool) -> Self {
        GraphCache {
            enabled,
            entries: HashMap::new(),
            memo: HashMap::new(),
            runs_memo: HashMap::new(),
            tick: 0,
            stats: GraphStats::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns capture on or off; turning it off drops every graph.
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.entries.clear();
        }
    }

    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// [`key`] of computing `nodes` of `graph`, remembered for the graph's current state.
    pub fn key_of(&mut self, graph: &Graph, nodes: &[TensorId]) -> Option<(u64, usize)> {
        let memo_key = state_key(graph, nodes);
        if let Some(&k) = self.memo.get(&memo_key) {
            return k;
        }
        if self.memo.len() >= MAX_MEMO {
            self.memo.clear();
        }
        let k = key(graph, nodes);
        self.memo.insert(memo_key, k);
        k
    }

    /// [`runs`] of `nodes` of `graph` (of at most `per_graph` launches each) as index ranges of
    /// `nodes`, remembered for the graph's current state.
    pub fn runs_of(
        &mut self,
        graph: &Graph,
        nodes: &[TensorId],
        per_graph: usize,
    ) -> Vec<Range<usize>> {
        let memo_key = state_key(graph, nodes);
        if let Some(r) = self.runs_memo.get(&memo_key) {
            return r.clone();
        }
        if self.runs_memo.len() >= MAX_MEMO {
            self.runs_memo.clear();
        }
        let mut start = 0;
        let ranges: Vec<Range<usize>> = runs(graph, nodes, per_graph)
            .iter()
            .map(|r| {
                start += r.len();
                start - r.len()..start
            })
            .collect();
        self.runs_memo.insert(memo_key, ranges.clone());
        ranges
    }

    /// Decides how to run the call of `key` and counts a sighting of it.
    pub fn plan(&mut self, key: u64) -> Plan {
        self.tick += 1;
        let tick = self.tick;
        let plan = match self.entries.get_mut(&key) {
            Some(e) => {
                e.last_use = tick;
                match e.state {
                    State::Seen => Plan::Capture,
                    State::Captured { .. } => Plan::Replay,
                    State::Uncapturable => Plan::Eager,
                }
            }
            None => {
                self.forget_oldest_if_full();
                self.entries.insert(
                    key,
                    Entry {
                        state: State::Seen,
                        last_use: tick,
                    },
                );
                Plan::Eager
            }
        };
        if plan == Plan::Eager {
            self.stats.eager += 1;
        }
        plan
    }

    fn forget_oldest_if_full(&mut self) {
        if self.entries.len() < MAX_ENTRIES {
            return;
        }
        if let Some(oldest) = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.last_use)
            .map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
    }

    /// Launches the graph captured for `key` (after [`Plan::Replay`]).
    pub fn replay(&mut self, key: u64) -> ggml_core::Result<()> {
        match self.entries.get(&key).map(|e| &e.state) {
            Some(State::Captured { graph, .. }) => {
                crate::cu("cuGraphLaunch", graph.launch())?;
                self.stats.replays += 1;
                Ok(())
            }
            _ => Err(crate::err("graph cache: no graph captured for this key")),
        }
    }

    /// Keeps the graph captured for `key` and the scratch buffers its launches use.
    pub fn store(&mut self, key: u64, graph: CudaGraph, scratch: Vec<Arc<CudaBuffer>>) {
        self.stats.captures += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            e.state = State::Captured {
                graph,
                _scratch: scratch,
            };
        }
    }

    /// Marks `key` as one that runs eagerly from now on.
    pub fn capture_failed(&mut self, key: u64) {
        self.stats.failed_captures += 1;
        self.stats.eager += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            e.state = State::Uncapturable;
        }
    }
}

/// What the memos of a graph's per-state work are keyed on: its stamp and the hash of the node ids.
fn state_key(graph: &Graph, nodes: &[TensorId]) -> (GraphStamp, u64) {
    let mut h = WordHasher(0xcbf2_9ce4_8422_2325);
    nodes.iter().for_each(|n| h.write_u32(n.0));
    (graph.stamp(), h.finish())
}

/// FNV-1a over 64-bit words: fast enough to key every `compute` call.
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x100_0000_01b3);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
}

use ggml_gpu::dispatch::{fusion_groups, is_skipped};

/// Launched nodes per captured graph: a long call is captured as several graphs, so the device
/// starts on the first while the host still launches the next (launching a graph costs the host
/// time per node).
pub const NODES_PER_GRAPH: usize = 128;

/// `nodes` cut into runs of at most `per_graph` launches each, a fused group of nodes
/// ([`fusion_groups`]) counting as one launch and never cut (the nodes that launch nothing go with
/// the run before them).
pub fn runs<'a>(graph: &Graph, nodes: &'a [TensorId], per_graph: usize) -> Vec<&'a [TensorId]> {
    let starts: HashSet<TensorId> = fusion_groups(graph, nodes).iter().map(|g| g[0]).collect();
    let mut runs = Vec::new();
    let (mut start, mut launched) = (0, 0);
    for (i, n) in nodes.iter().enumerate() {
        if !starts.contains(n) {
            continue;
        }
        if launched == per_graph {
            runs.push(&nodes[start..i]);
            (start, launched) = (i, 0);
        }
        launched += 1;
    }
    if start < nodes.len() {
        runs.push(&nodes[start..]);
    }
    runs
}

/// The device address of tensor `id`, or `None` when it is not in CUDA memory.
fn device_address(graph: &Graph, id: TensorId) -> Option<u64> {
    let d = graph.data(id).ok()?;
    let b = d.buffer.as_any().downcast_ref::<CudaBuffer>()?;
    Some(b.device_ptr() + d.offset as u64)
}

/// The key of computing `nodes` of `graph` and the number of nodes that launch work, or `None`
/// when a tensor has no CUDA memory (the eager path then reports the error).
pub fn key(graph: &Graph, nodes: &[TensorId]) -> Option<(u64, usize)> {
    let mut h = WordHasher(0xcbf2_9ce4_8422_2325);
    let mut launched = 0;
    for &node in nodes {
        if is_skipped(graph, node) {
            continue;
        }
        launched += 1;
        let t = graph.tensor(node);
        t.op.hash(&mut h);
        t.layout.hash(&mut h);
        h.write_u64(device_address(graph, node)?);
        h.write_usize(t.src.len());
        for &s in &t.src {
            graph.layout(s).hash(&mut h);
            h.write_u64(device_address(graph, s)?);
        }
    }
    Some((h.finish(), launched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_runs_eager_then_captures_then_replays() {
        let mut c = GraphCache::new(true);
        assert_eq!(c.plan(7), Plan::Eager);
        assert_eq!(c.plan(7), Plan::Capture);
        c.capture_failed(7);
        assert_eq!(c.plan(7), Plan::Eager);
        assert_eq!(c.plan(8), Plan::Eager);
        let s = c.stats();
        assert_eq!((s.eager, s.failed_captures, s.captures), (4, 1, 0));
        assert!(c.replay(8).is_err(), "nothing captured for 8");
    }

    #[test]
    fn cache_forgets_the_least_recently_used() {
        let mut c = GraphCache::new(true);
        for k in 0..MAX_ENTRIES as u64 {
            c.plan(k);
        }
        c.plan(0);
        c.plan(10_000);
        assert_eq!(c.entries.len(), MAX_ENTRIES);
        assert!(c.entries.contains_key(&0), "recently used");
        assert!(!c.entries.contains_key(&1), "least recently used");
    }

    #[test]
    fn runs_hold_at_most_the_launched_nodes_asked_for() {
        use ggml_core::DType;
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[8]).unwrap();
        let mut nodes = vec![a];
        let mut x = a;
        // Copies: one launch each (element-wise nodes in a row would fuse into chains).
        for i in 0..7 {
            x = g.cont(x).unwrap();
            nodes.push(x);
            if i % 3 == 0 {
                x = g.reshape(x, &[2, 4]).unwrap();
                nodes.push(x);
            }
        }
        let runs = runs(&g, &nodes, 3);
        let launched: Vec<usize> = runs
            .iter()
            .map(|r| r.iter().filter(|&&n| !is_skipped(&g, n)).count())
            .collect();
        assert_eq!(launched, [3, 3, 1]);
        assert_eq!(runs.concat(), nodes, "every node once, in order");
        assert!(super::runs(&g, &[], 3).is_empty());
    }

    #[test]
    fn runs_keep_a_fused_chain_whole() {
        use ggml_core::DType;
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[64]).unwrap();
        let w = g.new_input(DType::F32, &[64]).unwrap();
        let mut nodes = Vec::new();
        let mut x = a;
        for _ in 0..3 {
            x = g.silu(x).unwrap();
            let n = g.rms_norm(x, 1e-5).unwrap();
            x = g.mul(n, w).unwrap();
            nodes.extend([g.tensor(n).src[0], n, x]);
        }
        // silu, then the norm chain (norm, mul) as one launch: 2 launches of 3 nodes per round
        // (counting nodes, a run of 2 would end between a norm and its mul).
        let runs = runs(&g, &nodes, 2);
        let lens: Vec<usize> = runs.iter().map(|r| r.len()).collect();
        assert_eq!(
            lens,
            [3, 3, 3],
            "a cut between a norm and its mul splits the fused chain"
        );
        assert_eq!(runs.concat(), nodes);
    }

    #[test]
    fn keys_are_remembered_per_graph_state() {
        use ggml_core::DType;
        let mut c = GraphCache::new(true);
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[8]).unwrap();
        assert_eq!(c.key_of(&g, &[a]), key(&g, &[a]));
        assert_eq!(c.memo.len(), 1);
        assert_eq!(c.key_of(&g, &[a]), key(&g, &[a]));
        assert_eq!(c.memo.len(), 1, "same state, same nodes: remembered");
        let s = g.silu(a).unwrap();
        assert_eq!(c.key_of(&g, &[a]), key(&g, &[a]));
        assert_eq!(c.memo.len(), 2, "a changed graph is keyed again");
        assert_eq!(c.key_of(&g, &[a, s]), None, "unbound node");
        assert_eq!(c.memo.len(), 3);
    }

    #[test]
    fn runs_are_remembered_per_graph_state() {
        use ggml_core::DType;
        let mut c = GraphCache::new(true);
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[8]).unwrap();
        let mut nodes = vec![a];
        for _ in 0..5 {
            let x = g.silu(*nodes.last().unwrap()).unwrap();
            nodes.push(x);
        }
        let ranges = c.runs_of(&g, &nodes, 2);
        let direct: Vec<&[TensorId]> = runs(&g, &nodes, 2);
        let from_ranges: Vec<&[TensorId]> = ranges.iter().map(|r| &nodes[r.clone()]).collect();
        assert_eq!(from_ranges, direct);
        assert_eq!(c.runs_memo.len(), 1);
        assert_eq!(c.runs_of(&g, &nodes, 2), ranges);
        assert_eq!(c.runs_memo.len(), 1, "same state, same nodes: remembered");
        let before = g.stamp();
        g.silu(a).unwrap();
        assert_ne!(g.stamp(), before);
        assert_eq!(c.runs_of(&g, &nodes, 2), ranges);
        assert_eq!(c.runs_memo.len(), 2, "a changed graph is cut again");
    }

    #[test]
    fn key_needs_cuda_memory_and_skips_leaves() {
        use ggml_core::DType;
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[8, 2]).unwrap();
        let b = g.new_input(DType::F32, &[8, 2]).unwrap();
        let s = g.add(a, b).unwrap();
        assert_eq!(key(&g, &[s]), None, "unbound tensors have no CUDA memory");
        let (empty, none) = key(&g, &[]).unwrap();
        assert_eq!(none, 0);
        assert_eq!(key(&g, &[a, b]), Some((empty, 0)), "leaves launch nothing");
    }
}

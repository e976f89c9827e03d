//! [`ProgramCache`]: the programs of a meta stream, one per graph shape (a key from the graph's
//! structure, shapes, data bindings and node list), least recently used first out. A prompt's
//! micro-batches, the decode steps after it and the next prompt of the same lengths then find the
//! programs planned before instead of planning again; the first graph of a new shape pays planning
//! once. Hashing a graph's structure is skipped for a graph object seen unchanged since
//! ([`GraphStamp`]).

use crate::program::Program;
use ggml_core::sched::structure_key;
use ggml_core::{Graph, GraphStamp, TensorId};
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

/// Programs kept per meta stream: enough for a prompt's lengths (full micro-batches, the last
/// shorter one) and the decode steps' cache lengths.
pub(crate) const PROGRAMS: usize = 8;

/// Recently computed graph states and their program keys, so that an unchanged graph is not hashed
/// again.
const STAMPS: usize = 2 * PROGRAMS;

/// Programs by key, most recently used last.
#[derive(Default)]
pub(crate) struct ProgramCache {
    programs: VecDeque<Program>,
    stamps: VecDeque<(GraphStamp, u64, u64)>,
}

/// What [`ProgramCache::get_or_build`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    Hit,
    /// Built, and whether a least recently used program was dropped for it.
    Built {
        evicted: bool,
    },
}

impl ProgramCache {
    /// The program key of `graph` computing `nodes`.
    pub fn key(&mut self, graph: &Graph, nodes: &[TensorId]) -> u64 {
        let nodes_hash = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            nodes.hash(&mut h);
            h.finish()
        };
        let stamp = graph.stamp();
        if let Some(&(_, _, key)) = self
            .stamps
            .iter()
            .find(|(s, n, _)| *s == stamp && *n == nodes_hash)
        {
            return key;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        structure_key(graph).hash(&mut h);
        nodes_hash.hash(&mut h);
        let key = h.finish();
        if self.stamps.len() == STAMPS {
            self.stamps.pop_front();
        }
        self.stamps.push_back((stamp, nodes_hash, key));
        key
    }

    /// The program of `key`, built by `build` when none is cached; it becomes the most recently
    /// used. A failed build leaves the cache as it was.
    pub fn get_or_build<E>(
        &mut self,
        key: u64,
        build: impl FnOnce() -> Result<Program, E>,
    ) -> Result<(&Program, Lookup), E> {
        let lookup = match self.programs.iter().position(|p| p.key == key) {
            Some(i) => {
                let p = self.programs.remove(i).expect("position is in range");
                self.programs.push_back(p);
                Lookup::Hit
            }
            None => {
                let program = build()?;
                let evicted = self.programs.len() == PROGRAMS;
                if evicted {
                    self.programs.pop_front();
                }
                self.programs.push_back(program);
                Lookup::Built { evicted }
            }
        };
        let program = self.programs.back().expect("pushed above");
        Ok((program, lookup))
    }

    /// The most recently used program.
    pub fn last(&self) -> Option<&Program> {
        self.programs.back()
    }

    /// Programs held.
    pub fn len(&self) -> usize {
        self.programs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::DType;

    fn program(key: u64) -> Program {
        Program {
            key,
            graphs: Vec::new(),
            compute_bytes: Vec::new(),
            stages: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            recorded: Default::default(),
        }
    }

    /// Looks `key` up, building an empty program when missing; returns what happened.
    fn touch(cache: &mut ProgramCache, key: u64) -> Lookup {
        let (p, lookup) = cache
            .get_or_build(key, || Ok::<_, ()>(program(key)))
            .unwrap();
        assert_eq!(p.key, key);
        lookup
    }

    #[test]
    fn least_recently_used_program_goes_first() {
        let mut cache = ProgramCache::default();
        for k in 0..PROGRAMS as u64 {
            assert_eq!(touch(&mut cache, k), Lookup::Built { evicted: false });
        }
        // Key 0 used again: key 1 is now the oldest.
        assert_eq!(touch(&mut cache, 0), Lookup::Hit);
        assert_eq!(touch(&mut cache, 100), Lookup::Built { evicted: true });
        assert_eq!(cache.len(), PROGRAMS);
        assert_eq!(touch(&mut cache, 0), Lookup::Hit);
        assert_eq!(touch(&mut cache, 1), Lookup::Built { evicted: true });
        assert_eq!(cache.last().map(|p| p.key), Some(1));
    }

    #[test]
    fn failed_build_keeps_the_cache() {
        let mut cache = ProgramCache::default();
        touch(&mut cache, 7);
        let failed = cache.get_or_build(8, || Err::<Program, _>("no"));
        assert!(matches!(failed, Err("no")));
        assert_eq!(cache.len(), 1);
        assert_eq!(touch(&mut cache, 7), Lookup::Hit);
    }

    #[test]
    fn key_follows_structure_and_nodes_not_the_graph_object() {
        let mut cache = ProgramCache::default();
        let graph = |n: usize| {
            let mut g = Graph::new();
            let x = g.new_input(DType::F32, &[n, 3]).unwrap();
            let y = g.scale(x, 2.0).unwrap();
            g.expand(y);
            (g, y)
        };
        let (a, ya) = graph(5);
        let (b, yb) = graph(5);
        let (c, yc) = graph(6);
        let ka = cache.key(&a, &[ya]);
        assert_eq!(cache.key(&a, &[ya]), ka, "an unchanged graph");
        assert_eq!(cache.key(&b, &[yb]), ka, "another graph of the same shape");
        assert_ne!(cache.key(&c, &[yc]), ka, "another shape");
        assert_ne!(cache.key(&a, &[]), ka, "another node list");
    }
}

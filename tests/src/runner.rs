//! Runs one case on one backend: builds the graph (inputs as contiguous leaves, viewed as the case
//! asks), allocates it, fills the inputs, poisons the output, computes, reads back and compares.

use crate::case::{draw_leaf, Case, Gen, ViewKind};
use crate::check::compare;
use crate::codec::{decode, encode};
use crate::dense::Dense;
use ggml_core::sched::Scheduler;
use ggml_core::{Backend, Graph, Result, TensorId};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// The result of one case on one backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass(String),
    Fail(String),
    /// The device does not support an op of the case.
    Skip(String),
}

/// One input as built: its leaf, the tensor the op sees, the leaf's bytes, the values the op sees.
struct BuiltInput {
    leaf: TensorId,
    bytes: Vec<u8>,
    values: Dense,
}

fn build_input(
    graph: &mut Graph,
    rng: &mut StdRng,
    spec: &crate::case::InputSpec,
) -> Result<(BuiltInput, TensorId)> {
    let leaf_ne = spec.view.leaf_ne(spec.ne);
    let leaf = graph.new_input(spec.dtype, &leaf_ne)?;
    let (bytes, seen) = if spec.gen == Gen::Poison {
        (
            vec![0xFF; graph.layout(leaf).nbytes()],
            Dense::from_fn(leaf_ne, |_| f64::NAN),
        )
    } else {
        let bytes = encode(spec.dtype, leaf_ne, &draw_leaf(rng, spec.gen, leaf_ne).data)?;
        let seen = decode(spec.dtype, leaf_ne, &bytes)?;
        (bytes, seen)
    };
    let op_input = match spec.view {
        ViewKind::Contig => leaf,
        ViewKind::Permute([1, 0, 2, 3]) => graph.transpose(leaf)?,
        ViewKind::Permute(axes) => graph.permute(leaf, axes)?,
        ViewKind::Pad { offset, .. } => {
            let l = *graph.layout(leaf);
            let off = offset / spec.dtype.block_size() * spec.dtype.type_size();
            graph.view(leaf, &spec.ne, &l.nb[1..], off)?
        }
    };
    let values = spec.view.apply(&seen, spec.ne);
    Ok((
        BuiltInput {
            leaf,
            bytes,
            values,
        },
        op_input,
    ))
}

/// Runs `case` on `backend`; never panics (a panic of the backend is a failure).
pub fn run_case(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    run_case_times(backend, case, 1)
}

/// Runs `case` `runs` times on one allocated graph, the inputs drawn from `case.seed`, then
/// `case.seed + 1`, ... (a stream's repeated work: the same graph with fresh values); the first
/// failing run's outcome, else the last run's. Never panics.
pub fn run_case_times(backend: &Arc<dyn Backend>, case: &Case, runs: u64) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| try_run_case(backend, case, runs))) {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => Outcome::Fail(format!("error: {e}")),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Outcome::Fail(format!("panic: {}", msg.unwrap_or_default()))
        }
    }
}

/// A case's graph before allocation: the result tensor, the inputs' leaves and bytes, and the values
/// the op sees.
pub struct Built {
    pub graph: Graph,
    pub out: TensorId,
    leaves: Vec<(TensorId, Vec<u8>)>,
    pub values: Vec<Dense>,
}

/// Builds `case`'s graph and draws its inputs (from the case's seed).
pub fn build(case: &Case) -> Result<Built> {
    build_seeded(case, case.seed)
}

/// [`build`] with the inputs drawn from `seed`.
fn build_seeded(case: &Case, seed: u64) -> Result<Built> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut graph = Graph::new();
    let (mut leaves, mut values, mut op_inputs) = (Vec::new(), Vec::new(), Vec::new());
    for spec in &case.inputs {
        let (b, t) = build_input(&mut graph, &mut rng, spec)?;
        leaves.push((b.leaf, b.bytes));
        values.push(b.values);
        op_inputs.push(t);
    }
    let out = (case.build)(&mut graph, &op_inputs)?;
    graph.output(out);
    Ok(Built {
        graph,
        out,
        leaves,
        values,
    })
}

fn try_run_case(backend: &Arc<dyn Backend>, case: &Case, runs: u64) -> Result<Outcome> {
    let Built {
        mut graph,
        out,
        leaves,
        values,
    } = build(case)?;
    let device = backend.device();
    let nodes: Vec<TensorId> = graph.nodes().to_vec();
    if let Some(&n) = nodes
        .iter()
        .find(|&&n| !graph.tensor(n).op.is_view() && !device.supports_op(&graph, n))
    {
        return Ok(Outcome::Skip(format!(
            "{} does not support {}",
            device.name(),
            graph.tensor(n).op.name()
        )));
    }

    let mut sched = Scheduler::new(vec![backend.clone()]);
    sched.alloc(&mut graph)?;
    let mut outcome = run_built(&mut sched, &mut graph, out, case, &leaves, &values)?;
    for run in 1..runs {
        if matches!(outcome, Outcome::Fail(_)) {
            break;
        }
        // The same construction, so the same leaves, with values from the next seed.
        let again = build_seeded(case, case.seed.wrapping_add(run))?;
        outcome = run_built(
            &mut sched,
            &mut graph,
            out,
            case,
            &again.leaves,
            &again.values,
        )?;
    }
    Ok(outcome)
}

/// Fills the inputs of the allocated `graph`, poisons its result, computes and compares.
fn run_built(
    sched: &mut Scheduler,
    graph: &mut Graph,
    out: TensorId,
    case: &Case,
    leaves: &[(TensorId, Vec<u8>)],
    values: &[Dense],
) -> Result<Outcome> {
    for (leaf, bytes) in leaves {
        graph.set_bytes(*leaf, bytes)?;
    }
    // Poison the result (unless it aliases an input the case filled, as cpy and set_rows do):
    // 0xFF bytes are NaN in every float type and -1 as I32, so unwritten elements cannot pass.
    if graph.tensor(out).view.is_none() {
        let d = graph.data(out)?;
        d.buffer.fill(d.offset, graph.layout(out).nbytes(), 0xFF)?;
    }
    sched.compute(graph)?;

    let l = *graph.layout(out);
    let got = decode(l.dtype, l.ne, &graph.get_bytes(out)?)?;
    let want = (case.reference)(values)?;
    Ok(
        match compare(case.check, l.dtype, &got, &want, &values[0]) {
            Ok(m) => Outcome::Pass(m),
            Err(m) => Outcome::Fail(m),
        },
    )
}

//! Chains of element-wise nodes in one `k_eltwise_chain` launch (part of `kernel_cases`): the
//! delta-net log decay (add of a broadcast bias, softplus, mul), a chain whose value is the second
//! operand of a binary step (over a padded view), scale / clamp / neg, and a chain longer than the
//! kernel's 3 steps (fused in parts). Every result is bit-equal to the unfused run's and within the
//! float64 reference's bounds, and the fused launches ran (the dispatch's counter).

use super::fusions::{draw_inputs, seen_values, within};
use super::*;

/// One step of a test chain: how it combines the chain's value with input `k` of the case.
#[derive(Clone, Copy, Debug)]
enum Step {
    Unary(UnaryOp),
    Scale(f32, f32),
    Clamp(f32, f32),
    /// value op input.
    Then(BinOp, usize),
    /// input op value.
    Before(BinOp, usize),
}

fn node(g: &mut Graph, step: Step, x: TensorId, t: &[TensorId]) -> TensorId {
    let bin = |g: &mut Graph, op: BinOp, a: TensorId, b: TensorId| match op {
        BinOp::Add => g.add(a, b),
        BinOp::Sub => g.sub(a, b),
        BinOp::Mul => g.mul(a, b),
        BinOp::Div => g.div(a, b),
    };
    match step {
        Step::Unary(u) => g.unary(x, u),
        Step::Scale(s, b) => g.scale_bias(x, s, b),
        Step::Clamp(lo, hi) => g.clamp(x, lo, hi),
        Step::Then(op, k) => bin(g, op, x, t[k]),
        Step::Before(op, k) => bin(g, op, t[k], x),
    }
    .unwrap()
}

fn reference(step: Step, x: &Dense, seen: &[Dense]) -> Dense {
    match step {
        Step::Unary(u) => ew::unary(u, x),
        Step::Scale(s, b) => ew::scale(x, s, b),
        Step::Clamp(lo, hi) => ew::clamp(x, lo, hi),
        Step::Then(op, k) => ew::binary(op, x, &seen[k]),
        Step::Before(op, k) => ew::binary(op, &seen[k], x),
    }
}

#[test]
fn element_wise_chains_in_one_launch() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let pad = ViewKind::Pad { pad: 3, offset: 1 };
    let f32_in = |ne: [usize; 4], gen: Gen| InputSpec::new(DType::F32, ne).gen(gen);
    let cases: Vec<(Vec<InputSpec>, Vec<Step>)> = vec![
        (
            vec![
                f32_in([48, 7, 1, 1], Gen::Normal(4.0)),
                f32_in([48, 1, 1, 1], Gen::Normal(1.0)),
                f32_in([48, 1, 1, 1], Gen::Uniform(-2.0, -0.1)),
            ],
            vec![
                Step::Then(BinOp::Add, 1),
                Step::Unary(UnaryOp::Softplus),
                Step::Then(BinOp::Mul, 2),
            ],
        ),
        (
            vec![
                f32_in([33, 5, 2, 1], Gen::Normal(2.0)).view(pad),
                f32_in([33, 5, 2, 1], Gen::Normal(1.0)).view(pad),
                f32_in([33, 5, 2, 1], Gen::Uniform(0.5, 2.0)),
            ],
            vec![
                Step::Unary(UnaryOp::Sigmoid),
                Step::Before(BinOp::Mul, 1),
                Step::Before(BinOp::Div, 2),
            ],
        ),
        (
            vec![f32_in([4095, 3, 1, 1], Gen::Normal(3.0))],
            vec![
                Step::Scale(0.37, -0.25),
                Step::Clamp(-1.5, 2.0),
                Step::Unary(UnaryOp::Neg),
            ],
        ),
        (
            vec![
                f32_in([130, 2, 1, 1], Gen::Uniform(-3.0, 3.0)),
                f32_in([130, 2, 1, 1], Gen::Normal(1.0)),
            ],
            vec![
                Step::Unary(UnaryOp::Exp),
                Step::Before(BinOp::Sub, 1),
                Step::Unary(UnaryOp::Relu),
                Step::Unary(UnaryOp::Sqr),
            ],
        ),
    ];
    let mut checked = 0;
    for (specs, steps) in &cases {
        let inputs = draw_inputs(&mut rng, specs);
        let build = |g: &mut Graph, t: &[TensorId]| {
            let mut x = t[0];
            let mut out = Vec::new();
            for &s in steps {
                x = node(g, s, x, t);
                out.push(x);
            }
            out
        };
        let what = format!("{steps:?}");
        let fused = fused_matching_unfused(&dev, &inputs, &build, |c| c.eltwise_chains, &what);
        let seen = seen_values(&inputs);
        let mut x = seen[0].clone();
        for (k, &s) in steps.iter().enumerate() {
            x = reference(s, &x, &seen);
            let what = format!("{steps:?}: result {k}");
            checked += within(&what, &fused[k].1, &x, float_bound(Class::Math, DType::F32));
        }
    }
    println!(
        "{checked} chain results bit-equal to the unfused run and within the reference bounds"
    );
}

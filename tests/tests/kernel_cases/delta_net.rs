//! gated_delta_net at the sizes of Qwen3-Next / Qwen3.5 (head size 128, value heads sharing key
//! heads both ways): decode (one token), and a prompt longer than several chunks and than one
//! column tile of the kernel, against the float64 recurrence; the rule with the copy of its state
//! in one launch.

use super::fusions::draw_inputs;
use super::run;
use ggml_core::{DType, Graph, HeadShare, TensorId};
use ggml_tp_tests::case::{Gen, InputSpec};
use ggml_tp_tests::cases::{push_delta_net, CaseSet, DeltaNetShape};
use ggml_tp_tests::seed;
use rand::rngs::StdRng;
use rand::SeedableRng;

#[test]
fn gated_delta_net_model_sizes() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for tokens in [1, 2, 133] {
        for share in [HeadShare::Grouped, HeadShare::Tiled] {
            let s = DeltaNetShape {
                dk: 128,
                dv: 128,
                key_heads: 2,
                heads: 4,
                tokens,
            };
            push_delta_net(&mut set, s, share, tokens == 2);
        }
    }
    // Key heads of 256 (eight lanes per column) and of 72 (four lanes, some keys unused), value
    // heads of 40 (a partial column tile).
    for (dk, dv) in [(256, 64), (72, 40)] {
        let s = DeltaNetShape {
            dk,
            dv,
            key_heads: 1,
            heads: 2,
            tokens: 70,
        };
        push_delta_net(&mut set, s, HeadShare::Grouped, false);
    }
    run(set, seed);
}

/// The rule with the copy of its final state back into the state operand, as the models write it:
/// one launch (the dispatch's counter), the copy bit-equal to the state the rule's result holds and
/// to the unfused run's, the rule's outputs bit-equal to the unfused run's; decode and a prompt.
#[test]
fn gated_delta_net_writes_its_state_copy_in_the_same_launch() {
    let Some(dev) = super::kernel_device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(seed());
    let (dk, dv, hk, h) = (128, 128, 2, 4);
    for tokens in [1, 37] {
        let f32_in = |ne: [usize; 4], gen: Gen| InputSpec::new(DType::F32, ne).gen(gen);
        let specs = [
            f32_in([dk, hk, tokens, 1], Gen::Normal(0.1)),
            f32_in([dk, hk, tokens, 1], Gen::Normal(0.1)),
            f32_in([dv, h, tokens, 1], Gen::Normal(1.0)),
            f32_in([h, tokens, 2, 1], Gen::Uniform(-0.5, 0.5)),
            f32_in([dk, dv, h, 1], Gen::Normal(1.0)),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let state_at = dv * h * tokens * 4;
        let build = |g: &mut Graph, x: &[TensorId]| {
            let rule = g
                .gated_delta_net([x[0], x[1], x[2], x[3], x[4]], HeadShare::Grouped)
                .unwrap();
            let row = dk * 4;
            let s = g
                .view(rule, &[dk, dv, h], &[row, dv * row], state_at)
                .unwrap();
            vec![rule, g.cpy(s, x[4]).unwrap()]
        };
        let what = format!("{tokens} tokens");
        let fused = super::fused_matching_unfused(&dev, &inputs, &build, |c| c.state_copies, &what);
        assert_eq!(
            &fused[0].0[state_at..],
            &fused[1].0[..],
            "{tokens} tokens: the copy is not the rule's final state"
        );
    }
}

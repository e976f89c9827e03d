//! gated_delta_net at the sizes of Qwen3-Next / Qwen3.5 (head size 128, value heads sharing key
//! heads both ways): decode (one token), and a prompt longer than several chunks and than one
//! column tile of the kernel, against the float64 recurrence.

use super::run;
use ggml_core::HeadShare;
use ggml_tp_tests::cases::{push_delta_net, CaseSet, DeltaNetShape};
use ggml_tp_tests::seed;

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

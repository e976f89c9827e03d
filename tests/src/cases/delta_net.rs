//! Cases of gated_delta_net: odd key and value head sizes, several value heads sharing key heads
//! (grouped and tiled), one token (decode) and batches across the 64-token chunks of the chunked
//! form, strided queries; log decays and βs both drawn in (-1, 0) (the rule is linear in β, so its sign
//! changes nothing for the kernels, and the state still contracts on average); keys scaled so that `‖k‖² ≈ 1/2` as the models' L2-normalised keys are.

use super::CaseSet;
use crate::case::{Check, Gen, InputSpec};
use crate::check::{float_bound, Class};
use crate::reference::delta_net as dn;
use ggml_core::{DType, HeadShare};

/// The sizes of one gated_delta_net case.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetShape {
    pub dk: usize,
    pub dv: usize,
    pub key_heads: usize,
    pub heads: usize,
    pub tokens: usize,
}

/// A gated_delta_net case of shape `s`, key heads shared as `share`, the queries through a strided
/// view when `strided`, checked against the float64 recurrence.
pub fn push_delta_net(set: &mut CaseSet, s: DeltaNetShape, share: HeadShare, strided: bool) {
    let qk = [s.dk, s.key_heads, s.tokens, 1];
    let a = (1.5 / s.dk as f32).sqrt();
    let inputs = vec![
        InputSpec::new(DType::F32, qk)
            .gen(Gen::Uniform(-a, a))
            .view(set.row_layout(DType::F32, qk, strided)),
        InputSpec::new(DType::F32, qk).gen(Gen::Uniform(-a, a)),
        InputSpec::new(DType::F32, [s.dv, s.heads, s.tokens, 1]).gen(Gen::Normal(1.0)),
        InputSpec::new(DType::F32, [s.heads, s.tokens, 2, 1]).gen(Gen::Uniform(-1.0, 0.0)),
        InputSpec::new(DType::F32, [s.dk, s.dv, s.heads, 1]).gen(Gen::Normal(0.5)),
    ];
    set.push(
        "gated_delta_net",
        format!(
            "Dk {} Dv {} heads {}/{} {share:?} tokens {}",
            s.dk, s.dv, s.key_heads, s.heads, s.tokens
        ),
        inputs,
        Check::Nmse(float_bound(Class::Math, DType::F32)),
        move |g, x| g.gated_delta_net([x[0], x[1], x[2], x[3], x[4]], share),
        move |x| Ok(dn::gated_delta_net(x, share)),
    );
}

pub fn add_cases(set: &mut CaseSet) {
    let shapes = [
        (17, 23, 1, 3, 1),
        (32, 32, 2, 4, 1),
        (33, 31, 2, 6, 70),
        (64, 19, 3, 3, 129),
        (7, 65, 1, 2, 16),
        (40, 40, 2, 4, 15),
    ];
    for (dk, dv, key_heads, heads, tokens) in shapes {
        let s = DeltaNetShape {
            dk,
            dv,
            key_heads,
            heads,
            tokens,
        };
        for share in [HeadShare::Grouped, HeadShare::Tiled] {
            push_delta_net(set, s, share, tokens > 1 && share == HeadShare::Tiled);
        }
    }
}

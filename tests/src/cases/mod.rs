//! The case generator: for every op, cases over its types, random shapes (odd sizes, broadcasts) and
//! non-contiguous inputs. Shapes and values are drawn from one seed, so a run is reproducible.

mod attention;
mod delta_net;
mod elementwise;
mod matrix;

pub use attention::push_flash_attn;
pub use delta_net::{push_delta_net, DeltaNetShape};

use crate::case::{Case, Check, InputSpec, ViewKind};
use crate::dense::Dense;
use ggml_core::{DType, Graph, Result, TensorId};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Float element types of activations.
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Targets of cpy, cast and set_rows.
pub const STORE_TARGETS: [DType; 5] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
];

/// Odd and even sizes for axis 0 of float tensors.
const SIZES0: [usize; 7] = [1, 3, 7, 33, 64, 65, 129];

/// SplitMix64, to derive one seed per case.
pub fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Collects cases, drawing shapes and per-case seeds from one generator.
pub struct CaseSet {
    pub rng: StdRng,
    seed: u64,
    pub cases: Vec<Case>,
}

impl CaseSet {
    pub fn new(seed: u64) -> CaseSet {
        CaseSet {
            rng: StdRng::seed_from_u64(seed),
            seed,
            cases: Vec::new(),
        }
    }

    pub fn push(
        &mut self,
        op: &'static str,
        params: String,
        inputs: Vec<InputSpec>,
        check: Check,
        build: impl Fn(&mut Graph, &[TensorId]) -> Result<TensorId> + Send + Sync + 'static,
        reference: impl Fn(&[Dense]) -> Result<Dense> + Send + Sync + 'static,
    ) {
        let seed = mix(self.seed ^ mix(self.cases.len() as u64));
        self.cases.push(Case {
            op,
            params,
            inputs,
            build: Box::new(build),
            reference: Box::new(reference),
            check,
            seed,
        });
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        *xs.choose(&mut self.rng).expect("non-empty choice")
    }

    /// A random 4-D shape with an odd or even axis 0 and small outer axes.
    pub fn shape(&mut self) -> [usize; 4] {
        [
            self.pick(&SIZES0),
            self.pick(&[1, 2, 5, 7]),
            self.pick(&[1, 3]),
            self.pick(&[1, 2]),
        ]
    }

    /// A random axis-0 size that is a whole number of `dtype` blocks (odd block counts included).
    pub fn row_len(&mut self, dtype: DType) -> usize {
        if dtype.is_quantized() {
            dtype.block_size() * self.pick(&[1, 2, 3])
        } else {
            self.pick(&SIZES0)
        }
    }

    /// `Contig`, or a random non-contiguous layout when `noncontig`.
    pub fn layout(&mut self, dtype: DType, ne: [usize; 4], noncontig: bool) -> ViewKind {
        if noncontig {
            ViewKind::random_noncontig(&mut self.rng, dtype, ne, false)
        } else {
            ViewKind::Contig
        }
    }

    /// Like [`CaseSet::layout`], keeping axis 0 contiguous.
    pub fn row_layout(&mut self, dtype: DType, ne: [usize; 4], noncontig: bool) -> ViewKind {
        if noncontig {
            ViewKind::random_noncontig(&mut self.rng, dtype, ne, true)
        } else {
            ViewKind::Contig
        }
    }
}

/// Rounds of generation: each round draws every op's cases again with new shapes and layouts.
const ROUNDS: usize = 2;

/// Every case of the suite for `seed`.
pub fn all_cases(seed: u64) -> Vec<Case> {
    let mut set = CaseSet::new(seed);
    for _ in 0..ROUNDS {
        elementwise::add_cases(&mut set);
        matrix::add_cases(&mut set);
        attention::add_cases(&mut set);
        delta_net::add_cases(&mut set);
    }
    set.cases
}

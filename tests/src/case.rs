//! What one conformance case is: its inputs (type, logical shape, value distribution, and the layout
//! the op sees), how to build the op in a graph, how to compute the expected result, how to compare.

use crate::dense::Dense;
use ggml_core::{DType, Graph, Result, SortOrder, TensorId};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// How input values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gen {
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// Uniform in [lo, hi).
    Uniform(f32, f32),
    /// Integer ids in [0, max); `distinct` makes the ids of each row (axis 0) pairwise different.
    Ids { max: usize, distinct: bool },
    /// Attention mask: 0 or -inf (about a quarter), element 0 of each row always 0, some small biases.
    Mask,
    /// A KV cache's padded mask: as [`Gen::Mask`] for the first `n` keys of each row, -inf past them.
    PrefixMask(usize),
    /// A causal prompt's mask after `past` cached keys: where row (query) i sees keys up to
    /// `past + i`, as [`Gen::Mask`] or (`plain`) 0 as the models' masks; -inf past them.
    CausalMask { past: usize, plain: bool },
    /// Small integers in [0, n) (many ties).
    Ties(u32),
    /// Poison: every byte 0xFF (NaN for float types); the op must overwrite all of it.
    Poison,
}

/// The layout the op sees: the leaf is always contiguous; a non-contiguous input is a view of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewKind {
    Contig,
    /// `graph.permute(leaf, axes)` ([1, 0, 2, 3] is built with `graph.transpose`).
    Permute([usize; 4]),
    /// A strided view of the first `ne[0]` elements at element `offset` of leaf rows `pad` longer.
    Pad {
        pad: usize,
        offset: usize,
    },
}

impl ViewKind {
    /// Shape of the contiguous leaf behind a view of logical shape `ne`.
    pub fn leaf_ne(self, ne: [usize; 4]) -> [usize; 4] {
        match self {
            ViewKind::Contig => ne,
            ViewKind::Permute(axes) => [ne[axes[0]], ne[axes[1]], ne[axes[2]], ne[axes[3]]],
            ViewKind::Pad { pad, .. } => [ne[0] + pad, ne[1], ne[2], ne[3]],
        }
    }

    /// The values the op sees, from the leaf's values.
    pub fn apply(self, leaf: &Dense, ne: [usize; 4]) -> Dense {
        match self {
            ViewKind::Contig => leaf.clone(),
            ViewKind::Permute(axes) => leaf.permute(axes),
            ViewKind::Pad { offset, .. } => leaf.slice(0, offset, ne[0]),
        }
    }

    /// A random non-contiguous layout valid for `dtype` and `ne`; with `keep_rows`, axis 0 stays
    /// contiguous (as ggml requires of mul_mat operands and of sources of quantizing copies).
    pub fn random_noncontig(
        rng: &mut StdRng,
        dtype: DType,
        ne: [usize; 4],
        keep_rows: bool,
    ) -> ViewKind {
        let bs = dtype.block_size();
        let mut choices = vec![ViewKind::Pad {
            pad: 2 * bs,
            offset: bs,
        }];
        if ne[1] > 1 || ne[2] > 1 {
            choices.push(ViewKind::Permute([0, 2, 1, 3]));
        }
        if !dtype.is_quantized() {
            choices.push(ViewKind::Pad { pad: 3, offset: 1 });
        }
        if !dtype.is_quantized() && !keep_rows {
            if ne[0] > 1 || ne[1] > 1 {
                choices.push(ViewKind::Permute([1, 0, 2, 3]));
            }
            if ne[2] > 1 {
                choices.push(ViewKind::Permute([2, 0, 1, 3]));
            }
        }
        *choices.choose(rng).expect("non-empty")
    }
}

/// One input of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputSpec {
    pub dtype: DType,
    /// Logical shape, as the op sees it.
    pub ne: [usize; 4],
    pub gen: Gen,
    pub view: ViewKind,
}

impl InputSpec {
    /// A contiguous input with N(0, 1) values.
    pub fn new(dtype: DType, ne: [usize; 4]) -> InputSpec {
        InputSpec {
            dtype,
            ne,
            gen: Gen::Normal(1.0),
            view: ViewKind::Contig,
        }
    }
    pub fn gen(mut self, gen: Gen) -> InputSpec {
        self.gen = gen;
        self
    }
    pub fn view(mut self, view: ViewKind) -> InputSpec {
        self.view = view;
        self
    }
    /// An I32 tensor of ids in [0, max).
    pub fn ids(ne: [usize; 4], max: usize, distinct: bool) -> InputSpec {
        InputSpec::new(DType::I32, ne).gen(Gen::Ids { max, distinct })
    }
}

/// How the result is compared with the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Check {
    /// Normalized MSE at most this bound, and no NaN/Inf where the reference is finite.
    Nmse(f64),
    /// As `Nmse`, with every reference value counted as at least `terms` large in the norm: for
    /// results that are sums of terms of about that size (a scale with a bias), which are only as
    /// precise as their terms where they cancel to near zero.
    NmseOfTerms { bound: f64, terms: f64 },
    /// Bit-equal values (integer results).
    Exact,
    /// The result is, per row, a permutation of 0..ne0 that sorts input 0 in this order.
    Sorted(SortOrder),
    /// The result holds, per row, distinct indices of the k largest values of input 0, largest first.
    TopK,
}

pub type BuildFn = Box<dyn Fn(&mut Graph, &[TensorId]) -> Result<TensorId> + Send + Sync>;
pub type RefFn = Box<dyn Fn(&[Dense]) -> Result<Dense> + Send + Sync>;

/// One conformance case.
pub struct Case {
    /// Op name (as `Op::name`).
    pub op: &'static str,
    /// Parameters and variant, for messages.
    pub params: String,
    pub inputs: Vec<InputSpec>,
    /// Builds the op from the (possibly viewed) inputs; returns the tensor to read.
    pub build: BuildFn,
    /// Computes the expected result from the values the op sees.
    pub reference: RefFn,
    pub check: Check,
    /// Seed of this case's input values.
    pub seed: u64,
}

impl Case {
    /// One line naming the case: op, parameters, input types, shapes and layouts.
    pub fn describe(&self) -> String {
        let ins: Vec<String> = self
            .inputs
            .iter()
            .map(|i| {
                let v = match i.view {
                    ViewKind::Contig => String::new(),
                    ViewKind::Permute(a) => format!(" permute{a:?}"),
                    ViewKind::Pad { pad, offset } => format!(" padded(+{pad}, @{offset})"),
                };
                format!("{}{:?}{v}", i.dtype, i.ne)
            })
            .collect();
        format!("{}({}) [{}]", self.op, self.params, ins.join(", "))
    }
}

/// Draws one value of a float input.
pub fn draw(rng: &mut StdRng, gen: Gen) -> f64 {
    match gen {
        Gen::Normal(s) => {
            // Box-Muller.
            let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
            let u2: f64 = rng.gen();
            s as f64 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        }
        Gen::Uniform(lo, hi) => rng.gen_range(lo as f64..hi as f64),
        Gen::Ties(n) => rng.gen_range(0..n) as f64,
        Gen::Ids { max, .. } => rng.gen_range(0..max) as f64,
        Gen::CausalMask { plain: true, .. } => 0.0,
        Gen::Mask | Gen::PrefixMask(_) | Gen::CausalMask { .. } => {
            if rng.gen_bool(0.25) {
                f64::NEG_INFINITY
            } else if rng.gen_bool(0.5) {
                0.0
            } else {
                rng.gen_range(-1.0..1.0)
            }
        }
        Gen::Poison => f64::NAN,
    }
}

/// The values of a leaf of shape `ne` drawn from `gen`.
pub fn draw_leaf(rng: &mut StdRng, gen: Gen, ne: [usize; 4]) -> Dense {
    let mut d = Dense::from_fn(ne, |_| draw(rng, gen));
    let nrows = d.nrows();
    for r in 0..nrows {
        let (i1, i2, i3) = (r % ne[1], r / ne[1] % ne[2], r / ne[1] / ne[2]);
        let row = d.row_mut(i1, i2, i3);
        match gen {
            Gen::Ids {
                max,
                distinct: true,
            } => {
                assert!(row.len() <= max, "{} distinct ids out of {max}", row.len());
                let mut all: Vec<usize> = (0..max).collect();
                all.shuffle(rng);
                row.iter_mut().zip(all).for_each(|(x, id)| *x = id as f64);
            }
            Gen::Mask => row[0] = 0.0,
            Gen::PrefixMask(n) => {
                row.iter_mut().skip(n).for_each(|x| *x = f64::NEG_INFINITY);
                row[0] = 0.0;
            }
            Gen::CausalMask { past, .. } => {
                row.iter_mut()
                    .skip(past + i1 + 1)
                    .for_each(|x| *x = f64::NEG_INFINITY);
                row[0] = 0.0;
            }
            _ => {}
        }
    }
    d
}

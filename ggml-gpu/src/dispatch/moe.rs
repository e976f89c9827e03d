//! mul_mat_id: the experts' products of a mixture-of-experts layer. Prompts (more than
//! [`GROUPED_MIN_TOKENS`] tokens) over quantized experts run grouped by expert (`moe.cu`): the
//! activations rounded to 8 bits once (`k_quantize_q8`), the (slot, token) pairs grouped by expert
//! on the GPU (`k_moe_group`: counts, offsets, pair lists, work list of tiles), then one launch
//! (`k_moe_mma_<type>` on tensor cores where the runner has them, else `k_moe_mm_<type>`)
//! multiplies each used expert with its pairs' columns, so an expert's weights
//! are read once per tile of 32 pairs instead of once per pair; nothing comes back to the host, so
//! the step is capturable in a CUDA graph. Decode (few tokens), float experts and weights the
//! kernels cannot read in place take the GEMV kernels, one column per pair. Ids out of range give
//! NaN result columns on both paths.

use super::gemv::{self, GemvArgs};
use super::{args, fail, type_name, Launch, Runner, TDesc};
use ggml_core::{Layout, Result};

/// Prompts of more tokens than this run grouped by expert.
pub const GROUPED_MIN_TOKENS: usize = gemv::MAX_COLUMNS;

/// Weight rows and pairs of one tile, and threads of the product kernel (`MM_BM`, `MM_BN`,
/// `MM_THREADS`); threads of the grouping kernel (`MG_THREADS`).
const TILE_ROWS: usize = 64;
const TILE_PAIRS: usize = 32;
const MM_THREADS: u32 = 128;
const GROUP_THREADS: u32 = 256;

/// Most experts of a grouped product (`MG_MAX_EXPERTS`: the grouping's counts in shared memory).
const MAX_EXPERTS: usize = 1024;

/// Largest grid extent on axis y.
const MAX_GRID_Y: usize = 65535;

/// Scratch slot of the grouping buffer (after those of the GEMV and attention paths).
const SLOT_GROUP: usize = 10;

/// The grouped product's kernel of a weight type: on tensor cores (`mma`) or with DOT4_I8.
pub(super) fn grouped_kernel_name(type_name: &str, mma: bool) -> String {
    if mma {
        format!("k_moe_mma_{type_name}")
    } else {
        format!("k_moe_mm_{type_name}")
    }
}

/// The shape of one grouped product: pairs, experts, and the tiles of the work list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grouping {
    pairs: usize,
    experts: usize,
}

impl Grouping {
    /// The most tiles any routing of the pairs gives: at most one partial tile per used expert
    /// besides the whole ones.
    fn max_tiles(&self) -> usize {
        self.pairs.div_ceil(TILE_PAIRS) + self.experts.min(self.pairs)
    }

    /// Ints of the grouping buffer: tile count, offsets, pair lists, two per tile (`moe.cu`).
    fn buffer_ints(&self) -> usize {
        2 + self.experts + self.pairs + 2 * self.max_tiles()
    }
}

/// Whether a mul_mat_id of `n_tok` tokens over quantized experts takes the grouped path.
pub(super) fn takes_grouped(n_tok: usize) -> bool {
    n_tok > GROUPED_MIN_TOKENS
}

/// The GEMV arguments of the experts `a` (rows the kernels read) with one column per (slot,
/// token) pair of `ids` over activations of `b1` rows per token, into `d`.
fn pair_args(
    (a, la): (&TDesc, &Layout),
    b1: usize,
    (ids, lids): (&TDesc, &Layout),
    d: TDesc,
) -> GemvArgs {
    GemvArgs {
        ids: ids.ptr,
        ids_nb0: lids.nb[0] as i64,
        ids_nb1: lids.nb[1] as i64,
        ncols: 1,
        n_used: lids.ne[0] as i64,
        b1: b1 as i64,
        n_exp: la.ne[2] as i64,
        nz: (lids.ne[0] * lids.ne[1]) as i64,
        ..GemvArgs::of_weights(a, la, d.ptr)
    }
}

/// The experts' gate and up products over the same activations `b` (`[K, 1, T]`) and ids, with
/// their gated unit `out` (`glu_code`), as one GEMV launch: decode steps of a MoE layer. The
/// caller checks the shapes, that both weights have rows the kernels read in place, and that the
/// tokens are few enough for the GEMV path ([`takes_grouped`] false).
pub fn mul_mat_id_glu(
    r: &dyn Runner,
    [(gw, lgw, gd), (uw, luw, ud)]: [(TDesc, &Layout, TDesc); 2],
    (b, lb): (TDesc, &Layout),
    (ids, lids): (TDesc, &Layout),
    out: (TDesc, i32),
) -> Result<()> {
    let b1 = lb.ne[1];
    let gate = pair_args((&gw, lgw), b1, (&ids, lids), gd);
    let up = pair_args((&uw, luw), b1, (&ids, lids), ud);
    gemv::mul_mat_id_vec_glu(r, [(gate, (gw, lgw)), (up, (uw, luw))], (b, lb), out)
}

/// `dst[:, slot, token] = experts[ids[slot, token]] x b[:, slot % b1, token]`; ids out of range
/// give NaN columns.
pub fn mul_mat_id(
    r: &dyn Runner,
    (a, la): (TDesc, &Layout),
    (b, lb): (TDesc, &Layout),
    (ids, lids): (TDesc, &Layout),
    d: TDesc,
) -> Result<()> {
    let [_, m, n_exp, a3] = la.ne;
    let [_, b1, n_tok, _] = lb.ne;
    let n_used = lids.ne[0];
    if b1 == 0 || lids.ne[1] != n_tok || a3 != 1 || (b1 != 1 && b1 != n_used) {
        return Err(fail(
            r,
            format!(
                "mul_mat_id shapes {:?} x {:?} with ids {:?}",
                la.ne, lb.ne, lids.ne
            ),
        ));
    }
    let pairs = n_used * n_tok;
    let grouped = takes_grouped(n_tok)
        && la.dtype.is_quantized()
        && gemv::rows_readable(&a, la)
        && i32::try_from(pairs * b1).is_ok()
        && m.div_ceil(TILE_ROWS) <= MAX_GRID_Y
        && n_exp <= MAX_EXPERTS;
    let (a, la) = gemv::weights(r, a, la)?;
    let mut args = pair_args((&a, &la), b1, (&ids, lids), d);
    gemv::activations(r, b, lb, la.dtype, &mut args)?;
    if !grouped {
        args.vec = i64::from(gemv::vector_loads(&a, &la, args.x));
        return gemv::run(r, la.dtype, args);
    }
    let grouping = Grouping {
        pairs,
        experts: n_exp,
    };
    let group = r.scratch(SLOT_GROUP, 4 * grouping.buffer_ints())?;
    r.launch(&Launch {
        kernel: "k_moe_group".into(),
        grid: [1, 1, 1],
        threads: GROUP_THREADS,
        shared_bytes: 0,
        args: args![args, group],
    })?;
    let tn =
        type_name(la.dtype).ok_or_else(|| fail(r, format!("no MoE kernel for {}", la.dtype)))?;
    r.launch(&Launch {
        kernel: grouped_kernel_name(tn, r.has_mma() && crate::settings::settings().moe_mma).into(),
        grid: [grouping.max_tiles() as u32, m.div_ceil(TILE_ROWS) as u32, 1],
        threads: MM_THREADS,
        shared_bytes: 0,
        args: args![args, group],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::DType;

    #[test]
    fn constants_match_the_kernel_source() {
        let src = crate::kernels::shared_source();
        for line in [
            format!("#define MM_BM {TILE_ROWS}\n"),
            format!("#define MM_BN {TILE_PAIRS}\n"),
            format!("#define MM_THREADS {MM_THREADS}\n"),
            format!("#define MG_THREADS {GROUP_THREADS}\n"),
            format!("#define MG_MAX_EXPERTS {MAX_EXPERTS}\n"),
        ] {
            assert!(src.contains(&line), "{line}");
        }
        for t in DType::WEIGHTS.into_iter().filter(|t| t.is_quantized()) {
            let tn = type_name(t).unwrap();
            assert!(src.contains(&format!("MOE_KERNEL({tn}, ")), "{t}");
        }
    }

    /// Every split of `pairs` among `experts` (some maybe unused), as counts.
    fn routings(pairs: usize, experts: usize, counts: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if experts == 1 {
            counts.push(pairs);
            out.push(counts.clone());
            counts.pop();
            return;
        }
        for c in 0..=pairs {
            counts.push(c);
            routings(pairs - c, experts - 1, counts, out);
            counts.pop();
        }
    }

    #[test]
    fn the_work_list_holds_every_routing() {
        for (pairs, experts) in [(1, 1), (31, 2), (33, 2), (65, 3), (70, 4), (40, 5)] {
            let g = Grouping { pairs, experts };
            let mut all = Vec::new();
            routings(pairs, experts, &mut Vec::new(), &mut all);
            let most = all
                .iter()
                .map(|counts| counts.iter().map(|c| c.div_ceil(TILE_PAIRS)).sum::<usize>())
                .max()
                .unwrap();
            assert!(
                most <= g.max_tiles(),
                "{pairs} pairs over {experts}: {most}"
            );
        }
        let prompt = Grouping {
            pairs: 4096,
            experts: 128,
        };
        assert_eq!(prompt.max_tiles(), 256);
        assert_eq!(prompt.buffer_ints(), 2 + 128 + 4096 + 512);
    }
}

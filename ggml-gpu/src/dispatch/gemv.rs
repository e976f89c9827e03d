//! Matrix-vector products for few columns (the decode case, and mul_mat_id of few tokens through
//! [`super::moe`]): the `k_gemv_*` kernels of `gemv.cu` read the weights in their stored format. Activations are prepared once per call:
//! rounded to 8 bits with a scale and sum per 32 (`k_quantize_q8`) for quantized weights, F32
//! contiguous for float weights. K-quant rows that start 16-byte aligned are read in staged
//! chunks of [`CHUNK_UNITS`] units with 16-byte loads. Weights whose rows the kernels cannot read
//! directly (not contiguous along the row, or not aligned as their loads need) are converted to F32
//! first. Up to [`MAX_GROUP`] single-column products of one activation vector (q, k and v; gate and
//! up) can run as one launch ([`mul_mat_vec_group`]), the activations prepared once; gate and up
//! with their gated unit too ([`mul_mat_vec_glu`]).

use super::{args, contiguous_copy, fail, type_name, Launch, Runner, TDesc};
use ggml_core::{DType, Layout, Result};

/// Column counts the kernels are built for (a call takes the smallest that holds its columns).
pub const COLUMN_VARIANTS: [usize; 4] = [1, 2, 4, 8];

/// Most columns of one GEMV pass; wider products go to GEMM.
pub const MAX_COLUMNS: usize = 8;

/// Threads per block (`GV_THREADS`).
const THREADS: u32 = 128;

/// Warps a launch aims for (enough to fill a large GPU); below it rows get several warps each.
const TARGET_WARPS: usize = 8192;

/// Units of 32 weights of a staged chunk of quantized rows (`GV_CHUNK`).
const CHUNK_UNITS: usize = 64;

/// Largest grid extent on axes y and z.
const MAX_GRID_YZ: usize = 65535;

/// Scratch slots: converted weights, F32 activations, 8-bit activations, their scales.
const SLOT_WEIGHTS: usize = 0;
const SLOT_X: usize = 1;
const SLOT_XQ: usize = 2;
const SLOT_XD: usize = 3;

pub(super) fn kernel_name(type_name: &str, columns: usize) -> String {
    format!("k_gemv_{type_name}_{columns}")
}

pub(super) fn group_kernel_name(type_name: &str) -> String {
    format!("k_gemv_group_{type_name}")
}

pub(super) fn glu_kernel_name(type_name: &str) -> String {
    format!("k_gemv_glu_{type_name}")
}

/// Most products of one grouped launch (`GV_GROUP`).
pub const MAX_GROUP: usize = 3;

/// Arguments of a grouped GEMV launch; mirrors `struct GVGroup` in gemv.cu: the products' own
/// arguments and the first row block of each (then the total).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemvGroupArgs {
    pub g: [GemvArgs; MAX_GROUP],
    pub first: [i64; MAX_GROUP + 1],
    pub n: i64,
}

/// Arguments of a GEMV launch; mirrors `struct GV` in gemv.cu (every field 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemvArgs {
    pub w: u64,
    pub wnb1: i64,
    pub wnb2: i64,
    pub wnb3: i64,
    pub x: u64,
    pub xd: u64,
    pub d: u64,
    pub ids: u64,
    pub ids_nb0: i64,
    pub ids_nb1: i64,
    pub m: i64,
    pub k: i64,
    pub ncols: i64,
    pub b2: i64,
    pub r2: i64,
    pub r3: i64,
    pub n_used: i64,
    pub b1: i64,
    pub n_exp: i64,
    pub nz: i64,
    pub vec: i64,
    pub wpr: i64,
}

impl GemvArgs {
    /// The arguments naming weights `a` (rows, strides of rows and batches, row count and length)
    /// and the result at `d`; the caller sets the rest.
    pub(super) fn of_weights(a: &TDesc, la: &Layout, d: u64) -> GemvArgs {
        GemvArgs {
            w: a.ptr,
            wnb1: la.nb[1] as i64,
            wnb2: la.nb[2] as i64,
            wnb3: la.nb[3] as i64,
            d,
            m: la.ne[1] as i64,
            k: la.ne[0] as i64,
            ..Default::default()
        }
    }

    /// The arguments of the single-column product of weights `a` into `d` over the activations
    /// that `x` names (set by [`activations`]), with `vec` and `wpr` (the grouped and gated-unit
    /// launches).
    fn single_column(
        a: &TDesc,
        la: &Layout,
        d: u64,
        x: &GemvArgs,
        vec: bool,
        wpr: usize,
    ) -> GemvArgs {
        GemvArgs {
            x: x.x,
            xd: x.xd,
            ncols: 1,
            b2: 1,
            r2: 1,
            r3: 1,
            nz: 1,
            vec: i64::from(vec),
            wpr: wpr as i64,
            ..GemvArgs::of_weights(a, la, d)
        }
    }
}

/// The kernel-name part of weight type `wt`, or an error when no GEMV kernel takes it.
fn weight_type_name(r: &dyn Runner, wt: DType) -> Result<&'static str> {
    type_name(wt).ok_or_else(|| fail(r, format!("no GEMV kernel for {wt}")))
}

/// Alignment the kernels' loads of type `t` need of rows (and of the weights' start).
fn load_alignment(t: DType) -> u64 {
    match t {
        DType::Q4K | DType::Q5K | DType::Q4_0G | DType::Q8_0G => 16,
        DType::Q4_1 | DType::Q5_1 | DType::F32 => 4,
        DType::MXFP4 => 1,
        _ => 2,
    }
}

/// True when the kernels read the rows of `a` where they are: contiguous along the row and aligned.
pub fn rows_readable(a: &TDesc, l: &Layout) -> bool {
    let row_contiguous = l.ne[0] <= 1 || l.nb[0] == l.dtype.type_size();
    let align = load_alignment(l.dtype);
    let addr_bits = a.ptr | l.nb[1] as u64 | l.nb[2] as u64 | l.nb[3] as u64;
    type_name(l.dtype).is_some() && row_contiguous && addr_bits.is_multiple_of(align)
}

/// True when rows of `a` (and the batches) start 16-byte aligned.
fn rows_aligned16(a: &TDesc, l: &Layout) -> bool {
    (a.ptr | l.nb[1] as u64 | l.nb[2] as u64 | l.nb[3] as u64).is_multiple_of(16)
}

/// Quantized types whose aligned rows the kernels stage in chunks (`staged_type` in gemv.cu).
fn staged_type(t: DType) -> bool {
    matches!(t, DType::Q4K | DType::Q5K | DType::Q6K)
}

/// The kernels' `vec` flag: K-quant rows are staged in 16-byte chunks when aligned; float rows
/// and the activation columns at `x` (K elements) take 16-byte vector loads when K % 8 == 0 and
/// both are aligned.
pub(super) fn vector_loads(a: &TDesc, l: &Layout, x: u64) -> bool {
    if l.dtype.is_quantized() {
        return staged_type(l.dtype) && rows_aligned16(a, l);
    }
    l.ne[0].is_multiple_of(8) && x.is_multiple_of(16) && rows_aligned16(a, l)
}

/// `a` as GEMV weights: itself when its rows are readable, else a contiguous F32 copy in scratch.
pub(super) fn weights(r: &dyn Runner, a: TDesc, la: &Layout) -> Result<(TDesc, Layout)> {
    if rows_readable(&a, la) {
        return Ok((a, *la));
    }
    let copy = contiguous_copy(r, a, la, DType::F32, SLOT_WEIGHTS)?;
    Ok((copy, Layout::contiguous(DType::F32, la.ne)))
}

/// Where the 8-bit activations of `n` values and their scales go: scratch slots the products'
/// [`activations`] read, and which a norm chain before them may fill ([`mark_rounded`]).
pub(super) fn q8_scratch(r: &dyn Runner, n: usize) -> Result<(u64, u64)> {
    Ok((r.scratch(SLOT_XQ, n)?, r.scratch(SLOT_XD, n / 32 * 8)?))
}

thread_local! {
    /// The F32 activations (address, count) whose 8-bit copy the launch just queued wrote into
    /// [`q8_scratch`]: the next products over them skip `k_quantize_q8`. Set by the norm chain
    /// of [`super::fuse`], taken by the next [`activations`], cleared after every launch group.
    static ROUNDED: std::cell::Cell<Option<(u64, usize)>> = const { std::cell::Cell::new(None) };
}

/// Records that the launch just queued wrote the 8-bit copy of the `n` F32 values at `ptr` into
/// [`q8_scratch`].
pub(super) fn mark_rounded(ptr: u64, n: usize) {
    ROUNDED.with(|c| c.set(Some((ptr, n))));
}

/// Forgets [`mark_rounded`]'s record (the launch group after the one that made it has run).
pub(super) fn forget_rounded() {
    ROUNDED.with(|c| c.set(None));
}

/// The activations `b` as the kernels for weights of type `wt` take them; sets `x`, `xd`, `vec`.
/// Quantized weights take an 8-bit copy, made here unless the launch before wrote it.
pub(super) fn activations(
    r: &dyn Runner,
    b: TDesc,
    lb: &Layout,
    wt: DType,
    args: &mut GemvArgs,
) -> Result<()> {
    let n = lb.nelements();
    if wt.is_quantized() {
        let (xq, xd) = q8_scratch(r, n)?;
        let rounded = ROUNDED.with(|c| c.take()) == Some((b.ptr, n));
        if !(rounded && lb.dtype == DType::F32 && lb.is_contiguous()) {
            r.launch(&Launch::elementwise("k_quantize_q8", n, args![b, xq, xd]))?;
        }
        args.x = xq;
        args.xd = xd;
    } else if lb.dtype == DType::F32 && lb.is_contiguous() {
        args.x = b.ptr;
    } else {
        args.x = contiguous_copy(r, b, lb, DType::F32, SLOT_X)?.ptr;
    }
    Ok(())
}

/// Work items along a row of `k` weights of type `t` that warps of a row share: staged chunks of
/// [`CHUNK_UNITS`] units (quantized rows read in chunks), or units of 8 floats per lane.
fn row_work(t: DType, k: usize, staged: bool) -> usize {
    match (t.is_quantized(), staged) {
        (true, true) => (k / 32).div_ceil(CHUNK_UNITS),
        (true, false) => k / 32 / (2 * 32),
        (false, _) => k / 8 / (2 * 32),
    }
}

/// Warps per row (1, 2 or 4): one while the rows alone give [`TARGET_WARPS`] warps, more for
/// fewer rows as long as every warp keeps at least one work item of [`row_work`] (a chunk, or
/// two units per lane).
fn warps_per_row(rows: usize, work: usize) -> usize {
    let mut w = 1;
    while w < 4 && rows * w < TARGET_WARPS && work >= 2 * w {
        w *= 2;
    }
    w
}

/// Launches the kernel for weights of type `wt` over `args.nz` column groups of `args.ncols`.
pub(super) fn run(r: &dyn Runner, wt: DType, args: GemvArgs) -> Result<()> {
    let columns = COLUMN_VARIANTS
        .into_iter()
        .find(|&c| c >= args.ncols as usize)
        .ok_or_else(|| fail(r, format!("GEMV of {} columns", args.ncols)))?;
    // Row pairs: one column of quantized weights through the two-column kernel, whose row groups
    // take two rows sharing each load of the 8-bit activations (measured on an H100: Q4_0 decode
    // 320.4 -> 328.0 t/s; F16 157.5 -> 156.8, so float weights keep one row).
    let columns = if columns == 1 && wt.is_quantized() && crate::settings::settings().gemv_row_pairs
    {
        2
    } else {
        columns
    };
    let rows_per_group = if columns == 1 { 1 } else { 2 };
    let wpr = warps_per_row(
        args.m as usize * args.nz as usize,
        row_work(wt, args.k as usize, args.vec != 0),
    );
    let rows_per_block = rows_per_group * (THREADS as usize / 32) / wpr;
    let name = kernel_name(weight_type_name(r, wt)?, columns);
    let nz = args.nz as usize;
    let gy = nz.clamp(1, MAX_GRID_YZ);
    let blocks = (args.m as usize).div_ceil(rows_per_block);
    let args = GemvArgs {
        wpr: wpr as i64,
        ..args
    };
    r.launch(&Launch {
        kernel: name.into(),
        grid: [blocks as u32, gy as u32, nz.div_ceil(gy) as u32],
        threads: THREADS,
        shared_bytes: 0,
        args: args![args],
    })
}

/// `dst[m, n] = dot(a row m, b column n)` per batch, for `b` of at most [`MAX_COLUMNS`] columns
pub(super) fn mul_mat_vec(
    r: &dyn Runner,
    (a, la): (TDesc, &Layout),
    (b, lb): (TDesc, &Layout),
    d: TDesc,
) -> Result<()> {
    let (a, la) = weights(r, a, la)?;
    let [_, _, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    let mut args = GemvArgs {
        ncols: n as i64,
        b2: b2 as i64,
        r2: (b2 / a2) as i64,
        r3: (b3 / a3) as i64,
        nz: (b2 * b3) as i64,
        ..GemvArgs::of_weights(&a, &la, d.ptr)
    };
    activations(r, b, lb, la.dtype, &mut args)?;
    args.vec = i64::from(vector_loads(&a, &la, args.x));
    run(r, la.dtype, args)
}

/// Whether the products `(weights, their layout, result)` with the one activation vector `lb` run
/// as one grouped launch: 2 to [`MAX_GROUP`] two-dimensional products of one column, the weights
/// of one type and row length with rows the kernels read in place.
pub fn groupable(products: &[(TDesc, &Layout, TDesc)], lb: &Layout) -> bool {
    let Some(&(_, first, _)) = products.first() else {
        return false;
    };
    (2..=MAX_GROUP).contains(&products.len())
        && lb.ne[1..] == [1, 1, 1]
        && products.iter().all(|(a, la, _)| {
            la.dtype == first.dtype
                && la.ne[0] == lb.ne[0]
                && la.ne[2..] == [1, 1]
                && rows_readable(a, la)
        })
}

/// `d_i = a_i b` for the products `(a_i, layout, d_i)` of one activation column `b` in one launch
/// (the caller checks [`groupable`]).
pub fn mul_mat_vec_group(
    r: &dyn Runner,
    products: &[(TDesc, &Layout, TDesc)],
    (b, lb): (TDesc, &Layout),
) -> Result<()> {
    let wt = products[0].1.dtype;
    let k = lb.ne[0];
    let mut x = GemvArgs::default();
    activations(r, b, lb, wt, &mut x)?;
    let total_rows: usize = products.iter().map(|(_, la, _)| la.ne[1]).sum();
    let mut group = GemvGroupArgs {
        n: products.len() as i64,
        ..Default::default()
    };
    let mut blocks = 0usize;
    for (i, (a, la, d)) in products.iter().enumerate() {
        let vec = vector_loads(a, la, x.x);
        let wpr = warps_per_row(total_rows, row_work(wt, k, vec));
        group.g[i] = GemvArgs::single_column(a, la, d.ptr, &x, vec, wpr);
        group.first[i] = blocks as i64;
        blocks += la.ne[1].div_ceil(THREADS as usize / 32 / wpr);
    }
    group.first[products.len()..].fill(blocks as i64);
    let name = group_kernel_name(weight_type_name(r, wt)?);
    r.launch(&Launch {
        kernel: name.into(),
        grid: [blocks as u32, 1, 1],
        threads: THREADS,
        shared_bytes: 0,
        args: args![group],
    })
}

/// One single-column product of a gated unit: weights (descriptor, layout) and result.
pub type GluProduct<'a> = (TDesc, &'a Layout, TDesc);

/// `gate = a_gate b`, `up = a_up b` and `out = glu(gate, up)` (`glu_code`: the `G_*` code of
/// elementwise.cu) in one launch, for weights of one type and row count (the caller checks
/// [`groupable`] and the row counts; `out` holds as many F32 as a weight has rows).
pub fn mul_mat_vec_glu(
    r: &dyn Runner,
    (gate, up): (GluProduct, GluProduct),
    (b, lb): (TDesc, &Layout),
    out: (TDesc, i32),
) -> Result<()> {
    let wt = gate.1.dtype;
    let [k, m, _, _] = gate.1.ne;
    let mut x = GemvArgs::default();
    activations(r, b, lb, wt, &mut x)?;
    let vec = vector_loads(&gate.0, gate.1, x.x) && vector_loads(&up.0, up.1, x.x);
    let wpr = warps_per_row(m, row_work(wt, k, vec));
    let product = |(a, la, d): GluProduct| GemvArgs::single_column(&a, la, d.ptr, &x, vec, wpr);
    launch_glu(r, wt, [product(gate), product(up)], out)
}

/// The gate and up products of mul_mat_id and their gated unit `out` in one launch: per product
/// its arguments with the ids (one column per (slot, token) pair, activations not yet set) and its
/// weights (readable in place, of one type and row count).
pub(super) fn mul_mat_id_vec_glu(
    r: &dyn Runner,
    [(mut gate, gw), (mut up, uw)]: [(GemvArgs, (TDesc, &Layout)); 2],
    (b, lb): (TDesc, &Layout),
    out: (TDesc, i32),
) -> Result<()> {
    let wt = gw.1.dtype;
    activations(r, b, lb, wt, &mut gate)?;
    let vec = vector_loads(&gw.0, gw.1, gate.x) && vector_loads(&uw.0, uw.1, gate.x);
    let wpr = warps_per_row(
        gate.m as usize * gate.nz as usize,
        row_work(wt, gate.k as usize, vec),
    );
    (up.x, up.xd) = (gate.x, gate.xd);
    for g in [&mut gate, &mut up] {
        g.vec = i64::from(vec);
        g.wpr = wpr as i64;
    }
    launch_glu(r, wt, [gate, up], out)
}

/// Launches `k_gemv_glu_<wt>` over the rows of `gate` and `up` (sharing the activations, `vec`
/// and `wpr`) and, with ids, their `nz` pairs.
fn launch_glu(
    r: &dyn Runner,
    wt: DType,
    [gate, up]: [GemvArgs; 2],
    (out, glu_code): (TDesc, i32),
) -> Result<()> {
    let rows_per_block = THREADS as usize / 32 / gate.wpr as usize;
    let pairs = if gate.ids == 0 { 1 } else { gate.nz as usize };
    if pairs > MAX_GRID_YZ {
        return Err(fail(r, format!("gated unit of {pairs} pairs")));
    }
    let name = glu_kernel_name(weight_type_name(r, wt)?);
    r.launch(&Launch {
        kernel: name.into(),
        grid: [
            (gate.m as usize).div_ceil(rows_per_block) as u32,
            pairs as u32,
            1,
        ],
        threads: THREADS,
        shared_bytes: 0,
        args: args![gate, up, out.ptr, glu_code],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_match_the_cuda_struct() {
        assert_eq!(std::mem::size_of::<GemvArgs>(), 22 * 8);
        assert_eq!(
            std::mem::size_of::<GemvGroupArgs>(),
            MAX_GROUP * 22 * 8 + (MAX_GROUP + 2) * 8
        );
        let src = crate::kernels::shared_source();
        assert!(src.contains(&format!("#define GV_GROUP {MAX_GROUP}\n")));
    }

    #[test]
    fn groups_take_single_columns_of_one_weight_type() {
        let q = Layout::contiguous(DType::Q4_0, [256, 64, 1, 1]);
        let k = Layout::contiguous(DType::Q4_0, [256, 16, 1, 1]);
        let f = Layout::contiguous(DType::F16, [256, 16, 1, 1]);
        let x = Layout::contiguous(DType::F32, [256, 1, 1, 1]);
        let at = |ptr: u64, l: &Layout| TDesc::new(ptr, l).unwrap();
        let (dq, dk, df) = (at(0, &q), at(1 << 20, &k), at(2 << 20, &f));
        let out = TDesc::absent();
        assert!(groupable(
            &[(dq, &q, out), (dk, &k, out), (dk, &k, out)],
            &x
        ));
        assert!(!groupable(&[(dq, &q, out)], &x), "one product");
        assert!(!groupable(&[(dq, &q, out); 4], &x), "more than MAX_GROUP");
        assert!(
            !groupable(&[(dq, &q, out), (df, &f, out)], &x),
            "two weight types"
        );
        let two = Layout::contiguous(DType::F32, [256, 2, 1, 1]);
        assert!(
            !groupable(&[(dq, &q, out), (dk, &k, out)], &two),
            "two columns"
        );
        let short = Layout::contiguous(DType::F32, [128, 1, 1, 1]);
        assert!(
            !groupable(&[(dq, &q, out), (dk, &k, out)], &short),
            "row length"
        );
    }

    #[test]
    fn warps_per_row_fill_the_gpu_without_idle_lanes() {
        // F16 rows of 4096: 8 units of 8 per lane, rows of 14336 more.
        assert_eq!(warps_per_row(14336, row_work(DType::F16, 4096, true)), 1);
        assert_eq!(warps_per_row(4096, row_work(DType::F16, 4096, true)), 2);
        assert_eq!(warps_per_row(1024, row_work(DType::F16, 14336, true)), 4);
        assert_eq!(warps_per_row(1024, row_work(DType::F16, 800, true)), 1);
        // Staged Q4_K rows of 4096: two chunks, so two warps per row for 4096 rows.
        assert_eq!(warps_per_row(4096, row_work(DType::Q4K, 4096, true)), 2);
        assert_eq!(warps_per_row(1024, row_work(DType::Q4K, 14336, true)), 4);
        assert_eq!(warps_per_row(14336, row_work(DType::Q4K, 4096, true)), 1);
        assert_eq!(warps_per_row(4096, row_work(DType::Q4_0, 4096, false)), 2);
        assert_eq!(warps_per_row(3, 1), 1);
    }

    #[test]
    fn readable_rows_need_contiguity_and_alignment() {
        let q4k = Layout::contiguous(DType::Q4K, [512, 4, 1, 1]);
        assert!(rows_readable(&TDesc::new(256, &q4k).unwrap(), &q4k));
        assert!(!rows_readable(&TDesc::new(258, &q4k).unwrap(), &q4k));
        let q4_0 = Layout::contiguous(DType::Q4_0, [64, 3, 1, 1]);
        assert!(rows_readable(&TDesc::new(258, &q4_0).unwrap(), &q4_0));
        let mut f16 = Layout::contiguous(DType::F16, [8, 3, 1, 1]);
        f16.nb.swap(0, 1);
        assert!(!rows_readable(&TDesc::new(0, &f16).unwrap(), &f16));
    }

    #[test]
    fn every_type_and_column_count_has_a_kernel() {
        let names = super::super::kernel_names();
        for t in DType::WEIGHTS {
            for c in COLUMN_VARIANTS {
                assert!(names.contains(&kernel_name(type_name(t).unwrap(), c)));
            }
            assert!(names.contains(&group_kernel_name(type_name(t).unwrap())));
            assert!(names.contains(&glu_kernel_name(type_name(t).unwrap())));
        }
        assert!(COLUMN_VARIANTS.contains(&MAX_COLUMNS));
    }
}

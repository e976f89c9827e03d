//! flash_attn_ext dispatch. Few queries per KV head (decode), or a backend without batched BLAS,
//! go to `k_flash_attn_vec` when K and V are F16/BF16/F32 rows of whole 16-byte chunks (blocks of
//! up to [`FAV_MAX_HEADS`] query heads of a GQA group, fewer for wide V rows, the keys split over
//! blocks in tiles of [`FAV_TILE`]), else to `k_flash_attn` (one block per head, query and
//! sequence); either splits over the keys when the rows alone leave the GPU idle, merged by
//! `k_flash_attn_combine`. Many queries (prompt processing) take `k_flash_attn_mma_*` on a GPU
//! with F16 tensor cores where the heads are 64 or 128 wide and K/V are F16 or Q8_0 rows (flash
//! attention on tensor cores, no score matrix; `k_fm_tile_classes` first classes the mask's tiles
//! for its blocks), else the BLAS path: per sequence and chunk of
//! queries, scores = K·Q^T as one strided batched GEMM over the KV heads (the query heads of a
//! group are one operand), `k_attn_softmax` to probabilities, and one batched GEMM per query head
//! of a group writing P·V into the result in place.

use super::{args, contiguous_copy, fail, KernelArg, Launch, Runner, TDesc};
use ggml_core::{DType, Graph, Layout, Result, TensorId};

/// Threads per `k_flash_attn` block (`FA_THREADS` in attention.cu).
pub(super) const FA_THREADS: u32 = 128;
/// Threads per `k_flash_attn_combine` and `k_attn_softmax` block.
const ROW_THREADS: u32 = 256;
/// Blocks a `k_flash_attn` launch aims for (a few per SM of a large GPU).
const FA_TARGET_BLOCKS: usize = 512;
/// Fewest keys one split handles.
const FA_MIN_KEYS_PER_SPLIT: usize = 256;
/// Blocks a `k_flash_attn_vec` launch aims for (two per SM of an H200 at its 254 registers per
/// thread; 256 measured faster than 512 and 1024 from 16 to 32,768 keys).
const FAV_TARGET_BLOCKS: usize = 256;
/// Threads per `k_flash_attn_vec` block (`FAV_THREADS` in attention_vec.cu).
const FAV_THREADS: u32 = 128;
/// Keys per tile of `k_flash_attn_vec` (a split is whole tiles).
const FAV_TILE: usize = 64;
/// Most query heads one `k_flash_attn_vec` block takes.
const FAV_MAX_HEADS: usize = 4;
/// Longest K or V row (bytes) of `k_flash_attn_vec`.
const FAV_MAX_ROW_BYTES: usize = 1024;
/// Bytes of a K or V row one `k_flash_attn_vec` pass reads.
const FAV_PASS_BYTES: usize = 256;
/// Heads times V passes of the per-thread sums of a `k_flash_attn_vec` block.
const FAV_SLOTS: usize = 4;
/// Fewest queries per sequence for the BLAS path and `k_flash_attn_mma_*`.
const FA_BLAS_MIN_QUERIES: usize = 16;
/// Query rows per warp of `k_flash_attn_mma_*` (`FM_ROWS` in attention_mma.cu); a block has
/// [`mma_warps`] warps.
const FM_ROWS_PER_WARP: usize = 16;
/// Most bytes of scores and probabilities of one chunk of queries on the BLAS path.
const FA_BLAS_CHUNK_BYTES: usize = 256 << 20;
/// Scratch slots: per-split partials; the BLAS path's queries, scores, probabilities, K and V.
const SLOT_ATTN_PARTS: usize = 4;
const SLOT_ATTN_Q: usize = 5;
const SLOT_ATTN_SCORES: usize = 6;
const SLOT_ATTN_PROBS: usize = 7;
const SLOT_ATTN_K: usize = 8;
const SLOT_ATTN_V: usize = 9;
/// The mask's tile classes of `k_fm_tile_classes` for `k_flash_attn_mma_*`.
const SLOT_ATTN_TILE_CLASSES: usize = 11;
/// Keys per tile of `k_flash_attn_mma_*` and `k_fm_tile_classes` (`FM_BK` in attention_mma.cu).
const FM_TILE_KEYS: usize = 64;

/// One column-major strided batched BLAS product per batch index `i`:
/// `d_i[m, n] = op(a_i) op(b_i)` with `op` a transposition where `trans_*` is set (`a_i` is
/// `[k, m]` stored when transposed, else `[m, k]`), F32 accumulation and an F32 result; operand
/// `x_i` starts `i * stride_x` elements after `x`, leading dimensions in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchedGemmCall {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub dtype: DType,
    pub a: u64,
    pub lda: i32,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: i32,
    pub stride_b: i64,
    pub d: u64,
    pub ldd: i32,
    pub stride_d: i64,
    pub batch: i32,
}

/// The operands of one flash_attn_ext node.
pub(super) struct Attn<'a> {
    q: TDesc,
    k: TDesc,
    v: TDesc,
    mask: TDesc,
    sinks: TDesc,
    d: TDesc,
    lq: &'a Layout,
    lk: &'a Layout,
    lv: &'a Layout,
    ld: &'a Layout,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    has_mask: i32,
    has_sinks: i32,
}

/// Computes flash_attn_ext `node` of `graph` (`[scale, max_bias, softcap]`); with `q8` (the
/// 8-bit activations' values and scales of [`super::gemv::q8_scratch`]) also rounds the result to
/// 8 bits for the quantized product after it where the decode kernels can ([`rounds_to_q8`]).
/// Whether it did.
pub(super) fn flash_attn_ext(
    r: &dyn Runner,
    graph: &Graph,
    node: TensorId,
    [scale, max_bias, softcap]: [f32; 3],
    q8: Option<(u64, u64)>,
) -> Result<bool> {
    let t = graph.tensor(node);
    let desc = |i: usize| match t.src.get(i) {
        Some(&s) => r.desc(graph, s),
        None => Ok(TDesc::absent()),
    };
    let a = Attn {
        q: desc(0)?,
        k: desc(1)?,
        v: desc(2)?,
        mask: desc(3)?,
        sinks: desc(4)?,
        d: r.desc(graph, node)?,
        lq: graph.layout(t.src[0]),
        lk: graph.layout(t.src[1]),
        lv: graph.layout(t.src[2]),
        ld: &t.layout,
        scale,
        max_bias,
        softcap,
        has_mask: i32::from(t.src.len() > 3),
        has_sinks: i32::from(t.src.len() > 4),
    };
    if mma_fits(r, &a) {
        mma_blocks(r, &a)?;
    } else if r.has_gemm_batched() && blas_fits(&a) {
        through_blas(r, &a)?;
    } else if vec_attention_on() && vec_fits(&a) {
        let q8 = q8.filter(|_| rounds_to_q8(&a));
        vec_blocks(r, &a, q8.unwrap_or((0, 0)))?;
        return Ok(q8.is_some());
    } else {
        row_blocks(r, &a)?;
    }
    Ok(false)
}

/// Whether the decode kernels (`k_flash_attn_vec`, `k_flash_attn_combine`) can round the result
/// to 8 bits as they write it: F32 rows, contiguous, of whole units of 32 (a warp writes a unit).
pub(super) fn rounds_to_q8(a: &Attn) -> bool {
    a.ld.dtype == DType::F32 && a.ld.is_contiguous() && a.ld.ne[0].is_multiple_of(32)
}

/// Splits of the KV axis for `rows` query rows over `n_kv` keys, and the keys per split (a multiple
/// of [`FA_THREADS`]): one split unless the rows alone leave the GPU idle and the KV is long.
fn attention_splits(rows: usize, n_kv: usize) -> (usize, usize) {
    let wanted = FA_TARGET_BLOCKS.div_ceil(rows.max(1));
    let most = n_kv.div_ceil(FA_MIN_KEYS_PER_SPLIT);
    let splits = wanted.min(most).max(1);
    let per = n_kv
        .div_ceil(splits)
        .next_multiple_of(FA_THREADS as usize)
        .max(FA_THREADS as usize);
    (n_kv.div_ceil(per).max(1), per)
}

/// How `k_flash_attn_vec` covers a node: query heads per block, blocks per split (head blocks
/// times KV heads, queries and sequences), splits of the keys and keys per split (whole tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct VecPlan {
    heads_per_block: usize,
    blocks: usize,
    splits: usize,
    kv_per_split: usize,
}

/// The plan for `group` query heads per KV head, `rows_per_head` = KV heads x queries x
/// sequences, over `n_kv` keys, aiming at `target` blocks ([`FAV_TARGET_BLOCKS`] unless
/// `GGML_TP_ATTN_VEC_BLOCKS` says otherwise): the heads of a group share a block (up to
/// `max_heads`) when the shared blocks, one per tile at most, still fill half of the target;
/// otherwise one head per block. Then as many splits as bring the blocks to the target, one tile
/// each at least.
fn vec_plan(
    group: usize,
    rows_per_head: usize,
    n_kv: usize,
    target: usize,
    max_heads: usize,
) -> VecPlan {
    let tiles = n_kv.div_ceil(FAV_TILE).max(1);
    let shared = group.clamp(1, max_heads.max(1));
    let shared_blocks = group.div_ceil(shared) * rows_per_head.max(1);
    let heads_per_block = if shared_blocks * tiles >= target / 2 {
        shared
    } else {
        1
    };
    let blocks = group.div_ceil(heads_per_block) * rows_per_head.max(1);
    let wanted = target.div_ceil(blocks).clamp(1, tiles);
    let kv_per_split = tiles.div_ceil(wanted) * FAV_TILE;
    VecPlan {
        heads_per_block,
        blocks,
        splits: n_kv.div_ceil(kv_per_split).max(1),
        kv_per_split,
    }
}

/// Whether `k_flash_attn_vec` reads `t` (K or V, laid out as `l`): F16, BF16 or F32 elements in
/// rows of whole 16-byte chunks (at most [`FAV_MAX_ROW_BYTES`]), every row 16-byte aligned, rows
/// less than 4 GiB apart (the kernel's row offsets are one 32 x 32-bit product).
fn vec_operand(t: &TDesc, l: &Layout) -> bool {
    let es = l.dtype.type_size();
    let row = l.ne[0] * es;
    matches!(l.dtype, DType::F16 | DType::BF16 | DType::F32)
        && l.nb[0] == es
        && row.is_multiple_of(16)
        && (1..=FAV_MAX_ROW_BYTES).contains(&row)
        && t.ptr.is_multiple_of(16)
        && l.nb[1..].iter().all(|nb| nb.is_multiple_of(16))
        && l.nb[1] < 1 << 32
}

/// Whether decode attention may take `k_flash_attn_vec` (`GGML_TP_ATTN_VEC=0` keeps
/// `k_flash_attn`, for A/B measurements).
fn vec_attention_on() -> bool {
    crate::settings::settings().attn_vec
}

/// Whether the node takes `k_flash_attn_vec`: readable K and V, whole GQA groups, counts in i32.
fn vec_fits(a: &Attn) -> bool {
    let heads = a.lq.ne[2];
    let kv_heads = a.lk.ne[2];
    vec_operand(&a.k, a.lk)
        && vec_operand(&a.v, a.lv)
        && kv_heads > 0
        && heads.is_multiple_of(kv_heads)
        && a.lv.ne[2] == kv_heads
        && a.lk.ne[1] < (1 << 30)
}

/// Most query heads of a `k_flash_attn_vec` block over V laid out as `lv`: each thread keeps
/// [`FAV_SLOTS`] sums of 16 bytes of V, one per head and pass of [`FAV_PASS_BYTES`] (passes
/// rounded up to a power of two, as the kernel's bodies of 1, 2 and 4 heads take them).
fn vec_max_heads(lv: &Layout) -> usize {
    let passes = (lv.ne[0] * lv.dtype.type_size()).div_ceil(FAV_PASS_BYTES);
    (FAV_SLOTS / passes.max(1).next_power_of_two()).clamp(1, FAV_MAX_HEADS)
}

/// `k_flash_attn_vec`: blocks of query heads of one group per KV head, query and sequence, and
/// split of the keys; `(xq, xd)` the result's 8-bit copy ((0, 0): none).
fn vec_blocks(r: &dyn Runner, a: &Attn, (xq, xd): (u64, u64)) -> Result<()> {
    let [_, n_q, heads, seqs] = a.lq.ne;
    let [_, n_kv, kv_heads, _] = a.lk.ne;
    let target = crate::settings::settings()
        .attn_vec_blocks
        .unwrap_or(FAV_TARGET_BLOCKS);
    let plan = vec_plan(
        heads / kv_heads,
        kv_heads * n_q * seqs,
        n_kv,
        target,
        vec_max_heads(a.lv),
    );
    let kernel = vec_kernel(plan.heads_per_block, a.lk.dtype, a.lv.dtype);
    let heads_per_block = args![plan.heads_per_block as i32];
    let blocks = (plan.blocks, FAV_THREADS);
    let split = (plan.splits, plan.kv_per_split);
    let q8 = Some((xq, xd));
    attend_in_splits(r, a, kernel, blocks, heads_per_block, split, q8)
}

/// The `k_flash_attn_vec` entry point for blocks of `heads_per_block` heads: the body of the
/// fewest heads that covers them (1, 2 or [`FAV_MAX_HEADS`]), with the element type fixed where
/// K and V are F16 (one body per kernel: see `FAV_KERNEL` in attention_vec.cu).
fn vec_kernel(heads_per_block: usize, k: DType, v: DType) -> &'static str {
    let body = match heads_per_block {
        1 => 0,
        2 => 1,
        _ => 2,
    };
    let f16 = k == DType::F16 && v == DType::F16;
    VEC_KERNELS[body + if f16 { 0 } else { 3 }]
}

/// The `k_flash_attn_vec` entry points (`FAV_KERNEL` in attention_vec.cu): bodies of 1, 2 and
/// [`FAV_MAX_HEADS`] heads over F16 K and V, then the same over K and V of any type.
pub(crate) const VEC_KERNELS: [&str; 6] = [
    "k_flash_attn_vec_h1_f16",
    "k_flash_attn_vec_h2_f16",
    "k_flash_attn_vec_h4_f16",
    "k_flash_attn_vec_h1",
    "k_flash_attn_vec_h2",
    "k_flash_attn_vec_h4",
];

/// `k_flash_attn`: one block per output row (head, query, sequence) and split of the keys.
fn row_blocks(r: &dyn Runner, a: &Attn) -> Result<()> {
    let rows = a.ld.nrows();
    let split = attention_splits(rows, a.lk.ne[1]);
    attend_in_splits(
        r,
        a,
        "k_flash_attn",
        (rows, FA_THREADS),
        vec![],
        split,
        None,
    )
}

/// Launches `kernel` (`k_flash_attn` or `k_flash_attn_vec`) on `blocks` blocks of `threads`
/// threads per split of the keys (`splits` of `kv_per_split` keys): the node's operands, then the
/// kernel's own arguments `own`, the keys per split and the per-split partials (none for one
/// split, when the kernel writes the result), then for a kernel that takes them (`q8` set) the
/// result's 8-bit copy, `(0, 0)` for none; then `k_flash_attn_combine` merges the partials (and
/// makes that copy instead).
fn attend_in_splits(
    r: &dyn Runner,
    a: &Attn,
    kernel: &'static str,
    (blocks, threads): (usize, u32),
    own: Vec<KernelArg>,
    (splits, kv_per_split): (usize, usize),
    q8: Option<(u64, u64)>,
) -> Result<()> {
    let rows = a.ld.nrows();
    let part = if splits == 1 {
        0u64
    } else {
        r.scratch(SLOT_ATTN_PARTS, rows * splits * (a.ld.ne[0] + 2) * 4)?
    };
    let mut args = node_args(a);
    args.extend(own);
    args.extend(args![kv_per_split as i32, part]);
    let (xq, xd) = q8.unwrap_or((0, 0));
    if q8.is_some() {
        let (own_xq, own_xd) = if splits == 1 { (xq, xd) } else { (0, 0) };
        args.extend(args![own_xq, own_xd]);
    }
    let mut attend = Launch::rows(kernel, blocks, threads, 0, args);
    attend.grid[1] = splits as u32;
    r.launch(&attend)?;
    if splits == 1 {
        return Ok(());
    }
    let args = args![a.sinks, a.d, a.has_sinks, splits as i32, part, xq, xd];
    r.launch(&Launch::rows(
        "k_flash_attn_combine",
        rows,
        ROW_THREADS,
        0,
        args,
    ))
}

/// Whether the node takes `k_flash_attn_mma_*`: a GPU with F16 tensor cores, prompt-sized query
/// counts, heads of 64 or 128 for Q, K and V alike in whole GQA groups, K and V of F16 rows
/// (16-byte aligned, whole 16-byte loads) or Q8_0 rows, float queries, a contiguous F32 result.
fn mma_fits(r: &dyn Runner, a: &Attn) -> bool {
    let [d, n_q, n_head, n_seq] = a.lq.ne;
    let rows_of = |t: &TDesc, l: &Layout| {
        let align = match l.dtype {
            DType::F16 => 16,
            DType::Q8_0 => 2,
            _ => return false,
        };
        l.nb[0] == l.dtype.type_size()
            && std::iter::once(t.ptr as usize)
                .chain(l.nb[1..].iter().copied())
                .all(|v| v % align == 0)
    };
    let blocks = n_q.div_ceil(mma_rows()) * n_head * n_seq;
    crate::settings::settings().attn_mma
        && r.has_mma()
        && n_q >= FA_BLAS_MIN_QUERIES
        && matches!(d, 64 | 128)
        && a.lk.ne[0] == d
        && a.lv.ne[0] == d
        && a.lk.ne[2] > 0
        && n_head.is_multiple_of(a.lk.ne[2])
        && matches!(a.lq.dtype, DType::F32 | DType::F16 | DType::BF16)
        && rows_of(&a.k, a.lk)
        && rows_of(&a.v, a.lv)
        && a.ld.dtype == DType::F32
        && a.ld.is_contiguous()
        && a.lk.ne[1] < (1 << 30)
        && blocks < (1 << 31)
        && tile_class_blocks(a, mma_rows()) < (1 << 31)
}

/// The node's operands and options: the first arguments of every attention kernel.
fn node_args(a: &Attn) -> Vec<KernelArg> {
    args![
        a.q,
        a.k,
        a.v,
        a.mask,
        a.sinks,
        a.d,
        a.scale,
        a.max_bias,
        a.softcap,
        a.has_mask,
        a.has_sinks
    ]
}

/// Warps per `k_flash_attn_mma_*` block (at most `FM_WARPS` of attention_mma.cu).
fn mma_warps() -> usize {
    crate::settings::settings().attn_mma_warps
}

/// Query rows per `k_flash_attn_mma_*` block: [`mma_warps`] times [`FM_ROWS_PER_WARP`].
fn mma_rows() -> usize {
    FM_ROWS_PER_WARP * mma_warps()
}

/// `k_fm_tile_classes` blocks (and class bytes) for blocks of `rows` query rows: one per tile of
/// [`FM_TILE_KEYS`] keys, block of rows and mask head and sequence.
fn tile_class_blocks(a: &Attn, rows: usize) -> usize {
    a.lk.ne[1].div_ceil(FM_TILE_KEYS)
        * a.lq.ne[1].div_ceil(rows)
        * (a.mask.ne[2] * a.mask.ne[3]).max(1) as usize
}

/// The mask's tile classes for the `k_flash_attn_mma_*` blocks of `rows` query rows (see
/// [`tile_class_blocks`]), in scratch, written by `k_fm_tile_classes` (0: no mask).
fn mma_tile_classes(r: &dyn Runner, a: &Attn, rows: usize) -> Result<u64> {
    let count = tile_class_blocks(a, rows);
    if a.has_mask == 0 || count == 0 {
        return Ok(0);
    }
    let classes = r.scratch(SLOT_ATTN_TILE_CLASSES, count)?;
    let [n_q, n_kv] = [a.lq.ne[1] as i32, a.lk.ne[1] as i32];
    let args = args![a.mask, classes, n_q, n_kv, rows as i32];
    r.launch(&Launch::rows(
        "k_fm_tile_classes",
        count,
        32 * mma_warps() as u32,
        0,
        args,
    ))?;
    Ok(classes)
}

/// `k_flash_attn_mma_*`: one block per [`mma_rows`] queries of a head and sequence, after the
/// mask's tile classes.
fn mma_blocks(r: &dyn Runner, a: &Attn) -> Result<()> {
    let [d, n_q, n_head, n_seq] = a.lq.ne;
    let kernel = if d == 64 {
        "k_flash_attn_mma_d64"
    } else {
        "k_flash_attn_mma_d128"
    };
    let rows = mma_rows();
    let classes = mma_tile_classes(r, a, rows)?;
    let mut args = node_args(a);
    args.push(classes.into());
    let blocks = n_q.div_ceil(rows) * n_head * n_seq;
    r.launch(&Launch::rows(
        kernel,
        blocks,
        32 * mma_warps() as u32,
        0,
        args,
    ))
}

/// The BLAS operand type of K or V of type `t`: F16 rows as they are, quantized ones dequantized
/// to F16, the rest as F32.
fn operand_type(t: DType) -> DType {
    if t == DType::F16 || t.is_quantized() {
        DType::F16
    } else {
        DType::F32
    }
}

/// Whether `l` is readable by the BLAS as `dtype` in place: elements of that type, rows apart by
/// at least their length, every stride of whole elements.
fn in_place(l: &Layout, dtype: DType) -> bool {
    let es = dtype.type_size();
    l.dtype == dtype
        && l.nb[0] == es
        && l.nb[1] >= l.ne[0] * es
        && l.nb[1..].iter().all(|nb| nb % es == 0)
}

/// Whether the node takes the BLAS path: enough queries, some keys, a contiguous result (written
/// in place) and dimensions within i32.
fn blas_fits(a: &Attn) -> bool {
    let small = |v: usize| v < (1 << 30);
    a.lq.ne[1] >= FA_BLAS_MIN_QUERIES
        && a.lk.ne[1] > 0
        && a.ld.is_contiguous()
        && a.lk.ne.iter().chain(&a.lq.ne).all(|&v| small(v))
        && a.ld
            .nb
            .iter()
            .chain(&a.lk.nb)
            .chain(&a.lv.nb)
            .all(|&v| small(v))
}

/// K or V as a BLAS operand of `dtype`: in place, or copied contiguous into scratch `slot`.
/// Returns the address and the element strides of keys and heads, and of sequences.
fn kv_operand(
    r: &dyn Runner,
    t: TDesc,
    l: &Layout,
    dtype: DType,
    slot: usize,
) -> Result<(u64, [usize; 3])> {
    let (ptr, nb) = if in_place(l, dtype) {
        (t.ptr, l.nb)
    } else {
        let copy = contiguous_copy(r, t, l, dtype, slot)?;
        (copy.ptr, Layout::contiguous(dtype, l.ne).nb)
    };
    let es = dtype.type_size();
    Ok((ptr, [nb[1] / es, nb[2] / es, nb[3] / es]))
}

fn through_blas(r: &dyn Runner, a: &Attn) -> Result<()> {
    let [d_k, n_q, n_head, n_seq] = a.lq.ne;
    let [_, n_kv, n_head_kv, _] = a.lk.ne;
    let d_v = a.lv.ne[0];
    let group = n_head / n_head_kv;
    let (kt, vt) = (operand_type(a.lk.dtype), operand_type(a.lv.dtype));
    let (k, [k_row, k_head, k_seq]) = kv_operand(r, a.k, a.lk, kt, SLOT_ATTN_K)?;
    let (v, [v_row, v_head, v_seq]) = kv_operand(r, a.v, a.lv, vt, SLOT_ATTN_V)?;
    // Score rows padded to 16 bytes of probabilities.
    let ld = n_kv.next_multiple_of(8);
    let per_query = n_head * ld * (4 + vt.type_size());
    let chunk = (FA_BLAS_CHUNK_BYTES / per_query).clamp(1, n_q);
    let q_buf = r.scratch(SLOT_ATTN_Q, n_head * chunk * d_k * kt.type_size())?;
    let scores = r.scratch(SLOT_ATTN_SCORES, n_head * chunk * ld * 4)?;
    let probs = r.scratch(SLOT_ATTN_PROBS, n_head * chunk * ld * vt.type_size())?;
    let i32_of = |v: usize| i32::try_from(v).map_err(|_| fail(r, format!("{v} exceeds i32")));
    let [_, d_head, d_query, d_seq] = a.ld.nb.map(|nb| nb / 4);
    for s in 0..n_seq {
        for q0 in (0..n_q).step_by(chunk) {
            let nq = chunk.min(n_q - q0);
            // This chunk's queries as [D, nq, heads] of K's operand type: head h's rows at
            // h * nq, so the heads of a group follow each other.
            let mut src = a.q;
            src.ptr += (s * a.lq.nb[3] + q0 * a.lq.nb[1]) as u64;
            src.ne = [d_k, nq, n_head, 1].map(|v| v as i64);
            let dst = TDesc::contiguous(q_buf, kt, [d_k, nq, n_head, 1])?;
            r.launch(&Launch::elementwise(
                "k_cpy",
                d_k * nq * n_head,
                args![src, dst],
            ))?;
            r.gemm_batched(&BatchedGemmCall {
                trans_a: true,
                trans_b: false,
                m: i32_of(n_kv)?,
                n: i32_of(group * nq)?,
                k: i32_of(d_k)?,
                dtype: kt,
                a: k + (s * k_seq * kt.type_size()) as u64,
                lda: i32_of(k_row)?,
                stride_a: k_head as i64,
                b: q_buf,
                ldb: i32_of(d_k)?,
                stride_b: (group * nq * d_k) as i64,
                d: scores,
                ldd: i32_of(ld)?,
                stride_d: (group * nq * ld) as i64,
                batch: i32_of(n_head_kv)?,
            })?;
            let p = TDesc::contiguous(probs, vt, [ld, n_head * nq, 1, 1])?;
            let args = args![
                scores,
                p,
                a.mask,
                a.sinks,
                a.scale,
                a.max_bias,
                a.softcap,
                a.has_mask,
                a.has_sinks,
                i32_of(n_kv)?,
                i32_of(nq)?,
                i32_of(q0)?,
                i32_of(s)?
            ];
            r.launch(&Launch::rows(
                "k_attn_softmax",
                n_head * nq,
                ROW_THREADS,
                0,
                args,
            ))?;
            for i in 0..group {
                let out = d_seq * s + d_query * q0 + d_head * i;
                r.gemm_batched(&BatchedGemmCall {
                    trans_a: false,
                    trans_b: false,
                    m: i32_of(d_v)?,
                    n: i32_of(nq)?,
                    k: i32_of(n_kv)?,
                    dtype: vt,
                    a: v + (s * v_seq * vt.type_size()) as u64,
                    lda: i32_of(v_row)?,
                    stride_a: v_head as i64,
                    b: probs + (i * nq * ld * vt.type_size()) as u64,
                    ldb: i32_of(ld)?,
                    stride_b: (group * nq * ld) as i64,
                    d: a.d.ptr + (out * 4) as u64,
                    ldd: i32_of(d_query)?,
                    stride_d: (group * d_head) as i64,
                    batch: i32_of(n_head_kv)?,
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_splits_cover_the_keys() {
        assert_eq!(attention_splits(64, 100), (1, 128));
        assert_eq!(attention_splits(1024, 100_000).0, 1);
        for (rows, n_kv) in [(32, 8192), (1, 1000), (8, 300), (4, 65_536)] {
            let (splits, per) = attention_splits(rows, n_kv);
            assert!(splits > 1, "{rows} rows, {n_kv} keys");
            assert_eq!(per % FA_THREADS as usize, 0);
            assert!(splits * per >= n_kv && (splits - 1) * per < n_kv);
            assert!(per >= FA_MIN_KEYS_PER_SPLIT);
        }
    }

    /// Checks that `plan` covers `n_kv` keys with splits of whole `unit`s of keys, no empty split,
    /// and the heads of a group with whole blocks.
    fn assert_covers(plan: VecPlan, group: usize, rows_per_head: usize, n_kv: usize, unit: usize) {
        let VecPlan {
            heads_per_block,
            blocks,
            splits,
            kv_per_split,
        } = plan;
        let case = format!("group {group}, {rows_per_head} rows per head, {n_kv} keys: {plan:?}");
        assert!(
            (1..=FAV_MAX_HEADS.min(group)).contains(&heads_per_block),
            "{case}"
        );
        assert_eq!(
            blocks,
            group.div_ceil(heads_per_block) * rows_per_head,
            "{case}"
        );
        assert!(
            kv_per_split > 0 && kv_per_split.is_multiple_of(unit),
            "{case}"
        );
        assert!(splits * kv_per_split >= n_kv, "{case}");
        assert!(splits == 1 || (splits - 1) * kv_per_split < n_kv, "{case}");
    }

    #[test]
    fn vec_plans_cover_the_keys_and_heads() {
        for group in [1, 4, 6, 7, 8] {
            for rows_per_head in [1, 2, 8, 40, 1024] {
                for n_kv in [0, 1, 7, 63, 64, 65, 255, 256, 257, 4100, 32_768, 131_072] {
                    let plan =
                        vec_plan(group, rows_per_head, n_kv, FA_TARGET_BLOCKS, FAV_MAX_HEADS);
                    assert_covers(plan, group, rows_per_head, n_kv, FAV_TILE);
                }
            }
        }
    }

    #[test]
    fn vec_plans_fill_the_gpu_at_decode() {
        // Llama-3.1-8B decode (8 KV heads, groups of 4): few keys give one head per block and
        // one tile per split; 16 keys need no combine.
        let short = vec_plan(4, 8, 16, FA_TARGET_BLOCKS, FAV_MAX_HEADS);
        assert_eq!(
            (short.heads_per_block, short.blocks, short.splits),
            (1, 32, 1)
        );
        let p = vec_plan(4, 8, 256, FA_TARGET_BLOCKS, FAV_MAX_HEADS);
        assert_eq!(
            (p.heads_per_block, p.blocks, p.splits, p.kv_per_split),
            (1, 32, 4, 64)
        );
        // A long KV: the group shares its loads and the splits bring the blocks to the target.
        let long = vec_plan(4, 8, 32_768, FA_TARGET_BLOCKS, FAV_MAX_HEADS);
        assert_eq!((long.heads_per_block, long.blocks), (4, 8));
        assert_eq!(long.blocks * long.splits, FA_TARGET_BLOCKS);
        assert_eq!(long.kv_per_split, 32_768 / 64);
        // Groups beyond one block's heads: 6 = 4 + 2, 8 = 4 + 4.
        assert_eq!(
            vec_plan(6, 64, 4100, FA_TARGET_BLOCKS, FAV_MAX_HEADS).blocks,
            128
        );
        assert_eq!(
            vec_plan(8, 64, 4100, FA_TARGET_BLOCKS, FAV_MAX_HEADS).heads_per_block,
            4
        );
        // Many blocks already: one split.
        assert_eq!(
            vec_plan(1, 4096, 1000, FA_TARGET_BLOCKS, FAV_MAX_HEADS).splits,
            1
        );
    }

    #[test]
    fn wide_values_take_fewer_heads_per_block() {
        let heads = |dtype, d| vec_max_heads(&Layout::contiguous(dtype, [d, 100, 2, 1]));
        assert_eq!(heads(DType::F16, 64), 4);
        assert_eq!(heads(DType::F16, 128), 4);
        assert_eq!(heads(DType::BF16, 256), 2);
        assert_eq!(heads(DType::F32, 128), 2);
        assert_eq!(
            heads(DType::F16, 384),
            1,
            "three passes take the four-pass body"
        );
        assert_eq!(heads(DType::F16, 512), 1);
        for max_heads in [1, 2] {
            let plan = vec_plan(8, 2, 32_768, FA_TARGET_BLOCKS, max_heads);
            assert_eq!(plan.heads_per_block, max_heads);
            assert_covers(plan, 8, 2, 32_768, FAV_TILE);
        }
    }

    #[test]
    fn vec_operands_are_whole_aligned_chunks() {
        let ok = |dtype: DType, ne: [usize; 4]| {
            let l = Layout::contiguous(dtype, ne);
            let t = TDesc::new(1 << 20, &l).unwrap();
            vec_operand(&t, &l)
        };
        assert!(ok(DType::F16, [128, 7, 8, 1]));
        assert!(ok(DType::F16, [512, 7, 8, 1]));
        assert!(ok(DType::BF16, [64, 1, 1, 1]));
        assert!(ok(DType::F32, [256, 3, 2, 2]));
        assert!(!ok(DType::F32, [512, 3, 2, 2]), "row over 1024 bytes");
        assert!(!ok(DType::F16, [100, 3, 2, 1]), "rows of 200 bytes");
        assert!(!ok(DType::Q8_0, [128, 3, 2, 1]));
        let l = Layout::contiguous(DType::F16, [128, 4, 1, 1]);
        assert!(
            !vec_operand(&TDesc::new(8, &l).unwrap(), &l),
            "unaligned start"
        );
    }

    #[test]
    fn constants_match_the_sources() {
        let src = crate::kernels::shared_source();
        for (name, value) in [
            ("FA_THREADS", FA_THREADS as usize),
            ("FAV_THREADS", FAV_THREADS as usize),
            ("FAV_TILE", FAV_TILE),
            ("FAV_MAX_HEADS", FAV_MAX_HEADS),
            ("FAV_MAX_ROW_BYTES", FAV_MAX_ROW_BYTES),
            ("FAV_PASS_BYTES", FAV_PASS_BYTES),
            ("FAV_SLOTS", FAV_SLOTS),
            ("FM_ROWS", FM_ROWS_PER_WARP),
            // The most warps the settings allow (GGML_TP_ATTN_MMA_WARPS: 4 or 8).
            ("FM_WARPS", 8),
        ] {
            assert!(src.contains(&format!("#define {name} {value}\n")), "{name}");
        }
    }
}

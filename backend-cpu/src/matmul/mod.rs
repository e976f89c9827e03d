//! Matrix multiplication kernels of the CPU backend: [`mul_mat`] and [`mul_mat_id`] for float
//! (F32, F16, BF16) and quantized (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4) weights.
//!
//! Both ops are lowered to a list of `Job`s: one weight matrix (`M` rows of `K` elements) times a
//! list of activation columns, each with its own destination column. `mul_mat` makes one job per
//! destination batch `(i2, i3)` (the weight matrix broadcast ggml style, `i2 / (B2 / A2)`), and
//! [`mul_mat_group`] those of several weights times one activation in one list;
//! `mul_mat_id` makes one job per used expert, gathering the `(u, t)` slots routed to it, so every
//! expert's weights are streamed once per call.
//!
//! Activations are prepared once per call: converted to contiguous f32 rows when `b` is F16/BF16 or
//! its rows are strided, and for quantized weights quantized row by row to
//! `vec_dot_type(weight)` (Q8_0, Q8_1 or Q8_K, with ggml's reference quantizer, as llama.cpp does).
//! Then:
//! - quantized weights: row kernels (`quant.rs`, `quant_x86.rs`, `quant_avx512.rs`) multiply one
//!   weight row (two on x86 for Q4_1 / Q5_1 / MXFP4, and for Q8_0 at AVX-512) with up to 4 activation
//!   columns per block load (integer dot per block, scaled by both block scales), every column's
//!   result bit-identical whichever kernel computed it; on x86 the columns outside groups of 4
//!   (all of decode's) of Q4_1 / Q5_1 go through `quant_offset_x86.rs` and their groups through
//!   `quant_prompt_x86.rs` (one row x four columns, weights unpacked once per tile); at both x86
//!   levels Q4_0 / Q5_0 and the K-quants (prompt and decode) take `quant_rows8_x86.rs` /
//!   `quant_rows8_k_x86.rs` instead (eight rows per vector, exact integer sums per block, the
//!   portable kernel's float steps: equal to the scalar level's results; the K-quants' decode at
//!   AVX2 one row at a time, with the same integers and float steps);
//!   tasks are tiles of rows x columns (at most 64 columns), so a weight row stays in L1 while it
//!   meets every column of its tile;
//! - float weights (F16 / BF16 widened exactly to f32 and multiplied in f32 against f32
//!   activations; ggml instead rounds the activations to F16): the same row kernels (`float.rs`)
//!   for fewer than [`GEMM_MIN_COLS`] columns, the cache-blocked GEMM otherwise.
//!
//! Work is spread over the caller's team or rayon pool ([`crate::team::par_tasks`]). The SIMD level comes from [`simd::level`]
//! (run-time detection, `GGML_TP_SIMD` override); [`mul_mat_with`] / [`mul_mat_id_with`] take an
//! explicit level (tests, benchmarks).

mod act_quant;
mod float;
mod quant;
#[cfg(target_arch = "x86_64")]
mod quant_avx512;
#[cfg(target_arch = "x86_64")]
mod quant_offset_x86;
#[cfg(target_arch = "x86_64")]
mod quant_prompt_x86;
#[cfg(target_arch = "x86_64")]
mod quant_rows8_k_x86;
#[cfg(target_arch = "x86_64")]
mod quant_rows8_x86;
#[cfg(target_arch = "x86_64")]
mod quant_x86;
pub mod simd;
pub(crate) mod vec;

#[cfg(test)]
mod tests;

pub use simd::SimdLevel;

use crate::view::TView;
use ggml_core::quant::vec_dot_type;
use ggml_core::{DType, Error, Result};

/// Float-weight jobs with at least this many columns use the blocked GEMM.
pub const GEMM_MIN_COLS: usize = 8;

/// Columns per task of the row kernels.
const COL_TILE: usize = 64;

/// One weight matrix times a list of activation columns.
pub(crate) struct Job {
    /// Row 0 of the weight matrix; row `m` at `w + m * w_stride`, rows contiguous inside.
    pub w: *const u8,
    pub w_stride: usize,
    /// Weight rows (= destination rows).
    pub m: usize,
    /// Per column: the activation row (f32 or `vec_dot_type` blocks of `K` elements).
    pub acts: Vec<*const u8>,
    /// Per column: element 0 of its destination column (`M` contiguous f32).
    pub dsts: Vec<*mut f32>,
}

// SAFETY: a Job holds plain addresses; the tasks that share it write disjoint destination elements
// and only read the weights and activations, which nobody writes during the call.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

fn shape_err(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

fn unsupported(dtype: DType, what: &str) -> Error {
    Error::UnsupportedType {
        dtype,
        what: what.to_string(),
    }
}

/// Checks the weight type and layout shared by both ops; returns `K`.
fn check_weights(op: &'static str, a: &TView) -> Result<usize> {
    let wt = a.dtype();
    if !(wt.is_float() || quant::supported(wt)) {
        return Err(unsupported(wt, &format!("{op} (CPU) as weights")));
    }
    if !a.layout.rows_contiguous() {
        return Err(shape_err(
            op,
            format!("weight rows must be contiguous, nb = {:?}", a.nb()),
        ));
    }
    let k = a.ne()[0];
    if !k.is_multiple_of(wt.block_size()) {
        return Err(shape_err(
            op,
            format!("K = {k} is not a multiple of the {wt} block size"),
        ));
    }
    Ok(k)
}

fn check_dst(op: &'static str, dst: &TView, ne: [usize; 4]) -> Result<()> {
    if dst.dtype() != DType::F32 {
        return Err(unsupported(
            dst.dtype(),
            &format!("{op} (CPU) as destination"),
        ));
    }
    if dst.ne() != ne || !dst.layout.is_contiguous() {
        return Err(shape_err(
            op,
            format!(
                "destination must be contiguous F32 {ne:?}, got {:?}",
                dst.layout
            ),
        ));
    }
    Ok(())
}

/// Activations ready for the kernels: row `(i1, i2, i3)` of `b` at `ptr(i1, i2, i3)`.
struct Prepared {
    /// Owned rows (converted or quantized), or empty when `b` is used in place.
    buf: Vec<u8>,
    row_bytes: usize,
    ne: [usize; 4],
    src: TView,
}

impl Prepared {
    fn ptr(&self, i1: usize, i2: usize, i3: usize) -> *const u8 {
        if self.buf.is_empty() {
            self.src.row_ptr(i1, i2, i3)
        } else {
            let r = i1 + self.ne[1] * (i2 + self.ne[2] * i3);
            self.buf.as_ptr().wrapping_add(r * self.row_bytes)
        }
    }
}

/// Converts / quantizes the rows of `b` for weights of type `wt`, in parallel (activations
/// quantized at `level`, see [`act_quant`]).
fn prepare(op: &'static str, level: SimdLevel, wt: DType, b: &TView) -> Result<Prepared> {
    let bt = b.dtype();
    if !bt.is_float() {
        return Err(unsupported(bt, &format!("{op} (CPU) as activations")));
    }
    let ne = b.ne();
    let k = ne[0];
    let act = vec_dot_type(wt);
    let in_place = act == DType::F32 || wt.is_float();
    if bt == DType::F32 && b.layout.rows_contiguous() && in_place {
        return Ok(Prepared {
            buf: Vec::new(),
            row_bytes: 0,
            ne,
            src: *b,
        });
    }
    let out_t = if wt.is_float() { DType::F32 } else { act };
    let row_bytes = out_t.row_size(k).ok_or_else(|| {
        shape_err(
            op,
            format!("K = {k} is not a multiple of the {out_t} block size"),
        )
    })?;
    let nrows = ne[1] * ne[2] * ne[3];
    let mut buf = vec![0u8; nrows * row_bytes];
    if nrows == 0 || row_bytes == 0 {
        return Ok(Prepared {
            buf,
            row_bytes,
            ne,
            src: *b,
        });
    }
    // F32 rows with contiguous elements are read in place, others converted element by element.
    let direct = bt == DType::F32 && b.layout.rows_contiguous();
    let out_base = OutRows(buf.as_mut_ptr());
    crate::kernels::rows::par_rows(nrows, k, |range| {
        let mut tmp = Vec::new();
        for r in range {
            // SAFETY: tasks get disjoint row ranges of `buf`, which outlives the loop.
            let out =
                unsafe { std::slice::from_raw_parts_mut(out_base.row(r, row_bytes), row_bytes) };
            let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
            let p = b.row_ptr(i1, i2, i3);
            let row: &[f32] = if direct && (p as usize).is_multiple_of(4) {
                // SAFETY: row (i1, i2, i3) of b holds `k` contiguous aligned f32, live and not
                // written during the call.
                unsafe { std::slice::from_raw_parts(p as *const f32, k) }
            } else {
                tmp.clear();
                // SAFETY: (i0, i1, i2, i3) is inside b, whose memory is live and not written during the call.
                tmp.extend((0..k).map(|i0| unsafe { b.get_f32([i0, i1, i2, i3]) }));
                &tmp
            };
            if out_t == DType::F32 {
                out.copy_from_slice(bytemuck::cast_slice(row));
            } else {
                act_quant::quantize_act(level, out_t, row, out)?;
            }
        }
        Ok(())
    })?;
    Ok(Prepared {
        buf,
        row_bytes,
        ne,
        src: *b,
    })
}

/// The rows of a buffer that parallel tasks fill (each task its own rows).
struct OutRows(*mut u8);

// SAFETY: tasks write disjoint rows through it (see `prepare`).
unsafe impl Send for OutRows {}
unsafe impl Sync for OutRows {}

impl OutRows {
    fn row(&self, r: usize, row_bytes: usize) -> *mut u8 {
        self.0.wrapping_add(r * row_bytes)
    }
}

/// Runs every job at `level` in parallel ([`crate::team::par_tasks`]).
fn run_jobs(level: SimdLevel, wt: DType, k: usize, jobs: &[Job]) {
    let threads = crate::team::threads();
    let mut tiles = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let n = job.acts.len();
        if n == 0 || job.m == 0 {
            continue;
        }
        if k == 0 {
            for &d in &job.dsts {
                // SAFETY: each destination column holds `m` f32 (validated views).
                unsafe { std::slice::from_raw_parts_mut(d, job.m) }.fill(0.0);
            }
            continue;
        }
        if wt.is_float() && n >= GEMM_MIN_COLS {
            // SAFETY: the job's pointers were built from validated views (see `mul_mat`).
            unsafe { float::gemm(level, wt, job, k) };
            continue;
        }
        let col_tiles = n.div_ceil(COL_TILE);
        let want = (4 * threads).div_ceil(col_tiles * jobs.len());
        let rows = job.m.div_ceil(want).max(4);
        for r0 in (0..job.m).step_by(rows) {
            for c0 in (0..n).step_by(COL_TILE) {
                tiles.push((j, r0..(r0 + rows).min(job.m), c0..(c0 + COL_TILE).min(n)));
            }
        }
    }
    let _infallible = crate::team::par_tasks(tiles.len(), |t| {
        let (j, rows, cols) = tiles[t].clone();
        // SAFETY: tiles cover disjoint destination elements; pointers come from validated views.
        unsafe {
            if wt.is_float() {
                float::rows(level, wt, &jobs[j], k, rows, cols)
            } else {
                quant::rows(level, wt, &jobs[j], k, rows, cols)
            }
        }
        Ok(())
    });
}

/// `dst[m, n, i2, i3] = dot(a[:, m, i2 / (B2 / A2), i3 / (B3 / A3)], b[:, n, i2, i3])` at the
/// detected SIMD level. `a`: weights of any supported type [K, M, A2, A3] with contiguous rows;
/// `b`: F32/F16/BF16 [K, N, B2, B3] (any strides); `dst`: contiguous F32 [M, N, B2, B3].
pub fn mul_mat(a: &TView, b: &TView, dst: &TView) -> Result<()> {
    mul_mat_with(simd::level(), a, b, dst)
}

/// [`mul_mat`] at an explicit SIMD level (which must be available).
pub fn mul_mat_with(level: SimdLevel, a: &TView, b: &TView, dst: &TView) -> Result<()> {
    mul_mat_group_with(level, &[(*a, *dst)], b)
}

/// [`mul_mat`] of several weights `(a, dst)` of one type by the same activations `b` (a layer's
/// q, k and v; gate and up): the activations are prepared once and the tiles of every product
/// run in one parallel loop, so that small products share the threads with the large ones. Every
/// result equals its [`mul_mat`]'s (tiles never change a result). The destinations must not
/// overlap `b` unless the activations are converted or quantized (quantized weights).
pub fn mul_mat_group(products: &[(TView, TView)], b: &TView) -> Result<()> {
    mul_mat_group_with(simd::level(), products, b)
}

fn mul_mat_group_with(level: SimdLevel, products: &[(TView, TView)], b: &TView) -> Result<()> {
    const OP: &str = "mul_mat";
    if !level.is_available() {
        return Err(Error::Backend {
            backend: "cpu".into(),
            msg: format!("SIMD level {} unavailable", level.name()),
        });
    }
    let Some((first, _)) = products.first() else {
        return Ok(());
    };
    let (wt, bn) = (first.dtype(), b.ne());
    let k = check_weights(OP, first)?;
    for (a, dst) in products {
        let an = a.ne();
        if a.dtype() != wt || check_weights(OP, a)? != k {
            return Err(shape_err(
                OP,
                format!("{} {an:?} grouped with {wt} weights of K = {k}", a.dtype()),
            ));
        }
        if bn[0] != k || an[2] == 0 || an[3] == 0 || bn[2] % an[2] != 0 || bn[3] % an[3] != 0 {
            return Err(shape_err(OP, format!("cannot multiply {an:?} by {bn:?}")));
        }
        check_dst(OP, dst, [an[1], bn[1], bn[2], bn[3]])?;
    }
    let prep = prepare(OP, level, wt, b)?;
    let mut jobs = Vec::with_capacity(products.len() * bn[2] * bn[3]);
    for (a, dst) in products {
        let an = a.ne();
        let (r2, r3) = (bn[2] / an[2], bn[3] / an[3]);
        for i3 in 0..bn[3] {
            for i2 in 0..bn[2] {
                jobs.push(Job {
                    w: a.row_ptr(0, i2 / r2, i3 / r3),
                    w_stride: a.nb()[1],
                    m: an[1],
                    acts: (0..bn[1]).map(|n| prep.ptr(n, i2, i3)).collect(),
                    dsts: (0..bn[1])
                        .map(|n| dst.row_ptr(n, i2, i3) as *mut f32)
                        .collect(),
                });
            }
        }
    }
    run_jobs(level, wt, k, &jobs);
    Ok(())
}

/// `dst[:, u, t] = experts[:, :, ids[u, t]] . b[:, u % B1, t]` at the detected SIMD level.
/// `experts` [K, M, E] (contiguous rows), `b` [K, B1, T] with B1 = 1 or n_used, `ids` I32
/// [n_used, T] (each in 0..E), `dst` contiguous F32 [M, n_used, T].
pub fn mul_mat_id(experts: &TView, b: &TView, ids: &TView, dst: &TView) -> Result<()> {
    mul_mat_id_with(simd::level(), experts, b, ids, dst)
}

/// [`mul_mat_id`] at an explicit SIMD level (which must be available).
pub fn mul_mat_id_with(
    level: SimdLevel,
    experts: &TView,
    b: &TView,
    ids: &TView,
    dst: &TView,
) -> Result<()> {
    const OP: &str = "mul_mat_id";
    if !level.is_available() {
        return Err(Error::Backend {
            backend: "cpu".into(),
            msg: format!("SIMD level {} unavailable", level.name()),
        });
    }
    let k = check_weights(OP, experts)?;
    let (en, bn, idn) = (experts.ne(), b.ne(), ids.ne());
    if ids.dtype() != DType::I32 {
        return Err(unsupported(ids.dtype(), "mul_mat_id (CPU) as ids"));
    }
    let (n_used, t_count) = (idn[0], idn[1]);
    if bn[0] != k
        || en[3] != 1
        || bn[2] != t_count
        || (bn[1] != 1 && bn[1] != n_used)
        || bn[3] != 1
        || idn[2] != 1
        || idn[3] != 1
    {
        return Err(shape_err(
            OP,
            format!("experts {en:?}, b {bn:?}, ids {idn:?}"),
        ));
    }
    check_dst(OP, dst, [en[1], n_used, t_count, 1])?;
    let b1 = bn[1];
    let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); en[2]];
    for t in 0..t_count {
        for u in 0..n_used {
            // SAFETY: (u, t) is inside ids, whose memory is live.
            let e = unsafe { ids.get_i32([u, t, 0, 0]) };
            let slot = usize::try_from(e)
                .ok()
                .filter(|&e| e < en[2])
                .ok_or_else(|| {
                    shape_err(
                        OP,
                        format!("ids[{u}, {t}] = {e} is not an expert index (0..{})", en[2]),
                    )
                })?;
            per_expert[slot].push((u, t));
        }
    }
    let prep = prepare(OP, level, experts.dtype(), b)?;
    let jobs: Vec<Job> = per_expert
        .iter()
        .enumerate()
        .filter(|(_, slots)| !slots.is_empty())
        .map(|(e, slots)| Job {
            w: experts.row_ptr(0, e, 0),
            w_stride: experts.nb()[1],
            m: en[1],
            acts: slots.iter().map(|&(u, t)| prep.ptr(u % b1, t, 0)).collect(),
            dsts: slots
                .iter()
                .map(|&(u, t)| dst.row_ptr(u, t, 0) as *mut f32)
                .collect(),
        })
        .collect();
    run_jobs(level, experts.dtype(), k, &jobs);
    Ok(())
}

//! Float-weight kernels (F32, F16, BF16 weights against F32 activations), written once generic over
//! [`F32Vec`] and instantiated per SIMD level:
//!
//! - row kernels for few activation columns (matrix-vector products): one weight row is loaded once
//!   and multiplied with up to 4 activation columns at a time;
//! - a cache-blocked GEMM for many columns: the activation columns are packed once per job into
//!   panels of `NR` columns (`[panel][k][NR]`), each task packs `KC x MC` blocks of weights into
//!   panels of `MR = 2 * LANES` rows (`[panel][k][MR]`, widened to f32), and a register-tiled
//!   `MR x NR` micro-kernel (AVX-512: 32 x 12, AVX2 and NEON: 16 x 6, portable: 16 x 4) accumulates in
//!   registers and adds its tile to the destination.
//!
//! F16 / BF16 weights are widened exactly to f32 and multiplied in f32 (the activations are not
//! rounded to half precision as ggml does), which is at least as accurate as ggml.

use super::vec::{F32Vec, Scalar8};
use super::{Job, SimdLevel};
use ggml_core::DType;
use std::ops::Range;

const WT_F32: u8 = 0;
const WT_F16: u8 = 1;
const WT_BF16: u8 = 2;

/// k-depth of one packed block.
const KC: usize = 512;
/// Weight panels of `MR` rows per task block.
const MC_PANELS: usize = 4;

/// Loads `V::LANES` weights starting at element `i` of row `w`, widened to f32.
#[inline(always)]
unsafe fn load_w<V: F32Vec, const WT: u8>(w: *const u8, i: usize) -> V {
    // SAFETY: the caller guarantees `LANES` elements of the row's type from element `i`.
    unsafe {
        match WT {
            WT_F32 => V::load((w as *const f32).add(i)),
            WT_F16 => V::load_f16((w as *const u16).add(i)),
            _ => V::load_bf16((w as *const u16).add(i)),
        }
    }
}

/// Weight element `i` of row `w`, widened to f32.
#[inline(always)]
unsafe fn get_w<const WT: u8>(w: *const u8, i: usize) -> f32 {
    // SAFETY: the caller guarantees element `i` is inside the row.
    unsafe {
        match WT {
            WT_F32 => (w as *const f32).add(i).read_unaligned(),
            WT_F16 => ggml_core::quant::f16_bits_to_f32((w as *const u16).add(i).read_unaligned()),
            _ => f32::from_bits(u32::from((w as *const u16).add(i).read_unaligned()) << 16),
        }
    }
}

/// Dot products of one weight row with `C` f32 activation rows of `k` elements.
#[inline(always)]
unsafe fn fdot<V: F32Vec, const WT: u8, const C: usize>(
    w: *const u8,
    acts: &[*const f32; C],
    k: usize,
) -> [f32; C] {
    let l = V::LANES;
    // SAFETY: the weight row and each activation row hold `k` elements; all loads stay below `k`.
    unsafe {
        let mut acc0 = [V::zero(); C];
        let mut acc1 = [V::zero(); C];
        let mut i = 0;
        while i + 2 * l <= k {
            let w0 = load_w::<V, WT>(w, i);
            let w1 = load_w::<V, WT>(w, i + l);
            for c in 0..C {
                acc0[c] = V::fmadd(w0, V::load(acts[c].add(i)), acc0[c]);
                acc1[c] = V::fmadd(w1, V::load(acts[c].add(i + l)), acc1[c]);
            }
            i += 2 * l;
        }
        if i + l <= k {
            let w0 = load_w::<V, WT>(w, i);
            for c in 0..C {
                acc0[c] = V::fmadd(w0, V::load(acts[c].add(i)), acc0[c]);
            }
            i += l;
        }
        let mut out = [0f32; C];
        for c in 0..C {
            out[c] = V::add(acc0[c], acc1[c]).hsum();
            for j in i..k {
                out[c] += get_w::<WT>(w, j) * *acts[c].add(j);
            }
        }
        out
    }
}

/// Row kernel: `dst[col][m] = w[m] . act[col]` for `m` in `rows`, `col` in `cols`.
#[inline(always)]
unsafe fn rows_impl<V: F32Vec, const WT: u8>(
    job: &Job,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: the caller guarantees that the job's pointers are valid for `rows` x `cols` and that no
    // other thread writes these destination elements.
    unsafe {
        for m in rows {
            let w = job.w.add(m * job.w_stride);
            let mut c = cols.start;
            while c + 4 <= cols.end {
                let acts: [*const f32; 4] = std::array::from_fn(|i| job.acts[c + i] as *const f32);
                let r = fdot::<V, WT, 4>(w, &acts, k);
                for (i, v) in r.into_iter().enumerate() {
                    *job.dsts[c + i].add(m) = v;
                }
                c += 4;
            }
            for c in c..cols.end {
                let r = fdot::<V, WT, 1>(w, &[job.acts[c] as *const f32], k);
                *job.dsts[c].add(m) = r[0];
            }
        }
    }
}

#[inline(always)]
unsafe fn rows_any<V: F32Vec>(
    wt: DType,
    job: &Job,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match wt {
            DType::F32 => rows_impl::<V, WT_F32>(job, k, rows, cols),
            DType::F16 => rows_impl::<V, WT_F16>(job, k, rows, cols),
            _ => rows_impl::<V, WT_BF16>(job, k, rows, cols),
        }
    }
}

/// Micro-kernel: the `MR x NR` tile `sum_k a[k][0..MR] * b[k][0..NR]` over `kc` packed steps.
#[inline(always)]
unsafe fn micro<V: F32Vec, const NR: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
) -> [[V; 2]; NR] {
    let l = V::LANES;
    // SAFETY: `a` holds `kc * 2 * LANES` and `b` `kc * NR` packed f32 (caller).
    unsafe {
        let mut acc = [[V::zero(); 2]; NR];
        for kk in 0..kc {
            let a0 = V::load(a.add(kk * 2 * l));
            let a1 = V::load(a.add(kk * 2 * l + l));
            for (j, accj) in acc.iter_mut().enumerate() {
                let bj = V::splat(*b.add(kk * NR + j));
                accj[0] = V::fmadd(a0, bj, accj[0]);
                accj[1] = V::fmadd(a1, bj, accj[1]);
            }
        }
        acc
    }
}

/// Packs activation panel `p` (`NR` columns, zero-padded) into `out` (`k * NR` f32, `[k][NR]`).
unsafe fn pack_b_panel<const NR: usize>(job: &Job, k: usize, p: usize, out: &mut [f32]) {
    let n = job.acts.len();
    for j in 0..NR {
        let col = p * NR + j;
        if col < n {
            // SAFETY: each activation column holds `k` contiguous f32 (caller).
            let act = unsafe { std::slice::from_raw_parts(job.acts[col] as *const f32, k) };
            for (kk, &v) in act.iter().enumerate() {
                out[kk * NR + j] = v;
            }
        } else {
            for kk in 0..k {
                out[kk * NR + j] = 0.0;
            }
        }
    }
}

/// One GEMM task: rows `m_range` (starting at a multiple of `MR`) times activation panels `panels`.
#[inline(always)]
unsafe fn gemm_task_impl<V: F32Vec, const NR: usize, const WT: u8>(
    job: &Job,
    k: usize,
    bpack: &[f32],
    m_range: Range<usize>,
    panels: Range<usize>,
) {
    let mr = 2 * V::LANES;
    let n = job.acts.len();
    let npan = m_range.len().div_ceil(mr);
    let mut abuf = vec![0f32; npan * mr * KC.min(k)];
    let zeros = vec![0u8; 4 * KC.min(k)];
    let mut k0 = 0;
    // SAFETY: pointers of the job are valid (caller); packed buffers are indexed within their sizes:
    // `abuf` holds `npan` panels of `kc * mr`, `bpack` holds panels of `k * NR`.
    unsafe {
        while k0 < k {
            let kc = KC.min(k - k0);
            // Packed row by row along k (k outer, rows inner): contiguous stores and one load
            // from each of the `mr` rows per step; padding rows read a zero row.
            let esize = if WT == WT_F32 { 4 } else { 2 };
            for pi in 0..npan {
                let base = pi * kc * mr;
                let mut rowp = [zeros.as_ptr(); 64];
                for (r, rp) in rowp.iter_mut().enumerate().take(mr) {
                    let m = m_range.start + pi * mr + r;
                    if m < m_range.end {
                        *rp = job.w.add(m * job.w_stride + k0 * esize);
                    }
                }
                for kk in 0..kc {
                    let out = &mut abuf[base + kk * mr..base + kk * mr + mr];
                    for (o, &rp) in out.iter_mut().zip(&rowp) {
                        *o = get_w::<WT>(rp, kk);
                    }
                }
            }
            for p in panels.clone() {
                let bptr = bpack.as_ptr().add(p * k * NR + k0 * NR);
                for pi in 0..npan {
                    let acc = micro::<V, NR>(kc, abuf.as_ptr().add(pi * kc * mr), bptr);
                    let m0 = m_range.start + pi * mr;
                    let mrows = mr.min(m_range.end - m0);
                    for (j, accj) in acc.iter().enumerate() {
                        let col = p * NR + j;
                        if col >= n {
                            break;
                        }
                        let dst = job.dsts[col].add(m0);
                        if mrows == mr {
                            for (h, &v) in accj.iter().enumerate() {
                                let d = dst.add(h * V::LANES);
                                let v = if k0 == 0 { v } else { V::add(V::load(d), v) };
                                v.store(d);
                            }
                        } else {
                            let mut tmp = [0f32; 64];
                            accj[0].store(tmp.as_mut_ptr());
                            accj[1].store(tmp.as_mut_ptr().add(V::LANES));
                            for (r, &t) in tmp.iter().enumerate().take(mrows) {
                                let d = dst.add(r);
                                *d = if k0 == 0 { t } else { *d + t };
                            }
                        }
                    }
                }
            }
            k0 += kc;
        }
    }
}

#[inline(always)]
unsafe fn gemm_task_any<V: F32Vec, const NR: usize>(t: &GemmTask) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match t.wt {
            DType::F32 => {
                gemm_task_impl::<V, NR, WT_F32>(t.job, t.k, t.bpack, t.m.clone(), t.panels.clone())
            }
            DType::F16 => {
                gemm_task_impl::<V, NR, WT_F16>(t.job, t.k, t.bpack, t.m.clone(), t.panels.clone())
            }
            _ => {
                gemm_task_impl::<V, NR, WT_BF16>(t.job, t.k, t.bpack, t.m.clone(), t.panels.clone())
            }
        }
    }
}

struct GemmTask<'a> {
    wt: DType,
    job: &'a Job,
    k: usize,
    bpack: &'a [f32],
    m: Range<usize>,
    panels: Range<usize>,
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::{__m256, __m512};

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2(
        wt: DType,
        job: &Job,
        k: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        // SAFETY: features checked by the dispatcher; pointers forwarded from the caller.
        unsafe { rows_any::<__m256>(wt, job, k, rows, cols) }
    }
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn rows_avx512(
        wt: DType,
        job: &Job,
        k: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        // SAFETY: features checked by the dispatcher; pointers forwarded from the caller.
        unsafe { rows_any::<__m512>(wt, job, k, rows, cols) }
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemm_avx2(t: &GemmTask) {
        // SAFETY: features checked by the dispatcher; pointers forwarded from the caller.
        unsafe { gemm_task_any::<__m256, NR_AVX2>(t) }
    }
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn gemm_avx512(t: &GemmTask) {
        // SAFETY: features checked by the dispatcher; pointers forwarded from the caller.
        unsafe { gemm_task_any::<__m512, NR_AVX512>(t) }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::*;
    use crate::matmul::vec::Neon8;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn rows_neon(
        wt: DType,
        job: &Job,
        k: usize,
        rows: Range<usize>,
        cols: Range<usize>,
    ) {
        // SAFETY: NEON checked by the dispatcher; pointers forwarded from the caller.
        unsafe { rows_any::<Neon8>(wt, job, k, rows, cols) }
    }
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn gemm_neon(t: &GemmTask) {
        // SAFETY: NEON checked by the dispatcher; pointers forwarded from the caller.
        unsafe { gemm_task_any::<Neon8, NR_NEON>(t) }
    }
}

const NR_SCALAR: usize = 4;
/// Same panel width as AVX2 (so `pack_b_panel::<NR_AVX2>` packs NEON panels too).
const NR_NEON: usize = NR_AVX2;
const NR_AVX2: usize = 6;
const NR_AVX512: usize = 12;

/// Row kernel for `rows` x `cols` of a float-weight job at `level`.
///
/// # Safety
/// The job's pointers must be valid for `k`-element rows; no other thread may write the
/// destination elements of `rows` x `cols`; `level` must be available.
pub(crate) unsafe fn rows(
    level: SimdLevel,
    wt: DType,
    job: &Job,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller, who checked `level`.
    unsafe {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::rows_avx2(wt, job, k, rows, cols),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::rows_avx512(wt, job, k, rows, cols),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => arm::rows_neon(wt, job, k, rows, cols),
            _ => rows_any::<Scalar8>(wt, job, k, rows, cols),
        }
    }
}

/// Whole float-weight job through the blocked GEMM, in parallel ([`crate::team::par_tasks`]).
///
/// # Safety
/// As for [`rows`], for all rows and columns of the job.
pub(crate) unsafe fn gemm(level: SimdLevel, wt: DType, job: &Job, k: usize) {
    let (nr, mr) = match level {
        SimdLevel::Avx2 => (NR_AVX2, 16),
        SimdLevel::Avx512 => (NR_AVX512, 32),
        SimdLevel::Neon => (NR_NEON, 16),
        SimdLevel::Scalar => (NR_SCALAR, 16),
    };
    let n = job.acts.len();
    let n_panels = n.div_ceil(nr);
    let mut bpack = vec![0f32; n_panels * nr * k];
    let panels = super::OutRows(bpack.as_mut_ptr() as *mut u8);
    let panel_bytes = nr * k * 4;
    let _infallible = crate::team::par_tasks(n_panels, |p| {
        // SAFETY: each task fills its own panel of `bpack`, which outlives the loop; activation
        // columns are valid `k`-element f32 rows (caller).
        unsafe {
            let out =
                std::slice::from_raw_parts_mut(panels.row(p, panel_bytes) as *mut f32, nr * k);
            match nr {
                NR_AVX2 => pack_b_panel::<NR_AVX2>(job, k, p, out),
                NR_AVX512 => pack_b_panel::<NR_AVX512>(job, k, p, out),
                _ => pack_b_panel::<NR_SCALAR>(job, k, p, out),
            }
        }
        Ok(())
    });
    let mc = mr * MC_PANELS;
    let m_tiles = job.m.div_ceil(mc);
    let threads = crate::team::threads();
    let n_split = (4 * threads).div_ceil(m_tiles).clamp(1, n_panels.max(1));
    let per = n_panels.div_ceil(n_split);
    let tasks: Vec<(Range<usize>, Range<usize>)> = (0..m_tiles)
        .flat_map(|mt| {
            let m = mt * mc..((mt + 1) * mc).min(job.m);
            (0..n_split).map(move |s| (m.clone(), s * per..((s + 1) * per).min(n_panels)))
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let _infallible = crate::team::par_tasks(tasks.len(), |i| {
        let (m, panels) = tasks[i].clone();
        let t = GemmTask {
            wt,
            job,
            k,
            bpack: &bpack,
            m,
            panels,
        };
        // SAFETY: tasks cover disjoint destination tiles; `level` is available (caller).
        unsafe {
            match level {
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx2 => x86::gemm_avx2(&t),
                #[cfg(target_arch = "x86_64")]
                SimdLevel::Avx512 => x86::gemm_avx512(&t),
                #[cfg(target_arch = "aarch64")]
                SimdLevel::Neon => arm::gemm_neon(&t),
                _ => gemm_task_any::<Scalar8, NR_SCALAR>(&t),
            }
        }
        Ok(())
    });
}

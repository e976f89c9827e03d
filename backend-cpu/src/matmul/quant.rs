//! Quantized-weight kernels: block layouts and their shared scale handling, portable kernels, and
//! the dispatch to the x86 kernels of `quant_x86.rs`.
//!
//! Weights are multiplied against activations quantized to `vec_dot_type(weight)` as llama.cpp
//! does: per block an integer dot product, scaled by the weight and activation scales.
//!
//! - Legacy 32-element blocks ([`Legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) unpack to 32
//!   signed or unsigned bytes plus a scale `d` (and a min `m` for Q4_1/Q5_1, whose activations are
//!   Q8_1 with the scaled block sum `s`): `sum += (d * d_a) * dot(q, q_a) + m * s_a`.
//! - K-quant super-blocks ([`KQuant`]: Q4_K, Q5_K, Q6_K) unpack to 256 unsigned bytes, sixteen
//!   per-16 scales `sc` and sixteen min terms `mn` ([`KBlock`]), against Q8_K:
//!   `sum += d * d_a * sum_j sc_j dot_j(q, q_a) - dmin * d_a * sum_j mn_j bsums_j`. For Q6_K the
//!   offset of 32 is folded into the min term (`mn_j = 32 sc_j`, `dmin = d`).
//!
//! Every kernel multiplies one weight row with `C` activation rows (C = 1 or 4), so that a block is
//! unpacked once per group of columns.

use super::{Job, SimdLevel};
use ggml_core::quant::{e8m0_to_f32_half, f16_bits_to_f32, get_scale_min_k4, MXFP4_VALUES};
use ggml_core::{DType, QK_K};
use std::ops::Range;

/// Reads a little-endian u16 at `p`.
#[inline(always)]
pub(crate) unsafe fn rd16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees two readable bytes.
    unsafe { (p as *const u16).read_unaligned() }
}

/// Reads `N` bytes at `p`.
#[inline(always)]
pub(crate) unsafe fn rd<const N: usize>(p: *const u8) -> [u8; N] {
    // SAFETY: the caller guarantees `N` readable bytes.
    unsafe { (p as *const [u8; N]).read_unaligned() }
}

/// Byte offset of the quants in a Q8_0 (`false`) or Q8_1 (`true`) activation block, and its size.
#[inline(always)]
pub(crate) const fn act_layout(q8_1: bool) -> (usize, usize) {
    if q8_1 {
        (4, 36)
    } else {
        (2, 34)
    }
}

/// Conversion of IEEE half-precision bits to f32 (portable, or F16C on x86).
pub(crate) trait HalfCvt {
    /// # Safety
    /// Implementations using CPU features require them to be enabled in the caller.
    unsafe fn cvt(h: u16) -> f32;
}

/// Portable exact half-precision conversion.
pub(crate) struct ScalarHalf;

impl HalfCvt for ScalarHalf {
    #[inline(always)]
    unsafe fn cvt(h: u16) -> f32 {
        f16_bits_to_f32(h)
    }
}

/// A 32-element weight block of the legacy formats or MXFP4.
pub(crate) trait Legacy {
    /// Bytes per block.
    const SIZE: usize;
    /// True for `d * q + m` formats (Q4_1, Q5_1): unsigned quants, Q8_1 activations.
    const MIN: bool;
    /// Scale and min (0 when the format has none), half-precision scales converted by `F`.
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32);
    /// The 32 quants in element order (signed, or unsigned 0..32 when `MIN`).
    unsafe fn unpack(p: *const u8) -> [i8; 32];
}

#[inline(always)]
fn nibbles(qs: [u8; 16]) -> [u8; 32] {
    std::array::from_fn(|i| if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 })
}

#[inline(always)]
fn fifth_bits(mut q: [u8; 32], qh: [u8; 4]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;
pub(crate) struct Mxfp4;

// SAFETY (every `unsafe` block in these impls): the caller passes a pointer to a whole block.
impl Legacy for Q4_0 {
    const SIZE: usize = 18;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        (F::cvt(unsafe { rd16(p) }), 0.0)
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        nibbles(unsafe { rd(p.add(2)) }).map(|v| v as i8 - 8)
    }
}
impl Legacy for Q4_1 {
    const SIZE: usize = 20;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        unsafe { (F::cvt(rd16(p)), F::cvt(rd16(p.add(2)))) }
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        nibbles(unsafe { rd(p.add(4)) }).map(|v| v as i8)
    }
}
impl Legacy for Q5_0 {
    const SIZE: usize = 22;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        (F::cvt(unsafe { rd16(p) }), 0.0)
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        unsafe { fifth_bits(nibbles(rd(p.add(6))), rd(p.add(2))) }.map(|v| v as i8 - 16)
    }
}
impl Legacy for Q5_1 {
    const SIZE: usize = 24;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        unsafe { (F::cvt(rd16(p)), F::cvt(rd16(p.add(2)))) }
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        unsafe { fifth_bits(nibbles(rd(p.add(8))), rd(p.add(4))) }.map(|v| v as i8)
    }
}
impl Legacy for Q8_0 {
    const SIZE: usize = 34;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        (F::cvt(unsafe { rd16(p) }), 0.0)
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        unsafe { rd::<32>(p.add(2)) }.map(|v| v as i8)
    }
}
impl Legacy for Mxfp4 {
    const SIZE: usize = 17;
    const MIN: bool = false;
    #[inline(always)]
    unsafe fn dm<F: HalfCvt>(p: *const u8) -> (f32, f32) {
        // SAFETY: `p` points to a whole block (caller).
        (e8m0_to_f32_half(unsafe { *p }), 0.0)
    }
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> [i8; 32] {
        // SAFETY: `p` points to a whole block (caller).
        nibbles(unsafe { rd(p.add(1)) }).map(|v| MXFP4_VALUES[v as usize])
    }
}

/// An unpacked K-quant super-block (see the module docs).
#[derive(Clone)]
pub(crate) struct KBlock {
    pub d: f32,
    pub dmin: f32,
    pub q: [u8; QK_K],
    pub sc: [i16; 16],
    pub mn: [i16; 16],
}

impl KBlock {
    pub(crate) fn new() -> Self {
        KBlock {
            d: 0.0,
            dmin: 0.0,
            q: [0; QK_K],
            sc: [0; 16],
            mn: [0; 16],
        }
    }
}

/// A K-quant weight super-block of 256 elements.
pub(crate) trait KQuant {
    const SIZE: usize;
    unsafe fn unpack<F: HalfCvt>(p: *const u8, out: &mut KBlock);
}

pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

/// The super-block scales, mins and per-32 scales of a Q4_K / Q5_K block.
#[inline(always)]
unsafe fn unpack_k4_scales<F: HalfCvt>(p: *const u8, out: &mut KBlock) {
    // SAFETY: the caller passes a whole Q4_K / Q5_K block.
    let scales = unsafe {
        out.d = F::cvt(rd16(p));
        out.dmin = F::cvt(rd16(p.add(2)));
        rd::<12>(p.add(4))
    };
    for s in 0..8 {
        let (sc, m) = get_scale_min_k4(s, &scales);
        out.sc[2 * s] = i16::from(sc);
        out.sc[2 * s + 1] = i16::from(sc);
        out.mn[2 * s] = i16::from(m);
        out.mn[2 * s + 1] = i16::from(m);
    }
}

/// Scales, mins and 4-bit quants shared by Q4_K and Q5_K (`qs` at byte `qs_off`).
#[inline(always)]
unsafe fn unpack_k4<F: HalfCvt>(p: *const u8, qs_off: usize, out: &mut KBlock) {
    // SAFETY: the caller passes a whole Q4_K / Q5_K block.
    let qs = unsafe {
        unpack_k4_scales::<F>(p, out);
        rd::<128>(p.add(qs_off))
    };
    for c in 0..4 {
        for l in 0..32 {
            out.q[64 * c + l] = qs[32 * c + l] & 15;
            out.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    }
}

impl KQuant for Q4K {
    const SIZE: usize = 144;
    #[inline(always)]
    unsafe fn unpack<F: HalfCvt>(p: *const u8, out: &mut KBlock) {
        // SAFETY: the caller passes a whole block.
        unsafe { unpack_k4::<F>(p, 16, out) }
    }
}
impl KQuant for Q5K {
    const SIZE: usize = 176;
    #[inline(always)]
    unsafe fn unpack<F: HalfCvt>(p: *const u8, out: &mut KBlock) {
        // SAFETY: the caller passes a whole block.
        let qh = unsafe {
            unpack_k4::<F>(p, 48, out);
            rd::<32>(p.add(16))
        };
        for s in 0..8 {
            for (o, &h) in out.q[32 * s..32 * s + 32].iter_mut().zip(&qh) {
                *o |= ((h >> s) & 1) << 4;
            }
        }
    }
}
impl KQuant for Q6K {
    const SIZE: usize = 210;
    #[inline(always)]
    unsafe fn unpack<F: HalfCvt>(p: *const u8, out: &mut KBlock) {
        // SAFETY: the caller passes a whole block.
        let (ql, qh, scales) = unsafe {
            out.d = F::cvt(rd16(p.add(208)));
            (rd::<128>(p), rd::<64>(p.add(128)), rd::<16>(p.add(192)))
        };
        out.dmin = out.d;
        for (j, &sc) in scales.iter().enumerate() {
            out.sc[j] = i16::from(sc as i8);
            out.mn[j] = 32 * out.sc[j];
        }
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    let lo = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                    let hi = (qh[32 * h + l] >> (2 * k)) & 3;
                    out.q[128 * h + 32 * k + l] = lo | (hi << 4);
                }
            }
        }
    }
}

/// Layout of a Q8_K activation block: f32 scale, 256 quants, sixteen i16 sums.
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 4 + QK_K;
pub(crate) const Q8K_SIZE: usize = 4 + QK_K + 32;

#[inline(always)]
unsafe fn legacy_scalar<T: Legacy, const C: usize>(
    w: *const u8,
    acts: &[*const u8; C],
    nb: usize,
) -> [f32; C] {
    let (aq, asz) = act_layout(T::MIN);
    let mut sum = [0f32; C];
    for i in 0..nb {
        // SAFETY: the row holds `nb` weight blocks and `nb` activation blocks (caller).
        unsafe {
            let p = w.add(i * T::SIZE);
            let (d, m) = T::dm::<ScalarHalf>(p);
            let q = T::unpack(p);
            for c in 0..C {
                let a = acts[c].add(i * asz);
                let qa = rd::<32>(a.add(aq));
                let sumi: i32 = q
                    .iter()
                    .zip(qa)
                    .map(|(&x, y)| i32::from(x) * i32::from(y as i8))
                    .sum();
                let da = f16_bits_to_f32(rd16(a));
                sum[c] += sumi as f32 * (d * da);
                if T::MIN {
                    sum[c] += m * f16_bits_to_f32(rd16(a.add(2)));
                }
            }
        }
    }
    sum
}

#[inline(always)]
unsafe fn kquant_scalar<T: KQuant, const C: usize>(
    w: *const u8,
    acts: &[*const u8; C],
    nb: usize,
) -> [f32; C] {
    let mut sum = [0f32; C];
    let mut kb = KBlock::new();
    for i in 0..nb {
        // SAFETY: the row holds `nb` weight and activation super-blocks (caller).
        unsafe {
            T::unpack::<ScalarHalf>(w.add(i * T::SIZE), &mut kb);
            for c in 0..C {
                let a = acts[c].add(i * Q8K_SIZE);
                let da = f32::from_le_bytes(rd::<4>(a));
                let qa = rd::<256>(a.add(Q8K_QS));
                let bs = rd::<32>(a.add(Q8K_BSUMS));
                let mut isum = 0i32;
                for j in 0..16 {
                    let g: i32 = (0..16)
                        .map(|l| i32::from(kb.q[16 * j + l]) * i32::from(qa[16 * j + l] as i8))
                        .sum();
                    isum += i32::from(kb.sc[j]) * g;
                }
                let msum: i32 = (0..16)
                    .map(|j| {
                        i32::from(kb.mn[j])
                            * i32::from(i16::from_le_bytes([bs[2 * j], bs[2 * j + 1]]))
                    })
                    .sum();
                sum[c] += kb.d * da * isum as f32 - kb.dmin * da * msum as f32;
            }
        }
    }
    sum
}

/// The portable kernel of one weight type for `C` columns.
type KernelFn<const C: usize> = unsafe fn(*const u8, &[*const u8; C], usize) -> [f32; C];

fn scalar_kernels<const C: usize>(wt: DType) -> Option<KernelFn<C>> {
    Some(match wt {
        DType::Q4_0 => legacy_scalar::<Q4_0, C>,
        DType::Q4_1 => legacy_scalar::<Q4_1, C>,
        DType::Q5_0 => legacy_scalar::<Q5_0, C>,
        DType::Q5_1 => legacy_scalar::<Q5_1, C>,
        DType::Q8_0 => legacy_scalar::<Q8_0, C>,
        DType::MXFP4 => legacy_scalar::<Mxfp4, C>,
        DType::Q4K => kquant_scalar::<Q4K, C>,
        DType::Q5K => kquant_scalar::<Q5K, C>,
        DType::Q6K => kquant_scalar::<Q6K, C>,
        _ => return None,
    })
}

/// True for the weight types with quantized kernels.
pub(crate) fn supported(wt: DType) -> bool {
    scalar_kernels::<1>(wt).is_some()
}

/// A kernel of one weight type: one weight row against 4 or 1 activation rows, or two weight rows
/// against 4 (by default two `dot4`; kernels that share the activation loads override it).
pub(crate) trait RowKernel {
    unsafe fn dot4(&self, w: *const u8, acts: &[*const u8; 4]) -> [f32; 4];
    unsafe fn dot1(&self, w: *const u8, act: *const u8) -> f32;
    #[inline(always)]
    unsafe fn dot2x4(&self, w: &[*const u8; 2], acts: &[*const u8; 4]) -> [[f32; 4]; 2] {
        // SAFETY: forwarded from the caller.
        unsafe { [self.dot4(w[0], acts), self.dot4(w[1], acts)] }
    }
}

struct ScalarKernel {
    k4: KernelFn<4>,
    k1: KernelFn<1>,
    nb: usize,
}

impl RowKernel for ScalarKernel {
    unsafe fn dot4(&self, w: *const u8, acts: &[*const u8; 4]) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { (self.k4)(w, acts, self.nb) }
    }
    unsafe fn dot1(&self, w: *const u8, act: *const u8) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe { (self.k1)(w, &[act], self.nb)[0] }
    }
}

/// Applies `kern` to `rows` x `cols` of a job: pairs of weight rows (one row when a single one is
/// left) against groups of 4 columns, the remaining columns one by one.
#[inline(always)]
pub(crate) unsafe fn rows_with<K: RowKernel>(
    kern: &K,
    job: &Job,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: the job's pointers are valid for `rows` x `cols` and these destination elements are
    // written by this thread only (caller).
    unsafe {
        let mut m = rows.start;
        while m < rows.end {
            let nr = if m + 1 < rows.end { 2 } else { 1 };
            let w = [
                job.w.add(m * job.w_stride),
                job.w.add((m + nr - 1) * job.w_stride),
            ];
            let mut c = cols.start;
            while c + 4 <= cols.end {
                let acts: [*const u8; 4] = std::array::from_fn(|i| job.acts[c + i]);
                if nr == 2 {
                    for (r, vals) in kern.dot2x4(&w, &acts).into_iter().enumerate() {
                        for (i, v) in vals.into_iter().enumerate() {
                            *job.dsts[c + i].add(m + r) = v;
                        }
                    }
                } else {
                    for (i, v) in kern.dot4(w[0], &acts).into_iter().enumerate() {
                        *job.dsts[c + i].add(m) = v;
                    }
                }
                c += 4;
            }
            for c in c..cols.end {
                for (r, &wr) in w.iter().enumerate().take(nr) {
                    *job.dsts[c].add(m + r) = kern.dot1(wr, job.acts[c]);
                }
            }
            m += nr;
        }
    }
}

/// Quantized row kernel for `rows` x `cols` of a job whose activations are `vec_dot_type(wt)` rows
/// of `k` elements.
///
/// # Safety
/// The job's pointers must be valid; no other thread may write the destination elements of
/// `rows` x `cols`; `level` must be available; `wt` must be [`supported`].
pub(crate) unsafe fn rows(
    level: SimdLevel,
    wt: DType,
    job: &Job,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let nb = k / wt.block_size();
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar {
        // SAFETY: forwarded from the caller.
        unsafe { super::quant_x86::rows(level, wt, job, nb, rows, cols) };
        return;
    }
    let _ = level;
    if let (Some(k4), Some(k1)) = (scalar_kernels::<4>(wt), scalar_kernels::<1>(wt)) {
        // SAFETY: forwarded from the caller.
        unsafe { rows_with(&ScalarKernel { k4, k1, nb }, job, rows, cols) }
    }
}

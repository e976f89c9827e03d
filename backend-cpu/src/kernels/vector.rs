//! f32 row primitives of the per-token kernels (dot product, `y += a x`, `y *= s`, F16 widening,
//! `exp` in place; the dot product and the row-wise `y += w_j x_j` also with F16 rows `x`, widened
//! exactly as they are loaded), written once over [`F32Vec`] and [`RowElem`] (`exp`: per ISA in `exp_x86.rs`, libm elsewhere)
//! and instantiated per SIMD level like the float matmul kernels, so
//! that attention and the row conversions use AVX2 / AVX-512 / NEON vectors whatever the crate's
//! baseline target is. The level is [`crate::matmul::simd::level`] (`GGML_TP_SIMD`), chosen once.

use crate::matmul::simd::{level, SimdLevel};
use crate::matmul::vec::{F32Vec, Scalar8};
use std::sync::OnceLock;

/// The primitives of one SIMD level (raw pointers with an element count; see the safe wrappers).
#[derive(Clone, Copy)]
pub(crate) struct RowOps {
    dot: unsafe fn(*const f32, *const f32, usize) -> f32,
    axpy: unsafe fn(f32, *const f32, *mut f32, usize),
    axpy_rows: unsafe fn(*const f32, *const *const f32, usize, *mut f32, usize),
    dot_f16: unsafe fn(*const f32, *const u16, usize) -> f32,
    axpy_rows_f16: unsafe fn(*const f32, *const *const u16, usize, *mut f32, usize),
    scale: unsafe fn(f32, *mut f32, usize),
    widen_f16: unsafe fn(*const u16, *mut f32, usize),
    exp: unsafe fn(*mut f32, usize),
}

impl RowOps {
    /// The primitives of `level` (which must be available).
    pub(crate) fn of(level: SimdLevel) -> RowOps {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::AVX2,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::AVX512,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => arm::NEON,
            _ => RowOps {
                dot: dot_impl::<Scalar8, f32>,
                axpy: axpy_impl::<Scalar8>,
                axpy_rows: axpy_rows_impl::<Scalar8, f32>,
                dot_f16: dot_impl::<Scalar8, u16>,
                axpy_rows_f16: axpy_rows_impl::<Scalar8, u16>,
                scale: scale_impl::<Scalar8>,
                widen_f16: widen_f16_impl::<Scalar8>,
                exp: exp_scalar,
            },
        }
    }

    /// `sum a[i] b[i]` over the shorter length.
    #[inline]
    pub(crate) fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: both slices hold at least `n` elements; `self` holds an available level's kernels.
        unsafe { (self.dot)(a.as_ptr(), b.as_ptr(), a.len().min(b.len())) }
    }

    /// `y[i] += alpha * x[i]` over the shorter length.
    #[inline]
    pub(crate) fn axpy(&self, alpha: f32, x: &[f32], y: &mut [f32]) {
        // SAFETY: as for `dot`.
        unsafe { (self.axpy)(alpha, x.as_ptr(), y.as_mut_ptr(), x.len().min(y.len())) }
    }

    /// `y[i] += w[j] * x_j[i]` for every row `x_j` of `xs` in turn, over `y`'s length (each `x_j`
    /// at least as long): the same steps as one [`RowOps::axpy`] per row, with `y` kept in
    /// registers across the rows.
    #[inline]
    pub(crate) fn axpy_rows(&self, w: &[f32], xs: &[&[f32]], y: &mut [f32]) {
        assert!(w.len() == xs.len() && xs.len() <= AXPY_ROWS_MAX);
        assert!(xs.iter().all(|x| x.len() >= y.len()));
        let mut ptrs = [std::ptr::null(); AXPY_ROWS_MAX];
        for (p, x) in ptrs.iter_mut().zip(xs) {
            *p = x.as_ptr();
        }
        // SAFETY: every row holds `y.len()` elements (checked); as for `dot` otherwise.
        unsafe { (self.axpy_rows)(w.as_ptr(), ptrs.as_ptr(), w.len(), y.as_mut_ptr(), y.len()) }
    }

    /// [`RowOps::dot`] of `a` with the `a.len()` IEEE halves at `b`, each widened exactly: the
    /// result of `dot` with the widened row, bit for bit.
    ///
    /// # Safety
    /// `b` must be readable for `a.len()` u16 (no alignment needed).
    #[inline]
    pub(crate) unsafe fn dot_f16(&self, a: &[f32], b: *const u8) -> f32 {
        // SAFETY: `b` is readable for `a.len()` u16 (caller).
        unsafe { (self.dot_f16)(a.as_ptr(), b as *const u16, a.len()) }
    }

    /// [`RowOps::axpy_rows`] with rows of IEEE halves at `xs` (widened exactly: the result of
    /// `axpy_rows` with the widened rows, bit for bit).
    ///
    /// # Safety
    /// Every row must be readable for `y.len()` u16 (no alignment needed).
    #[inline]
    pub(crate) unsafe fn axpy_rows_f16(&self, w: &[f32], xs: &[*const u8], y: &mut [f32]) {
        assert!(w.len() == xs.len());
        // SAFETY: every row is readable for `y.len()` u16 (caller); `*const u8` and `*const u16`
        // have the same layout.
        unsafe {
            (self.axpy_rows_f16)(
                w.as_ptr(),
                xs.as_ptr() as *const *const u16,
                w.len(),
                y.as_mut_ptr(),
                y.len(),
            )
        }
    }

    /// `y[i] *= s`.
    #[inline]
    pub(crate) fn scale(&self, s: f32, y: &mut [f32]) {
        // SAFETY: as for `dot`.
        unsafe { (self.scale)(s, y.as_mut_ptr(), y.len()) }
    }

    /// `y[i] = exp(y[i])` (within a few ulp of libm's `expf` on the vector levels; inputs below
    /// -87 may give a tiny positive value instead of a subnormal or 0).
    #[inline]
    pub(crate) fn exp(&self, y: &mut [f32]) {
        // SAFETY: as for `dot`.
        unsafe { (self.exp)(y.as_mut_ptr(), y.len()) }
    }

    /// Widens `out.len()` IEEE half-precision values at `src` exactly to f32.
    ///
    /// # Safety
    /// `src` must be readable for `out.len()` u16 (no alignment needed).
    #[inline]
    pub(crate) unsafe fn widen_f16(&self, src: *const u8, out: &mut [f32]) {
        // SAFETY: `src` is readable for `out.len()` u16 (caller); the loads are unaligned.
        unsafe { (self.widen_f16)(src as *const u16, out.as_mut_ptr(), out.len()) }
    }
}

/// The primitives at the process's SIMD level.
pub(crate) fn row_ops() -> &'static RowOps {
    static OPS: OnceLock<RowOps> = OnceLock::new();
    OPS.get_or_init(|| RowOps::of(level()))
}

/// libm's `expf` on every element.
unsafe fn exp_scalar(y: *mut f32, n: usize) {
    // SAFETY: `y` holds `n` elements (caller).
    for v in unsafe { std::slice::from_raw_parts_mut(y, n) } {
        *v = v.exp();
    }
}

/// Elements of the rows that [`dot_impl`] and [`axpy_rows_impl`] read as their second operand:
/// f32, or IEEE halves (`u16` bits) widened exactly on load.
trait RowElem: Copy {
    /// `V::LANES` elements at `p` as f32.
    unsafe fn load<V: F32Vec>(p: *const Self) -> V;
    /// The element at `p` as f32.
    unsafe fn get(p: *const Self) -> f32;
}

impl RowElem for f32 {
    #[inline(always)]
    unsafe fn load<V: F32Vec>(p: *const f32) -> V {
        // SAFETY: forwarded from the caller.
        unsafe { V::load(p) }
    }
    #[inline(always)]
    unsafe fn get(p: *const f32) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe { *p }
    }
}

impl RowElem for u16 {
    #[inline(always)]
    unsafe fn load<V: F32Vec>(p: *const u16) -> V {
        // SAFETY: forwarded from the caller.
        unsafe { V::load_f16(p) }
    }
    #[inline(always)]
    unsafe fn get(p: *const u16) -> f32 {
        // SAFETY: forwarded from the caller (no alignment needed).
        ggml_core::quant::f16_bits_to_f32(unsafe { p.read_unaligned() })
    }
}

#[inline(always)]
unsafe fn dot_impl<V: F32Vec, E: RowElem>(a: *const f32, b: *const E, n: usize) -> f32 {
    let l = V::LANES;
    // SAFETY: `a` and `b` hold `n` elements (caller); every load stays below `n`.
    unsafe {
        let (mut acc0, mut acc1) = (V::zero(), V::zero());
        let mut i = 0;
        while i + 2 * l <= n {
            acc0 = V::fmadd(V::load(a.add(i)), E::load(b.add(i)), acc0);
            acc1 = V::fmadd(V::load(a.add(i + l)), E::load(b.add(i + l)), acc1);
            i += 2 * l;
        }
        if i + l <= n {
            acc0 = V::fmadd(V::load(a.add(i)), E::load(b.add(i)), acc0);
            i += l;
        }
        let mut s = V::add(acc0, acc1).hsum();
        for j in i..n {
            s += *a.add(j) * E::get(b.add(j));
        }
        s
    }
}

#[inline(always)]
unsafe fn axpy_impl<V: F32Vec>(alpha: f32, x: *const f32, y: *mut f32, n: usize) {
    let l = V::LANES;
    // SAFETY: `x` and `y` hold `n` elements (caller) and do not overlap (distinct slices).
    unsafe {
        let av = V::splat(alpha);
        let mut i = 0;
        while i + l <= n {
            V::fmadd(av, V::load(x.add(i)), V::load(y.add(i))).store(y.add(i));
            i += l;
        }
        for j in i..n {
            *y.add(j) += alpha * *x.add(j);
        }
    }
}

/// Vectors of `y` one [`axpy_rows_impl`] pass keeps in registers.
const AXPY_TILE: usize = 4;

/// Rows one [`RowOps::axpy_rows`] call takes at most.
pub(crate) const AXPY_ROWS_MAX: usize = 16;

#[inline(always)]
unsafe fn axpy_rows_impl<V: F32Vec, E: RowElem>(
    w: *const f32,
    xs: *const *const E,
    count: usize,
    y: *mut f32,
    n: usize,
) {
    let l = V::LANES;
    // SAFETY: `w` and `xs` hold `count` entries, every row and `y` `n` elements, rows and `y`
    // do not overlap (caller).
    unsafe {
        let mut i = 0;
        while i < n / l * l {
            let t = ((n / l * l - i) / l).min(AXPY_TILE);
            let mut acc = [V::zero(); AXPY_TILE];
            for (k, a) in acc.iter_mut().enumerate().take(t) {
                *a = V::load(y.add(i + k * l));
            }
            for j in 0..count {
                let (wv, x) = (V::splat(*w.add(j)), *xs.add(j));
                for (k, a) in acc.iter_mut().enumerate().take(t) {
                    *a = V::fmadd(wv, E::load(x.add(i + k * l)), *a);
                }
            }
            for (k, a) in acc.iter().enumerate().take(t) {
                a.store(y.add(i + k * l));
            }
            i += t * l;
        }
        for e in i..n {
            for j in 0..count {
                *y.add(e) += *w.add(j) * E::get((*xs.add(j)).add(e));
            }
        }
    }
}

#[inline(always)]
unsafe fn scale_impl<V: F32Vec>(s: f32, y: *mut f32, n: usize) {
    let l = V::LANES;
    // SAFETY: `y` holds `n` elements (caller).
    unsafe {
        let (sv, zero) = (V::splat(s), V::zero());
        let mut i = 0;
        while i + l <= n {
            V::fmadd(sv, V::load(y.add(i)), zero).store(y.add(i));
            i += l;
        }
        for j in i..n {
            *y.add(j) *= s;
        }
    }
}

#[inline(always)]
unsafe fn widen_f16_impl<V: F32Vec>(src: *const u16, out: *mut f32, n: usize) {
    let l = V::LANES;
    // SAFETY: `src` and `out` hold `n` elements (caller); `src` may be unaligned.
    unsafe {
        let mut i = 0;
        while i + l <= n {
            V::load_f16(src.add(i)).store(out.add(i));
            i += l;
        }
        for j in i..n {
            *out.add(j) = ggml_core::quant::f16_bits_to_f32(src.add(j).read_unaligned());
        }
    }
}

/// Instantiates the primitives for vector type `$v` inside functions compiled with `$features`.
macro_rules! row_ops_for {
    ($name:ident, $v:ty, $features:literal, $exp:path) => {
        pub(super) const $name: RowOps = {
            #[target_feature(enable = $features)]
            unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
                // SAFETY: features checked by `RowOps::of`'s caller; pointers from the wrappers.
                unsafe { dot_impl::<$v, f32>(a, b, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn dot_f16(a: *const f32, b: *const u16, n: usize) -> f32 {
                // SAFETY: as for `dot`.
                unsafe { dot_impl::<$v, u16>(a, b, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn axpy(alpha: f32, x: *const f32, y: *mut f32, n: usize) {
                // SAFETY: as for `dot`.
                unsafe { axpy_impl::<$v>(alpha, x, y, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn axpy_rows(
                w: *const f32,
                xs: *const *const f32,
                count: usize,
                y: *mut f32,
                n: usize,
            ) {
                // SAFETY: as for `dot`.
                unsafe { axpy_rows_impl::<$v, f32>(w, xs, count, y, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn axpy_rows_f16(
                w: *const f32,
                xs: *const *const u16,
                count: usize,
                y: *mut f32,
                n: usize,
            ) {
                // SAFETY: as for `dot`.
                unsafe { axpy_rows_impl::<$v, u16>(w, xs, count, y, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn scale(s: f32, y: *mut f32, n: usize) {
                // SAFETY: as for `dot`.
                unsafe { scale_impl::<$v>(s, y, n) }
            }
            #[target_feature(enable = $features)]
            unsafe fn widen_f16(src: *const u16, out: *mut f32, n: usize) {
                // SAFETY: as for `dot`.
                unsafe { widen_f16_impl::<$v>(src, out, n) }
            }
            RowOps {
                dot,
                axpy,
                axpy_rows,
                dot_f16,
                axpy_rows_f16,
                scale,
                widen_f16,
                exp: $exp,
            }
        };
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::{__m256, __m512};

    use crate::kernels::exp_x86::{exp_avx2, exp_avx512};

    row_ops_for!(AVX2, __m256, "avx2,fma,f16c", exp_avx2);
    row_ops_for!(
        AVX512,
        __m512,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
        exp_avx512
    );
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::*;
    use crate::matmul::vec::Neon8;

    row_ops_for!(NEON, Neon8, "neon", super::exp_scalar);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Every available level against an f64 reference, odd lengths, fresh random inputs.
    #[test]
    fn row_ops_every_level_against_f64() {
        let mut rng = rand::thread_rng();
        for lvl in SimdLevel::available() {
            let ops = RowOps::of(lvl);
            for n in [0usize, 1, 7, 8, 17, 33, 64, 131] {
                let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let want: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x * y)).sum();
                let mag: f64 = a
                    .iter()
                    .zip(&b)
                    .map(|(&x, &y)| f64::from(x * y).abs())
                    .sum();
                let got = f64::from(ops.dot(&a, &b));
                assert!(
                    (got - want).abs() <= 1e-6 * (mag + 1.0),
                    "{lvl:?} dot n={n}"
                );

                let alpha: f32 = rng.gen_range(-2.0..2.0);
                let mut y = b.clone();
                ops.axpy(alpha, &a, &mut y);
                for i in 0..n {
                    let w = f64::from(b[i]) + f64::from(alpha) * f64::from(a[i]);
                    assert!(
                        (f64::from(y[i]) - w).abs() <= 1e-6,
                        "{lvl:?} axpy n={n} i={i}"
                    );
                }
                // axpy_rows: the steps of one axpy per row, bit for bit (odd row counts and
                // lengths: whole tiles, a partial tile, the scalar tail).
                for rows in [1usize, 3, 16] {
                    let xs: Vec<Vec<f32>> = (0..rows)
                        .map(|_| (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect())
                        .collect();
                    let w: Vec<f32> = (0..rows).map(|_| rng.gen_range(0.0..1.0)).collect();
                    let (mut one, mut all) = (b.clone(), b.clone());
                    for (x, &wj) in xs.iter().zip(&w) {
                        ops.axpy(wj, x, &mut one);
                    }
                    let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
                    ops.axpy_rows(&w, &refs, &mut all);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&one),
                        bits(&all),
                        "{lvl:?} axpy_rows n={n} rows={rows}"
                    );
                }
                let xs: Vec<f32> = (0..n).map(|_| rng.gen_range(-90.0..5.0)).collect();
                let mut e = xs.clone();
                ops.exp(&mut e);
                for (&x, &g) in xs.iter().zip(&e) {
                    let w = f64::from(x).exp();
                    assert!(
                        (f64::from(g) - w).abs() <= 4e-7 * w + 1e-37,
                        "{lvl:?} exp({x}) = {g}, want {w}"
                    );
                }
                ops.scale(alpha, &mut y);
                let h: Vec<u16> = a
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect();
                let mut wide = vec![f32::NAN; n];
                // SAFETY: `h` holds `n` u16.
                unsafe { ops.widen_f16(h.as_ptr() as *const u8, &mut wide) };
                for i in 0..n {
                    let w = f64::from(b[i]) + f64::from(alpha) * f64::from(a[i]);
                    let ws = w * f64::from(alpha);
                    assert!(
                        (f64::from(y[i]) - ws).abs() <= 1e-5,
                        "{lvl:?} scale n={n} i={i}"
                    );
                    assert_eq!(
                        wide[i],
                        half::f16::from_bits(h[i]).to_f32(),
                        "{lvl:?} f16 n={n}"
                    );
                }
                // The F16 row primitives: the f32 ones on the widened rows, bit for bit.
                // SAFETY: `h` holds `n` u16.
                let d16 = unsafe { ops.dot_f16(&b, h.as_ptr() as *const u8) };
                assert_eq!(
                    d16.to_bits(),
                    ops.dot(&b, &wide).to_bits(),
                    "{lvl:?} dot_f16 n={n}"
                );
                let w: Vec<f32> = (0..3).map(|_| rng.gen_range(0.0..1.0)).collect();
                let (mut from16, mut from32) = (b.clone(), b.clone());
                // SAFETY: every row holds `n` u16.
                unsafe { ops.axpy_rows_f16(&w, &[h.as_ptr() as *const u8; 3], &mut from16) };
                ops.axpy_rows(&w, &[&wide[..]; 3], &mut from32);
                assert!(
                    from16
                        .iter()
                        .zip(&from32)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{lvl:?} axpy_rows_f16 n={n}"
                );
            }
        }
    }
}

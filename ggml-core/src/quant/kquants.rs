//! The K-quant super-block formats Q4_K, Q5_K, Q6_K (weights) and Q8_K (activations): unpacking
//! to integer quants, dequantization (the f32 operation order of gguf-py: `(d * sc) * q - (dmin *
//! m)` for Q4_K/Q5_K, `(d * sc) * q` for Q6_K, `d * q` for Q8_K), and ggml's reference quantizers
//! (`quantize_row_q{4,5,6,8}_K_ref`, with `make_qkx2_quants` / `make_qx_quants`).

use super::blocks::{
    f16_to_f32, f32_to_f16, get_scale_min_k4, nearest_int, pack_scale_min_k4, BlockQ4K, BlockQ5K,
    BlockQ6K, BlockQ8K,
};
use super::QuantBlock;
use crate::dtype::{DType, QK_K};

/// Amax below which ggml treats a group as all zeros.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The 4-bit quants of a Q4_K / the low 4 bits of a Q5_K: 4 chunks of 32 bytes, low nibbles are
/// sub-block `2c`, high nibbles sub-block `2c + 1`.
#[inline]
fn unpack_k4(qs: &[u8; QK_K / 2]) -> [i8; QK_K] {
    let mut q = [0i8; QK_K];
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            let b = qs[32 * c + l];
            q[64 * c + l] = (b & 0x0F) as i8;
            q[64 * c + 32 + l] = (b >> 4) as i8;
        }
    }
    q
}

/// Inverse of [`unpack_k4`] (values must be below 16).
#[inline]
fn pack_k4(q: &[u8; QK_K]) -> [u8; QK_K / 2] {
    let mut qs = [0u8; QK_K / 2];
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            qs[32 * c + l] = (q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4);
        }
    }
    qs
}

/// `(d * sc_s, dmin * m_s)` for the 8 sub-blocks of a Q4_K / Q5_K super-block.
#[inline]
fn k4_scales(d: f32, dmin: f32, scales: &[u8; 12]) -> [(f32, f32); 8] {
    std::array::from_fn(|s| {
        let (sc, m) = get_scale_min_k4(s, scales);
        (d * f32::from(sc), dmin * f32::from(m))
    })
}

fn dequant_k4(q: &[i8; QK_K], d: f32, dmin: f32, scales: &[u8; 12], out: &mut [f32]) {
    let sm = k4_scales(d, dmin, scales);
    for (s, (qs, os)) in q.chunks_exact(32).zip(out.chunks_exact_mut(32)).enumerate() {
        let (ds, ms) = sm[s];
        for (o, &v) in os.iter_mut().zip(qs) {
            *o = ds * f32::from(v) - ms;
        }
    }
}

impl BlockQ4K {
    /// The quants 0..16 in element order; element `i` = `d * sc_{i/32} * q - dmin * m_{i/32}`.
    pub fn unpack(&self) -> [i8; QK_K] {
        unpack_k4(&self.qs)
    }

    /// The eight `(scale, min)` pairs, see [`get_scale_min_k4`].
    pub fn scale_mins(&self) -> [(u8, u8); 8] {
        std::array::from_fn(|s| get_scale_min_k4(s, &self.scales))
    }
}

impl BlockQ5K {
    /// The quants 0..32 in element order; element `i` = `d * sc_{i/32} * q - dmin * m_{i/32}`.
    pub fn unpack(&self) -> [i8; QK_K] {
        let mut q = unpack_k4(&self.qs);
        for (i, v) in q.iter_mut().enumerate() {
            *v |= (((self.qh[i % 32] >> (i / 32)) & 1) << 4) as i8;
        }
        q
    }

    /// The eight `(scale, min)` pairs, see [`get_scale_min_k4`].
    pub fn scale_mins(&self) -> [(u8, u8); 8] {
        std::array::from_fn(|s| get_scale_min_k4(s, &self.scales))
    }
}

impl BlockQ6K {
    /// The signed quants `q - 32` (-32..32) in element order; element `i` = `d * scales[i/16] * q`.
    ///
    /// Each half `h` of 128 elements uses `ql[64h..64h+64]` and `qh[32h..32h+32]`: element
    /// `128h + 32k + l` has low bits `ql[64h + 32(k%2) + l] >> 4(k/2)` and high bits
    /// `(qh[32h + l] >> 2k) & 3`.
    pub fn unpack(&self) -> [i8; QK_K] {
        let mut q = [0i8; QK_K];
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    let lo = (self.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                    let hi = (self.qh[32 * h + l] >> (2 * k)) & 3;
                    q[128 * h + 32 * k + l] = (lo | (hi << 4)) as i8 - 32;
                }
            }
        }
        q
    }
}

/// Inverse of [`BlockQ6K::unpack`] for the unsigned quants `q + 32` (0..64).
fn pack_q6(l: &[u8; QK_K]) -> ([u8; QK_K / 2], [u8; QK_K / 4]) {
    let mut ql = [0u8; QK_K / 2];
    let mut qh = [0u8; QK_K / 4];
    for h in 0..2 {
        for k in 0..4 {
            for i in 0..32 {
                let v = l[128 * h + 32 * k + i];
                ql[64 * h + 32 * (k % 2) + i] |= (v & 0x0F) << (4 * (k / 2));
                qh[32 * h + i] |= ((v >> 4) & 3) << (2 * k);
            }
        }
    }
    (ql, qh)
}

/// ggml's `make_qkx2_quants`: an asymmetric fit of `x ~ scale * L - min` over `L` in `0..=nmax`
/// with weights, searching `nstep + 1` scales. Returns `(scale, min)` (min >= 0) and fills `l`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.iter_mut().for_each(|v| *v = 0);
        return (0.0, -min);
    }
    let quant = |iscale: f32, xi: f32, min: f32| nearest_int(iscale * (xi - min)).clamp(0, nmax);
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        l[i] = quant(iscale, x[i], min) as u8;
        let diff = scale * f32::from(l[i]) + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let li = quant(iscale, x[i], min);
            laux[i] = li as u8;
            let (w, lf) = (weights[i], li as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The shared part of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: per-sub-block fits, 6-bit
/// scales and mins relative to the super-block `d` / `dmin`, then requantization with the stored
/// scales. Returns `(d, dmin, packed scales, quants 0..=nmax)`.
fn quantize_k4_like(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
) -> (half::f16, half::f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (sc, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
        );
        scales[j] = sc;
        mins[j] = m;
        if sc > max_scale {
            max_scale = sc;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] =
        std::array::from_fn(|j| nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8);
    let lm: [u8; 8] = std::array::from_fn(|j| nearest_int(inv_min * mins[j]).clamp(0, 63) as u8);
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    for (j, &(ds, dm)) in k4_scales(f16_to_f32(d), f16_to_f32(dmin), &packed)
        .iter()
        .enumerate()
    {
        if ds == 0.0 {
            continue;
        }
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / ds).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

impl QuantBlock for BlockQ4K {
    const DTYPE: DType = DType::Q4K;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_k4(
            &self.unpack(),
            f16_to_f32(self.d),
            f16_to_f32(self.dmin),
            &self.scales,
            out,
        );
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, dmin, scales, l) = quantize_k4_like(x, 15, -1.0, 20);
        BlockQ4K {
            d,
            dmin,
            scales,
            qs: pack_k4(&l),
        }
    }
}

impl QuantBlock for BlockQ5K {
    const DTYPE: DType = DType::Q5K;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_k4(
            &self.unpack(),
            f16_to_f32(self.d),
            f16_to_f32(self.dmin),
            &self.scales,
            out,
        );
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, dmin, scales, l) = quantize_k4_like(x, 31, -0.5, 15);
        let mut qh = [0u8; QK_K / 8];
        for (i, &v) in l.iter().enumerate() {
            qh[i % 32] |= ((v >> 4) & 1) << (i / 32);
        }
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs: pack_k4(&l),
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x^2`): a
/// symmetric fit `x ~ scale * (L - nmax)` with `L` in `0..2 nmax`, trying 19 scales.
fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let quant = |iscale: f32, xi: f32| nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        x.iter().fold((0.0f32, 0.0f32), |(slx, sl2), &xi| {
            let (w, lf) = (xi * xi, quant(iscale, xi) as f32);
            (slx + w * xi * lf, sl2 + w * lf * lf)
        })
    };
    let mut iscale = -(nmax as f32) / max;
    let set_l = |iscale: f32, l: &mut [u8]| {
        for (li, &xi) in l.iter_mut().zip(x) {
            *li = (quant(iscale, xi) + nmax) as u8;
        }
    };
    set_l(iscale, l);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            set_l(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

impl QuantBlock for BlockQ6K {
    const DTYPE: DType = DType::Q6K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let q = self.unpack();
        for (s, (qs, os)) in q.chunks_exact(16).zip(out.chunks_exact_mut(16)).enumerate() {
            let ds = d * f32::from(self.scales[s]);
            for (o, &v) in os.iter_mut().zip(qs) {
                *o = ds * f32::from(v);
            }
        }
    }
    fn quantize(x: &[f32]) -> Self {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (ib, sc) in scales.iter_mut().enumerate() {
            *sc = make_qx_quants(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
            if sc.abs() > max_abs_scale {
                max_abs_scale = sc.abs();
                max_scale = *sc;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            return bytemuck::Zeroable::zeroed();
        }
        let iscale = -128.0 / max_scale;
        let d = f32_to_f16(1.0 / iscale);
        let qscales: [i8; QK_K / 16] =
            std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).clamp(-128, 127) as i8);
        for (j, &qs) in qscales.iter().enumerate() {
            let ds = f16_to_f32(d) * f32::from(qs);
            if ds == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / ds).clamp(-32, 31) + 32) as u8;
            }
        }
        let (ql, qh) = pack_q6(&l);
        BlockQ6K {
            ql,
            qh,
            scales: qscales,
            d,
        }
    }
}

impl QuantBlock for BlockQ8K {
    const DTYPE: DType = DType::Q8K;
    fn dequantize(&self, out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(&self.qs) {
            *o = self.d * f32::from(v);
        }
    }
    fn quantize(x: &[f32]) -> Self {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut b: BlockQ8K = bytemuck::Zeroable::zeroed();
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).clamp(-128, 127) as i8;
        }
        for (s, chunk) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = chunk.iter().map(|&v| i16::from(v)).sum();
        }
        b.d = 1.0 / iscale;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k4_and_q6_packing_round_trip() {
        let l: [u8; QK_K] = std::array::from_fn(|i| ((i * 37 + 11) % 64) as u8);
        let (ql, qh) = pack_q6(&l);
        let b = BlockQ6K {
            ql,
            qh,
            scales: [1; 16],
            d: f32_to_f16(1.0),
        };
        let q = b.unpack();
        for i in 0..QK_K {
            assert_eq!(i32::from(q[i]) + 32, i32::from(l[i]), "element {i}");
        }
        let l4: [u8; QK_K] = std::array::from_fn(|i| ((i * 5 + 3) % 16) as u8);
        let q4 = unpack_k4(&pack_k4(&l4));
        assert!(q4.iter().zip(&l4).all(|(&a, &b)| a as u8 == b));
    }

    #[test]
    fn q8k_bsums_are_sums_of_sixteen() {
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 13) % 29) as f32 - 14.0).collect();
        let b = BlockQ8K::quantize(&x);
        for j in 0..16 {
            let s: i32 = b.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(i32::from(b.bsums[j]), s);
        }
        assert_eq!(b.qs.iter().map(|v| v.unsigned_abs()).max(), Some(127));
    }
}

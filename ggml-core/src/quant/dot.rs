//! Activation types of weight types and scalar reference dot products `weight . activation`,
//! computed as ggml's generic (non-SIMD) `ggml_vec_dot_*`: an integer dot product per block,
//! scaled by the two block scales in f32 (plus the min terms of Q4_1/Q5_1 and the K-quants, which
//! use the activation's `s` / `bsums`). Float types accumulate f32 products in f64.

use super::blocks::{
    e8m0_to_f32_half, f16_to_f32, BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0,
    BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use super::{check_row, dequantize_row, read_blocks};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The type a row of `weight` is multiplied against in a dot product (ggml's `vec_dot_type`):
/// Q4_0, Q5_0, Q8_0, MXFP4 -> Q8_0; Q4_1, Q5_1 -> Q8_1; Q4_K, Q5_K, Q6_K -> Q8_K; float types ->
/// themselves. Q8_1, Q8_K and I32 map to themselves but have no [`vec_dot_ref`].
pub fn vec_dot_type(weight: DType) -> DType {
    match weight {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::MXFP4 => DType::Q8_0,
        DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
        DType::Q4K | DType::Q5K | DType::Q6K => DType::Q8K,
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::Q8_1 | DType::Q8K => weight,
        DType::Q4_0G | DType::Q8_0G => vec_dot_type(weight.base()),
    }
}

/// `sum_i dequant(w)[i] * dequant(act)[i]` over `n` elements, where `w` is a row of `weight` and
/// `act` a row of [`vec_dot_type`]`(weight)`, both exactly `row_size(n)` bytes. Errors for a bad
/// length or a type without a dot product (I32, Q8_1, Q8_K).
pub fn vec_dot_ref(weight: DType, w: &[u8], act: &[u8], n: usize) -> Result<f32> {
    let act_type = vec_dot_type(weight);
    check_row("vec_dot_ref", weight, n, w.len())?;
    check_row("vec_dot_ref", act_type, n, act.len())?;
    Ok(match weight {
        DType::F32 | DType::F16 | DType::BF16 => float_dot(weight, w, act, n)?,
        DType::Q4_0G | DType::Q8_0G => {
            vec_dot_ref(weight.base(), &super::ungroup(weight, w)?, act, n)?
        }
        DType::Q4_0 => sym_dot::<BlockQ4_0>(w, act, |x| (f16_to_f32(x.d), x.unpack())),
        DType::Q5_0 => sym_dot::<BlockQ5_0>(w, act, |x| (f16_to_f32(x.d), x.unpack())),
        DType::Q8_0 => sym_dot::<BlockQ8_0>(w, act, |x| (f16_to_f32(x.d), x.qs)),
        DType::MXFP4 => sym_dot::<BlockMxfp4>(w, act, |x| (e8m0_to_f32_half(x.e), x.unpack())),
        DType::Q4_1 => {
            min_dot::<BlockQ4_1>(w, act, |x| (f16_to_f32(x.d), f16_to_f32(x.m), x.unpack()))
        }
        DType::Q5_1 => {
            min_dot::<BlockQ5_1>(w, act, |x| (f16_to_f32(x.d), f16_to_f32(x.m), x.unpack()))
        }
        DType::Q4K => k4_dot::<BlockQ4K>(w, act, |x| {
            (
                f16_to_f32(x.d),
                f16_to_f32(x.dmin),
                x.scale_mins(),
                x.unpack(),
            )
        }),
        DType::Q5K => k4_dot::<BlockQ5K>(w, act, |x| {
            (
                f16_to_f32(x.d),
                f16_to_f32(x.dmin),
                x.scale_mins(),
                x.unpack(),
            )
        }),
        DType::Q6K => q6k_dot(w, act),
        DType::I32 | DType::Q8_1 | DType::Q8K => {
            return Err(Error::UnsupportedType {
                dtype: weight,
                what: "vec_dot_ref (as a weight)".into(),
            })
        }
    })
}

/// Integer dot product of two equally long quant slices.
#[inline]
fn idot(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

fn float_dot(dtype: DType, w: &[u8], act: &[u8], n: usize) -> Result<f32> {
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    dequantize_row(dtype, w, &mut a)?;
    dequantize_row(dtype, act, &mut b)?;
    Ok(a.iter()
        .zip(&b)
        .map(|(&x, &y)| f64::from(x * y))
        .sum::<f64>() as f32)
}

/// Weights `d * q` against Q8_0: `sum += sumi * (d_w * d_a)`.
fn sym_dot<B: bytemuck::Pod>(w: &[u8], act: &[u8], get: impl Fn(&B) -> (f32, [i8; 32])) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in read_blocks::<B>(w).zip(read_blocks::<BlockQ8_0>(act)) {
        let (d, q) = get(&x);
        sumf += idot(&q, &y.qs) as f32 * (d * f16_to_f32(y.d));
    }
    sumf
}

/// Weights `d * q + m` against Q8_1: `sum += (d_w * d_a) * sumi + m_w * s_a`.
fn min_dot<B: bytemuck::Pod>(
    w: &[u8],
    act: &[u8],
    get: impl Fn(&B) -> (f32, f32, [i8; 32]),
) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in read_blocks::<B>(w).zip(read_blocks::<BlockQ8_1>(act)) {
        let (d, m, q) = get(&x);
        sumf += (d * f16_to_f32(y.d)) * idot(&q, &y.qs) as f32 + m * f16_to_f32(y.s);
    }
    sumf
}

type K4Parts = (f32, f32, [(u8, u8); 8], [i8; 256]);

/// Q4_K / Q5_K against Q8_K: `sum += d_w * d_a * sum_s(sc_s * dot_s) - dmin_w * d_a *
/// sum_j(bsums_j * m_{j/2})`.
fn k4_dot<B: bytemuck::Pod>(w: &[u8], act: &[u8], get: impl Fn(&B) -> K4Parts) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in read_blocks::<B>(w).zip(read_blocks::<BlockQ8K>(act)) {
        let (d, dmin, sm, q) = get(&x);
        let mut isum = 0i32;
        for (s, &(sc, _)) in sm.iter().enumerate() {
            isum += i32::from(sc) * idot(&q[32 * s..32 * s + 32], &y.qs[32 * s..32 * s + 32]);
        }
        let msum: i32 = y
            .bsums
            .iter()
            .enumerate()
            .map(|(j, &b)| i32::from(b) * i32::from(sm[j / 2].1))
            .sum();
        sumf += d * y.d * isum as f32 - dmin * y.d * msum as f32;
    }
    sumf
}

/// Q6_K against Q8_K: `sum += d_w * d_a * sum_s(scales_s * dot_s)` over 16 sub-blocks of 16.
fn q6k_dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in read_blocks::<BlockQ6K>(w).zip(read_blocks::<BlockQ8K>(act)) {
        let q = x.unpack();
        let mut isum = 0i32;
        for (s, &sc) in x.scales.iter().enumerate() {
            isum += i32::from(sc) * idot(&q[16 * s..16 * s + 16], &y.qs[16 * s..16 * s + 16]);
        }
        sumf += f16_to_f32(x.d) * y.d * isum as f32;
    }
    sumf
}

//! What the kernels take and handle: the tensor descriptor [`TDesc`] (mirrors `struct TD` in
//! `common.cu`), the type codes and names, the launch-shape constants, and [`supports`], the
//! op/type table that `supports_op` answers from (for CUDA and HIP alike).

use ggml_core::{DType, Error, Layout, Op, Result};

/// A tensor as the kernels see it: device address, shape, byte strides, type code (`T_*` in
/// `common.cu`). Mirrors `struct TD`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TDesc {
    pub ptr: u64,
    pub ne: [i64; 4],
    pub nb: [i64; 4],
    pub dtype: i32,
    pub pad: i32,
}

impl TDesc {
    /// The descriptor of `layout` at device address `ptr`.
    pub fn new(ptr: u64, l: &Layout) -> Result<TDesc> {
        let code = type_code(l.dtype).ok_or_else(|| Error::UnsupportedType {
            dtype: l.dtype,
            what: "the GPU kernels".into(),
        })?;
        Ok(TDesc {
            ptr,
            ne: l.ne.map(|v| v as i64),
            nb: l.nb.map(|v| v as i64),
            dtype: code,
            pad: 0,
        })
    }

    /// A contiguous tensor of `dtype` and shape `ne` at `ptr`.
    pub fn contiguous(ptr: u64, dtype: DType, ne: [usize; 4]) -> Result<TDesc> {
        TDesc::new(ptr, &Layout::contiguous(dtype, ne))
    }

    /// A placeholder for an absent optional operand (shape of ones, so index arithmetic stays
    /// defined).
    pub fn absent() -> TDesc {
        TDesc {
            ne: [1; 4],
            ..Default::default()
        }
    }
}

/// The kernels' code of a type, or `None` for types they cannot read.
pub fn type_code(t: DType) -> Option<i32> {
    Some(match t {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::Q4_0 => 4,
        DType::Q4_1 => 5,
        DType::Q5_0 => 6,
        DType::Q5_1 => 7,
        DType::Q8_0 => 8,
        DType::Q4K => 9,
        DType::Q5K => 10,
        DType::Q6K => 11,
        DType::MXFP4 => 12,
        DType::Q4_0G => 13,
        DType::Q8_0G => 14,
        DType::Q8_1 | DType::Q8K => return None,
    })
}

/// The name of type `t` in kernel names (`k_gemv_q4_k_1`), for the types with own kernels.
pub fn type_name(t: DType) -> Option<&'static str> {
    Some(match t {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Q4_0 => "q4_0",
        DType::Q4_1 => "q4_1",
        DType::Q5_0 => "q5_0",
        DType::Q5_1 => "q5_1",
        DType::Q8_0 => "q8_0",
        DType::Q4K => "q4_k",
        DType::Q5K => "q5_k",
        DType::Q6K => "q6_k",
        DType::MXFP4 => "mxfp4",
        DType::Q4_0G => "q4_0g",
        DType::Q8_0G => "q8_0g",
        _ => return None,
    })
}

/// The type a GPU keeps weights of type `dtype` with rows of `ne0` elements in
/// ([`ggml_core::Device::weight_dtype`]): rows of whole groups regrouped for the types
/// `GGML_TP_GROUPED_WEIGHTS` names (Q8_0 by default); every other weight as it is.
pub fn weight_dtype(dtype: DType, ne0: usize) -> DType {
    let regroup = crate::settings::settings().grouped_weights.contains(&dtype);
    match dtype.grouped() {
        Some(g) if regroup && g.row_size(ne0).is_some() => g,
        _ => dtype,
    }
}

/// Threads per block of the element-wise kernels.
pub const THREADS: u32 = 256;
/// Most blocks of one element-wise launch (grid-stride loops cover the rest).
pub const MAX_BLOCKS: usize = 1 << 20;
/// Largest row argsort/top_k sorts in shared memory.
pub const MAX_SORT: usize = 4096;
/// Largest head size of flash_attn_ext (`FA_MAX_D` in attention.cu).
pub const MAX_HEAD: usize = 512;

fn readable(t: DType) -> bool {
    type_code(t).is_some()
}

fn float(t: DType) -> bool {
    t.is_float()
}

fn fits_i32(l: &Layout) -> bool {
    l.ne.iter().all(|&n| n < i32::MAX as usize)
}

/// True when the kernels handle `op` with these source layouts and result layout.
pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    let t = |i: usize| src.get(i).map(|l| l.dtype);
    let (a, b) = (t(0), t(1));
    let rows_ok = dst.nrows() < (1usize << 31) && src.iter().all(|l| l.nrows() < (1usize << 31));
    if !rows_ok {
        return false;
    }
    match op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => true,
        Op::Cpy | Op::Cont => match (a, dst.dtype) {
            (Some(s), d) if float(d) => readable(s),
            (Some(DType::I32), DType::I32) => true,
            (Some(s), DType::Q8_0 | DType::Q4_0) if float(s) => true,
            (Some(s), d) if s == d && d.is_quantized() => readable(d) && src[0].ne[0] == dst.ne[0],
            _ => false,
        },
        Op::GetRows => {
            b == Some(DType::I32)
                && a.is_some_and(|a| {
                    readable(a)
                        && if a == DType::I32 {
                            dst.dtype == DType::I32
                        } else {
                            dst.dtype == DType::F32
                        }
                })
        }
        Op::SetRows => {
            t(1).is_some_and(float)
                && t(2) == Some(DType::I32)
                && (float(dst.dtype) || matches!(dst.dtype, DType::Q8_0 | DType::Q4_0))
        }
        Op::MulMat => {
            a.is_some_and(readable)
                && b.is_some_and(float)
                && dst.dtype == DType::F32
                && dst.is_contiguous()
                && src.iter().all(|l| fits_i32(l))
        }
        Op::MulMatId => {
            a.is_some_and(readable)
                && b.is_some_and(float)
                && t(2) == Some(DType::I32)
                && dst.dtype == DType::F32
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            a.is_some_and(float) && b.is_some_and(float) && float(dst.dtype)
        }
        Op::AddId => {
            a == Some(DType::F32)
                && b == Some(DType::F32)
                && t(2) == Some(DType::I32)
                && dst.dtype == DType::F32
        }
        Op::Scale { .. } | Op::Clamp { .. } | Op::Unary(_) | Op::Glu { .. } => {
            src.iter().all(|l| float(l.dtype)) && !src.is_empty() && float(dst.dtype)
        }
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::SumRows => {
            a.is_some_and(float) && float(dst.dtype)
        }
        Op::Rope(_) => {
            a.is_some_and(float)
                && b == Some(DType::I32)
                && src.get(2).is_none_or(|l| l.dtype == DType::F32)
                && float(dst.dtype)
        }
        Op::SoftMax { .. } => {
            a.is_some_and(float)
                && src.iter().skip(1).all(|l| float(l.dtype))
                && dst.dtype == DType::F32
        }
        Op::FlashAttnExt { .. } => {
            src.len() >= 3
                && float(src[0].dtype)
                && readable(src[1].dtype)
                && readable(src[2].dtype)
                && src[3..].iter().all(|l| float(l.dtype))
                && src[0].ne[0] <= MAX_HEAD
                && src[2].ne[0] <= MAX_HEAD
                && dst.dtype == DType::F32
        }
        Op::Concat { .. } => a.is_some_and(|a| !a.is_quantized() && Some(a) == b && a == dst.dtype),
        Op::Argsort { .. } | Op::TopK { .. } => {
            a.is_some_and(float) && dst.dtype == DType::I32 && src[0].ne[0] <= MAX_SORT
        }
        Op::GatedDeltaNet { .. } => super::delta_net::supports(src, dst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_matches_the_kernel_struct() {
        assert_eq!(std::mem::size_of::<TDesc>(), 80);
        assert_eq!(std::mem::align_of::<TDesc>(), 8);
        let d = TDesc::contiguous(64, DType::Q4_0, [64, 3, 1, 1]).unwrap();
        assert_eq!(d.nb, [18, 36, 108, 108]);
        assert_eq!(d.dtype, 4);
        assert!(TDesc::contiguous(0, DType::Q8K, [256, 1, 1, 1]).is_err());
    }

    #[test]
    fn type_codes_and_limits_match_the_sources() {
        let src = crate::kernels::shared_source();
        for (t, name) in [
            (DType::F32, "T_F32"),
            (DType::F16, "T_F16"),
            (DType::BF16, "T_BF16"),
            (DType::I32, "T_I32"),
            (DType::Q8_0, "T_Q8_0"),
            (DType::Q4K, "T_Q4K"),
            (DType::Q6K, "T_Q6K"),
            (DType::MXFP4, "T_MXFP4"),
            (DType::Q4_0G, "T_Q4_0G"),
            (DType::Q8_0G, "T_Q8_0G"),
        ] {
            let line = format!("#define {name} {}\n", type_code(t).unwrap());
            assert!(src.contains(&line), "{line}");
        }
        assert!(src.contains(&format!("#define FA_MAX_D {MAX_HEAD}\n")));
    }

    #[test]
    fn support_table() {
        let f32l = Layout::contiguous(DType::F32, [8, 2, 1, 1]);
        let q8k = Layout::contiguous(DType::Q8K, [256, 2, 1, 1]);
        let i32l = Layout::contiguous(DType::I32, [8, 2, 1, 1]);
        assert!(supports(&Op::Add, &[&f32l, &f32l], &f32l));
        assert!(!supports(&Op::MulMat, &[&q8k, &f32l], &f32l));
        let sort = Op::Argsort {
            order: ggml_core::SortOrder::Asc,
        };
        assert!(supports(&sort, &[&f32l], &i32l));
        let long = Layout::contiguous(DType::F32, [MAX_SORT + 1, 1, 1, 1]);
        assert!(!supports(&sort, &[&long], &i32l));
    }
}

//! The CUDA kernels: their sources (`cu/*.cu`, one file per op family, compiled together with NVRTC
//! for the device's compute capability and cached per device in [`Kernels`]), the tensor
//! descriptor [`TDesc`] they take, launch helpers, and [`supports`], the op/type table that
//! `supports_op` answers from. [`compute_node`] (in `ops`) runs one graph node.

mod gemm;
mod gemv;
mod matmul;
mod ops;

pub use ops::compute_node;

use crate::err;
use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use ggml_core::{DType, Layout, Op, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The kernel sources, in compilation order (`common.cu` first, `decode.cu` before `gemv.cu`).
pub const SOURCES: [(&str, &str); 9] = [
    ("common.cu", include_str!("cu/common.cu")),
    ("elementwise.cu", include_str!("cu/elementwise.cu")),
    ("norm.cu", include_str!("cu/norm.cu")),
    ("rope.cu", include_str!("cu/rope.cu")),
    ("rows.cu", include_str!("cu/rows.cu")),
    ("sort.cu", include_str!("cu/sort.cu")),
    ("attention.cu", include_str!("cu/attention.cu")),
    ("decode.cu", include_str!("cu/decode.cu")),
    ("gemv.cu", include_str!("cu/gemv.cu")),
];

/// The kernel entry points written out by name (the GEMV and dequantizer families are in
/// [`kernel_names`]).
const NAMED_KERNELS: [&str; 19] = [
    "k_unary",
    "k_binary",
    "k_glu",
    "k_add_id",
    "k_norm",
    "k_sum_rows",
    "k_soft_max",
    "k_rope",
    "k_cpy",
    "k_cpy_q",
    "k_cpy_blocks",
    "k_get_rows",
    "k_set_rows",
    "k_set_rows_q",
    "k_concat",
    "k_argsort",
    "k_flash_attn",
    "k_flash_attn_combine",
    "k_quantize_q8",
];

/// Every kernel entry point.
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = NAMED_KERNELS.iter().map(|s| s.to_string()).collect();
    for t in gemv::WEIGHT_TYPES {
        let tn = type_name(t).expect("GEMV types have kernel names");
        for nc in gemv::COLUMN_VARIANTS {
            names.push(gemv::kernel_name(tn, nc));
        }
        if t.is_quantized() {
            names.push(gemm::dequant_kernel(tn));
        }
    }
    names
}

/// The whole program as one translation unit.
pub fn program_source() -> String {
    let mut s = String::new();
    for (_, src) in SOURCES {
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// PTX of the program per compute capability, compiled once per process (devices of one
/// architecture share it; the driver caches the machine code it makes from it).
static PTX: Mutex<Vec<((i32, i32), String)>> = Mutex::new(Vec::new());

fn ptx_for(cc: (i32, i32)) -> std::result::Result<String, String> {
    let mut cache = PTX.lock();
    if let Some((_, p)) = cache.iter().find(|(c, _)| *c == cc) {
        return Ok(p.clone());
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{}{}", cc.0, cc.1)],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(program_source(), opts)
        .map_err(|e| format!("NVRTC compile failed: {e:?}"))?
        .to_src();
    cache.push((cc, ptx.clone()));
    Ok(ptx)
}

/// The loaded kernels of one device.
pub struct Kernels {
    funcs: HashMap<String, CudaFunction>,
}

impl Kernels {
    /// Compiles the program with NVRTC for compute capability `cc` (once per process) and loads it
    /// into `ctx`.
    pub fn compile(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> std::result::Result<Self, String> {
        crate::probe::guarded("NVRTC", || {
            let ptx = Ptx::from_src(ptx_for(cc)?);
            let module = ctx
                .load_module(ptx)
                .map_err(|e| format!("loading the compiled kernels: {e:?}"))?;
            let mut funcs = HashMap::new();
            for name in kernel_names() {
                let f = module
                    .load_function(&name)
                    .map_err(|e| format!("kernel {name}: {e:?}"))?;
                funcs.insert(name, f);
            }
            Ok(Kernels { funcs })
        })
    }

    pub fn get(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| err(format!("no kernel {name}")))
    }
}

/// A tensor as the kernels see it: device address, shape, byte strides, type code (`T_*` in
/// `common.cu`). Mirrors `struct TD`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TDesc {
    pub ptr: u64,
    pub ne: [i64; 4],
    pub nb: [i64; 4],
    pub dtype: i32,
    pub pad: i32,
}

// SAFETY: a plain `repr(C)` struct of integers with the layout of `struct TD`.
unsafe impl DeviceRepr for TDesc {}

impl TDesc {
    /// The descriptor of `layout` at device address `ptr`.
    pub fn new(ptr: u64, l: &Layout) -> Result<TDesc> {
        let code =
            type_code(l.dtype).ok_or_else(|| err(format!("type {} has no kernel", l.dtype)))?;
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
        _ => return None,
    })
}

/// Threads per block of the element-wise kernels.
pub const THREADS: u32 = 256;

/// A grid of `THREADS`-thread blocks covering `n` elements (grid-stride loops cover the rest).
pub fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` threads per row.
pub fn rows_grid(rows: usize, threads: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// Largest row argsort/top_k sort in shared memory.
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_matches_the_cuda_struct() {
        assert_eq!(std::mem::size_of::<TDesc>(), 80);
        let d = TDesc::contiguous(64, DType::Q4_0, [64, 3, 1, 1]).unwrap();
        assert_eq!(d.nb, [18, 36, 108, 108]);
        assert_eq!(d.dtype, 4);
        assert!(TDesc::contiguous(0, DType::Q8K, [256, 1, 1, 1]).is_err());
    }

    #[test]
    fn program_names_every_kernel() {
        let src = program_source();
        for name in NAMED_KERNELS {
            assert!(
                src.contains(&format!("void {name}(")),
                "kernel {name} missing from the sources"
            );
        }
        // The GEMV and dequantizer families are instantiated by macros, one line per type.
        for t in gemv::WEIGHT_TYPES {
            let tn = type_name(t).unwrap();
            assert!(
                src.contains(&format!("GEMV_KERNELS({tn}, ")),
                "GEMV for {t}"
            );
            if t.is_quantized() {
                assert!(
                    src.contains(&format!("DEQUANT_KERNEL({tn}, ")),
                    "dequantizer for {t}"
                );
            }
        }
    }

    #[test]
    fn nvrtc_compiles_the_program_when_present() {
        // SAFETY: only opens the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: no NVRTC library");
            return;
        }
        let opts = CompileOptions {
            options: vec!["--gpu-architecture=compute_90".into()],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(program_source(), opts);
        assert!(ptx.is_ok(), "{ptx:?}");
    }

    #[test]
    fn support_table() {
        let f32l = Layout::contiguous(DType::F32, [8, 2, 1, 1]);
        let q8k = Layout::contiguous(DType::Q8K, [256, 2, 1, 1]);
        let i32l = Layout::contiguous(DType::I32, [8, 2, 1, 1]);
        assert!(supports(&Op::Add, &[&f32l, &f32l], &f32l));
        assert!(!supports(&Op::MulMat, &[&q8k, &f32l], &f32l));
        assert!(supports(
            &Op::Argsort {
                order: ggml_core::SortOrder::Asc
            },
            &[&f32l],
            &i32l
        ));
    }
}

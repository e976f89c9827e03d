//! Vendor-neutral kernel dispatch, shared by the CUDA and HIP backends (no CUDA type appears here):
//! which kernel computes a graph node, its launch shape and its arguments in the order of the
//! kernel's parameter list, the scratch it needs, and the BLAS calls of wide matrix products.
//! [`compute_nodes`] (with its fusions) and [`compute_node`] drive a [`Runner`], which each backend
//! implements by launching on its stream.

mod attention;
pub(crate) use attention::VEC_KERNELS;
mod delta_net;
mod fuse;
mod fuse_decode;
mod fuse_eltwise;
mod fuse_moe;
mod gemm;
mod gemv;
mod moe;
mod ops;
mod rows;
mod table;

pub use attention::BatchedGemmCall;
pub use fuse::{
    compute_nodes, fusion_counts, fusion_groups, is_skipped, launch_groups, FusionCounts,
};
pub use gemm::{dequant_kernel, GemmCall, GemmTypes};
pub use gemv::{GemvArgs, GemvGroupArgs, COLUMN_VARIANTS, MAX_COLUMNS, MAX_GROUP};
pub use ops::compute_node;
pub use table::{
    supports, type_code, type_name, weight_dtype, TDesc, MAX_BLOCKS, MAX_HEAD, MAX_SORT, THREADS,
};

use ggml_core::{DType, Error, Graph, Layout, Result, TensorId};
use std::borrow::Cow;

/// What a backend provides to run the dispatch on one stream.
pub trait Runner {
    /// The device's name, for errors (`cuda:0`).
    fn device_name(&self) -> String;
    /// The backend family, for errors (`cuda`).
    fn family(&self) -> &'static str;
    /// The descriptor of tensor `id` of `graph` in this device's memory (address checked).
    fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc>;
    /// A device address of at least `bytes` bytes in scratch slot `slot`, valid for work queued on
    /// this stream until the next call for the same slot.
    fn scratch(&self, slot: usize, bytes: usize) -> Result<u64>;
    /// Queues one kernel launch.
    fn launch(&self, launch: &Launch) -> Result<()>;
    /// The operand types [`Runner::gemm`] takes.
    fn gemm_types(&self) -> GemmTypes;
    /// Queues one BLAS matrix product.
    fn gemm(&self, call: &GemmCall) -> Result<()>;
    /// Whether the GPU has the tensor-core products of compute capability 8.0 (`MMA_F16_16816`
    /// and `MMA_I8_16816` of the kernel preludes): prompt attention then takes
    /// `k_flash_attn_mma_*`, grouped expert products `k_moe_mma_*`.
    fn has_mma(&self) -> bool {
        false
    }
    /// Whether [`Runner::gemm_batched`] is available; without it attention runs on kernels only.
    fn has_gemm_batched(&self) -> bool {
        false
    }
    /// Queues one strided batched BLAS product (F16 or F32 operands, F32 accumulation).
    fn gemm_batched(&self, _call: &BatchedGemmCall) -> Result<()> {
        Err(fail(
            self,
            format!(
                "strided batched GEMM is unsupported on {}",
                self.device_name()
            ),
        ))
    }
}

/// A contiguous copy of `src` (of layout `l`) as `dtype` in scratch slot `slot` (`k_cpy`).
fn contiguous_copy(
    r: &dyn Runner,
    src: TDesc,
    l: &Layout,
    dtype: DType,
    slot: usize,
) -> Result<TDesc> {
    let ptr = r.scratch(slot, l.nelements() * dtype.type_size())?;
    let copy = TDesc::contiguous(ptr, dtype, l.ne)?;
    r.launch(&Launch::elementwise(
        "k_cpy",
        l.nelements(),
        args![src, copy],
    ))?;
    Ok(copy)
}

/// An error of the dispatch on `runner`'s backend.
fn fail<R: Runner + ?Sized>(runner: &R, msg: String) -> Error {
    Error::Backend {
        backend: runner.family().into(),
        msg,
    }
}

/// One kernel argument, passed by value.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    Tensor(TDesc),
    I32(i32),
    F32(f32),
    U64(u64),
    Gemv(GemvArgs),
    /// Boxed: it is several times the size of the others.
    GemvGroup(Box<GemvGroupArgs>),
}

macro_rules! kernel_arg_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for KernelArg {
            fn from(v: $t) -> Self {
                KernelArg::$v(v)
            }
        }
    )*};
}
kernel_arg_from!(TDesc => Tensor, i32 => I32, f32 => F32, u64 => U64, GemvArgs => Gemv);

impl KernelArg {
    /// The address of the argument's value, as the vendors' launch calls take each parameter
    /// (valid while `self` lives and is not moved).
    pub fn address(&self) -> *mut std::ffi::c_void {
        let p: *const std::ffi::c_void = match self {
            KernelArg::Tensor(v) => (v as *const TDesc).cast(),
            KernelArg::I32(v) => (v as *const i32).cast(),
            KernelArg::F32(v) => (v as *const f32).cast(),
            KernelArg::U64(v) => (v as *const u64).cast(),
            KernelArg::Gemv(v) => (v as *const GemvArgs).cast(),
            KernelArg::GemvGroup(v) => (v.as_ref() as *const GemvGroupArgs).cast(),
        };
        p.cast_mut()
    }
}

impl From<GemvGroupArgs> for KernelArg {
    fn from(v: GemvGroupArgs) -> Self {
        KernelArg::GemvGroup(Box::new(v))
    }
}

/// The arguments of a launch, from values (a `TDesc`, `i32`, `f32`, `u64` or `GemvArgs` each).
macro_rules! args {
    ($($arg:expr),* $(,)?) => { vec![$($crate::dispatch::KernelArg::from($arg)),*] };
}
use args;

/// One kernel launch: blocks of `threads` threads (one-dimensional) on a grid of up to three axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: Cow<'static, str>,
    pub grid: [u32; 3],
    pub threads: u32,
    pub shared_bytes: u32,
    pub args: Vec<KernelArg>,
}

impl Launch {
    /// Blocks of [`THREADS`] threads covering `n` elements (grid-stride loops cover the rest).
    pub fn elementwise(
        kernel: impl Into<Cow<'static, str>>,
        n: usize,
        args: Vec<KernelArg>,
    ) -> Launch {
        Launch {
            kernel: kernel.into(),
            grid: [
                n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
                1,
                1,
            ],
            threads: THREADS,
            shared_bytes: 0,
            args,
        }
    }

    /// One block of `threads` threads per row (`rows` < 2^31, see [`supports`]).
    pub fn rows(
        kernel: impl Into<Cow<'static, str>>,
        rows: usize,
        threads: u32,
        shared_bytes: u32,
        args: Vec<KernelArg>,
    ) -> Launch {
        Launch {
            kernel: kernel.into(),
            grid: [rows as u32, 1, 1],
            threads,
            shared_bytes,
            args,
        }
    }
}

/// The kernel entry points written out by name (the GEMV, dequantizer and grouped MoE families are in
/// [`kernel_names`]).
pub const NAMED_KERNELS: [&str; 42] = [
    "k_unary",
    "k_unary_rows",
    "k_binary",
    "k_binary_rows",
    "k_glu",
    "k_glu_rows",
    "k_add_id",
    "k_eltwise_chain",
    "k_norm",
    "k_norm_rows",
    "k_norm_row1",
    "k_sum_rows",
    "k_sum_rows_short",
    "k_soft_max",
    "k_rope",
    "k_rope_rows",
    "k_cpy",
    "k_cpy_q",
    "k_cpy_blocks",
    "k_cpy_rows",
    "k_get_rows",
    "k_get_rows_rows",
    "k_set_rows",
    "k_set_rows_rows",
    "k_set_rows_q",
    "k_rope_set_rows",
    "k_concat",
    "k_argsort",
    "k_flash_attn",
    "k_flash_attn_combine",
    "k_attn_softmax",
    "k_flash_attn_mma_d64",
    "k_flash_attn_mma_d128",
    "k_fm_tile_classes",
    "k_quantize_q8",
    "k_f16_from_f32",
    "k_bf16_from_f32",
    "k_hold",
    "k_moe_group",
    "k_moe_weighted_sum",
    "k_moe_router",
    "k_gated_delta_net",
];

/// Every kernel entry point of the program (the list both backends load).
pub fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = NAMED_KERNELS.iter().map(|s| s.to_string()).collect();
    names.extend(VEC_KERNELS.iter().map(|s| s.to_string()));
    for t in DType::WEIGHTS.into_iter().chain(DType::GROUPED) {
        let tn = type_name(t).expect("GEMV types have kernel names");
        for nc in COLUMN_VARIANTS {
            names.push(gemv::kernel_name(tn, nc));
        }
        names.push(gemv::group_kernel_name(tn));
        names.push(gemv::glu_kernel_name(tn));
        if t.is_quantized() {
            names.push(dequant_kernel(tn));
            names.push(moe::grouped_kernel_name(tn, false));
            names.push(moe::grouped_kernel_name(tn, true));
        }
    }
    names
}

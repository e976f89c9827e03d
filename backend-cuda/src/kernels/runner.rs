//! [`Runner`] on a CUDA stream: [`ggml_gpu::dispatch`]'s launches through cudarc, its GEMMs through
//! cuBLAS GemmEx and GemmStridedBatchedEx (F32, F16 and BF16 operands, F32 accumulation, no TF32),
//! descriptors of tensors in this device's buffers.

use crate::memory::CudaBuffer;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::sys;
use ggml_core::backend::check_range;
use ggml_core::Buffer as _;
use ggml_core::{DType, Device, Graph, Result, TensorId};
use ggml_gpu::dispatch::{BatchedGemmCall, GemmCall, GemmTypes, KernelArg, Launch, Runner, TDesc};
use std::ffi::c_void;
use std::ptr::null_mut;

fn operation(transposed: bool) -> blas_sys::cublasOperation_t {
    if transposed {
        blas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas_sys::cublasOperation_t::CUBLAS_OP_N
    }
}

fn cuda_type(t: DType) -> blas_sys::cudaDataType {
    match t {
        DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
        _ => blas_sys::cudaDataType::CUDA_R_32F,
    }
}

impl Runner for CudaBackend {
    fn device_name(&self) -> String {
        self.cuda_device().name()
    }

    fn family(&self) -> &'static str {
        "cuda"
    }

    fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc> {
        let t = graph.tensor(id);
        let data = graph.data(id)?;
        let buf = data
            .buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|b| std::sync::Arc::ptr_eq(b.pool(), self.cuda_device().pool()))
            .ok_or_else(|| {
                err(format!(
                    "tensor {} lives in {}, not in memory of {}",
                    t.name,
                    data.buffer.name(),
                    self.cuda_device().name()
                ))
            })?;
        check_range(data.offset, t.nbytes(), buf.size())?;
        TDesc::new(buf.device_ptr() + data.offset as u64, &t.layout)
    }

    fn scratch(&self, slot: usize, bytes: usize) -> Result<u64> {
        CudaBackend::scratch(self, slot, bytes)
    }

    fn launch(&self, l: &Launch) -> Result<()> {
        let f = self.kernels().get(&l.kernel)?;
        let mut params: Vec<*mut c_void> = l.args.iter().map(KernelArg::address).collect();
        // SAFETY: a zeroed attribute value is a valid union value; the field set is the one the
        // attribute's id names.
        let mut dependent: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        dependent.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        dependent.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: l.grid[0],
            gridDimY: l.grid[1],
            gridDimZ: l.grid[2],
            blockDimX: l.threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: l.shared_bytes,
            hStream: self.stream().cu_stream(),
            attrs: &mut dependent,
            numAttrs: u32::from(self.kernels().dependent_launch),
        };
        // SAFETY: the dispatch passes arguments matching the kernel's parameter list in ggml-gpu's
        // cu/*.cu (a tested property), each by the address of its value, which outlives the call
        // (the driver copies them); every tensor address was checked to lie inside a live buffer
        // of this device or scratch allocated for the launch; a dependent launch's kernel waits
        // for the launch before it at its first instruction (`GRID_DEPENDENCY_SYNC`).
        let r = unsafe {
            sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), null_mut())
        };
        cu(&l.kernel, r.result())
    }

    fn gemm_types(&self) -> GemmTypes {
        GemmTypes::Mixed
    }

    fn gemm(&self, c: &GemmCall) -> Result<()> {
        let handle = self.blas();
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the operands lie in live device memory with the leading dimensions and sizes
        // given (from checked descriptors or scratch allocated by the dispatch); the handle is
        // bound to this backend's stream.
        cu("cublasGemmEx", unsafe {
            blas::gemm_ex(
                handle.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                c.m,
                c.n,
                c.k,
                (&alpha as *const f32).cast(),
                c.a as *const _,
                cuda_type(c.a_type),
                c.lda,
                c.b as *const _,
                cuda_type(c.b_type),
                c.ldb,
                (&beta as *const f32).cast(),
                c.d as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                c.ldd,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }

    fn has_mma(&self) -> bool {
        self.cuda_device().compute_capability().0 >= 8
    }

    fn has_gemm_batched(&self) -> bool {
        true
    }

    fn gemm_batched(&self, c: &BatchedGemmCall) -> Result<()> {
        let handle = self.blas();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let t = cuda_type(c.dtype);
        // SAFETY: every batch of each operand lies in live device memory with the leading
        // dimensions, strides and sizes given (from checked descriptors or scratch allocated by
        // the dispatch); the handle is bound to this backend's stream.
        cu("cublasGemmStridedBatchedEx", unsafe {
            blas::gemm_strided_batched_ex(
                handle.0,
                operation(c.trans_a),
                operation(c.trans_b),
                c.m,
                c.n,
                c.k,
                (&alpha as *const f32).cast(),
                c.a as *const _,
                t,
                c.lda,
                c.stride_a,
                c.b as *const _,
                t,
                c.ldb,
                c.stride_b,
                (&beta as *const f32).cast(),
                c.d as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                c.ldd,
                c.stride_d,
                c.batch,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}

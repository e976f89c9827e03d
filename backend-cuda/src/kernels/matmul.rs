//! mul_mat dispatch: products with at most [`gemv::MAX_COLUMNS`] columns per batch (decode) go to
//! the GEMV kernels, which read weights in their stored format; wider ones (prompt processing) to
//! cuBLAS GemmEx ([`gemm`]).

use super::{gemm, gemv, TDesc};
use crate::err;
use crate::stream::CudaBackend;
use ggml_core::{Layout, Result};

/// `dst[m, n] = dot(a row m, b row n)` per batch, a [K, M, A2, A3], b [K, N, B2, B3].
pub fn mul_mat(
    be: &CudaBackend,
    a: TDesc,
    la: &Layout,
    b: TDesc,
    lb: &Layout,
    d: TDesc,
) -> Result<()> {
    let [_, _, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    if a2 == 0 || a3 == 0 || b2 % a2 != 0 || b3 % a3 != 0 {
        return Err(err(format!("mul_mat batches {:?} x {:?}", la.ne, lb.ne)));
    }
    if n <= gemv::MAX_COLUMNS {
        return gemv::mul_mat_vec(be, a, la, b, lb, d);
    }
    let wa = gemm::weights(be, a, la)?;
    let xb = gemm::activations(be, b, lb, wa.dtype)?;
    gemm::gemm(be, &wa, la.ne, &xb, lb.ne, d.ptr)
}

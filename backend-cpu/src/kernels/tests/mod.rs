//! Unit tests of the kernels against scalar references on small random inputs: odd sizes, permuted
//! (non-contiguous) sources and NaN-poisoned destinations so unwritten bytes show.

mod data_ops;
mod math_ops;

use crate::view::TView;
use ggml_core::quant::{dequantize_row, quantize_row};
use ggml_core::{DType, Layout};
use rand::Rng;

/// A host tensor: owned bytes and a layout into them.
pub struct Host {
    pub bytes: Vec<u8>,
    pub layout: Layout,
}

impl Host {
    pub fn view(&mut self) -> TView {
        TView::new(self.bytes.as_mut_ptr(), self.layout)
    }

    /// A contiguous tensor filled with `vals` (ggml order), converted/quantized to `dtype`.
    pub fn new(dtype: DType, ne: [usize; 4], vals: &[f32]) -> Host {
        let layout = Layout::contiguous(dtype, ne);
        let mut bytes = vec![0u8; layout.nbytes().max(1)];
        let row = layout.row_bytes();
        for (r, chunk) in vals.chunks(ne[0]).enumerate() {
            if dtype == DType::I32 {
                for (i, v) in chunk.iter().enumerate() {
                    bytes[r * row + 4 * i..r * row + 4 * i + 4]
                        .copy_from_slice(&(*v as i32).to_le_bytes());
                }
            } else {
                quantize_row(dtype, chunk, &mut bytes[r * row..(r + 1) * row]).unwrap();
            }
        }
        Host { bytes, layout }
    }

    /// A tensor of logical shape `ne` stored with axes 0 and 1 swapped (non-contiguous rows).
    pub fn transposed(dtype: DType, ne: [usize; 4], vals: &[f32]) -> Host {
        assert!(!dtype.is_quantized());
        let store = Layout::contiguous(dtype, [ne[1], ne[0], ne[2], ne[3]]);
        let mut h = Host {
            bytes: vec![0u8; store.nbytes()],
            layout: Layout {
                dtype,
                ne,
                nb: [store.nb[1], store.nb[0], store.nb[2], store.nb[3]],
            },
        };
        let v = h.view();
        for (e, &x) in vals.iter().enumerate() {
            // SAFETY: in range of the view.
            unsafe { v.set_f32(idx4(e, &ne), x) };
        }
        h
    }

    /// A contiguous destination with every byte 0xFF (NaN for float types).
    pub fn poisoned(dtype: DType, ne: [usize; 4]) -> Host {
        let layout = Layout::contiguous(dtype, ne);
        Host {
            bytes: vec![0xFF; layout.nbytes().max(1)],
            layout,
        }
    }

    /// Logical values in ggml order as f32.
    pub fn values(&mut self) -> Vec<f32> {
        let l = self.layout;
        let v = self.view();
        let mut out = vec![0f32; l.nelements()];
        for (r, chunk) in out.chunks_mut(l.ne[0].max(1)).enumerate() {
            let i = idx4(r * l.ne[0], &l.ne);
            // SAFETY: rows are in range.
            unsafe { crate::kernels::rows::load_row_into(&v, [i[1], i[2], i[3]], chunk).unwrap() };
        }
        out
    }
}

/// (i0, i1, i2, i3) of flat element `e`.
pub fn idx4(e: usize, ne: &[usize; 4]) -> [usize; 4] {
    [
        e % ne[0],
        (e / ne[0]) % ne[1],
        (e / ne[0] / ne[1]) % ne[2],
        e / ne[0] / ne[1] / ne[2],
    ]
}

pub fn rand_vals(n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// What `dtype` storage makes of `vals` (rounding or quantization), rows of `ne0`.
pub fn rounded(dtype: DType, ne0: usize, vals: &[f32]) -> Vec<f32> {
    if dtype == DType::I32 {
        return vals.iter().map(|v| *v as i32 as f32).collect();
    }
    let mut out = vec![0f32; vals.len()];
    let mut q = vec![0u8; dtype.row_size(ne0).unwrap()];
    for (x, o) in vals.chunks(ne0).zip(out.chunks_mut(ne0)) {
        quantize_row(dtype, x, &mut q).unwrap();
        dequantize_row(dtype, &q, o).unwrap();
    }
    out
}

/// Asserts element-wise closeness with a relative-plus-absolute tolerance; NaN never passes.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g == w);
        assert!(ok, "element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// Tolerance of a float result stored in `dtype`.
pub fn tol_of(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// A source in one of the layouts the tests exercise: contiguous or transposed storage.
pub fn source(dtype: DType, ne: [usize; 4], vals: &[f32], transposed: bool) -> Host {
    if transposed {
        Host::transposed(dtype, ne, vals)
    } else {
        Host::new(dtype, ne, vals)
    }
}

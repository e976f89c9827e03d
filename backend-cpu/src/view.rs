//! `TView`: a raw, typed window on a tensor's bytes in host memory (pointer + layout), the argument
//! type of every CPU kernel. Kernels read sources and write the destination through it.

use ggml_core::{DType, Layout};

/// A tensor's host memory: base pointer and layout. Copyable; kernels split work so that no two
/// threads write the same bytes.
#[derive(Clone, Copy, Debug)]
pub struct TView {
    pub ptr: *mut u8,
    pub layout: Layout,
}

// SAFETY: a TView is a plain address; the scheduler guarantees that kernels writing through it do not
// race with other accesses to the same bytes.
unsafe impl Send for TView {}
unsafe impl Sync for TView {}

impl TView {
    pub fn new(ptr: *mut u8, layout: Layout) -> Self {
        TView { ptr, layout }
    }

    /// A view over a host slice holding a contiguous tensor (for tests and benchmarks).
    pub fn of_slice(bytes: &mut [u8], dtype: DType, ne: [usize; 4]) -> Self {
        let layout = Layout::contiguous(dtype, ne);
        assert!(bytes.len() >= layout.nbytes(), "slice too small for tensor");
        TView {
            ptr: bytes.as_mut_ptr(),
            layout,
        }
    }

    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn ne(&self) -> [usize; 4] {
        self.layout.ne
    }
    pub fn nb(&self) -> [usize; 4] {
        self.layout.nb
    }

    /// Address of element (or block holding element) `i`.
    #[inline]
    pub fn at(&self, i: [usize; 4]) -> *mut u8 {
        self.ptr.wrapping_add(self.layout.offset_of(i))
    }

    /// Address of row (i1, i2, i3).
    #[inline]
    pub fn row_ptr(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        self.at([0, i1, i2, i3])
    }

    /// Row (i1, i2, i3) as bytes; valid when rows are contiguous inside.
    ///
    /// # Safety
    /// The view must point to live memory of its layout, and no thread may write this row meanwhile.
    #[inline]
    pub unsafe fn row_bytes(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        std::slice::from_raw_parts(self.row_ptr(i1, i2, i3), self.layout.row_bytes())
    }

    /// Row (i1, i2, i3) of an F32 tensor with contiguous rows.
    ///
    /// # Safety
    /// As for [`TView::row_bytes`], and the dtype must be F32 with `nb[0] == 4`.
    #[inline]
    pub unsafe fn row_f32(&self, i1: usize, i2: usize, i3: usize) -> &[f32] {
        std::slice::from_raw_parts(self.row_ptr(i1, i2, i3) as *const f32, self.layout.ne[0])
    }

    /// Mutable row (i1, i2, i3) of an F32 tensor with contiguous rows.
    ///
    /// # Safety
    /// As for [`TView::row_f32`], and no other thread may access this row meanwhile.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_f32_mut(&self, i1: usize, i2: usize, i3: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.row_ptr(i1, i2, i3) as *mut f32, self.layout.ne[0])
    }

    /// Reads element `i` as f32 (scalar types only).
    ///
    /// # Safety
    /// The view must point to live memory of its layout and `i` must be in range.
    #[inline]
    pub unsafe fn get_f32(&self, i: [usize; 4]) -> f32 {
        let p = self.at(i);
        match self.layout.dtype {
            DType::F32 => (p as *const f32).read_unaligned(),
            DType::F16 => half::f16::from_bits((p as *const u16).read_unaligned()).to_f32(),
            DType::BF16 => half::bf16::from_bits((p as *const u16).read_unaligned()).to_f32(),
            DType::I32 => (p as *const i32).read_unaligned() as f32,
            t => panic!("get_f32 on quantized type {t}"),
        }
    }

    /// Writes element `i` from f32 (scalar types only).
    ///
    /// # Safety
    /// As for [`TView::get_f32`], and no other thread may access this element meanwhile.
    #[inline]
    pub unsafe fn set_f32(&self, i: [usize; 4], v: f32) {
        let p = self.at(i);
        match self.layout.dtype {
            DType::F32 => (p as *mut f32).write_unaligned(v),
            DType::F16 => (p as *mut u16).write_unaligned(half::f16::from_f32(v).to_bits()),
            DType::BF16 => (p as *mut u16).write_unaligned(half::bf16::from_f32(v).to_bits()),
            DType::I32 => (p as *mut i32).write_unaligned(v as i32),
            t => panic!("set_f32 on quantized type {t}"),
        }
    }

    /// Reads I32 element `i`.
    ///
    /// # Safety
    /// As for [`TView::get_f32`]; the dtype must be I32.
    #[inline]
    pub unsafe fn get_i32(&self, i: [usize; 4]) -> i32 {
        (self.at(i) as *const i32).read_unaligned()
    }
}

//! The AVX2 and AVX-512 prompt kernel of Q4_1 / Q5_1 ([`MinPrompt`]): groups of four activation
//! columns, one weight row at a time, each weight block unpacked once per tile instead of once per
//! group of columns ([`prompt_tile`]: chunks of rows unpacked while they stay in L2, each against
//! every group of four columns of the tile), with the generic kernel's steps (their quants are
//! unsigned already; the two-row kernel's sixteen accumulators spill at AVX2). So every result is
//! bit-identical to the generic and decode kernels' (a token's logits must not depend on its
//! batch).

use super::quant::{act_layout, rd16, HalfCvt};
use super::quant_x86::{finish, DotI8, F16c, LegacyX86};
use super::Job;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// Bytes of unpacked weight rows a tile keeps at once.
const CHUNK_BYTES: usize = 64 << 10;

/// The Q8_1 activation columns of a tile for Q4_1 / Q5_1: per column and block, the quants as
/// they are, the scale and the scaled sum.
struct MinColumns {
    y: Vec<__m256i>,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl MinColumns {
    /// The Q8_1 rows `acts` of `nb` blocks.
    #[inline(always)]
    unsafe fn new(acts: &[*const u8], nb: usize) -> Self {
        let (aq, asz) = act_layout(true);
        let n = acts.len() * nb;
        let mut cols = MinColumns {
            y: Vec::with_capacity(n),
            d: Vec::with_capacity(n),
            s: Vec::with_capacity(n),
        };
        // SAFETY: AVX2 enabled by the caller; every row holds `nb` blocks. (Loops, not closures:
        // closures do not inherit the caller's target features.)
        unsafe {
            for &act in acts {
                for i in 0..nb {
                    let a = act.add(i * asz);
                    cols.y.push(_mm256_loadu_si256(a.add(aq) as *const __m256i));
                    cols.d.push(F16c::cvt(rd16(a)));
                    cols.s.push(F16c::cvt(rd16(a.add(2))));
                }
            }
        }
        cols
    }
}

/// A prompt kernel of one weight format: how a weight block is unpacked once for every column
/// group of a tile, and an unpacked row against four columns of the tile.
trait PromptKernel {
    type Block: Clone;
    fn empty() -> Self::Block;
    /// Unpacks block `i` of the weight row at `w` into `out`.
    unsafe fn unpack(&self, w: *const u8, i: usize, out: &mut Self::Block);
    /// The unpacked row `blocks` against the four tile columns from `g`.
    unsafe fn row4(&self, blocks: &[Self::Block], g: usize) -> [f32; 4];
}

/// A legacy prompt kernel's step: block `i` of an unpacked row against block `i` of four columns
/// (`j`: their indices in the tile's column data), into the scaled accumulators `acc` and the min
/// sums `msum`, as the generic kernel's `quant_x86::legacy_step` does.
trait LegacyStep: PromptKernel {
    /// Blocks per row.
    fn nb(&self) -> usize;
    unsafe fn step(
        &self,
        b: &Self::Block,
        j: [usize; 4],
        acc: &mut [__m256; 4],
        msum: &mut [f32; 4],
    );
}

/// The unpacked row `blocks` against the four tile columns from `g` with `k`'s steps: even and odd
/// blocks in separate accumulators, then `quant_x86::finish`, as in the generic kernel (so every
/// result is bit-identical to it).
#[inline(always)]
unsafe fn even_odd_row4<K: LegacyStep>(k: &K, blocks: &[K::Block], g: usize) -> [f32; 4] {
    let nb = k.nb();
    let j0 = [g * nb, (g + 1) * nb, (g + 2) * nb, (g + 3) * nb];
    // SAFETY: AVX2/FMA enabled by the caller; the row and the columns hold `nb` blocks.
    unsafe {
        let mut acc0 = [[_mm256_setzero_ps(); 4]];
        let mut acc1 = [[_mm256_setzero_ps(); 4]];
        let mut msum = [[0f32; 4]];
        let mut i = 0;
        while i + 2 <= nb {
            k.step(
                blocks.get_unchecked(i),
                j0.map(|j| j + i),
                &mut acc0[0],
                &mut msum[0],
            );
            let j1 = j0.map(|j| j + i + 1);
            k.step(blocks.get_unchecked(i + 1), j1, &mut acc1[0], &mut msum[0]);
            i += 2;
        }
        if i < nb {
            k.step(
                blocks.get_unchecked(i),
                j0.map(|j| j + i),
                &mut acc0[0],
                &mut msum[0],
            );
        }
        let [out] = finish(&acc0, &acc1, &msum);
        out
    }
}

/// Block of a Q4_1 / Q5_1 weight row unpacked for every column group of a tile: the unsigned
/// quants, the scale in every lane (see [`RowBlock`]) and the min.
#[derive(Clone, Copy)]
struct MinBlock {
    q: __m256i,
    d: __m256,
    m: f32,
}

/// Q4_1 / Q5_1 against the Q8_1 activations of a tile, with the generic kernel's steps
/// (`quant_x86::legacy_step`): per block and column the unsigned x signed dot, scaled by `d * d_a`
/// into the even or odd accumulator, and `m * s_a` into the column's min sum.
struct MinPrompt<T, D> {
    cols: MinColumns,
    nb: usize,
    kind: PhantomData<(T, D)>,
}

impl<T: LegacyX86, D: DotI8> LegacyStep for MinPrompt<T, D> {
    fn nb(&self) -> usize {
        self.nb
    }
    #[inline(always)]
    unsafe fn step(&self, b: &MinBlock, j: [usize; 4], acc: &mut [__m256; 4], msum: &mut [f32; 4]) {
        // SAFETY: AVX2/FMA enabled by the caller; `j` indexes the columns.
        unsafe {
            for c in 0..4 {
                let s = D::dot_us(b.q, *self.cols.y.get_unchecked(j[c]));
                let scale = _mm256_mul_ps(b.d, _mm256_set1_ps(*self.cols.d.get_unchecked(j[c])));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[c]);
                msum[c] += b.m * *self.cols.s.get_unchecked(j[c]);
            }
        }
    }
}

impl<T: LegacyX86, D: DotI8> PromptKernel for MinPrompt<T, D> {
    type Block = MinBlock;
    fn empty() -> MinBlock {
        // SAFETY: vectors of plain integers and floats, for which zero bits are valid.
        unsafe { std::mem::zeroed() }
    }
    #[inline(always)]
    unsafe fn unpack(&self, w: *const u8, i: usize, out: &mut MinBlock) {
        // SAFETY: AVX2 enabled by the caller; block `i` exists in the row.
        unsafe {
            let p = w.add(i * T::SIZE);
            let (d, m) = T::dm::<F16c>(p);
            *out = MinBlock {
                q: T::unpack_x86(p),
                d: _mm256_set1_ps(d),
                m,
            };
        }
    }
    #[inline(always)]
    unsafe fn row4(&self, blocks: &[MinBlock], g: usize) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { even_odd_row4(self, blocks, g) }
    }
}

/// `rows` x `cols` (a multiple of four columns) of a job with `nb` blocks per weight row: chunks
/// of rows unpacked by `kern` (at most [`CHUNK_BYTES`]), each against every group of four columns.
#[inline(always)]
unsafe fn prompt_tile<K: PromptKernel>(
    kern: &K,
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    debug_assert!(cols.len().is_multiple_of(4));
    let chunk = (CHUNK_BYTES / (nb * size_of::<K::Block>())).clamp(1, rows.len().max(1));
    // Written in place, not pushed: a push's possible reallocation made LLVM spill the vectors.
    let mut blocks = vec![K::empty(); chunk * nb];
    // SAFETY: the job's pointers are valid for `rows` x `cols` and these destination elements are
    // written by this thread only (caller).
    unsafe {
        for r0 in rows.clone().step_by(chunk) {
            let r1 = (r0 + chunk).min(rows.end);
            for (row, m) in blocks.chunks_exact_mut(nb).zip(r0..r1) {
                let w = job.w.add(m * job.w_stride);
                for (i, b) in row.iter_mut().enumerate() {
                    kern.unpack(w, i, b);
                }
            }
            for g in (0..cols.len()).step_by(4) {
                for m in r0..r1 {
                    let out = kern.row4(&blocks[(m - r0) * nb..(m - r0 + 1) * nb], g);
                    for (c, v) in out.into_iter().enumerate() {
                        *job.dsts[cols.start + g + c].add(m) = v;
                    }
                }
            }
        }
    }
}

/// Q4_1 / Q5_1 weights `T` of `nb` blocks per row: `rows` x `cols` (a multiple of four columns).
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C enabled in the caller.
#[inline(always)]
pub(super) unsafe fn min_prompt_rows<T: LegacyX86, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let kern = MinPrompt::<T, D> {
            cols: MinColumns::new(&job.acts[cols.clone()], nb),
            nb,
            kind: PhantomData,
        };
        prompt_tile(&kern, job, nb, rows, cols);
    }
}

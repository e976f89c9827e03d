//! The AVX2 prompt kernels of Q4_0 / Q5_0 and of the K-quants (at AVX-512 they take the eight-row
//! kernels of `quant_rows8_avx512.rs` / `quant_rows8_k_avx512.rs`, which reuse [`KUnpacked`]; the
//! numbers that follow are of these kernels at AVX-512 before those, where the unsigned x signed
//! dot was one `vpdpbusd`; measured on a 2-core EPYC guest, criterion GEMM at the
//! AVX-512 level against its two-row kernels: Q5_0 141 -> 201 Gelem/s, Q4_0 179 -> 204, Q4_K 166 ->
//! 196, Q6_K 177 -> 199): groups of four activation columns, one weight row at a time, each weight block unpacked once per tile instead of once per
//! group of columns ([`prompt_tile`]: chunks of rows unpacked while they stay in L2, each against
//! every group of four columns of the tile).
//!
//! Q4_0 / Q5_0 ([`LegacyPrompt`]): the two-row prompt kernels (`quant_x86::legacy_2x4`,
//! `quant_avx512::legacy_2x4`) unpack a weight block once per group of four columns, and at AVX2
//! pay two `vpsignb` per block and column for the signed x signed dot and keep sixteen
//! accumulators, which spill. Here the activations
//! are made unsigned (`y + 128`) and their scales converted once per tile ([`Columns`]), and the
//! weights unpacked with the excess `128 * sum(q)` in the lanes of [`DotI8::dot_us`] ([`RowBlock`]).
//! Per block and column the kernel is then `dot_us(y + 128, q) - 128 * sum(q)`, which is the signed
//! dot's lanes exactly (no pair saturates 16 bits: `2 * 255 * 16 < 2^15`), and the generic kernel's
//! float steps (the scale `d * d_a` lane by lane, one FMA into the even or odd accumulator), with
//! eight accumulators live.
//!
//! Q4_1 / Q5_1 ([`MinPrompt`]): the generic kernel's steps (their quants are unsigned already)
//! on blocks unpacked once per tile, one row against four columns (the two-row kernel's sixteen
//! accumulators spill at AVX2).
//!
//! K-quants ([`KQuantPrompt`]): the one-column kernel's steps on the unpacked super-blocks
//! ([`KUnpacked`]: quants, scale vectors, min terms), whose unpacking (scales decoded one by one)
//! cost as much as the dot products when done for every group of four columns.
//!
//! So every result is bit-identical to the generic and decode kernels' (a token's logits must not
//! depend on its batch).

use super::quant::{act_layout, rd16, HalfCvt};
use super::quant::{KBlock, Q8K_BSUMS, Q8K_QS, Q8K_SIZE};
use super::quant_offset_x86::SmallOffset;
use super::quant_x86::{finish, hsums, kquant_accumulate, DotI8, F16c, KQuantX86, LegacyX86};
use super::Job;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// Bytes of unpacked weight rows a tile keeps at once.
const CHUNK_BYTES: usize = 64 << 10;

/// The activation columns of a tile, made unsigned: per column and block, `y + 128` and the scale.
struct Columns {
    y: Vec<__m256i>,
    d: Vec<f32>,
}

impl Columns {
    /// The Q8_0 rows `acts` of `nb` blocks.
    #[inline(always)]
    unsafe fn new(acts: &[*const u8], nb: usize) -> Self {
        let (aq, asz) = act_layout(false);
        let mut cols = Columns {
            y: Vec::with_capacity(acts.len() * nb),
            d: Vec::with_capacity(acts.len() * nb),
        };
        // SAFETY: AVX2 enabled by the caller; every row holds `nb` blocks. (Loops, not closures:
        // closures do not inherit the caller's target features.)
        unsafe {
            let bias = _mm256_set1_epi8(-128);
            for &act in acts {
                for i in 0..nb {
                    let a = act.add(i * asz);
                    let y = _mm256_loadu_si256(a.add(aq) as *const __m256i);
                    cols.y.push(_mm256_xor_si256(y, bias));
                    cols.d.push(F16c::cvt(rd16(a)));
                }
            }
        }
        cols
    }
}

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

/// A K-quant super-block unpacked ([`KBlock`]) with what every column reads of it as vectors: the
/// per-16 scales (`scv`, lanes of `vpmaddwd`) and the min terms (`mn`); the one-column kernel
/// (`quant_x86::kquant`) unpacks into one as well.
#[derive(Clone)]
pub(super) struct KUnpacked {
    kb: KBlock,
    scv: [__m256i; 8],
    mn: __m256i,
}

impl KUnpacked {
    pub(super) fn new() -> Self {
        KUnpacked {
            kb: KBlock::new(),
            // SAFETY: vectors of plain integers, for which zero bits are valid.
            scv: unsafe { std::mem::zeroed() },
            mn: unsafe { std::mem::zeroed() },
        }
    }

    /// Replaces the block by the super-block `T` at `p`.
    #[inline(always)]
    pub(super) unsafe fn fill<T: KQuantX86>(&mut self, p: *const u8) {
        // SAFETY: AVX2 enabled by the caller, who passes a whole block.
        unsafe {
            T::unpack_x86(p, &mut self.kb);
            self.mn = _mm256_loadu_si256(self.kb.mn.as_ptr() as *const __m256i);
            for (v, s) in self.scv.iter_mut().enumerate() {
                *s = _mm256_set_m128i(
                    _mm_set1_epi16(self.kb.sc[2 * v + 1]),
                    _mm_set1_epi16(self.kb.sc[2 * v]),
                );
            }
        }
    }

    /// The block against super-block `i` of `C` Q8_K rows, into their scaled f32 lanes `acc`.
    #[inline(always)]
    pub(super) unsafe fn dot<const C: usize>(
        &self,
        acts: &[*const u8; C],
        i: usize,
        acc: &mut [__m256; C],
    ) {
        // SAFETY: AVX2/FMA enabled by the caller; super-block `i` exists in every row.
        unsafe {
            for c in 0..C {
                let a = acts[c].add(i * Q8K_SIZE);
                let (isum, msum) = (self.int_sums(a), self.min_sums(a));
                acc[c] = kquant_accumulate(acc[c], isum, msum, &self.kb, a);
            }
        }
    }

    /// The block's scaled integer dots against the Q8_K block at `a`, in eight i32 lanes (lane
    /// `l`: quants `4 l .. 4 l + 4` of every 32, times their scales).
    #[inline(always)]
    pub(super) unsafe fn int_sums(&self, a: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `a` points to a whole Q8_K block.
        unsafe {
            let mut isum = _mm256_setzero_si256();
            for (v, sc) in self.scv.iter().enumerate() {
                let q = _mm256_loadu_si256(self.kb.q.as_ptr().add(32 * v) as *const __m256i);
                let y = _mm256_loadu_si256(a.add(Q8K_QS + 32 * v) as *const __m256i);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), *sc));
            }
            isum
        }
    }

    /// The block's min terms against the Q8_K block at `a` (its block sums), in eight i32 lanes.
    #[inline(always)]
    pub(super) unsafe fn min_sums(&self, a: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `a` points to a whole Q8_K block.
        unsafe {
            let bs = _mm256_loadu_si256(a.add(Q8K_BSUMS) as *const __m256i);
            _mm256_madd_epi16(bs, self.mn)
        }
    }

    /// The unpacked block.
    pub(super) fn block(&self) -> &KBlock {
        &self.kb
    }
}

/// Block of a weight row unpacked for every column group of a tile: the signed quants, `128` times
/// their sums in the lanes of [`DotI8::dot_us`], and the scale in every lane (a vector, so that LLVM
/// does not turn the product of two broadcasts into a scalar product and a broadcast: one
/// instruction more per block and column).
#[derive(Clone, Copy)]
struct RowBlock {
    q: __m256i,
    excess: __m256i,
    d: __m256,
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

/// Q4_0 / Q5_0 against the unsigned activations of a tile.
struct LegacyPrompt<T, D> {
    cols: Columns,
    nb: usize,
    kind: PhantomData<(T, D)>,
}

impl<T: SmallOffset, D: DotI8> LegacyStep for LegacyPrompt<T, D> {
    fn nb(&self) -> usize {
        self.nb
    }
    /// The min sums stay zero (Q4_0 / Q5_0 carry their offset in the integer dot).
    #[inline(always)]
    unsafe fn step(&self, b: &RowBlock, j: [usize; 4], acc: &mut [__m256; 4], _: &mut [f32; 4]) {
        // SAFETY: AVX2/FMA enabled by the caller; `j` indexes the columns.
        unsafe {
            for c in 0..4 {
                let y = *self.cols.y.get_unchecked(j[c]);
                let s = _mm256_sub_epi32(D::dot_us(y, b.q), b.excess);
                // The same product as the generic kernel's scalar `d * d_a`, lane by lane.
                let scale = _mm256_mul_ps(b.d, _mm256_set1_ps(*self.cols.d.get_unchecked(j[c])));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[c]);
            }
        }
    }
}

impl<T: SmallOffset, D: DotI8> PromptKernel for LegacyPrompt<T, D> {
    type Block = RowBlock;
    fn empty() -> RowBlock {
        // SAFETY: vectors of plain integers and floats, for which zero bits are valid.
        unsafe { std::mem::zeroed() }
    }
    #[inline(always)]
    unsafe fn unpack(&self, w: *const u8, i: usize, out: &mut RowBlock) {
        // SAFETY: AVX2 enabled by the caller; block `i` exists in the row.
        unsafe {
            let p = w.add(i * T::SIZE);
            let q = T::unpack_x86(p);
            *out = RowBlock {
                q,
                excess: D::dot_us(_mm256_set1_epi8(-128), q),
                d: _mm256_set1_ps(T::dm::<F16c>(p).0),
            };
        }
    }
    #[inline(always)]
    unsafe fn row4(&self, blocks: &[RowBlock], g: usize) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { even_odd_row4(self, blocks, g) }
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

/// K-quants against the Q8_K rows of a tile, with the one-column kernel's steps ([`KUnpacked`]).
struct KQuantPrompt<'a, T> {
    acts: &'a [*const u8],
    kind: PhantomData<T>,
}

impl<T: KQuantX86> PromptKernel for KQuantPrompt<'_, T> {
    type Block = KUnpacked;
    fn empty() -> KUnpacked {
        KUnpacked::new()
    }
    #[inline(always)]
    unsafe fn unpack(&self, w: *const u8, i: usize, out: &mut KUnpacked) {
        // SAFETY: AVX2 enabled by the caller; super-block `i` exists in the row.
        unsafe { out.fill::<T>(w.add(i * T::SIZE)) }
    }
    #[inline(always)]
    unsafe fn row4(&self, blocks: &[KUnpacked], g: usize) -> [f32; 4] {
        let acts = [
            self.acts[g],
            self.acts[g + 1],
            self.acts[g + 2],
            self.acts[g + 3],
        ];
        // SAFETY: AVX2/FMA enabled by the caller; the row and the columns hold `blocks.len()`
        // super-blocks.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (i, b) in blocks.iter().enumerate() {
                b.dot::<4>(&acts, i, &mut acc);
            }
            hsums(acc)
        }
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

/// Q4_0 / Q5_0 weights `T` of `nb` blocks per row: `rows` x `cols` (a multiple of four columns).
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C enabled in the caller.
#[inline(always)]
pub(super) unsafe fn prompt_rows<T: SmallOffset, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let kern = LegacyPrompt::<T, D> {
            cols: Columns::new(&job.acts[cols.clone()], nb),
            nb,
            kind: PhantomData,
        };
        prompt_tile(&kern, job, nb, rows, cols);
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

/// K-quant weights `T` of `nb` super-blocks per row: `rows` x `cols` (a multiple of four columns).
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C enabled in the caller.
#[inline(always)]
pub(super) unsafe fn kquant_prompt_rows<T: KQuantX86>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let kern = KQuantPrompt::<T> {
        acts: &job.acts[cols.clone()],
        kind: PhantomData,
    };
    // SAFETY: forwarded from the caller.
    unsafe { prompt_tile(&kern, job, nb, rows, cols) }
}

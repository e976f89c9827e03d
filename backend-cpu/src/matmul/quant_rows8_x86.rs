//! The eight-row kernels of Q4_0 / Q5_0 at both x86 levels, prompt and decode: eight weight rows
//! side by side in the eight lanes of a vector, each lane a row's whole-block integer dot; and the
//! drivers of such eight-row kernels ([`Rows8`]: [`prompt_tile`], [`decode_tile`]), which the
//! K-quants' (`quant_rows8_k_x86.rs`) share. What differs between the levels is [`Level8`]: the
//! quad dot products (AVX-512 VNNI `vpdpbusd`; AVX2 `vpmaddubsw` of four quads summed in i16, then
//! one `vpmaddwd`), the half-precision scales and the partial stores.
//!
//! The one-row x86 kernels keep per block eight partial sums per (row, column) and pay three float
//! steps for them (convert, scale, FMA) per 32 products. Here a block of eight rows is interleaved
//! ([`GroupBlock`]: vector `k` holds quants `4 k .. 4 k + 4` of every row, made unsigned by
//! [`Level8::unpack_u`]), so eight quad dots against the column's four-quant groups (broadcast
//! from the activation row) give the eight rows' block dots at once, starting from minus `OFFSET`
//! times the activation block's sum ([`ActTerms`]), and the float steps are paid once per eight
//! rows (criterion GEMM 4864x512x896 on one core of a 2-core EPYC guest: Q5_0 at AVX-512 105 ->
//! 235 Gelem/s). The prompt kernel ([`prompt_tile`]) interleaves chunks of rows once per tile and
//! takes them against four columns at a time; the decode kernel ([`LegacyRows8::decode_group`])
//! dots each row's block against the column and sums the eight rows' lanes with a transposing add
//! tree ([`Level8::row_dots`]: at AVX2 in i16 before one widening per four rows), which gives the
//! same integers. (The K-quants' decode at AVX2 streams one
//! row at a time instead: [`Level8::K_DECODE_ROWS8`], [`Rows8::decode_column`].)
//!
//! The float steps are the portable kernel's (`quant::legacy_scalar`): per block
//! `sum += s as f32 * (d * d_a)`, no FMA. So every result is bit-identical whichever kernel,
//! level, tile or batch computed it (a token's logits must not depend on its batch), and equal to
//! the scalar level's. Rows past the end of a tile repeat its last row; their lanes are not stored.

use super::quant::{act_layout, rd, rd16, HalfCvt};
use super::quant_offset_x86::SmallOffset;
use super::quant_x86::{Avx2Dot, DotI8, F16c, VnniDot};
use super::Job;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// Rows per group: the lanes of a `__m256i` of i32.
pub(super) const ROWS: usize = 8;

/// The largest span of a group of rows that [`Group::prefetch_next`] prefetches into L1 (half of
/// a 32 KiB L1).
const L1_SPAN: usize = 16 << 10;

/// Bytes of interleaved weight blocks a prompt tile keeps at once.
const CHUNK_BYTES: usize = 64 << 10;

/// What the eight-row kernels do differently at the two x86 levels (`Avx2Dot`: AVX2/FMA/F16C;
/// `VnniDot`: AVX-512 F/BW/VL/VNNI as well, enabled by every caller of its methods).
pub(super) trait Level8: DotI8 {
    /// Whether the K-quants' single columns (decode) take the eight-row kernel
    /// ([`Rows8::decode_group`]) or stream one weight row at a time (`KRows8::decode_row`).
    const K_DECODE_ROWS8: bool;
    /// `acc` plus, per i32 lane, the dot products of the unsigned quads `q[k]` with the signed quads
    /// `y[k]`, where each pair of byte products summed over the four `k` fits in i16 (unsigned
    /// bytes below 32 against 8-bit activations).
    unsafe fn quad_dots(acc: __m256i, q: [__m256i; 4], y: [__m256i; 4]) -> __m256i;
    /// The quants of the `T` block at `p` plus `OFFSET`, as unsigned bytes.
    unsafe fn unpack_u<T: SmallOffset>(p: *const u8) -> __m256i;
    /// The half-precision numbers in the low 16 bits of the i32 lanes of `h`, as f32 (exact).
    unsafe fn halves(h: __m256i) -> __m256;
    /// Stores the first `n` (1..=8) lanes of `v` at `dst`.
    unsafe fn store(dst: *mut f32, n: usize, v: __m256);
    /// The per-16 scales of eight rows (i32 lanes) as [`Level8::k_group`] takes them.
    unsafe fn k_scales(sc: __m256i) -> __m256i;
    /// Per i32 lane, `sc` (from [`Level8::k_scales`]) times the dot products of the unsigned
    /// quads `q[k]` (bytes below 64) with the signed quads `y[k]`; `i16_quads`: how many of the
    /// four quads' byte-pair products sum in i16 without overflow (4 or 2, `KQuantX86::I16_QUADS`).
    unsafe fn k_group(q: [__m256i; 4], y: [__m256i; 4], sc: __m256i, i16_quads: usize) -> __m256i;
    /// `acc` plus, per i32 lane, the products of the i16 pairs of `x` and `y` summed.
    unsafe fn pair_dots(acc: __m256i, x: __m256i, y: __m256i) -> __m256i;
    /// Lane `r`: the dot product of the 32 unsigned quants `q[r]` (bytes below 32) with the 32
    /// signed bytes `y` (a decode group's eight block dots).
    unsafe fn row_dots(q: [__m256i; ROWS], y: __m256i) -> __m256i;
}

// SAFETY (every `unsafe` block of this impl): AVX2/FMA/F16C are enabled by the caller.
impl Level8 for Avx2Dot {
    /// One row at a time: the eight rows' streams, prefetched a group ahead into L2 (the
    /// K-quants' groups outgrow L1), left the AVX2 kernel waiting on its loads (Q4_K / Q6_K GEMV
    /// 4096x4096 and 14336x4096 on a 2-core Zen 3 guest: 10-12.6 GiB/s instead of 16-22).
    const K_DECODE_ROWS8: bool = false;
    #[inline(always)]
    unsafe fn quad_dots(acc: __m256i, q: [__m256i; 4], y: [__m256i; 4]) -> __m256i {
        unsafe {
            let mut t = _mm256_maddubs_epi16(q[0], y[0]);
            for k in 1..4 {
                t = _mm256_add_epi16(t, _mm256_maddubs_epi16(q[k], y[k]));
            }
            _mm256_add_epi32(acc, _mm256_madd_epi16(t, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn unpack_u<T: SmallOffset>(p: *const u8) -> __m256i {
        unsafe { T::unpack_u(p) }
    }
    #[inline(always)]
    unsafe fn halves(h: __m256i) -> __m256 {
        unsafe {
            let h = _mm256_and_si256(h, _mm256_set1_epi32(0xFFFF));
            // Per 128-bit half: its four halves twice; then the two halves' first fours joined.
            let p = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(h, h));
            _mm256_cvtph_ps(_mm256_castsi256_si128(p))
        }
    }
    #[inline(always)]
    unsafe fn store(dst: *mut f32, n: usize, v: __m256) {
        unsafe {
            if n == ROWS {
                _mm256_storeu_ps(dst, v);
            } else {
                let mut lanes = [0f32; ROWS];
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, n);
            }
        }
    }
    /// Each scale in both i16 halves of its lane, the pair `vpmaddwd` multiplies by.
    #[inline(always)]
    unsafe fn k_scales(sc: __m256i) -> __m256i {
        unsafe { _mm256_blend_epi16::<0xAA>(sc, _mm256_slli_epi32::<16>(sc)) }
    }
    #[inline(always)]
    unsafe fn k_group(q: [__m256i; 4], y: [__m256i; 4], sc: __m256i, i16_quads: usize) -> __m256i {
        unsafe {
            let p: [__m256i; 4] = [
                _mm256_maddubs_epi16(q[0], y[0]),
                _mm256_maddubs_epi16(q[1], y[1]),
                _mm256_maddubs_epi16(q[2], y[2]),
                _mm256_maddubs_epi16(q[3], y[3]),
            ];
            let (a, b) = (_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
            if i16_quads == 4 {
                _mm256_madd_epi16(_mm256_add_epi16(a, b), sc)
            } else {
                _mm256_add_epi32(_mm256_madd_epi16(a, sc), _mm256_madd_epi16(b, sc))
            }
        }
    }
    #[inline(always)]
    unsafe fn pair_dots(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(x, y)) }
    }
    /// The rows' `vpmaddubsw` pair sums added in i16 by two levels of `vphaddw` (eight products
    /// per i16 lane: `8 * 31 * 127 < 2^15`), then widened by one `vpmaddwd` per four rows: per
    /// 128-bit half `[r0, r1, r2, r3]` and `[r4, r5, r6, r7]`, whose halves one add joins.
    #[inline(always)]
    unsafe fn row_dots(q: [__m256i; ROWS], y: __m256i) -> __m256i {
        unsafe {
            let mut p = [_mm256_setzero_si256(); ROWS];
            for r in 0..ROWS {
                p[r] = _mm256_maddubs_epi16(q[r], y);
            }
            let h = [
                _mm256_hadd_epi16(p[0], p[1]),
                _mm256_hadd_epi16(p[2], p[3]),
                _mm256_hadd_epi16(p[4], p[5]),
                _mm256_hadd_epi16(p[6], p[7]),
            ];
            let ones = _mm256_set1_epi16(1);
            let lo = _mm256_madd_epi16(_mm256_hadd_epi16(h[0], h[1]), ones);
            let hi = _mm256_madd_epi16(_mm256_hadd_epi16(h[2], h[3]), ones);
            _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(lo, hi),
                _mm256_permute2x128_si256::<0x31>(lo, hi),
            )
        }
    }
}

// SAFETY (every `unsafe` block of this impl): AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI are enabled
// by the caller.
impl Level8 for VnniDot {
    const K_DECODE_ROWS8: bool = true;
    #[inline(always)]
    unsafe fn quad_dots(acc: __m256i, q: [__m256i; 4], y: [__m256i; 4]) -> __m256i {
        let mut acc = acc;
        for k in 0..4 {
            acc = unsafe { _mm256_dpbusd_epi32(acc, q[k], y[k]) };
        }
        acc
    }
    #[inline(always)]
    unsafe fn unpack_u<T: SmallOffset>(p: *const u8) -> __m256i {
        unsafe { T::unpack_u_avx512(p) }
    }
    #[inline(always)]
    unsafe fn halves(h: __m256i) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm256_cvtepi32_epi16(h)) }
    }
    #[inline(always)]
    unsafe fn store(dst: *mut f32, n: usize, v: __m256) {
        let mask = (1u32 << n) - 1;
        unsafe { _mm256_mask_storeu_ps(dst, mask as u8, v) }
    }
    #[inline(always)]
    unsafe fn k_scales(sc: __m256i) -> __m256i {
        sc
    }
    #[inline(always)]
    unsafe fn k_group(q: [__m256i; 4], y: [__m256i; 4], sc: __m256i, _: usize) -> __m256i {
        unsafe {
            let t = Self::quad_dots(_mm256_setzero_si256(), q, y);
            _mm256_mullo_epi32(t, sc)
        }
    }
    #[inline(always)]
    unsafe fn pair_dots(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        unsafe { _mm256_dpwssd_epi32(acc, x, y) }
    }
    #[inline(always)]
    unsafe fn row_dots(q: [__m256i; ROWS], y: __m256i) -> __m256i {
        unsafe {
            let mut v = [_mm256_setzero_si256(); ROWS];
            for r in 0..ROWS {
                v[r] = Self::dot_us(q[r], y);
            }
            row_sums(v)
        }
    }
}

/// Block `i` of a group of eight weight rows: vector `k` holds the unsigned quants `4 k .. 4 k +
/// 4` of row `r` in its i32 lane `r`, and `d` the rows' scales.
#[derive(Clone, Copy)]
struct GroupBlock {
    q: [__m256i; 8],
    d: __m256,
}

/// Per activation column and block: minus `OFFSET` times the block's quant sum, and its scale.
struct ActTerms {
    excess: Vec<i32>,
    da: Vec<f32>,
    nb: usize,
}

/// The [`ActTerms`] of one column.
#[derive(Clone, Copy)]
struct Terms<'a> {
    excess: &'a [i32],
    da: &'a [f32],
}

impl ActTerms {
    /// The terms of the Q8_0 rows `acts` of `nb` blocks against quants offset by `T::OFFSET`.
    fn new<T: SmallOffset>(acts: &[*const u8], nb: usize) -> Self {
        let (aq, asz) = act_layout(false);
        let mut terms = ActTerms {
            excess: vec![0; acts.len() * nb],
            da: vec![0.0; acts.len() * nb],
            nb,
        };
        for (c, &act) in acts.iter().enumerate() {
            for i in 0..nb {
                // SAFETY: every activation row holds `nb` Q8_0 blocks (caller).
                let (y, d) = unsafe {
                    let a = act.add(i * asz);
                    (rd::<32>(a.add(aq)), F16c::cvt(rd16(a)))
                };
                let sum: i32 = y.iter().map(|&v| i32::from(v as i8)).sum();
                terms.excess[c * nb + i] = -i32::from(T::OFFSET) * sum;
                terms.da[c * nb + i] = d;
            }
        }
        terms
    }

    /// The terms of column `c` (index into the `acts` of [`ActTerms::new`]).
    fn column(&self, c: usize) -> Terms<'_> {
        let r = c * self.nb..(c + 1) * self.nb;
        Terms {
            excess: &self.excess[r.clone()],
            da: &self.da[r],
        }
    }
}

/// The i32 at `p` in every lane.
#[inline(always)]
pub(super) unsafe fn bcast(p: *const u8) -> __m256i {
    // SAFETY: AVX enabled by the caller; four readable bytes.
    unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
}

/// `acc + s as f32 * (d * d_a)` lane by lane: the portable kernel's float steps.
#[inline(always)]
unsafe fn accumulate(acc: __m256, s: __m256i, d: __m256, da: f32) -> __m256 {
    // SAFETY: AVX enabled by the caller.
    unsafe {
        let scale = _mm256_mul_ps(d, _mm256_set1_ps(da));
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s), scale))
    }
}

/// The results `v` of row group `g` of `rows` against column `c` of the job.
#[inline(always)]
unsafe fn store_group<L: Level8>(job: &Job, rows: &Range<usize>, g: usize, c: usize, v: __m256) {
    let m0 = rows.start + ROWS * g;
    // SAFETY: the level's features are enabled by the caller; the group's rows of column `c` are
    // the caller's to write.
    unsafe { L::store(job.dsts[c].add(m0), (rows.end - m0).min(ROWS), v) }
}

/// The eight weight rows of a group from `m0`, the last row of the tile repeated past its end.
pub(super) struct Group {
    pub(super) w: [*const u8; ROWS],
    /// Bytes from a row to the next.
    stride: usize,
    /// Byte offsets of the rows from the first (lanes of a gather).
    offsets: __m256i,
    /// Bytes of the next group that [`Group::prefetch_next`] prefetches per block.
    share: usize,
}

impl Group {
    /// The group from row `m0` of the tile `rows` of rows of `nb` blocks.
    #[inline(always)]
    unsafe fn new(job: &Job, m0: usize, rows: &Range<usize>, nb: usize) -> Self {
        let mut w = [job.w; ROWS];
        let mut offsets = [0i32; ROWS];
        for r in 0..ROWS {
            let dm = (m0 + r).min(rows.end - 1) - m0;
            // SAFETY: the row lies in the job's weights (caller), whose group spans fit in i32.
            w[r] = unsafe { job.w.add((m0 + dm) * job.w_stride) };
            offsets[r] = (dm * job.w_stride) as i32;
        }
        // SAFETY: AVX enabled by the caller.
        let offsets = unsafe { _mm256_loadu_si256(offsets.as_ptr() as *const __m256i) };
        Group {
            w,
            stride: job.w_stride,
            offsets,
            share: (ROWS * job.w_stride).div_ceil(nb.max(1)),
        }
    }

    /// Prefetches share `i` ([`Group::share`] bytes) of the next group's rows (one contiguous
    /// span), in address order, without a division per block (the integer divisions a block were
    /// the bottleneck of the Q4_0 / Q5_0 decode loops at AVX2: 47-60 cycles per block of eight
    /// rows on Zen 3 by `llvm-mca`, 15-16 (Q4_0) and 24-25 (Q5_0) without them). The decode
    /// kernels read a group's eight rows side by side, eight interleaved streams that the hardware
    /// prefetcher serves poorly (Qwen2.5-0.5B Q5_0 tg at AVX-512 on a 2-core EPYC guest:
    /// prefetching each row's blocks in the next group instead was 5-10% slower than the one-row
    /// kernels, `quant_x86::prefetch_ahead`'s fixed distance, which lands inside the group,
    /// 20-25%). Spans over [`L1_SPAN`] (the K-quants' long rows) go to L2: into L1 they evicted
    /// the group in hand (Q4_K / Q6_K GEMV 14336x4096 on one core: 8 GiB/s instead of 12-13).
    #[inline(always)]
    pub(super) unsafe fn prefetch_next(&self, i: usize) {
        let span = ROWS * self.stride;
        let next = self.w[0].wrapping_add(span);
        let mut off = i * self.share;
        while off < (i + 1) * self.share + 64 {
            let p = next.wrapping_add(off) as *const i8;
            // SAFETY: SSE is part of x86-64; a prefetch never faults.
            unsafe {
                if span <= L1_SPAN {
                    _mm_prefetch::<_MM_HINT_T0>(p);
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(p);
                }
            }
            off += 64;
        }
    }

    /// The scales of block `i` of the rows (one gather and F16C's exact conversion).
    #[inline(always)]
    unsafe fn scales<T: SmallOffset, L: Level8>(&self, i: usize) -> __m256 {
        // SAFETY: the level's features are enabled by the caller; block `i` exists in every row
        // and holds at least four bytes.
        unsafe {
            let base = self.w[0].add(i * T::SIZE) as *const i32;
            L::halves(_mm256_i32gather_epi32::<1>(base, self.offsets))
        }
    }
}

/// The eight i32 lanes of `q` as the columns of an 8 x 8 matrix: lane `r` of result `k` is lane
/// `k` of `q[r]`.
#[inline(always)]
pub(super) unsafe fn transpose(q: [__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let t: [__m256i; 8] = [
            _mm256_unpacklo_epi32(q[0], q[1]),
            _mm256_unpackhi_epi32(q[0], q[1]),
            _mm256_unpacklo_epi32(q[2], q[3]),
            _mm256_unpackhi_epi32(q[2], q[3]),
            _mm256_unpacklo_epi32(q[4], q[5]),
            _mm256_unpackhi_epi32(q[4], q[5]),
            _mm256_unpacklo_epi32(q[6], q[7]),
            _mm256_unpackhi_epi32(q[6], q[7]),
        ];
        // u[j] (j < 4): lanes j and j + 4 of rows 0..4; u[j + 4]: of rows 4..8.
        let mut u = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let (a, b) = (4 * h, 4 * h + 2);
            u[4 * h] = _mm256_unpacklo_epi64(t[a], t[b]);
            u[4 * h + 1] = _mm256_unpackhi_epi64(t[a], t[b]);
            u[4 * h + 2] = _mm256_unpacklo_epi64(t[a + 1], t[b + 1]);
            u[4 * h + 3] = _mm256_unpackhi_epi64(t[a + 1], t[b + 1]);
        }
        let mut out = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            out[j] = _mm256_permute2x128_si256::<0x20>(u[j], u[j + 4]);
            out[j + 4] = _mm256_permute2x128_si256::<0x31>(u[j], u[j + 4]);
        }
        out
    }
}

/// A weight format's eight-row kernels, which [`prompt_tile`] and [`decode_tile`] drive.
pub(super) trait Rows8: Sized {
    /// The x86 level of the kernels.
    type Level: Level8;
    /// Block `i` of a group's eight rows interleaved for the prompt kernel (plain vectors and
    /// floats, for which zero bits are valid).
    type Block: Copy;
    /// The kernel against the activation rows `acts` of `nb` blocks (a tile's columns).
    unsafe fn new(acts: &[*const u8], nb: usize) -> Self;
    /// Block `i` of the rows of `group` interleaved.
    unsafe fn interleave(&self, group: &Group, i: usize) -> Self::Block;
    /// An interleaved group (`blocks`, one per block of the row) against the columns `cols`
    /// (indices into `acts`): the eight rows' results per column.
    unsafe fn dot<const C: usize>(&self, blocks: &[Self::Block], cols: [usize; C]) -> [__m256; C];
    /// The rows of `group` (`nb` blocks each) straight from the weights against column 0
    /// (decode): the eight rows' results.
    unsafe fn decode_group(&self, group: &Group, nb: usize) -> __m256;
    /// Column `c` of `rows` of the job (the column of [`Rows8::new`]): by default eight rows at a
    /// time ([`decode_groups`]).
    #[inline(always)]
    unsafe fn decode_column(&self, job: &Job, nb: usize, rows: &Range<usize>, c: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { decode_groups(self, job, nb, rows, c) }
    }
}

/// The kernels of Q4_0 / Q5_0 (`T`) at level `L` against a tile's Q8_0 columns.
struct LegacyRows8<T, L> {
    acts: Vec<*const u8>,
    terms: ActTerms,
    kind: PhantomData<(T, L)>,
}

impl<T: SmallOffset, L: Level8> Rows8 for LegacyRows8<T, L> {
    type Level = L;
    type Block = GroupBlock;
    unsafe fn new(acts: &[*const u8], nb: usize) -> Self {
        LegacyRows8 {
            acts: acts.to_vec(),
            terms: ActTerms::new::<T>(acts, nb),
            kind: PhantomData,
        }
    }
    #[inline(always)]
    unsafe fn interleave(&self, group: &Group, i: usize) -> GroupBlock {
        // SAFETY: forwarded from the caller.
        unsafe { interleave::<T, L>(group, i) }
    }
    #[inline(always)]
    unsafe fn dot<const C: usize>(&self, blocks: &[GroupBlock], cols: [usize; C]) -> [__m256; C] {
        let acts = cols.map(|c| self.acts[c]);
        let terms = cols.map(|c| self.terms.column(c));
        // SAFETY: forwarded from the caller.
        unsafe { group_dot::<L, C>(blocks, acts, terms) }
    }
    /// Block by block, the eight rows' block dots by [`Level8::row_dots`] ([`Group::prefetch_next`]).
    #[inline(always)]
    unsafe fn decode_group(&self, group: &Group, nb: usize) -> __m256 {
        let (aq, asz) = act_layout(false);
        let terms = self.terms.column(0);
        // SAFETY: the level's features are enabled by the caller; the rows and the column hold
        // `nb` blocks.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                group.prefetch_next(i);
                let y = _mm256_loadu_si256(self.acts[0].add(i * asz + aq) as *const __m256i);
                let mut q = [_mm256_setzero_si256(); ROWS];
                for (r, w) in group.w.iter().enumerate() {
                    q[r] = L::unpack_u::<T>(w.add(i * T::SIZE));
                }
                let excess = _mm256_set1_epi32(*terms.excess.get_unchecked(i));
                let s = _mm256_add_epi32(L::row_dots(q, y), excess);
                let d = group.scales::<T, L>(i);
                acc = accumulate(acc, s, d, *terms.da.get_unchecked(i));
            }
            acc
        }
    }
}

/// Block `i` of the weight rows of `group` interleaved.
#[inline(always)]
unsafe fn interleave<T: SmallOffset, L: Level8>(group: &Group, i: usize) -> GroupBlock {
    // SAFETY: the level's features are enabled by the caller; block `i` exists in every row.
    unsafe {
        let mut q = [_mm256_setzero_si256(); ROWS];
        for (r, w) in group.w.iter().enumerate() {
            q[r] = L::unpack_u::<T>(w.add(i * T::SIZE));
        }
        GroupBlock {
            q: transpose(q),
            d: group.scales::<T, L>(i),
        }
    }
}

/// An interleaved group of rows (`blocks`, one per block of the row) against `C` activation
/// columns (`acts`, their `terms`): the eight rows' results per column. Each column's block dot
/// is split over two [`Level8::quad_dots`] (quads 0..4 and 4..8): two chains of `vpdpbusd` at
/// AVX-512, which its latency needs; at AVX2 the i16 sums of four quads' products stay exact.
#[inline(always)]
unsafe fn group_dot<L: Level8, const C: usize>(
    blocks: &[GroupBlock],
    acts: [*const u8; C],
    terms: [Terms; C],
) -> [__m256; C] {
    let (aq, asz) = act_layout(false);
    // SAFETY: the level's features are enabled by the caller; the columns hold `blocks.len()`
    // blocks.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); C];
        for (i, b) in blocks.iter().enumerate() {
            let mut s = [[_mm256_setzero_si256(); C]; 2];
            for c in 0..C {
                s[0][c] = _mm256_set1_epi32(*terms[c].excess.get_unchecked(i));
            }
            for (h, sh) in s.iter_mut().enumerate() {
                let q = [b.q[4 * h], b.q[4 * h + 1], b.q[4 * h + 2], b.q[4 * h + 3]];
                for c in 0..C {
                    let y = acts[c].add(i * asz + aq + 16 * h);
                    let y = [bcast(y), bcast(y.add(4)), bcast(y.add(8)), bcast(y.add(12))];
                    sh[c] = L::quad_dots(sh[c], q, y);
                }
            }
            for c in 0..C {
                let sum = _mm256_add_epi32(s[0][c], s[1][c]);
                acc[c] = accumulate(acc[c], sum, b.d, *terms[c].da.get_unchecked(i));
            }
        }
        acc
    }
}

/// `rows` x `cols` of a job with at least four columns: chunks of row groups interleaved (at most
/// [`CHUNK_BYTES`]), each against every group of four columns, then against the rest one by one.
#[inline(always)]
unsafe fn prompt_tile<K: Rows8>(job: &Job, nb: usize, rows: Range<usize>, cols: Range<usize>) {
    let ncols = cols.len();
    let groups = rows.len().div_ceil(ROWS);
    let chunk = (CHUNK_BYTES / (nb * size_of::<K::Block>())).clamp(1, groups);
    // SAFETY: the job's pointers are valid for `rows` x `cols`, these destination elements are
    // written by this thread only (caller), and the level's features are enabled by the caller;
    // zero bits are a valid `K::Block`.
    unsafe {
        let kern = K::new(&job.acts[cols.clone()], nb);
        let mut buf = vec![std::mem::zeroed::<K::Block>(); chunk * nb];
        for g0 in (0..groups).step_by(chunk) {
            let g1 = (g0 + chunk).min(groups);
            for (g, blocks) in (g0..g1).zip(buf.chunks_exact_mut(nb)) {
                let group = Group::new(job, rows.start + ROWS * g, &rows, nb);
                for (i, b) in blocks.iter_mut().enumerate() {
                    *b = kern.interleave(&group, i);
                }
            }
            for c in (0..ncols / 4 * 4).step_by(4) {
                for (g, blocks) in (g0..g1).zip(buf.chunks_exact(nb)) {
                    let out = kern.dot(blocks, [c, c + 1, c + 2, c + 3]);
                    for (j, v) in out.into_iter().enumerate() {
                        store_group::<K::Level>(job, &rows, g, cols.start + c + j, v);
                    }
                }
            }
            for c in ncols / 4 * 4..ncols {
                for (g, blocks) in (g0..g1).zip(buf.chunks_exact(nb)) {
                    let [v] = kern.dot(blocks, [c]);
                    store_group::<K::Level>(job, &rows, g, cols.start + c, v);
                }
            }
        }
    }
}

/// Lane `r` of the result: the sum of the eight lanes of `v[r]`.
#[inline(always)]
pub(super) unsafe fn row_sums(v: [__m256i; 8]) -> __m256i {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // Per 128-bit half: the half's sums of rows 0..4 (then 4..8).
        let lo = _mm256_hadd_epi32(h01, h23);
        let hi = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        )
    }
}

/// Column `c` of `rows` of a job eight rows at a time ([`Rows8::decode_group`] of `kern`, whose
/// column is `c`).
///
/// # Safety
/// As for [`rows8`].
#[inline(always)]
pub(super) unsafe fn decode_groups<K: Rows8>(
    kern: &K,
    job: &Job,
    nb: usize,
    rows: &Range<usize>,
    c: usize,
) {
    // SAFETY: as for `prompt_tile`.
    unsafe {
        for m0 in rows.clone().step_by(ROWS) {
            let acc = kern.decode_group(&Group::new(job, m0, rows, nb), nb);
            store_group::<K::Level>(job, rows, (m0 - rows.start) / ROWS, c, acc);
        }
    }
}

/// `rows` x `cols` of a job, column by column ([`Rows8::decode_column`]).
#[inline(always)]
unsafe fn decode_tile<K: Rows8>(job: &Job, nb: usize, rows: Range<usize>, cols: Range<usize>) {
    // SAFETY: as for `prompt_tile`.
    unsafe {
        for c in cols {
            K::new(&[job.acts[c]], nb).decode_column(job, nb, &rows, c);
        }
    }
}

/// `rows` x `cols` of a job with the kernels `K` (`nb` blocks per row): [`prompt_tile`] from four
/// columns, else [`decode_tile`].
///
/// # Safety
/// As for `quant::rows`, with the features of `K::Level` enabled in the caller.
#[inline(always)]
pub(super) unsafe fn rows8<K: Rows8>(job: &Job, nb: usize, rows: Range<usize>, cols: Range<usize>) {
    if rows.is_empty() {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        if cols.len() >= 4 {
            prompt_tile::<K>(job, nb, rows, cols)
        } else {
            decode_tile::<K>(job, nb, rows, cols)
        }
    }
}

/// Q4_0 / Q5_0 weights `T` of `nb` blocks per row at level `L`: `rows` x `cols` of a job
/// ([`rows8`]).
///
/// # Safety
/// As for [`rows8`].
#[inline(always)]
pub(super) unsafe fn legacy_rows8<T: SmallOffset, L: Level8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { rows8::<LegacyRows8<T, L>>(job, nb, rows, cols) }
}

//! `flash_attn_ext`: fused attention with a single online-softmax pass per query row, the weights of
//! 16 visible keys at a time computed by one vector `exp`. q F32; k and v
//! F32/F16/BF16/Q8_0/Q4_0 (any type `load_row` converts); optional mask (broadcast over heads and
//! sequences), sinks, logit softcap, ALiBi slopes and grouped-query heads. Result [Dv, H, Nq, S].
//!
//! K/V rows of other types than F32 are converted to f32 once per task and KV head (`Converted`),
//! except F16 rows when a sequence has few query rows (decode): those are read in place, widened
//! as they are loaded (`RowOps::dot_f16`, `RowOps::axpy_rows_f16`), which gives the converted
//! rows' results bit for bit without a task converting (and zeroing) every visible row first.

use super::norm::alibi_slope;
use super::rows::{load_row, load_row_into, par_rows, unravel, with_out_row, Scratch};
use super::vector::{row_ops, RowOps, AXPY_ROWS_MAX};
use crate::view::TView;
use ggml_core::{DType, Error, Result};

/// Parameters of one `flash_attn_ext` call.
#[derive(Clone, Copy, Debug)]
pub struct FaParams {
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
}

/// Query rows per sequence up to which F16 K/V rows are read in place (each visible row once per
/// query row of its KV head) rather than converted once per task.
const IN_PLACE_MAX_QUERIES: usize = 2;

/// Attention of every query row: `softmax(scale * q·k + slope * mask) · v`, with optional sinks.
pub fn flash_attn_ext(
    q: &TView,
    k: &TView,
    v: &TView,
    mask: Option<&TView>,
    sinks: Option<&TView>,
    dst: &TView,
    p: FaParams,
) -> Result<()> {
    check_shapes(q, k, v, mask, sinks, dst)?;
    let (lq, lk, lv, d) = (q.layout, k.layout, v.layout, dst.layout);
    let (n_head, n_kv, n_head_kv, dv) = (lq.ne[2], lk.ne[1], lk.ne[2], lv.ne[0]);
    let group = n_head / n_head_kv;
    let (scale, softcap) = if p.softcap != 0.0 {
        (p.scale / p.softcap, p.softcap)
    } else {
        (p.scale, 0.0)
    };
    par_rows(d.nrows(), n_kv * (lq.ne[0] + dv), |range| {
        let (mut sq, mut sm, mut sk, mut sv, mut so) = (
            Scratch::default(),
            Scratch::default(),
            Scratch::default(),
            Scratch::default(),
            Scratch::default(),
        );
        let ops = row_ops();
        let mut acc = OnlineSoftmax::new(dv, ops);
        // K/V rows converted to f32 once per (kv head, sequence) for the whole task, instead of once
        // per query row (prompts have many query rows per head), and only as far as a row's
        // visible keys reach (a KV cache's padded tail is never converted).
        let dk = lq.ne[0];
        let cache_bytes = n_head_kv * lq.ne[3] * n_kv * (dk + dv) * 4;
        let in_place = lq.ne[1] <= IN_PLACE_MAX_QUERIES && is_f16_rows(k) && is_f16_rows(v);
        let use_cache = !in_place
            && (k.dtype() != DType::F32 || v.dtype() != DType::F32)
            && cache_bytes <= 256 << 20;
        let mut cache: Vec<Option<Converted>> =
            (0..if use_cache { n_head_kv * lq.ne[3] } else { 0 })
                .map(|_| None)
                .collect();
        for r in range {
            let [h, iq, s] = unravel(r, &d.ne);
            let hk = h / group;
            let slope = alibi_slope(p.max_bias, h, n_head);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let qr = load_row(q, [iq, h, s], &mut sq.f)?;
                let mr = match mask {
                    Some(m) => Some(load_row(m, [iq, h % m.ne()[2], s % m.ne()[3]], &mut sm.f)?),
                    None => None,
                };
                acc.reset();
                let mut converted = if use_cache {
                    Some(
                        cache[hk + s * n_head_kv]
                            .get_or_insert_with(|| Converted::new(n_kv, dk, dv)),
                    )
                } else {
                    None
                };
                let mut chunk = Chunk::default();
                for j in 0..n_kv {
                    let mv = mr.map_or(0.0, |m| slope * m[j]);
                    if mv == f32::NEG_INFINITY {
                        continue;
                    }
                    let mut x = if in_place {
                        ops.dot_f16(qr, k.row_ptr(j, hk, s))
                    } else {
                        let kr = match converted.as_deref_mut() {
                            Some(c) => c.key(k, v, [j, hk, s])?,
                            None => load_row(k, [j, hk, s], &mut sk.f)?,
                        };
                        ops.dot(qr, kr)
                    } * scale;
                    if softcap != 0.0 {
                        x = softcap * x.tanh();
                    }
                    if chunk.push(j, x + mv) {
                        let values = Values {
                            v,
                            hk,
                            s,
                            in_place,
                            converted: converted.as_deref(),
                        };
                        acc.add_chunk(&mut chunk, &values, &mut sv)?;
                    }
                }
                let values = Values {
                    v,
                    hk,
                    s,
                    in_place,
                    converted: converted.as_deref(),
                };
                acc.add_chunk(&mut chunk, &values, &mut sv)?;
                if let Some(sk_view) = sinks {
                    acc.add_sink(sk_view.get_f32([h, 0, 0, 0]));
                }
                with_out_row(dst, [h, iq, s], &mut so, |out| {
                    acc.write(out);
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

/// The shapes `flash_attn_ext` computes on: q [D, Nq, H, S], k [D, Nkv, Hkv, S], v [Dv, Nkv, Hkv, S]
/// with H a multiple of Hkv, dst [Dv, H, Nq, S]; a mask of at least [Nkv, Nq]; one sink per head.
fn check_shapes(
    q: &TView,
    k: &TView,
    v: &TView,
    mask: Option<&TView>,
    sinks: Option<&TView>,
    dst: &TView,
) -> Result<()> {
    let (lq, lk, lv, d) = (q.layout, k.layout, v.layout, dst.layout);
    let (n_head, n_kv, n_head_kv, dv) = (lq.ne[2], lk.ne[1], lk.ne[2], lv.ne[0]);
    let bad = lq.ne[0] != lk.ne[0]
        || lv.ne[1] != n_kv
        || lv.ne[2] != n_head_kv
        || n_head_kv == 0
        || n_head % n_head_kv != 0
        || lk.ne[3] != lq.ne[3]
        || lv.ne[3] != lq.ne[3]
        || d.ne != [dv, n_head, lq.ne[1], lq.ne[3]];
    if bad {
        return Err(Error::Shape {
            op: "flash_attn_ext",
            msg: format!(
                "q {:?}, k {:?}, v {:?}, dst {:?}",
                lq.ne, lk.ne, lv.ne, d.ne
            ),
        });
    }
    if let Some(m) = mask {
        let lm = m.layout;
        if lm.ne[0] != n_kv || lm.ne[1] < lq.ne[1] || lm.ne[2] == 0 || lm.ne[3] == 0 {
            return Err(Error::Shape {
                op: "flash_attn_ext",
                msg: format!("mask {:?} for q {:?}, k {:?}", lm.ne, lq.ne, lk.ne),
            });
        }
    }
    if let Some(s) = sinks {
        if s.ne()[0] != n_head {
            return Err(Error::Shape {
                op: "flash_attn_ext",
                msg: format!("sinks {:?} for {n_head} heads", s.ne()),
            });
        }
    }
    Ok(())
}

/// Whether `t` holds F16 rows with contiguous elements (read in place by the F16 row primitives).
fn is_f16_rows(t: &TView) -> bool {
    t.dtype() == DType::F16 && t.layout.nb[0] == 2
}

/// The K and V rows of one (KV head, sequence) converted to F32 and packed, keys `0 .. len` so far.
struct Converted {
    k: Vec<f32>,
    v: Vec<f32>,
    dk: usize,
    dv: usize,
    len: usize,
}

impl Converted {
    /// Room for `n_kv` keys; rows are zeroed only as [`Converted::key`] reaches them.
    fn new(n_kv: usize, dk: usize, dv: usize) -> Self {
        Converted {
            k: Vec::with_capacity(n_kv * dk),
            v: Vec::with_capacity(n_kv * dv),
            dk,
            dv,
            len: 0,
        }
    }

    /// The converted K row of key `j` of KV head `hk` in sequence `s` (`[j, hk, s]`), converting
    /// the K and V rows of every key up to it first.
    ///
    /// # Safety
    /// `j`, `hk` and `s` must be in range of `k` and `v`, the same for every call on `self`.
    unsafe fn key(&mut self, k: &TView, v: &TView, [j, hk, s]: [usize; 3]) -> Result<&[f32]> {
        let (dk, dv) = (self.dk, self.dv);
        while self.len <= j {
            let r = self.len;
            self.k.resize((r + 1) * dk, 0.0);
            self.v.resize((r + 1) * dv, 0.0);
            // SAFETY: key r <= j is in range (caller).
            unsafe {
                load_row_into(k, [r, hk, s], &mut self.k[r * dk..(r + 1) * dk])?;
                load_row_into(v, [r, hk, s], &mut self.v[r * dv..(r + 1) * dv])?;
            }
            self.len += 1;
        }
        Ok(&self.k[j * dk..(j + 1) * dk])
    }

    /// The converted V row of key `j` (converted already: [`Converted::key`] of `j` came first).
    fn value(&self, j: usize) -> &[f32] {
        &self.v[j * self.dv..(j + 1) * self.dv]
    }
}

/// Scores of a query row's visible keys collected before their weights are computed together
/// (one vector `exp` per chunk). Chunks are cut from the visible keys only, so a query row's
/// chunks, and so its result, do not depend on the keys masked out (its batch).
struct Chunk {
    keys: [usize; CHUNK],
    scores: [f32; CHUNK],
    len: usize,
}

/// Keys per [`Chunk`] (the rows one `axpy_rows` call takes).
const CHUNK: usize = AXPY_ROWS_MAX;

impl Default for Chunk {
    fn default() -> Self {
        Chunk {
            keys: [0; CHUNK],
            scores: [0.0; CHUNK],
            len: 0,
        }
    }
}

impl Chunk {
    /// Adds key `j` with score `x`; true when the chunk is full.
    fn push(&mut self, j: usize, x: f32) -> bool {
        self.keys[self.len] = j;
        self.scores[self.len] = x;
        self.len += 1;
        self.len == CHUNK
    }
}

/// Where a query row's value rows come from: `v`'s F16 rows in place, the converted cache of its
/// KV head, or `v` itself row by row.
struct Values<'a> {
    v: &'a TView,
    hk: usize,
    s: usize,
    in_place: bool,
    converted: Option<&'a Converted>,
}

impl Values<'_> {
    /// Value row `j`.
    ///
    /// # Safety
    /// `j` must be a key of `v`.
    unsafe fn row<'b>(&'b self, j: usize, sv: &'b mut Scratch) -> Result<&'b [f32]> {
        match self.converted {
            Some(c) => Ok(c.value(j)),
            // SAFETY: `j` is a key of `v` (caller); `hk` and `s` are in range (flash_attn_ext).
            None => unsafe { load_row(self.v, [j, self.hk, self.s], &mut sv.f) },
        }
    }
}

/// One query row's online softmax: the running maximum score, the sum of weights and the weighted
/// sum of value rows, rescaled whenever a larger score arrives.
struct OnlineSoftmax {
    ops: &'static RowOps,
    acc: Vec<f32>,
    max: f32,
    sum: f32,
}

impl OnlineSoftmax {
    fn new(dv: usize, ops: &'static RowOps) -> Self {
        OnlineSoftmax {
            ops,
            acc: vec![0f32; dv],
            max: f32::NEG_INFINITY,
            sum: 0.0,
        }
    }

    fn reset(&mut self) {
        self.acc.iter_mut().for_each(|a| *a = 0.0);
        self.max = f32::NEG_INFINITY;
        self.sum = 0.0;
    }

    /// Adds the value rows of `chunk`'s keys with their scores (rescaling once to the chunk's
    /// largest score when it is a new maximum), and empties the chunk.
    ///
    /// # Safety
    /// The chunk's keys must be keys of `values`.
    unsafe fn add_chunk(
        &mut self,
        chunk: &mut Chunk,
        values: &Values,
        sv: &mut Scratch,
    ) -> Result<()> {
        let n = std::mem::take(&mut chunk.len);
        let scores = &mut chunk.scores[..n];
        let top = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        if top > self.max {
            let ms = (self.max - top).exp();
            self.max = top;
            self.ops.scale(ms, &mut self.acc);
            self.sum *= ms;
        }
        scores.iter_mut().for_each(|x| *x -= self.max);
        self.ops.exp(scores);
        if values.in_place {
            let mut rows = [std::ptr::null(); CHUNK];
            for (r, &j) in rows.iter_mut().zip(&chunk.keys[..n]) {
                *r = values.v.row_ptr(j, values.hk, values.s) as *const u8;
            }
            // SAFETY: the rows are F16 rows of `v` of `acc.len()` elements (keys of `values`,
            // caller).
            unsafe { self.ops.axpy_rows_f16(scores, &rows[..n], &mut self.acc) };
        } else if let Some(c) = values.converted {
            // Converted rows stay put: all of the chunk's rows in one pass over the accumulator.
            let mut rows: [&[f32]; CHUNK] = [&[]; CHUNK];
            for (r, &j) in rows.iter_mut().zip(&chunk.keys[..n]) {
                *r = c.value(j);
            }
            self.ops.axpy_rows(scores, &rows[..n], &mut self.acc);
        } else {
            for (&j, &weight) in chunk.keys[..n].iter().zip(scores.iter()) {
                // SAFETY: `j` is a key of `values` (caller).
                let vr = unsafe { values.row(j, sv)? };
                self.ops.axpy(weight, vr, &mut self.acc);
            }
        }
        for &weight in scores.iter() {
            self.sum += weight;
        }
        Ok(())
    }

    /// Adds a sink: one more logit in the normaliser, with no value row.
    fn add_sink(&mut self, sink: f32) {
        if sink > self.max {
            let ms = (self.max - sink).exp();
            self.ops.scale(ms, &mut self.acc);
            self.sum = self.sum * ms + 1.0;
        } else {
            self.sum += (sink - self.max).exp();
        }
    }

    /// The normalised result (zeros when every score was masked out).
    fn write(&self, out: &mut [f32]) {
        let inv = if self.sum == 0.0 { 0.0 } else { 1.0 / self.sum };
        out.iter_mut()
            .zip(&self.acc)
            .for_each(|(o, &a)| *o = a * inv);
    }
}

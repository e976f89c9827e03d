//! `MetaBuffer`: the memory of one tensor on the meta device, held as one buffer per device at slice
//! size. Byte offsets given to `set`/`get` are offsets into the full, contiguous tensor; they are mapped
//! to the devices' slices (split), written everywhere (mirrored) or summed on read (partial).

use crate::split::SplitState;
use ggml_core::backend::{check_range, Buffer};
use ggml_core::{DType, Error, Layout, Result};
use std::any::Any;
use std::sync::Arc;

/// One tensor's memory across the devices of a meta device.
pub struct MetaBuffer {
    layout: Layout,
    state: SplitState,
    parts: Vec<Arc<dyn Buffer>>,
    name: String,
}

/// A run of bytes of the full tensor that is contiguous on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    device: usize,
    local_offset: usize,
    len: usize,
}

/// Runs of one device that follow each other in its memory, copied as one: `pieces` are the
/// runs' `(start in the caller's bytes, length)`, in order from `local_offset` on.
struct Batch {
    device: usize,
    local_offset: usize,
    len: usize,
    pieces: Vec<(usize, usize)>,
}

/// The full tensor seen as `[inner bytes, axis units, outer]` around the split axis.
struct AxisGeometry {
    inner: usize,
    units: usize,
    /// Element count per unit along the axis (the block size on axis 0, else 1).
    unit_elems: usize,
}

impl MetaBuffer {
    /// Wraps per-device buffers that hold `layout`'s parts for `state`. Each part must hold at least the
    /// local tensor's bytes.
    pub fn new(
        layout: Layout,
        state: SplitState,
        parts: Vec<Arc<dyn Buffer>>,
        name: String,
    ) -> Result<MetaBuffer> {
        if !layout.is_contiguous() {
            return Err(Error::Other(format!(
                "meta buffer {name}: layout must be contiguous"
            )));
        }
        let b = MetaBuffer {
            layout,
            state,
            parts,
            name,
        };
        for d in 0..b.parts.len() {
            let need = b.local_layout(d).nbytes();
            if b.parts[d].size() < need {
                return Err(Error::Other(format!(
                    "meta buffer {}: part {d} has {} bytes, needs {need}",
                    b.name,
                    b.parts[d].size()
                )));
            }
        }
        Ok(b)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn state(&self) -> &SplitState {
        &self.state
    }

    /// Per-device buffers.
    pub fn parts(&self) -> &[Arc<dyn Buffer>] {
        &self.parts
    }

    /// Layout of device `d`'s part.
    pub fn local_layout(&self, d: usize) -> Layout {
        Layout::contiguous(self.layout.dtype, self.state.local_shape(self.layout.ne, d))
    }

    fn geometry(&self, axis: usize) -> AxisGeometry {
        let l = &self.layout;
        if axis == 0 {
            AxisGeometry {
                inner: l.dtype.type_size(),
                units: l.ne[0] / l.dtype.block_size(),
                unit_elems: l.dtype.block_size(),
            }
        } else {
            AxisGeometry {
                inner: l.nb[axis],
                units: l.ne[axis],
                unit_elems: 1,
            }
        }
    }

    /// The runs of `[offset, offset + len)` gathered per device where they continue each other
    /// there: a tensor split along its rows and written whole is one copy per device instead of
    /// one per row (two devices sharing Qwen3-30B-A3B's expert weights that way: tens of millions
    /// of copies, minutes of loading on a GPU).
    fn batches(&self, offset: usize, len: usize) -> Vec<Batch> {
        let mut batches: Vec<Batch> = Vec::new();
        let mut open: Vec<Option<usize>> = vec![None; self.parts.len()];
        let mut done = 0;
        for r in self.runs(offset, len) {
            match open[r.device].map(|i| &mut batches[i]) {
                Some(b) if b.local_offset + b.len == r.local_offset => {
                    b.len += r.len;
                    b.pieces.push((done, r.len));
                }
                _ => {
                    open[r.device] = Some(batches.len());
                    batches.push(Batch {
                        device: r.device,
                        local_offset: r.local_offset,
                        len: r.len,
                        pieces: vec![(done, r.len)],
                    });
                }
            }
            done += r.len;
        }
        batches
    }

    /// Splits the full-tensor byte range `[offset, offset + len)` into device runs.
    fn runs(&self, offset: usize, len: usize) -> Vec<Run> {
        let SplitState::Split { axis, segments } = &self.state else {
            return Vec::new();
        };
        let g = self.geometry(*axis);
        // Unit index -> (device, local unit index) via segment tables, in units.
        let mut table: Vec<(usize, usize, usize, usize)> = Vec::new(); // (global start, end, device, local start)
        let mut global = 0usize;
        let mut local_base = vec![0usize; self.parts.len()];
        for seg in segments {
            for (d, &s) in seg.slices.iter().enumerate() {
                let s = s / g.unit_elems;
                if s > 0 {
                    table.push((global, global + s, d, local_base[d]));
                }
                global += s;
                local_base[d] += s;
            }
        }
        let local_units: Vec<usize> = local_base;
        let row = g.units * g.inner;
        let mut out = Vec::new();
        let (mut pos, end) = (offset, offset + len);
        while pos < end {
            let outer = pos / row;
            let within = pos % row;
            let unit = within / g.inner;
            let inner_off = within % g.inner;
            let &(gs, ge, d, ls) = table
                .iter()
                .find(|t| t.0 <= unit && unit < t.1)
                .expect("segments cover the axis");
            let run_end_in_row = ge * g.inner;
            let take = (run_end_in_row - within).min(end - pos);
            let local_offset = (outer * local_units[d] + ls + (unit - gs)) * g.inner + inner_off;
            out.push(Run {
                device: d,
                local_offset,
                len: take,
            });
            pos += take;
        }
        out
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        check_range(offset, len, self.layout.nbytes())
    }
}

/// Adds `src` (as `dtype` elements) into the f64 accumulator.
fn accumulate(dtype: DType, src: &[u8], acc: &mut [f64]) -> Result<()> {
    match dtype {
        DType::F32 => src
            .chunks_exact(4)
            .zip(acc.iter_mut())
            .for_each(|(c, a)| *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
        DType::F16 => src
            .chunks_exact(2)
            .zip(acc.iter_mut())
            .for_each(|(c, a)| *a += half::f16::from_le_bytes([c[0], c[1]]).to_f64()),
        DType::BF16 => src
            .chunks_exact(2)
            .zip(acc.iter_mut())
            .for_each(|(c, a)| *a += half::bf16::from_le_bytes([c[0], c[1]]).to_f64()),
        t => {
            return Err(Error::UnsupportedType {
                dtype: t,
                what: "reading a partial meta tensor".into(),
            })
        }
    }
    Ok(())
}

fn store(dtype: DType, acc: &[f64], out: &mut [u8]) {
    match dtype {
        DType::F32 => out
            .chunks_exact_mut(4)
            .zip(acc)
            .for_each(|(c, &a)| c.copy_from_slice(&(a as f32).to_le_bytes())),
        DType::F16 => out
            .chunks_exact_mut(2)
            .zip(acc)
            .for_each(|(c, &a)| c.copy_from_slice(&half::f16::from_f64(a).to_le_bytes())),
        _ => out
            .chunks_exact_mut(2)
            .zip(acc)
            .for_each(|(c, &a)| c.copy_from_slice(&half::bf16::from_f64(a).to_le_bytes())),
    }
}

impl Buffer for MetaBuffer {
    fn size(&self) -> usize {
        self.layout.nbytes()
    }

    fn name(&self) -> String {
        format!("meta[{}]({})", self.name, self.state)
    }

    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        match &self.state {
            SplitState::Mirrored => self.parts.iter().try_for_each(|p| p.set(offset, data)),
            SplitState::Partial => {
                self.parts[0].set(offset, data)?;
                self.parts[1..]
                    .iter()
                    .try_for_each(|p| p.fill(offset, data.len(), 0))
            }
            SplitState::Split { .. } => {
                for b in self.batches(offset, data.len()) {
                    let part = &self.parts[b.device];
                    if let [(at, len)] = b.pieces[..] {
                        part.set(b.local_offset, &data[at..at + len])?;
                    } else {
                        let mut gathered = Vec::with_capacity(b.len);
                        for &(at, len) in &b.pieces {
                            gathered.extend_from_slice(&data[at..at + len]);
                        }
                        part.set(b.local_offset, &gathered)?;
                    }
                }
                Ok(())
            }
        }
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        match &self.state {
            SplitState::Mirrored => self.parts[0].get(offset, out),
            SplitState::Partial => {
                let dtype = self.layout.dtype;
                let es = dtype.type_size();
                if dtype.is_quantized()
                    || !offset.is_multiple_of(es)
                    || !out.len().is_multiple_of(es)
                {
                    return Err(Error::UnsupportedType {
                        dtype,
                        what: "partial read at this offset".into(),
                    });
                }
                let mut acc = vec![0f64; out.len() / es];
                let mut tmp = vec![0u8; out.len()];
                for p in &self.parts {
                    p.get(offset, &mut tmp)?;
                    accumulate(dtype, &tmp, &mut acc)?;
                }
                store(dtype, &acc, out);
                Ok(())
            }
            SplitState::Split { .. } => {
                for b in self.batches(offset, out.len()) {
                    let part = &self.parts[b.device];
                    if let [(at, len)] = b.pieces[..] {
                        part.get(b.local_offset, &mut out[at..at + len])?;
                    } else {
                        let mut gathered = vec![0u8; b.len];
                        part.get(b.local_offset, &mut gathered)?;
                        let mut from = 0;
                        for &(at, len) in &b.pieces {
                            out[at..at + len].copy_from_slice(&gathered[from..from + len]);
                            from += len;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.check(offset, len)?;
        match &self.state {
            SplitState::Mirrored => self
                .parts
                .iter()
                .try_for_each(|p| p.fill(offset, len, value)),
            SplitState::Partial => {
                self.parts[0].fill(offset, len, value)?;
                self.parts[1..]
                    .iter()
                    .try_for_each(|p| p.fill(offset, len, 0))
            }
            SplitState::Split { .. } => self
                .batches(offset, len)
                .into_iter()
                .try_for_each(|b| self.parts[b.device].fill(b.local_offset, b.len, value)),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A byte range of another buffer, seen as a buffer of its own (for assembling device parts that live
/// inside compute buffers).
pub struct Window {
    buffer: Arc<dyn Buffer>,
    offset: usize,
    len: usize,
}

impl Window {
    pub fn new(buffer: Arc<dyn Buffer>, offset: usize, len: usize) -> Result<Window> {
        check_range(offset, len, buffer.size())?;
        Ok(Window {
            buffer,
            offset,
            len,
        })
    }
}

impl Buffer for Window {
    fn size(&self) -> usize {
        self.len
    }
    fn name(&self) -> String {
        format!(
            "{}[{}..{}]",
            self.buffer.name(),
            self.offset,
            self.offset + self.len
        )
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        self.buffer.host_ptr().map(|p| p.wrapping_add(self.offset))
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len)?;
        self.buffer.set(self.offset + offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len)?;
        self.buffer.get(self.offset + offset, out)
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        self.buffer.fill(self.offset + offset, len, value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::{segment, Segment};
    use ggml_core::host_buffer::HostBuffer;
    use proptest::prelude::*;

    fn make(layout: Layout, state: SplitState, n: usize) -> MetaBuffer {
        let parts = (0..n)
            .map(|d| {
                let local = Layout::contiguous(layout.dtype, state.local_shape(layout.ne, d));
                Arc::new(HostBuffer::new(local.nbytes()).unwrap()) as Arc<dyn Buffer>
            })
            .collect();
        MetaBuffer::new(layout, state, parts, "t".into()).unwrap()
    }

    /// Device and local unit index of global unit `u` along the split axis, by walking the segments.
    fn owner(segments: &[Segment], unit_elems: usize, n: usize, u: usize) -> (usize, usize) {
        let mut global = 0;
        let mut local = vec![0usize; n];
        for seg in segments {
            for (d, &s) in seg.slices.iter().enumerate() {
                let s = s / unit_elems;
                if u < global + s {
                    return (d, local[d] + u - global);
                }
                global += s;
                local[d] += s;
            }
        }
        unreachable!("unit {u} outside the axis")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn set_then_get_returns_the_bytes_and_parts_hold_their_slices(
            axis in 0usize..4,
            quant in any::<bool>(),
            dims in prop::collection::vec(1usize..5, 4),
            seg_units in prop::collection::vec(0usize..4, 1..4),
            ratios in prop::collection::vec(0u8..4, 1..5),
            rotate in 0usize..4,
            cut in (0usize..1000, 0usize..1000),
            seed in any::<u64>(),
        ) {
            let n = ratios.len();
            let ratios: Vec<f32> = ratios.into_iter().map(f32::from).collect();
            prop_assume!(ratios.iter().sum::<f32>() > 0.0);
            let dtype = if quant && axis == 0 { DType::Q8_0 } else { DType::F32 };
            let g = if axis == 0 && quant { 32 } else { 1 };
            let segments: Vec<Segment> = seg_units.iter().enumerate()
                .map(|(i, &u)| segment((u + 1) * g * 2, g, &ratios, rotate + i).unwrap())
                .collect();
            let mut ne = [dims[0], dims[1], dims[2], dims[3]];
            ne[axis] = segments.iter().map(|s| s.len).sum();
            if dtype == DType::F32 && axis != 0 { ne[0] = dims[0]; }
            let layout = Layout::contiguous(dtype, ne);
            let state = SplitState::Split { axis, segments: segments.clone() };
            let b = make(layout, state.clone(), n);
            let total = layout.nbytes();
            let full: Vec<u8> = (0..total).map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 2654435761) >> 7) as u8).collect();
            b.set(0, &full).unwrap();
            let mut back = vec![0u8; total];
            b.get(0, &mut back).unwrap();
            prop_assert_eq!(&back, &full);
            // A sub-range write and read at arbitrary offsets.
            let (lo, hi) = (cut.0 % (total + 1), cut.1 % (total + 1));
            let (lo, hi) = (lo.min(hi), lo.max(hi));
            let patch: Vec<u8> = (lo..hi).map(|i| (i as u8) ^ 0x5a).collect();
            b.set(lo, &patch).unwrap();
            let mut mid = vec![0u8; hi - lo];
            b.get(lo, &mut mid).unwrap();
            prop_assert_eq!(&mid, &patch);
            let mut expect = full.clone();
            expect[lo..hi].copy_from_slice(&patch);
            // Each device's part is its slice of the full tensor, checked unit by unit.
            let (inner, units, unit_elems) = if axis == 0 {
                (dtype.type_size(), ne[0] / dtype.block_size(), dtype.block_size())
            } else {
                (layout.nb[axis], ne[axis], 1)
            };
            let outer = total / (inner * units);
            let locals: Vec<Vec<u8>> = (0..n).map(|d| {
                let mut v = vec![0u8; b.local_layout(d).nbytes()];
                b.parts()[d].get(0, &mut v).unwrap();
                v
            }).collect();
            for o in 0..outer {
                for u in 0..units {
                    let (d, lu) = owner(&segments, unit_elems, n, u);
                    let lunits = state.local_len(d).unwrap() / unit_elems;
                    let src = (o * units + u) * inner;
                    let dst = (o * lunits + lu) * inner;
                    prop_assert_eq!(&locals[d][dst..dst + inner], &expect[src..src + inner]);
                }
            }
        }
    }

    /// A host buffer that counts the copies into and out of it.
    struct Counting(HostBuffer, std::sync::atomic::AtomicUsize);

    impl Buffer for Counting {
        fn size(&self) -> usize {
            self.0.size()
        }
        fn name(&self) -> String {
            self.0.name()
        }
        fn host_ptr(&self) -> Option<*mut u8> {
            None
        }
        fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.set(offset, data)
        }
        fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.get(offset, out)
        }
        fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.fill(offset, len, value)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn a_tensor_split_along_its_rows_is_one_copy_per_device() {
        let layout = Layout::contiguous(DType::F32, [8, 1000, 3, 1]);
        let state = SplitState::Split {
            axis: 0,
            segments: vec![segment(8, 1, &[1.0, 3.0], 0).unwrap()],
        };
        let parts: Vec<Arc<Counting>> = (0..2)
            .map(|d| {
                let local = Layout::contiguous(layout.dtype, state.local_shape(layout.ne, d));
                Arc::new(Counting(HostBuffer::new(local.nbytes()).unwrap(), 0.into()))
            })
            .collect();
        let dyn_parts = parts.iter().map(|p| p.clone() as Arc<dyn Buffer>).collect();
        let b = MetaBuffer::new(layout, state, dyn_parts, "t".into()).unwrap();
        let full: Vec<u8> = (0..layout.nbytes()).map(|i| (i * 7 % 251) as u8).collect();
        b.set(0, &full).unwrap();
        let mut back = vec![0u8; full.len()];
        b.get(0, &mut back).unwrap();
        b.fill(0, full.len(), 0).unwrap();
        assert_eq!(back, full);
        for p in &parts {
            assert_eq!(
                p.1.load(std::sync::atomic::Ordering::Relaxed),
                3,
                "set, get, fill"
            );
        }
    }

    #[test]
    fn mirrored_and_partial_states() {
        let layout = Layout::contiguous(DType::F32, [5, 3, 1, 1]);
        let m = make(layout, SplitState::Mirrored, 3);
        let vals: Vec<f32> = (0..15).map(|i| i as f32).collect();
        m.set(0, bytemuck::cast_slice(&vals)).unwrap();
        for p in m.parts() {
            let mut v = vec![0f32; 15];
            p.get(0, bytemuck::cast_slice_mut(&mut v)).unwrap();
            assert_eq!(v, vals);
        }
        let p = make(layout, SplitState::Partial, 3);
        p.set(0, bytemuck::cast_slice(&vals)).unwrap();
        let mut out = vec![0f32; 15];
        p.get(0, bytemuck::cast_slice_mut(&mut out)).unwrap();
        assert_eq!(out, vals);
        // Three summands read back as their sum.
        for part in p.parts() {
            part.set(8, bytemuck::cast_slice(&[1.5f32])).unwrap();
        }
        p.get(0, bytemuck::cast_slice_mut(&mut out)).unwrap();
        assert_eq!(out[2], 4.5);
        assert!(
            p.get(1, &mut [0u8; 4]).is_err(),
            "unaligned partial read is refused"
        );
        assert!(m.set(60, &[0u8; 4]).is_err(), "out of bounds");
    }
}

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
    pub fn new(layout: Layout, state: SplitState, parts: Vec<Arc<dyn Buffer>>, name: String) -> Result<MetaBuffer> {
        if !layout.is_contiguous() {
            return Err(Error::Other(format!("meta buffer {name}: layout must be contiguous")));
        }
        let b = MetaBuffer { layout, state, parts, name };
        for d in 0..b.parts.len() {
            let need = b.local_layout(d).nbytes();
            if b.parts[d].size() < need {
                return Err(Error::Other(format!("meta buffer {}: part {d} has {} bytes, needs {need}", b.name, b.parts[d].size())));
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
            AxisGeometry { inner: l.dtype.type_size(), units: l.ne[0] / l.dtype.block_size(), unit_elems: l.dtype.block_size() }
        } else {
            AxisGeometry { inner: l.nb[axis], units: l.ne[axis], unit_elems: 1 }
        }
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
            let &(gs, ge, d, ls) = table.iter().find(|t| t.0 <= unit && unit < t.1).expect("segments cover the axis");
            let run_end_in_row = ge * g.inner;
            let take = (run_end_in_row - within).min(end - pos);
            let local_offset = (outer * local_units[d] + ls + (unit - gs)) * g.inner + inner_off;
            out.push(Run { device: d, local_offset, len: take });
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
        DType::F32 => src.chunks_exact(4).zip(acc.iter_mut()).for_each(|(c, a)| *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64),
        DType::F16 => src.chunks_exact(2).zip(acc.iter_mut()).for_each(|(c, a)| *a += half::f16::from_le_bytes([c[0], c[1]]).to_f64()),
        DType::BF16 => src.chunks_exact(2).zip(acc.iter_mut()).for_each(|(c, a)| *a += half::bf16::from_le_bytes([c[0], c[1]]).to_f64()),
        t => return Err(Error::UnsupportedType { dtype: t, what: "reading a partial meta tensor".into() }),
    }
    Ok(())
}

fn store(dtype: DType, acc: &[f64], out: &mut [u8]) {
    match dtype {
        DType::F32 => out.chunks_exact_mut(4).zip(acc).for_each(|(c, &a)| c.copy_from_slice(&(a as f32).to_le_bytes())),
        DType::F16 => out.chunks_exact_mut(2).zip(acc).for_each(|(c, &a)| c.copy_from_slice(&half::f16::from_f64(a).to_le_bytes())),
        _ => out.chunks_exact_mut(2).zip(acc).for_each(|(c, &a)| c.copy_from_slice(&half::bf16::from_f64(a).to_le_bytes())),
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
                self.parts[1..].iter().try_for_each(|p| p.fill(offset, data.len(), 0))
            }
            SplitState::Split { .. } => {
                let mut done = 0;
                for r in self.runs(offset, data.len()) {
                    self.parts[r.device].set(r.local_offset, &data[done..done + r.len])?;
                    done += r.len;
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
                if dtype.is_quantized() || !offset.is_multiple_of(es) || !out.len().is_multiple_of(es) {
                    return Err(Error::UnsupportedType { dtype, what: "partial read at this offset".into() });
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
                let mut done = 0;
                for r in self.runs(offset, out.len()) {
                    self.parts[r.device].get(r.local_offset, &mut out[done..done + r.len])?;
                    done += r.len;
                }
                Ok(())
            }
        }
    }

    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.check(offset, len)?;
        match &self.state {
            SplitState::Mirrored => self.parts.iter().try_for_each(|p| p.fill(offset, len, value)),
            SplitState::Partial => {
                self.parts[0].fill(offset, len, value)?;
                self.parts[1..].iter().try_for_each(|p| p.fill(offset, len, 0))
            }
            SplitState::Split { .. } => self.runs(offset, len).into_iter().try_for_each(|r| self.parts[r.device].fill(r.local_offset, r.len, value)),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

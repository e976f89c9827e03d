//! Joining per-device results: AllReduce of partial sums (through the family's communicator when it
//! offers one, else through host staging) and gathering split tensors into whole ones.

use crate::buffer::{MetaBuffer, Window};
use crate::split::SplitState;
use ggml_core::backend::{Buffer, Communicator};
use ggml_core::{DType, DataRef, Error, Graph, Layout, Result, TensorId};
use std::sync::Arc;

fn part(graph: &Graph, id: TensorId) -> Result<(DataRef, Layout)> {
    let layout = *graph.layout(id);
    if !layout.is_contiguous() {
        return Err(Error::Other(format!(
            "meta: {} must be contiguous to be joined",
            graph.tensor(id).name
        )));
    }
    Ok((graph.data(id)?, layout))
}

/// Sums the F32 tensors `locals[d]` of `graphs[d]` in place on every device.
pub fn all_reduce(
    graphs: &[Graph],
    locals: &[TensorId],
    comm: Option<&dyn Communicator>,
) -> Result<usize> {
    let parts = locals
        .iter()
        .enumerate()
        .map(|(d, &l)| part(&graphs[d], l))
        .collect::<Result<Vec<_>>>()?;
    let layout = parts[0].1;
    if layout.dtype != DType::F32 {
        return Err(Error::UnsupportedType {
            dtype: layout.dtype,
            what: "meta all-reduce".into(),
        });
    }
    let count = layout.nelements();
    if let Some(c) = comm {
        let data: Vec<DataRef> = parts.iter().map(|p| p.0.clone()).collect();
        c.all_reduce(&data, DType::F32, count)?;
        return Ok(count * 4);
    }
    let mut sum = vec![0f32; count];
    let mut tmp = vec![0f32; count];
    for (i, (d, _)) in parts.iter().enumerate() {
        let target: &mut [f32] = if i == 0 { &mut sum } else { &mut tmp };
        d.buffer.get(d.offset, bytemuck::cast_slice_mut(target))?;
        if i > 0 {
            sum.iter_mut().zip(&tmp).for_each(|(s, t)| *s += t);
        }
    }
    for (d, _) in &parts {
        d.buffer.set(d.offset, bytemuck::cast_slice(&sum))?;
    }
    Ok(count * 4)
}

/// The whole tensor of `layout` from its parts `locals[d]` split as `state`, as bytes.
pub fn assemble(
    graphs: &[Graph],
    locals: &[TensorId],
    layout: Layout,
    state: &SplitState,
) -> Result<Vec<u8>> {
    let full = Layout::contiguous(layout.dtype, layout.ne);
    let mut out = vec![0u8; full.nbytes()];
    match state {
        SplitState::Mirrored => {
            let (d, _) = part(&graphs[0], locals[0])?;
            d.buffer.get(d.offset, &mut out)?;
        }
        SplitState::Partial => {
            all_reduce(graphs, locals, None)?;
            let (d, _) = part(&graphs[0], locals[0])?;
            d.buffer.get(d.offset, &mut out)?;
        }
        SplitState::Split { .. } => {
            let windows = locals
                .iter()
                .enumerate()
                .map(|(d, &l)| {
                    let (data, lay) = part(&graphs[d], l)?;
                    Ok(
                        Arc::new(Window::new(data.buffer, data.offset, lay.nbytes())?)
                            as Arc<dyn Buffer>,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            MetaBuffer::new(full, state.clone(), windows, "gather".into())?.get(0, &mut out)?;
        }
    }
    Ok(out)
}

/// Gathers a split tensor into whole copies `targets[d]` on every device.
pub fn all_gather(
    graphs: &[Graph],
    locals: &[TensorId],
    targets: &[TensorId],
    layout: Layout,
    state: &SplitState,
) -> Result<usize> {
    let bytes = assemble(graphs, locals, layout, state)?;
    for (d, &t) in targets.iter().enumerate() {
        graphs[d].set_bytes(t, &bytes)?;
    }
    Ok(bytes.len())
}

//! Allocation and execution of a case's graph on one backend.

use ggml_core::{Backend, DataRef, Graph, Result};
use std::sync::Arc;

/// Allocates every tensor that owns memory and has none yet, in one buffer of the backend's device.
pub fn alloc(backend: &Arc<dyn Backend>, graph: &mut Graph) -> Result<()> {
    let bt = backend.device().buffer_type();
    let align = bt.alignment().max(1);
    let mut offsets = Vec::new();
    let mut size = 0usize;
    for (k, t) in graph.tensors().iter().enumerate() {
        if t.data.is_none() && t.view.is_none() {
            offsets.push((k, size));
            size += t.nbytes().div_ceil(align) * align;
        }
    }
    let buffer = bt.alloc(size.max(align))?;
    for (k, off) in offsets {
        graph.tensor_mut(ggml_core::TensorId(k as u32)).data = Some(DataRef::new(buffer.clone(), off));
    }
    Ok(())
}

/// Computes the graph's nodes and waits for them.
pub fn compute(backend: &Arc<dyn Backend>, graph: &Graph) -> Result<()> {
    backend.compute(graph, graph.nodes())?;
    backend.synchronize()
}

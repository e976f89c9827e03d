//! gated_delta_net dispatch: `k_gated_delta_net` over the whole batch in one launch, one thread per
//! value column of a head's state (grid: value heads × column tiles of [`DN_THREADS`]).

use super::{args, Launch, Runner, TDesc};
use ggml_core::{Graph, HeadShare, Layout, Result, TensorId};

/// Threads per `k_gated_delta_net` block (value columns of one head).
const DN_THREADS: u32 = 64;
/// Largest key head size (`DN_MAX_DK` in delta_net.cu).
pub const DN_MAX_DK: usize = 256;

/// Whether the kernel takes these operands: F32 throughout, keys of at most [`DN_MAX_DK`].
pub(super) fn supports(src: &[&Layout], dst: &Layout) -> bool {
    src.len() == 5
        && src.iter().all(|l| l.dtype == ggml_core::DType::F32)
        && src[1].ne[0] <= DN_MAX_DK
        && dst.dtype == ggml_core::DType::F32
}

/// Launches the rule of `node` through `r`.
pub(super) fn gated_delta_net(
    r: &dyn Runner,
    graph: &Graph,
    node: TensorId,
    heads: HeadShare,
) -> Result<()> {
    let t = graph.tensor(node);
    let d: Vec<TDesc> = t
        .src
        .iter()
        .map(|&s| r.desc(graph, s))
        .collect::<Result<_>>()?;
    let dst = r.desc(graph, node)?;
    let [dv, nh] = [d[2].ne[0] as usize, d[2].ne[1] as usize];
    let tiled = i32::from(heads == HeadShare::Tiled);
    r.launch(&Launch {
        kernel: "k_gated_delta_net".into(),
        grid: [nh as u32, dv.div_ceil(DN_THREADS as usize) as u32, 1],
        threads: DN_THREADS,
        shared_bytes: 0,
        args: args![d[0], d[1], d[2], d[3], d[4], dst, tiled],
    })
}

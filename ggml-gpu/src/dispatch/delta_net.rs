//! gated_delta_net dispatch: `k_gated_delta_net` over the whole batch in one launch, a group of
//! [`lanes_per_column`] threads per value column of a head's state, each holding
//! [`DN_KEYS_PER_LANE`] keys of it (grid: value heads × column tiles of [`DN_THREADS`] threads).

use super::{args, Launch, Runner, TDesc};
use ggml_core::{Graph, HeadShare, Layout, Result, TensorId};

/// Threads per `k_gated_delta_net` block (groups of lanes, one value column of one head each).
const DN_THREADS: u32 = 128;
/// Largest key head size (`DN_MAX_DK` in delta_net.cu).
pub const DN_MAX_DK: usize = 256;
/// Keys of a column's state each lane keeps in registers (`DN_KEYS_PER_LANE`).
const DN_KEYS_PER_LANE: usize = 32;

/// Lanes per value column for key heads of `dk`: the fewest powers of two from 4 whose
/// [`DN_KEYS_PER_LANE`] keys each hold the column (4 up to 128 keys, 8 up to 256).
fn lanes_per_column(dk: usize) -> usize {
    dk.div_ceil(DN_KEYS_PER_LANE).next_power_of_two().max(4)
}

/// Whether the kernel takes these operands: F32 throughout, keys of at most [`DN_MAX_DK`], a dense
/// result (the outputs, then the final state, one after another).
pub(super) fn supports(src: &[&Layout], dst: &Layout) -> bool {
    src.len() == 5
        && src.iter().all(|l| l.dtype == ggml_core::DType::F32)
        && src[1].ne[0] <= DN_MAX_DK
        && dst.dtype == ggml_core::DType::F32
        && dst.is_contiguous()
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
    let lanes = lanes_per_column(d[1].ne[0] as usize);
    let columns_per_block = DN_THREADS as usize / lanes;
    let tiled = i32::from(heads == HeadShare::Tiled);
    r.launch(&Launch {
        kernel: "k_gated_delta_net".into(),
        grid: [nh as u32, dv.div_ceil(columns_per_block) as u32, 1],
        threads: DN_THREADS,
        shared_bytes: 0,
        args: args![d[0], d[1], d[2], d[3], d[4], dst, tiled, lanes as i32],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_columns_lanes_hold_its_keys_in_one_warp() {
        for dk in 1..=DN_MAX_DK {
            let lanes = lanes_per_column(dk);
            assert!(lanes * DN_KEYS_PER_LANE >= dk, "dk {dk}");
            assert!(
                32usize.is_multiple_of(lanes) && (DN_THREADS as usize).is_multiple_of(lanes),
                "dk {dk}"
            );
        }
        assert_eq!((lanes_per_column(128), lanes_per_column(256)), (4, 8));
    }

    #[test]
    fn constants_match_the_source() {
        let src = crate::kernels::shared_source();
        for (name, value) in [
            ("DN_MAX_DK", DN_MAX_DK),
            ("DN_KEYS_PER_LANE", DN_KEYS_PER_LANE),
        ] {
            assert!(src.contains(&format!("#define {name} {value}\n")), "{name}");
        }
    }
}

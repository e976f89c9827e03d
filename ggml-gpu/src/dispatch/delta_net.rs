//! gated_delta_net dispatch: `k_gated_delta_net` over the whole batch in one launch, a group of
//! [`lanes_per_column`] threads per value column of a head's state, each holding
//! [`DN_KEYS_PER_LANE`] keys of it (grid: value heads × column tiles of [`DN_THREADS`] threads).
//! The copy of the final state that follows the rule in a model's graph (back into the recurrent
//! state, [`state_copy_len`]) joins its launch: the kernel writes the state there too.

use super::fuse::aliasing_is_safe;
use super::{args, Launch, Runner, TDesc};
use ggml_core::{DType, Graph, HeadShare, Layout, Op, Result, TensorId};

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

/// 2 when `nodes` starts with a rule and the copy of its final state (a view of the rule's result
/// at the state, whole, copied to an F32 tensor of the state's shape), as the models write it back.
pub(super) fn state_copy_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    let [rule, copy, ..] = *nodes else {
        return None;
    };
    let r = graph.tensor(rule);
    let c = graph.tensor(copy);
    let fusing = crate::settings::settings().fuse_chains;
    if !fusing || !matches!(r.op, Op::GatedDeltaNet { .. }) || c.op != Op::Cpy {
        return None;
    }
    let src: Vec<&Layout> = r.src.iter().map(|&s| graph.layout(s)).collect();
    if !supports(&src, &r.layout) {
        return None;
    }
    let s0 = src[4];
    let v = graph.tensor(c.src[0]);
    let outputs = src[2].ne[..2].iter().product::<usize>() * src[1].ne[2];
    let at_state = Op::View {
        offset: outputs * DType::F32.type_size(),
    };
    let whole_state =
        v.op == at_state && v.src[0] == rule && v.layout.is_contiguous() && v.layout.ne == s0.ne;
    (whole_state && c.layout.dtype == DType::F32 && c.layout.ne == s0.ne).then_some(2)
}

/// Launches the rule `group[0]` and the copy of its state `group[1]` (from [`state_copy_len`]) as
/// one `k_gated_delta_net`; `false` (nothing launched) when the copy's target overlaps another
/// operand other than exactly.
pub(super) fn launch_with_state_copy(
    r: &dyn Runner,
    graph: &Graph,
    group: &[TensorId],
) -> Result<bool> {
    let Op::GatedDeltaNet { heads } = graph.tensor(group[0]).op else {
        unreachable!("state_copy_len checked the rule")
    };
    let target = r.desc(graph, group[1])?;
    let (operands, dst) = descs(r, graph, group[0])?;
    if !aliasing_is_safe(&[target, dst], &operands) {
        return Ok(false);
    }
    launch(r, (&operands, dst), heads, target)?;
    Ok(true)
}

/// Launches the rule of `node` through `r`.
pub(super) fn gated_delta_net(
    r: &dyn Runner,
    graph: &Graph,
    node: TensorId,
    heads: HeadShare,
) -> Result<()> {
    let (operands, dst) = descs(r, graph, node)?;
    launch(r, (&operands, dst), heads, TDesc::absent())
}

/// The operands and the result of the rule `node`.
fn descs(r: &dyn Runner, graph: &Graph, node: TensorId) -> Result<(Vec<TDesc>, TDesc)> {
    let operands = graph
        .tensor(node)
        .src
        .iter()
        .map(|&s| r.desc(graph, s))
        .collect::<Result<_>>()?;
    Ok((operands, r.desc(graph, node)?))
}

/// The rule over operands `d` into `dst`, its final state also copied to `copy` unless that is
/// absent.
fn launch(
    r: &dyn Runner,
    (d, dst): (&[TDesc], TDesc),
    heads: HeadShare,
    copy: TDesc,
) -> Result<()> {
    let [dv, nh] = [d[2].ne[0] as usize, d[2].ne[1] as usize];
    let lanes = lanes_per_column(d[1].ne[0] as usize);
    let columns_per_block = DN_THREADS as usize / lanes;
    let tiled = i32::from(heads == HeadShare::Tiled);
    r.launch(&Launch {
        kernel: "k_gated_delta_net".into(),
        grid: [nh as u32, dv.div_ceil(columns_per_block) as u32, 1],
        threads: DN_THREADS,
        shared_bytes: 0,
        args: args![d[0], d[1], d[2], d[3], d[4], dst, copy, tiled, lanes as i32],
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

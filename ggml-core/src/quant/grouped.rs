//! The regrouped layouts of Q4_0 and Q8_0 ([`DType::Q4_0G`], [`DType::Q8_0G`]), which GPUs keep
//! weights in: a row's blocks in groups of [`GROUP_BLOCKS`]; in a group, the 16-byte halves of the
//! blocks' quants (half `h` of block `j` at `512 h + 16 j`: Q4_0 has one half, Q8_0 two), then the
//! blocks' f16 scales (block `j`'s at `16 GROUP_BLOCKS q + 2 j`, `q` the halves per block). A group
//! takes the bytes its blocks take in GGUF, so rows and tensors keep their sizes, and converting is
//! a permutation within each group.

use super::check_row;
use crate::dtype::{DType, GROUP_BLOCKS};
use crate::error::{Error, Result};

/// Bytes of a 16-byte half of a block's quants.
const HALF: usize = 16;
/// Bytes of a block's f16 scale (the first bytes of a Q4_0 / Q8_0 block).
const SCALE: usize = 2;

/// 16-byte halves of quants per block of `base` (Q4_0: 1, Q8_0: 2).
fn halves(base: DType) -> usize {
    (base.type_size() - SCALE) / HALF
}

/// The grouped type whose blocks are `base`'s, or an error for a type without a regrouped layout.
fn grouped_of(base: DType) -> Result<DType> {
    base.grouped().ok_or_else(|| Error::UnsupportedType {
        dtype: base,
        what: "regrouping".to_string(),
    })
}

/// Checks that `bytes` is a whole number of groups of `grouped`.
fn check_groups(op: &'static str, grouped: DType, bytes: usize) -> Result<()> {
    let n = bytes / grouped.type_size() * grouped.block_size();
    check_row(op, grouped, n, bytes)
}

/// Where the pieces of a group's blocks go: (offset in the regrouped layout, offset in GGUF's,
/// bytes) of each 16-byte half of quants and each scale.
fn pieces(base: DType) -> Vec<(usize, usize, usize)> {
    let (bs, q) = (base.type_size(), halves(base));
    let mut out = Vec::with_capacity(GROUP_BLOCKS * (q + 1));
    for j in 0..GROUP_BLOCKS {
        for h in 0..q {
            out.push((
                GROUP_BLOCKS * HALF * h + HALF * j,
                bs * j + SCALE + HALF * h,
                HALF,
            ));
        }
        out.push((GROUP_BLOCKS * HALF * q + SCALE * j, bs * j, SCALE));
    }
    out
}

/// `src`, whole groups of `grouped`, into `dst` (as long) with every group's pieces moved into the
/// regrouped layout (`into_groups`) or back into GGUF's.
fn permute(grouped: DType, src: &[u8], dst: &mut [u8], into_groups: bool) -> Result<()> {
    let op = if into_groups { "regroup" } else { "ungroup" };
    check_groups(op, grouped, src.len())?;
    if dst.len() != src.len() {
        return Err(Error::Shape {
            op,
            msg: format!("{} bytes into {}", src.len(), dst.len()),
        });
    }
    let pieces = pieces(grouped.base());
    let size = grouped.type_size();
    for (s, d) in src.chunks_exact(size).zip(dst.chunks_exact_mut(size)) {
        for &(at_group, at_file, n) in &pieces {
            let (from, to) = if into_groups {
                (at_file, at_group)
            } else {
                (at_group, at_file)
            };
            d[to..to + n].copy_from_slice(&s[from..from + n]);
        }
    }
    Ok(())
}

/// [`regroup`] into `dst`, which is as long as `src`: callers may cut a tensor at whole groups
/// and regroup the pieces in parallel.
pub fn regroup_into(base: DType, src: &[u8], dst: &mut [u8]) -> Result<()> {
    permute(grouped_of(base)?, src, dst, true)
}

/// `src`, whole groups of [`GROUP_BLOCKS`] `base` blocks (Q4_0 or Q8_0, GGUF layout), in the
/// regrouped layout of [`DType::grouped`].
pub fn regroup(base: DType, src: &[u8]) -> Result<Vec<u8>> {
    let mut dst = vec![0u8; src.len()];
    regroup_into(base, src, &mut dst)?;
    Ok(dst)
}

/// `src`, whole groups of the regrouped type `grouped`, back in its base type's GGUF layout.
pub fn ungroup(grouped: DType, src: &[u8]) -> Result<Vec<u8>> {
    if grouped.base().grouped() != Some(grouped) {
        return Err(Error::UnsupportedType {
            dtype: grouped,
            what: "ungrouping".to_string(),
        });
    }
    let mut dst = vec![0u8; src.len()];
    permute(grouped, src, &mut dst, false)?;
    Ok(dst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize_to_vec};

    #[test]
    fn regrouping_permutes_whole_groups_and_ungrouping_restores_them() {
        for base in [DType::Q4_0, DType::Q8_0] {
            let g = base.grouped().unwrap();
            let x: Vec<f32> = (0..3 * 1024)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let q = quantize_to_vec(base, &x).unwrap();
            let r = regroup(base, &q).unwrap();
            assert_ne!(r, q);
            assert_eq!(ungroup(g, &r).unwrap(), q);
            // Block 5 of group 1: its scale and first quant byte where the layout puts them.
            let (group, bs) = (&r[g.type_size()..2 * g.type_size()], base.type_size());
            let block = &q[g.type_size() + 5 * bs..g.type_size() + 6 * bs];
            let scales = GROUP_BLOCKS * bs - GROUP_BLOCKS * SCALE;
            assert_eq!(group[scales + 10..scales + 12], block[..2]);
            assert_eq!(group[80], block[2]);
            // Both layouts decode to the same values.
            assert_eq!(
                dequantize_to_vec(g, &r).unwrap(),
                dequantize_to_vec(base, &q).unwrap()
            );
        }
    }

    #[test]
    fn partial_groups_and_types_without_a_layout_are_refused() {
        let q = vec![0u8; DType::Q4_0.type_size() * 31];
        assert!(regroup(DType::Q4_0, &q).is_err());
        assert!(regroup(DType::Q4_1, &vec![0u8; 20 * 32]).is_err());
        assert!(ungroup(DType::Q4_0, &vec![0u8; 576]).is_err());
        assert!(ungroup(DType::Q4_0G, &vec![0u8; 575]).is_err());
    }
}

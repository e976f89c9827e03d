//! Split states of tensors on the meta device and the arithmetic of slices: how a dimension is cut
//! into per-device slices for given ratios, rounded to a granularity (whole quant blocks, whole GQA
//! groups), with the remainder rotating so that memory stays even across layers.

use std::fmt;

/// One segment of a split axis: its full length and the length each device holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    pub len: usize,
    pub slices: Vec<usize>,
}

impl Segment {
    /// Offset of device `d`'s slice inside the full segment.
    pub fn start_of(&self, d: usize) -> usize {
        self.slices[..d].iter().sum()
    }
}

/// How a tensor's data is distributed over the devices of a meta device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SplitState {
    /// Every device holds the whole tensor.
    Mirrored,
    /// Cut along `axis`; the axis is a concatenation of segments (one for a plain tensor, several for a
    /// fused one such as QKV), each cut into per-device slices.
    Split { axis: usize, segments: Vec<Segment> },
    /// Every device holds a full-shaped summand; the value is the sum over devices.
    Partial,
}

impl SplitState {
    /// Length of `axis` held by device `d` (the sum of its slices over segments).
    pub fn local_len(&self, d: usize) -> Option<usize> {
        match self {
            SplitState::Split { segments, .. } => Some(segments.iter().map(|s| s.slices[d]).sum()),
            _ => None,
        }
    }

    /// The split axis, if any.
    pub fn axis(&self) -> Option<usize> {
        match self {
            SplitState::Split { axis, .. } => Some(*axis),
            _ => None,
        }
    }

    /// Shape of device `d`'s part of a tensor of full shape `ne`.
    pub fn local_shape(&self, ne: [usize; 4], d: usize) -> [usize; 4] {
        let mut out = ne;
        if let SplitState::Split { axis, .. } = self {
            out[*axis] = self.local_len(d).unwrap_or(0);
        }
        out
    }
}

impl fmt::Display for SplitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitState::Mirrored => f.write_str("mirrored"),
            SplitState::Partial => f.write_str("partial"),
            SplitState::Split { axis, segments } => {
                write!(f, "split(axis {axis}")?;
                for s in segments {
                    write!(f, ", {}={:?}", s.len, s.slices)?;
                }
                f.write_str(")")
            }
        }
    }
}

/// Errors of split arithmetic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SplitError {
    #[error("length {len} is not a multiple of the granularity {granularity}")]
    Granularity { len: usize, granularity: usize },
    #[error("invalid ratios {0:?}: need at least one device and non-negative finite ratios with a positive sum")]
    Ratios(Vec<f32>),
}

/// Cuts `len` into one slice per ratio, each a multiple of `granularity`, as close to the ratios as the
/// granularity allows. Units left over after rounding down go to the devices with the largest
/// fractional parts, ties broken starting at device `rotate % n` so that successive layers (passing
/// their index) spread the remainder evenly.
pub fn split_sizes(
    len: usize,
    granularity: usize,
    ratios: &[f32],
    rotate: usize,
) -> Result<Vec<usize>, SplitError> {
    let g = granularity.max(1);
    if !len.is_multiple_of(g) {
        return Err(SplitError::Granularity {
            len,
            granularity: g,
        });
    }
    let total: f64 = ratios.iter().map(|&r| r as f64).sum();
    if ratios.is_empty() || ratios.iter().any(|r| !r.is_finite() || *r < 0.0) || total <= 0.0 {
        return Err(SplitError::Ratios(ratios.to_vec()));
    }
    let n = ratios.len();
    let units = len / g;
    let exact: Vec<f64> = ratios
        .iter()
        .map(|&r| units as f64 * r as f64 / total)
        .collect();
    let mut out: Vec<usize> = exact.iter().map(|&e| e.floor() as usize).collect();
    let assigned: usize = out.iter().sum();
    let mut order: Vec<usize> = (0..n).filter(|&d| ratios[d] > 0.0).collect();
    // Largest fractional part first; among equal parts, rotation decides.
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.partial_cmp(&fa)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(((a + n - rotate % n) % n).cmp(&((b + n - rotate % n) % n)))
    });
    for &d in order.iter().cycle().take(units.saturating_sub(assigned)) {
        out[d] += 1;
    }
    Ok(out.into_iter().map(|u| u * g).collect())
}

/// A segment of `len` cut by [`split_sizes`].
pub fn segment(
    len: usize,
    granularity: usize,
    ratios: &[f32],
    rotate: usize,
) -> Result<Segment, SplitError> {
    Ok(Segment {
        len,
        slices: split_sizes(len, granularity, ratios, rotate)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn even_uneven_and_zero_slices() {
        assert_eq!(
            split_sizes(4096, 32, &[1.0, 1.0], 0).unwrap(),
            vec![2048, 2048]
        );
        assert_eq!(
            split_sizes(4096, 32, &[3.0, 1.0], 0).unwrap(),
            vec![3072, 1024]
        );
        assert_eq!(
            split_sizes(8, 1, &[1.0, 1.0, 0.0], 0).unwrap(),
            vec![4, 4, 0]
        );
        // 4 KV heads over 8 devices: half the devices hold none.
        let s = split_sizes(4, 1, &[1.0; 8], 0).unwrap();
        assert_eq!(s.iter().sum::<usize>(), 4);
        assert_eq!(s.iter().filter(|&&x| x == 0).count(), 4);
        assert!(split_sizes(33, 32, &[1.0], 0).is_err());
        assert!(split_sizes(32, 32, &[0.0, 0.0], 0).is_err());
        assert!(split_sizes(32, 32, &[], 0).is_err());
    }

    #[test]
    fn remainder_rotates_across_layers() {
        let mut per_device = [0usize; 3];
        for layer in 0..3 {
            for (d, s) in split_sizes(4, 1, &[1.0, 1.0, 1.0], layer)
                .unwrap()
                .into_iter()
                .enumerate()
            {
                per_device[d] += s;
            }
        }
        assert_eq!(per_device, [4, 4, 4]);
    }

    proptest! {
        #[test]
        fn slices_sum_to_the_length_and_respect_granularity(
            units in 0usize..2000,
            g in prop::sample::select(vec![1usize, 2, 8, 32, 256]),
            ratios in prop::collection::vec(0u8..5, 1..9),
            rotate in 0usize..16,
        ) {
            let ratios: Vec<f32> = ratios.into_iter().map(f32::from).collect();
            prop_assume!(ratios.iter().sum::<f32>() > 0.0);
            let s = split_sizes(units * g, g, &ratios, rotate).unwrap();
            prop_assert_eq!(s.len(), ratios.len());
            prop_assert_eq!(s.iter().sum::<usize>(), units * g);
            let total: f32 = ratios.iter().sum();
            for (d, &x) in s.iter().enumerate() {
                prop_assert_eq!(x % g, 0);
                if ratios[d] == 0.0 { prop_assert_eq!(x, 0); }
                // Within one granule of the exact share.
                let exact = (units * g) as f32 * ratios[d] / total;
                prop_assert!((x as f32 - exact).abs() <= g as f32 + 1e-3 * exact.max(1.0));
            }
        }
    }
}

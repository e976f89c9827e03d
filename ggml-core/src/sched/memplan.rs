//! Compute-memory planning: places tensors with known lifetimes (first and last step they are live)
//! at offsets in one buffer so that tensors alive at the same time never overlap. Greedy by size,
//! best fit among the gaps left by already placed tensors whose lifetimes overlap.

/// One tensor to place: its size in bytes and the inclusive range of steps it must stay intact.
#[derive(Clone, Copy, Debug)]
pub struct Lifetime {
    pub size: usize,
    pub first: usize,
    pub last: usize,
}

impl Lifetime {
    fn overlaps(&self, o: &Lifetime) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// Offsets for each item (same order as `items`) and the total buffer size; offsets are multiples of
/// `align`.
pub fn place(items: &[Lifetime], align: usize) -> (Vec<usize>, usize) {
    let align = align.max(1);
    let round = |v: usize| v.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        items[b]
            .size
            .cmp(&items[a].size)
            .then(items[a].first.cmp(&items[b].first))
    });
    let mut offsets = vec![0usize; items.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(items.len());
    let mut total = 0usize;
    for &i in &order {
        let it = items[i];
        let size = round(it.size);
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| items[j].overlaps(&it))
            .map(|&j| (offsets[j], offsets[j] + round(items[j].size)))
            .collect();
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = 0usize;
        for &(start, end) in &busy {
            if start > cursor {
                let gap = start - cursor;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        let offset = best.map(|(_, o)| o).unwrap_or(cursor);
        offsets[i] = offset;
        total = total.max(offset + size);
        placed.push(i);
    }
    (offsets, total)
}

/// The liveness lower bound: the largest total size of items alive at one step.
pub fn lower_bound(items: &[Lifetime], align: usize) -> usize {
    let align = align.max(1);
    let mut events: Vec<(usize, bool, usize)> = Vec::with_capacity(items.len() * 2);
    for it in items {
        let size = it.size.div_ceil(align) * align;
        events.push((it.first, true, size));
        events.push((it.last + 1, false, size));
    }
    // Releases before allocations at the same step.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut live, mut peak) = (0usize, 0usize);
    for (_, alloc, size) in events {
        if alloc {
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_lifetimes_never_share_bytes() {
        let items: Vec<Lifetime> = (0..200)
            .map(|i| Lifetime {
                size: 64 + (i * 37) % 1000,
                first: i % 50,
                last: i % 50 + (i % 7),
            })
            .collect();
        let (off, total) = place(&items, 32);
        for a in 0..items.len() {
            assert_eq!(off[a] % 32, 0);
            assert!(off[a] + items[a].size <= total);
            for b in a + 1..items.len() {
                if items[a].overlaps(&items[b]) {
                    let disjoint =
                        off[a] + items[a].size <= off[b] || off[b] + items[b].size <= off[a];
                    assert!(disjoint, "items {a} and {b} overlap in time and space");
                }
            }
        }
        assert!(total >= lower_bound(&items, 32));
    }

    #[test]
    fn a_chain_reuses_memory() {
        let items: Vec<Lifetime> = (0..10)
            .map(|i| Lifetime {
                size: 100,
                first: i,
                last: i + 1,
            })
            .collect();
        let (_, total) = place(&items, 1);
        assert_eq!(total, 200);
        assert_eq!(lower_bound(&items, 1), 200);
    }
}

//! The pair-merge loop shared by the SentencePiece and BPE tokenizers.
//!
//! A text is cut into UTF-8 characters held in a linked list of symbols. Every adjacent pair that
//! may merge goes into a binary heap with a priority (a merge rank for BPE, a token score for
//! SentencePiece); ties go to the leftmost pair. The best pair is merged, and its new neighbours are
//! queued. A popped pair whose symbols changed since it was queued (one was merged away, or the
//! right one grew) is skipped: its stored size no longer matches.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A symbol: a byte range of the text, linked to its neighbours. Merged-away symbols have `len` 0.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A queued pair: the priority first, so that the heap's order is the merge order.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Pair<K> {
    priority: K,
    left: Reverse<usize>,
    right: usize,
    size: usize,
}

/// The symbols of a text being merged.
pub(crate) struct Symbols<'t> {
    text: &'t str,
    symbols: Vec<Symbol>,
}

impl<'t> Symbols<'t> {
    /// One symbol per UTF-8 character of `text`.
    pub fn chars(text: &'t str) -> Symbols<'t> {
        let mut symbols = Vec::with_capacity(text.len());
        for (i, (start, ch)) in text.char_indices().enumerate() {
            let len = ch.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < text.len()).then_some(i + 1),
            });
        }
        Symbols { text, symbols }
    }

    /// A single symbol holding all of `text`.
    pub fn whole(text: &'t str) -> Symbols<'t> {
        let symbols = vec![Symbol {
            start: 0,
            len: text.len(),
            prev: None,
            next: None,
        }];
        Symbols { text, symbols }
    }

    /// Merges pairs while any has a priority. `priority(left, right, joined)` gives the priority of
    /// merging two adjacent symbols (higher merges first), or `None` if they do not merge.
    pub fn merge<K: Ord>(&mut self, priority: impl Fn(&str, &str, &str) -> Option<K>) {
        let mut queue = BinaryHeap::new();
        for i in 1..self.symbols.len() {
            self.push(i - 1, i, &priority, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (li, ri) = (pair.left.0, pair.right);
            let (l, r) = (self.symbols[li], self.symbols[ri]);
            if l.len == 0 || r.len == 0 || l.len + r.len != pair.size {
                continue;
            }
            self.symbols[li].len += r.len;
            self.symbols[ri].len = 0;
            self.symbols[li].next = r.next;
            if let Some(n) = r.next {
                self.symbols[n].prev = Some(li);
            }
            if let Some(p) = l.prev {
                self.push(p, li, &priority, &mut queue);
            }
            if let Some(n) = r.next {
                self.push(li, n, &priority, &mut queue);
            }
        }
    }

    fn push<K: Ord>(
        &self,
        left: usize,
        right: usize,
        priority: &impl Fn(&str, &str, &str) -> Option<K>,
        queue: &mut BinaryHeap<Pair<K>>,
    ) {
        let (l, r) = (&self.symbols[left], &self.symbols[right]);
        let size = l.len + r.len;
        let lt = &self.text[l.start..l.start + l.len];
        let rt = &self.text[r.start..r.start + r.len];
        let joined = &self.text[l.start..l.start + size];
        if let Some(p) = priority(lt, rt, joined) {
            queue.push(Pair {
                priority: p,
                left: Reverse(left),
                right,
                size,
            });
        }
    }

    /// The texts of the remaining symbols, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &'t str> + '_ {
        self.symbols
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| &self.text[s.start..s.start + s.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_best_pair_first_and_leftmost_on_ties() {
        // "aaa": both pairs tie, the left one merges, then "aa"+"a" has no priority.
        let mut s = Symbols::chars("aaa");
        s.merge(|_, _, j| (j == "aa").then_some(1));
        assert_eq!(s.pieces().collect::<Vec<_>>(), vec!["aa", "a"]);
        // "abc": "bc" outranks "ab".
        let mut s = Symbols::chars("abc");
        s.merge(|_, _, j| match j {
            "ab" => Some(1),
            "bc" => Some(2),
            _ => None,
        });
        assert_eq!(s.pieces().collect::<Vec<_>>(), vec!["a", "bc"]);
    }
}

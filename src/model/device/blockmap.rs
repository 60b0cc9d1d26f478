//! The block map of one device: blocks by address, in short sorted chunks.
//!
//! A `BTreeMap<u64, Block>` costs one descent per lookup, and applying a
//! free took five to seven of them (the block, its right neighbour, its
//! left neighbour, the removals). Here the blocks are kept in address order
//! in chunks of at most [`CHUNK_MAX`] entries, with the first address of
//! every chunk in a separate sorted vector. A lookup is two binary searches
//! (the chunk, then the block in it), and it yields a [`Pos`] from which
//! the neighbours are one index away: an allocation or a free with its
//! merges costs one lookup.
//!
//! Memory: 88 bytes a block (`(u64, Block)`), chunks grown by doubling and
//! shrunk when a quarter full, plus 32 bytes a chunk.

use std::ops::{Bound, Range, RangeBounds};

use super::Block;

/// Most entries in one chunk; a fuller one is split in two.
const CHUNK_MAX: usize = 32;

type Entry = (u64, Block);

/// Blocks by address (see the module documentation).
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockMap {
    /// The first address of each chunk, ascending.
    firsts: Vec<u64>,
    /// Non-empty chunks in address order; every address of chunk `i` is
    /// below `firsts[i + 1]`.
    chunks: Vec<Vec<Entry>>,
    len: usize,
}

/// Where an entry is: chunk and index. Valid until the map changes (except
/// as the methods that change it say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    c: usize,
    i: usize,
}

impl BlockMap {
    /// A map of entries already sorted by address, without duplicates.
    pub(crate) fn from_sorted(entries: impl IntoIterator<Item = Entry>) -> Self {
        let mut map = Self::default();
        let mut chunk: Vec<Entry> = Vec::new();
        for e in entries {
            debug_assert!(map.len == 0 || chunk.last().is_none_or(|l| l.0 < e.0));
            chunk.push(e);
            map.len += 1;
            if chunk.len() == CHUNK_MAX / 2 {
                map.firsts.push(chunk[0].0);
                map.chunks.push(std::mem::take(&mut chunk));
            }
        }
        if !chunk.is_empty() {
            map.firsts.push(chunk[0].0);
            map.chunks.push(chunk);
        }
        map
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.firsts.capacity() * size_of::<u64>()
            + self.chunks.capacity() * size_of::<Vec<Entry>>()
            + (self.chunks.iter())
                .map(|c| c.capacity() * size_of::<Entry>())
                .sum::<usize>()
    }

    /// The chunk that holds `k` if anything does (the last one starting at
    /// or before `k`).
    #[inline]
    fn chunk_of(&self, k: u64) -> Option<usize> {
        self.firsts.partition_point(|&f| f <= k).checked_sub(1)
    }

    /// The entry at address `k`.
    #[inline]
    pub(crate) fn find(&self, k: u64) -> Option<Pos> {
        let c = self.chunk_of(k)?;
        let i = self.chunks[c].binary_search_by_key(&k, |e| e.0).ok()?;
        Some(Pos { c, i })
    }

    /// The entry with the greatest address at or below `k`.
    #[inline]
    pub(crate) fn find_le(&self, k: u64) -> Option<Pos> {
        let c = self.chunk_of(k)?;
        // The chunk's first address is at most `k`, so `i ≥ 1`.
        let i = self.chunks[c].partition_point(|e| e.0 <= k) - 1;
        Some(Pos { c, i })
    }

    #[inline]
    pub(crate) fn at(&self, p: Pos) -> (u64, &Block) {
        let e = &self.chunks[p.c][p.i];
        (e.0, &e.1)
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, p: Pos) -> &mut Block {
        &mut self.chunks[p.c][p.i].1
    }

    /// The entry after `p`.
    #[inline]
    pub(crate) fn next(&self, p: Pos) -> Option<Pos> {
        if p.i + 1 < self.chunks[p.c].len() {
            Some(Pos { c: p.c, i: p.i + 1 })
        } else if p.c + 1 < self.chunks.len() {
            Some(Pos { c: p.c + 1, i: 0 })
        } else {
            None
        }
    }

    /// The entry before `p`.
    #[inline]
    pub(crate) fn prev(&self, p: Pos) -> Option<Pos> {
        if p.i > 0 {
            Some(Pos { c: p.c, i: p.i - 1 })
        } else if p.c > 0 {
            Some(Pos {
                c: p.c - 1,
                i: self.chunks[p.c - 1].len() - 1,
            })
        } else {
            None
        }
    }

    /// Insert `(k, b)` right after `p`; the caller guarantees that `k`
    /// lies between `p`'s address and the next one. Returns the new entry's
    /// position (`p` stays valid only when it is returned unsplit: use the
    /// returned one).
    pub(crate) fn insert_after(&mut self, p: Pos, k: u64, b: Block) -> Pos {
        debug_assert!(self.chunks[p.c][p.i].0 < k);
        debug_assert!(self.next(p).is_none_or(|n| k < self.at(n).0));
        self.chunks[p.c].insert(p.i + 1, (k, b));
        self.len += 1;
        let at = Pos { c: p.c, i: p.i + 1 };
        self.split_if_full(at)
    }

    /// Split the chunk of `at` when it is over the limit; returns where the
    /// entry of `at` is afterwards.
    fn split_if_full(&mut self, at: Pos) -> Pos {
        let c = at.c;
        if self.chunks[c].len() <= CHUNK_MAX {
            return at;
        }
        let half = self.chunks[c].len() / 2;
        let tail = self.chunks[c].split_off(half);
        self.firsts.insert(c + 1, tail[0].0);
        self.chunks.insert(c + 1, tail);
        if at.i >= half {
            Pos {
                c: c + 1,
                i: at.i - half,
            }
        } else {
            at
        }
    }

    /// Remove the entry at `p`. Positions before `p` stay valid.
    pub(crate) fn remove_at(&mut self, p: Pos) -> Entry {
        let chunk = &mut self.chunks[p.c];
        let e = chunk.remove(p.i);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(p.c);
            self.firsts.remove(p.c);
        } else {
            if p.i == 0 {
                self.firsts[p.c] = chunk[0].0;
            }
            if chunk.capacity() > CHUNK_MAX && chunk.len() * 4 < chunk.capacity() {
                chunk.shrink_to(chunk.len() * 2);
            }
        }
        e
    }

    pub(crate) fn get(&self, k: &u64) -> Option<&Block> {
        self.find(*k).map(|p| self.at(p).1)
    }

    pub(crate) fn get_mut(&mut self, k: &u64) -> Option<&mut Block> {
        let p = self.find(*k)?;
        Some(self.at_mut(p))
    }

    /// Insert or replace the block at `k`; returns the one replaced.
    pub(crate) fn insert(&mut self, k: u64, b: Block) -> Option<Block> {
        match self.find_le(k) {
            Some(p) if self.at(p).0 == k => Some(std::mem::replace(self.at_mut(p), b)),
            Some(p) => {
                self.insert_after(p, k, b);
                None
            }
            None if self.chunks.is_empty() => {
                self.firsts.push(k);
                self.chunks.push(vec![(k, b)]);
                self.len += 1;
                None
            }
            None => {
                // Below every address: at the start of the first chunk.
                self.chunks[0].insert(0, (k, b));
                self.firsts[0] = k;
                self.len += 1;
                self.split_if_full(Pos { c: 0, i: 0 });
                None
            }
        }
    }

    /// Remove the block at `k`.
    pub(crate) fn remove(&mut self, k: &u64) -> Option<Block> {
        let p = self.find(*k)?;
        Some(self.remove_at(p).1)
    }

    /// The chunks that may hold addresses in `(lo, hi)`.
    fn chunk_span(&self, lo: Bound<u64>, hi: Bound<u64>) -> Range<usize> {
        let a = match lo {
            Bound::Included(s) | Bound::Excluded(s) => self.chunk_of(s).unwrap_or(0),
            Bound::Unbounded => 0,
        };
        let b = match hi {
            Bound::Included(e) => self.firsts.partition_point(|&f| f <= e),
            Bound::Excluded(e) => self.firsts.partition_point(|&f| f < e),
            Bound::Unbounded => self.firsts.len(),
        };
        a..b.max(a)
    }

    /// Blocks with addresses in `r`, in address order.
    pub(crate) fn range<R: RangeBounds<u64>>(
        &self,
        r: R,
    ) -> impl DoubleEndedIterator<Item = (&u64, &Block)> + '_ {
        let (lo, hi) = (r.start_bound().cloned(), r.end_bound().cloned());
        self.chunks[self.chunk_span(lo, hi)]
            .iter()
            .flat_map(move |c| c[slice_of(c, lo, hi)].iter().map(|e| (&e.0, &e.1)))
    }

    /// Blocks with addresses in `r`, in address order, to change.
    pub(crate) fn range_mut<R: RangeBounds<u64>>(
        &mut self,
        r: R,
    ) -> impl DoubleEndedIterator<Item = (&u64, &mut Block)> + '_ {
        let (lo, hi) = (r.start_bound().cloned(), r.end_bound().cloned());
        let span = self.chunk_span(lo, hi);
        self.chunks[span].iter_mut().flat_map(move |c| {
            let s = slice_of(c, lo, hi);
            c[s].iter_mut().map(|e| {
                let (k, b) = e;
                (&*k, b)
            })
        })
    }

    /// All blocks in address order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &Block)> + '_ {
        self.chunks.iter().flatten().map(|e| (&e.0, &e.1))
    }

    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &Block> + '_ {
        self.chunks.iter().flatten().map(|e| &e.1)
    }
}

/// The part of `chunk` with addresses in `(lo, hi)`.
fn slice_of(chunk: &[Entry], lo: Bound<u64>, hi: Bound<u64>) -> Range<usize> {
    let a = match lo {
        Bound::Included(s) => chunk.partition_point(|e| e.0 < s),
        Bound::Excluded(s) => chunk.partition_point(|e| e.0 <= s),
        Bound::Unbounded => 0,
    };
    let b = match hi {
        Bound::Included(e) => chunk.partition_point(|x| x.0 <= e),
        Bound::Excluded(e) => chunk.partition_point(|x| x.0 < e),
        Bound::Unbounded => chunk.len(),
    };
    a..b.max(a)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::event::{BlockState, PoolId};
    use crate::model::attrib::Origin;

    fn block(size: u64) -> Block {
        Block {
            size,
            requested: 0,
            stream: 0,
            pool: PoolId(0, 0),
            segment: 0,
            since_ns: 0,
            state: BlockState::Inactive,
            expandable: false,
            origin: Origin::default(),
        }
    }

    fn check(m: &BlockMap, r: &BTreeMap<u64, Block>) {
        assert_eq!(m.len(), r.len());
        let a: Vec<_> = m.iter().map(|(k, b)| (*k, *b)).collect();
        let b: Vec<_> = r.iter().map(|(k, b)| (*k, *b)).collect();
        assert_eq!(a, b);
        for (i, c) in m.chunks.iter().enumerate() {
            assert!(!c.is_empty() && c.len() <= CHUNK_MAX);
            assert_eq!(m.firsts[i], c[0].0);
        }
    }

    proptest! {
        /// The map behaves as a `BTreeMap` under inserts, removals, ranges
        /// and neighbour walks.
        #[test]
        fn same_as_btreemap(ops in proptest::collection::vec((0u8..6, 0u64..400, 0u64..400), 0..600)) {
            let mut m = BlockMap::default();
            let mut r = BTreeMap::new();
            for (op, k, k2) in ops {
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(k, block(k2)), r.insert(k, block(k2))),
                    2 => prop_assert_eq!(m.remove(&k), r.remove(&k)),
                    3 => {
                        let (lo, hi) = (k.min(k2), k.max(k2));
                        let a: Vec<_> = m.range(lo..hi).map(|(k, _)| *k).collect();
                        let b: Vec<_> = r.range(lo..hi).map(|(k, _)| *k).collect();
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = m.range(..=hi).rev().map(|(k, _)| *k).collect();
                        let b: Vec<_> = r.range(..=hi).rev().map(|(k, _)| *k).collect();
                        prop_assert_eq!(a, b);
                    }
                    4 => {
                        let a = m.find_le(k).map(|p| m.at(p).0);
                        let b = r.range(..=k).next_back().map(|(k, _)| *k);
                        prop_assert_eq!(a, b);
                        if let Some(p) = m.find_le(k) {
                            let n = m.next(p).map(|n| m.at(n).0);
                            prop_assert_eq!(n, r.range(m.at(p).0 + 1..).next().map(|(k, _)| *k));
                            let q = m.prev(p).map(|q| m.at(q).0);
                            prop_assert_eq!(q, r.range(..m.at(p).0).next_back().map(|(k, _)| *k));
                        }
                    }
                    _ => {
                        for (_, b) in m.range_mut(k.min(k2)..k.max(k2)) {
                            b.size += 1;
                        }
                        for (_, b) in r.range_mut(k.min(k2)..k.max(k2)) {
                            b.size += 1;
                        }
                    }
                }
                check(&m, &r);
            }
            let rebuilt = BlockMap::from_sorted(r.iter().map(|(k, b)| (*k, *b)));
            check(&rebuilt, &r);
        }
    }
}

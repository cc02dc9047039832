//! The model's tables, shared between one model and the next.
//!
//! A model is immutable and swapped whole (spec/model.md §13), yet a registry change touches a
//! few services of thousands: the next model must not be a copy of every table. [`Table`] is a
//! hash map cut into shards, each behind an `Arc`, and [`Sorted`] a sorted list cut into chunks
//! the same way. Cloning either copies one pointer; a write to the clone copies the spine (a
//! pointer per shard) once and the shard it lands in, and leaves every other shard shared with
//! the model it was cloned from. A shard holds about [`SHARD`] entries whatever the table's size,
//! so a change costs the same at 200 services as at 20,000.
//!
//! Written here rather than taken from a crate: the persistent maps of crates.io (`im`, `imbl`,
//! `rpds`) are under the MPL-2.0, outside the licences `deny.toml` allows, and the two shapes
//! the model needs are short. Lookups stay those of std's `HashMap` after one more hash.

use crate::prelude::*;

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;

/// Entries per shard when a table is built, and per chunk of a [`Sorted`] list.
pub const SHARD: usize = 32;

/// A table is cut again (four times the shards) when its shards hold this many entries on
/// average: a write then copies at most about this many entries.
const SHARD_MOST: usize = 4 * SHARD;

/// A hash map of shards shared between clones: a write copies one shard.
///
/// Which shard a key lands in is decided by a hasher of its own, random per table (as std's
/// `HashMap` keys are): names chosen to fall in one shard cannot be predicted.
#[derive(Clone)]
pub struct Table<K, V> {
    /// Picks the shard; shared by the clones, which are cut alike (equality compares their
    /// shards pairwise then).
    hasher: Arc<RandomState>,
    /// The shards; their count is a power of two.
    shards: Arc<Vec<Arc<HashMap<K, V>>>>,
    /// Entries in all shards.
    len: usize,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Self {
            hasher: Arc::new(RandomState::new()),
            shards: Arc::new(vec![Arc::new(HashMap::new())]),
            len: 0,
        }
    }
}

impl<K: Hash + Eq, V> Table<K, V> {
    /// An empty table cut for about `n` entries.
    pub fn with_capacity(n: usize) -> Self {
        let count = (n / SHARD).max(1).next_power_of_two();
        let each = n.div_ceil(count);
        Self {
            hasher: Arc::new(RandomState::new()),
            shards: Arc::new(
                (0..count)
                    .map(|_| Arc::new(HashMap::with_capacity(each)))
                    .collect(),
            ),
            len: 0,
        }
    }

    fn shard_of<Q: Hash + ?Sized>(&self, k: &Q) -> usize {
        // The low bits: the count is a power of two.
        (self.hasher.hash_one(k) as usize) & (self.shards.len() - 1)
    }

    /// The value of `k`.
    pub fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[self.shard_of(k)].get(k)
    }

    /// Whether `k` has a value.
    pub fn contains_key<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    /// How many entries the table holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// How many shards the table has (for tests and benchmarks).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Table<K, V> {
    /// The shard `k` lands in, as this table's own: copied when another table shares it.
    fn shard_mut<Q: Hash + ?Sized>(&mut self, k: &Q) -> &mut HashMap<K, V> {
        let i = self.shard_of(k);
        Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[i])
    }

    /// Sets `k` to `v`; the value it had.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let old = self.shard_mut(&k).insert(k, v);
        if old.is_none() {
            self.len += 1;
            if self.len > self.shards.len() * SHARD_MOST {
                self.recut(self.shards.len() * 4);
            }
        }
        old
    }

    /// The shard holding `k`, as this table's own; `None`, and nothing copied, when no shard
    /// holds it.
    fn holding_mut<Q>(&mut self, k: &Q) -> Option<&mut HashMap<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.shard_of(k);
        if !self.shards[i].contains_key(k) {
            return None;
        }
        Some(Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[i]))
    }

    /// Takes `k` out; the value it had.
    pub fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let old = self.holding_mut(k)?.remove(k);
        self.len -= usize::from(old.is_some());
        old
    }

    /// The value of `k`, to change in place (its shard copied when shared).
    pub fn get_mut<Q>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.holding_mut(k)?.get_mut(k)
    }

    /// The same entries in `count` shards.
    fn recut(&mut self, count: usize) {
        let mut out = Self::with_capacity(count * SHARD);
        out.hasher = self.hasher.clone();
        for (k, v) in self.iter() {
            let i = out.shard_of(k);
            Arc::make_mut(&mut Arc::make_mut(&mut out.shards)[i]).insert(k.clone(), v.clone());
        }
        out.len = self.len;
        *self = out;
    }
}

impl<K: Hash + Eq + Clone, V: Clone> FromIterator<(K, V)> for Table<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut t = Self::with_capacity(iter.size_hint().0);
        t.extend(iter);
        t
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Extend<(K, V)> for Table<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl<K: Hash + Eq, V: PartialEq> PartialEq for Table<K, V> {
    /// Equal when they hold the same entries, however they are cut. Two tables of one lineage
    /// (one cloned from the other, then written) are compared shard by shard, and a shard
    /// they still share costs one pointer comparison.
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if Arc::ptr_eq(&self.hasher, &other.hasher) && self.shards.len() == other.shards.len() {
            return self
                .shards
                .iter()
                .zip(other.shards.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        }
        self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<K: Hash + Eq, V: Eq> Eq for Table<K, V> {}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for Table<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.shards.iter().flat_map(|s| s.iter()))
            .finish()
    }
}

impl<'t, K: Hash + Eq, V> IntoIterator for &'t Table<K, V> {
    type Item = (&'t K, &'t V);
    type IntoIter = Box<dyn Iterator<Item = (&'t K, &'t V)> + 't>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// How a [`Sorted`] list orders its items: items in the same place are one (a list holds each
/// once). Equality (`PartialEq`) may see more than the order does: two lists are equal when
/// their items are.
pub trait Order {
    /// The order of two items.
    fn order(&self, other: &Self) -> Ordering;
}

/// A sorted list without repeats (by [`Order`]), in chunks shared between clones: an insert or a removal
/// copies one chunk.
#[derive(Clone)]
pub struct Sorted<T> {
    /// Non-empty chunks, in order: every item of a chunk is before every item of the next.
    chunks: Arc<Vec<Arc<Vec<T>>>>,
    len: usize,
}

impl<T> Default for Sorted<T> {
    fn default() -> Self {
        Self {
            chunks: Arc::default(),
            len: 0,
        }
    }
}

impl<T> Sorted<T> {
    /// How many items the list holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every item, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// The item `probe` finds equal (`probe` tells how an item compares to the one sought).
    pub fn find(&self, probe: impl Fn(&T) -> Ordering) -> Option<&T> {
        let c = self.chunk_of(&probe)?;
        let chunk = &self.chunks[c];
        chunk.binary_search_by(probe).ok().map(|i| &chunk[i])
    }

    /// The chunk whose range holds what `probe` seeks: the last whose first item is not after
    /// it (or the first).
    fn chunk_of(&self, probe: &impl Fn(&T) -> Ordering) -> Option<usize> {
        if self.chunks.is_empty() {
            return None;
        }
        let after = self
            .chunks
            .partition_point(|c| probe(&c[0]) != Ordering::Greater);
        Some(after.saturating_sub(1))
    }
}

impl<T: Order + Clone> Sorted<T> {
    /// The list of `items`, sorted here; of equal items the last is kept.
    pub fn from_vec(mut items: Vec<T>) -> Self {
        items.sort_by(T::order);
        items.reverse();
        items.dedup_by(|a, b| (*a).order(b) == Ordering::Equal);
        items.reverse();
        let len = items.len();
        let chunks = items.chunks(SHARD).map(|c| Arc::new(c.to_vec())).collect();
        Self {
            chunks: Arc::new(chunks),
            len,
        }
    }

    /// Puts `item` in its place; the item equal to it that it replaced.
    pub fn insert(&mut self, item: T) -> Option<T> {
        let Some(c) = self.chunk_of(&|x: &T| x.order(&item)) else {
            Arc::make_mut(&mut self.chunks).push(Arc::new(vec![item]));
            self.len = 1;
            return None;
        };
        let chunks = Arc::make_mut(&mut self.chunks);
        let chunk = Arc::make_mut(&mut chunks[c]);
        match chunk.binary_search_by(|x| x.order(&item)) {
            Ok(i) => Some(std::mem::replace(&mut chunk[i], item)),
            Err(i) => {
                chunk.insert(i, item);
                self.len += 1;
                if chunk.len() >= 2 * SHARD {
                    let back = chunk.split_off(SHARD);
                    chunks.insert(c + 1, Arc::new(back));
                }
                None
            }
        }
    }

    /// Takes out the item `probe` finds equal.
    pub fn remove_by(&mut self, probe: impl Fn(&T) -> Ordering) -> Option<T> {
        let c = self.chunk_of(&probe)?;
        let i = self.chunks[c].binary_search_by(&probe).ok()?;
        let chunks = Arc::make_mut(&mut self.chunks);
        let chunk = Arc::make_mut(&mut chunks[c]);
        let item = chunk.remove(i);
        let left = chunk.len();
        if left == 0 {
            chunks.remove(c);
        } else if left < SHARD / 4 && c + 1 < chunks.len() && left + chunks[c + 1].len() < 2 * SHARD
        {
            // A chunk emptied by removals joins the next, so that churn does not leave the
            // list in many small chunks (each a pointer the spine copies at every write).
            let next = chunks.remove(c + 1);
            Arc::make_mut(&mut chunks[c]).extend(next.iter().cloned());
        }
        self.len -= 1;
        Some(item)
    }

    /// How many chunks the list is cut in (for tests).
    #[cfg(test)]
    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Takes out the item equal to `item`.
    pub fn remove(&mut self, item: &T) -> Option<T> {
        self.remove_by(|x| x.order(item))
    }
}

impl<T: PartialEq> PartialEq for Sorted<T> {
    /// Equal when they hold the same items, however they are cut; chunks two lists still share
    /// cost one pointer comparison.
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if Arc::ptr_eq(&self.chunks, &other.chunks) {
            return true;
        }
        let chunkwise = self.chunks.len() == other.chunks.len()
            && self
                .chunks
                .iter()
                .zip(other.chunks.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        // Cut differently, equal items still make equal lists.
        chunkwise || self.iter().eq(other.iter())
    }
}

impl<T: Eq> Eq for Sorted<T> {}

impl<'t, T> IntoIterator for &'t Sorted<T> {
    type Item = &'t T;
    type IntoIter = Box<dyn DoubleEndedIterator<Item = &'t T> + 't>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Sorted<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    impl Order for (u16, u8) {
        fn order(&self, other: &Self) -> Ordering {
            self.0.cmp(&other.0)
        }
    }

    /// What a map, a table and a list held when a clone was taken.
    type Kept = (BTreeMap<u16, u8>, Table<u16, u8>, Sorted<(u16, u8)>);

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u8),
        Remove(u16),
        Keep,
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                4 => (0u16..600, any::<u8>()).prop_map(|(k, v)| Op::Insert(k, v)),
                2 => (0u16..600).prop_map(Op::Remove),
                1 => Just(Op::Keep),
            ],
            0..2_000,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// A table and a sorted list answer as a `BTreeMap` does after every write, and a clone
        /// taken before a write still answers as the map did then.
        #[test]
        fn they_answer_as_a_map_does_and_a_clone_keeps_its_past(ops in ops()) {
            let mut reference = BTreeMap::new();
            let mut table = Table::default();
            let mut sorted = Sorted::default();
            let mut kept: Option<Kept> = None;
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        prop_assert_eq!(table.insert(k, v), reference.insert(k, v));
                        sorted.insert((k, v));
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(table.remove(&k), reference.remove(&k));
                        sorted.remove_by(|x: &(u16, u8)| x.0.cmp(&k));
                    }
                    Op::Keep => kept = Some((reference.clone(), table.clone(), sorted.clone())),
                }
                prop_assert_eq!(table.len(), reference.len());
                prop_assert_eq!(sorted.len(), reference.len());
            }
            let listed: Vec<(u16, u8)> = sorted.iter().copied().collect();
            let expected: Vec<(u16, u8)> = reference.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(listed, expected);
            for k in 0..600u16 {
                prop_assert_eq!(table.get(&k), reference.get(&k));
                prop_assert_eq!(sorted.find(|x| x.0.cmp(&k)).map(|x| &x.1), reference.get(&k));
            }
            if let Some((past, table, sorted)) = kept {
                prop_assert_eq!(table.len(), past.len());
                for (k, v) in &past {
                    prop_assert_eq!(table.get(k), Some(v));
                }
                let listed: Vec<(u16, u8)> = sorted.iter().copied().collect();
                let expected: Vec<(u16, u8)> = past.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(listed, expected);
            }
        }
    }

    #[test]
    fn churn_leaves_a_sorted_list_in_few_chunks() {
        let mut list: Sorted<(u16, u8)> = Sorted::default();
        for k in 0..4_000u16 {
            list.insert((k, 0));
        }
        // Remove most items everywhere, leaving one in 16.
        for k in (0..4_000u16).filter(|k| k % 16 != 0) {
            assert!(list.remove_by(|x| x.0.cmp(&k)).is_some());
        }
        assert_eq!(list.len(), 250);
        assert!(
            list.chunk_count() <= 250 / (SHARD / 4) + 1,
            "{} chunks",
            list.chunk_count()
        );
        let left: Vec<u16> = list.iter().map(|x| x.0).collect();
        assert_eq!(left, (0..4_000u16).step_by(16).collect::<Vec<_>>());
    }

    #[test]
    fn a_write_to_a_clone_copies_one_shard_and_shares_the_rest() {
        let t: Table<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        let before = t.shard_count();
        assert!(before >= 10_000 / SHARD_MOST, "{before} shards");
        let mut next = t.clone();
        next.insert(5, 6);
        let shared = t
            .shards
            .iter()
            .zip(next.shards.iter())
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert_eq!(shared, before - 1);
        assert_eq!(t.get(&5), Some(&5));
        assert_eq!(next.get(&5), Some(&6));
        // Equal however they are cut.
        let mut small: Table<u32, u32> = Table::default();
        for i in 0..10_000 {
            small.insert(i, i);
        }
        assert!(small == t);
    }
}

//! The packed batch Tulip queues and hands to the engine: sequences back to back, no padding.

/// Sequences back to back (`ids`) and where each starts and ends (`cu_seqlens`, one more entry
/// than sequences): the engine's packed batch layout. `types`: each token's type (a
/// cross-encoder's pair: 1 from its second text on), or empty when every token is type 0 (a
/// text alone, the common case: no second buffer to carry).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Packed {
    pub ids: Vec<i32>,
    pub cu_seqlens: Vec<i32>,
    pub types: Vec<i32>,
}

/// A batch's arrays as the engine's `PackedBatch` holds them, each little-endian bytes:
/// `input_ids` int64, `seqlens` int32, `cu_seqlens` int32, `positions` int64 (from 0 in each
/// sequence), `seq_ids` int64 (each token's sequence), `token_type_ids` int64. Built here, so the
/// engine thread's Python only wraps them (`server/tulip_calls.packed_step`).
pub struct BatchArrays {
    pub input_ids: Vec<u8>,
    pub seqlens: Vec<u8>,
    pub cu_seqlens: Vec<u8>,
    pub positions: Vec<u8>,
    pub seq_ids: Vec<u8>,
    pub token_type_ids: Vec<u8>,
}

fn le_i32(values: impl Iterator<Item = i32>) -> Vec<u8> {
    values.flat_map(i32::to_le_bytes).collect()
}

fn le_i64(values: impl Iterator<Item = i64>) -> Vec<u8> {
    values.flat_map(i64::to_le_bytes).collect()
}

fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Packed {
    pub fn new() -> Self {
        Packed {
            ids: Vec::new(),
            cu_seqlens: vec![0],
            types: Vec::new(),
        }
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Appends one sequence of one text (type 0).
    pub fn push(&mut self, ids: &[u32]) {
        self.ids.extend(ids.iter().map(|&i| i as i32));
        if !self.types.is_empty() {
            self.types.resize(self.ids.len(), 0);
        }
        self.cu_seqlens.push(self.ids.len() as i32);
    }

    /// Appends one pair's sequence: type 0 up to `second`, 1 from it on (a cross-encoder's
    /// document); `second` 0: every token type 0 (a model without segment embeddings).
    pub fn push_pair(&mut self, ids: &[u32], second: usize) {
        if second == 0 {
            return self.push(ids);
        }
        self.types.resize(self.ids.len(), 0); // the zeros of the texts before, if none yet
        self.types
            .extend((0..ids.len()).map(|k| i32::from(k >= second)));
        self.ids.extend(ids.iter().map(|&i| i as i32));
        self.cu_seqlens.push(self.ids.len() as i32);
    }

    /// Each token's type, zeros included.
    fn types_of(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = i32> + '_ {
        let zeros = self.types.is_empty();
        range.map(move |i| if zeros { 0 } else { self.types[i] })
    }

    /// Appends sequence `i` of `other`.
    fn push_from(&mut self, other: &Packed, i: usize) {
        let (a, b) = (
            other.cu_seqlens[i] as usize,
            other.cu_seqlens[i + 1] as usize,
        );
        if !other.types.is_empty() || !self.types.is_empty() {
            self.types.resize(self.ids.len(), 0); // the zeros of the texts before, if none yet
            self.types.extend(other.types_of(a..b));
        }
        self.ids.extend_from_slice(&other.ids[a..b]);
        self.cu_seqlens.push(self.ids.len() as i32);
    }

    /// The sequences in order, cut into parts of at most `budget` tokens each (a sequence over
    /// it alone in its part): a large request's parts share the queue with everyone else's
    /// requests instead of holding the engine for one long batch.
    pub fn split(&self, budget: usize) -> Vec<Packed> {
        let mut parts = vec![Packed::new()];
        for (i, w) in self.cu_seqlens.windows(2).enumerate() {
            let len = (w[1] - w[0]) as usize;
            let last = parts.last_mut().expect("one part at least");
            if last.num_seqs() > 0 && last.num_tokens() + len > budget {
                parts.push(Packed::new());
            }
            parts.last_mut().expect("one part").push_from(self, i);
        }
        parts
    }

    /// Appends every sequence of `other` after this one's.
    pub fn extend(&mut self, other: &Packed) {
        for i in 0..other.num_seqs() {
            self.push_from(other, i);
        }
    }

    /// `ids` and `cu_seqlens` as little-endian int32 bytes: what `Tokenizer.encode_packed`
    /// hands over (NumPy reads them with `frombuffer`).
    pub fn le_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        (
            le_i32(self.ids.iter().copied()),
            le_i32(self.cu_seqlens.iter().copied()),
        )
    }

    /// The inverse of `le_bytes`, with each token's type when `types` is given (int32, one per
    /// id; all zero is kept as none): an error unless `cu_seqlens` starts at 0, never falls and
    /// ends at the number of ids, and the types are one per id, each 0 or 1.
    pub fn from_le_bytes(
        ids: &[u8],
        cu_seqlens: &[u8],
        types: Option<&[u8]>,
    ) -> Result<Self, String> {
        let (ids_, cu) = (ints(ids), ints(cu_seqlens));
        let whole = ids.len().is_multiple_of(4) && cu_seqlens.len().is_multiple_of(4);
        let ordered = cu.first() == Some(&0) && cu.windows(2).all(|w| w[0] <= w[1]);
        if !whole || !ordered || cu.last().copied() != Some(ids_.len() as i32) {
            return Err(
                "not a packed batch: cu_seqlens must run from 0 to the number of ids".into(),
            );
        }
        let mut types = types.map(ints).unwrap_or_default();
        if !types.is_empty() && types.len() != ids_.len() {
            return Err(format!(
                "{} token types for {} ids",
                types.len(),
                ids_.len()
            ));
        }
        if types.iter().any(|&t| t != 0 && t != 1) {
            return Err("a token type is 0 or 1".into());
        }
        if types.iter().all(|&t| t == 0) {
            types.clear();
        }
        Ok(Packed {
            ids: ids_,
            cu_seqlens: cu,
            types,
        })
    }

    /// The engine's arrays for this batch (`BatchArrays`).
    pub fn arrays(&self) -> BatchArrays {
        let lens = self.cu_seqlens.windows(2).map(|w| w[1] - w[0]);
        let mut positions = Vec::with_capacity(self.ids.len() * 8);
        let mut seq_ids = Vec::with_capacity(self.ids.len() * 8);
        for (s, len) in lens.clone().enumerate() {
            for p in 0..len as i64 {
                positions.extend_from_slice(&p.to_le_bytes());
                seq_ids.extend_from_slice(&(s as i64).to_le_bytes());
            }
        }
        BatchArrays {
            input_ids: le_i64(self.ids.iter().map(|&i| i as i64)),
            seqlens: le_i32(lens),
            cu_seqlens: le_i32(self.cu_seqlens.iter().copied()),
            positions,
            seq_ids,
            token_type_ids: le_i64(self.types_of(0..self.ids.len()).map(i64::from)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i64s(bytes: &[u8]) -> Vec<i64> {
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn pair(first: u32, second: u32) -> Packed {
        let ids: Vec<u8> = le_i32((0..(first + second) as i32).map(|i| 100 + i));
        let cu = le_i32([0, (first + second) as i32].into_iter());
        let types = le_i32((0..first + second).map(|i| i32::from(i >= first)));
        Packed::from_le_bytes(&ids, &cu, Some(&types)).unwrap()
    }

    #[test]
    fn packed_offsets_follow_the_sequences() {
        let mut a = Packed::new();
        a.push(&[1, 2, 3]);
        a.push(&[4]);
        let mut b = Packed::new();
        b.push(&[5, 6]);
        a.extend(&b);
        assert_eq!(a.ids, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(a.cu_seqlens, vec![0, 3, 4, 6]);
        assert_eq!((a.num_seqs(), a.num_tokens()), (3, 6));
        assert!(a.types.is_empty());
    }

    #[test]
    fn a_split_keeps_the_order_and_the_budget() {
        let mut all = Packed::new();
        for n in [3u32, 5, 2, 9, 1, 1] {
            all.push(&(0..n).collect::<Vec<_>>());
        }
        let parts = all.split(8);
        let sizes: Vec<usize> = parts.iter().map(Packed::num_tokens).collect();
        assert_eq!(sizes, vec![8, 2, 9, 2]); // the 9-token sequence alone, over the budget
        let mut back = Packed::new();
        for p in &parts {
            back.extend(p);
        }
        assert_eq!(back, all);
        assert_eq!(all.split(100), vec![all.clone()]);
    }

    #[test]
    fn pairs_keep_their_types_beside_single_texts() {
        let mut batch = Packed::new();
        batch.push(&[7, 8]);
        batch.extend(&pair(2, 3));
        batch.push(&[9]);
        assert_eq!(batch.types, vec![0, 0, 0, 0, 1, 1, 1, 0]);
        let parts = batch.split(5);
        assert_eq!(parts.len(), 3);
        let zeros = |p: &Packed| p.types.iter().all(|&t| t == 0);
        assert!(zeros(&parts[0]) && zeros(&parts[2]));
        assert_eq!(parts[1].types, vec![0, 0, 1, 1, 1]);
        let mut first = Packed::new(); // a batch that starts with a pair
        first.extend(&pair(1, 1));
        first.push(&[3]);
        assert_eq!(first.types, vec![0, 1, 0]);
        let mut pushed = Packed::new(); // `push_pair`, as Ivy's scoring routes pack them
        pushed.push(&[7, 8]);
        pushed.push_pair(&[100, 101, 102, 103, 104], 2);
        pushed.push_pair(&[5, 6], 0);
        assert_eq!(pushed.types, vec![0, 0, 0, 0, 1, 1, 1, 0, 0]);
        assert_eq!(pushed.cu_seqlens, vec![0, 2, 7, 9]);
        let a = batch.arrays();
        assert_eq!(i64s(&a.token_type_ids), vec![0, 0, 0, 0, 1, 1, 1, 0]);
        assert_eq!(i64s(&a.positions), vec![0, 1, 0, 1, 2, 3, 4, 0]);
        assert_eq!(i64s(&a.seq_ids), vec![0, 0, 1, 1, 1, 1, 1, 2]);
        assert_eq!(i64s(&a.input_ids)[..3], [7, 8, 100]);
        assert_eq!(a.seqlens, le_i32([2, 5, 1].into_iter()));
        assert_eq!(a.cu_seqlens, le_i32([0, 2, 7, 8].into_iter()));
    }

    #[test]
    fn bad_bytes_are_refused() {
        let ids = le_i32([1, 2, 3].into_iter());
        let cu = le_i32([0, 3].into_iter());
        assert!(Packed::from_le_bytes(&ids, &le_i32([0, 2].into_iter()), None).is_err());
        let short = le_i32([0, 1].into_iter());
        assert!(Packed::from_le_bytes(&ids, &cu, Some(&short)).is_err());
        let two = le_i32([0, 2, 1].into_iter());
        assert!(Packed::from_le_bytes(&ids, &cu, Some(&two)).is_err());
        let zeros = le_i32([0, 0, 0].into_iter());
        assert!(Packed::from_le_bytes(&ids, &cu, Some(&zeros))
            .unwrap()
            .types
            .is_empty());
    }
}

//! Text to packed token ids with the model's own `tokenizer.json`, through the `tokenizers` crate
//! (the code the Python package wraps: the same ids), with the length limit checked per text.

use std::fmt;

use tokenizers::Tokenizer;

use super::wordpiece::AsciiWordPiece;

/// From this many texts a batch is tokenized on several threads (`TextTokenizer::batch`): a
/// short query's few tokens cost less than a hand-off.
pub const PARALLEL_TEXTS: usize = 64;

/// Sequences back to back (`ids`) and where each starts and ends (`cu_seqlens`, one more entry
/// than sequences): the engine's packed batch layout, no padding.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Packed {
    pub ids: Vec<i32>,
    pub cu_seqlens: Vec<i32>,
}

impl Packed {
    pub fn new() -> Self {
        Packed {
            ids: Vec::new(),
            cu_seqlens: vec![0],
        }
    }

    pub fn num_seqs(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Appends one sequence.
    pub fn push(&mut self, ids: &[u32]) {
        self.ids.extend(ids.iter().map(|&i| i as i32));
        self.cu_seqlens.push(self.ids.len() as i32);
    }

    /// The sequences in order, cut into parts of at most `budget` tokens each (a sequence over
    /// it alone in its part): a large request's parts share the queue with everyone else's
    /// requests instead of holding the engine for one long batch.
    pub fn split(&self, budget: usize) -> Vec<Packed> {
        let mut parts = vec![Packed::new()];
        for w in self.cu_seqlens.windows(2) {
            let seq = &self.ids[w[0] as usize..w[1] as usize];
            let last = parts.last_mut().expect("one part at least");
            if last.num_seqs() > 0 && last.num_tokens() + seq.len() > budget {
                parts.push(Packed::new());
            }
            let part = parts.last_mut().expect("one part at least");
            part.ids.extend_from_slice(seq);
            part.cu_seqlens.push(part.ids.len() as i32);
        }
        parts
    }

    /// `ids` and `cu_seqlens` as little-endian int32 bytes: what Python's `step` and
    /// `Tokenizer.encode_packed` hand over (NumPy reads them with `frombuffer`).
    pub fn le_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        (bytes(&self.ids), bytes(&self.cu_seqlens))
    }

    /// The inverse of `le_bytes`: an error unless `cu_seqlens` starts at 0, never falls and
    /// ends at the number of ids.
    pub fn from_le_bytes(ids: &[u8], cu_seqlens: &[u8]) -> Result<Self, String> {
        let ints = |b: &[u8]| -> Vec<i32> {
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (ids_, cu) = (ints(ids), ints(cu_seqlens));
        let whole = ids.len().is_multiple_of(4) && cu_seqlens.len().is_multiple_of(4);
        let ordered = cu.first() == Some(&0) && cu.windows(2).all(|w| w[0] <= w[1]);
        if !whole || !ordered || cu.last().copied() != Some(ids_.len() as i32) {
            return Err(
                "not a packed batch: cu_seqlens must run from 0 to the number of ids".into(),
            );
        }
        Ok(Packed {
            ids: ids_,
            cu_seqlens: cu,
        })
    }

    /// Appends every sequence of `other` after this one's.
    pub fn extend(&mut self, other: &Packed) {
        let base = self.ids.len() as i32;
        self.ids.extend_from_slice(&other.ids);
        self.cu_seqlens
            .extend(other.cu_seqlens[1..].iter().map(|c| c + base));
    }
}

/// Why a text was not tokenized: the caller's error, said with where it was.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeError {
    /// `index` has `tokens` tokens, over `limit` (truncation was not asked for).
    TooLong {
        index: usize,
        tokens: usize,
        limit: usize,
    },
    /// The tokenizer itself failed on `index`.
    Failed { index: usize, message: String },
}

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizeError::TooLong {
                index,
                tokens,
                limit,
            } => write!(
                f,
                "input[{index}] has {tokens} tokens, over the model's limit of {limit}: shorten it"
            ),
            TokenizeError::Failed { index, message } => {
                write!(f, "input[{index}] could not be tokenized: {message}")
            }
        }
    }
}

/// A model's tokenizer with its length limit (`max_length` tokens, special tokens included).
pub struct TextTokenizer {
    inner: Tokenizer,
    twin: Option<AsciiWordPiece>, // a BERT tokenizer's clean ASCII texts: the same ids, faster
    pub max_length: usize,
    /// The template's special tokens (the ids of ""): a text with no more has no token of its
    /// own (whitespace or control characters only), which the request core refuses.
    pub num_special: usize,
}

impl TextTokenizer {
    /// Loads `path` (a `tokenizer.json`) with padding and truncation off: the limit is ours.
    pub fn from_file(path: &str, max_length: usize) -> Result<Self, String> {
        let mut inner = Tokenizer::from_file(path)
            .map_err(|e| format!("{path}: not a valid tokenizer.json ({e})"))?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| format!("{path}: {e}"))?;
        let json = inner.to_string(false).map_err(|e| format!("{path}: {e}"))?;
        Self::from_json(&json, max_length)
    }

    /// A tokenizer as its JSON gives it, its truncation and padding included (the Python core's
    /// tokenizers, each set up for one side of a cut).
    pub fn from_json(json: &str, max_length: usize) -> Result<Self, String> {
        let inner: Tokenizer = json.parse().map_err(|e: tokenizers::Error| e.to_string())?;
        let spec: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let twin = AsciiWordPiece::of(&inner, &spec);
        let num_special = inner
            .encode_fast("", true)
            .map_err(|e| e.to_string())?
            .get_ids()
            .len();
        Ok(TextTokenizer {
            inner,
            twin,
            max_length,
            num_special,
        })
    }

    /// Whether clean ASCII texts take the WordPiece twin.
    pub fn has_twin(&self) -> bool {
        self.twin.is_some()
    }

    /// One text's ids with the special tokens (offsets are not computed: the ids are the same).
    pub fn ids(&self, index: usize, text: &str) -> Result<Vec<u32>, TokenizeError> {
        if let Some(twin) = self.twin.as_ref().filter(|t| t.takes(text)) {
            return Ok(twin.ids(text));
        }
        self.inner
            .encode_fast(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Failed {
                index,
                message: e.to_string(),
            })
    }

    /// Each text's ids, in order; a batch of `PARALLEL_TEXTS` or more on rayon's pool (its
    /// threads: `RAYON_NUM_THREADS`, else a core each), each chunk of texts on one thread.
    pub fn batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Vec<u32>>, TokenizeError> {
        use rayon::prelude::*;
        if texts.len() < PARALLEL_TEXTS || rayon::current_num_threads() < 2 {
            return texts
                .iter()
                .enumerate()
                .map(|(i, t)| self.ids(i, t.as_ref()))
                .collect();
        }
        texts
            .par_iter()
            .with_min_len(PARALLEL_TEXTS / 4)
            .enumerate()
            .map(|(i, t)| self.ids(i, t.as_ref()))
            .collect()
    }

    /// Every text's ids, packed; an over-long text is an error (the truncation policy of the
    /// request core, `core/tokenization.py`, is not ported yet: the prototype refuses).
    pub fn pack<S: AsRef<str>>(&self, texts: &[S]) -> Result<Packed, TokenizeError> {
        let mut packed = Packed::new();
        for (index, text) in texts.iter().enumerate() {
            let ids = self.ids(index, text.as_ref())?;
            if ids.len() > self.max_length {
                return Err(TokenizeError::TooLong {
                    index,
                    tokens: ids.len(),
                    limit: self.max_length,
                });
            }
            packed.push(&ids);
        }
        Ok(packed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_error_names_the_input_and_the_limit() {
        let e = TokenizeError::TooLong {
            index: 3,
            tokens: 700,
            limit: 512,
        };
        let text = e.to_string();
        assert!(text.contains("input[3] has 700 tokens") && text.contains("limit of 512"));
    }
}

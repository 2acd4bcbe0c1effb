//! Text to packed token ids with the model's own `tokenizer.json`, through the `tokenizers` crate
//! (the code the Python package wraps: the same ids), with the length limit checked per text.

use std::fmt;

use tokenizers::Tokenizer;

use super::pairs::{Cut, Joined, PairTemplate};
use super::wordpiece::AsciiWordPiece;
use crate::tulip::Packed;

/// A batch of texts of twice this many bytes or more is tokenized on several threads
/// (`TextTokenizer::batch`), each taking texts of about this many bytes at a time (~4,000
/// tokens, 0.2-0.7 ms of one core): less costs less than waking a thread. Bytes, not texts: a
/// reranking's 25 documents of 500 tokens are one text each, and 1-2 ms of one core.
pub const PARALLEL_BYTES: usize = 16 * 1024;

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
    /// The single-text template's special tokens before and after a text's own ids.
    pub lead: Vec<u32>,
    pub trail: Vec<u32>,
    /// The pair template, when the tokenizer has one (`pairs`).
    pub pairs: Option<PairTemplate>,
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
        // the single-text template: the special tokens around a one-token text
        let probe = inner.encode_fast("a", true).map_err(|e| e.to_string())?;
        let own: Vec<usize> = (0..probe.len())
            .filter(|&k| probe.get_special_tokens_mask()[k] == 0)
            .collect();
        let (first, last) = match (own.first(), own.last()) {
            (Some(&first), Some(&last)) => (first, last + 1),
            _ => return Err("the tokenizer gives the text \"a\" no token of its own".into()),
        };
        let ids = probe.get_ids();
        let (lead, trail) = (ids[..first].to_vec(), ids[last..].to_vec());
        let pairs = PairTemplate::of(&inner)?;
        Ok(TextTokenizer {
            inner,
            twin,
            max_length,
            num_special,
            lead,
            trail,
            pairs,
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

    /// Each text's ids, in order; a batch of `2 * PARALLEL_BYTES` or more on rayon's pool (its
    /// threads: `RAYON_NUM_THREADS`, else a core each), in chunks of about `PARALLEL_BYTES`.
    pub fn batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Vec<u32>>, TokenizeError> {
        use rayon::prelude::*;
        let bytes: usize = texts.iter().map(|t| t.as_ref().len()).sum();
        if texts.len() < 2 || bytes < 2 * PARALLEL_BYTES || rayon::current_num_threads() < 2 {
            return texts
                .iter()
                .enumerate()
                .map(|(i, t)| self.ids(i, t.as_ref()))
                .collect();
        }
        let per_chunk = PARALLEL_BYTES / (bytes / texts.len()).max(1);
        texts
            .par_iter()
            .with_min_len(per_chunk.max(1))
            .enumerate()
            .map(|(i, t)| self.ids(i, t.as_ref()))
            .collect()
    }

    /// Each text's own ids, no special tokens, never truncated: its ids less the single-text
    /// template's (the post-processor adds only those).
    pub fn plain<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Vec<u32>>, TokenizeError> {
        let (lead, trail) = (self.lead.len(), self.trail.len());
        let mut all = self.batch(texts)?;
        for ids in &mut all {
            ids.truncate(ids.len().saturating_sub(trail));
            ids.drain(..lead.min(ids.len()));
        }
        Ok(all)
    }

    /// A query's pair with each document (`PairTemplate::join`, each text's own ids), or None
    /// when the query has no token of its own; an error when the tokenizer has no pair
    /// template. The request core's pairs and Ivy's, one implementation.
    pub fn pairs<S: AsRef<str> + Sync>(
        &self,
        query: &str,
        docs: &[S],
        limit: usize,
        cut: Cut,
    ) -> Result<Option<Vec<Joined>>, TokenizeError> {
        let Some(template) = self.pairs.as_ref() else {
            return Err(TokenizeError::Failed {
                index: 0,
                message: "the tokenizer has no pair template".into(),
            });
        };
        let first = self.plain(&[query])?.pop().unwrap_or_default();
        if first.is_empty() {
            return Ok(None);
        }
        let bodies = self.plain(docs)?;
        Ok(Some(
            bodies
                .iter()
                .map(|body| template.join(&first, body, limit, cut))
                .collect(),
        ))
    }

    /// Every text's ids (`batch`), packed; the first over-long text is an error (the Python
    /// front then says so, or cuts it where truncation was asked for).
    pub fn pack<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Packed, TokenizeError> {
        let mut packed = Packed::new();
        for (index, ids) in self.batch(texts)?.iter().enumerate() {
            if ids.len() > self.max_length {
                return Err(TokenizeError::TooLong {
                    index,
                    tokens: ids.len(),
                    limit: self.max_length,
                });
            }
            packed.push(ids);
        }
        Ok(packed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

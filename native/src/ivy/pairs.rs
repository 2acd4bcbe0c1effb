//! A cross-encoder's pairs: the tokenizer's pair template, read from a probe pair, joins a
//! query's and a document's own ids (each text tokenized apart, no special tokens) into one
//! sequence, the document cut when asked and the query never. The one implementation of the
//! rule: Ivy's scoring routes join here, and the request core's `PairPreparer`
//! (`core/pairs.py`) calls it through `embedserve._native`.

use tokenizers::Tokenizer;

/// The special tokens around a pair: `before` + query + `between` + document + `after` (BERT:
/// `[CLS] q [SEP] d [SEP]`; XLM-R: `<s> q </s></s> d </s>`), as the tokenizer's
/// post-processor joins two texts tokenized apart.
#[derive(Debug, Clone, PartialEq)]
pub struct PairTemplate {
    pub before: Vec<u32>,
    pub between: Vec<u32>,
    pub after: Vec<u32>,
}

/// What to do with a pair over the model's limit: refuse it, or keep the document's beginning
/// (`End`: its end is cut off) or its end (`Start`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cut {
    Refuse,
    End,
    Start,
}

impl Cut {
    /// The request core's `truncate` of a scoring request: none, "end" or "start".
    pub fn of(truncate: Option<&str>) -> Result<Cut, String> {
        match truncate {
            None => Ok(Cut::Refuse),
            Some("end") => Ok(Cut::End),
            Some("start") => Ok(Cut::Start),
            Some(other) => Err(format!("not a cut of a pair: {other:?}")),
        }
    }
}

/// One pair joined, or why not.
#[derive(Debug, Clone, PartialEq)]
pub enum Joined {
    /// the sequence, and where the document (token type 1 in BERT's pairs) begins in it
    Pair { ids: Vec<u32>, second: usize },
    /// the whole pair's tokens, over the limit, and no cut was asked for
    TooLong(usize),
    /// the tokens of the query and the special tokens: no room is left for a document token
    QueryTooLong(usize),
    /// the document has no token of its own (refused as "" is)
    Empty,
}

impl PairTemplate {
    /// The template of `tokenizer`'s post-processor, from its encoding of the pair ("a", "b");
    /// None when it does not mark a second text (no pair template).
    pub fn of(tokenizer: &Tokenizer) -> Result<Option<Self>, String> {
        let probe = tokenizer
            .encode_fast(("a", "b"), true)
            .map_err(|e| e.to_string())?;
        let sequence = probe.get_sequence_ids();
        let of = |side: usize| -> Vec<usize> {
            (0..sequence.len())
                .filter(|&k| sequence[k] == Some(side))
                .collect()
        };
        let (firsts, seconds) = (of(0), of(1));
        let (Some(&first), Some(&last_first), Some(&second), Some(&last)) = (
            firsts.first(),
            firsts.last(),
            seconds.first(),
            seconds.last(),
        ) else {
            return Ok(None);
        };
        if second <= last_first {
            return Ok(None); // the second text before the first ends: not a template of ours
        }
        let ids = probe.get_ids();
        Ok(Some(PairTemplate {
            before: ids[..first].to_vec(),
            between: ids[last_first + 1..second].to_vec(),
            after: ids[last + 1..].to_vec(),
        }))
    }

    /// `query` and `doc` (each a text's own ids) as one sequence of at most `limit` tokens.
    pub fn join(&self, query: &[u32], doc: &[u32], limit: usize, cut: Cut) -> Joined {
        if doc.is_empty() {
            return Joined::Empty;
        }
        let fixed = self.before.len() + query.len() + self.between.len() + self.after.len();
        let total = fixed + doc.len();
        let doc = if total <= limit {
            doc
        } else if cut == Cut::Refuse {
            return Joined::TooLong(total);
        } else if limit <= fixed {
            return Joined::QueryTooLong(fixed);
        } else {
            let room = limit - fixed;
            match cut {
                Cut::Start => &doc[doc.len() - room..],
                _ => &doc[..room],
            }
        };
        let mut ids = Vec::with_capacity(fixed + doc.len());
        ids.extend_from_slice(&self.before);
        ids.extend_from_slice(query);
        ids.extend_from_slice(&self.between);
        let second = ids.len();
        ids.extend_from_slice(doc);
        ids.extend_from_slice(&self.after);
        Joined::Pair { ids, second }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bert() -> PairTemplate {
        PairTemplate {
            before: vec![101],
            between: vec![102],
            after: vec![102],
        }
    }

    #[test]
    fn a_pair_fits_whole() {
        let joined = bert().join(&[7, 8], &[9], 8, Cut::Refuse);
        assert_eq!(
            joined,
            Joined::Pair {
                ids: vec![101, 7, 8, 102, 9, 102],
                second: 4
            }
        );
    }

    #[test]
    fn an_over_long_document_is_cut_on_the_side_asked_or_refused() {
        let doc = [1, 2, 3, 4, 5];
        assert_eq!(bert().join(&[7], &doc, 6, Cut::Refuse), Joined::TooLong(9));
        let end = bert().join(&[7], &doc, 6, Cut::End);
        assert_eq!(
            end,
            Joined::Pair {
                ids: vec![101, 7, 102, 1, 2, 102],
                second: 3
            }
        );
        let start = bert().join(&[7], &doc, 6, Cut::Start);
        assert_eq!(
            start,
            Joined::Pair {
                ids: vec![101, 7, 102, 4, 5, 102],
                second: 3
            }
        );
    }

    #[test]
    fn a_query_that_leaves_no_room_is_never_cut() {
        assert_eq!(
            bert().join(&[7, 8, 9], &[1, 2], 6, Cut::End),
            Joined::QueryTooLong(6)
        );
        assert_eq!(
            bert().join(&[7, 8, 9], &[1, 2], 6, Cut::Refuse),
            Joined::TooLong(8)
        );
        assert_eq!(bert().join(&[7], &[], 6, Cut::End), Joined::Empty);
        assert!(Cut::of(Some("middle")).is_err());
        assert_eq!(Cut::of(None), Ok(Cut::Refuse));
    }
}

//! A BERT tokenizer's twin for clean ASCII text: the `tokenizers` crate's ids for less work.
//!
//! A `BertNormalizer` walks each character through Unicode decomposition, accent stripping, CJK
//! spacing and control-character cleaning; on ASCII text with no character that cleaning
//! removes, all of that leaves only the lower-casing. What remains is small: lower-case, split on
//! whitespace (dropped) and around each ASCII punctuation character (a word of its own), each
//! word to its WordPiece ids (longest match first, the `##` prefix, the unknown token for a word
//! that cannot be covered or is over `max_input_chars_per_word`), then the template's special
//! tokens around them, the text's own tokens cut first to the tokenizer's truncation.
//!
//! Exactness by the crate's own rules (`normalizers/bert.rs`, `pre_tokenizers/bert.rs`,
//! `models/wordpiece`): `clean_text` removes 0x00-0x08, 0x0b, 0x0c, 0x0e-0x1f and 0x7f (a text
//! holding one goes the crate's way) and maps tab, newline and CR to a space, which the
//! pre-tokenizer splits on as on a space; a text holding an added token (matched on the raw
//! text: `[CLS]`, `[MASK]`, ...) goes the crate's way too. `AsciiWordPiece::of` checks the twin
//! against the crate on probes built to hit each rule, and tests compare both on corpora.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde_json::Value;
use tokenizers::Tokenizer;

/// FxHash (rustc's): vocabulary keys are short, and SipHash's cost would be most of a lookup.
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Vocab = HashMap<Box<[u8]>, u32, BuildHasherDefault<Fx>>;

/// Characters `clean_text` removes (tab, newline and carriage return are mapped, not removed).
fn removed(b: u8) -> bool {
    matches!(b, 0x00..=0x08 | 0x0b | 0x0c | 0x0e..=0x1f | 0x7f)
}

pub struct AsciiWordPiece {
    whole: Vocab,
    continuing: Vocab, // pieces after a word's first, without their prefix
    unk: u32,
    max_chars: usize,
    lowercase: bool,
    added: Vec<String>,
    lead: Vec<u32>,
    trail: Vec<u32>,
    keep: Option<(usize, bool)>, // the text's own tokens a truncating tokenizer keeps, from the end?
}

impl AsciiWordPiece {
    /// The twin of `tok` (its JSON `spec`), or None unless it has a cleaning `BertNormalizer`,
    /// a `BertPreTokenizer`, a WordPiece model, no padding and no added token matched after
    /// normalization, and gives the crate's ids on every probe.
    pub fn of(tok: &Tokenizer, spec: &Value) -> Option<Self> {
        let norm = &spec["normalizer"];
        if norm["type"] != "BertNormalizer" || norm["clean_text"] == Value::Bool(false) {
            return None;
        }
        if spec["pre_tokenizer"]["type"] != "BertPreTokenizer" || !spec["padding"].is_null() {
            return None;
        }
        let model = &spec["model"];
        if model["type"] != "WordPiece" {
            return None;
        }
        let added_tokens = spec["added_tokens"].as_array().cloned().unwrap_or_default();
        if added_tokens
            .iter()
            .any(|a| a["normalized"] == Value::Bool(true))
        {
            return None;
        }
        let prefix = model["continuing_subword_prefix"].as_str().unwrap_or("##");
        let mut whole = Vocab::default();
        let mut continuing = Vocab::default();
        for (piece, id) in model["vocab"].as_object()? {
            let id = u32::try_from(id.as_u64()?).ok()?;
            whole.insert(piece.as_bytes().into(), id);
            if let Some(rest) = piece.strip_prefix(prefix) {
                continuing.insert(rest.as_bytes().into(), id);
            }
        }
        let unk = *whole.get(model["unk_token"].as_str()?.as_bytes())?;
        let mut plain = tok.clone();
        plain.with_truncation(None).ok()?;
        let probe = plain.encode_fast("a", true).ok()?;
        let mask = probe.get_special_tokens_mask();
        let first = mask.iter().position(|&m| m == 0)?;
        let last = mask.iter().rposition(|&m| m == 0)?;
        let ids = probe.get_ids();
        let specials = ids.len() - (last - first + 1);
        let keep = match tok.get_truncation() {
            None => None,
            Some(cut) => Some((
                cut.max_length.checked_sub(specials).filter(|&k| k > 0)?,
                matches!(cut.direction, tokenizers::TruncationDirection::Left),
            )),
        };
        let twin = AsciiWordPiece {
            whole,
            continuing,
            unk,
            max_chars: model["max_input_chars_per_word"].as_u64().unwrap_or(100) as usize,
            lowercase: norm["lowercase"] != Value::Bool(false),
            added: added_tokens
                .iter()
                .filter_map(|a| a["content"].as_str().map(str::to_owned))
                .collect(),
            lead: ids[..first].to_vec(),
            trail: ids[last + 1..].to_vec(),
            keep,
        };
        let x120 = "x".repeat(120);
        let probes = [
            "Hello, WORLD! It's 3.14 - e.g. x_y (z) [a] {b}\tc\r\nd ~`|\\^",
            "a",
            "",
            "   ",
            x120.as_str(),
            "unaffable antidisestablishmentarianism qzxqzx 12345678901234567890",
        ];
        for text in probes {
            let expected = tok.encode_fast(text, true).ok()?;
            if twin.takes(text) && twin.ids(text) != expected.get_ids() {
                return None;
            }
        }
        Some(twin)
    }

    /// Whether the twin's ids are the crate's for `text`: clean ASCII, no added token in it.
    pub fn takes(&self, text: &str) -> bool {
        let bytes = text.as_bytes();
        bytes.is_ascii()
            && !bytes.iter().any(|&b| removed(b))
            && !self.added.iter().any(|a| text.contains(a.as_str()))
    }

    /// `text`'s ids, special tokens included; `text` must be one the twin `takes`.
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::with_capacity(self.lead.len() + text.len() / 4 + self.trail.len());
        ids.extend_from_slice(&self.lead);
        let mut word = Vec::with_capacity(32);
        for &raw in text.as_bytes() {
            let b = if self.lowercase {
                raw.to_ascii_lowercase()
            } else {
                raw
            };
            if b.is_ascii_whitespace() || b.is_ascii_punctuation() {
                self.word(&word, &mut ids);
                word.clear();
                if b.is_ascii_punctuation() {
                    self.word(&[b], &mut ids);
                }
            } else {
                word.push(b);
            }
        }
        self.word(&word, &mut ids);
        let own = ids.len() - self.lead.len();
        if let Some((keep, from_end)) = self.keep {
            if own > keep {
                let start = self.lead.len();
                if from_end {
                    ids.drain(start..start + own - keep);
                } else {
                    ids.truncate(start + keep);
                }
            }
        }
        ids.extend_from_slice(&self.trail);
        ids
    }

    /// One word's WordPiece ids onto `out` (nothing for an empty word).
    fn word(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if let Some(&id) = self.whole.get(word) {
            out.push(id); // most words of running text: one lookup
            return;
        }
        if word.len() > self.max_chars {
            out.push(self.unk);
            return;
        }
        let before = out.len();
        let mut start = 0;
        while start < word.len() {
            let vocab = if start == 0 {
                &self.whole
            } else {
                &self.continuing
            };
            let found = (start + 1..=word.len())
                .rev()
                .find_map(|end| vocab.get(&word[start..end]).map(|&id| (id, end)));
            match found {
                Some((id, end)) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(before);
                    out.push(self.unk);
                    return;
                }
            }
        }
    }
}

//! The scoring routes' plain bodies answered natively for a cross-encoder: Cohere's
//! `POST /v1/rerank` (`query`, `documents` as strings, `model`, `top_n`, `return_documents`;
//! an over-long document cut at its end, the route's default) and `POST /v2/rerank` (`query`,
//! `documents`, `model`, `top_n`; always cut, as Cohere cuts), TEI's `POST /rerank` (`query`,
//! `texts`, `raw_scores`, `return_text`, `truncate`, `truncation_direction`) and vLLM's
//! `POST /v1/score` (one `text_1` string, `text_2`, `model`, `truncate`, `user`). The shapes
//! and rules are the Python front's (`gateway/scoring.py`); any other body, option or value is
//! not parsed here: the Python front reads it and says what is wrong with it.

use std::cmp::Ordering;
use std::num::NonZeroUsize;

use serde::Deserialize;

use super::api::{json_string, parse, wide_float, Input};
use super::pairs::Cut;

/// The scoring routes answered here (after `api::ROUTES` in the counts' order).
pub const ROUTES: [&str; 4] = ["/v1/rerank", "/rerank", "/v1/score", "/v2/rerank"];

/// A reranker's activation of its logit (the folder's: sentence-transformers' CrossEncoder
/// convention, `loading/spec.ScoreSpec.activate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Identity,
    Sigmoid,
}

impl Activation {
    pub fn of(name: &str) -> Result<Activation, String> {
        match name {
            "identity" => Ok(Activation::Identity),
            "sigmoid" => Ok(Activation::Sigmoid),
            _ => Err(format!("not an activation: {name:?}")),
        }
    }

    /// The score of a logit: the logistic in float64, stable for large |x| (as
    /// `loading/labels.sigmoid`), then float32.
    pub fn apply(self, logit: f32) -> f32 {
        let x = f64::from(logit);
        match self {
            Activation::Identity => logit,
            Activation::Sigmoid if x >= 0.0 => (1.0 / (1.0 + (-x).exp())) as f32,
            Activation::Sigmoid => {
                let e = x.exp();
                (e / (1.0 + e)) as f32
            }
        }
    }
}

/// Cohere's (and Jina's) `/v1/rerank` plain body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// a positive integer (0 is refused there)
    #[serde(default)]
    pub top_n: Option<NonZeroUsize>,
    #[serde(default)]
    pub return_documents: Option<bool>,
}

/// Cohere's `/v2/rerank` plain body (`cohere.ClientV2`'s); `priority` (a lane) goes to the
/// Python front.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankV2Request {
    pub query: String,
    pub documents: Vec<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub top_n: Option<NonZeroUsize>,
}

/// TEI's `truncation_direction`, as TEI and `huggingface_hub` spell it.
#[derive(Debug, Clone, Copy, Deserialize)]
pub enum Direction {
    #[serde(alias = "right")]
    Right,
    #[serde(alias = "left")]
    Left,
}

/// TEI's `/rerank` plain body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeiRerankRequest {
    pub query: String,
    pub texts: Vec<String>,
    #[serde(default)]
    pub raw_scores: Option<bool>,
    #[serde(default)]
    pub return_text: Option<bool>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<Direction>,
    #[serde(default)]
    pub model: Option<String>,
}

/// A scoring request's `truncate` as the request core reads it: false (or none) refuses an
/// over-long pair, "end" / "start" cut its document; `true` is not a value (the Python front
/// says so).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Truncate {
    Flag(bool),
    Side(String),
}

/// vLLM's `/v1/score` plain body: one `text_1` (a list of them goes to the Python front).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest {
    pub text_1: String,
    pub text_2: Input,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub truncate: Option<Truncate>,
    #[serde(default)]
    #[allow(dead_code)] // OpenAI-style clients send it; read for its type only
    pub user: Option<String>,
}

/// A plain body of one of `ROUTES`.
#[derive(Debug)]
pub enum Scoring {
    Cohere(RerankRequest),
    Tei(TeiRerankRequest),
    Score(ScoreRequest),
    CohereV2(RerankV2Request),
}

impl Scoring {
    /// The body of a request to `ROUTES[route]`, if it is that route's plain shape.
    pub fn parse(route: usize, body: &[u8]) -> Result<Scoring, serde_json::Error> {
        match route {
            0 => parse(body).map(Scoring::Cohere),
            1 => parse(body).map(Scoring::Tei),
            2 => parse(body).map(Scoring::Score),
            _ => parse(body).map(Scoring::CohereV2),
        }
    }

    pub fn query(&self) -> &str {
        match self {
            Scoring::Cohere(r) => &r.query,
            Scoring::Tei(r) => &r.query,
            Scoring::Score(r) => &r.text_1,
            Scoring::CohereV2(r) => &r.query,
        }
    }

    pub fn documents(&self) -> &[String] {
        match self {
            Scoring::Cohere(r) => &r.documents,
            Scoring::Tei(r) => &r.texts,
            Scoring::Score(r) => r.text_2.texts(),
            Scoring::CohereV2(r) => &r.documents,
        }
    }

    pub fn model(&self) -> Option<&str> {
        match self {
            Scoring::Cohere(r) => r.model.as_deref(),
            Scoring::Tei(r) => r.model.as_deref(),
            Scoring::Score(r) => r.model.as_deref(),
            Scoring::CohereV2(r) => r.model.as_deref(),
        }
    }

    /// What an over-long pair gets, or None for a value the Python front refuses; `rerank`:
    /// Cohere's routes', which take no `truncate` here (`gateway/scoring.RERANK_TRUNCATE`,
    /// passed in once).
    pub fn cut(&self, rerank: Cut) -> Option<Cut> {
        match self {
            Scoring::Cohere(_) | Scoring::CohereV2(_) => Some(rerank),
            Scoring::Tei(r) => Some(match (r.truncate, r.truncation_direction) {
                (Some(true), Some(Direction::Left)) => Cut::Start,
                (Some(true), _) => Cut::End,
                _ => Cut::Refuse,
            }),
            Scoring::Score(r) => match &r.truncate {
                None | Some(Truncate::Flag(false)) => Some(Cut::Refuse),
                Some(Truncate::Side(side)) => Cut::of(Some(side)).ok(),
                Some(Truncate::Flag(true)) => None,
            },
        }
    }

    /// The scores of the logits: TEI's sigmoid (its raw logit with `raw_scores`), else the
    /// model's activation.
    pub fn scores(&self, logits: impl Iterator<Item = f32>, model: Activation) -> Vec<f32> {
        let activation = match self {
            Scoring::Tei(r) if r.raw_scores == Some(true) => Activation::Identity,
            Scoring::Tei(_) => Activation::Sigmoid,
            _ => model,
        };
        logits.map(|x| activation.apply(x)).collect()
    }

    /// The answer's body, in the route's shape; `id` a new 32-hex-digit id (a UUID's digits),
    /// `now` Unix seconds.
    pub fn answer(
        &self,
        scores: &[f32],
        model: &str,
        tokens: usize,
        id: &str,
        now: u64,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + scores.len() * 48);
        let docs = self.documents();
        match self {
            Scoring::Cohere(r) => {
                push(&mut out, &format!("{{\"id\":\"rerank-{id}\",\"model\":"));
                json_string(&mut out, model);
                push(&mut out, ",\"results\":[");
                for (k, &i) in ranked(scores, r.top_n.map(NonZeroUsize::get))
                    .iter()
                    .enumerate()
                {
                    push(&mut out, if k > 0 { ",{\"index\":" } else { "{\"index\":" });
                    push(&mut out, &format!("{i},\"relevance_score\":"));
                    push_float(&mut out, scores[i]);
                    if r.return_documents == Some(true) {
                        push(&mut out, ",\"document\":{\"text\":");
                        json_string(&mut out, &docs[i]);
                        out.push(b'}');
                    }
                    out.push(b'}');
                }
                push(&mut out, "],");
                push_usage(&mut out, tokens);
            }
            Scoring::CohereV2(r) => {
                // `gateway/cohere.rerank_body`: a UUID's text, results, Cohere's meta
                let uuid = format!(
                    "{}-{}-{}-{}-{}",
                    &id[..8],
                    &id[8..12],
                    &id[12..16],
                    &id[16..20],
                    &id[20..]
                );
                push(&mut out, &format!("{{\"id\":\"{uuid}\",\"results\":["));
                for (k, &i) in ranked(scores, r.top_n.map(NonZeroUsize::get))
                    .iter()
                    .enumerate()
                {
                    push(&mut out, if k > 0 { ",{\"index\":" } else { "{\"index\":" });
                    push(&mut out, &format!("{i},\"relevance_score\":"));
                    push_float(&mut out, scores[i]);
                    out.push(b'}');
                }
                push(&mut out, "],\"meta\":{\"api_version\":{\"version\":\"2\"},");
                push(&mut out, "\"billed_units\":{\"search_units\":1}}}");
            }
            Scoring::Tei(r) => {
                out.push(b'[');
                for (k, &i) in ranked(scores, None).iter().enumerate() {
                    push(&mut out, if k > 0 { ",{\"index\":" } else { "{\"index\":" });
                    push(&mut out, &format!("{i},\"score\":"));
                    push_float(&mut out, scores[i]);
                    if r.return_text == Some(true) {
                        push(&mut out, ",\"text\":");
                        json_string(&mut out, &docs[i]);
                    }
                    out.push(b'}');
                }
                out.push(b']');
            }
            Scoring::Score(_) => {
                push(
                    &mut out,
                    &format!("{{\"id\":\"score-{id}\",\"object\":\"list\","),
                );
                push(&mut out, &format!("\"created\":{now},\"model\":"));
                json_string(&mut out, model);
                push(&mut out, ",\"data\":[");
                for (i, &score) in scores.iter().enumerate() {
                    let comma = if i > 0 { "," } else { "" };
                    push(
                        &mut out,
                        &format!("{comma}{{\"index\":{i},\"object\":\"score\","),
                    );
                    push(&mut out, "\"score\":");
                    push_float(&mut out, score);
                    out.push(b'}');
                }
                push(&mut out, "],");
                push_usage(&mut out, tokens);
            }
        }
        out
    }
}

/// Whether the Python front refuses `text` as empty (`str.strip()`: Unicode's white space and
/// the information separators U+001C to U+001F).
pub fn blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Indices by descending score, ties in input order (a stable sort, as `core/pairs.ranked`);
/// the first `top_n` (None: all).
pub fn ranked(scores: &[f32], top_n: Option<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap_or(Ordering::Equal));
    order.truncate(top_n.unwrap_or(scores.len()));
    order
}

fn push(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
}

/// A score as the Python front writes it (`api::wide_float`).
fn push_float(out: &mut Vec<u8>, score: f32) {
    wide_float(out, score, &mut ryu::Buffer::new());
}

fn push_usage(out: &mut Vec<u8>, tokens: usize) {
    push(
        out,
        &format!("\"usage\":{{\"prompt_tokens\":{tokens},\"total_tokens\":{tokens}}}}}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(body: &[u8]) -> serde_json::Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn the_plain_bodies_of_each_route() {
        let cohere = Scoring::parse(
            0,
            br#"{"query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": true}"#,
        )
        .unwrap();
        assert_eq!(
            (cohere.query(), cohere.documents()),
            ("q", &["a".to_string(), "b".into()][..])
        );
        assert_eq!(cohere.cut(Cut::End), Some(Cut::End));
        let tei = Scoring::parse(
            1,
            br#"{"query": "q", "texts": ["a"], "truncate": true, "truncation_direction": "left"}"#,
        )
        .unwrap();
        assert_eq!(tei.cut(Cut::End), Some(Cut::Start));
        let tei = Scoring::parse(1, br#"{"query": "q", "texts": ["a"]}"#).unwrap();
        assert_eq!(tei.cut(Cut::End), Some(Cut::Refuse));
        let score = Scoring::parse(2, br#"{"text_1": "q", "text_2": "a", "truncate": "end"}"#);
        let score = score.unwrap();
        assert_eq!(
            (score.documents().len(), score.cut(Cut::End)),
            (1, Some(Cut::End))
        );
        let flagged = Scoring::parse(2, br#"{"text_1": "q", "text_2": ["a"], "truncate": true}"#);
        assert_eq!(flagged.unwrap().cut(Cut::End), None);
    }

    #[test]
    fn other_shapes_are_the_python_fronts() {
        for (route, body) in [
            (0, &br#"{"query": "q", "documents": [{"text": "a"}]}"#[..]),
            (0, br#"{"query": "q", "documents": ["a"], "top_n": true}"#),
            (0, br#"{"query": "q", "documents": ["a"], "top_n": -1}"#),
            (0, br#"{"query": "q", "documents": ["a"], "top_n": 0}"#),
            (0, br#"{"query": "q", "documents": ["a"], "top_n": 2.0}"#),
            (
                0,
                br#"{"query": "q", "documents": ["a"], "truncate": false}"#,
            ),
            (
                0,
                br#"{"query": "q", "documents": ["a"], "instruction": "x"}"#,
            ),
            (0, br#"{"query": "q", "documents": "a"}"#),
            (0, br#"{"documents": ["a"]}"#),
            (
                1,
                br#"{"query": "q", "texts": ["a"], "truncation_direction": "Up"}"#,
            ),
            (1, br#"{"query": "q", "texts": ["a"], "raw_scores": 1}"#),
            (2, br#"{"text_1": ["q", "r"], "text_2": ["a", "b"]}"#),
            (
                2,
                br#"{"text_1": "q", "text_2": ["a"], "weights": [1, 0, 0]}"#,
            ),
            (2, br#"["q", "a"]"#),
            (3, br#"{"query": "q", "documents": ["a"], "priority": 1}"#),
            (
                3,
                br#"{"query": "q", "documents": ["a"], "max_tokens_per_doc": 4}"#,
            ),
            (
                3,
                br#"{"query": "q", "documents": ["a"], "return_documents": true}"#,
            ),
        ] {
            let parsed = Scoring::parse(route, body);
            assert!(parsed.is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn ranks_are_stable_and_cut_at_top_n() {
        assert_eq!(ranked(&[0.1, 0.9, 0.1, 0.5], None), vec![1, 3, 0, 2]);
        assert_eq!(ranked(&[0.1, 0.9, 0.1, 0.5], Some(2)), vec![1, 3]);
    }

    #[test]
    fn the_logistic_is_stable_and_float32() {
        assert_eq!(Activation::Sigmoid.apply(0.0), 0.5);
        assert_eq!(Activation::Sigmoid.apply(-1000.0), 0.0);
        assert_eq!(Activation::Sigmoid.apply(1000.0), 1.0);
        assert_eq!(Activation::Identity.apply(-2.5), -2.5);
        assert!((Activation::Sigmoid.apply(2.0) - 0.880_797_1).abs() < 1e-7);
    }

    #[test]
    fn the_answers_read_back_in_each_shape() {
        let scores = [0.25f32, 0.75, -0.1];
        let cohere = Scoring::parse(
            0,
            br#"{"query": "q", "documents": ["a", "b\"", "c"], "top_n": 2, "return_documents": true}"#,
        )
        .unwrap();
        let v = json(&cohere.answer(&scores, "m", 9, "ab", 0));
        assert_eq!(v["id"], "rerank-ab");
        assert_eq!(v["results"][0]["index"], 1);
        assert_eq!(v["results"][0]["document"]["text"], "b\"");
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert_eq!(v["results"][1]["relevance_score"].as_f64(), Some(0.25));
        assert_eq!(v["usage"]["total_tokens"], 9);
        let tei = Scoring::parse(
            1,
            br#"{"query": "q", "texts": ["a", "b", "c"], "return_text": true}"#,
        );
        let v = json(&tei.unwrap().answer(&scores, "m", 9, "ab", 0));
        assert_eq!(v[2]["index"], 2);
        assert_eq!(v[2]["text"], "c");
        let score = Scoring::parse(2, br#"{"text_1": "q", "text_2": ["a", "b", "c"]}"#).unwrap();
        let v = json(&score.answer(&scores, "m", 9, "ab", 7));
        assert_eq!(
            (v["created"].as_u64(), v["data"][2]["index"].as_u64()),
            (Some(7), Some(2))
        );
        assert_eq!(v["data"][2]["score"].as_f64(), Some(f64::from(-0.1f32)));
        assert_eq!(v["model"], "m");
        let v2 = Scoring::parse(
            3,
            br#"{"model": "m", "query": "q", "documents": ["a", "b", "c"]}"#,
        );
        let v2 = v2.unwrap();
        assert_eq!(v2.cut(Cut::Start), Some(Cut::Start));
        let id = "0123456789abcdef0123456789abcdef";
        let v = json(&v2.answer(&scores, "m", 9, id, 0));
        assert_eq!(v["id"], "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(v["results"][0]["index"], 1);
        assert_eq!(v["meta"]["billed_units"]["search_units"], 1);
    }

    #[test]
    fn blank_is_what_pythons_strip_empties() {
        assert!(blank(" \t\n\u{a0}\u{3000}\u{1c}"));
        assert!(!blank(" a "));
    }
}

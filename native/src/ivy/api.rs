//! The embedding routes' plain bodies answered natively: OpenAI's `POST /v1/embeddings`
//! (`input` as text, `model`, `encoding_format` float or base64, `user`) and TEI's `POST /embed`
//! (`inputs` as text, `normalize`, `truncate`), parsed with serde, and their answers written by
//! hand (floats by `ryu`, base64 of little-endian float32). Any other body is not parsed here:
//! the Python front reads it and says what is wrong with it.

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// The routes answered here, in the order of their counts (`Gateway.take_counts`).
pub const ROUTES: [&str; 2] = ["/v1/embeddings", "/embed"];

/// TEI's sparse route, answered here for a sparse model (`routes`).
pub const SPARSE_ROUTE: &str = "/embed_sparse";

/// `input`: one text or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// `POST /v1/embeddings`'s plain body: any other field (prompts, `dimensions`, `truncate`,
/// ...), a duplicate one or another type is an error here, and the request goes to the
/// Python front.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsRequest {
    pub input: Input,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    #[serde(default)]
    #[allow(dead_code)] // OpenAI's clients send it; read for its type only
    pub user: Option<String>,
}

impl Input {
    pub fn texts(&self) -> &[String] {
        match self {
            Input::One(text) => std::slice::from_ref(text),
            Input::Many(texts) => texts,
        }
    }
}

/// TEI's `POST /embed` plain body: `normalize` (null: the model's own) and `truncate` (a text
/// too long to be answered here is handed over, which cuts it when asked: so any value will
/// do); `dimensions`, `prompt_name` or `truncation_direction` send it to the Python front.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeiEmbedRequest {
    pub inputs: Input,
    #[serde(default)]
    pub normalize: Option<bool>,
    #[serde(default)]
    #[allow(dead_code)] // read for its type only (see above)
    pub truncate: Option<bool>,
}

/// TEI's `POST /embed_sparse` plain body: `truncate` as `/embed`'s (any value will do);
/// `truncation_direction` or `prompt_name` send it to the Python front.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeiSparseRequest {
    pub inputs: Input,
    #[serde(default)]
    #[allow(dead_code)] // read for its type only (see `TeiEmbedRequest`)
    pub truncate: Option<bool>,
    #[serde(default)]
    pub model: Option<String>,
}

/// TEI's `/embed_sparse` answer: per input, its entries as `{"index", "value"}` (CSR rows:
/// `offsets`, ascending `indices`, `values`), each value the float32 widened to float64 and
/// written shortest, as the Python front writes it; None for rows that do not add up.
pub fn sparse_answer(offsets: &[i64], indices: &[i64], values: &[f32]) -> Option<Vec<u8>> {
    if indices.len() != values.len() || offsets.last().copied() != Some(indices.len() as i64) {
        return None;
    }
    let mut out = Vec::with_capacity(2 + indices.len() * 32);
    let mut floats = ryu::Buffer::new();
    out.push(b'[');
    for (row, w) in offsets.windows(2).enumerate() {
        let (a, b) = (usize::try_from(w[0]).ok()?, usize::try_from(w[1]).ok()?);
        if row > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (k, (index, value)) in indices.get(a..b)?.iter().zip(&values[a..b]).enumerate() {
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(format!("{{\"index\":{index},\"value\":").as_bytes());
            wide_float(&mut out, *value, &mut floats);
            out.push(b'}');
        }
        out.push(b']');
    }
    out.push(b']');
    Some(out)
}

/// A plain body of one of `ROUTES`.
#[derive(Debug)]
pub enum Plain {
    OpenAi(EmbeddingsRequest),
    Tei(TeiEmbedRequest),
}

impl Plain {
    /// The body of a request to `ROUTES[route]`, if it is that route's plain shape.
    pub fn parse(route: usize, body: &[u8]) -> Result<Plain, serde_json::Error> {
        match route {
            0 => parse(body).map(Plain::OpenAi),
            _ => parse(body).map(Plain::Tei),
        }
    }

    pub fn texts(&self) -> &[String] {
        match self {
            Plain::OpenAi(request) => request.input.texts(),
            Plain::Tei(request) => request.inputs.texts(),
        }
    }

    /// The model the body names, if any (TEI's route names none).
    pub fn model(&self) -> Option<&str> {
        match self {
            Plain::OpenAi(request) => request.model.as_deref(),
            Plain::Tei(_) => None,
        }
    }

    /// Whether the rows leave as unit vectors: the body's `normalize`, else the model's.
    pub fn normalize(&self, model_default: bool) -> bool {
        match self {
            Plain::OpenAi(_) => model_default,
            Plain::Tei(request) => request.normalize.unwrap_or(model_default),
        }
    }

    /// The answer's body, in the route's shape.
    pub fn answer(&self, rows: &[f32], width: usize, model: &str, tokens: usize) -> Vec<u8> {
        match self {
            Plain::OpenAi(request) => {
                let base64 = matches!(request.encoding_format, Some(EncodingFormat::Base64));
                answer(rows, width, model, tokens, base64)
            }
            Plain::Tei(_) => tei_answer(rows, width),
        }
    }
}

/// The body parsed, if it is the plain shape: a JSON object (serde's derived struct would take
/// an array of the fields' values in order too, which the Python front refuses).
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => serde_json::from_slice(body),
        _ => Err(serde::de::Error::custom("the body is not a JSON object")),
    }
}

/// Each row scaled to unit length, as the request core's head does (`core/head.apply_head`: over
/// the norm, at least 1e-12).
pub fn normalize(rows: &mut [f32], width: usize) {
    for row in rows.chunks_exact_mut(width.max(1)) {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        row.iter_mut().for_each(|v| *v /= norm);
    }
}

/// The answer's body: one row of `width` floats per input, in order.
pub fn answer(rows: &[f32], width: usize, model: &str, tokens: usize, base64: bool) -> Vec<u8> {
    let num = rows.len().checked_div(width).unwrap_or(0);
    let mut out = Vec::with_capacity(64 + num * (48 + width * if base64 { 6 } else { 12 }));
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    for (i, row) in rows.chunks_exact(width.max(1)).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"object\":\"embedding\",\"index\":");
        out.extend_from_slice(i.to_string().as_bytes());
        out.extend_from_slice(b",\"embedding\":");
        if base64 {
            let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
            out.push(b'"');
            out.extend_from_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(bytes)
                    .as_bytes(),
            );
            out.push(b'"');
        } else {
            float_row(&mut out, row);
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"model\":");
    json_string(&mut out, model);
    out.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(b",\"total_tokens\":");
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(b"}}");
    out
}

/// TEI's answer: a JSON array of rows of floats.
pub fn tei_answer(rows: &[f32], width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + rows.len() * 12);
    out.push(b'[');
    for (i, row) in rows.chunks_exact(width.max(1)).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        float_row(&mut out, row);
    }
    out.push(b']');
    out
}

/// A JSON string of `text`, escaped.
pub fn json_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(serde_json::to_string(text).unwrap_or_default().as_bytes());
}

/// A float32 as the Python front writes a value it read as a Python float: widened to
/// float64, its shortest text (a score, a sparse value); a 0 for what JSON cannot hold (see
/// `float_row`).
pub fn wide_float(out: &mut Vec<u8>, value: f32, floats: &mut ryu::Buffer) {
    let wide = f64::from(value);
    let text = if wide.is_finite() {
        floats.format_finite(wide)
    } else {
        "0"
    };
    out.extend_from_slice(text.as_bytes());
}

/// One row as a JSON array of floats, each the shortest text that reads back as its float32.
fn float_row(out: &mut Vec<u8>, row: &[f32]) {
    out.push(b'[');
    for (j, v) in row.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        // NOTE: JSON has no NaN or infinity; the engine's guard keeps them out, and a 0 is
        // written rather than an unparsable body if one slips through
        if v.is_finite() {
            push_f32(out, *v);
        } else {
            out.push(b'0');
        }
    }
    out.push(b']');
}

/// The shortest text of a finite float32 (`ryu::Buffer::format_finite`'s), written by ryu into
/// `out` itself. NOTE: through a `ryu::Buffer`, a libc memmove per float of its text into the
/// answer was ~4% of a short request's CPU (384 floats).
fn push_f32(out: &mut Vec<u8>, value: f32) {
    const MOST: usize = 16; // ryu's bound on a float32's text
    out.reserve(MOST);
    let spare = out.spare_capacity_mut();
    // SAFETY: `spare` holds at least MOST bytes (reserved above), ryu writes at most MOST there
    // and returns how many it wrote, so the first `len` bytes past the end are initialized.
    unsafe {
        let len = ryu::raw::format32(value, spare.as_mut_ptr().cast::<u8>());
        out.set_len(out.len() + len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_text_or_many() {
        let one: EmbeddingsRequest =
            parse(br#"{"input": "a", "model": "m", "user": "u"}"#).unwrap();
        assert_eq!(one.input.texts(), ["a"]);
        let many: EmbeddingsRequest =
            parse(br#"{"input": ["a", "b"], "encoding_format": "base64"}"#).unwrap();
        assert_eq!(many.input.texts(), ["a", "b"]);
        assert!(matches!(many.encoding_format, Some(EncodingFormat::Base64)));
        let nulls: EmbeddingsRequest =
            parse(br#"{"input": "a", "model": null, "encoding_format": null}"#).unwrap();
        assert!(nulls.model.is_none() && nulls.encoding_format.is_none());
    }

    #[test]
    fn other_shapes_are_not_the_plain_body() {
        for body in [
            &br#"{"input": 3}"#[..],
            br#"{"input": ["a", 1]}"#,
            br#"{"input": [1, 2, 3]}"#,
            br#"{"model": "m"}"#,
            br#"{"input": "a", "dimensions": 8}"#,
            br#"{"input": "a", "input": "b"}"#,
            br#"{"input": "a", "encoding_format": "base64_packed"}"#,
            br#"{"input": "a", "user": 1}"#,
            br#"["a"]"#,
            br#" ["a", "m", "float"]"#,
            b"{\"input\": \"a\"",
            b"{\"input\": \"\\ud800\"}",
        ] {
            let parsed = Plain::parse(0, body);
            assert!(parsed.is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    /// A row's floats are ryu's shortest texts, read back as the same float32: the extremes,
    /// subnormals, signed zero and 100,000 random bit patterns (xorshift, fixed seed).
    #[test]
    fn each_float_is_written_as_ryus_shortest_text() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-5,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
        ];
        values.extend([
            f32::from_bits(1),
            -f32::from_bits(0x007f_ffff),
            0.1,
            1.0 / 3.0,
        ]);
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let value = f32::from_bits(state as u32);
            if value.is_finite() {
                values.push(value);
            }
        }
        let mut out = Vec::new();
        float_row(&mut out, &values);
        let text = String::from_utf8(out).unwrap();
        let mut floats = ryu::Buffer::new();
        let expected: Vec<String> = values
            .iter()
            .map(|v| floats.format_finite(*v).to_string())
            .collect();
        let expected = format!("[{}]", expected.join(","));
        assert_eq!(text, expected);
        let read: Vec<f32> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            read.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    /// A fuzz of the body parsers (the scoring routes' too) with a fixed seed (no crate: xorshift): random bytes and valid
    /// bodies with bytes flipped, cut or repeated. Every one is parsed or refused as a 400 with
    /// a message; none panics.
    #[test]
    fn any_body_is_parsed_or_refused_never_a_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds: [&[u8]; 7] = [
            br#"{"input": ["a text", "another"], "model": "m", "encoding_format": "base64"}"#,
            br#"{"input": "one", "user": {"nested": [1, 2, {"x": null}]}}"#,
            "{\"input\": [\"caf\u{e9}\", \"\\ud83d\\ude00\"]}".as_bytes(),
            b"[]",
            br#"{"inputs": ["x", "y"], "normalize": true, "truncate": false}"#,
            br#"{"query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": true}"#,
            br#"{"text_1": "q", "text_2": ["a"], "truncate": "end", "texts": ["z"]}"#,
        ];
        for round in 0..20_000 {
            let body: Vec<u8> = if round % 4 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect()
            } else {
                let mut body = seeds[(next() % seeds.len() as u64) as usize].to_vec();
                for _ in 0..=(next() % 4) {
                    let at = (next() as usize) % body.len().max(1);
                    match next() % 3 {
                        0 if !body.is_empty() => body[at] = next() as u8,
                        1 => body.truncate(at),
                        _ => {
                            let piece = body[at..].to_vec();
                            body.extend_from_slice(&piece);
                        }
                    }
                }
                body
            };
            for route in 0..ROUTES.len() {
                if let Ok(request) = Plain::parse(route, &body) {
                    let _ = request.texts(); // parsed or refused; either way no panic
                }
            }
            for route in 0..super::super::scoring::ROUTES.len() {
                if let Ok(request) = super::super::scoring::Scoring::parse(route, &body) {
                    let _ = (
                        request.documents(),
                        request.cut(super::super::pairs::Cut::End),
                    );
                }
            }
        }
    }

    #[test]
    fn teis_plain_body_and_answer() {
        let one = Plain::parse(
            1,
            br#"{"inputs": "a", "normalize": false, "truncate": true}"#,
        );
        let one = one.unwrap();
        assert_eq!(one.texts(), ["a"]);
        assert!(!one.normalize(true) && one.model().is_none());
        let many = Plain::parse(1, br#"{"inputs": ["a", "b"], "normalize": null}"#).unwrap();
        assert_eq!(many.texts(), ["a", "b"]);
        assert!(many.normalize(true));
        for body in [
            &br#"{"input": "a"}"#[..],
            br#"{"inputs": "a", "dimensions": 8}"#,
            br#"{"inputs": "a", "prompt_name": "query"}"#,
            br#"{"inputs": "a", "truncation_direction": "Left"}"#,
            br#"{"inputs": "a", "normalize": "yes"}"#,
            br#"{"inputs": "a", "model": "m"}"#,
            br#"["a"]"#,
        ] {
            let parsed = Plain::parse(1, body);
            assert!(parsed.is_err(), "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(
            tei_answer(&[0.5, -1.0, 0.25, 2.0], 2),
            b"[[0.5,-1.0],[0.25,2.0]]"
        );
        let answer = one.answer(&[1.0, 0.0], 2, "m", 3);
        assert_eq!(answer, b"[[1.0,0.0]]");
    }

    #[test]
    fn teis_sparse_body_and_answer() {
        let plain: TeiSparseRequest =
            parse(br#"{"inputs": ["a", "b"], "truncate": true}"#).unwrap();
        assert_eq!(plain.inputs.texts(), ["a", "b"]);
        for body in [
            &br#"{"inputs": "a", "prompt_name": "query"}"#[..],
            br#"{"inputs": "a", "truncation_direction": "Left"}"#,
            br#"{"input": "a"}"#,
        ] {
            assert!(parse::<TeiSparseRequest>(body).is_err());
        }
        let answer = sparse_answer(&[0, 2, 2, 3], &[5, 9, 7], &[0.5, 1.25, 0.1]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v[0][1]["index"], 9);
        assert_eq!(v[0][1]["value"], 1.25);
        assert_eq!(v[1].as_array().unwrap().len(), 0);
        assert_eq!(v[2][0]["value"].as_f64(), Some(f64::from(0.1f32)));
        assert!(sparse_answer(&[0, 4], &[1, 2], &[0.5, 0.5]).is_none());
    }

    #[test]
    fn rows_are_scaled_to_unit_length() {
        let mut rows = [3.0f32, 4.0, 0.0, 0.0];
        normalize(&mut rows, 2);
        assert_eq!(rows, [0.6, 0.8, 0.0, 0.0]);
    }

    #[test]
    fn the_answer_is_json_that_reads_back() {
        let rows = [0.5f32, -0.25, 1e-8, 3.0];
        let body = answer(&rows, 2, "mini\"lm", 7, false);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["data"][1]["embedding"][0].as_f64().unwrap() as f32, 1e-8);
        assert_eq!(v["model"], "mini\"lm");
        assert_eq!(v["usage"]["total_tokens"], 7);
        let b64 = answer(&rows, 2, "m", 7, true);
        let v: serde_json::Value = serde_json::from_slice(&b64).unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v["data"][0]["embedding"].as_str().unwrap())
            .unwrap();
        assert_eq!(f32::from_le_bytes(raw[4..8].try_into().unwrap()), -0.25);
    }
}

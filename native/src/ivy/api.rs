//! The OpenAI embeddings shape: the request body parsed with serde, the answer written by hand
//! (floats by `ryu`, base64 of little-endian float32), and errors as
//! `{"error": {"message", "type", "param", "code"}}` with their HTTP status.

use base64::Engine as _;
use serde::Deserialize;

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

/// `POST /v1/embeddings`'s body (the fields the prototype reads; others are ignored, as
/// OpenAI's clients send `user` and the like).
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub input: Input,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
}

impl EmbeddingsRequest {
    pub fn texts(&self) -> &[String] {
        match &self.input {
            Input::One(text) => std::slice::from_ref(text),
            Input::Many(texts) => texts,
        }
    }
}

/// An answer that is not 200: its status and its OpenAI-shape body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    pub fn invalid(code: &'static str, param: Option<&'static str>, message: String) -> Self {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            code,
            param,
            message,
        }
    }

    pub fn body(&self) -> Vec<u8> {
        let error = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        });
        serde_json::to_vec(&error).unwrap_or_default()
    }
}

/// The body parsed, or a 400 that says what was wrong and where (serde's line and column).
pub fn parse(body: &[u8]) -> Result<EmbeddingsRequest, ApiError> {
    let request: EmbeddingsRequest = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "invalid_body",
            None,
            format!("the body is not an embeddings request: {e}"),
        )
    })?;
    if request.texts().is_empty() {
        return Err(ApiError::invalid(
            "empty_input",
            Some("input"),
            "input is an empty list: give at least one text".into(),
        ));
    }
    if let Some(i) = request.texts().iter().position(|t| t.is_empty()) {
        return Err(ApiError::invalid(
            "empty_text",
            Some("input"),
            format!("input[{i}] is an empty string: every input needs at least one token"),
        ));
    }
    Ok(request)
}

/// Each row scaled to unit length (a zero row stays zero), as the model's Normalize module does.
pub fn normalize(rows: &mut [f32], width: usize) {
    for row in rows.chunks_exact_mut(width.max(1)) {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        if norm > 0.0 {
            row.iter_mut().for_each(|v| *v /= norm);
        }
    }
}

/// The answer's body: one row of `width` floats per input, in order.
pub fn answer(rows: &[f32], width: usize, model: &str, tokens: usize, base64: bool) -> Vec<u8> {
    let num = rows.len().checked_div(width).unwrap_or(0);
    let mut out = Vec::with_capacity(64 + num * (48 + width * if base64 { 6 } else { 12 }));
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    let mut floats = ryu::Buffer::new();
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
            out.push(b'[');
            for (j, v) in row.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                // NOTE: JSON has no NaN or infinity; the engine's guard keeps them out, and a 0
                // is written rather than an unparsable body if one slips through
                out.extend_from_slice(
                    if v.is_finite() {
                        floats.format_finite(*v)
                    } else {
                        "0"
                    }
                    .as_bytes(),
                );
            }
            out.push(b']');
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"model\":");
    out.extend_from_slice(serde_json::to_string(model).unwrap_or_default().as_bytes());
    out.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(b",\"total_tokens\":");
    out.extend_from_slice(tokens.to_string().as_bytes());
    out.extend_from_slice(b"}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_text_or_many() {
        let one = parse(br#"{"input": "a", "model": "m", "user": "u"}"#).unwrap();
        assert_eq!(one.texts(), ["a"]);
        let many = parse(br#"{"input": ["a", "b"], "encoding_format": "base64"}"#).unwrap();
        assert_eq!(many.texts(), ["a", "b"]);
        assert!(matches!(many.encoding_format, Some(EncodingFormat::Base64)));
    }

    #[test]
    fn bad_bodies_say_what_and_where() {
        for (body, code) in [
            (&br#"{"input": 3}"#[..], "invalid_body"),
            (&br#"{"input": ["a", 1]}"#[..], "invalid_body"),
            (&br#"{"model": "m"}"#[..], "invalid_body"),
            (&br#"{"input": []}"#[..], "empty_input"),
            (&br#"{"input": ["a", ""]}"#[..], "empty_text"),
            (&b"{\"input\": \"a\""[..], "invalid_body"),
            (
                &br#"{"input": "a", "encoding_format": "int4"}"#[..],
                "invalid_body",
            ),
        ] {
            let err = parse(body).unwrap_err();
            assert_eq!((err.status, err.code), (400, code), "{err:?}");
            let back: serde_json::Value = serde_json::from_slice(&err.body()).unwrap();
            assert_eq!(back["error"]["code"], code);
        }
        let err = parse(br#"{"input": ["a", ""]}"#).unwrap_err();
        assert!(err.message.contains("input[1]"));
    }

    /// A fuzz of the body parser with a fixed seed (no crate: xorshift): random bytes and valid
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
        let seeds: [&[u8]; 4] = [
            br#"{"input": ["a text", "another"], "model": "m", "encoding_format": "base64"}"#,
            br#"{"input": "one", "user": {"nested": [1, 2, {"x": null}]}}"#,
            "{\"input\": [\"caf\u{e9}\", \"\\ud83d\\ude00\"]}".as_bytes(),
            b"[]",
        ];
        for round in 0..20_000 {
            let body: Vec<u8> = if round % 4 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect()
            } else {
                let mut body = seeds[(next() % 4) as usize].to_vec();
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
            match parse(&body) {
                Ok(request) => assert!(!request.texts().is_empty()),
                Err(e) => assert!(e.status == 400 && !e.message.is_empty(), "{e:?}"),
            }
        }
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

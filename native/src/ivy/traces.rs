//! Spans of the requests answered here, under `--otlp-endpoint`, in the Python path's shape
//! (`contract/tracing.py`): one trace per request, `gateway request` (the HTTP request, a child
//! of the caller's `traceparent`), and for each part `server request` (queued to answered) under
//! it and `engine step` (its batch's run) under that, each with the request id. Recorded here
//! when the request is answered, held (at most `max`, then dropped and counted), and taken by
//! the Python exporter (`Gateway.take_spans`), which encodes and posts them with the Python
//! front's own: one OTLP writer. A request handed to the Python front is traced there.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use hyper::http::request::Parts;

tokio::task_local! {
    /// The traced request this task answers (`Traces::begin`).
    pub static TRACE: std::sync::Arc<RequestTrace>;
}

/// OTLP's span kinds, as `contract/tracing.py` has them.
pub const SERVER: u8 = 2;
pub const INTERNAL: u8 = 1;

/// A finished span.
pub struct Span {
    pub name: &'static str,
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// empty: a trace's root
    pub parent: Vec<u8>,
    pub kind: u8,
    pub start_ns: u64,
    pub end_ns: u64,
    pub strings: Vec<(&'static str, String)>,
    pub ints: Vec<(&'static str, i64)>,
}

/// A part's times, as a traced request's `in_turn` saw them.
struct Part {
    submitted_ns: u64,
    answered_ns: u64,
    queue: f64,
    inference: f64,
    tokens: usize,
}

/// A request being answered here, traced.
pub struct RequestTrace {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Vec<u8>,
    pub request_id: String,
    start_ns: u64,
    method: String,
    route: &'static str,
    parts: Mutex<Vec<Part>>,
}

impl RequestTrace {
    /// A part submitted at `submitted_ns` was answered now, `queue` and `inference` seconds
    /// after its submission (Tulip's stage times).
    pub fn part(&self, submitted_ns: u64, queue: f64, inference: f64, tokens: usize) {
        if let Ok(mut parts) = self.parts.lock() {
            parts.push(Part {
                submitted_ns,
                answered_ns: wall_ns(),
                queue,
                inference,
                tokens,
            });
        }
    }
}

/// Every span not yet taken.
pub struct Traces {
    spans: Mutex<Vec<Span>>,
    max: usize,
    dropped: AtomicU64,
    ids: RandomState,
    next: AtomicU64,
}

/// Now, in nanoseconds since the Unix epoch (OTLP's clock).
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A W3C `traceparent`'s (trace id, span id); None for a missing or malformed one.
fn parse_traceparent(value: &[u8]) -> Option<([u8; 16], [u8; 8])> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let parts: Vec<&str> = text.split('-').collect();
    let [_, trace, span, _] = parts.as_slice() else {
        return None;
    };
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex(trace, &mut trace_id)?;
    hex(span, &mut span_id)?;
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    (!zero(&trace_id) && !zero(&span_id)).then_some((trace_id, span_id))
}

fn hex(text: &str, out: &mut [u8]) -> Option<()> {
    if text.len() != out.len() * 2 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(())
}

impl Traces {
    pub fn new(max: usize) -> Self {
        Traces {
            spans: Mutex::new(Vec::new()),
            max,
            dropped: AtomicU64::new(0),
            ids: RandomState::new(),
            next: AtomicU64::new(0),
        }
    }

    /// `N` random bytes, never all zero.
    fn id<const N: usize>(&self) -> [u8; N] {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let word = self.ids.hash_one(n).max(1).to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        out
    }

    /// A request to `route` about to be answered here: its trace, a child of the caller's
    /// `traceparent` header if it sent a valid one.
    pub fn begin(&self, parts: &Parts, route: &'static str, request_id: Vec<u8>) -> RequestTrace {
        let caller = parts
            .headers
            .get("traceparent")
            .and_then(|v| parse_traceparent(v.as_bytes()));
        let (trace_id, parent) = match caller {
            Some((trace_id, span_id)) => (trace_id, span_id.to_vec()),
            None => (self.id::<16>(), Vec::new()),
        };
        RequestTrace {
            trace_id,
            span_id: self.id::<8>(),
            parent,
            request_id: String::from_utf8_lossy(&request_id).into_owned(),
            start_ns: wall_ns(),
            method: parts.method.as_str().to_string(),
            route,
            parts: Mutex::new(Vec::new()),
        }
    }

    /// The request was answered with `status`: its spans, held for the exporter.
    pub fn finish(&self, trace: &RequestTrace, status: u16) {
        let id = || ("embedserve.request_id", trace.request_id.clone());
        let mut spans = vec![Span {
            name: "gateway request",
            trace_id: trace.trace_id,
            span_id: trace.span_id,
            parent: trace.parent.clone(),
            kind: SERVER,
            start_ns: trace.start_ns,
            end_ns: wall_ns(),
            strings: vec![
                id(),
                ("http.request.method", trace.method.clone()),
                ("http.route", trace.route.to_string()),
            ],
            ints: vec![("http.response.status_code", i64::from(status))],
        }];
        let parts = trace
            .parts
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default();
        let count = parts.len() as i64;
        for part in parts {
            let server = self.id::<8>();
            let taken = part.submitted_ns + (part.queue * 1e9) as u64;
            let ran = (part.inference * 1e9) as u64;
            spans.push(Span {
                name: "server request",
                trace_id: trace.trace_id,
                span_id: server,
                parent: trace.span_id.to_vec(),
                kind: SERVER,
                start_ns: part.submitted_ns,
                end_ns: part.answered_ns.max(part.submitted_ns),
                strings: vec![id()],
                ints: vec![("embedserve.parts", count)],
            });
            spans.push(Span {
                name: "engine step",
                trace_id: trace.trace_id,
                span_id: self.id::<8>(),
                parent: server.to_vec(),
                kind: INTERNAL,
                start_ns: taken,
                end_ns: taken + ran,
                strings: vec![id()],
                ints: vec![("embedserve.tokens", part.tokens as i64)],
            });
        }
        let Ok(mut held) = self.spans.lock() else {
            return;
        };
        let room = self.max.saturating_sub(held.len());
        if spans.len() > room {
            self.dropped
                .fetch_add(spans.len() as u64, Ordering::Relaxed);
            return; // an exporter that cannot keep up never slows requests down
        }
        held.extend(spans);
    }

    /// Every span held, and how many were dropped since the last take.
    pub fn take(&self) -> (Vec<Span>, u64) {
        let spans = self
            .spans
            .lock()
            .map(|mut held| std::mem::take(&mut *held))
            .unwrap_or_default();
        (spans, self.dropped.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(traceparent: Option<&str>) -> Parts {
        let mut request = hyper::Request::post("/v1/embeddings");
        if let Some(value) = traceparent {
            request = request.header("traceparent", value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_request_is_one_trace_its_parts_under_its_span() {
        let traces = Traces::new(100);
        let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = traces.begin(&parts(Some(caller)), "/v1/embeddings", b"rid".to_vec());
        trace.part(wall_ns(), 0.001, 0.002, 7);
        traces.finish(&trace, 200);
        let (spans, dropped) = traces.take();
        assert_eq!(dropped, 0);
        let names: Vec<_> = spans.iter().map(|s| s.name).collect();
        assert_eq!(names, ["gateway request", "server request", "engine step"]);
        let (gateway, server, engine) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(
            gateway.parent,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(spans.iter().all(|s| s.trace_id == gateway.trace_id));
        assert_eq!(server.parent, gateway.span_id.to_vec());
        assert_eq!(engine.parent, server.span_id.to_vec());
        assert!(spans
            .iter()
            .all(|s| s.strings[0] == ("embedserve.request_id", "rid".into())));
        assert!(engine.start_ns >= server.start_ns && engine.end_ns - engine.start_ns == 2_000_000);
    }

    #[test]
    fn a_bad_traceparent_starts_a_trace_and_a_full_buffer_drops() {
        let traces = Traces::new(2);
        let trace = traces.begin(&parts(Some("00-zz-00-01")), "/embed", b"r".to_vec());
        assert!(trace.parent.is_empty() && trace.trace_id.iter().any(|&b| b != 0));
        trace.part(wall_ns(), 0.0, 0.0, 1);
        traces.finish(&trace, 200); // 3 spans, room for 2
        assert_eq!(traces.take().1, 3);
        assert!(
            parse_traceparent(b"00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none()
        );
    }
}

//! The HTTP front: every request is read here; the plain shapes of `POST /v1/embeddings` and
//! TEI's `POST /embed` are answered here (tokenized, queued on Tulip, written), and every other
//! request, or one this front may not answer, is handed over to the Python front in this
//! process (`fallback`).

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use pyo3::prelude::*;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::admission::Admission;
use super::api::{self, Plain, ROUTES};
use super::fallback::{hand_over, Answered};
use super::stats::Stats;
use super::tokenize::TextTokenizer;
use crate::tulip::Packed;
use crate::tulip::Tulip;

/// The bounds of a request answered here; each is the Python front's, passed in at start-up.
pub struct Bounds {
    pub max_body_bytes: usize,
    pub max_inputs: usize,
    /// real tokens per request (`--max-tokens-per-request`)
    pub max_tokens: usize,
    /// a request's tokens per part (`Packed::split`): the engine's batch budget
    pub part_tokens: usize,
    /// for a body to arrive after its headers
    pub body_timeout: Duration,
    /// for a connection's request headers to arrive
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
}

/// What every connection shares.
pub struct Front {
    /// the served model's names; answers name the first
    pub names: Vec<String>,
    /// the request core's tokenizer of a text sent with no options (no prompt, no cut)
    pub tokenizer: TextTokenizer,
    pub tulip: Tulip,
    /// the Python front (`fallback::hand_over`)
    pub python: Py<PyAny>,
    /// whether this model's plain requests are answered here at all (a dense float32 model
    /// whose folder names no default prompt) and its rows leave as unit vectors
    pub fast: bool,
    pub normalize: bool,
    pub bounds: Bounds,
    pub admission: RwLock<Admission>,
    /// set on SIGTERM: every request is handed over (the Python front answers 503)
    pub draining: AtomicBool,
    pub in_flight: AtomicUsize,
    /// one per route of `api::ROUTES`
    pub stats: Vec<Stats>,
    ids: RandomState,
    next_id: AtomicU64,
}

impl Front {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        names: Vec<String>,
        tokenizer: TextTokenizer,
        tulip: Tulip,
        python: Py<PyAny>,
        fast: bool,
        normalize: bool,
        bounds: Bounds,
        admission: Admission,
        stats: Vec<Stats>,
    ) -> Self {
        Front {
            names,
            tokenizer,
            tulip,
            python,
            fast,
            normalize,
            bounds,
            admission: RwLock::new(admission),
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            stats,
            ids: RandomState::new(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The client's X-Request-Id when it is short and printable (the Python front's rule,
    /// `checks.request_id`), else a new one: 32 hex digits.
    fn request_id(&self, parts: &Parts) -> Vec<u8> {
        if let Some(sent) = parts.headers.get("x-request-id") {
            let sent = sent.as_bytes();
            if !sent.is_empty() && sent.len() <= 128 && sent.iter().all(|c| (33..127).contains(c)) {
                return sent.to_vec();
            }
        }
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (self.ids.hash_one(n), self.ids.hash_one(!n));
        format!("{a:016x}{b:016x}").into_bytes()
    }
}

type Body = Full<Bytes>;

struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn route(
    front: Arc<Front>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let _counted = Counted::new(&front.in_flight);
    let start = Instant::now();
    let (parts, body) = request.into_parts();
    let route = ROUTES.iter().position(|&r| r == parts.uri.path());
    let here = front.fast
        && parts.method == Method::POST
        && route.is_some()
        && !front.draining.load(Ordering::Relaxed)
        && front
            .admission
            .read()
            .is_ok_and(|a| a.admits(&parts.headers));
    let (true, Some(route)) = (here, route) else {
        return Ok(handed(&front, &parts, Bytes::new(), Some(body)).await);
    };
    match read_whole(&front.bounds, &parts, body).await {
        Ok(bytes) => match embeddings(&front, route, &parts, &bytes, start).await {
            Some(reply) => Ok(reply),
            None => Ok(handed(&front, &parts, bytes, None).await),
        },
        Err((read, rest)) => Ok(handed(&front, &parts, read, rest).await),
    }
}

/// The body when its declared length is within the bound and it arrives in time; else what was
/// read and the rest, for the Python front's reading (its answer: 413, 408, ...).
async fn read_whole(
    bounds: &Bounds,
    parts: &Parts,
    mut body: Incoming,
) -> Result<Bytes, (Bytes, Option<Incoming>)> {
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let Some(length) = declared.filter(|&n| n <= bounds.max_body_bytes) else {
        return Err((Bytes::new(), Some(body)));
    };
    let deadline = tokio::time::Instant::now() + bounds.body_timeout;
    let mut read = BytesMut::with_capacity(length);
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Ok(None) if read.len() == length => return Ok(read.freeze()),
            Ok(None) | Ok(Some(Err(_))) => return Err((read.freeze(), None)),
            Err(_) => return Err((read.freeze(), Some(body))), // slow: the front's timeout
        }
    }
}

/// A plain embeddings request to `ROUTES[route]` answered here, or None: the Python front
/// answers it (another shape, a refusal, a full queue, a failed batch: each rule and message
/// is written there).
async fn embeddings(
    front: &Front,
    route: usize,
    parts: &Parts,
    body: &[u8],
    start: Instant,
) -> Option<Response<Body>> {
    let parsed = Plain::parse(route, body).ok()?;
    if let Some(model) = parsed.model() {
        if !front.names.iter().any(|name| name == model) {
            return None;
        }
    }
    let texts = parsed.texts();
    if texts.is_empty()
        || texts.len() > front.bounds.max_inputs
        || texts.iter().any(|t| t.is_empty())
    {
        return None;
    }
    let packed = front.tokenizer.pack(texts).ok()?;
    let tokens = packed.num_tokens();
    let special = front.tokenizer.num_special as i32;
    let no_own_token = packed.cu_seqlens.windows(2).any(|w| w[1] - w[0] <= special);
    if tokens > front.bounds.max_tokens || no_own_token {
        return None;
    }
    let tokenized = start.elapsed();
    let mut rows = embed(front, packed).await?;
    if parsed.normalize(front.normalize) {
        api::normalize(&mut rows.values, rows.width);
    }
    let payload = parsed.answer(&rows.values, rows.width, &front.names[0], tokens);
    let mut reply = Response::new(Full::new(Bytes::from(payload)));
    let headers = reply.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(id) = HeaderValue::from_bytes(&front.request_id(parts)) {
        headers.insert("x-request-id", id);
    }
    // TEI's timing headers, whole milliseconds, as the Python front writes them
    let ms = |seconds: f64| HeaderValue::from((seconds * 1e3) as u64);
    headers.insert("x-total-time", ms(start.elapsed().as_secs_f64()));
    headers.insert("x-tokenization-time", ms(tokenized.as_secs_f64()));
    headers.insert("x-queue-time", ms(rows.queue));
    headers.insert("x-inference-time", ms(rows.inference));
    front.stats[route].record(start.elapsed().as_secs_f64(), tokens, texts.len());
    Some(reply)
}

/// The rows of `packed`'s sequences, in order: its parts queued at once, answered in turn;
/// None when the queue is full or a batch failed.
async fn embed(front: &Front, packed: Packed) -> Option<crate::tulip::Rows> {
    // its lane, by its size: every part of a bulk request is bulk
    let bulk = front
        .tulip
        .lanes
        .is_bulk(packed.num_seqs(), packed.num_tokens());
    let parts = packed.split(front.bounds.part_tokens);
    let mut answers = Vec::with_capacity(parts.len());
    for part in parts {
        answers.push(front.tulip.submit(part, bulk)?);
    }
    let mut rows = crate::tulip::Rows::default();
    for answer in answers {
        let part = answer.await.ok()?.ok()?;
        rows.values.extend_from_slice(&part.values);
        rows.width = part.width;
        rows.queue = rows.queue.max(part.queue);
        rows.inference = rows.inference.max(part.inference);
    }
    Some(rows)
}

/// The Python front's answer to the request.
async fn handed(
    front: &Front,
    parts: &Parts,
    read: Bytes,
    rest: Option<Incoming>,
) -> Response<Body> {
    match hand_over(&front.python, parts, read, rest).await {
        Ok(Answered {
            status,
            headers,
            body,
        }) => {
            let mut reply = Response::new(Full::new(Bytes::from(body)));
            *reply.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            for (name, value) in headers {
                let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(&name),
                    HeaderValue::from_bytes(&value),
                ) else {
                    continue;
                };
                // hyper writes the framing of the body it sends
                if name != CONTENT_LENGTH && name != "transfer-encoding" && name != "connection" {
                    reply.headers_mut().append(name, value);
                }
            }
            reply
        }
        Err(message) => {
            eprintln!("embedserve native: the Python front did not answer: {message}");
            let mut reply = Response::new(Full::new(Bytes::from_static(
                b"{\"error\":{\"message\":\"internal error in the gateway\",\"type\":\"server_error\",\"param\":null,\"code\":\"server_error\"}}",
            )));
            *reply.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            reply
        }
    }
}

/// Serves `front` on `listener` until `stop` turns true; each connection on a task of its own,
/// at most `max_connections` at once (the others wait in the kernel's backlog).
pub async fn serve(front: Arc<Front>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(front.bounds.max_connections.max(1)));
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // EMFILE and the like: said, then accept again after a pause
                    eprintln!("embedserve native: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let front = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let bounds = &front.bounds;
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout)
                .max_buf_size(bounds.max_header_bytes.max(8192));
            let service = service_fn(|request| route(front.clone(), request));
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

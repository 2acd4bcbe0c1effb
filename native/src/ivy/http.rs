//! The HTTP front: every request is read here; the plain shapes of the embedding routes
//! (`api`) and, for a cross-encoder, of the scoring routes (`scoring`) are answered here
//! (tokenized, queued on Tulip, written), and every other request, or one this front may not
//! answer, is handed over to the Python front in this process (`fallback`).

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
use super::api::{self, Plain};
use super::fallback::{hand_over, Answered};
use super::pairs::Joined;
use super::scoring::{self, blank, Activation, Scoring};
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

/// Every route answered here, in the order of `Front::stats`: the embedding routes, then the
/// scoring ones.
pub fn routes() -> impl Iterator<Item = &'static str> {
    api::ROUTES.iter().chain(scoring::ROUTES.iter()).copied()
}

/// A route answered here: `api::ROUTES[i]` or `scoring::ROUTES[i]`.
#[derive(Clone, Copy)]
enum Here {
    Embed(usize),
    Score(usize),
}

impl Here {
    fn of(path: &str) -> Option<Here> {
        let at = |routes: &[&str]| routes.iter().position(|&r| r == path);
        at(&api::ROUTES)
            .map(Here::Embed)
            .or_else(|| at(&scoring::ROUTES).map(Here::Score))
    }

    /// Its place in `Front::stats` (`routes()`).
    fn stats(self) -> usize {
        match self {
            Here::Embed(i) => i,
            Here::Score(i) => api::ROUTES.len() + i,
        }
    }
}

/// A cross-encoder's scoring, for the scoring routes answered here: its pairs joined by the
/// tokenizer's pair template (`TextTokenizer::pairs`).
pub struct Reranker {
    /// the folder's activation of the logit
    pub activation: Activation,
    /// the model has segment embeddings: a pair's document is token type 1
    pub typed: bool,
    /// the characters a request may make the tokenizer read (`core/bounds.max_chars`)
    pub max_chars: usize,
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
    /// a cross-encoder's: its plain scoring requests are answered here
    pub reranker: Option<Reranker>,
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
        reranker: Option<Reranker>,
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
            reranker,
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
        self.new_id().into_bytes()
    }

    /// A new id: 32 hex digits.
    fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (self.ids.hash_one(n), self.ids.hash_one(!n));
        format!("{a:016x}{b:016x}")
    }

    /// Whether a body's `model` (if it names one) is served here.
    fn serves(&self, model: Option<&str>) -> bool {
        model.is_none_or(|model| self.names.iter().any(|name| name == model))
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
    let route = Here::of(parts.uri.path()).filter(|&here| match here {
        Here::Embed(_) => front.fast,
        Here::Score(_) => front.reranker.is_some(),
    });
    let open = parts.method == Method::POST
        && !front.draining.load(Ordering::Relaxed)
        && front
            .admission
            .read()
            .is_ok_and(|a| a.admits(&parts.headers));
    let (true, Some(route)) = (open, route) else {
        return Ok(handed(&front, &parts, Bytes::new(), Some(body)).await);
    };
    match read_whole(&front.bounds, &parts, body).await {
        Ok(bytes) => {
            let answered = match route {
                Here::Embed(i) => embeddings(&front, i, &parts, &bytes, start).await,
                Here::Score(i) => scores(&front, i, &parts, &bytes, start).await,
            };
            match answered {
                Some(reply) => Ok(reply),
                None => Ok(handed(&front, &parts, bytes, None).await),
            }
        }
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
    if !front.serves(parsed.model()) {
        return None;
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
    // its lane, by its size: every part of a bulk request is bulk
    let bulk = front
        .tulip
        .lanes
        .is_bulk(packed.num_seqs(), packed.num_tokens());
    let mut rows = rows(front, packed, bulk).await?;
    if parsed.normalize(front.normalize) {
        api::normalize(&mut rows.values, rows.width);
    }
    let payload = parsed.answer(&rows.values, rows.width, &front.names[0], tokens);
    front.stats[Here::Embed(route).stats()].record(
        start.elapsed().as_secs_f64(),
        tokens,
        texts.len(),
    );
    Some(reply(front, parts, payload, start, tokenized, &rows))
}

/// A cross-encoder's plain scoring request to `scoring::ROUTES[route]` answered here, or None:
/// the Python front answers it (another shape or option, a text it refuses, a pair it would
/// refuse, a full queue, a failed batch).
async fn scores(
    front: &Front,
    route: usize,
    parts: &Parts,
    body: &[u8],
    start: Instant,
) -> Option<Response<Body>> {
    let reranker = front.reranker.as_ref()?;
    let parsed = Scoring::parse(route, body).ok()?;
    let cut = parsed.cut()?;
    let (query, docs) = (parsed.query(), parsed.documents());
    // the request's characters as `core/bounds.pair_chars` counts them: the query per document
    let chars =
        query.chars().count() * docs.len() + docs.iter().map(|d| d.chars().count()).sum::<usize>();
    if !front.serves(parsed.model())
        || docs.is_empty()
        || docs.len() > front.bounds.max_inputs
        || chars > reranker.max_chars
        || blank(query)
        || docs.iter().any(|d| blank(d))
    {
        return None;
    }
    let limit = front.tokenizer.max_length;
    // None: the query has no token of its own; a document without one is `Joined::Empty`
    let pairs = front.tokenizer.pairs(query, docs, limit, cut).ok()??;
    let mut packed = Packed::new();
    for joined in pairs {
        let Joined::Pair { ids, second } = joined else {
            return None; // refused there, with its message
        };
        packed.push_pair(&ids, if reranker.typed { second } else { 0 });
    }
    let tokens = packed.num_tokens();
    if tokens > front.bounds.max_tokens {
        return None;
    }
    let tokenized = start.elapsed();
    // a scoring request is interactive, whatever its size (`core/lanes.interactive_route`)
    let rows = rows(front, packed, false).await?;
    let logits = rows.values.iter().step_by(rows.width.max(1)).copied();
    let scores = parsed.scores(logits, reranker.activation);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let payload = parsed.answer(&scores, &front.names[0], tokens, &front.new_id(), now);
    front.stats[Here::Score(route).stats()].record(
        start.elapsed().as_secs_f64(),
        tokens,
        docs.len(),
    );
    Some(reply(front, parts, payload, start, tokenized, &rows))
}

/// An answer's response: its JSON body, the request id, TEI's timing headers.
fn reply(
    front: &Front,
    parts: &Parts,
    payload: Vec<u8>,
    start: Instant,
    tokenized: Duration,
    rows: &crate::tulip::Rows,
) -> Response<Body> {
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
    reply
}

/// The rows of `packed`'s sequences, in order: its parts queued at once in the lane asked,
/// answered in turn; None when the queue is full or a batch failed.
async fn rows(front: &Front, packed: Packed, bulk: bool) -> Option<crate::tulip::Rows> {
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

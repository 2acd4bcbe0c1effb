//! The routes answered natively: the plain bodies of the embedding routes (`api`), TEI's
//! `/embed_sparse` for a sparse model, and a cross-encoder's scoring routes (`scoring`), each
//! tokenized, queued on Tulip and written here. Each handler answers or gives `Unanswered`, and
//! the request goes to the Python front (another shape, a refusal, a full queue, a failed batch,
//! a part not answered within `--request-timeout`: each rule and message is written there).

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::http::request::Parts;
use hyper::Response;
use tokio::sync::oneshot;

use super::api::{self, Plain, TeiSparseRequest, SPARSE_ROUTE};
use super::front::{Front, Model, Task};
use super::pairs::Joined;
use super::scoring::{self, blank, Scoring};
use super::traces::{wall_ns, TRACE};
use crate::tulip::{Packed, Rows, SparseRows, Timed};

pub type Body = Full<Bytes>;

/// Why a route did not answer a request: the Python front answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// another shape, a refusal, a full queue, a failed batch: it runs the request
    HandOver,
    /// a part's answer did not come within `--request-timeout` of its submission: it answers
    /// as for its own call past that deadline, without running the request again
    Expired,
}

use Unanswered::HandOver;

/// A route's answer, or why there is none.
pub type Answer = Result<Response<Body>, Unanswered>;

/// Every route answered here, in the order of `Model::stats`: the embedding routes, the
/// scoring ones, then `/embed_sparse`.
pub fn routes() -> impl Iterator<Item = &'static str> {
    api::ROUTES
        .iter()
        .chain(scoring::ROUTES.iter())
        .chain([SPARSE_ROUTE].iter())
        .copied()
}

/// A route answered here: `api::ROUTES[i]`, `scoring::ROUTES[i]` or `SPARSE_ROUTE`.
#[derive(Clone, Copy)]
pub enum Here {
    Embed(usize),
    Score(usize),
    Sparse,
}

impl Here {
    /// The route of `path`, if a model's requests to it may be answered here.
    pub fn of(path: &str, front: &Front) -> Option<Here> {
        let at = |routes: &[&str]| routes.iter().position(|&r| r == path);
        let here = at(&api::ROUTES)
            .map(Here::Embed)
            .or_else(|| at(&scoring::ROUTES).map(Here::Score))
            .or((path == SPARSE_ROUTE).then_some(Here::Sparse))?;
        front.models.iter().any(|m| here.open(m)).then_some(here)
    }

    /// Whether `model`'s requests to it may be answered here.
    fn open(self, model: &Model) -> bool {
        let served = &model.served;
        match self {
            Here::Embed(_) => served.embeddings,
            Here::Score(_) => served.reranker.is_some(),
            Here::Sparse => served.sparse,
        }
    }

    /// Its path.
    pub fn path(self) -> &'static str {
        routes().nth(self.stats()).unwrap_or_default()
    }

    /// Its place in `Model::stats` (`routes()`).
    fn stats(self) -> usize {
        match self {
            Here::Embed(i) => i,
            Here::Score(i) => api::ROUTES.len() + i,
            Here::Sparse => api::ROUTES.len() + scoring::ROUTES.len(),
        }
    }

    /// The answer to a request to this route, or why the Python front answers it.
    pub async fn answer(self, front: &Front, parts: &Parts, body: &[u8], start: Instant) -> Answer {
        match self {
            Here::Embed(i) => embeddings(front, i, parts, body, start).await,
            Here::Score(i) => scores(front, i, parts, body, start).await,
            Here::Sparse => sparse(front, parts, body, start).await,
        }
    }
}

/// A plain embeddings request to `ROUTES[route]` answered here, or why the Python front answers
/// it (another shape, a refusal, a full queue, a failed batch: each rule and message is written
/// there).
async fn embeddings(
    front: &Front,
    route: usize,
    parts: &Parts,
    body: &[u8],
    start: Instant,
) -> Answer {
    let parsed = Plain::parse(route, body).map_err(|_| HandOver)?;
    let model = front.model(parsed.model(), Task::Embed).ok_or(HandOver)?;
    if !Here::Embed(route).open(model) {
        return Err(HandOver);
    }
    let texts = parsed.texts();
    let packed = packed_texts(model, texts).ok_or(HandOver)?;
    let tokens = packed.num_tokens();
    let tokenized = start.elapsed();
    // its lane, by its size: every part of a bulk request is bulk
    let bulk = model.lanes.is_bulk(packed.num_seqs(), tokens);
    let mut rows = rows(front, model, packed, bulk).await?;
    if parsed.normalize(model.served.normalize) {
        api::normalize(&mut rows.values, rows.width);
    }
    let payload = parsed.answer(&rows.values, rows.width, &model.names[0], tokens);
    let done = Done::of(
        start,
        tokenized,
        (rows.queue, rows.inference),
        tokens,
        texts.len(),
    );
    Ok(reply(
        front,
        (model, Here::Embed(route)),
        parts,
        payload,
        done,
    ))
}

/// Texts sent with no options, tokenized and packed, if this front may answer them: within the
/// input and token bounds, each within the model's length and with a token of its own (else
/// the Python front says what is wrong, or cuts what it was asked to cut).
fn packed_texts(model: &Model, texts: &[String]) -> Option<Packed> {
    let bounds = &model.limits;
    if texts.is_empty() || texts.len() > bounds.max_inputs || texts.iter().any(|t| t.is_empty()) {
        return None;
    }
    // the characters as `core/bounds.text_chars` counts them (none counted fewer: a text over
    // one window is the Python front's); a text's bytes are at least its characters, so they
    // are counted only where its bytes are over a bound: most requests are far under both
    let chars = |t: &String| t.chars().count();
    let window = bounds.window_chars;
    if texts.iter().any(|t| t.len() > window && chars(t) > window) {
        return None;
    }
    let bytes: usize = texts.iter().map(String::len).sum();
    if bytes > bounds.max_chars && texts.iter().map(chars).sum::<usize>() > bounds.max_chars {
        return None;
    }
    let packed = model.tokenizer.pack(texts).ok()?;
    let special = model.tokenizer.num_special as i32;
    let no_own_token = packed.cu_seqlens.windows(2).any(|w| w[1] - w[0] <= special);
    (packed.num_tokens() <= bounds.max_tokens && !no_own_token).then_some(packed)
}

/// TEI's plain `/embed_sparse` answered here, or why not (as `embeddings`): each part of the
/// request run alone through the engine's sparse outputs, in order.
async fn sparse(front: &Front, parts: &Parts, body: &[u8], start: Instant) -> Answer {
    let parsed: TeiSparseRequest = api::parse(body).map_err(|_| HandOver)?;
    let model = front
        .model(parsed.model.as_deref(), Task::Sparse)
        .ok_or(HandOver)?;
    if !Here::Sparse.open(model) {
        return Err(HandOver);
    }
    let texts = parsed.inputs.texts();
    let packed = packed_texts(model, texts).ok_or(HandOver)?;
    let tokens = packed.num_tokens();
    let tokenized = start.elapsed();
    let bulk = model.lanes.is_bulk(packed.num_seqs(), tokens);
    let mut all = SparseRows {
        offsets: vec![0],
        ..SparseRows::default()
    };
    let submit = |part| model.submit_sparse(part, bulk);
    in_turn(front, model, packed, submit, |part: SparseRows| {
        let base = all.indices.len() as i64;
        all.offsets
            .extend(part.offsets.iter().skip(1).map(|o| base + o));
        all.indices.extend_from_slice(&part.indices);
        all.values.extend_from_slice(&part.values);
        all.queue = all.queue.max(part.queue);
        all.inference = all.inference.max(part.inference);
    })
    .await?;
    if all.offsets.len() != texts.len() + 1 {
        return Err(HandOver); // vectors for other sequences than sent: the Python front's answer
    }
    let payload = api::sparse_answer(&all.offsets, &all.indices, &all.values).ok_or(HandOver)?;
    let done = Done::of(
        start,
        tokenized,
        (all.queue, all.inference),
        tokens,
        texts.len(),
    );
    Ok(reply(front, (model, Here::Sparse), parts, payload, done))
}

/// A cross-encoder's plain scoring request to `scoring::ROUTES[route]` answered here, or why
/// the Python front answers it (another shape or option, a text it refuses, a pair it would
/// refuse, a full queue, a failed batch).
async fn scores(front: &Front, route: usize, parts: &Parts, body: &[u8], start: Instant) -> Answer {
    let parsed = Scoring::parse(route, body).map_err(|_| HandOver)?;
    let model = front.model(parsed.model(), Task::Score).ok_or(HandOver)?;
    let reranker = model.served.reranker.as_ref().ok_or(HandOver)?;
    let cut = parsed.cut(reranker.rerank_cut).ok_or(HandOver)?;
    let (query, docs) = (parsed.query(), parsed.documents());
    // the request's characters as `core/bounds.pair_chars` counts them: the query per document
    let chars =
        query.chars().count() * docs.len() + docs.iter().map(|d| d.chars().count()).sum::<usize>();
    if docs.is_empty()
        || docs.len() > model.limits.max_inputs
        || chars > model.limits.max_chars
        || blank(query)
        || docs.iter().any(|d| blank(d))
    {
        return Err(HandOver);
    }
    let limit = model.tokenizer.max_length;
    // None: the query has no token of its own; a document without one is `Joined::Empty`
    let pairs = model
        .tokenizer
        .pairs(query, docs, limit, cut)
        .ok()
        .flatten()
        .ok_or(HandOver)?;
    let mut packed = Packed::new();
    for joined in pairs {
        let Joined::Pair { ids, second } = joined else {
            return Err(HandOver); // refused there, with its message
        };
        packed.push_pair(&ids, if reranker.typed { second } else { 0 });
    }
    let tokens = packed.num_tokens();
    if tokens > model.limits.max_tokens {
        return Err(HandOver);
    }
    let tokenized = start.elapsed();
    // a scoring request is interactive, whatever its size (`core/lanes.interactive_route`)
    let rows = rows(front, model, packed, false).await?;
    let logits = rows.values.iter().step_by(rows.width.max(1)).copied();
    let scores = parsed.scores(logits, reranker.activation);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let payload = parsed.answer(&scores, &model.names[0], tokens, &front.new_id(), now);
    let done = Done::of(
        start,
        tokenized,
        (rows.queue, rows.inference),
        tokens,
        docs.len(),
    );
    Ok(reply(
        front,
        (model, Here::Score(route)),
        parts,
        payload,
        done,
    ))
}

/// An answered request's times (its start, tokenized after, seconds queued and in the engine:
/// TEI's headers) and what it counts into `/metrics` (tokens, inputs).
struct Done {
    start: Instant,
    tokenized: Duration,
    queue: f64,
    inference: f64,
    tokens: usize,
    inputs: usize,
}

impl Done {
    fn of(
        start: Instant,
        tokenized: Duration,
        (queue, inference): (f64, f64),
        tokens: usize,
        inputs: usize,
    ) -> Done {
        Done {
            start,
            tokenized,
            queue,
            inference,
            tokens,
            inputs,
        }
    }
}

/// An answer's response (its JSON body, the request id, TEI's timing headers), counted into
/// its model's stats of its route.
fn reply(
    front: &Front,
    (model, here): (&Model, Here),
    parts: &Parts,
    payload: Vec<u8>,
    done: Done,
) -> Response<Body> {
    let total = done.start.elapsed().as_secs_f64();
    model.stats[here.stats()].record(total, done.tokens, done.inputs);
    let mut reply = Response::new(Full::new(Bytes::from(payload)));
    let headers = reply.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // a traced request's id was taken when its trace began: its spans carry it
    let id = TRACE
        .try_with(|t| t.request_id.clone().into_bytes())
        .unwrap_or_else(|_| front.request_id(parts));
    if let Ok(id) = HeaderValue::from_bytes(&id) {
        headers.insert("x-request-id", id);
    }
    // TEI's timing headers, whole milliseconds, as the Python front writes them
    let ms = |seconds: f64| HeaderValue::from((seconds * 1e3) as u64);
    headers.insert("x-total-time", ms(total));
    headers.insert("x-tokenization-time", ms(done.tokenized.as_secs_f64()));
    headers.insert("x-queue-time", ms(done.queue));
    headers.insert("x-inference-time", ms(done.inference));
    reply
}

/// The rows of `packed`'s sequences, in order, its parts queued in the lane asked (`in_turn`).
async fn rows(
    front: &Front,
    model: &Model,
    packed: Packed,
    bulk: bool,
) -> Result<Rows, Unanswered> {
    let mut rows = Rows::default();
    let submit = |part| model.submit(part, bulk);
    in_turn(front, model, packed, submit, |part: Rows| {
        rows.values.extend_from_slice(&part.values);
        rows.width = part.width;
        rows.queue = rows.queue.max(part.queue);
        rows.inference = rows.inference.max(part.inference);
    })
    .await?;
    Ok(rows)
}

/// Each part of `packed` (`Packed::split` at the part budget) submitted and its answer taken,
/// in order, with at most `parts_in_flight` of them queued at once (the Python pipeline's
/// rule): a large request enters the queue as it drains, requests sent meanwhile interleave
/// with it, and an idle queue smaller than the request still serves it whole. `HandOver` when
/// the queue is full (before > 0 tokens queued) or a part failed, `Expired` when a part's answer
/// did not come within `request_timeout` of its submission (the Python pipeline's deadline of a
/// call): the rest are never submitted, and those queued are dropped (Tulip skips them).
async fn in_turn<R: Timed>(
    front: &Front,
    model: &Model,
    packed: Packed,
    submit: impl Fn(Packed) -> Option<oneshot::Receiver<Result<R, String>>>,
    mut take: impl FnMut(R),
) -> Result<(), Unanswered> {
    let mut parts = packed.split(model.limits.part_tokens).into_iter();
    let mut queued = VecDeque::with_capacity(front.bounds.parts_in_flight);
    let timeout = front.bounds.request_timeout;
    let traced = TRACE.try_with(|_| ()).is_ok();
    loop {
        while queued.len() < front.bounds.parts_in_flight.max(1) {
            let Some(part) = parts.next() else { break };
            let (tokens, submitted) = (part.num_tokens(), if traced { wall_ns() } else { 0 });
            let answer = submit(part).ok_or(HandOver)?;
            let deadline = tokio::time::Instant::now() + timeout;
            queued.push_back((deadline, answer, tokens, submitted));
        }
        let Some((deadline, answer, tokens, submitted)) = queued.pop_front() else {
            return Ok(());
        };
        let answer = tokio::time::timeout_at(deadline, answer).await;
        let part = answer
            .map_err(|_| Unanswered::Expired)?
            .ok()
            .and_then(Result::ok)
            .ok_or(HandOver)?;
        if traced {
            let (queue, inference) = part.times();
            let _ = TRACE.try_with(|t| t.part(submitted, queue, inference, tokens));
        }
        take(part);
    }
}

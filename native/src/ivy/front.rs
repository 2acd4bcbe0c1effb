//! What every connection of the native front shares: the served models (each one's names,
//! tokenizer, queue, what of its requests are answered here and its bounds), the bounds, the
//! admission rules, the counts, and new request ids.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use hyper::http::request::Parts;
use pyo3::prelude::*;

use super::admission::Admission;
use super::pairs::Cut;
use super::scoring::Activation;
use super::stats::Stats;
use super::tokenize::TextTokenizer;
use super::traces::Traces;
use crate::link::Links;
use crate::tulip::{Answer, Lanes, Packed, SparseAnswer, Tulip};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The bounds of a request answered here; each is the Python front's, passed in at start-up
/// (a model's own: `Limits`).
pub struct Bounds {
    pub max_body_bytes: usize,
    /// a request's parts queued at once (`gateway/pipeline.PARTS_IN_FLIGHT`)
    pub parts_in_flight: usize,
    /// for a part's answer, from its submission (`--request-timeout`)
    pub request_timeout: Duration,
    /// for a body to arrive after its headers
    pub body_timeout: Duration,
    /// for a connection's request headers to arrive
    pub header_timeout: Duration,
    pub max_header_bytes: usize,
    /// header lines per request (more: 431)
    pub max_headers: usize,
    pub max_connections: usize,
}
/// A cross-encoder's scoring, for the scoring routes answered here: its pairs joined by the
/// tokenizer's pair template (`TextTokenizer::pairs`).
pub struct Reranker {
    /// the folder's activation of the logit
    pub activation: Activation,
    /// the model has segment embeddings: a pair's document is token type 1
    pub typed: bool,
    /// what Cohere's rerank routes do with an over-long document (`RERANK_TRUNCATE`)
    pub rerank_cut: Cut,
}

/// What of this model's requests Ivy answers itself (the rest go to the Python front).
pub struct Served {
    /// plain dense embeddings (a float32 model whose folder names no default prompt)
    pub embeddings: bool,
    /// the rows leave as unit vectors unless the body says otherwise
    pub normalize: bool,
    /// TEI's plain `/embed_sparse` (a sparse model whose folder names no default prompt)
    pub sparse: bool,
    /// a cross-encoder's plain scoring requests
    pub reranker: Option<Reranker>,
}

/// A model's own bounds of a request answered here, the Python front's for it (its models
/// file keys, else the flags).
pub struct Limits {
    pub max_inputs: usize,
    /// real tokens per request (`--max-tokens-per-request`)
    pub max_tokens: usize,
    /// the characters a request may make the tokenizer read (`core/bounds.max_chars`)
    pub max_chars: usize,
    /// a text longer is the Python front's: it reads such a text a piece at a time, with
    /// errors of its own (`core/tokenization.TextTokenizer.window_chars`)
    pub window_chars: usize,
    /// a request's tokens per part (`Packed::split`): the engine's batch budget, or its own
    pub part_tokens: usize,
}

/// Where a model's parts go: its engine's queue in this process, or its replicas, server
/// processes of their own (`link`).
pub enum Engines {
    Here(Tulip),
    Linked(Arc<Links>),
}

/// One served model: its names, its tokenizer of a text sent with no options (no prompt, no
/// cut), its engines, what of its requests are answered here and its bounds.
pub struct Model {
    /// answers name the first
    pub names: Vec<String>,
    pub tokenizer: TextTokenizer,
    pub engines: Engines,
    /// which lane a request takes by its size (the Python package's rule)
    pub lanes: Lanes,
    pub served: Served,
    pub limits: Limits,
    /// its requests answered here, one per route of `routes::routes()`
    pub stats: Vec<Stats>,
}

impl Model {
    /// Queues `packed` for its pooled rows in the lane `bulk` says; None when the queue in
    /// this process is full (the Python front answers: its rules say what).
    pub fn submit(&self, packed: Packed, bulk: bool) -> Option<oneshot::Receiver<Answer>> {
        match &self.engines {
            Engines::Here(tulip) => tulip.submit(packed, bulk),
            Engines::Linked(links) => Some(links.submit(packed, bulk)),
        }
    }

    /// `submit` for the sparse vectors of `packed`'s sequences.
    pub fn submit_sparse(
        &self,
        packed: Packed,
        bulk: bool,
    ) -> Option<oneshot::Receiver<SparseAnswer>> {
        match &self.engines {
            Engines::Here(tulip) => tulip.submit_sparse(packed, bulk),
            Engines::Linked(links) => Some(links.submit_sparse(packed, bulk)),
        }
    }
}

/// What a route answered here asks of a model: which one a body naming none goes to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Task {
    /// dense embeddings
    Embed = 0,
    /// sparse vectors
    Sparse = 1,
    /// a pair's score
    Score = 2,
}

/// What every connection shares.
pub struct Front {
    /// in the order given; a request names one (or, with one alone, none)
    pub models: Vec<Model>,
    /// the Python front (`fallback::hand_over`)
    pub python: Py<PyAny>,
    pub bounds: Bounds,
    pub admission: RwLock<Admission>,
    /// set on SIGTERM: every request is handed over (the Python front answers 503)
    pub draining: AtomicBool,
    pub in_flight: AtomicUsize,
    /// the spans of requests answered here (`--otlp-endpoint`), else None
    pub traces: Option<Traces>,
    /// with several models, the one a body naming none goes to, per `Task` (None: the Python
    /// front answers it)
    pub unnamed: RwLock<[Option<usize>; 3]>,
    ids: RandomState,
    next_id: AtomicU64,
}

impl Front {
    pub fn new(
        models: Vec<Model>,
        python: Py<PyAny>,
        bounds: Bounds,
        admission: Admission,
        traces: Option<Traces>,
    ) -> Self {
        Front {
            models,
            python,
            bounds,
            admission: RwLock::new(admission),
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            traces,
            unnamed: RwLock::new([None; 3]),
            ids: RandomState::new(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The client's X-Request-Id when it is short and printable (the Python front's rule,
    /// `checks.request_id`), else a new one: 32 hex digits.
    pub fn request_id(&self, parts: &Parts) -> Vec<u8> {
        if let Some(sent) = parts.headers.get("x-request-id") {
            let sent = sent.as_bytes();
            if !sent.is_empty() && sent.len() <= 128 && sent.iter().all(|c| (33..127).contains(c)) {
                return sent.to_vec();
            }
        }
        self.new_id().into_bytes()
    }

    /// A new id: the 32 hex digits of a random (version 4) UUID, as Python's `uuid4().hex`.
    pub fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (self.ids.hash_one(n), self.ids.hash_one(!n));
        let a = (a & !0xf000) | 0x4000; // the version digit
        let b = (b & !(0xc << 60)) | (0x8 << 60); // the variant bits
        format!("{a:016x}{b:016x}")
    }

    /// The model a body's `model` names; with one model alone, also a body that names none;
    /// with several, the one the Python front's rule picks for `task` (`--default-model`, its
    /// picks passed in: `Gateway.set_unnamed`), or none (the Python front says why).
    pub fn model(&self, named: Option<&str>, task: Task) -> Option<&Model> {
        match named {
            Some(name) => self
                .models
                .iter()
                .find(|m| m.names.iter().any(|n| n == name)),
            None if self.models.len() == 1 => self.models.first(),
            None => {
                let picked = self.unnamed.read().ok()?[task as usize];
                picked.and_then(|i| self.models.get(i))
            }
        }
    }
}

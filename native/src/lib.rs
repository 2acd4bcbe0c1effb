//! `embedserve._native`: the request path in Rust, built by maturin into the package.
//!
//! Two layers, one direction of calls: `ivy` (HTTP, JSON, tokenization) hands packed token ids
//! to `tulip` (the FCFS token-budget queue), which calls the Python engine's `step()` through
//! pyo3. Python sees three classes: `Tokenizer` (packed ids of a batch of texts, the GIL released
//! while it works), its `PairTemplate` (a cross-encoder's pairs joined) and `Gateway` (the HTTP
//! front and the queue in front of a `step` callable).

mod id_lists;
pub mod ivy;
pub mod link;
pub mod thread_state;
pub mod tulip;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tokio::sync::watch;

use std::sync::atomic::Ordering;

use id_lists::id_lists;
use ivy::admission::Admission;
use ivy::front::{Bounds, Engines, Front, Limits, Model, Reranker, Served};
use ivy::http::serve;
use ivy::pairs::{Cut, Joined};
use ivy::routes::routes;
use ivy::scoring::Activation;
use ivy::stats::{Stats, Taken};
use ivy::tokenize::{TextTokenizer, TokenizeError};
use ivy::traces::Traces;
use link::{Avoid, Linking, Links};
use tulip::{Delivery, Lanes, Packed, Reply, Tulip};

/// A model's `tokenizer.json` through the `tokenizers` crate: the Python package's ids.
#[pyclass(frozen, module = "embedserve._native")]
struct Tokenizer {
    inner: TextTokenizer,
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (path, max_length = usize::MAX))]
    fn new(path: &str, max_length: usize) -> PyResult<Self> {
        let inner = TextTokenizer::from_file(path, max_length).map_err(PyValueError::new_err)?;
        Ok(Tokenizer { inner })
    }

    /// A tokenizer from its JSON (`tokenizers.Tokenizer.to_str()`), its truncation and padding
    /// as the JSON sets them: the request core's tokenizers, one per side of a cut.
    #[staticmethod]
    #[pyo3(signature = (json, max_length = usize::MAX))]
    fn from_str(json: &str, max_length: usize) -> PyResult<Self> {
        let inner = TextTokenizer::from_json(json, max_length).map_err(PyValueError::new_err)?;
        Ok(Tokenizer { inner })
    }

    /// Each text's ids (the Python package's `encode_batch_fast(texts)`'s `ids`), the GIL
    /// released while they are made; no length limit.
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        lists(py, py.detach(|| self.inner.batch(&texts)))
    }

    /// Each text's own ids, no special tokens, never truncated (the ids less the single-text
    /// template's), the GIL released while they are made.
    fn encode_plain_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        lists(py, py.detach(|| self.inner.plain(&texts)))
    }

    /// The single-text template's special tokens: (the ids before a text's own, those after).
    #[getter]
    fn template(&self) -> (Vec<u32>, Vec<u32>) {
        (self.inner.lead.clone(), self.inner.trail.clone())
    }

    /// The pair template, or None when the tokenizer has none.
    #[getter]
    fn pair_template(&self) -> Option<PairTemplate> {
        self.inner.pairs.clone().map(|inner| PairTemplate { inner })
    }

    /// A cross-encoder's pairs of `query` with each of `docs` (`ivy::pairs`), each at most
    /// `limit` tokens, the document cut when over it if `truncate` is "end" or "start" (None:
    /// refused), the GIL released: None when the query has no token of its own, else per
    /// document `PairTemplate.join`'s answer, or ("empty", [], 0) for a document with no token
    /// of its own. A ValueError when the tokenizer has no pair template.
    #[pyo3(signature = (query, docs, limit, truncate = None))]
    fn pairs<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        docs: Vec<String>,
        limit: usize,
        truncate: Option<&str>,
    ) -> PyResult<Option<Vec<PyPair<'py>>>> {
        let cut = Cut::of(truncate).map_err(PyValueError::new_err)?;
        let pairs = py
            .detach(|| self.inner.pairs(query, &docs, limit, cut))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let Some(all) = pairs else { return Ok(None) };
        let (kinds, ids): (Vec<_>, Vec<_>) = all
            .into_iter()
            .map(|pair| {
                let (what, ids, n) = joined(pair);
                ((what, n), ids)
            })
            .unzip();
        let lists = id_lists(py, &ids)?;
        Ok(Some(
            kinds
                .into_iter()
                .zip(lists.iter())
                .map(|((what, n), ids)| (what, ids, n))
                .collect(),
        ))
    }

    /// Whether clean ASCII texts take the WordPiece twin (a BERT tokenizer's; the same ids).
    #[getter]
    fn ascii_twin(&self) -> bool {
        self.inner.has_twin()
    }

    /// One text's ids, special tokens included.
    fn ids(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.ids(0, text))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Every text's ids back to back and their boundaries, as little-endian int32 bytes
    /// (`ids`, `cu_seqlens`); a ValueError naming the first text over `max_length`.
    fn encode_packed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let packed = py
            .detach(|| self.inner.pack(&texts))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let (ids, cu) = packed.le_bytes();
        Ok((PyBytes::new(py, &ids), PyBytes::new(py, &cu)))
    }
}

/// A tokenizer's pair template (`ivy::pairs`): the one rule that joins a query and a document
/// into a cross-encoder's sequence, for the request core's `PairPreparer`.
#[pyclass(frozen, module = "embedserve._native")]
struct PairTemplate {
    inner: ivy::pairs::PairTemplate,
}

#[pymethods]
impl PairTemplate {
    #[getter]
    fn before(&self) -> Vec<u32> {
        self.inner.before.clone()
    }

    #[getter]
    fn between(&self) -> Vec<u32> {
        self.inner.between.clone()
    }

    #[getter]
    fn after(&self) -> Vec<u32> {
        self.inner.after.clone()
    }

    /// `query` and `doc` (each a text's own ids) as one sequence of at most `limit` tokens,
    /// the document cut when over it if `truncate` is "end" or "start" (None: refused):
    /// ("pair", ids, where the document begins), ("too_long", [], the pair's tokens) or
    /// ("query_too_long", [], the tokens the query and the special tokens take).
    #[pyo3(signature = (query, doc, limit, truncate = None))]
    fn join(
        &self,
        query: Vec<u32>,
        doc: Vec<u32>,
        limit: usize,
        truncate: Option<&str>,
    ) -> PyResult<PyJoined> {
        let cut = Cut::of(truncate).map_err(PyValueError::new_err)?;
        Ok(joined(self.inner.join(&query, &doc, limit, cut)))
    }
}

/// Made ids as lists (`id_lists`), or the tokenizer's error as a ValueError.
fn lists(
    py: Python<'_>,
    made: Result<Vec<Vec<u32>>, TokenizeError>,
) -> PyResult<Bound<'_, PyList>> {
    id_lists(py, &made.map_err(|e| PyValueError::new_err(e.to_string()))?)
}

/// A joined pair as Python reads it: (what, ids, a number).
type PyJoined = (&'static str, Vec<u32>, usize);

/// `PyJoined` with its ids a list made by `id_lists` (a batch of pairs at once).
type PyPair<'py> = (&'static str, Bound<'py, PyAny>, usize);

fn joined(joined: Joined) -> PyJoined {
    match joined {
        Joined::Pair { ids, second } => ("pair", ids, second),
        Joined::TooLong(n) => ("too_long", Vec::new(), n),
        Joined::QueryTooLong(n) => ("query_too_long", Vec::new(), n),
        Joined::Empty => ("empty", Vec::new(), 0),
    }
}

/// One model as `Gateway` serves it: its tokenizer's JSON (truncating at `max_length`), its
/// engine's `build` (Tulip's) or its `replicas` (server processes' unix sockets: `link`), its
/// names, what of its requests Ivy answers (`fast`: plain
/// embeddings, rows normalized unless asked otherwise when `normalize`; `sparse`: TEI's
/// `/embed_sparse`; `reranker`: (activation, typed, Cohere's rerank truncate), its scoring
/// routes) and its own bounds (`part_tokens` 0: its engine's batch tokens).
#[pyclass(frozen, module = "embedserve._native")]
struct ServedModel {
    tokenizer_json: String,
    build: Option<Py<PyAny>>,
    replicas: Vec<String>,
    names: Vec<String>,
    max_length: usize,
    fast: bool,
    normalize: bool,
    sparse: bool,
    reranker: Option<(String, bool, String)>,
    max_inputs: usize,
    max_tokens: usize,
    max_chars: usize,
    window_chars: usize,
    part_tokens: usize,
    max_queued_tokens: usize,
}

#[pymethods]
impl ServedModel {
    #[new]
    #[pyo3(signature = (
        tokenizer_json, build, *, names, max_length, fast, normalize, sparse, max_inputs,
        max_tokens, max_chars, window_chars, part_tokens, max_queued_tokens, reranker = None,
        replicas = Vec::new(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tokenizer_json: String,
        build: Option<Py<PyAny>>,
        names: Vec<String>,
        max_length: usize,
        fast: bool,
        normalize: bool,
        sparse: bool,
        max_inputs: usize,
        max_tokens: usize,
        max_chars: usize,
        window_chars: usize,
        part_tokens: usize,
        max_queued_tokens: usize,
        reranker: Option<(String, bool, String)>,
        replicas: Vec<String>,
    ) -> PyResult<Self> {
        if names.is_empty() {
            return Err(PyValueError::new_err("a served model needs a name"));
        }
        if build.is_some() != replicas.is_empty() {
            return Err(PyValueError::new_err(
                "a served model has either an engine's build or its replicas",
            ));
        }
        if !replicas.is_empty() && (part_tokens == 0 || reranker.is_some()) {
            return Err(PyValueError::new_err(
                "a model served by replicas needs its part tokens, and its scores are the \
                 Python front's",
            ));
        }
        Ok(ServedModel {
            tokenizer_json,
            build,
            replicas,
            names,
            max_length,
            fast,
            normalize,
            sparse,
            reranker,
            max_inputs,
            max_tokens,
            max_chars,
            window_chars,
            part_tokens,
            max_queued_tokens,
        })
    }
}

impl ServedModel {
    /// The model served: its tokenizer made, its engine built by a Tulip of its own (waited
    /// for, the GIL released), or its replicas' sockets (connected at their first call).
    fn start(
        &self,
        py: Python<'_>,
        lanes: Lanes,
        wait_requests: usize,
        delivery: Delivery,
        latency_buckets: &[f64],
        linking: &Linking,
    ) -> PyResult<Model> {
        let tokenizer = TextTokenizer::from_json(&self.tokenizer_json, self.max_length)
            .map_err(PyValueError::new_err)?;
        let reranker = match &self.reranker {
            Some(_) if tokenizer.pairs.is_none() => {
                return Err(PyValueError::new_err(
                    "a reranker's tokenizer must have a pair template",
                ))
            }
            Some((activation, typed, rerank_truncate)) => Some(Reranker {
                activation: Activation::of(activation).map_err(PyValueError::new_err)?,
                typed: *typed,
                rerank_cut: Cut::of(Some(rerank_truncate)).map_err(PyValueError::new_err)?,
            }),
            None => None,
        };
        let engines = match &self.build {
            Some(build) => Engines::Here(Tulip::start(
                py,
                build.clone_ref(py),
                self.max_queued_tokens,
                lanes,
                wait_requests,
                delivery,
            )?),
            None => Engines::Linked(Arc::new(
                Links::new(&self.replicas, linking).map_err(PyValueError::new_err)?,
            )),
        };
        let limits = Limits {
            max_inputs: self.max_inputs,
            max_tokens: self.max_tokens,
            max_chars: self.max_chars,
            window_chars: self.window_chars,
            // 0: a part of a request is one batch of the engine's
            part_tokens: match (self.part_tokens, &engines) {
                (0, Engines::Here(tulip)) => tulip.batch_tokens,
                (given, _) => given,
            },
        };
        Ok(Model {
            names: self.names.clone(),
            tokenizer,
            engines,
            lanes,
            served: Served {
                embeddings: self.fast,
                normalize: self.normalize,
                sparse: self.sparse,
                reranker,
            },
            limits,
            stats: routes()
                .map(|_| Stats::new(latency_buckets.to_vec()))
                .collect(),
        })
    }
}

/// The native front on `host:port` for `models` (`ServedModel`, each with a Tulip of its own,
/// built in turn): the plain shapes of the routes of `ivy::routes` answered here, their ids
/// queued on the named model's Tulip, which calls its `build()`'s `step(*arrays) -> handle` (and
/// `sparse(*arrays)`) on its engine thread (`tulip::BatchArrays`); every other request handed
/// to the Python `front` (`ivy::fallback`).
#[pyclass(frozen, module = "embedserve._native")]
struct Gateway {
    // taken by the first shutdown; other threads read `port` and call `stop()` meanwhile
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    // the bound socket until `serve()` starts accepting on it
    listener: Mutex<Option<std::net::TcpListener>>,
    stop: watch::Sender<bool>,
    front: Arc<Front>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Gateway {
    #[new]
    #[pyo3(signature = (
        models, front, *, max_body_bytes, parts_in_flight, request_timeout, body_timeout,
        header_timeout, max_header_bytes, max_headers, max_connections, hosts, keys,
        latency_buckets, batch_wait_requests, host = "127.0.0.1", port = 0, threads = 1,
        lanes = None, traces = 0, avoid = (3, 10.0, 1.0), link_secret = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        models: Vec<PyRef<'_, ServedModel>>,
        front: Py<PyAny>,
        max_body_bytes: usize,
        parts_in_flight: usize,
        request_timeout: f64,
        body_timeout: f64,
        header_timeout: f64,
        max_header_bytes: usize,
        max_headers: usize,
        max_connections: usize,
        hosts: Vec<String>,
        keys: Vec<Vec<u8>>,
        latency_buckets: Vec<f64>,
        batch_wait_requests: usize,
        host: &str,
        port: u16,
        threads: usize,
        lanes: Option<(usize, usize, usize)>,
        traces: usize,
        avoid: (usize, f64, f64),
        link_secret: Option<String>,
    ) -> PyResult<Self> {
        if threads == 0 || models.is_empty() {
            return Err(PyValueError::new_err(
                "threads must be positive, and a model given",
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ivy")
            // its workers hand requests to the Python front (nothing of Ivy's runs on tokio's
            // blocking pool, whose threads would come and go, each keeping a thread state)
            .on_thread_start(thread_state::keep)
            .enable_all()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let listener = std::net::TcpListener::bind((host, port))
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {host}:{port}: {e}")))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let seconds = |s: f64| Duration::from_secs_f64(s.max(0.001));
        // (bulk_every, bulk_inputs, bulk_tokens): the Python package's rule; None: lanes off
        let lanes = match lanes {
            Some((bulk_every, bulk_inputs, bulk_tokens)) if bulk_every > 0 => Lanes {
                bulk_every,
                bulk_inputs,
                bulk_tokens,
            },
            _ => Lanes::OFF,
        };
        let delivery = Delivery(Some(runtime.handle().clone()));
        // (failing_after, seconds avoided then, seconds avoided when unreachable): the Python
        // pool's rules (`gateway/replicas.py`) for a model served by replicas
        let linking = Linking {
            avoid: Avoid {
                failing_after: avoid.0.max(1),
                engine_failing: seconds(avoid.1),
                unreachable: seconds(avoid.2),
            },
            secret: link_secret,
        };
        let models = models
            .iter()
            .map(|spec| {
                spec.start(
                    py,
                    lanes,
                    batch_wait_requests,
                    delivery.clone(),
                    &latency_buckets,
                    &linking,
                )
            })
            .collect::<PyResult<Vec<Model>>>()?;
        let bounds = Bounds {
            max_body_bytes,
            parts_in_flight,
            request_timeout: seconds(request_timeout),
            body_timeout: seconds(body_timeout),
            header_timeout: seconds(header_timeout),
            max_header_bytes,
            max_headers,
            max_connections,
        };
        let admission = Admission { hosts, keys };
        let front = Arc::new(Front::new(
            models,
            front,
            bounds,
            admission,
            // spans held for the exporter at most (0: tracing off)
            (traces > 0).then(|| Traces::new(traces)),
        ));
        let (stop, _) = watch::channel(false);
        Ok(Gateway {
            runtime: Mutex::new(Some(runtime)),
            listener: Mutex::new(Some(listener)),
            stop,
            front,
            port,
        })
    }

    /// Model `model`'s engine's tokens per batch (its `build()`'s).
    #[pyo3(signature = (model = 0))]
    fn batch_tokens(&self, model: usize) -> PyResult<usize> {
        Ok(self.tulip(model)?.batch_tokens)
    }

    /// Accepts and serves until `stop()` (the socket is bound at construction: connections made
    /// before wait in its backlog); signals are handled meanwhile (Python's handlers run here,
    /// and KeyboardInterrupt and the like are raised from here).
    fn serve(&self, py: Python<'_>) -> PyResult<()> {
        let listener = self.listener.lock().ok().and_then(|mut l| l.take());
        let Some(listener) = listener else {
            return Err(PyRuntimeError::new_err("serve() was called already"));
        };
        let mut stopped = self.stop.subscribe();
        {
            let runtime = self
                .runtime
                .lock()
                .map_err(|_| PyRuntimeError::new_err("poisoned"))?;
            let Some(runtime) = runtime.as_ref() else {
                return Err(PyRuntimeError::new_err("the gateway has stopped"));
            };
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener)?;
            runtime.spawn(serve(self.front.clone(), listener, self.stop.subscribe()));
        }
        loop {
            if *stopped.borrow_and_update() {
                break;
            }
            // a SIGTERM forwarded by `serve`'s launcher starts the drain within this
            py.detach(|| std::thread::sleep(Duration::from_millis(10)));
            if let Err(e) = py.check_signals() {
                self.shutdown();
                return Err(e);
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Stops accepting; `serve()` returns.
    fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Every request from now on is handed to the Python front (which answers 503 while it
    /// drains); those in flight finish.
    fn drain(&self) {
        self.front.draining.store(true, Ordering::Relaxed);
    }

    /// Tokens queued on model `model`'s Tulip, not yet in a batch (the engine's metrics).
    #[pyo3(signature = (model = 0))]
    fn queued_tokens(&self, model: usize) -> PyResult<usize> {
        Ok(self.tulip(model)?.queued_tokens())
    }

    /// Tokens submitted to model `model`'s Tulip (by Ivy and by the Python front) and not yet
    /// answered: its engine's outstanding tokens, as the gateway counts a replica's (`/ready`).
    #[pyo3(signature = (model = 0))]
    fn outstanding_tokens(&self, model: usize) -> PyResult<usize> {
        Ok(self.tulip(model)?.outstanding_tokens())
    }

    /// The spans of the requests answered here since the last call (`ivy::traces`), each
    /// `(name, trace_id, span_id, parent_span_id, kind, start_ns, end_ns, attributes)`, and how
    /// many were dropped meanwhile (the buffer full); none when tracing is off.
    #[allow(clippy::type_complexity)]
    fn take_spans<'py>(&self, py: Python<'py>) -> PyResult<(Vec<Bound<'py, PyTuple>>, u64)> {
        let Some(traces) = &self.front.traces else {
            return Ok((Vec::new(), 0));
        };
        let (spans, dropped) = traces.take();
        let mut out = Vec::with_capacity(spans.len());
        for span in spans {
            let attributes = PyDict::new(py);
            for (key, value) in span.strings {
                attributes.set_item(key, value)?;
            }
            for (key, value) in span.ints {
                attributes.set_item(key, value)?;
            }
            let item = (
                span.name,
                PyBytes::new(py, &span.trace_id),
                PyBytes::new(py, &span.span_id),
                PyBytes::new(py, &span.parent),
                span.kind,
                span.start_ns,
                span.end_ns,
                attributes,
            );
            out.push(item.into_pyobject(py)?);
        }
        Ok((out, dropped))
    }

    /// Requests read and not yet answered.
    #[getter]
    fn in_flight(&self) -> usize {
        self.front.in_flight.load(Ordering::Relaxed)
    }

    /// What the requests answered here (not handed over) add to the metrics since the last
    /// call, by model and route: (route, the model's first name, (requests, latency counts per
    /// bucket of `latency_buckets` and one over them, latency seconds in all, tokens, inputs)).
    fn take_counts(&self) -> Vec<(&'static str, &str, Taken)> {
        let models = self.front.models.iter();
        models
            .flat_map(|m| {
                routes()
                    .zip(&m.stats)
                    .map(|(r, stats)| (r, &*m.names[0], stats.take()))
            })
            .collect()
    }

    /// With several models, the one a body naming no model goes to on the routes answered
    /// here, by what it asks (dense embeddings, sparse vectors, scores): a model's place, or
    /// None where the Python front's rule picks none (it answers why). Unset, all None.
    fn set_unnamed(&self, embed: Option<usize>, sparse: Option<usize>, score: Option<usize>) {
        if let Ok(mut unnamed) = self.front.unnamed.write() {
            *unnamed = [embed, sparse, score];
        }
    }

    /// Tokens of Ivy's calls to each of model `model`'s replicas not yet answered, in order
    /// (a model served by replicas; one in this process has none).
    #[pyo3(signature = (model = 0))]
    fn replica_tokens(&self, model: usize) -> PyResult<Vec<usize>> {
        match self.front.models.get(model).map(|m| &m.engines) {
            Some(Engines::Linked(links)) => Ok(links.sent_tokens()),
            Some(Engines::Here(_)) => Ok(Vec::new()),
            None => Err(PyValueError::new_err(format!("no model {model}"))),
        }
    }

    /// The API keys in force from now on (the key file read again on SIGHUP).
    fn set_api_keys(&self, keys: Vec<Vec<u8>>) {
        if let Ok(mut admission) = self.front.admission.write() {
            admission.keys = keys;
        }
    }

    /// Queues a Python request's packed sequences (little-endian int32 bytes; `token_types`
    /// one per id for a cross-encoder's pairs) on model `model`'s Tulip beside the native ones,
    /// in the bulk lane when `bulk` (the request's lane, the Python front's rule);
    /// `callback(rows, width, queue_s, inference_s, error)` is called on the thread that
    /// resolves its batch. False when the queue is full.
    #[pyo3(signature = (ids, cu_seqlens, callback, bulk = false, token_types = None, model = 0))]
    fn submit(
        &self,
        ids: &[u8],
        cu_seqlens: &[u8],
        callback: Py<PyAny>,
        bulk: bool,
        token_types: Option<&[u8]>,
        model: usize,
    ) -> PyResult<bool> {
        let packed =
            Packed::from_le_bytes(ids, cu_seqlens, token_types).map_err(PyValueError::new_err)?;
        Ok(self
            .tulip(model)?
            .queue(packed, Reply::Python(callback), bulk))
    }

    /// Queues `work()`, a Python request's batch of its own (spans, a retrieval model's
    /// outputs), counted as `tokens` against the queue's bound, in the bulk lane when `bulk`:
    /// run alone on the engine thread in its turn, it answers its request itself. False when
    /// the queue is full.
    #[pyo3(signature = (work, tokens, bulk = false, model = 0))]
    fn call(&self, work: Py<PyAny>, tokens: usize, bulk: bool, model: usize) -> PyResult<bool> {
        Ok(self
            .tulip(model)?
            .queue_tokens(Packed::new(), Reply::Call(work), tokens, bulk))
    }
}

impl Gateway {
    /// Model `model`'s queue (in the order given).
    /// Model `model`'s queue in this process (an error for a model served by replicas).
    fn tulip(&self, model: usize) -> PyResult<&Tulip> {
        match self.front.models.get(model).map(|m| &m.engines) {
            Some(Engines::Here(tulip)) => Ok(tulip),
            Some(Engines::Linked(_)) => Err(PyValueError::new_err(format!(
                "model {model} is served by replicas, not an engine in this process"
            ))),
            None => Err(PyValueError::new_err(format!("no model {model}"))),
        }
    }

    fn shutdown(&self) {
        self.stop.send_replace(true);
        let taken = self.runtime.lock().ok().and_then(|mut r| r.take());
        if let Some(runtime) = taken {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Nanoseconds one spin-wait hint (x86's `pause`, what OpenMP's spin repeats) takes on this
/// CPU: the least over `runs` of `rounds` each (a run the kernel preempted counts long). It
/// turns a spin counted in rounds into a time: a pause costs 10 to 150 cycles by CPU
/// (`cpu_threads.server_spin_rounds`).
#[pyfunction]
#[pyo3(signature = (rounds = 10_000, runs = 3))]
fn pause_ns(py: Python<'_>, rounds: u32, runs: u32) -> f64 {
    py.detach(|| {
        (0..runs.max(1))
            .map(|_| {
                let start = Instant::now();
                for _ in 0..rounds {
                    std::hint::spin_loop();
                }
                start.elapsed().as_nanos() as f64 / f64::from(rounds.max(1))
            })
            .fold(f64::INFINITY, f64::min)
    })
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(pause_ns, module)?)?;
    module.add_class::<Tokenizer>()?;
    module.add_class::<PairTemplate>()?;
    module.add_class::<ServedModel>()?;
    module.add_class::<Gateway>()?;
    module.add_class::<ivy::fallback::Reply>()?;
    Ok(())
}

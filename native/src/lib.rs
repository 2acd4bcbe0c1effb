//! `embedserve._native`: the request path in Rust, built by maturin into the package.
//!
//! Two layers, one direction of calls: `ivy` (HTTP, JSON, tokenization) hands packed token ids
//! to `tulip` (the FCFS token-budget queue), which calls the Python engine's `step()` through
//! pyo3. Python sees three classes: `Tokenizer` (packed ids of a batch of texts, the GIL released
//! while it works), its `PairTemplate` (a cross-encoder's pairs joined) and `Gateway` (the HTTP
//! front and the queue in front of a `step` callable).

mod id_lists;
pub mod ivy;
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
use ivy::front::{Bounds, Front, Reranker, Served};
use ivy::http::serve;
use ivy::pairs::{Cut, Joined};
use ivy::routes::routes;
use ivy::scoring::Activation;
use ivy::stats::{Stats, Taken};
use ivy::tokenize::{TextTokenizer, TokenizeError};
use ivy::traces::Traces;
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

/// The native front on `host:port`: the plain shapes of the routes of `ivy::routes` answered
/// here (`fast`: the embedding routes; `sparse`: TEI's `/embed_sparse`; `reranker`: the scoring
/// routes), their ids queued on Tulip, which calls `build()`'s `step(*arrays) -> handle` (and
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
        tokenizer_json, build, front, *, names, max_length, fast, normalize, sparse, max_body_bytes,
        max_inputs, max_tokens, max_chars, window_chars, part_tokens, parts_in_flight,
        request_timeout, body_timeout, header_timeout, max_header_bytes, max_headers,
        max_connections, hosts, keys, latency_buckets, max_queued_tokens, batch_wait_requests,
        host = "127.0.0.1", port = 0, threads = 1, lanes = None, reranker = None, traces = 0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tokenizer_json: &str,
        build: Py<PyAny>,
        front: Py<PyAny>,
        names: Vec<String>,
        max_length: usize,
        fast: bool,
        normalize: bool,
        sparse: bool,
        max_body_bytes: usize,
        max_inputs: usize,
        max_tokens: usize,
        max_chars: usize,
        window_chars: usize,
        part_tokens: usize,
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
        max_queued_tokens: usize,
        batch_wait_requests: usize,
        host: &str,
        port: u16,
        threads: usize,
        lanes: Option<(usize, usize, usize)>,
        reranker: Option<(String, bool, String)>,
        traces: usize,
    ) -> PyResult<Self> {
        if threads == 0 || names.is_empty() {
            return Err(PyValueError::new_err(
                "threads must be positive, and a name given",
            ));
        }
        let tokenizer =
            TextTokenizer::from_json(tokenizer_json, max_length).map_err(PyValueError::new_err)?;
        // (activation, typed, Cohere's rerank truncate): a cross-encoder's scoring routes
        // answered here
        let reranker = match reranker {
            Some(_) if tokenizer.pairs.is_none() => {
                return Err(PyValueError::new_err(
                    "a reranker's tokenizer must have a pair template",
                ))
            }
            Some((activation, typed, rerank_truncate)) => Some(Reranker {
                activation: Activation::of(&activation).map_err(PyValueError::new_err)?,
                typed,
                rerank_cut: Cut::of(Some(&rerank_truncate)).map_err(PyValueError::new_err)?,
            }),
            None => None,
        };
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
        let tulip = Tulip::start(
            py,
            build,
            max_queued_tokens,
            lanes,
            batch_wait_requests,
            delivery,
        )?;
        let bounds = Bounds {
            max_body_bytes,
            max_inputs,
            max_tokens,
            max_chars,
            window_chars,
            // 0: a part of a request is one batch of the engine's
            part_tokens: if part_tokens == 0 {
                tulip.batch_tokens
            } else {
                part_tokens
            },
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
            names,
            tokenizer,
            tulip,
            front,
            Served {
                embeddings: fast,
                normalize,
                sparse,
                reranker,
            },
            bounds,
            admission,
            routes()
                .map(|_| Stats::new(latency_buckets.clone()))
                .collect(),
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

    /// The engine's tokens per batch (`build()`'s).
    #[getter]
    fn batch_tokens(&self) -> usize {
        self.front.tulip.batch_tokens
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

    /// Tokens queued on Tulip, not yet in a batch (the engine's metrics).
    #[getter]
    fn queued_tokens(&self) -> usize {
        self.front.tulip.queued_tokens()
    }

    /// Tokens submitted to Tulip (by Ivy and by the Python front) and not yet answered: the
    /// one engine's outstanding tokens, as the gateway counts a replica's (`/ready`).
    #[getter]
    fn outstanding_tokens(&self) -> usize {
        self.front.tulip.outstanding_tokens()
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
    /// call, by route: (route, (requests, latency counts per bucket of `latency_buckets` and
    /// one over them, latency seconds in all, tokens, inputs)).
    fn take_counts(&self) -> Vec<(&'static str, Taken)> {
        routes()
            .zip(&self.front.stats)
            .map(|(route, stats)| (route, stats.take()))
            .collect()
    }

    /// The API keys in force from now on (the key file read again on SIGHUP).
    fn set_api_keys(&self, keys: Vec<Vec<u8>>) {
        if let Ok(mut admission) = self.front.admission.write() {
            admission.keys = keys;
        }
    }

    /// Queues a Python request's packed sequences (little-endian int32 bytes; `token_types`
    /// one per id for a cross-encoder's pairs) on Tulip beside the native ones, in the bulk lane
    /// when `bulk` (the request's lane, the Python front's rule);
    /// `callback(rows, width, queue_s, inference_s, error)` is called on the thread that
    /// resolves its batch. False when the queue is full.
    #[pyo3(signature = (ids, cu_seqlens, callback, bulk = false, token_types = None))]
    fn submit(
        &self,
        ids: &[u8],
        cu_seqlens: &[u8],
        callback: Py<PyAny>,
        bulk: bool,
        token_types: Option<&[u8]>,
    ) -> PyResult<bool> {
        let packed =
            Packed::from_le_bytes(ids, cu_seqlens, token_types).map_err(PyValueError::new_err)?;
        Ok(self
            .front
            .tulip
            .queue(packed, Reply::Python(callback), bulk))
    }

    /// Queues `work()`, a Python request's batch of its own (spans, a retrieval model's
    /// outputs), counted as `tokens` against the queue's bound, in the bulk lane when `bulk`:
    /// run alone on the engine thread in its turn, it answers its request itself. False when
    /// the queue is full.
    #[pyo3(signature = (work, tokens, bulk = false))]
    fn call(&self, work: Py<PyAny>, tokens: usize, bulk: bool) -> bool {
        self.front
            .tulip
            .queue_tokens(Packed::new(), Reply::Call(work), tokens, bulk)
    }
}

impl Gateway {
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
    module.add_class::<Gateway>()?;
    module.add_class::<ivy::fallback::Reply>()?;
    Ok(())
}

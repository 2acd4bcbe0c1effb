//! `embedserve._native`: the request path in Rust, built by maturin into the package.
//!
//! Two layers, one direction of calls: `ivy` (HTTP, JSON, tokenization) hands packed token ids
//! to `tulip` (the FCFS token-budget queue), which calls the Python engine's `step()` through
//! pyo3. Python sees two classes: `Tokenizer` (packed ids of a batch of texts, the GIL released
//! while it works) and `Gateway` (the HTTP front and the queue in front of a `step` callable).

pub mod ivy;
pub mod tulip;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::watch;

use ivy::http::{serve, Front};
use ivy::tokenize::TextTokenizer;
use tulip::Tulip;

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
    fn encode_batch(&self, py: Python<'_>, texts: Vec<String>) -> PyResult<Vec<Vec<u32>>> {
        py.detach(|| self.inner.batch(&texts))
            .map_err(|e| PyValueError::new_err(e.to_string()))
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

/// The native front: `POST /v1/embeddings` and `GET /health` on `host:port`, each request's
/// ids queued for `step(ids, cu_seqlens) -> handle` (`handle.wait()`: float32 rows).
#[pyclass(frozen, module = "embedserve._native")]
struct Gateway {
    // taken by the first shutdown; other threads read `port` and call `stop()` meanwhile
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    stop: watch::Sender<bool>,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl Gateway {
    #[new]
    #[pyo3(signature = (
        tokenizer, step, *, model, max_length, batch_tokens, max_body_bytes, max_inputs,
        host = "127.0.0.1", port = 0, threads = 1, max_queued_tokens = 1 << 20,
        normalize = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        tokenizer: &str,
        step: Py<PyAny>,
        model: String,
        max_length: usize,
        batch_tokens: usize,
        max_body_bytes: usize,
        max_inputs: usize,
        host: &str,
        port: u16,
        threads: usize,
        max_queued_tokens: usize,
        normalize: bool,
    ) -> PyResult<Self> {
        if threads == 0 || batch_tokens == 0 {
            return Err(PyValueError::new_err(
                "threads and batch_tokens must be positive",
            ));
        }
        let tokenizer =
            TextTokenizer::from_file(tokenizer, max_length).map_err(PyValueError::new_err)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ivy")
            .enable_all()
            .build()
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let listener = std::net::TcpListener::bind((host, port))
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {host}:{port}: {e}")))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let front = Arc::new(Front {
            model,
            tokenizer,
            tulip: Tulip::start(step, batch_tokens, max_queued_tokens),
            max_body_bytes,
            max_inputs,
            part_tokens: batch_tokens,
            normalize,
        });
        let (stop, stopped) = watch::channel(false);
        let _guard = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        runtime.spawn(serve(front, listener, stopped));
        Ok(Gateway {
            runtime: Mutex::new(Some(runtime)),
            stop,
            port,
        })
    }

    /// Serves until `stop()` or a signal (KeyboardInterrupt and the like are raised here).
    fn serve(&self, py: Python<'_>) -> PyResult<()> {
        let mut stopped = self.stop.subscribe();
        loop {
            if *stopped.borrow_and_update() {
                break;
            }
            py.detach(|| std::thread::sleep(Duration::from_millis(50)));
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
        let _ = self.stop.send(true);
    }
}

impl Gateway {
    fn shutdown(&self) {
        let _ = self.stop.send(true);
        let taken = self.runtime.lock().ok().and_then(|mut r| r.take());
        if let Some(runtime) = taken {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Tokenizer>()?;
    module.add_class::<Gateway>()?;
    Ok(())
}

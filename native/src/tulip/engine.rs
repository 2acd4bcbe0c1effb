use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use crate::ivy::tokenize::Packed;

/// A request's rows, `width` floats per sequence in order, and its stage times (seconds queued
/// until a batch took it, then that batch's run until its rows were read): TEI's headers.
#[derive(Debug, Default)]
pub struct Rows {
    pub values: Vec<f32>,
    pub width: usize,
    pub queue: f64,
    pub inference: f64,
}

/// A request's rows, or why the engine failed it.
pub type Answer = Result<Rows, String>;

/// Where a request's answer goes: an Ivy connection's task, or a Python callable
/// `(rows: bytes | None, width, queue_s, inference_s, error: str | None)` called on the thread
/// that resolved the batch, with the GIL (the Python front's requests: `Gateway.submit`).
/// `Call`: not rows of `step` but work of its own (`Gateway.call`: spans, a retrieval model's
/// outputs), a Python callable run alone on the engine thread in its turn, which answers its
/// request itself.
pub enum Reply {
    Native(oneshot::Sender<Answer>),
    Python(Py<PyAny>),
    Call(Py<PyAny>),
}

/// One request's sequences (none for a call) and where its answer goes; `tokens` count
/// against the queue's bound.
pub struct Job {
    pub packed: Packed,
    pub reply: Reply,
    pub queued: Instant,
    pub tokens: usize,
}

impl Job {
    fn answer(self, py: Python<'_>, answer: Answer) {
        match self.reply {
            Reply::Native(sender) => {
                let _ = sender.send(answer);
            }
            Reply::Call(_) => {} // never batched: it answers its request itself
            Reply::Python(callback) => {
                let called = match answer {
                    Ok(rows) => {
                        let bytes: Vec<u8> =
                            rows.values.iter().flat_map(|v| v.to_le_bytes()).collect();
                        let bytes = PyBytes::new(py, &bytes);
                        callback.call1(
                            py,
                            (bytes, rows.width, rows.queue, rows.inference, py.None()),
                        )
                    }
                    Err(message) => callback.call1(py, (py.None(), 0, 0.0, 0.0, message)),
                };
                if let Err(e) = called {
                    e.print(py); // the callback's own failure: said, the batch goes on
                }
            }
        }
    }
}

struct InFlight {
    handle: Py<PyAny>,
    jobs: Vec<Job>,
    taken: Instant,
}

/// The queue's sending end, shared by every connection.
pub struct Tulip {
    /// tokens per batch: the engine's, from `build`
    pub batch_tokens: usize,
    queue: mpsc::Sender<Job>,
    queued_tokens: Arc<AtomicUsize>,
    max_queued_tokens: usize,
}

impl Tulip {
    /// Starts the engine thread, which calls `build()` first and steps what it returns, and the
    /// results thread. `build() -> (step, batch_tokens)`, `step(ids, cu_seqlens) -> handle`:
    /// int32 bytes in,
    /// `handle.wait()` a float32 [sequences, width] buffer. NOTE: the engine is built on the
    /// thread that steps it, as the Python server does (`server/engine_thread.py`): on the CPU
    /// each thread running PyTorch leads an OpenMP team of its own. Waits for `build` (the GIL
    /// released) and returns its error, if it raised.
    pub fn start(
        py: Python<'_>,
        build: Py<PyAny>,
        max_queued_tokens: usize,
    ) -> Result<Self, PyErr> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let (built, ready) = mpsc::channel::<Result<usize, PyErr>>();
        // one batch waiting on its results at most: the engine thread blocks on the next
        let (in_flight, to_resolve) = mpsc::sync_channel::<InFlight>(1);
        let queued_tokens = Arc::new(AtomicUsize::new(0));
        let counter = queued_tokens.clone();
        thread::Builder::new()
            .name("tulip-engine".into())
            .spawn(move || {
                let step = Python::attach(|py| build.call0(py)?.extract::<(Py<PyAny>, usize)>(py));
                let (step, batch_tokens) = match step {
                    Ok((step, batch_tokens)) if batch_tokens > 0 => {
                        let _ = built.send(Ok(batch_tokens));
                        (step, batch_tokens)
                    }
                    Ok(_) => {
                        let message = "build() gave a batch of no tokens";
                        let _ = built.send(Err(PyValueError::new_err(message)));
                        return;
                    }
                    Err(e) => {
                        let _ = built.send(Err(e));
                        return;
                    }
                };
                engine_loop(jobs, step, batch_tokens, in_flight, counter)
            })
            .expect("the engine thread starts");
        thread::Builder::new()
            .name("tulip-results".into())
            .spawn(move || results_loop(to_resolve))
            .expect("the results thread starts");
        let batch_tokens = py.detach(move || ready.recv()).unwrap_or_else(|_| {
            Err(PyRuntimeError::new_err(
                "the engine thread ended while building",
            ))
        })?;
        Ok(Tulip {
            batch_tokens,
            queue,
            queued_tokens,
            max_queued_tokens,
        })
    }

    /// Queues `packed`; its rows come back on the receiver. None when the queue already holds
    /// `max_queued_tokens` (the caller answers 503: the server keeps serving what it took).
    pub fn submit(&self, packed: Packed) -> Option<oneshot::Receiver<Answer>> {
        let (reply, answer) = oneshot::channel();
        self.queue(packed, Reply::Native(reply)).then_some(answer)
    }

    /// Queues `packed` for `reply`; false when the queue is full or the engine thread has gone.
    pub fn queue(&self, packed: Packed, reply: Reply) -> bool {
        let tokens = packed.num_tokens();
        self.queue_tokens(packed, reply, tokens)
    }

    /// `queue` with the tokens counted given (a call's: its `packed` is empty).
    pub fn queue_tokens(&self, packed: Packed, reply: Reply, tokens: usize) -> bool {
        let before = self.queued_tokens.fetch_add(tokens, Ordering::Relaxed);
        if before > 0 && before + tokens > self.max_queued_tokens {
            self.queued_tokens.fetch_sub(tokens, Ordering::Relaxed);
            return false;
        }
        let job = Job {
            packed,
            reply,
            queued: Instant::now(),
            tokens,
        };
        self.queue.send(job).is_ok()
    }
}

fn engine_loop(
    jobs: mpsc::Receiver<Job>,
    step: Py<PyAny>,
    budget: usize,
    in_flight: mpsc::SyncSender<InFlight>,
    queued_tokens: Arc<AtomicUsize>,
) {
    let mut held: Option<Job> = None; // the first job of the next batch: it did not fit
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        if let Reply::Call(work) = &first.reply {
            queued_tokens.fetch_sub(first.tokens, Ordering::Relaxed);
            Python::attach(|py| {
                if let Err(e) = work.call0(py) {
                    e.print(py); // its own failure to answer: said, the queue goes on
                }
            });
            continue;
        }
        let mut tokens = first.tokens;
        let mut batch = vec![first];
        while let Ok(job) = jobs.try_recv() {
            let call = matches!(job.reply, Reply::Call(_));
            if call || tokens + job.tokens > budget {
                held = Some(job); // a call runs alone, next
                break;
            }
            tokens += job.tokens;
            batch.push(job);
        }
        queued_tokens.fetch_sub(tokens, Ordering::Relaxed);
        let taken = Instant::now();
        let mut packed = Packed::new();
        for job in &batch {
            packed.extend(&job.packed);
        }
        let (ids, cu) = packed.le_bytes();
        let handle = Python::attach(|py| {
            step.call1(py, (PyBytes::new(py, &ids), PyBytes::new(py, &cu)))
                .map_err(|e| e.to_string())
        });
        let handle = match handle {
            Ok(handle) => handle,
            Err(message) => {
                fail(batch, &message);
                continue;
            }
        };
        // NOTE: with nothing queued behind it there is no next batch to prepare: the batch is
        // resolved here, one thread hand-off fewer for a lone request; otherwise the results
        // thread resolves it while this one prepares the next
        if held.is_none() {
            match jobs.try_recv() {
                Ok(next) => held = Some(next),
                Err(mpsc::TryRecvError::Empty) => {
                    resolve(handle, batch, taken);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    resolve(handle, batch, taken);
                    return;
                }
            }
        }
        let batch = InFlight {
            handle,
            jobs: batch,
            taken,
        };
        if in_flight.send(batch).is_err() {
            return;
        }
    }
}

fn results_loop(in_flight: mpsc::Receiver<InFlight>) {
    for InFlight {
        handle,
        jobs,
        taken,
    } in in_flight
    {
        resolve(handle, jobs, taken);
    }
}

/// Waits for `handle` and answers each job with its rows, the GIL held throughout (a Python
/// job's callback needs it; a native one's send is a few instructions).
fn resolve(handle: Py<PyAny>, jobs: Vec<Job>, taken: Instant) {
    Python::attach(|py| {
        let rows = (|| -> PyResult<(Vec<f32>, usize)> {
            let array = handle.call_method0(py, "wait")?;
            let buffer = PyBuffer::<f32>::get(array.bind(py))?;
            let width = buffer.shape().get(1).copied().unwrap_or(0);
            Ok((buffer.to_vec(py)?, width))
        })();
        let inference = taken.elapsed().as_secs_f64();
        let (rows, width) = match rows {
            Ok(rows) => rows,
            Err(e) => {
                let message = e.to_string();
                jobs.into_iter()
                    .for_each(|job| job.answer(py, Err(message.clone())));
                return;
            }
        };
        let mut start = 0;
        for job in jobs {
            let end = start + job.packed.num_seqs() * width;
            let answer = match rows.get(start..end) {
                Some(own) => Ok(Rows {
                    values: own.to_vec(),
                    width,
                    queue: taken.saturating_duration_since(job.queued).as_secs_f64(),
                    inference,
                }),
                None => Err("the engine answered too few rows".to_string()),
            };
            job.answer(py, answer);
            start = end;
        }
    });
}

fn fail(jobs: Vec<Job>, message: &str) {
    Python::attach(|py| {
        jobs.into_iter()
            .for_each(|job| job.answer(py, Err(message.to_string())));
    });
}

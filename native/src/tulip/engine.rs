use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use tokio::sync::oneshot;

use super::packed::Packed;

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

/// An answer's stage times: (seconds queued, seconds in the engine).
pub trait Timed {
    fn times(&self) -> (f64, f64);
}

impl Timed for Rows {
    fn times(&self) -> (f64, f64) {
        (self.queue, self.inference)
    }
}

impl Timed for SparseRows {
    fn times(&self) -> (f64, f64) {
        (self.queue, self.inference)
    }
}

/// A request's sparse vectors (CSR: sequence i's entries are `indices[offsets[i]..offsets[i +
/// 1]]`, ascending token ids, and the same range of `values`) and its stage times.
#[derive(Debug, Default)]
pub struct SparseRows {
    pub offsets: Vec<i64>,
    pub indices: Vec<i64>,
    pub values: Vec<f32>,
    pub queue: f64,
    pub inference: f64,
}

/// A request's sparse vectors, or why the engine failed it.
pub type SparseAnswer = Result<SparseRows, String>;

/// Where a request's answer goes: an Ivy connection's task, or a Python callable
/// `(rows: bytes | None, width, queue_s, inference_s, error: str | None)` called on the thread
/// that resolved the batch, with the GIL (the Python front's requests: `Gateway.submit`).
/// `Call`: not rows of `step` but work of its own (`Gateway.call`: spans, a retrieval model's
/// outputs), a Python callable run alone on the engine thread in its turn, which answers its
/// request itself. `Sparse`: an Ivy connection's sparse vectors, its sequences run alone
/// through `build()`'s `sparse` (a batch of one kind, as the Python server runs outputs).
pub enum Reply {
    Native(oneshot::Sender<Answer>),
    Python(Py<PyAny>),
    Call(Py<PyAny>),
    Sparse(oneshot::Sender<SparseAnswer>),
}

impl Reply {
    /// Whether its job runs alone, not batched with `step`'s.
    fn alone(&self) -> bool {
        matches!(self, Reply::Call(_) | Reply::Sparse(_))
    }

    /// Whether nobody waits for it any more: an Ivy request past its deadline, or whose client
    /// left (its receiver dropped). NOTE: the Python front's own requests are dropped on its
    /// side; their work is still done.
    fn abandoned(&self) -> bool {
        match self {
            Reply::Native(sender) => sender.is_closed(),
            Reply::Sparse(sender) => sender.is_closed(),
            Reply::Python(_) | Reply::Call(_) => false,
        }
    }
}

/// One request's sequences (none for a call) and where its answer goes; `tokens` count
/// against the queue's bound; `bulk`: its lane (else interactive).
pub struct Job {
    pub packed: Packed,
    pub reply: Reply,
    pub queued: Instant,
    pub tokens: usize,
    pub bulk: bool,
    /// its tokens, counted as outstanding until the job is answered or dropped
    pub outstanding: Outstanding,
}

/// A job's share of the tokens submitted and not yet answered (`Tulip::outstanding_tokens`):
/// taken off the count when the job is dropped, whichever way it ends (answered, failed,
/// abandoned), so no path can leak it.
pub struct Outstanding {
    count: Arc<AtomicUsize>,
    tokens: usize,
}

impl Outstanding {
    pub fn new(count: &Arc<AtomicUsize>, tokens: usize) -> Self {
        count.fetch_add(tokens, Ordering::Relaxed);
        Outstanding {
            count: count.clone(),
            tokens,
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.count.fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

impl Job {
    /// Answers the job; an Ivy connection's answer is queued on `native` to be sent with the
    /// batch's others (`Delivery`).
    fn answer(
        self,
        py: Python<'_>,
        answer: Answer,
        native: &mut Vec<(oneshot::Sender<Answer>, Answer)>,
    ) {
        match self.reply {
            Reply::Native(sender) => native.push((sender, answer)),
            Reply::Call(_) => {} // never batched: it answers its request itself
            Reply::Sparse(sender) => {
                // never batched with `step`'s rows: only a failure reaches it here
                let _ = sender.send(answer.and_then(|_| Err("rows for a sparse request".into())));
            }
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

/// Where Ivy's answers are sent from. NOTE: each answer's send wakes its connection's task;
/// from this thread each wake of a parked Ivy worker is a system call, and on a busy core the
/// woken worker preempts this thread, one answer at a time (null engine, one core: ~12% of the
/// engine thread in context switches). A batch's answers are sent instead by one task on Ivy's
/// runtime: one wake per batch, the tasks then woken on the worker itself.
#[derive(Clone)]
pub struct Delivery(pub Option<tokio::runtime::Handle>);

impl Delivery {
    fn send(&self, answers: Vec<(oneshot::Sender<Answer>, Answer)>) {
        match &self.0 {
            Some(runtime) if answers.len() > 1 => {
                runtime.spawn(async move {
                    for (sender, answer) in answers {
                        let _ = sender.send(answer);
                    }
                });
            }
            _ => {
                for (sender, answer) in answers {
                    let _ = sender.send(answer);
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

/// Priority lanes (the Python package's rule, `core/lanes.py`, passed in once): a request of
/// more than `bulk_inputs` sequences or `bulk_tokens` tokens is bulk; at every batch boundary
/// the interactive lane goes first unless bulk work has waited `bulk_every - 1` batches.
/// `bulk_every` 0: lanes off, one FCFS queue.
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    pub bulk_every: usize,
    pub bulk_inputs: usize,
    pub bulk_tokens: usize,
}

impl Lanes {
    pub const OFF: Lanes = Lanes {
        bulk_every: 0,
        bulk_inputs: usize::MAX,
        bulk_tokens: usize::MAX,
    };

    /// Whether a request of `seqs` sequences, `tokens` tokens in all, is bulk.
    pub fn is_bulk(&self, seqs: usize, tokens: usize) -> bool {
        self.bulk_every > 0 && (seqs > self.bulk_inputs || tokens > self.bulk_tokens)
    }
}

/// The server's batch wait (`server/service.py`, `EmbedService._gather`, its numbers passed in
/// once): before a batch is cut, wait at most `wait` after the engine's last step (twice that
/// when more than `max_requests` requests are expected) until as many requests are queued as
/// were then waiting and in that step (at most `max_requests`), or a batch's tokens. The clients
/// just answered tend to come back at once, and where a forward has a large fixed cost (the
/// CPU) one batch of them all is much cheaper than one of the first and another of the rest.
/// One client alone never waits. `wait` zero: no wait (a GPU's default).
#[derive(Clone, Copy, Debug)]
pub struct BatchWait {
    pub wait: Duration,
    pub max_requests: usize,
}

/// When the engine's last step ended and how many requests were expected then.
struct LastStep {
    ended: Instant,
    expected: usize,
}

impl BatchWait {
    /// The moment the wait ends, and how many requests end it sooner: None when there is none.
    fn until(&self, last: &LastStep) -> Option<(Instant, usize)> {
        if self.wait.is_zero() {
            return None;
        }
        let times = if last.expected > self.max_requests {
            2
        } else {
            1
        };
        Some((
            last.ended + self.wait * times,
            last.expected.min(self.max_requests),
        ))
    }
}

/// The engine thread's two lanes, each first come, first served.
struct Queues {
    interactive: VecDeque<Job>,
    bulk: VecDeque<Job>,
    lanes: Lanes,
    bulk_skipped: usize, // batches the interactive lane took while bulk work waited
}

impl Queues {
    fn new(lanes: Lanes) -> Self {
        Queues {
            interactive: VecDeque::new(),
            bulk: VecDeque::new(),
            lanes,
            bulk_skipped: 0,
        }
    }

    fn push(&mut self, job: Job) {
        if job.bulk && self.lanes.bulk_every > 0 {
            self.bulk.push_back(job);
        } else {
            self.interactive.push_back(job);
        }
    }

    fn is_empty(&self) -> bool {
        self.interactive.is_empty() && self.bulk.is_empty()
    }

    /// Jobs waiting, in both lanes.
    fn len(&self) -> usize {
        self.interactive.len() + self.bulk.len()
    }

    /// Their tokens.
    fn tokens(&self) -> usize {
        self.interactive
            .iter()
            .chain(self.bulk.iter())
            .map(|job| job.tokens)
            .sum()
    }

    /// The lane the next batch comes from: the interactive one unless it is empty or bulk work
    /// has waited `bulk_every - 1` batches. None when both are empty.
    fn next_lane(&mut self) -> Option<&mut VecDeque<Job>> {
        let bulk_waits = !self.bulk.is_empty();
        let bulk_due = bulk_waits && self.bulk_skipped + 1 >= self.lanes.bulk_every;
        if !self.interactive.is_empty() && !bulk_due {
            self.bulk_skipped = if bulk_waits { self.bulk_skipped + 1 } else { 0 };
            return Some(&mut self.interactive);
        }
        if bulk_waits {
            self.bulk_skipped = 0;
            return Some(&mut self.bulk);
        }
        None
    }

    /// The next batch: a call alone, or whole jobs of one lane in order under `budget` (a job
    /// larger than it alone), and the tokens of the jobs nobody waits for any more, dropped
    /// meanwhile (`Reply::abandoned`: they take no part of the budget). Empty when nothing waits.
    fn next_batch(&mut self, budget: usize) -> (Vec<Job>, usize) {
        let mut dropped = 0;
        let Some(lane) = self.next_lane() else {
            return (Vec::new(), dropped);
        };
        dropped += drop_abandoned(lane);
        let Some(first) = lane.pop_front() else {
            return (Vec::new(), dropped);
        };
        if first.reply.alone() {
            return (vec![first], dropped);
        }
        let mut tokens = first.tokens;
        let mut batch = vec![first];
        loop {
            dropped += drop_abandoned(lane);
            let Some(job) = lane.front() else { break };
            if job.reply.alone() || tokens + job.tokens > budget {
                break; // a call runs alone, next
            }
            tokens += job.tokens;
            batch.extend(lane.pop_front());
        }
        (batch, dropped)
    }
}

/// The jobs at the front of `lane` that nobody waits for any more, dropped: their tokens.
fn drop_abandoned(lane: &mut VecDeque<Job>) -> usize {
    let mut tokens = 0;
    while lane.front().is_some_and(|job| job.reply.abandoned()) {
        tokens += lane.pop_front().map_or(0, |job| job.tokens);
    }
    tokens
}

/// The queue's sending end, shared by every connection.
pub struct Tulip {
    /// tokens per batch: the engine's, from `build`
    pub batch_tokens: usize,
    pub lanes: Lanes,
    queue: mpsc::Sender<Job>,
    queued_tokens: Arc<AtomicUsize>,
    outstanding_tokens: Arc<AtomicUsize>,
    max_queued_tokens: usize,
}

impl Tulip {
    /// Starts the engine thread, which calls `build()` first and steps what it returns, and the
    /// results thread. `build() -> (step, batch_tokens, batch_wait_seconds, sparse)` (the wait
    /// of `BatchWait`, with `wait_requests` its `max_requests`), `step(input_ids, seqlens,
    /// cu_seqlens, positions, seq_ids, token_type_ids) -> handle`: the engine's `PackedBatch`
    /// arrays as bytearrays (`BatchArrays`), `handle.wait()` a float32 [sequences, width]
    /// buffer; `sparse(*arrays) -> (offsets, indices, values)` (little-endian int64, int64,
    /// float32 bytes: `SparseRows`), eager, or None for a model without them. NOTE:
    /// the engine is built on the thread that steps it, as the Python server does
    /// (`server/engine_thread.py`): on the CPU each thread running PyTorch leads an OpenMP team
    /// of its own. Waits for `build` (the GIL released) and returns its error, if it raised.
    /// Ivy's answers are sent as `delivery` says.
    pub fn start(
        py: Python<'_>,
        build: Py<PyAny>,
        max_queued_tokens: usize,
        lanes: Lanes,
        wait_requests: usize,
        delivery: Delivery,
    ) -> Result<Self, PyErr> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let (built, ready) = mpsc::channel::<Result<usize, PyErr>>();
        // one batch waiting on its results at most: the engine thread blocks on the next
        let (in_flight, to_resolve) = mpsc::sync_channel::<InFlight>(1);
        let queued_tokens = Arc::new(AtomicUsize::new(0));
        let counter = queued_tokens.clone();
        let engine_delivery = delivery.clone();
        thread::Builder::new()
            .name("tulip-engine".into())
            .spawn(move || {
                crate::thread_state::keep();
                let step = Python::attach(|py| build.call0(py)?.extract::<Built>(py));
                let (step, batch_tokens, wait, sparse) = match step {
                    Ok((step, batch_tokens, wait, sparse)) if batch_tokens > 0 => {
                        let _ = built.send(Ok(batch_tokens));
                        (step, batch_tokens, wait, sparse)
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
                let queues = Queues::new(lanes);
                let steps = Steps { step, sparse };
                let wait = BatchWait {
                    wait: Duration::from_secs_f64(wait.max(0.0)),
                    max_requests: wait_requests,
                };
                let batching = Batching {
                    budget: batch_tokens,
                    wait,
                };
                engine_loop(
                    jobs,
                    queues,
                    steps,
                    batching,
                    in_flight,
                    counter,
                    engine_delivery,
                )
            })
            .expect("the engine thread starts");
        thread::Builder::new()
            .name("tulip-results".into())
            .spawn(move || {
                crate::thread_state::keep();
                results_loop(to_resolve, &delivery)
            })
            .expect("the results thread starts");
        let batch_tokens = py.detach(move || ready.recv()).unwrap_or_else(|_| {
            Err(PyRuntimeError::new_err(
                "the engine thread ended while building",
            ))
        })?;
        Ok(Tulip {
            batch_tokens,
            lanes,
            queue,
            queued_tokens,
            outstanding_tokens: Arc::new(AtomicUsize::new(0)),
            max_queued_tokens,
        })
    }

    /// Queues `packed` in the lane `bulk` says; its rows come back on the receiver. None when
    /// the queue already holds `max_queued_tokens` (the caller answers 503: the server keeps
    /// serving what it took).
    pub fn submit(&self, packed: Packed, bulk: bool) -> Option<oneshot::Receiver<Answer>> {
        let (reply, answer) = oneshot::channel();
        self.queue(packed, Reply::Native(reply), bulk)
            .then_some(answer)
    }

    /// Queues `packed` for its sparse vectors, run alone in the lane `bulk` says; None when the
    /// queue is full.
    pub fn submit_sparse(
        &self,
        packed: Packed,
        bulk: bool,
    ) -> Option<oneshot::Receiver<SparseAnswer>> {
        let (reply, answer) = oneshot::channel();
        self.queue(packed, Reply::Sparse(reply), bulk)
            .then_some(answer)
    }

    /// Queues `packed` for `reply`; false when the queue is full or the engine thread has gone.
    /// Tokens queued and not yet taken into a batch.
    pub fn queued_tokens(&self) -> usize {
        self.queued_tokens.load(Ordering::Relaxed)
    }

    /// Tokens submitted and not yet answered: queued, in a batch, or waiting on its results.
    pub fn outstanding_tokens(&self) -> usize {
        self.outstanding_tokens.load(Ordering::Relaxed)
    }

    pub fn queue(&self, packed: Packed, reply: Reply, bulk: bool) -> bool {
        let tokens = packed.num_tokens();
        self.queue_tokens(packed, reply, tokens, bulk)
    }

    /// `queue` with the tokens counted given (a call's: its `packed` is empty).
    pub fn queue_tokens(&self, packed: Packed, reply: Reply, tokens: usize, bulk: bool) -> bool {
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
            bulk,
            outstanding: Outstanding::new(&self.outstanding_tokens, tokens),
        };
        self.queue.send(job).is_ok()
    }
}

/// Moves every job sent so far into its lane.
fn take_sent(jobs: &mpsc::Receiver<Job>, queues: &mut Queues) {
    while let Ok(job) = jobs.try_recv() {
        queues.push(job);
    }
}

/// What `build()` gives: (step, batch_tokens, batch_wait_seconds, sparse).
type Built = (Py<PyAny>, usize, f64, Option<Py<PyAny>>);

/// The engine's callables (`Tulip::start`).
struct Steps {
    step: Py<PyAny>,
    sparse: Option<Py<PyAny>>,
}

/// `f(*arrays)` of a batch's arrays, as bytearrays: NumPy's views of them are writable, as the
/// engine's arrays are.
fn call_with(py: Python<'_>, f: &Py<PyAny>, packed: &Packed) -> PyResult<Py<PyAny>> {
    let a = packed.arrays();
    let array = |bytes: &[u8]| PyByteArray::new(py, bytes);
    let arrays = (
        array(&a.input_ids),
        array(&a.seqlens),
        array(&a.cu_seqlens),
        array(&a.positions),
        array(&a.seq_ids),
        array(&a.token_type_ids),
    );
    f.call1(py, arrays)
}

/// A sparse request's job, run on the engine thread: its vectors sent back.
fn run_sparse(job: Job, sparse: Option<&Py<PyAny>>) {
    let Reply::Sparse(sender) = job.reply else {
        return;
    };
    let taken = Instant::now();
    let answer = Python::attach(|py| -> PyResult<SparseRows> {
        let Some(sparse) = sparse else {
            return Err(PyRuntimeError::new_err(
                "this engine gives no sparse vectors",
            ));
        };
        let out = call_with(py, sparse, &job.packed)?;
        let (offsets, indices, values) =
            out.extract::<(Bound<'_, PyBytes>, Bound<'_, PyBytes>, Bound<'_, PyBytes>)>(py)?;
        let (offsets, indices, values) =
            (offsets.as_bytes(), indices.as_bytes(), values.as_bytes());
        let ints = |bytes: &[u8]| -> Vec<i64> {
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect()
        };
        Ok(SparseRows {
            offsets: ints(offsets),
            indices: ints(indices),
            values: values
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
            queue: taken.saturating_duration_since(job.queued).as_secs_f64(),
            inference: taken.elapsed().as_secs_f64(),
        })
    });
    let _ = sender.send(answer.map_err(|e| e.to_string()));
}

/// How the engine thread cuts batches: tokens per batch, and the batch wait.
struct Batching {
    budget: usize,
    wait: BatchWait,
}

/// Moves the jobs sent into their lanes until the batch wait is over (`BatchWait`); false when
/// every sender has gone.
fn gather(
    jobs: &mpsc::Receiver<Job>,
    queues: &mut Queues,
    batching: &Batching,
    last: &LastStep,
) -> bool {
    let Some((until, requests)) = batching.wait.until(last) else {
        return true;
    };
    while queues.len() < requests && queues.tokens() < batching.budget {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match jobs.recv_timeout(left) {
            Ok(job) => queues.push(job),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
        }
    }
    true
}

fn engine_loop(
    jobs: mpsc::Receiver<Job>,
    mut queues: Queues,
    steps: Steps,
    batching: Batching,
    in_flight: mpsc::SyncSender<InFlight>,
    queued_tokens: Arc<AtomicUsize>,
    delivery: Delivery,
) {
    let budget = batching.budget;
    let mut last = LastStep {
        ended: Instant::now(),
        expected: 0,
    };
    loop {
        if queues.is_empty() {
            match jobs.recv() {
                Ok(job) => queues.push(job),
                Err(_) => return,
            }
            // NOTE: woken by the first job of a burst, the core is given up once before the
            // batch is cut, so that the threads sending the rest of it (on this core, when the
            // cores are busy) queue them first: one batch instead of a lone job's and then the
            // others' (null engine, one core, 64 connections: 24k -> 31k requests per core)
            thread::yield_now();
        }
        take_sent(&jobs, &mut queues);
        if !gather(&jobs, &mut queues, &batching, &last) {
            return;
        }
        let (mut batch, dropped) = queues.next_batch(budget);
        let tokens: usize = batch.iter().map(|job| job.tokens).sum();
        queued_tokens.fetch_sub(tokens + dropped, Ordering::Relaxed);
        if batch.is_empty() {
            continue;
        }
        if let [Job {
            reply: Reply::Call(work),
            ..
        }] = batch.as_slice()
        {
            Python::attach(|py| {
                if let Err(e) = work.call0(py) {
                    e.print(py); // its own failure to answer: said, the queue goes on
                }
            });
            continue;
        }
        if matches!(
            batch.as_slice(),
            [Job {
                reply: Reply::Sparse(_),
                ..
            }]
        ) {
            batch
                .pop()
                .into_iter()
                .for_each(|job| run_sparse(job, steps.sparse.as_ref()));
            continue;
        }
        let taken = Instant::now();
        let mut packed = Packed::new();
        for job in &batch {
            packed.extend(&job.packed);
        }
        let handle =
            Python::attach(|py| call_with(py, &steps.step, &packed).map_err(|e| e.to_string()));
        take_sent(&jobs, &mut queues);
        last = LastStep {
            ended: Instant::now(),
            expected: queues.len() + batch.len(),
        };
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
        if queues.is_empty() {
            // the next loop's recv ends it once senders are gone
            resolve(handle, batch, taken, &delivery);
            continue;
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

fn results_loop(in_flight: mpsc::Receiver<InFlight>, delivery: &Delivery) {
    for InFlight {
        handle,
        jobs,
        taken,
    } in in_flight
    {
        resolve(handle, jobs, taken, delivery);
    }
}

/// Waits for `handle` and answers each job with its rows, the GIL held throughout (a Python
/// job's callback needs it); Ivy's answers are sent after, as `delivery` says.
fn resolve(handle: Py<PyAny>, jobs: Vec<Job>, taken: Instant, delivery: &Delivery) {
    let mut native = Vec::with_capacity(jobs.len());
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
                    .for_each(|job| job.answer(py, Err(message.clone()), &mut native));
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
            job.answer(py, answer, &mut native);
            start = end;
        }
    });
    delivery.send(native);
}

fn fail(jobs: Vec<Job>, message: &str) {
    let mut native = Vec::new();
    Python::attach(|py| {
        jobs.into_iter()
            .for_each(|job| job.answer(py, Err(message.to_string()), &mut native));
    });
    Delivery(None).send(native);
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANES: Lanes = Lanes {
        bulk_every: 4,
        bulk_inputs: 16,
        bulk_tokens: 2048,
    };

    /// A job someone waits for (its receiver kept for the test's life).
    fn job(tokens: usize, bulk: bool) -> Job {
        let (reply, waiting) = oneshot::channel();
        std::mem::forget(waiting);
        Job {
            packed: Packed::new(),
            reply: Reply::Native(reply),
            queued: Instant::now(),
            tokens,
            bulk,
            outstanding: Outstanding::new(&Arc::new(AtomicUsize::new(0)), tokens),
        }
    }

    fn taken(queues: &mut Queues, budget: usize) -> Vec<(usize, bool)> {
        let (batch, _) = queues.next_batch(budget);
        batch.iter().map(|j| (j.tokens, j.bulk)).collect()
    }

    #[test]
    fn jobs_nobody_waits_for_are_dropped_and_take_no_budget() {
        let mut queues = Queues::new(Lanes::OFF);
        let (reply, gone) = oneshot::channel();
        drop(gone); // its client left, or its deadline passed
        let abandoned = Job {
            reply: Reply::Native(reply),
            ..job(900, false)
        };
        queues.push(job(100, false));
        queues.push(abandoned);
        queues.push(job(900, false));
        let (batch, dropped) = queues.next_batch(1000);
        let tokens: Vec<usize> = batch.iter().map(|j| j.tokens).collect();
        assert_eq!((tokens, dropped), (vec![100, 900], 900));
    }

    #[test]
    fn the_lane_rule_is_the_python_one() {
        assert!(!LANES.is_bulk(16, 2048));
        assert!(LANES.is_bulk(17, 10));
        assert!(LANES.is_bulk(1, 2049));
        assert!(!Lanes::OFF.is_bulk(1_000, 1 << 20));
    }

    #[test]
    fn interactive_work_goes_first_at_a_batch_boundary() {
        let mut queues = Queues::new(LANES);
        queues.push(job(90, true));
        queues.push(job(91, true));
        assert_eq!(taken(&mut queues, 100), vec![(90, true)]);
        queues.push(job(8, false)); // arrives behind bulk work: goes first
        assert_eq!(taken(&mut queues, 100), vec![(8, false)]);
        assert_eq!(taken(&mut queues, 100), vec![(91, true)]);
        assert!(queues.is_empty());
    }

    #[test]
    fn bulk_keeps_one_batch_in_bulk_every_under_a_constant_interactive_stream() {
        let mut queues = Queues::new(LANES);
        for _ in 0..10 {
            queues.push(job(90, true));
        }
        let mut lanes = Vec::new();
        for _ in 0..40 {
            queues.push(job(60, false));
            lanes.push(taken(&mut queues, 100)[0].1);
        }
        let mut expected = Vec::new();
        for _ in 0..10 {
            expected.extend([false, false, false, true]);
        }
        assert_eq!(lanes, expected);
    }

    #[test]
    fn each_lane_is_first_come_first_served_and_batches_fill_its_budget() {
        let mut queues = Queues::new(LANES);
        for i in 1..=6 {
            queues.push(job(i * 10, i % 2 == 0));
        }
        // interactive 10, 30, 50 under 100: 10 + 30 + 50 = 90
        assert_eq!(
            taken(&mut queues, 100),
            vec![(10, false), (30, false), (50, false)]
        );
        assert_eq!(taken(&mut queues, 100), vec![(20, true), (40, true)]);
        assert_eq!(taken(&mut queues, 100), vec![(60, true)]);
    }

    #[test]
    fn the_batch_wait_is_the_servers_rule() {
        let wait = BatchWait {
            wait: Duration::from_millis(3),
            max_requests: 4,
        };
        let ended = Instant::now();
        let last = |expected| LastStep { ended, expected };
        // as many as were expected (one alone: no wait at all), at most 4
        assert_eq!(
            wait.until(&last(1)),
            Some((ended + Duration::from_millis(3), 1))
        );
        assert_eq!(
            wait.until(&last(4)),
            Some((ended + Duration::from_millis(3), 4))
        );
        // more expected than 4: twice as long for 4
        assert_eq!(
            wait.until(&last(16)),
            Some((ended + Duration::from_millis(6), 4))
        );
        let none = BatchWait {
            wait: Duration::ZERO,
            max_requests: 4,
        };
        assert_eq!(none.until(&last(16)), None);
    }

    #[test]
    fn gathering_stops_at_the_requests_expected_or_a_batchs_tokens() {
        let batching = |budget| Batching {
            budget,
            wait: BatchWait {
                wait: Duration::from_secs(60),
                max_requests: 4,
            },
        };
        let last = LastStep {
            ended: Instant::now(),
            expected: 3,
        };
        let (send, jobs) = mpsc::channel();
        for _ in 0..5 {
            send.send(job(10, false)).unwrap();
        }
        let mut queues = Queues::new(LANES);
        assert!(gather(&jobs, &mut queues, &batching(1000), &last));
        assert_eq!(queues.len(), 3); // not a minute: the third arrived
        let mut queues = Queues::new(LANES);
        assert!(gather(&jobs, &mut queues, &batching(15), &last));
        assert_eq!(queues.len(), 2); // 20 tokens: over the budget
        drop(send);
        let mut queues = Queues::new(LANES);
        assert!(!gather(&jobs, &mut queues, &batching(1000), &last)); // senders gone
    }

    #[test]
    fn a_job_nobody_waits_for_is_abandoned() {
        let (reply, answer) = oneshot::channel::<Answer>();
        let reply = Reply::Native(reply);
        assert!(!reply.abandoned());
        drop(answer); // a deadline passed, or the client left
        assert!(reply.abandoned());
    }

    #[test]
    fn with_lanes_off_every_job_is_in_one_fcfs_queue() {
        let mut queues = Queues::new(Lanes::OFF);
        queues.push(job(90, true));
        queues.push(job(8, false));
        assert_eq!(taken(&mut queues, 100), vec![(90, true), (8, false)]);
    }
}

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

use crate::ivy::tokenize::Packed;

/// A request's rows (`.1` floats per sequence, in order), or why the engine failed it.
pub type Answer = Result<(Vec<f32>, usize), String>;

/// One request's sequences and where its answer goes.
pub struct Job {
    pub packed: Packed,
    pub reply: oneshot::Sender<Answer>,
}

struct InFlight {
    handle: Py<PyAny>,
    jobs: Vec<Job>,
}

/// The queue's sending end, shared by every connection.
pub struct Tulip {
    queue: mpsc::Sender<Job>,
    queued_tokens: Arc<AtomicUsize>,
    max_queued_tokens: usize,
}

impl Tulip {
    /// Starts the engine thread and the results thread around `step(ids, cu_seqlens) -> handle`
    /// (int32 bytes in; `handle.wait()` gives a float32 [sequences, width] buffer).
    pub fn start(step: Py<PyAny>, batch_tokens: usize, max_queued_tokens: usize) -> Self {
        let (queue, jobs) = mpsc::channel::<Job>();
        // one batch waiting on its results at most: the engine thread blocks on the next
        let (in_flight, to_resolve) = mpsc::sync_channel::<InFlight>(1);
        let queued_tokens = Arc::new(AtomicUsize::new(0));
        let counter = queued_tokens.clone();
        thread::Builder::new()
            .name("tulip-engine".into())
            .spawn(move || engine_loop(jobs, step, batch_tokens, in_flight, counter))
            .expect("the engine thread starts");
        thread::Builder::new()
            .name("tulip-results".into())
            .spawn(move || results_loop(to_resolve))
            .expect("the results thread starts");
        Tulip {
            queue,
            queued_tokens,
            max_queued_tokens,
        }
    }

    /// Queues `packed`; its rows come back on the receiver. None when the queue already holds
    /// `max_queued_tokens` (the caller answers 503: the server keeps serving what it took).
    pub fn submit(&self, packed: Packed) -> Option<oneshot::Receiver<Answer>> {
        let tokens = packed.num_tokens();
        let before = self.queued_tokens.fetch_add(tokens, Ordering::Relaxed);
        if before > 0 && before + tokens > self.max_queued_tokens {
            self.queued_tokens.fetch_sub(tokens, Ordering::Relaxed);
            return None;
        }
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Job { packed, reply }).is_err() {
            return None; // the engine thread has gone
        }
        Some(answer)
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
        let mut tokens = first.packed.num_tokens();
        let mut batch = vec![first];
        while let Ok(job) = jobs.try_recv() {
            if tokens + job.packed.num_tokens() > budget {
                held = Some(job);
                break;
            }
            tokens += job.packed.num_tokens();
            batch.push(job);
        }
        queued_tokens.fetch_sub(tokens, Ordering::Relaxed);
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
                    resolve(handle, batch);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    resolve(handle, batch);
                    return;
                }
            }
        }
        let batch = InFlight {
            handle,
            jobs: batch,
        };
        if in_flight.send(batch).is_err() {
            return;
        }
    }
}

fn results_loop(in_flight: mpsc::Receiver<InFlight>) {
    for InFlight { handle, jobs } in in_flight {
        resolve(handle, jobs);
    }
}

/// Waits for `handle` (the GIL held for the call) and answers each job with its rows.
fn resolve(handle: Py<PyAny>, jobs: Vec<Job>) {
    let rows = Python::attach(|py| -> PyResult<(Vec<f32>, usize)> {
        let array = handle.call_method0(py, "wait")?;
        let buffer = PyBuffer::<f32>::get(array.bind(py))?;
        let width = buffer.shape().get(1).copied().unwrap_or(0);
        Ok((buffer.to_vec(py)?, width))
    });
    match rows {
        Ok((rows, width)) => {
            let mut start = 0;
            for job in jobs {
                let end = start + job.packed.num_seqs() * width;
                let own = rows.get(start..end).map(|r| (r.to_vec(), width));
                let _ = job
                    .reply
                    .send(own.ok_or_else(|| "the engine answered too few rows".to_string()));
                start = end;
            }
        }
        Err(e) => fail(jobs, &e.to_string()),
    }
}

fn fail(jobs: Vec<Job>, message: &str) {
    for job in jobs {
        let _ = job.reply.send(Err(message.to_string()));
    }
}

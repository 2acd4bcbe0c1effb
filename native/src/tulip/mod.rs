//! Tulip: the first-come-first-served queue of packed requests, cut into batches under a token
//! budget, each handed to the Python engine's `step()` through pyo3 with the GIL held for that
//! call alone; a second thread resolves each batch's handle (the engine's `LazyTensor`) and
//! answers its requests. At most one batch waits to be resolved while the next is prepared, as
//! the engine's async results intend: under load batches grow instead of queueing calls.

mod engine;

pub use engine::{Answer, Job, Reply, Rows, Tulip};

//! Tulip: the queue of packed requests in two lanes (interactive first at every batch boundary,
//! bulk a minimum share: `Lanes`; each lane first come, first served), cut into batches under a
//! token budget, each handed to the Python engine's `step()` through pyo3 with the GIL held for that
//! call alone; a second thread resolves each batch's handle (the engine's `LazyTensor`) and
//! answers its requests. At most one batch waits to be resolved while the next is prepared, as
//! the engine's async results intend: under load batches grow instead of queueing calls.

mod engine;
mod packed;

pub use engine::{
    Answer, Delivery, Job, Lanes, Reply, Rows, SparseAnswer, SparseRows, Timed, Tulip,
};
pub use packed::{BatchArrays, Packed};

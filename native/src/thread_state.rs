//! One Python thread state for the life of each thread of ours that calls Python (Tulip's engine
//! and results threads, Ivy's workers when they hand a request over).
//!
//! NOTE: `Python::attach` on a thread that holds no thread state creates one and deletes it on
//! release, with its frame stack (an mmap and a munmap): on Tulip's engine thread, per batch,
//! ~8% of the request path's CPU with the null engine. With one kept, an attach only takes the GIL.

/// Gives this thread a Python thread state that it keeps, and leaves the GIL released. Never
/// given back: a thread that ends then touches no Python (taking the GIL to delete it could
/// meet the interpreter finalizing, which ends the thread under Rust's frames), and the
/// interpreter frees every thread state when it finalizes.
pub fn keep() {
    // SAFETY: the interpreter is initialized (our threads start from Python calls) and this
    // thread does not hold the GIL: PyGILState_Ensure creates the thread state and takes the GIL,
    // PyEval_SaveThread releases it. pyo3's later attaches find that state (PyGILState_Ensure
    // counts it; its release leaves it) and pyo3's own count is untouched (zero), as it was.
    unsafe {
        pyo3::ffi::PyGILState_Ensure();
        pyo3::ffi::PyEval_SaveThread();
    }
}

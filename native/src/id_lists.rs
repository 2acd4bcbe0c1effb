//! Token ids as Python lists of ints, each id's int object made once per process and shared, as
//! CPython shares the ints up to 256. The lists are built under the GIL, which none of the
//! tokenizer's threads can share: a thousand passages' 90,000 ids cost an allocation each
//! otherwise (2.7 of 7.3 ms on one Zen 3 core), and a reference each this way.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

/// Ids below this share an int: the largest vocabulary served, Gemma 3's 262,144 tokens, at
/// 32 bytes an int (8 MiB at most, grown to the largest id seen). Others get an int each.
const SHARED_IDS: usize = 1 << 18;

// Ids' ints, index = id. Read and grown with the GIL held (no Python runs meanwhile that could
// come back here), so the lock is never contended; never dropped, as CPython's own are not.
static INTS: Mutex<Vec<Py<PyInt>>> = Mutex::new(Vec::new());

/// `[[int, ...], ...]`: each of `all` as a list of its ids.
pub fn id_lists<'py>(py: Python<'py>, all: &[Vec<u32>]) -> PyResult<Bound<'py, PyList>> {
    let mut ints = INTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let top = all.iter().flatten().max().map_or(0, |&id| id as usize + 1);
    for id in ints.len()..top.min(SHARED_IDS) {
        ints.push(PyInt::new(py, id).unbind());
    }
    let lists = all
        .iter()
        .map(|ids| {
            PyList::new(
                py,
                ids.iter().map(|&id| match ints.get(id as usize) {
                    Some(int) => int.bind(py).clone(),
                    None => PyInt::new(py, id),
                }),
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, lists)
}

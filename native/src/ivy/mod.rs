//! Ivy: the HTTP front (hyper), JSON (serde), tokenization (the `tokenizers` crate) and the
//! hand-off of packed ids to Tulip; no Python on this path.

pub mod api;
pub mod http;
pub mod tokenize;
pub mod wordpiece;

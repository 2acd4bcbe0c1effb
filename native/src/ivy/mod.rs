//! Ivy: the HTTP front (hyper), JSON (serde), tokenization (the `tokenizers` crate), the
//! hand-off of packed ids to Tulip, and the hand-over of every request it does not answer to the
//! Python front in the same process; no Python on the path of a request answered here.

pub mod admission;
pub mod api;
pub mod connections;
pub mod fallback;
pub mod front;
pub mod http;
pub mod pairs;
pub mod routes;
pub mod scoring;
pub mod stats;
pub mod tokenize;
pub mod traces;
pub mod wordpiece;

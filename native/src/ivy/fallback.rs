//! The hand-over of a request Ivy does not answer itself to the Python front in this process
//! (`embedserve.gateway.native_front`: the gateway's ASGI app on its event loop's thread), which
//! owns the long tail's routes and every rule's refusal. Ivy answers the common shape of a hot
//! route natively and hands over everything else, errors included: each rule and each error
//! message is written once, in Python, and the native path only decides that a request is one
//! it may answer.
//!
//! The Python side is a callable `front(method, target, headers, reply, expired) -> sink`
//! (`expired`: the request's deadline passed while Ivy waited on its answer, so the front's
//! calls have no time left and it answers that error without running it again): the body
//! follows as `sink.feed(chunk, more)` calls while it arrives (the app's own size and time bounds
//! read it), `sink.gone()` says the client left before its answer, and the app answers once
//! through `reply.send(status, headers, body)`.

use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::http::request::Parts;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::oneshot;

/// What the Python front answered.
pub struct Answered {
    pub status: u16,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Where the Python front sends one request's answer (once).
#[pyclass(frozen, module = "embedserve._native")]
pub struct Reply {
    sender: Mutex<Option<oneshot::Sender<Answered>>>,
}

#[pymethods]
impl Reply {
    /// The answer; a second call, or one after the client left, does nothing.
    fn send(&self, status: u16, headers: Vec<(Vec<u8>, Vec<u8>)>, body: &[u8]) {
        let taken = self.sender.lock().ok().and_then(|mut s| s.take());
        if let Some(sender) = taken {
            let _ = sender.send(Answered {
                status,
                headers,
                body: body.to_vec(),
            });
        }
    }
}

/// The request's body on the Python side; told the client left unless the answer came first.
struct Sink {
    sink: Py<PyAny>,
    /// answered, or told the client left: nothing more to say
    closed: bool,
}

impl Sink {
    fn feed(&self, chunk: &[u8], more: bool) {
        Python::attach(|py| {
            if let Err(e) = self
                .sink
                .call_method1(py, "feed", (PyBytes::new(py, chunk), more))
            {
                e.print(py);
            }
        });
    }

    /// The client left before its answer: said once.
    fn gone(&mut self) {
        if !std::mem::replace(&mut self.closed, true) {
            Python::attach(|py| {
                if let Err(e) = self.sink.call_method0(py, "gone") {
                    e.print(py);
                }
            });
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.gone();
    }
}

/// Hands the request (`parts`, the body's first bytes already read, then what is left of it,
/// whether its deadline passed here) to the Python `front` and waits for its answer; an error
/// when the front could not take it.
pub async fn hand_over(
    front: &Py<PyAny>,
    parts: &Parts,
    read: Bytes,
    rest: Option<Incoming>,
    expired: bool,
) -> Result<Answered, String> {
    let (sender, mut answered) = oneshot::channel();
    let reply = Reply {
        sender: Mutex::new(Some(sender)),
    };
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let sink = Python::attach(|py| -> PyResult<Py<PyAny>> {
        let headers: Vec<(Bound<'_, PyBytes>, Bound<'_, PyBytes>)> = parts
            .headers
            .iter()
            .map(|(name, value)| {
                (
                    PyBytes::new(py, name.as_str().as_bytes()),
                    PyBytes::new(py, value.as_bytes()),
                )
            })
            .collect();
        front.call1(py, (parts.method.as_str(), target, headers, reply, expired))
    })
    .map_err(|e| e.to_string())?;
    let mut sink = Sink {
        sink,
        closed: false,
    };
    sink.feed(&read, rest.is_some());
    if let Some(mut body) = rest {
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if !data.is_empty() {
                                sink.feed(&data, true);
                            }
                        }
                    }
                    Some(Err(_)) => {
                        sink.gone(); // the client broke off its body
                        break;
                    }
                    None => {
                        sink.feed(b"", false);
                        break;
                    }
                },
                result = &mut answered => {
                    sink.closed = true;
                    return result.map_err(|_| "the Python front dropped the request".into());
                }
            }
        }
    }
    let result = (&mut answered).await;
    sink.closed = true;
    result.map_err(|_| "the Python front dropped the request".into())
}

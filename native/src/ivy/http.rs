//! The HTTP front: every request is read here (connection, header and body bounds, admission);
//! a request to a route answered natively (`routes`) is answered there, and every other
//! request, or one that route may not answer, is handed over to the Python front in this
//! process (`fallback`).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::fallback::{hand_over, Answered};
use super::front::{Bounds, Front};
use super::routes::{Body, Here, Unanswered};

struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn route(
    front: Arc<Front>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let _counted = Counted::new(&front.in_flight);
    let start = Instant::now();
    let (parts, body) = request.into_parts();
    let route = Here::of(parts.uri.path(), &front);
    let open = parts.method == Method::POST
        && !front.draining.load(Ordering::Relaxed)
        && front
            .admission
            .read()
            .is_ok_and(|a| a.admits(&parts.headers));
    let (true, Some(route)) = (open, route) else {
        return Ok(handed(&front, &parts, Bytes::new(), Some(body), false).await);
    };
    match read_whole(&front.bounds, &parts, body).await {
        Ok(bytes) => match route.answer(&front, &parts, &bytes, start).await {
            Ok(reply) => Ok(reply),
            Err(why) => {
                let expired = why == Unanswered::Expired;
                Ok(handed(&front, &parts, bytes, None, expired).await)
            }
        },
        Err((read, rest)) => Ok(handed(&front, &parts, read, rest, false).await),
    }
}

/// The body when its declared length is within the bound and it arrives in time; else what was
/// read and the rest, for the Python front's reading (its answer: 413, 408, ...).
async fn read_whole(
    bounds: &Bounds,
    parts: &Parts,
    mut body: Incoming,
) -> Result<Bytes, (Bytes, Option<Incoming>)> {
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let Some(length) = declared.filter(|&n| n <= bounds.max_body_bytes) else {
        return Err((Bytes::new(), Some(body)));
    };
    let deadline = tokio::time::Instant::now() + bounds.body_timeout;
    let mut read = BytesMut::with_capacity(length);
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Ok(None) if read.len() == length => return Ok(read.freeze()),
            Ok(None) | Ok(Some(Err(_))) => return Err((read.freeze(), None)),
            Err(_) => return Err((read.freeze(), Some(body))), // slow: the front's timeout
        }
    }
}

/// The Python front's answer to the request (`expired`: its deadline passed here).
async fn handed(
    front: &Front,
    parts: &Parts,
    read: Bytes,
    rest: Option<Incoming>,
    expired: bool,
) -> Response<Body> {
    match hand_over(&front.python, parts, read, rest, expired).await {
        Ok(Answered {
            status,
            headers,
            body,
        }) => {
            let mut reply = Response::new(Full::new(Bytes::from(body)));
            *reply.status_mut() =
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            for (name, value) in headers {
                let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(&name),
                    HeaderValue::from_bytes(&value),
                ) else {
                    continue;
                };
                // hyper writes the framing of the body it sends
                if name != CONTENT_LENGTH && name != "transfer-encoding" && name != "connection" {
                    reply.headers_mut().append(name, value);
                }
            }
            reply
        }
        Err(message) => {
            eprintln!("embedserve native: the Python front did not answer: {message}");
            let mut reply = Response::new(Full::new(Bytes::from_static(
                b"{\"error\":{\"message\":\"internal error in the gateway\",\"type\":\"server_error\",\"param\":null,\"code\":\"server_error\"}}",
            )));
            *reply.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            reply
        }
    }
}

/// Serves `front` on `listener` until `stop` turns true; each connection on a task of its own,
/// at most `max_connections` at once (the others wait in the kernel's backlog).
pub async fn serve(front: Arc<Front>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(front.bounds.max_connections.max(1)));
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // EMFILE and the like: said, then accept again after a pause
                    eprintln!("embedserve native: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let front = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let bounds = &front.bounds;
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout)
                .max_buf_size(bounds.max_header_bytes.max(8192))
                .max_headers(bounds.max_headers);
            let service = service_fn(|request| route(front.clone(), request));
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

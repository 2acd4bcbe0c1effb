//! The HTTP front: every request is read here (connection, header and body bounds, admission);
//! a request to a route answered natively (`routes`) is answered there, and every other
//! request, or one that route may not answer, is handed over to the Python front in this
//! process (`fallback`).

use std::convert::Infallible;
use std::io::Write;
use std::os::fd::AsFd;
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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::connections::{too_slow, Conns, Late, Slot, Watched};
use super::fallback::{hand_over, Answered};
use super::front::{Bounds, Front};
use super::routes::{Answer, Body, Here, Unanswered};
use super::traces::TRACE;

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
        Ok(bytes) => match answer(&front, route, &parts, &bytes, start).await {
            Ok(reply) => Ok(reply),
            Err(why) => {
                let expired = why == Unanswered::Expired;
                Ok(handed(&front, &parts, bytes, None, expired).await)
            }
        },
        Err((read, rest)) => Ok(handed(&front, &parts, read, rest, false).await),
    }
}

/// `route`'s answer, its spans recorded when it is answered here and traced (`traces`).
async fn answer(front: &Front, route: Here, parts: &Parts, body: &[u8], start: Instant) -> Answer {
    let Some(traces) = &front.traces else {
        return route.answer(front, parts, body, start).await;
    };
    let trace = Arc::new(traces.begin(parts, route.path(), front.request_id(parts)));
    let answer = TRACE
        .scope(trace.clone(), route.answer(front, parts, body, start))
        .await;
    if let Ok(reply) = &answer {
        traces.finish(&trace, reply.status().as_u16());
    }
    answer
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
/// at most `max_connections` open (`connections`: the oldest idle one makes room, else the
/// newcomer gets a 503).
pub async fn serve(front: Arc<Front>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    let conns = Arc::new(Conns::new(front.bounds.max_connections));
    loop {
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
        let Some(slot) = conns.admit() else {
            // a fresh socket's buffer takes the refusal whole; then it is closed
            let _ = stream.try_write(&conns.full());
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(front.clone(), stream, slot));
    }
}

/// One connection served until it closes, is evicted, or its headers are late (a 408, or a
/// new connection that sent nothing closed).
async fn connection(front: Arc<Front>, stream: TcpStream, slot: Slot) {
    let (conn, accepted) = (slot.conn.clone(), Instant::now());
    let bounds = &front.bounds;
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(None) // `Conn::deadline` times headers
        .max_buf_size(bounds.max_header_bytes.max(8192))
        .max_headers(bounds.max_headers);
    // the socket once more: the 408 is written after hyper's connection is dropped
    let after: Option<std::net::TcpStream> =
        stream.as_fd().try_clone_to_owned().ok().map(Into::into);
    let service = service_fn(|request| {
        let (front, conn) = (front.clone(), conn.clone());
        async move {
            conn.busy();
            let answer = route(front, request).await;
            conn.answered();
            answer
        }
    });
    let watched = Watched {
        stream,
        conn: conn.clone(),
    };
    let serving = http.serve_connection(TokioIo::new(watched), service);
    tokio::pin!(serving);
    loop {
        let deadline = conn.deadline(accepted, bounds.header_timeout);
        let late = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut serving => return,
            _ = conn.evicted() => return,
            _ = conn.woken() => {}
            _ = late => match conn.late(accepted, bounds.header_timeout) {
                Late::No => {}
                Late::Silent => return,
                Late::Headers => {
                    if let Some(mut after) = after {
                        let _ = after.write(&too_slow(bounds.header_timeout.as_secs_f64()));
                    }
                    return;
                }
            },
        }
    }
}

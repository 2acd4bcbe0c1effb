use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::api::{self, ApiError, EncodingFormat};
use super::tokenize::{Packed, TextTokenizer, TokenizeError};
use crate::tulip::Tulip;

/// What every connection shares: the model's name and tokenizer, the queue, the bounds.
pub struct Front {
    pub model: String,
    pub tokenizer: TextTokenizer,
    pub tulip: Tulip,
    pub max_body_bytes: usize,
    pub max_inputs: usize,
    /// a request's tokens per part (`Packed::split`): the engine's batch budget
    pub part_tokens: usize,
    /// rows leave as unit vectors (the folder ends in a Normalize module)
    pub normalize: bool,
}

type Body = Full<Bytes>;

fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        CONTENT_TYPE,
        "application/json".parse().expect("a valid header"),
    );
    reply
}

fn error(e: ApiError) -> Response<Body> {
    json(
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        e.body(),
    )
}

async fn route(
    front: Arc<Front>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let reply = match (request.method(), request.uri().path()) {
        (&Method::GET, "/health") => json(StatusCode::OK, b"{\"status\":\"ok\"}".to_vec()),
        (&Method::POST, "/v1/embeddings") => embeddings(&front, request).await,
        (_, "/health" | "/v1/embeddings") => error(ApiError {
            status: 405,
            kind: "invalid_request_error",
            code: "method_not_allowed",
            param: None,
            message: format!("{} is not allowed here", request.method()),
        }),
        (_, path) => error(ApiError {
            status: 404,
            kind: "invalid_request_error",
            code: "not_found",
            param: None,
            message: format!("no route {path}"),
        }),
    };
    Ok(reply)
}

async fn embeddings(front: &Front, request: Request<Incoming>) -> Response<Body> {
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || ApiError {
        status: 413,
        kind: "invalid_request_error",
        code: "body_too_large",
        param: None,
        message: format!("the body is over {} bytes", front.max_body_bytes),
    };
    if declared.is_some_and(|n| n > front.max_body_bytes) {
        return error(too_large()); // refused before a byte of it is read
    }
    let body = match Limited::new(request.into_body(), front.max_body_bytes)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => return error(too_large()),
    };
    let parsed = match api::parse(&body) {
        Ok(parsed) => parsed,
        Err(e) => return error(e),
    };
    let texts = parsed.texts();
    if texts.len() > front.max_inputs {
        return error(ApiError::invalid(
            "too_many_inputs",
            Some("input"),
            format!(
                "{} inputs, over the limit of {}",
                texts.len(),
                front.max_inputs
            ),
        ));
    }
    let packed = match front.tokenizer.pack(texts) {
        Ok(packed) => packed,
        Err(e @ TokenizeError::TooLong { .. }) => {
            return error(ApiError::invalid(
                "input_too_long",
                Some("input"),
                e.to_string(),
            ))
        }
        Err(e) => {
            return error(ApiError::invalid(
                "untokenizable",
                Some("input"),
                e.to_string(),
            ))
        }
    };
    let tokens = packed.num_tokens();
    let rows = match embed(front, packed).await {
        Ok(rows) => rows,
        Err(e) => return error(e),
    };
    let (mut rows, width) = rows;
    if front.normalize {
        api::normalize(&mut rows, width);
    }
    let base64 = matches!(parsed.encoding_format, Some(EncodingFormat::Base64));
    let model = parsed.model.as_deref().unwrap_or(&front.model);
    json(
        StatusCode::OK,
        api::answer(&rows, width, model, tokens, base64),
    )
}

/// The rows of `packed`'s sequences, in order: its parts queued at once, answered in turn.
async fn embed(front: &Front, packed: Packed) -> Result<(Vec<f32>, usize), ApiError> {
    let overloaded = || ApiError {
        status: 503,
        kind: "server_error",
        code: "overloaded",
        param: None,
        message: "the queue is full: retry after a moment".into(),
    };
    let parts = packed.split(front.part_tokens);
    let mut answers = Vec::with_capacity(parts.len());
    for part in parts {
        answers.push(front.tulip.submit(part).ok_or_else(overloaded)?);
    }
    let (mut rows, mut width) = (Vec::new(), 0);
    for answer in answers {
        match answer.await {
            Ok(Ok((part, w))) => {
                rows.extend_from_slice(&part);
                width = w;
            }
            Ok(Err(message)) => {
                eprintln!("embedserve native: a batch failed: {message}");
                return Err(ApiError {
                    status: 500,
                    kind: "server_error",
                    code: "engine_failed",
                    param: None,
                    message: "the engine failed this request's batch".into(),
                });
            }
            Err(_) => {
                return Err(ApiError {
                    status: 503,
                    kind: "server_error",
                    code: "stopping",
                    param: None,
                    message: "the server is stopping".into(),
                })
            }
        }
    }
    Ok((rows, width))
}

/// Serves `front` on `listener` until `stop` turns true; each connection on a task of its own.
pub async fn serve(front: Arc<Front>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // EMFILE and the like: said, then accept again after a pause
                    eprintln!("embedserve native: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let front = front.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| route(front.clone(), request));
            let _ = http1::Builder::new()
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

//! The floor under Ivy's short requests (benchmarks/studies/http_floor.py): the same hyper
//! HTTP/1 server, runtime (tokio, one worker thread) and socket options as `ivy/http.rs`, each
//! request's body read whole and answered with a fixed body of `ANSWER` bytes (a short query's
//! OpenAI answer: 384 floats) and no other work: no JSON, tokenization, queue or engine.
//!
//!     cargo run --release -- PORT [ANSWER_BYTES]

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(18700);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4743);
    let answer = Bytes::from(vec![b'1'; size]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        println!("http-floor: listening on {port}, answers of {size} bytes");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move {
                        let _body = request.into_body().collect().await;
                        let response = Response::builder()
                            .header("content-type", "application/json")
                            // Ivy's other headers: a request id and TEI's four timings
                            .header("x-request-id", "9ca234606fc74ce98d700b01ca0378e9")
                            .header("x-total-time", "0")
                            .header("x-tokenization-time", "0")
                            .header("x-queue-time", "0")
                            .header("x-inference-time", "0")
                            .body(Full::new(answer))
                            .expect("a response");
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

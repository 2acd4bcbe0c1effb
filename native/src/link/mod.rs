//! Link: the contract's client side in Rust, for a model whose engines are server processes of
//! their own (`serve` with several engines per model, `embedserve gateway`): each part of a
//! request answered here goes to the replica with the fewest tokens outstanding, over its unix
//! socket on this host (`contract/local.py`), else over gRPC (`grpc.rs`), one retry elsewhere; a replica that cannot be reached, or whose
//! engine keeps failing, is passed over for a while (the Python pool's rules,
//! `gateway/replicas.py`, their numbers passed in). A part that still fails is the Python
//! front's, whose pool answers it or says why not.

mod grpc;
mod socket;
pub mod wire;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::tulip::{Answer, Packed, SparseAnswer};
use grpc::Remote;
use socket::{Failure, Socket, UNAVAILABLE};
use wire::Asked;

/// gRPC codes after which another replica may well succeed (`replicas.RETRYABLE`).
const RETRYABLE: [u8; 5] = [1, 2, 8, 13, 14];
/// gRPC codes of an engine that failed the work itself (`replicas.ENGINE_FAILURES`).
const ENGINE_FAILURES: [u8; 2] = [2, 13];

/// When a replica is passed over (`replicas.FAILING_AFTER`, `AVOID_SECONDS`); a replica that
/// could not be reached is passed over for `unreachable` (the Python pool's health interval).
#[derive(Clone, Copy)]
pub struct Avoid {
    pub failing_after: usize,
    pub engine_failing: Duration,
    pub unreachable: Duration,
}

/// How a replica is reached.
enum Transport {
    /// a server on this host, by its unix socket
    Socket(Socket),
    /// a server at `HOST:PORT`, by gRPC
    Remote(Remote),
}

impl Transport {
    async fn call(&self, request: &[u8]) -> Result<Vec<u8>, Failure> {
        match self {
            Transport::Socket(socket) => socket.call(request).await,
            Transport::Remote(remote) => remote.call(request).await,
        }
    }
}

/// How a model's replicas are called: when one is passed over, and the link secret sent to
/// those called by gRPC (None: no secret).
pub struct Linking {
    pub avoid: Avoid,
    pub secret: Option<String>,
}

/// One replica: how it is reached, its outstanding tokens, and until when it is passed over.
struct Replica {
    transport: Transport,
    sent_tokens: AtomicUsize,
    engine_failures: AtomicUsize,
    avoid_until: Mutex<Option<Instant>>,
}

/// Tokens counted outstanding on a replica while a call to it is alive.
struct Sent<'a>(&'a AtomicUsize, usize);

impl<'a> Sent<'a> {
    fn new(count: &'a AtomicUsize, tokens: usize) -> Self {
        count.fetch_add(tokens, Ordering::Relaxed);
        Sent(count, tokens)
    }
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// A model's replicas.
pub struct Links {
    replicas: Vec<Replica>,
    avoid: Avoid,
}

impl Links {
    /// Each replica named: an absolute path is a unix socket, anything else `HOST:PORT`
    /// (called by gRPC).
    pub fn new(replicas: &[String], linking: &Linking) -> Result<Self, String> {
        let replicas = replicas
            .iter()
            .map(|named| {
                let transport = if named.starts_with('/') {
                    Transport::Socket(Socket::new(PathBuf::from(named)))
                } else {
                    Transport::Remote(Remote::new(named, linking.secret.as_deref())?)
                };
                Ok(Replica {
                    transport,
                    sent_tokens: AtomicUsize::new(0),
                    engine_failures: AtomicUsize::new(0),
                    avoid_until: Mutex::new(None),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Links {
            replicas,
            avoid: linking.avoid,
        })
    }

    /// Tokens sent to each replica and not yet answered, in order.
    pub fn sent_tokens(&self) -> Vec<usize> {
        self.replicas
            .iter()
            .map(|r| r.sent_tokens.load(Ordering::Relaxed))
            .collect()
    }

    /// The replica to call: not passed over, then the fewest tokens outstanding (the first of
    /// equals); one passed over only when every other is.
    fn choose(&self, exclude: Option<usize>) -> Option<usize> {
        let now = Instant::now();
        let key = |r: &Replica| {
            let avoided = r
                .avoid_until
                .lock()
                .map(|until| until.is_some_and(|t| t > now))
                .unwrap_or(false);
            (avoided, r.sent_tokens.load(Ordering::Relaxed))
        };
        (0..self.replicas.len())
            .filter(|&i| Some(i) != exclude)
            .min_by_key(|&i| key(&self.replicas[i]))
    }

    /// One replica's answer to `request`, its tokens counted outstanding meanwhile and its
    /// failures kept.
    async fn call_one(&self, i: usize, request: &[u8], tokens: usize) -> Result<Vec<u8>, Failure> {
        let replica = &self.replicas[i];
        // given back however the call ends: answered, failed, or dropped by a caller that
        // stopped waiting (a deadline, a client gone)
        let sent = Sent::new(&replica.sent_tokens, tokens);
        let answer = replica.transport.call(request).await;
        drop(sent);
        let avoid = match &answer {
            Ok(_) => {
                replica.engine_failures.store(0, Ordering::Relaxed);
                Some(None)
            }
            Err(f) if f.code == UNAVAILABLE => Some(Some(self.avoid.unreachable)),
            Err(f) if ENGINE_FAILURES.contains(&f.code) => {
                let failures = replica.engine_failures.fetch_add(1, Ordering::Relaxed) + 1;
                (failures >= self.avoid.failing_after).then_some(Some(self.avoid.engine_failing))
            }
            Err(_) => None,
        };
        if let (Some(avoid), Ok(mut until)) = (avoid, replica.avoid_until.lock()) {
            *until = avoid.map(|d| Instant::now() + d);
        }
        answer
    }

    /// The answer to `request` (`tokens` real tokens) from the replica chosen, or, where it
    /// failed in a way another may not, from another; else why not.
    async fn call(&self, request: Vec<u8>, tokens: usize) -> Result<Vec<u8>, String> {
        let first = self.choose(None).ok_or("no replica")?;
        match self.call_one(first, &request, tokens).await {
            Ok(answer) => Ok(answer),
            Err(failure) => match self.choose(Some(first)) {
                Some(other) if RETRYABLE.contains(&failure.code) => self
                    .call_one(other, &request, tokens)
                    .await
                    .map_err(|f| f.message),
                _ => Err(failure.message),
            },
        }
    }

    /// Sends `packed` for its pooled rows in the lane `bulk` says; the rows come back on the
    /// receiver. Dropping it (a deadline passed, the client gone) cancels the call.
    pub fn submit(self: &Arc<Self>, packed: Packed, bulk: bool) -> oneshot::Receiver<Answer> {
        self.send(packed, bulk, Asked::Rows, wire::rows)
    }

    /// `submit` for the part's sparse vectors.
    pub fn submit_sparse(
        self: &Arc<Self>,
        packed: Packed,
        bulk: bool,
    ) -> oneshot::Receiver<SparseAnswer> {
        self.send(packed, bulk, Asked::Sparse, wire::sparse_rows)
    }

    fn send<R: Send + 'static>(
        self: &Arc<Self>,
        packed: Packed,
        bulk: bool,
        asked: Asked,
        read: fn(&[u8], usize) -> Result<R, String>,
    ) -> oneshot::Receiver<Result<R, String>> {
        let (mut reply, answer) = oneshot::channel();
        let links = self.clone();
        tokio::spawn(async move {
            let request = wire::request(&packed, asked, bulk, "");
            let seqs = packed.num_seqs();
            tokio::select! {
                answered = links.call(request, packed.num_tokens()) => {
                    let _ = reply.send(answered.and_then(|payload| read(&payload, seqs)));
                }
                // nobody waits any more: the call is dropped, which cancels it
                () = reply.closed() => {}
            }
        });
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call dropped before its answer (its caller stopped waiting) gives its tokens back.
    #[tokio::test]
    async fn a_dropped_call_gives_its_tokens_back() {
        let folder = std::env::temp_dir().join(format!("links-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&folder);
        let path = folder.join("silent.sock");
        let _ = std::fs::remove_file(&path);
        // a server that takes the connection and never answers
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(stream);
        });
        let linking = Linking {
            avoid: Avoid {
                failing_after: 3,
                engine_failing: Duration::from_secs(10),
                unreachable: Duration::from_secs(1),
            },
            secret: None,
        };
        let links = Links::new(&[path.to_string_lossy().into_owned()], &linking).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), links.call(vec![1, 2], 7));
        assert!(waited.await.is_err());
        assert_eq!(links.sent_tokens(), [0]);
        server.abort();
        let _ = std::fs::remove_file(&path);
    }
}

//! One replica's unix socket (`contract/local.py`'s framing): calls multiplexed on one
//! connection, made when the first call needs it and again after it closes; each call's answer
//! taken by the reading task as its frame arrives, in any order; a call its caller stopped
//! waiting for (a deadline, a client gone) cancelled on the server.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// Frames both ways: `<IIB` (payload bytes, call id, kind) and the payload. Kinds sent: EMBED,
/// CANCEL; kinds answered: the call's gRPC status code (0: OK, the serialized answer).
const HEADER: usize = 9;
const EMBED: u8 = 0;
const CANCEL: u8 = 1;
/// gRPC's UNAVAILABLE: the socket could not be reached, or closed with the call outstanding
pub const UNAVAILABLE: u8 = 14;
/// the largest answer read (the Python side's `grpc.max_receive_message_length`)
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// A call that was not answered OK: its gRPC status code and details.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

fn frame(call: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&call.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// The calls waiting on an answer: its kind (status) and payload.
type Calls = HashMap<u32, oneshot::Sender<(u8, Vec<u8>)>>;
type Waiting = Mutex<Calls>;

/// An open connection: frames to write, and the calls waiting on an answer.
struct Connection {
    writes: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Arc<Waiting>,
    open: Arc<AtomicBool>,
    next_call: AtomicU32,
}

/// One replica's socket.
pub struct Socket {
    pub path: PathBuf,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

impl Socket {
    pub fn new(path: PathBuf) -> Self {
        Socket {
            path,
            connection: tokio::sync::Mutex::new(None),
        }
    }

    /// The serialized answer to the serialized `request`, or why not.
    pub async fn call(&self, request: &[u8]) -> Result<Vec<u8>, Failure> {
        let connection = self.connected().await?;
        let call = connection.next_call.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        lock(&connection.waiting).insert(call, answer);
        let mut pending = Pending {
            connection: &connection,
            call,
            answered: false,
        };
        // NOTE: after the insert: a reading task that ended before it cleared no sender of ours
        if !connection.open.load(Ordering::SeqCst) {
            return Err(self.closed());
        }
        if connection.writes.send(frame(call, EMBED, request)).is_err() {
            return Err(self.closed());
        }
        let result = answered.await;
        pending.answered = true;
        match result {
            Ok((0, payload)) => Ok(payload),
            Ok((code, details)) => Err(Failure {
                code,
                message: String::from_utf8_lossy(&details).into_owned(),
            }),
            Err(_) => Err(self.closed()),
        }
    }

    fn closed(&self) -> Failure {
        Failure {
            code: UNAVAILABLE,
            message: format!("{}: connection closed", self.path.display()),
        }
    }

    /// The open connection, made now if there is none.
    async fn connected(&self) -> Result<Arc<Connection>, Failure> {
        let mut held = self.connection.lock().await;
        if let Some(connection) = held.as_ref() {
            if connection.open.load(Ordering::SeqCst) {
                return Ok(connection.clone());
            }
        }
        let stream = UnixStream::connect(&self.path).await.map_err(|e| Failure {
            code: UNAVAILABLE,
            message: format!("{}: {e}", self.path.display()),
        })?;
        let (reads, writes) = stream.into_split();
        let (sender, frames) = mpsc::unbounded_channel();
        let connection = Arc::new(Connection {
            writes: sender,
            waiting: Arc::new(Mutex::new(HashMap::new())),
            open: Arc::new(AtomicBool::new(true)),
            next_call: AtomicU32::new(1),
        });
        tokio::spawn(write_frames(writes, frames, connection.open.clone()));
        tokio::spawn(read_answers(
            reads,
            connection.waiting.clone(),
            connection.open.clone(),
        ));
        *held = Some(connection.clone());
        Ok(connection)
    }
}

fn lock(waiting: &Waiting) -> std::sync::MutexGuard<'_, Calls> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// A call in flight: dropped before its answer came (its caller stopped waiting), it is
/// forgotten here and cancelled on the server.
struct Pending<'a> {
    connection: &'a Connection,
    call: u32,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        lock(&self.connection.waiting).remove(&self.call);
        if self.connection.open.load(Ordering::Relaxed) {
            let _ = self.connection.writes.send(frame(self.call, CANCEL, &[]));
        }
    }
}

/// Writes frames as they come, those queued meanwhile in one write; ends when the connection
/// fails or every sender is gone.
async fn write_frames(
    mut writes: OwnedWriteHalf,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    open: Arc<AtomicBool>,
) {
    while let Some(mut out) = frames.recv().await {
        while let Ok(more) = frames.try_recv() {
            out.extend_from_slice(&more);
        }
        if writes.write_all(&out).await.is_err() {
            break;
        }
    }
    open.store(false, Ordering::Relaxed);
}

/// Hands each answer frame to its call; when the connection ends, every call still waiting
/// fails (its sender dropped: UNAVAILABLE) and the next call connects again.
async fn read_answers(mut reads: OwnedReadHalf, waiting: Arc<Waiting>, open: Arc<AtomicBool>) {
    let mut header = [0u8; HEADER];
    loop {
        if reads.read_exact(&mut header).await.is_err() {
            break;
        }
        let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let call = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if length > MAX_ANSWER_BYTES {
            break;
        }
        let mut payload = vec![0u8; length];
        if reads.read_exact(&mut payload).await.is_err() {
            break;
        }
        if let Some(answer) = lock(&waiting).remove(&call) {
            let _ = answer.send((header[8], payload));
        }
    }
    open.store(false, Ordering::SeqCst);
    lock(&waiting).clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A server that answers each EMBED frame with its payload reversed (status 0), or with
    /// status 8 when the payload is "full", and remembers the CANCEL frames it got.
    async fn echo(listener: UnixListener, cancels: Arc<Mutex<Vec<u32>>>) {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut header = [0u8; HEADER];
        while stream.read_exact(&mut header).await.is_ok() {
            let length = u32::from_le_bytes(header[0..4].try_into().unwrap()) as usize;
            let call = u32::from_le_bytes(header[4..8].try_into().unwrap());
            let mut payload = vec![0u8; length];
            stream.read_exact(&mut payload).await.unwrap();
            if header[8] == CANCEL {
                cancels.lock().unwrap().push(call);
                continue;
            }
            if payload == b"wait" {
                continue; // never answered
            }
            let (kind, answer) = if payload == b"full" {
                (8, b"queue full".to_vec())
            } else {
                (0, payload.iter().rev().copied().collect())
            };
            stream.write_all(&frame(call, kind, &answer)).await.unwrap();
        }
    }

    #[tokio::test]
    async fn calls_are_answered_failed_cancelled_and_a_closed_socket_is_unavailable() {
        let folder = std::env::temp_dir().join(format!("link-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&folder);
        let path = folder.join("a.sock");
        let _ = std::fs::remove_file(&path);
        let cancels = Arc::new(Mutex::new(Vec::new()));
        let server = tokio::spawn(echo(UnixListener::bind(&path).unwrap(), cancels.clone()));
        let socket = Socket::new(path.clone());
        let (a, b) = tokio::join!(socket.call(b"abc"), socket.call(b"xy"));
        assert_eq!((a.unwrap(), b.unwrap()), (b"cba".to_vec(), b"yx".to_vec()));
        let full = socket.call(b"full").await.unwrap_err();
        assert_eq!((full.code, full.message.as_str()), (8, "queue full"));
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), socket.call(b"wait"));
        assert!(waited.await.is_err());
        assert_eq!(socket.call(b"z").await.unwrap(), b"z");
        assert_eq!(*cancels.lock().unwrap(), [4]);
        server.abort();
        let _ = server.await;
        let gone = socket.call(b"q").await.unwrap_err();
        assert_eq!(gone.code, UNAVAILABLE);
        let _ = std::fs::remove_file(&path);
        let again = socket.call(b"q").await.unwrap_err();
        assert_eq!(again.code, UNAVAILABLE);
    }
}

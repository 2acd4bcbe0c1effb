//! Bounded connections, the Python front's rule (`gateway/connections.py`), so that idle and
//! slow clients cannot lock everyone else out:
//!
//! - a request's headers complete within `--header-timeout` of their first byte, else a JSON
//!   408 and close; a new connection's first request within it of the accept, else closed
//!   without a word; idle between requests is not timed (`Conn::deadline`; hyper's own header
//!   timer would close an idle keep-alive connection without a word);
//! - at most `--max-connections` open: a connection with no request in progress (idle between
//!   requests, or its headers not complete) holds its slot only until a new connection needs it,
//!   when the oldest such is closed; only when every open connection has a request in progress
//!   is the new one refused, a JSON 503 with retry-after, then closed.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// One open connection's state, shared by its task, its reads and the registry.
pub struct Conn {
    /// a request is in progress: its headers were read and it is not answered yet
    busy: AtomicBool,
    /// a request was read on it: its accept's deadline is over
    served: AtomicBool,
    /// when the next request's first byte came (nanoseconds since `start`, plus one), 0: none
    began: AtomicU64,
    /// when it last became idle (nanoseconds since `start`: eviction order)
    since: AtomicU64,
    /// told to close (evicted for a newcomer)
    evict: Notify,
    /// a request's first byte came: its headers' deadline starts
    woken: Notify,
    start: Instant,
}

/// What a connection's header deadline found when it passed.
#[derive(Debug, PartialEq, Eq)]
pub enum Late {
    /// nothing is late (the deadline moved)
    No,
    /// a request's headers began and did not complete: a 408
    Headers,
    /// a new connection sent nothing: closed without a word
    Silent,
}

impl Conn {
    fn nanos(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// A request's headers were read: in progress until `answered`.
    pub fn busy(&self) {
        self.busy.store(true, Ordering::Relaxed);
        self.served.store(true, Ordering::Relaxed);
        self.began.store(0, Ordering::Relaxed);
    }

    pub fn answered(&self) {
        self.since.store(self.nanos(), Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
    }

    /// Bytes came: the first of a request's headers start their deadline.
    fn read(&self) {
        if !self.busy.load(Ordering::Relaxed) && self.began.load(Ordering::Relaxed) == 0 {
            self.began.store(self.nanos() + 1, Ordering::Relaxed);
            self.woken.notify_one();
        }
    }

    /// When the headers awaited are late (`timeout` from the request's first byte, or from the
    /// accept for a connection's first request); None: none awaited (a request in progress, or
    /// idle between requests: keep-alive's business).
    pub fn deadline(&self, accepted: Instant, timeout: Duration) -> Option<Instant> {
        if self.busy.load(Ordering::Relaxed) {
            return None;
        }
        match self.began.load(Ordering::Relaxed) {
            0 if self.served.load(Ordering::Relaxed) => None,
            0 => Some(accepted + timeout),
            began => Some(self.start + Duration::from_nanos(began - 1) + timeout),
        }
    }

    /// What is late now, if anything.
    pub fn late(&self, accepted: Instant, timeout: Duration) -> Late {
        match self.deadline(accepted, timeout) {
            Some(deadline) if deadline <= Instant::now() => {
                if self.began.load(Ordering::Relaxed) != 0 {
                    Late::Headers
                } else {
                    Late::Silent
                }
            }
            _ => Late::No,
        }
    }

    /// Resolves once the connection is evicted.
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Resolves once a request's first byte came (since the last call).
    pub async fn woken(&self) {
        self.woken.notified().await
    }
}

/// Every open connection, at most `max`.
pub struct Conns {
    max: usize,
    start: Instant,
    open: Mutex<(u64, HashMap<u64, Arc<Conn>>)>,
}

/// A connection's place in `Conns`: it leaves when this is dropped.
pub struct Slot {
    conns: Arc<Conns>,
    id: u64,
    pub conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.conns.open.lock() {
            open.1.remove(&self.id);
        }
    }
}

impl Conns {
    pub fn new(max: usize) -> Self {
        Conns {
            max: max.max(1),
            start: Instant::now(),
            open: Mutex::new((0, HashMap::new())),
        }
    }

    /// A slot for a new connection, the oldest with no request in progress evicted when all are
    /// taken; None when every open connection has a request in progress.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock().ok()?;
        if open.1.len() >= self.max {
            let oldest = open
                .1
                .iter()
                .filter(|(_, c)| !c.busy.load(Ordering::Relaxed))
                .min_by_key(|(_, c)| c.since.load(Ordering::Relaxed))
                .map(|(&id, _)| id)?;
            if let Some(evicted) = open.1.remove(&oldest) {
                evicted.evict.notify_one();
            }
        }
        let conn = Arc::new(Conn {
            busy: AtomicBool::new(false),
            served: AtomicBool::new(false),
            began: AtomicU64::new(0),
            since: AtomicU64::new(self.start.elapsed().as_nanos() as u64),
            evict: Notify::new(),
            woken: Notify::new(),
            start: self.start,
        });
        let id = open.0;
        open.0 += 1;
        open.1.insert(id, conn.clone());
        Some(Slot {
            conns: self.clone(),
            id,
            conn,
        })
    }

    /// The refusal of a connection when every slot has a request in progress.
    pub fn full(&self) -> Vec<u8> {
        let why = format!("the gateway worker has {} requests open", self.max);
        refusal(503, &why, "too_many_connections")
    }
}

/// The 408 of a request whose headers did not complete within `seconds`.
pub fn too_slow(seconds: f64) -> Vec<u8> {
    let why = format!("the request's headers did not arrive within {seconds} s");
    refusal(408, &why, "request_timeout")
}

/// A refusal and its connection's close, as the Python front writes it (`connections._refusal`).
fn refusal(status: u16, why: &str, code: &str) -> Vec<u8> {
    let body = format!(
        "{{\"error\": {{\"message\": \"{why}\", \"type\": \"invalid_request_error\", \
         \"param\": null, \"code\": \"{code}\"}}}}"
    );
    let (reason, retry) = match status {
        503 => ("Service Unavailable", "retry-after: 1\r\n"),
        _ => ("Request Timeout", ""),
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         {retry}connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A connection's stream as hyper reads it: each read that brings bytes marks its `Conn`.
pub struct Watched {
    pub stream: TcpStream,
    pub conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_never_do() {
        let conns = Arc::new(Conns::new(2));
        let a = conns.admit().expect("a slot");
        let b = conns.admit().expect("a slot");
        b.conn.busy();
        let c = conns.admit().expect("a's slot: it was idle");
        assert!(!conns.open.lock().unwrap().1.contains_key(&a.id));
        c.conn.busy();
        assert!(conns.admit().is_none()); // every one has a request in progress
        c.conn.answered();
        assert!(conns.admit().is_some());
    }

    #[test]
    fn headers_are_timed_from_their_first_byte_and_idle_keep_alive_is_not() {
        let conns = Arc::new(Conns::new(2));
        let slot = conns.admit().expect("a slot");
        let (conn, accepted, t) = (&slot.conn, Instant::now(), Duration::from_secs(5));
        assert_eq!(conn.deadline(accepted, t), Some(accepted + t)); // the accept's
        assert_eq!(conn.late(accepted, Duration::ZERO), Late::Silent);
        conn.read();
        assert_eq!(conn.late(accepted, Duration::ZERO), Late::Headers);
        conn.busy();
        assert_eq!(conn.deadline(accepted, t), None);
        conn.answered();
        assert_eq!(conn.deadline(accepted, t), None); // idle keep-alive
        conn.read();
        assert!(conn
            .deadline(accepted, t)
            .is_some_and(|d| d > accepted + t / 2));
    }

    #[test]
    fn refusals_are_the_python_fronts() {
        let text = String::from_utf8(too_slow(1.0)).unwrap();
        assert!(text.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        assert!(text.ends_with(
            "{\"error\": {\"message\": \"the request's headers did not arrive within 1 s\", \
             \"type\": \"invalid_request_error\", \"param\": null, \"code\": \"request_timeout\"}}"
        ));
        let text = String::from_utf8(Conns::new(16).full()).unwrap();
        assert!(text.contains("retry-after: 1\r\nconnection: close\r\n\r\n"));
        assert!(text.contains("the gateway worker has 16 requests open"));
    }
}

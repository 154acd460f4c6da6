//! A minimal HTTP/1.x endpoint: `GET /metrics` (and `HEAD`) answers the exposition document,
//! any other path a 404 that says where the metrics are, any other method a 405.
//!
//! One thread of its own accepts and answers connections one at a time, each read and write
//! bounded by [`IO_TIMEOUT`], and every response closes its connection: a scraper asks every
//! few seconds, and a client that stalls holds the endpoint for at most the timeout. The
//! document is rendered on this thread, so the serving process's own threads (a memnode's
//! request path) never wait for a scrape; rendering reads their counters only.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::exposition::CONTENT_TYPE;

/// How long one connection may take to send its request or read the response.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest request head read (request line and headers).
const MAX_REQUEST: usize = 8 << 10;

/// A running metrics endpoint. Dropping it leaves the thread serving (for the life of the
/// process); [`MetricsServer::stop`] ends it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The address it listens on (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits for the thread.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wakes the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listens on `addr` (HOST:PORT) and serves `render()`'s document at `/metrics` from a thread
/// named `thread_name`.
pub fn serve(
    addr: &str,
    thread_name: &str,
    render: impl Fn() -> String + Send + 'static,
) -> io::Result<MetricsServer> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| io::Error::new(e.kind(), format!("metrics address `{addr}`: {e}")))?
        .collect();
    let listener = TcpListener::bind(&addrs[..]).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} for metrics: {e}"),
        )
    })?;
    let local = listener.local_addr()?;
    let stopping = Arc::new(AtomicBool::new(false));
    let stop = stopping.clone();
    let thread = std::thread::Builder::new()
        .name(thread_name.into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                match conn {
                    Ok(mut c) => {
                        if let Err(e) = answer(&mut c, &render) {
                            log::debug!("metrics request: {e}");
                        }
                    }
                    Err(e) => {
                        log::warn!("metrics endpoint: accept failed: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    Ok(MetricsServer {
        addr: local,
        stopping,
        thread: Some(thread),
    })
}

/// Reads one request from `c` and answers it.
fn answer(c: &mut TcpStream, render: &dyn Fn() -> String) -> io::Result<()> {
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    c.set_write_timeout(Some(IO_TIMEOUT))?;
    let head = read_head(c)?;
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body, content_type) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", render(), CONTENT_TYPE),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            format!("404: nothing at {path:?}; the metrics are at /metrics\n"),
            "text/plain; charset=utf-8",
        ),
        _ => (
            "405 Method Not Allowed",
            format!("405: {method:?} is not served; use GET /metrics\n"),
            "text/plain; charset=utf-8",
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n{}\r\n",
        body.len(),
        if status.starts_with("405") {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        }
    )
    .into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(body.as_bytes());
    }
    c.write_all(&response)?;
    c.flush()
}

/// The request's head (up to the blank line), at most [`MAX_REQUEST`] bytes.
fn read_head(c: &mut TcpStream) -> io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() >= MAX_REQUEST {
            break;
        }
        let n = c.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(addr: SocketAddr, req: &str) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn metrics_are_served_and_other_paths_refused() {
        let s = serve("127.0.0.1:0", "metrics-test", || "x_total 1\n".to_string()).unwrap();
        let addr = s.local_addr();
        let ok = request(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("version=0.0.4"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nx_total 1\n"), "{ok}");
        let q = request(addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(q.starts_with("HTTP/1.1 200"), "{q}");
        let missing = request(addr, "GET / HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        assert!(missing.contains("/metrics"), "{missing}");
        let post = request(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let head = request(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        s.stop();
        assert!(
            TcpStream::connect(addr).is_err(),
            "still listening after stop"
        );
    }

    #[test]
    fn a_bad_address_is_a_clear_error() {
        let e = serve("nonsense", "m", String::new).unwrap_err();
        assert!(e.to_string().contains("nonsense"), "{e}");
    }
}

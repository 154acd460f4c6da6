//! A TCP proxy that breaks connections on command: it forwards bytes between clients and one
//! server, and can cut every live connection at once (both directions shut down, as a network
//! reset would) or stall (hold every byte, on old and new connections, until released).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct State {
    /// Both sockets of every connection pair still forwarding.
    live: Mutex<Vec<(TcpStream, TcpStream)>>,
    stalled: AtomicBool,
    stop: AtomicBool,
    /// Bytes forwarded from the server to clients.
    to_clients: AtomicU64,
    /// Connections accepted.
    accepted: AtomicU64,
    /// Connections cut.
    cut: AtomicU64,
}

/// The proxy; every socket is shut down on drop.
pub struct FaultyProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultyProxy {
    /// Forwards connections made to [`FaultyProxy::addr`] to `server`.
    pub fn start(server: SocketAddr) -> FaultyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        let acceptor = std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(server) else {
                    continue;
                };
                st.accepted.fetch_add(1, Ordering::SeqCst);
                for s in [&client, &server] {
                    s.set_nodelay(true).unwrap();
                }
                st.live
                    .lock()
                    .unwrap()
                    .push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (st1, st2) = (st.clone(), st.clone());
                std::thread::spawn(move || forward(&st1, client, server, false));
                std::thread::spawn(move || forward(&st2, s2, c2, true));
            }
        });
        FaultyProxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// Cuts every live connection; returns how many.
    pub fn cut_all(&self) -> usize {
        let live = std::mem::take(&mut *self.state.live.lock().unwrap());
        for (c, s) in &live {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
        self.state
            .cut
            .fetch_add(live.len() as u64, Ordering::SeqCst);
        live.len()
    }

    /// Holds (true) or releases (false) every byte in both directions.
    pub fn set_stalled(&self, stalled: bool) {
        self.state.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Bytes forwarded from the server to clients so far.
    pub fn bytes_to_clients(&self) -> u64 {
        self.state.to_clients.load(Ordering::SeqCst)
    }

    /// (connections accepted, connections cut).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.state.accepted.load(Ordering::SeqCst),
            self.state.cut.load(Ordering::SeqCst),
        )
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.state.stalled.store(false, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the acceptor, which sees the flag
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.cut_all();
    }
}

/// Copies `from` to `to` until either side closes, holding data while the proxy is stalled.
fn forward(st: &State, mut from: TcpStream, mut to: TcpStream, to_client: bool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while st.stalled.load(Ordering::SeqCst) && !st.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if to_client {
            st.to_clients.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

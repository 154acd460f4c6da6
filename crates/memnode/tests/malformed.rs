//! Malformed input on one connection closes that connection only; everyone else keeps working.
//! Well-formed input in whatever pieces the network makes of it is answered in order.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use gleaner_memnode::ServerConfig;
use gleaner_proto::{
    client_proof, generate_token, random_bytes, read_frame, write_frame, ErrorCode, FrameHeader,
    Message, MessageKind, PageBatch, PageIds, Token, MAX_BATCH_PAGES, MAX_BLOB_SIZE, MAX_PAYLOAD,
};

use common::{assert_pages, page, write, TestServer};

/// A raw connection that has read the server's challenge.
struct Raw {
    s: TcpStream,
    nonce: [u8; 32],
}

impl Raw {
    fn open(server: &TestServer) -> Raw {
        let addr = server.endpoint.to_string();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rx = Vec::new();
        let h = read_frame(&mut s, &mut rx).unwrap();
        let nonce = match Message::decode(h.kind, &rx).unwrap() {
            Message::Challenge { nonce } => nonce,
            other => panic!("expected a challenge, got {other:?}"),
        };
        Raw { s, nonce }
    }

    /// Opens and authenticates as a new session, without the client library.
    fn authenticated(server: &TestServer, token: &Token) -> Raw {
        let mut raw = Raw::open(server);
        let client_nonce = random_bytes();
        let auth = Message::Auth {
            client_nonce,
            session_id: 0,
            session_key: [0; 16],
            proof: client_proof(token, &raw.nonce, &client_nonce, 0, &[0; 16]),
            client_name: "raw",
        };
        auth.send(&mut raw.s, 1, &mut Vec::new()).unwrap();
        let mut rx = Vec::new();
        let h = read_frame(&mut raw.s, &mut rx).unwrap();
        assert_eq!(h.kind, MessageKind::Welcome);
        raw
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Reads until the server closes; panics if it does not within the read timeout. If a frame
    /// came before the close, it must be `Error{BadRequest}`.
    fn expect_closed(mut self, case: &str) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("{case}: server did not close the connection: {e}"),
            }
        }
        if !got.is_empty() {
            let mut rx = Vec::new();
            let h = read_frame(&mut &got[..], &mut rx)
                .unwrap_or_else(|e| panic!("{case}: undecodable reply: {e}"));
            match Message::decode(h.kind, &rx).unwrap() {
                Message::Error { code, .. } => assert_eq!(code, ErrorCode::BadRequest, "{case}"),
                other => panic!("{case}: unexpected reply {other:?}"),
            }
        }
    }
}

fn header(kind: MessageKind, len: u32) -> [u8; 12] {
    FrameHeader {
        kind,
        req_id: 9,
        len,
    }
    .encode()
}

#[test]
fn malformed_connections_are_dropped_and_others_keep_working() {
    let server = TestServer::tcp(256);
    let token = server.token;
    let mut before = server.connect();
    write(&mut before, &[(1, 11), (2, 22)]).unwrap();

    let mut cases = 0;
    let mut case = |name: &str, f: &dyn Fn(&mut Raw), authenticated: bool| {
        let mut raw = if authenticated {
            Raw::authenticated(&server, &token)
        } else {
            Raw::open(&server)
        };
        f(&mut raw);
        raw.expect_closed(name);
        cases += 1;
    };

    case(
        "bad magic",
        &|r| r.send(&[0xde, 0xad, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0]),
        false,
    );
    case(
        "bad version",
        &|r| {
            let mut h = header(MessageKind::Auth, 0);
            h[2] = 77;
            r.send(&h)
        },
        false,
    );
    case(
        "unknown kind",
        &|r| {
            let mut h = header(MessageKind::Auth, 0);
            h[3] = 200;
            r.send(&h)
        },
        false,
    );
    case(
        "oversized length",
        &|r| r.send(&header(MessageKind::Write, MAX_PAYLOAD as u32 + 1)),
        true,
    );
    case(
        "truncated frame then close",
        &|r| {
            r.send(&header(MessageKind::Auth, 100));
            r.send(&[0u8; 10]);
            r.s.shutdown(Shutdown::Write).unwrap();
        },
        false,
    );
    case(
        "undecodable Auth payload",
        &|r| {
            r.send(&header(MessageKind::Auth, 5));
            r.send(&[1, 2, 3, 4, 5]);
        },
        false,
    );
    case(
        "Auth longer than the pre-authentication limit",
        &|r| r.send(&header(MessageKind::Auth, 100_000)),
        false,
    );
    case(
        "Read before auth",
        &|r| {
            let mut p = Vec::new();
            PageIds::encode_into(&mut p, &[1]);
            r.send(&header(MessageKind::Read, p.len() as u32));
            r.send(&p);
        },
        false,
    );
    case(
        "undecodable Read after auth",
        &|r| {
            let mut p = Vec::new();
            p.extend_from_slice(&(MAX_BATCH_PAGES as u32 + 1).to_le_bytes());
            r.send(&header(MessageKind::Read, p.len() as u32));
            r.send(&p);
        },
        true,
    );
    // Write batches whose entries break the blob bounds: the whole frame is refused and nothing
    // of it is stored (checked below: the session's pages are unchanged).
    let write_entries = |r: &mut Raw, entries: &[(u64, u32, usize)], count: u32| {
        let mut p = count.to_le_bytes().to_vec();
        for &(id, len, data) in entries {
            p.extend_from_slice(&id.to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            p.resize(p.len() + data, 7);
        }
        r.send(&header(MessageKind::Write, p.len() as u32));
        r.send(&p);
    };
    case(
        "Write with an empty blob",
        &|r| write_entries(r, &[(1, 10, 10), (2, 0, 0)], 2),
        true,
    );
    case(
        "Write with a blob longer than MAX_BLOB_SIZE",
        &|r| {
            let len = MAX_BLOB_SIZE + 1;
            write_entries(r, &[(1, len as u32, len)], 1)
        },
        true,
    );
    case(
        "Write whose last blob is cut short",
        &|r| write_entries(r, &[(1, 10, 10), (2, 100, 50)], 2),
        true,
    );
    case(
        "Write with bytes after its last entry",
        &|r| write_entries(r, &[(1, 10, 11)], 1),
        true,
    );
    case(
        "server-to-client kind from a client",
        &|r| r.send(&header(MessageKind::Pong, 0)),
        true,
    );
    case(
        "second Auth on an authenticated connection",
        &|r| {
            let mut p = Vec::new();
            Message::Auth {
                client_nonce: [0; 32],
                session_id: 0,
                session_key: [0; 16],
                proof: [0; 32],
                client_name: "again",
            }
            .encode(&mut p);
            r.send(&header(MessageKind::Auth, p.len() as u32));
            r.send(&p);
        },
        true,
    );

    // The connection opened before still works, and so does a new one.
    before.ping().unwrap();
    assert_pages(&mut before, &[(1, 11), (2, 22)]);
    let mut after = server.connect();
    write(&mut after, &[(1, 33)]).unwrap();
    assert_pages(&mut after, &[(1, 33)]);
    assert_pages(&mut before, &[(1, 11)]);

    let s = server.stats();
    assert_eq!(s.totals.malformed_frames, cases);
    assert_eq!(s.totals.auth_failures, 0);
}

#[test]
fn silent_connections_time_out_in_the_handshake() {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 16 * 4096, generate_token());
    config.handshake_timeout = Duration::from_millis(200);
    let server = TestServer::start_with(config);
    let raw = Raw::open(&server);
    raw.expect_closed("silent client");
    let s = server.local_stats();
    assert_eq!(s.totals.handshake_timeouts, 1);
    assert_eq!(s.totals.malformed_frames, 0);
    server.connect().ping().unwrap();
}

#[test]
fn connections_beyond_the_limit_are_refused() {
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 16 * 4096, generate_token());
    config.max_connections = 1;
    let server = TestServer::start_with(config);
    let mut first = server.connect();
    let err = gleaner_proto::Connection::connect(
        &server.endpoint,
        &server.token,
        None,
        &TestServer::opts("second"),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            gleaner_proto::ClientError::Unexpected {
                got: MessageKind::Error,
                ..
            }
        ),
        "{err}"
    );
    first.ping().unwrap();
    let s = server.local_stats();
    assert_eq!(s.totals.connections_refused, 1);
    assert_eq!(s.live_connections, 1);
    // Once the first leaves, there is room again.
    drop(first);
    assert!(common::wait_until(Duration::from_secs(5), || server
        .local_stats()
        .live_connections
        == 0));
    server.connect().ping().unwrap();
}

/// Requests come in whatever pieces the network makes of them: several frames in one send (the
/// memnode reads ahead, and must keep what it read past the first frame for the next), a frame
/// larger than what it reads ahead, or one frame a byte at a time. Each request is answered, in
/// order, with the right pages.
#[test]
fn requests_in_one_send_or_a_byte_at_a_time_are_each_answered_in_order() {
    let server = TestServer::tcp(256);
    let token = server.token;
    // Five pages written (20 KiB, more than the memnode reads ahead), two read back in another
    // order, one never written.
    let mut bytes = Vec::new();
    let mut payload = Vec::new();
    PageBatch::begin(&mut payload);
    for id in 1..=5u64 {
        PageBatch::push(&mut payload, id, 0, &page(id * 11));
    }
    write_frame(&mut bytes, MessageKind::Write, 1, &payload).unwrap();
    payload.clear();
    PageIds::encode_into(&mut payload, &[4, 2]);
    write_frame(&mut bytes, MessageKind::Read, 2, &payload).unwrap();
    payload.clear();
    PageIds::encode_into(&mut payload, &[9]);
    write_frame(&mut bytes, MessageKind::Read, 3, &payload).unwrap();

    for one_byte_sends in [false, true] {
        let case = if one_byte_sends {
            "a byte at a time"
        } else {
            "in one send"
        };
        let mut raw = Raw::authenticated(&server, &token);
        if one_byte_sends {
            raw.s.set_nodelay(true).unwrap();
            for b in &bytes {
                raw.send(std::slice::from_ref(b));
            }
        } else {
            raw.send(&bytes);
        }
        let mut rx = Vec::new();
        let h = read_frame(&mut raw.s, &mut rx).unwrap();
        assert_eq!(
            (h.req_id, h.kind),
            (1, MessageKind::Ack),
            "{case}: the write"
        );
        let h = read_frame(&mut raw.s, &mut rx).unwrap();
        assert_eq!(
            (h.req_id, h.kind),
            (2, MessageKind::Pages),
            "{case}: the read"
        );
        let Message::Pages { batch } = Message::decode(h.kind, &rx).unwrap() else {
            unreachable!("the kind was checked");
        };
        let got: Vec<(u64, bool)> = batch
            .iter()
            .map(|(id, _, data)| (id, data == page(id * 11).as_slice()))
            .collect();
        assert_eq!(got, [(4, true), (2, true)], "{case}: pages and contents");
        let h = read_frame(&mut raw.s, &mut rx).unwrap();
        assert_eq!(h.req_id, 3, "{case}: the read of a page never written");
        match Message::decode(h.kind, &rx).unwrap() {
            Message::Error { code, .. } => assert_eq!(code, ErrorCode::NotFound, "{case}"),
            other => panic!("{case}: expected NotFound, got {other:?}"),
        }
    }
}

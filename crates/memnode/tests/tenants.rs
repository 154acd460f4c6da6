//! Tenants on one memnode (issue 13): each with its own token and quota. A tenant over its quota
//! is refused (the message names it) and can write again once it frees space; the memnode's
//! capacity still bounds every tenant; a tenant's token never opens another tenant's session;
//! the stats list each tenant's quota, use and sessions.

mod common;

use gleaner_memnode::{ServerConfig, TenantConfig};
use gleaner_proto::{generate_token, ClientError, Connection, ErrorCode, Token, PAGE_SIZE};

use common::{assert_pages, write, TestServer, P};

fn tenant(name: &str, quota_pages: u64) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        token: generate_token(),
        quota_bytes: quota_pages * P,
        weight: 2,
    }
}

fn server(capacity_pages: u64, tenants: &[TenantConfig]) -> TestServer {
    let mut config = ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        capacity_pages * PAGE_SIZE as u64,
        generate_token(),
    );
    config.tenants = tenants.to_vec();
    TestServer::start_with(config)
}

fn connect(server: &TestServer, token: &Token) -> Connection {
    Connection::connect(&server.endpoint, token, None, &TestServer::opts("tenant"))
        .expect("connect")
}

fn pages(from: u64, n: u64) -> Vec<(u64, u64)> {
    (from..from + n).map(|i| (i, 1000 + i)).collect()
}

#[test]
fn a_tenant_over_its_quota_is_refused_then_writes_again_after_freeing() {
    let t = tenant("batch", 10);
    let s = server(100, std::slice::from_ref(&t));
    let mut c = connect(&s, &t.token);
    assert_eq!(
        c.session().capacity_bytes,
        10 * P,
        "Welcome announces the quota"
    );
    write(&mut c, &pages(0, 10)).unwrap();
    let err = write(&mut c, &pages(10, 1)).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::Full), "{err}");
    assert!(err.to_string().contains("tenant batch"), "{err}");
    // The main token's tenant still has the rest of the memnode.
    let mut other = s.connect();
    write(&mut other, &pages(0, 50)).unwrap();
    // Freeing within the quota makes room again.
    c.free(&[(0, 2)]).unwrap();
    write(&mut c, &pages(10, 2)).unwrap();
    assert_pages(&mut c, &pages(2, 10));
    let stats = s.local_stats();
    let b = stats.tenants.iter().find(|x| x.name == "batch").unwrap();
    assert_eq!(
        (b.quota_bytes, b.used_bytes, b.weight, b.sessions),
        (10 * P, 10 * P, 2, 1)
    );
    let d = stats.tenants.iter().find(|x| x.name == "default").unwrap();
    assert_eq!(
        d.used_bytes,
        60 * P,
        "the default tenant counts every byte: {d:?}"
    );
    assert_eq!(stats.used_bytes, 60 * P);
    assert!(stats.sessions.iter().any(|x| x.tenant == "batch"));
}

#[test]
fn the_memnode_capacity_bounds_every_tenant() {
    let t = tenant("big", 1000);
    let s = server(8, std::slice::from_ref(&t));
    let mut c = connect(&s, &t.token);
    assert_eq!(
        c.session().capacity_bytes,
        8 * P,
        "a quota above the capacity is cut to it"
    );
    write(&mut c, &pages(0, 8)).unwrap();
    let err = write(&mut c, &pages(8, 1)).unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::Full), "{err}");
}

#[test]
fn a_tenants_token_never_opens_another_tenants_session() {
    let (a, b) = (tenant("a", 10), tenant("b", 10));
    let s = server(100, &[a.clone(), b.clone()]);
    let mut ca = connect(&s, &a.token);
    write(&mut ca, &pages(0, 3)).unwrap();
    let info = ca.session();
    let id = Some((info.session_id, info.session_key));
    for (who, token) in [("b", &b.token), ("default", &s.token)] {
        let err = Connection::connect(&s.endpoint, token, id, &TestServer::opts(who)).unwrap_err();
        assert!(
            matches!(err, ClientError::AuthRejected { .. }),
            "{who}: {err}"
        );
    }
    // Its own token does.
    let mut again = Connection::connect(&s.endpoint, &a.token, id, &TestServer::opts("a")).unwrap();
    assert_pages(&mut again, &pages(0, 3));
    // A token no tenant has is refused outright.
    let err = Connection::connect(&s.endpoint, &generate_token(), None, &TestServer::opts("x"))
        .unwrap_err();
    assert!(matches!(err, ClientError::AuthRejected { .. }), "{err}");
}

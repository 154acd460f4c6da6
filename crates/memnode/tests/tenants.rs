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

/// A memnode on TCP loopback of `capacity_pages` with `tenants` besides the main token's.
fn config(capacity_pages: u64, tenants: &[TenantConfig]) -> ServerConfig {
    let mut config = ServerConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        capacity_pages * PAGE_SIZE as u64,
        generate_token(),
    );
    config.tenants = tenants.to_vec();
    config
}

fn server(capacity_pages: u64, tenants: &[TenantConfig]) -> TestServer {
    TestServer::start_with(config(capacity_pages, tenants))
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
    // Without `--bandwidth` there is no link to report on.
    let stats = s.local_stats();
    assert!(stats.link_departures.is_none() && stats.tenants.iter().all(|t| t.queue.is_none()));
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

/// A tenant's token holder asking for stats sees its own sessions and quota only: never
/// another tenant's session (its id, its client name) nor another tenant; the main token still
/// sees every session and tenant.
#[test]
fn a_tenant_asking_for_stats_sees_only_its_own_sessions() {
    let (a, b) = (tenant("a", 10), tenant("b", 20));
    let s = server(100, &[a.clone(), b.clone()]);
    let mut ca = connect(&s, &a.token);
    write(&mut ca, &pages(0, 3)).unwrap();
    let a_id = ca.session().session_id;
    let mut cb = connect(&s, &b.token);
    write(&mut cb, &pages(0, 5)).unwrap();
    let b_id = cb.session().session_id;
    let parse = |json: String| -> gleaner_memnode::StatsSnapshot {
        serde_json::from_str(&json).expect("stats JSON")
    };
    let seen_by_b = parse(cb.stats().unwrap());
    assert_eq!(seen_by_b.scope, "tenant b");
    let ids: Vec<u64> = seen_by_b.sessions.iter().map(|x| x.id).collect();
    assert_eq!(
        ids,
        vec![b_id],
        "tenant b sees only its session: {seen_by_b:?}"
    );
    assert!(
        seen_by_b.sessions.iter().all(|x| x.tenant == "b"),
        "{seen_by_b:?}"
    );
    assert_eq!(seen_by_b.sessions_total, 1);
    let names: Vec<&str> = seen_by_b.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["b"], "no other tenant listed");
    assert_eq!(
        seen_by_b.capacity_bytes,
        20 * P,
        "its quota is its capacity"
    );
    assert_eq!(seen_by_b.pages_held, 5, "its pages only");
    let json_b = cb.stats().unwrap();
    assert!(
        !json_b.contains(&format!("\"id\":{a_id},")),
        "tenant a's session id shows in b's stats: {json_b}"
    );
    // Tenant a likewise.
    let seen_by_a = parse(ca.stats().unwrap());
    let ids: Vec<u64> = seen_by_a.sessions.iter().map(|x| x.id).collect();
    assert_eq!(ids, vec![a_id], "{seen_by_a:?}");
    // The main token sees the whole memnode.
    let mut main = connect(&s, &s.token);
    let all = parse(main.stats().unwrap());
    assert_eq!(all.scope, "memnode");
    for id in [a_id, b_id] {
        assert!(all.sessions.iter().any(|x| x.id == id), "{all:?}");
    }
    assert_eq!(all.tenants.len(), 3, "default, a and b: {all:?}");
    assert_eq!(all.capacity_bytes, 100 * P);
    // Nor may a tenant drain the memnode (which would take it down for every tenant, and
    // answered with the count of every session).
    let err = cb.drain().unwrap_err();
    assert_eq!(err.server_code(), Some(ErrorCode::BadRequest), "{err}");
    assert!(err.to_string().contains("tenant b may not drain"), "{err}");
    let mut ca2 = connect(&s, &a.token);
    write(&mut ca2, &pages(10, 1)).expect("still serving: not draining");
    ca2.ping()
        .expect("not draining (a draining memnode answers Ping with Draining)");
}

/// Lets `workers` run `warm_ms`, then takes the stats before and after a window of `secs`
/// seconds, then stops them (`stop`) and waits for them.
fn window(
    server: &TestServer,
    warm_ms: u64,
    secs: u64,
    stop: &std::sync::atomic::AtomicBool,
    workers: Vec<std::thread::JoinHandle<()>>,
) -> (
    gleaner_memnode::StatsSnapshot,
    gleaner_memnode::StatsSnapshot,
) {
    std::thread::sleep(std::time::Duration::from_millis(warm_ms));
    let before = server.local_stats();
    std::thread::sleep(std::time::Duration::from_secs(secs));
    let after = server.local_stats();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    (before, after)
}

/// With `--bandwidth`, tenants that keep the link busy share it by weight (start-time fair
/// queuing): two connections each of a weight-1 and a weight-3 tenant reading 256 KiB batches
/// as fast as they can through a 16 MiB/s link get bytes in a 1:3 ratio, within 10%; each
/// tenant's queue wait is reported, and the light tenant waits longer.
#[test]
fn tenants_share_a_saturated_link_by_weight() {
    let light = TenantConfig {
        weight: 1,
        ..tenant("light", 10_000)
    };
    let heavy = TenantConfig {
        weight: 3,
        ..tenant("heavy", 10_000)
    };
    let mut config = config(20_000, &[light.clone(), heavy.clone()]);
    config.bandwidth_bytes_per_s = Some(16 << 20);
    let server = TestServer::start_with(config);
    let ids: Vec<u64> = (0..64).collect();
    let mut workers = Vec::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for t in [&light, &heavy] {
        let mut first = connect(&server, &t.token);
        write(&mut first, &pages(0, 64)).unwrap();
        let session = first.session();
        for _ in 0..2 {
            let mut c = Connection::connect(
                &server.endpoint,
                &t.token,
                Some((session.session_id, session.session_key)),
                &TestServer::opts("reader"),
            )
            .unwrap();
            let (ids, stop) = (ids.clone(), stop.clone());
            workers.push(std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(c.read_pages(&ids).unwrap().len(), 64);
                }
            }));
        }
        // Kept open so the session stays.
        std::mem::forget(first);
    }
    // Both saturate the link for 3 s; only the bytes of that window count.
    let (before, after) = window(&server, 500, 3, &stop, workers);
    let bytes = |s: &gleaner_memnode::StatsSnapshot, name: &str| {
        let t = s.tenants.iter().find(|t| t.name == name).unwrap();
        t.queue
            .as_ref()
            .expect("queue stats with a link")
            .total
            .bytes
    };
    let l = bytes(&after, "light") - bytes(&before, "light");
    let h = bytes(&after, "heavy") - bytes(&before, "heavy");
    let ratio = h as f64 / l as f64;
    eprintln!("link shared 1:3 by weight: heavy {h} B, light {l} B, ratio {ratio:.3}");
    assert!(
        (2.7..=3.3).contains(&ratio),
        "heavy {h} B, light {l} B: {ratio:.2}, not 3 within 10%"
    );
    // The link ran near its rate: 3 s at 16 MiB/s.
    let total = (l + h) as f64 / 3.0 / (16u64 << 20) as f64;
    assert!(
        (0.8..=1.05).contains(&total),
        "link at {total:.2} of its rate"
    );
    let q = |name: &str| {
        after
            .tenants
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .queue
            .clone()
            .unwrap()
            .total
    };
    assert!(
        q("light").wait_mean_us > q("heavy").wait_mean_us,
        "light {:?} heavy {:?}",
        q("light"),
        q("heavy")
    );
}

/// The link is full duplex, as real links are: one session reading and one writing back as
/// fast as they can through a 16 MiB/s link each get about 16 MiB/s, and neither waits for the
/// other's bytes.
#[test]
fn reads_and_write_backs_each_get_the_whole_rate_of_their_direction() {
    let mut config = config(20_000, &[]);
    config.bandwidth_bytes_per_s = Some(16 << 20);
    let server = TestServer::start_with(config);
    let mut first = server.connect();
    write(&mut first, &pages(0, 64)).unwrap();
    let s = first.session();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for reader in [true, false] {
        let mut c = server.attach(s.session_id, s.session_key).unwrap();
        let stop = stop.clone();
        workers.push(std::thread::spawn(move || {
            let ids: Vec<u64> = (0..64).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if reader {
                    assert_eq!(c.read_pages(&ids).unwrap().len(), 64);
                } else {
                    write(&mut c, &pages(1000, 64)).unwrap();
                }
            }
        }));
    }
    let (before, after) = window(&server, 300, 2, &stop, workers);
    let class_bytes = |s: &gleaner_memnode::StatsSnapshot, class: &str| {
        s.tenants[0].queue.as_ref().unwrap().classes[class].bytes
    };
    for class in ["demand", "writeback"] {
        let rate = (class_bytes(&after, class) - class_bytes(&before, class)) as f64
            / 2.0
            / (16u64 << 20) as f64;
        eprintln!("{class}: {rate:.2} of the link's rate");
        assert!(
            (0.8..=1.05).contains(&rate),
            "{class} at {rate:.2} of the link's rate: each direction should carry its whole rate"
        );
    }
    // Each reply was held for its bytes, and the stats say how on time they left.
    let d = after
        .link_departures
        .clone()
        .expect("a memnode with a link reports its replies' departures");
    let replies = after.tenants[0].queue.as_ref().unwrap().total.requests;
    assert!(
        d.replies_held > 0 && d.replies_held <= replies && d.mean_error_us.is_finite(),
        "{d:?} for {replies} requests at the link"
    );
}

/// With the read lane busy for about a quarter of a second, a prefetch and a demand read of one
/// session queued in that order, and a write-back sent meanwhile: the order they finish in.
fn queued_order(server: &TestServer, s: gleaner_proto::SessionInfo) -> Vec<&'static str> {
    let conn = || server.attach(s.session_id, s.session_key).unwrap();
    let ids: Vec<u64> = (0..64).collect();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut busy = conn();
    let busy_ids = ids.clone();
    let blocker = std::thread::spawn(move || busy.read_pages(&busy_ids).map(|b| b.len()));
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut handles = Vec::new();
    for (name, delay) in [("prefetch", 0), ("demand", 20), ("writeback", 40)] {
        let (mut c, order, ids) = (conn(), order.clone(), ids[..8].to_vec());
        handles.push(std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay));
            match name {
                "writeback" => write(&mut c, &pages(100, 8)).unwrap(),
                "prefetch" => {
                    let p = c.start_prefetch(&ids, u32::MAX).unwrap();
                    c.finish_read(p, &ids).unwrap();
                }
                _ => assert_eq!(c.read_pages(&ids).unwrap().len(), 8),
            }
            order.lock().unwrap().push(name);
        }));
    }
    assert_eq!(blocker.join().unwrap().unwrap(), 64);
    for h in handles {
        h.join().unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// A memnode with a 1 MiB/s link (a 64-page read holds it for a quarter of a second), and a
/// session holding pages 0..64.
fn slow_link(schedule: gleaner_memnode::Schedule) -> (TestServer, Connection) {
    let mut config = config(20_000, &[]);
    config.bandwidth_bytes_per_s = Some(1 << 20);
    config.schedule = schedule;
    let server = TestServer::start_with(config);
    let mut first = server.connect();
    write(&mut first, &pages(0, 64)).unwrap();
    (server, first)
}

/// Within a session, reads go in priority order at the link: a prefetch and a demand read queued
/// in that order are served demand first; a write-back sent while both wait comes in on the
/// link's other direction and is stored before either. A prefetch that waited past its deadline
/// is dropped (`Error{Late}`, nothing read) and the same pages read on demand afterwards are
/// intact; the stats count it per tenant, with each class's queue.
#[test]
fn a_session_classes_go_in_priority_order_and_late_prefetches_are_dropped() {
    let (server, first) = slow_link(gleaner_memnode::Schedule::Fair);
    let s = first.session();
    assert_eq!(
        queued_order(&server, s),
        ["writeback", "demand", "prefetch"]
    );

    // A prefetch with a 1 ms deadline behind another quarter-second read: dropped.
    let conn = || server.attach(s.session_id, s.session_key).unwrap();
    let ids: Vec<u64> = (0..64).collect();
    let mut busy = conn();
    let busy_ids = ids.clone();
    let blocker = std::thread::spawn(move || busy.read_pages(&busy_ids).map(|b| b.len()));
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut c = conn();
    let p = c.start_prefetch(&ids[..8], 1000).unwrap();
    let e = c.finish_read(p, &ids[..8]).unwrap_err();
    assert_eq!(e.server_code(), Some(ErrorCode::Late), "{e}");
    assert_eq!(blocker.join().unwrap().unwrap(), 64);
    // Nothing was lost: the same pages on demand.
    assert_pages(&mut c, &pages(0, 8));
    let stats = server.local_stats();
    let q = stats.tenants[0].queue.clone().unwrap();
    assert_eq!(q.prefetches_dropped, 1);
    assert_eq!(q.classes["prefetch"].requests, 1);
    // The first write and the queued one.
    assert_eq!(q.classes["writeback"].requests, 2);
    assert!(q.classes["demand"].requests >= 3, "{q:?}");
    // Reads waited behind the blockers; write-backs had their direction to themselves.
    assert!(
        q.classes["demand"].wait_mean_us > q.classes["writeback"].wait_mean_us,
        "{q:?}"
    );
}

/// `--schedule fifo` (the baseline): the same reads are served in arrival order (the write-back,
/// on the other direction, still first), and a prefetch past its deadline is still served.
#[test]
fn a_fifo_link_serves_in_arrival_order_and_drops_nothing() {
    let (server, first) = slow_link(gleaner_memnode::Schedule::Fifo);
    let s = first.session();
    assert_eq!(
        queued_order(&server, s),
        ["writeback", "prefetch", "demand"]
    );
    let mut busy = server.attach(s.session_id, s.session_key).unwrap();
    let blocker = std::thread::spawn(move || {
        busy.read_pages(&(0..64).collect::<Vec<_>>())
            .map(|b| b.len())
    });
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut c = server.attach(s.session_id, s.session_key).unwrap();
    let ids: Vec<u64> = (0..8).collect();
    let p = c.start_prefetch(&ids, 1000).unwrap();
    assert_eq!(c.finish_read(p, &ids).unwrap().len(), 8);
    assert_eq!(blocker.join().unwrap().unwrap(), 64);
    assert_eq!(
        server.local_stats().tenants[0]
            .queue
            .clone()
            .unwrap()
            .prefetches_dropped,
        0
    );
}

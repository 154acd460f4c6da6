//! The session table: sessions are created at a handshake, attached to by further connections,
//! ended by `Goodbye`, or released by the reaper once their lease after the last connection runs
//! out.
//!
//! The table lock guards only the map and each session's live-connection count; page data lives
//! behind each session's own `RwLock` (see `store.rs`), so no table-wide lock is held while pages
//! are copied, and never during socket I/O.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use gleaner_proto::{random_bytes, SessionKey};

use crate::slabs::{GrantError, SlabUsage, Slabs};
use crate::store::{Capacity, Released, SessionPages};

/// Longest client name kept (longer names are cut at a character boundary): names end up in
/// logs and in the stats document, whose size is bounded by the protocol.
const MAX_CLIENT_NAME: usize = 128;

/// One session: a namespace of pages plus its counters.
#[derive(Debug)]
pub(crate) struct Session {
    id: u64,
    key: SessionKey,
    /// Whose token opened it: its pages count against this tenant's quota.
    tenant: Arc<Tenant>,
    client: String,
    created: Instant,
    store: RwLock<SessionPages>,
    /// Shared-memory slabs granted to the session's client (same host only).
    slabs: Mutex<Slabs>,
    /// Frame bytes received on the session's connections (after the handshake).
    pub(crate) bytes_in: AtomicU64,
    /// Frame bytes sent on the session's connections (after the handshake).
    pub(crate) bytes_out: AtomicU64,
    /// Requests served.
    pub(crate) requests: AtomicU64,
}

/// A tenant: its name, token, weight, and the quota its sessions draw on (the memnode's whole
/// capacity for the tenant of the main token).
pub(crate) struct Tenant {
    pub(crate) name: String,
    pub(crate) token: gleaner_proto::Token,
    pub(crate) weight: u32,
    pub(crate) capacity: Arc<Capacity>,
    /// What its requests met at the link (`--bandwidth`).
    pub(crate) queue: crate::sched::TenantQueue,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("weight", &self.weight)
            .finish()
    }
}

impl Session {
    /// The capacity its pages draw on: its tenant's quota.
    pub(crate) fn capacity(&self) -> &Capacity {
        &self.tenant.capacity
    }

    /// Its tenant.
    pub(crate) fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The session id (never 0).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The attach key.
    pub(crate) fn key(&self) -> SessionKey {
        self.key
    }

    /// The name the creating client gave.
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    /// How long ago the session was created.
    pub(crate) fn age(&self) -> Duration {
        self.created.elapsed()
    }

    /// Shared access to the pages (reads, stats).
    pub(crate) fn store(&self) -> RwLockReadGuard<'_, SessionPages> {
        // A panic while holding the lock aborts the shipped binaries (their panic hook,
        // `gleaner_sys::panic`); in tests, every store operation leaves the store consistent
        // before it can panic.
        self.store.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive access to the pages (writes, frees).
    pub(crate) fn store_mut(&self) -> RwLockWriteGuard<'_, SessionPages> {
        self.store.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops all pages and slabs and marks the session ended; returns what was released
    /// (stored pages plus slab pages, and the bytes of capacity they held).
    pub(crate) fn end(&self, capacity: &Capacity) -> Released {
        // The store's lock first: a grant checks it (under the same order) for an ended session.
        let mut store = self.store_mut();
        let stored = store.end(capacity);
        stored + self.slabs().end(capacity)
    }

    fn slabs(&self) -> MutexGuard<'_, Slabs> {
        self.slabs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Grants the session a shared-memory slab of up to `pages` pages; `Ok(None)` if the session
    /// has ended. Returns the slab's number, its pages and a descriptor to send to the client.
    pub(crate) fn grant(
        &self,
        pages: u64,
        capacity: &Capacity,
    ) -> Result<Option<(u32, u64, std::os::fd::OwnedFd)>, GrantError> {
        let store = self.store();
        if store.is_ended() {
            return Ok(None);
        }
        let granted = self.slabs().grant(pages, capacity)?;
        drop(store);
        Ok(Some(granted))
    }

    /// The session's slabs: how many, their pages and bytes, the memory they occupy.
    pub(crate) fn slab_usage(&self) -> SlabUsage {
        self.slabs().usage()
    }
}

/// Why a connection could not attach to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachError {
    /// No session with that id (never existed, ended, or released by its lease).
    Unknown,
    /// The session exists but the key is wrong.
    WrongKey,
}

struct Entry {
    session: Arc<Session>,
    /// Connections attached now.
    live: u32,
    /// When `live` last dropped to 0.
    idle_since: Option<Instant>,
}

/// A point-in-time view of one session for the stats document.
pub(crate) struct SessionView {
    /// The session.
    pub session: Arc<Session>,
    /// Connections attached now.
    pub live: u32,
    /// How long it has had no connection, if it has none.
    pub idle_for: Option<Duration>,
}

/// All live sessions.
pub(crate) struct SessionTable {
    entries: Mutex<HashMap<u64, Entry>>,
    hash_seed: u64,
}

impl SessionTable {
    /// An empty table.
    pub(crate) fn new() -> Self {
        SessionTable {
            entries: Mutex::new(HashMap::new()),
            hash_seed: u64::from_le_bytes(random_bytes()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates a session with a random id and key, with one connection attached.
    pub(crate) fn create(&self, client: &str, tenant: &Arc<Tenant>) -> Arc<Session> {
        self.insert(client, tenant, None, 1)
    }

    /// Adds a session of `tenant` with a random id and key, holding `store` (an empty one when
    /// `None`), with `live` connections attached (none: its lease starts now).
    fn insert(
        &self,
        client: &str,
        tenant: &Arc<Tenant>,
        store: Option<SessionPages>,
        live: u32,
    ) -> Arc<Session> {
        let mut entries = self.lock();
        let id = loop {
            let id = u64::from_le_bytes(random_bytes());
            if id != 0 && !entries.contains_key(&id) {
                break id;
            }
        };
        let session = Arc::new(Session {
            id,
            key: random_bytes(),
            tenant: tenant.clone(),
            client: truncate(client, MAX_CLIENT_NAME).to_string(),
            created: Instant::now(),
            store: RwLock::new(store.unwrap_or_else(|| SessionPages::new(self.hash_seed ^ id))),
            slabs: Mutex::new(Slabs::default()),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        entries.insert(
            id,
            Entry {
                session: Arc::clone(&session),
                live,
                idle_since: (live == 0).then(Instant::now),
            },
        );
        session
    }

    /// A new session of `parent`'s tenant holding `parent`'s pages as they are now (see
    /// [`SessionPages::fork`]), with no connection yet: its lease runs until one attaches.
    pub(crate) fn fork(
        &self,
        parent: &Arc<Session>,
        client: &str,
    ) -> Result<Option<Arc<Session>>, crate::store::Full> {
        // The copy is made under the parent's read lock only (never the table's).
        let store = {
            let parent_store = parent.store();
            if parent_store.is_ended() {
                return Ok(None);
            }
            parent_store.fork(parent.capacity())?
        };
        Ok(Some(self.insert(client, &parent.tenant, Some(store), 0)))
    }

    /// Attaches one more connection to session `id` if `key` is its key (compared in constant
    /// time).
    pub(crate) fn attach(
        &self,
        id: u64,
        key: &SessionKey,
        tenant: &Arc<Tenant>,
    ) -> Result<Arc<Session>, AttachError> {
        let mut entries = self.lock();
        let entry = entries.get_mut(&id).ok_or(AttachError::Unknown)?;
        // Another tenant's token never opens a session, even with its key.
        if !keys_equal(&entry.session.key, key) || !Arc::ptr_eq(&entry.session.tenant, tenant) {
            return Err(AttachError::WrongKey);
        }
        entry.live += 1;
        entry.idle_since = None;
        Ok(Arc::clone(&entry.session))
    }

    /// A connection of `session` closed without `Goodbye`: when it was the last, the lease starts.
    pub(crate) fn detach(&self, session: &Arc<Session>) {
        let mut entries = self.lock();
        if let Some(entry) = entries.get_mut(&session.id) {
            if Arc::ptr_eq(&entry.session, session) {
                entry.live = entry.live.saturating_sub(1);
                if entry.live == 0 {
                    entry.idle_since = Some(Instant::now());
                }
            }
        }
    }

    /// Removes `session` from the table (for `Goodbye`); false if it was already gone. The caller
    /// releases its pages with [`Session::end`].
    pub(crate) fn remove(&self, session: &Arc<Session>) -> bool {
        let mut entries = self.lock();
        match entries.get(&session.id) {
            Some(e) if Arc::ptr_eq(&e.session, session) => {
                entries.remove(&session.id);
                true
            }
            _ => false,
        }
    }

    /// Removes and returns every session that has had no connection for at least `lease`.
    pub(crate) fn take_expired(&self, lease: Duration) -> Vec<Arc<Session>> {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.lock().retain(|_, e| {
            let due = e.live == 0
                && e.idle_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= lease);
            if due {
                expired.push(Arc::clone(&e.session));
            }
            !due
        });
        expired
    }

    /// Removes and returns every session (at shutdown).
    pub(crate) fn take_all(&self) -> Vec<Arc<Session>> {
        self.lock().drain().map(|(_, e)| e.session).collect()
    }

    /// A view of every session, for stats.
    pub(crate) fn snapshot(&self) -> Vec<SessionView> {
        let now = Instant::now();
        self.lock()
            .values()
            .map(|e| SessionView {
                session: Arc::clone(&e.session),
                live: e.live,
                idle_for: e.idle_since.map(|t| now.saturating_duration_since(t)),
            })
            .collect()
    }
}

/// Compares two session keys in constant time.
fn keys_equal(a: &SessionKey, b: &SessionKey) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// `s` cut to at most `max` bytes at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> Arc<Tenant> {
        Arc::new(Tenant {
            name: name.into(),
            token: [0; 32],
            weight: 1,
            capacity: Arc::new(Capacity::new(1 << 20)),
            queue: Default::default(),
        })
    }

    #[test]
    fn attach_detach_and_lease_expiry() {
        let t = SessionTable::new();
        let (a, b) = (tenant("a"), tenant("b"));
        let s = t.create("test", &a);
        assert_ne!(s.id(), 0);
        assert_eq!(
            t.attach(s.id(), &s.key(), &b).unwrap_err(),
            AttachError::WrongKey,
            "another tenant's token does not open the session"
        );
        assert_eq!(
            t.attach(s.id(), &[0; 16], &a).unwrap_err(),
            AttachError::WrongKey
        );
        assert_eq!(
            t.attach(s.id() ^ 1, &s.key(), &a).unwrap_err(),
            AttachError::Unknown
        );
        let again = t.attach(s.id(), &s.key(), &a).unwrap();
        assert!(Arc::ptr_eq(&s, &again));
        t.detach(&s);
        assert!(t.take_expired(Duration::ZERO).is_empty(), "one still live");
        t.detach(&s);
        assert!(t.take_expired(Duration::from_secs(60)).is_empty());
        let gone = t.take_expired(Duration::ZERO);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            t.attach(s.id(), &s.key(), &a).unwrap_err(),
            AttachError::Unknown
        );
    }

    #[test]
    fn long_client_names_are_cut_at_a_char_boundary() {
        let t = SessionTable::new();
        let s = t.create(&"é".repeat(200), &tenant("a"));
        assert!(s.client().len() <= MAX_CLIENT_NAME);
        assert!(s.client().chars().all(|c| c == 'é'));
        assert!(t.remove(&s));
        assert!(!t.remove(&s));
    }
}

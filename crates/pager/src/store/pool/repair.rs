//! The pool's repair thread: it pings every member each second (is it draining? still there?),
//! gives each extent that lost a replica, or sits on a draining member, a new member and copies
//! its pages there from the others, and ends the session on drained members. See the parent
//! module for why the copy is race-free with write-backs going on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gleaner_proto::{ErrorCode, PageBatch, MAX_BATCH_PAGES};

use super::{members_of, pack, Pool, EXTENT_PAGES};
use crate::store::socket::Link;
use crate::store::StoreError;

/// How long re-replication waits for the write-backs staged under an extent's old placement.
const REPAIR_DRAIN: Duration = Duration::from_secs(2);

impl Pool {
    /// Pings every live member on its control connection: one that is draining says so; one
    /// whose connection broke is reconnected, or found lost (and its extents repaired) even
    /// while the program asks nothing of it.
    pub(super) fn check_members(&self) {
        for (m, member) in self.members.iter().enumerate() {
            if !self.alive(m) {
                continue;
            }
            let lost = member.session.with_control(|c| match c.ping() {
                Ok(()) => None,
                Err(e) if e.server_code() == Some(ErrorCode::Draining) => {
                    if !member.draining.swap(true, Ordering::AcqRel) {
                        log::warn!(
                            "memnode {} is draining: moving its extents to the other memnodes",
                            self.name(m)
                        );
                    }
                    None
                }
                Err(e) if e.is_transient() => match member.session.reattach(&e) {
                    Ok(fresh) => {
                        *c = fresh;
                        None
                    }
                    Err(lost) => Some(lost.to_string()),
                },
                Err(e) => Some(e.to_string()),
            });
            if let Some(Some(why)) = lost {
                self.lose(m, &why);
            }
        }
    }

    /// Ends the session on every draining member that no longer holds any extent.
    pub(super) fn release_drained(&self) {
        for (m, member) in self.members.iter().enumerate() {
            if !self.alive(m) || !self.draining(m) {
                continue;
            }
            let holds = |w: &AtomicU64| members_of(w.load(Ordering::Acquire)).any(|x| x == m);
            if self.placement.iter().any(holds) || self.filling.iter().any(holds) {
                continue;
            }
            *member.lost_because.lock().expect("lost lock") =
                "drained: its extents moved to the other memnodes".into();
            member.alive.store(false, Ordering::Release);
            member.drained.store(true, Ordering::Release);
            member.session.close();
            log::warn!(
                "memnode {} drained: this program no longer uses it",
                self.name(m)
            );
        }
    }
}

/// The repair thread: every second (and at once when a member is lost), pings each member
/// (draining? still there?), repairs every extent that lost a replica or sits on a draining
/// member, and ends the session on each draining member that no longer holds any extent.
pub(super) fn run(pool: &Pool) {
    let mut links: Vec<Option<Link>> = (0..pool.members.len()).map(|_| None).collect();
    loop {
        {
            let (flag, cv) = &pool.wake;
            let mut woken = flag.lock().expect("wake lock");
            if !*woken {
                woken = cv
                    .wait_timeout(woken, Duration::from_secs(1))
                    .expect("wake lock")
                    .0;
            }
            *woken = false;
        }
        if pool.stop.load(Ordering::Acquire) {
            return;
        }
        pool.check_members();
        for extent in 0..pool.placement.len() {
            if pool.stop.load(Ordering::Acquire) {
                return;
            }
            let word = pool.placement[extent].load(Ordering::Acquire);
            let pending = pool.filling[extent].load(Ordering::Acquire) != 0;
            if word == 0
                || (!pending && members_of(word).all(|m| pool.alive(m) && !pool.draining(m)))
            {
                continue;
            }
            if let Err(e) = repair_extent(pool, extent, &mut links) {
                log::warn!("re-replicating extent {extent}: {e}; trying again later");
            }
        }
        pool.release_drained();
    }
}

/// Repairs `extent`: replaces its lost and draining members with new ones, copies its pages to
/// them from the others, then lets the new members serve reads and the old ones go. A copy that
/// fails is taken up again on the next round (the new members keep taking writes meanwhile).
fn repair_extent(pool: &Pool, extent: usize, links: &mut [Option<Link>]) -> Result<(), StoreError> {
    let word = pool.placement[extent].load(Ordering::Acquire);
    let members: Vec<usize> = members_of(word).collect();
    let filling: Vec<usize> = members_of(pool.filling[extent].load(Ordering::Acquire)).collect();
    let usable = |m: usize| pool.alive(m) && !pool.draining(m);
    let keep: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&m| usable(m) && !filling.contains(&m))
        .collect();
    let leaving: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&m| pool.alive(m) && pool.draining(m) && !filling.contains(&m))
        .collect();
    let mut targets: Vec<usize> = filling.iter().copied().filter(|&m| usable(m)).collect();
    if !filling.is_empty() && targets.is_empty() {
        // Every new member went away before it was filled: start over next round.
        pool.filling[extent].store(0, Ordering::Release);
        return Ok(());
    }
    let needs_new = members.iter().any(|&m| !pool.alive(m)) || !leaving.is_empty();
    if filling.is_empty() && needs_new {
        if keep.is_empty() && leaving.is_empty() {
            // Nothing to copy from: a read of one of its pages says which memnodes were lost.
            return Ok(());
        }
        let added = pool.choose(pool.replicas.saturating_sub(keep.len()), &members);
        // During the copy the extent is on the kept members, the leaving ones (still read and
        // written, so they stay current) and the new ones. The new ones take writes at once but
        // serve no read until they hold every page: marked filling before they appear in the
        // placement, so no reader sees one without the other.
        let mut during = keep.clone();
        during.extend_from_slice(&leaving);
        during.extend_from_slice(&added);
        pool.filling[extent].store(pack(&added), Ordering::Release);
        if pool.placement[extent]
            .compare_exchange(word, pack(&during), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            pool.filling[extent].store(0, Ordering::Release);
            return Ok(()); // placed anew meanwhile: the next round looks again
        }
        for &m in &added {
            pool.members[m].extents.fetch_add(1, Ordering::Relaxed);
        }
        for m in members.iter().filter(|m| !during.contains(m)) {
            pool.members[*m].extents.fetch_sub(1, Ordering::Relaxed);
        }
        targets = added;
    }
    if !targets.is_empty() {
        let mut sources = keep.clone();
        sources.extend_from_slice(&leaving);
        copy_extent(pool, extent, &sources, &targets, links)?;
    }
    // The new members serve reads now; the lost and the leaving ones leave the placement (the
    // leaving ones only where someone else holds the pages).
    let word = pool.placement[extent].load(Ordering::Acquire);
    let remaining: Vec<usize> = members_of(word).filter(|&m| usable(m)).collect();
    let current: Vec<usize> = members_of(word).collect();
    if !remaining.is_empty()
        && remaining != current
        && pool.placement[extent]
            .compare_exchange(word, pack(&remaining), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        for m in current.into_iter().filter(|m| !remaining.contains(m)) {
            pool.members[m].extents.fetch_sub(1, Ordering::Relaxed);
        }
    } else if remaining.is_empty() && !leaving.is_empty() {
        log::warn!(
            "extent {extent} cannot leave {}: no other memnode can take it",
            pool.name(leaving[0])
        );
    }
    pool.filling[extent].store(0, Ordering::Release);
    Ok(())
}

/// Copies the pages of `extent` that have a far copy from one of `sources` to every member of
/// `targets`, again for pages whose version moved during the copy.
fn copy_extent(
    pool: &Pool,
    extent: usize,
    sources: &[usize],
    targets: &[usize],
    links: &mut [Option<Link>],
) -> Result<(), StoreError> {
    // Write-backs staged under the old placement did not go to the new members: wait for them,
    // so that the copy below sees their versions.
    let deadline = Instant::now() + REPAIR_DRAIN;
    while pool.inflight[extent].load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let copy_started = Instant::now();
    let first = extent as u64 * EXTENT_PAGES;
    let end = (first + EXTENT_PAGES).min(pool.versions.len() as u64);
    let mut todo: Vec<u64> = (first..end).filter(|&p| pool.version(p) != 0).collect();
    let mut rounds = 0;
    while !todo.is_empty() {
        rounds += 1;
        if rounds > 8 {
            // The new members keep taking writes and serve no reads; the next round goes on.
            return Err(StoreError::Lost(format!(
                "{} pages of the extent kept changing during the copy",
                todo.len()
            )));
        }
        let mut copied: Vec<(u64, u64)> = Vec::with_capacity(todo.len());
        for chunk in todo.chunks(MAX_BATCH_PAGES) {
            copy_pages(pool, chunk, sources, targets, links, &mut copied)?;
        }
        todo = copied
            .iter()
            .filter(|&&(p, v)| pool.version(p) != 0 && pool.version(p) != v)
            .map(|&(p, _)| p)
            .collect();
    }
    pool.repair_ns
        .fetch_add(copy_started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    pool.extents_repaired.fetch_add(1, Ordering::Relaxed);
    log::info!(
        "extent {extent} copied onto {}",
        targets
            .iter()
            .map(|&m| pool.name(m))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// Copies `pages` from one of `sources` to every member of `targets`, recording each page's
/// copied version in `copied`. A page no longer held (discarded meanwhile) is skipped.
fn copy_pages(
    pool: &Pool,
    pages: &[u64],
    sources: &[usize],
    targets: &[usize],
    links: &mut [Option<Link>],
    copied: &mut Vec<(u64, u64)>,
) -> Result<(), StoreError> {
    let mut blobs: Vec<(u64, u64, Vec<u8>)> = Vec::with_capacity(pages.len());
    let mut read = false;
    for &s in sources {
        if !pool.alive(s) {
            continue;
        }
        let link = match link_to(pool, s, links) {
            Some(l) => l,
            None => continue,
        };
        blobs.clear();
        let r = link.send_read(pages, &mut 0).and_then(|p| {
            link.finish_read(p, pages, &mut 0, &mut |_, page, version, blob| {
                blobs.push((page, version, blob.to_vec()));
                Ok(())
            })
        });
        match r {
            Ok(()) => {
                read = true;
                break;
            }
            // A page discarded since the copy started: copy the others one by one.
            Err(StoreError::Lost(why)) if why.contains("no longer holds") => {
                for &page in pages {
                    let r = link.send_read(&[page], &mut 0).and_then(|p| {
                        link.finish_read(p, &[page], &mut 0, &mut |_, page, version, blob| {
                            blobs.push((page, version, blob.to_vec()));
                            Ok(())
                        })
                    });
                    if let Err(StoreError::Lost(why)) = r {
                        if !why.contains("no longer holds") {
                            return Err(StoreError::Lost(why));
                        }
                    }
                }
                read = true;
                break;
            }
            Err(StoreError::Lost(why)) => {
                links[s] = None;
                pool.lose(s, &why);
            }
            Err(e) => return Err(e),
        }
    }
    if !read {
        return Err(StoreError::Lost(format!(
            "no replica left to copy from: {}",
            pool.lost_of(sources.iter().copied())
        )));
    }
    for &t in targets {
        if !pool.alive(t) {
            continue;
        }
        let Some(link) = link_to(pool, t, links) else {
            continue;
        };
        PageBatch::begin(link.batch());
        for (page, version, blob) in &blobs {
            PageBatch::push(link.batch(), *page, *version, blob);
        }
        match link.write_batch(None) {
            Ok(()) => {
                pool.members[t]
                    .pages_written
                    .fetch_add(blobs.len() as u64, Ordering::Relaxed);
            }
            Err(StoreError::Lost(why)) => {
                links[t] = None;
                pool.lose(t, &why);
            }
            Err(e) => return Err(e),
        }
    }
    pool.pages_repaired
        .fetch_add(blobs.len() as u64, Ordering::Relaxed);
    copied.extend(blobs.iter().map(|(p, v, _)| (*p, *v)));
    Ok(())
}

/// The repair thread's link to member `m`, opened on first use (None if it cannot be).
fn link_to<'a>(pool: &Pool, m: usize, links: &'a mut [Option<Link>]) -> Option<&'a mut Link> {
    if links[m].is_none() {
        match Link::open(&pool.members[m].session) {
            Ok(l) => links[m] = Some(l),
            Err(e) => {
                pool.lose(m, &e.to_string());
                return None;
            }
        }
    }
    links[m].as_mut()
}

//! The managed arena: one far-memory region reserved at start-up (registered with userfaultfd
//! once), from which the program's heap and anonymous mappings are carved page by page.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

use gleaner_pager::{Region, PAGE_SIZE};

use crate::lock::SpinLock;
use crate::retain::Retained;
use crate::wipe::WipeRanges;

/// First-fit allocator of page ranges inside the arena (free ranges keyed by first page).
struct PageRanges {
    free: BTreeMap<usize, usize>,
}

impl PageRanges {
    fn take(&mut self, pages: usize) -> Option<usize> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= pages)?;
        self.free.remove(&start);
        if len > pages {
            self.free.insert(start + pages, len - pages);
        }
        Some(start)
    }

    /// Takes exactly `[start, start+pages)` if it is entirely free (for growing in place).
    fn take_at(&mut self, start: usize, pages: usize) -> bool {
        let Some((&s, &len)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if s + len < start + pages {
            return false;
        }
        self.free.remove(&s);
        if s < start {
            self.free.insert(s, start - s);
        }
        if s + len > start + pages {
            self.free.insert(start + pages, s + len - start - pages);
        }
        true
    }

    fn give(&mut self, mut start: usize, mut pages: usize) {
        if let Some((&s, &len)) = self.free.range(..start).next_back() {
            if s + len == start {
                self.free.remove(&s);
                start = s;
                pages += len;
            }
        }
        if let Some(&len) = self.free.get(&(start + pages)) {
            self.free.remove(&(start + pages));
            pages += len;
        }
        self.free.insert(start, pages);
    }
}

/// The arena: the region and its free page ranges.
pub(crate) struct Arena {
    /// The region: the process's own, or in a fork child that pages from its parent's
    /// snapshot, the child's (leaked, like the first: neither is ever dropped).
    region: AtomicPtr<Region>,
    ranges: SpinLock<PageRanges>,
    /// Freed big blocks kept for reuse (`retain.rs`), in pages from the arena's start.
    retained: SpinLock<Retained>,
    /// Pages a fork child must see as zeros (`MADV_WIPEONFORK`, `wipe.rs`).
    wipe: SpinLock<WipeRanges>,
}

static ARENA: OnceLock<Arena> = OnceLock::new();
/// Set once the program maps a file or shared memory over managed memory: until then no page
/// can be surrendered, and the interposers skip looking for such pages.
static SURRENDERED_ANY: AtomicBool = AtomicBool::new(false);
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

/// Installs the arena (once, from the constructor); freed big blocks of up to `retain` bytes
/// in all are kept for reuse, each for at most `retain_ms` milliseconds.
pub(crate) fn install(region: Region, retain: usize, retain_ms: u64) {
    let pages = region.len() / PAGE_SIZE;
    let (base, len) = (region.as_ptr() as usize, region.len());
    let mut free = BTreeMap::new();
    free.insert(0, pages);
    if ARENA
        .set(Arena {
            region: AtomicPtr::new(Box::into_raw(Box::new(region))),
            ranges: SpinLock::new(PageRanges { free }),
            retained: SpinLock::new(Retained::new(retain / PAGE_SIZE, retain_ms)),
            wipe: SpinLock::new(WipeRanges::default()),
        })
        .is_ok()
    {
        crate::dump::exclude(base, len);
        BASE.store(base, Ordering::Release);
        END.store(base + len, Ordering::Release);
    }
}

/// The arena, once installed.
pub(crate) fn get() -> Option<&'static Arena> {
    ARENA.get()
}

/// Whether `addr` is managed memory.
pub(crate) fn contains(addr: usize) -> bool {
    addr >= BASE.load(Ordering::Acquire) && addr < END.load(Ordering::Acquire)
}

impl Arena {
    /// The region this process pages with.
    pub(crate) fn region(&self) -> &'static Region {
        // SAFETY: the pointer comes from `Box::into_raw` and its box is never freed (a region
        // replaced in a fork child is leaked), so it is valid for the rest of the process.
        unsafe { &*self.region.load(Ordering::Acquire) }
    }

    /// In a fork child: pages with `region` (the child's own) from now on. The parent's, as
    /// the child inherited it, is leaked.
    pub(crate) fn replace_region(&self, region: Region) {
        self.region
            .store(Box::into_raw(Box::new(region)), Ordering::Release);
    }

    fn base(&self) -> usize {
        self.region().as_ptr() as usize
    }

    /// Carves `len` bytes (rounded up to pages); the pages read as zeros. None if the arena is full.
    pub(crate) fn carve(&self, len: usize) -> Option<usize> {
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        let first = self.ranges.with(|r| r.take(pages))?;
        self.include_in_dumps(first + pages);
        Some(self.base() + first * PAGE_SIZE)
    }

    /// Extends the carved range `[addr, addr+old)` to `new` bytes in place, if the pages after it
    /// are free.
    pub(crate) fn grow_in_place(&self, addr: usize, old: usize, new: usize) -> bool {
        let (old_p, new_p) = (old.div_ceil(PAGE_SIZE), new.div_ceil(PAGE_SIZE));
        let first = (addr - self.base()) / PAGE_SIZE;
        let grown = new_p <= old_p
            || self
                .ranges
                .with(|r| r.take_at(first + old_p, new_p - old_p));
        if grown {
            self.include_in_dumps(first + new_p);
        }
        grown
    }

    /// Pages up to `end` (from the arena's start) are carved: core dumps include them
    /// (`dump.rs`).
    fn include_in_dumps(&self, end: usize) {
        let region = self.region();
        crate::dump::include_up_to(region.as_ptr() as usize, region.len() / PAGE_SIZE, end);
    }

    /// Discards `[addr, addr+len)` (page-aligned; rounded up to pages) and returns it to the free
    /// ranges. In a fork child without a pager the pages are simply dropped.
    pub(crate) fn release(&self, addr: usize, len: usize) {
        let pages = len.div_ceil(PAGE_SIZE);
        self.discard(addr, pages * PAGE_SIZE);
        let first = (addr - self.base()) / PAGE_SIZE;
        self.wipe.with(|w| w.clear(first, pages));
        self.ranges.with(|r| r.give(first, pages));
    }

    /// `MADV_WIPEONFORK` (`wipe` true) or `MADV_KEEPONFORK` on `[addr, addr+len)`
    /// (page-aligned): whether a fork child sees those pages as zeros (`wipe.rs`).
    pub(crate) fn advise_fork(&self, addr: usize, len: usize, wipe: bool) {
        let (first, pages) = ((addr - self.base()) / PAGE_SIZE, len.div_ceil(PAGE_SIZE));
        self.wipe.with(|w| {
            if wipe {
                w.mark(first, pages)
            } else {
                w.clear(first, pages)
            }
        });
    }

    /// `[old, old+len)` moved to `new` (`mremap`): the marks go with the pages, as the kernel's
    /// flag goes with its mapping.
    pub(crate) fn move_fork_advice(&self, old: usize, len: usize, new: usize) {
        let base = self.base();
        let (from, to) = ((old - base) / PAGE_SIZE, (new - base) / PAGE_SIZE);
        self.wipe.with(|w| {
            for (first, pages) in w.within(from, len.div_ceil(PAGE_SIZE)) {
                w.mark(first - from + to, pages);
            }
        });
    }

    /// `[addr, addr+old)` grew in place to `new` bytes: if its last page is marked, the new
    /// pages are too (the kernel's mapping grows with its flags).
    pub(crate) fn grow_fork_advice(&self, addr: usize, old: usize, new: usize) {
        let first = (addr - self.base()) / PAGE_SIZE;
        let (old_p, new_p) = (old.div_ceil(PAGE_SIZE), new.div_ceil(PAGE_SIZE));
        self.wipe.with(|w| {
            if old_p > 0 && new_p > old_p && !w.within(first + old_p - 1, 1).is_empty() {
                w.mark(first + old_p, new_p - old_p);
            }
        });
    }

    /// In a fork child, before the program goes on: discards the pages the program marked
    /// `MADV_WIPEONFORK` (the marks stay, for the child's own children).
    pub(crate) fn wipe_for_fork_child(&self) {
        let base = self.base();
        for (first, pages) in self.wipe.with(|w| w.all()) {
            self.discard(base + first * PAGE_SIZE, pages * PAGE_SIZE);
        }
    }

    /// Locks the `MADV_WIPEONFORK` marks (fork prepare hook, in every process with managed
    /// memory: the child reads them).
    pub(crate) fn lock_fork_advice(&self) {
        self.wipe.lock();
    }

    /// Unlocks them after fork, in parent or child.
    ///
    /// # Safety
    /// Only after [`Arena::lock_fork_advice`].
    pub(crate) unsafe fn unlock_fork_advice(&self) {
        // SAFETY: forwarded contract.
        unsafe { self.wipe.unlock() };
    }

    /// Keeps the freed big block `[addr, addr+len)` (page-aligned) for reuse by [`Arena::reuse`]
    /// as it is, without a discard; the kept blocks that no longer fit the bounds (`retain.rs`)
    /// are released.
    pub(crate) fn retire(&self, addr: usize, len: usize) {
        let first = (addr - self.base()) / PAGE_SIZE;
        let gone = self
            .retained
            .with(|r| r.keep(first, len.div_ceil(PAGE_SIZE), now_ms()));
        self.release_kept(gone);
    }

    /// `len` bytes (rounded up to pages) from the freed big blocks kept, if one is large
    /// enough: their contents are whatever the program left there, not zeros.
    pub(crate) fn reuse(&self, len: usize) -> Option<usize> {
        let pages = len.div_ceil(PAGE_SIZE).max(1);
        let (first, gone) = self.retained.with(|r| r.take(pages, now_ms()));
        self.release_kept(gone);
        let offset = first? * PAGE_SIZE;
        if crate::has_pager() {
            let _in = crate::InPager::enter();
            self.region().reuse(offset, pages * PAGE_SIZE);
        }
        Some(self.base() + offset)
    }

    /// Releases the freed big blocks kept longest, idle longer than their reuses are seen to
    /// wait (`Retained::give_up`), until `pages` pages or none is left (reclaim asks: the budget
    /// is short). Returns the pages released.
    pub(crate) fn release_idle(&self, pages: usize) -> usize {
        let gone = self.retained.with(|r| r.give_up(pages, now_ms()));
        let released = gone.iter().map(|&(_, n)| n).sum();
        self.release_kept(gone);
        released
    }

    fn release_kept(&self, ranges: Vec<(usize, usize)>) {
        for (first, pages) in ranges {
            self.release(self.base() + first * PAGE_SIZE, pages * PAGE_SIZE);
        }
    }

    /// Forgets the contents of `[addr, addr+len)` (page-aligned) without releasing the range;
    /// pages the program had mapped a file or shared memory over are managed memory again.
    pub(crate) fn discard(&self, addr: usize, len: usize) {
        if crate::has_pager() {
            let _in = crate::InPager::enter();
            self.region().discard(addr - self.base(), len);
        } else if SURRENDERED_ANY.load(Ordering::Acquire) {
            // The range may hold the program's own mapping (this process's parent placed it
            // before the fork): put fresh anonymous memory back, as the pager would.
            map_fresh(addr, len);
        } else {
            // SAFETY: the range is inside the arena, which in a fork child without a pager is
            // plain anonymous memory.
            let r = unsafe { crate::real::madvise(addr as *mut _, len, libc::MADV_DONTNEED) };
            if r != 0 {
                // Locked pages (the child called mlock or mlockall), which the kernel does not
                // drop: fresh memory over them forgets them all the same.
                map_fresh(addr, len);
            }
        }
    }

    /// Gives `[addr, addr+len)` (page-aligned) up to a file or shared mapping the program is
    /// about to place there with `MAP_FIXED`: its contents are forgotten and the pager leaves
    /// those pages alone until [`Arena::discard`] (an `munmap`, or anonymous memory mapped
    /// there) takes them back.
    pub(crate) fn surrender(&self, addr: usize, len: usize) {
        SURRENDERED_ANY.store(true, Ordering::Release);
        self.advise_fork(addr, len, false);
        if crate::has_pager() {
            let _in = crate::InPager::enter();
            self.region().surrender(addr - self.base(), len);
        }
        // Without a pager the arena is plain memory: the caller's mapping simply replaces it.
    }

    /// Whether the page at `addr` holds a mapping the program placed over managed memory.
    pub(crate) fn is_surrendered(&self, addr: usize) -> bool {
        SURRENDERED_ANY.load(Ordering::Acquire)
            && crate::has_pager()
            && self.region().is_surrendered(addr - self.base())
    }

    /// Whether any page of `[addr, addr+len)` holds a mapping the program placed there.
    pub(crate) fn any_surrendered(&self, addr: usize, len: usize) -> bool {
        SURRENDERED_ANY.load(Ordering::Acquire)
            && (addr..addr + len)
                .step_by(PAGE_SIZE)
                .any(|a| self.is_surrendered(a))
    }

    /// Locks the page-range allocator (fork prepare hook).
    pub(crate) fn lock_for_fork(&self) {
        self.retained.lock();
        self.ranges.lock();
    }

    /// Unlocks it after fork, in parent or child.
    ///
    /// # Safety
    /// Only after [`Arena::lock_for_fork`].
    pub(crate) unsafe fn unlock_after_fork(&self) {
        // SAFETY: forwarded contract (both were taken by `lock_for_fork`).
        unsafe {
            self.ranges.unlock();
            self.retained.unlock();
        }
    }
}

/// Milliseconds on the monotonic clock (the ages of kept blocks).
fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Maps fresh anonymous memory over `[addr, addr+len)` of the arena, in a fork child without a
/// pager (where the arena is plain anonymous memory): whatever was there is forgotten.
fn map_fresh(addr: usize, len: usize) {
    // SAFETY: MAP_FIXED over a range inside the arena that the program gives up; in a fork
    // child without a pager the arena is plain anonymous memory.
    unsafe {
        crate::real::mmap(
            addr as *mut _,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges_first_fit_grow_and_coalesce() {
        let mut r = PageRanges {
            free: BTreeMap::from([(0, 100)]),
        };
        assert_eq!(r.take(10), Some(0));
        assert_eq!(r.take(10), Some(10));
        assert!(r.take_at(20, 5));
        assert!(!r.take_at(20, 5));
        r.give(0, 10);
        r.give(10, 10);
        r.give(20, 5);
        assert_eq!(r.free, BTreeMap::from([(0, 100)]));
        assert_eq!(r.take(101), None);
    }
}

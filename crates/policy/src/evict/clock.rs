//! CLOCK (second chance): resident pages sit on a circular list with a reference bit; the hand
//! evicts the first page whose bit is clear, clearing set bits as it passes.
//!
//! Where the reference bit comes from depends on [`Visibility`]:
//!
//! * **Oracle**: set by every access, as a hardware accessed bit would be.
//! * **Fault** (what user space can do): set by the faults the policy sees — a demand miss, the
//!   first use of a prefetched page — and by *sampling*: when the hand clears a page's bit it
//!   also unmaps the page (keeping its data), so the next access to it faults
//!   ([`Touch::Refault`]), sets the bit and maps it again. Every page still in use pays one minor
//!   fault per revolution of the hand; the simulator reports these faults.
//!
//! Demand-inserted pages start referenced, prefetched pages unreferenced.

use super::{EvictPolicy, Insert, PageMap, Touch, Visibility};

#[derive(Debug, Clone, Copy)]
struct Slot {
    page: u64,
    referenced: bool,
    mapped: bool,
}

/// CLOCK; see the module documentation.
#[derive(Debug, Clone)]
pub struct Clock {
    visibility: Visibility,
    slots: Vec<Option<Slot>>,
    index: PageMap<usize>,
    free_slots: Vec<usize>,
    hand: usize,
}

impl Clock {
    /// An empty clock for the given visibility.
    pub fn new(visibility: Visibility) -> Self {
        Clock {
            visibility,
            slots: Vec::new(),
            index: PageMap::default(),
            free_slots: Vec::new(),
            hand: 0,
        }
    }

    fn slot_mut(&mut self, page: u64) -> Option<&mut Slot> {
        let i = *self.index.get(&page)?;
        self.slots[i].as_mut()
    }
}

impl EvictPolicy for Clock {
    fn name(&self) -> String {
        "clock".into()
    }

    fn visibility(&self) -> Visibility {
        self.visibility
    }

    fn insert(&mut self, page: u64, how: Insert, _at: usize) {
        let slot = Slot {
            page,
            referenced: how == Insert::Demand,
            mapped: true,
        };
        // A freed slot is where the hand just evicted: the new page goes behind the hand.
        let i = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.index.insert(page, i);
    }

    fn touch(&mut self, page: u64, _how: Touch, _at: usize) {
        if let Some(s) = self.slot_mut(page) {
            s.referenced = true;
            s.mapped = true;
        }
    }

    fn is_mapped(&self, page: u64) -> bool {
        match self.index.get(&page).and_then(|&i| self.slots[i]) {
            Some(s) => s.mapped,
            None => true,
        }
    }

    fn victim(&mut self, _at: usize) -> Option<u64> {
        if self.index.is_empty() {
            return None;
        }
        let sample = self.visibility == Visibility::Fault;
        // Two revolutions always suffice: the first clears every bit.
        for _ in 0..2 * self.slots.len() + 1 {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            let Some(s) = self.slots[i].as_mut() else {
                continue;
            };
            if s.referenced {
                s.referenced = false;
                if sample {
                    s.mapped = false;
                }
                continue;
            }
            let page = s.page;
            self.slots[i] = None;
            self.free_slots.push(i);
            self.index.remove(&page);
            return Some(page);
        }
        unreachable!("a clock with resident pages always finds a victim in two revolutions")
    }

    fn remove(&mut self, page: u64) {
        if let Some(i) = self.index.remove(&page) {
            self.slots[i] = None;
            self.free_slots.push(i);
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_chance_and_sampling() {
        let mut c = Clock::new(Visibility::Fault);
        for (i, p) in [1u64, 2, 3].into_iter().enumerate() {
            c.insert(p, Insert::Demand, i);
        }
        // All referenced: the first pass clears (and unmaps) 1, 2, 3, then evicts 1.
        assert_eq!(c.victim(3), Some(1));
        assert!(!c.is_mapped(2) && !c.is_mapped(3));
        c.touch(2, Touch::Refault, 4);
        assert!(c.is_mapped(2));
        assert_eq!(c.victim(5), Some(3), "2 got its second chance");
        let mut o = Clock::new(Visibility::Oracle);
        o.insert(1, Insert::Demand, 0);
        o.insert(2, Insert::Prefetch, 1);
        assert_eq!(o.victim(2), Some(2), "an unused prefetched page goes first");
        assert!(o.is_mapped(1), "oracle clock never unmaps");
    }
}

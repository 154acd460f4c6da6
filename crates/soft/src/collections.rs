//! Soft collections: a hash map, an array and a queue whose metadata (keys, indexes) stays in
//! ordinary memory and whose payloads live in a [`Pool`] (Midas, NSDI 2024, section 4.1).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::pool::Pool;
use crate::ptr::SoftBox;

/// A soft hash map: `get` of a key whose value was taken runs the pool's reconstructor with
/// the key as its argument; a key never inserted is reconstructed too (a cache in front of the
/// reconstructor).
#[derive(Debug)]
pub struct SoftHashMap {
    pool: Pool,
    index: Mutex<HashMap<Vec<u8>, Arc<SoftBox>>>,
}

impl SoftHashMap {
    /// An empty map over `pool`.
    pub fn new(pool: &Pool) -> SoftHashMap {
        SoftHashMap {
            pool: pool.clone(),
            index: Mutex::new(HashMap::new()),
        }
    }

    fn entry(&self, key: &[u8]) -> Arc<SoftBox> {
        let mut ix = self.index.lock().unwrap();
        if let Some(b) = ix.get(key) {
            return b.clone();
        }
        let b = Arc::new(self.pool.new_unique());
        ix.insert(key.to_vec(), b.clone());
        b
    }

    /// A copy of the value for `key` (rebuilt on a miss); `None` if the reconstructor gives
    /// nothing for it.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.entry(key).read(key)
    }

    /// As [`SoftHashMap::get`], into `out`.
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> bool {
        self.entry(key).read_into(key, out)
    }

    /// Sets `key`'s value.
    pub fn insert(&self, key: &[u8], value: &[u8]) -> bool {
        self.entry(key).write(value)
    }

    /// Forgets `key`.
    pub fn remove(&self, key: &[u8]) -> bool {
        self.index.lock().unwrap().remove(key).is_some()
    }

    /// Keys known.
    pub fn len(&self) -> usize {
        self.index.lock().unwrap().len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A soft array of `len` elements: element `i` is rebuilt by the pool's reconstructor with
/// `i` (8 bytes, little endian) as its argument.
#[derive(Debug)]
pub struct SoftArray {
    items: Vec<SoftBox>,
}

impl SoftArray {
    /// An array of `len` empty elements over `pool`.
    pub fn new(pool: &Pool, len: usize) -> SoftArray {
        SoftArray {
            items: (0..len).map(|_| pool.new_unique()).collect(),
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// A copy of element `i` (`None` past the end or if it cannot be rebuilt).
    pub fn get(&self, i: usize) -> Option<Vec<u8>> {
        self.items.get(i)?.read(&(i as u64).to_le_bytes())
    }

    /// As [`SoftArray::get`], into `out`.
    pub fn get_into(&self, i: usize, out: &mut Vec<u8>) -> bool {
        self.items
            .get(i)
            .is_some_and(|b| b.read_into(&(i as u64).to_le_bytes(), out))
    }

    /// Sets element `i` (write-through callers also write their backing store).
    pub fn set(&self, i: usize, value: &[u8]) -> bool {
        self.items.get(i).is_some_and(|b| b.write(value))
    }

    /// Compare-and-swap on element `i`.
    pub fn cmpxchg(&self, i: usize, old: &[u8], new: &[u8]) -> bool {
        self.items.get(i).is_some_and(|b| b.cmpxchg(old, new))
    }
}

/// A soft FIFO queue: each element keeps its reconstruction arguments in ordinary memory, so a
/// popped element whose memory was taken is rebuilt rather than lost.
#[derive(Debug)]
pub struct SoftQueue {
    pool: Pool,
    q: Mutex<VecDeque<(Vec<u8>, SoftBox)>>,
}

impl SoftQueue {
    /// An empty queue over `pool`.
    pub fn new(pool: &Pool) -> SoftQueue {
        SoftQueue {
            pool: pool.clone(),
            q: Mutex::new(VecDeque::new()),
        }
    }

    /// Appends `value`, rebuildable from `args`.
    pub fn push(&self, args: &[u8], value: &[u8]) {
        let b = self.pool.new_unique();
        b.write(value);
        self.q.lock().unwrap().push_back((args.to_vec(), b));
    }

    /// Takes the oldest element (rebuilt if its memory was taken).
    pub fn pop(&self) -> Option<Vec<u8>> {
        let (args, b) = self.q.lock().unwrap().pop_front()?;
        b.read(&args)
    }

    /// Elements queued.
    pub fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

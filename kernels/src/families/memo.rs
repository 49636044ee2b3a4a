//! A small process-wide memo for the seeded test inputs and CPU references of
//! the matmul families.
//!
//! A check runs many variants of a family over the same shapes, and the
//! inputs are a pure function of (generator tag, dimensions, seed), so
//! regenerating and re-quantizing them, and re-running the f64 oracle on
//! them, for every variant is wasted CPU time (at prefill shapes it dwarfs
//! the GPU work). Entries are keyed by a string that names everything the
//! value depends on; the memo keeps the most recently used `CAPACITY`
//! entries, which covers every value one shape needs when the checker visits
//! the cells shape by shape.

use std::any::Any;
use std::sync::{Arc, Mutex};

const CAPACITY: usize = 12;

type Entry = (String, Arc<dyn Any + Send + Sync>);

/// Most-recently-used list of at most `capacity` entries.
pub(crate) struct Memo {
    entries: Mutex<Vec<Entry>>,
    capacity: usize,
}

static MEMO: Memo = Memo::new(CAPACITY);

impl Memo {
    pub(crate) const fn new(capacity: usize) -> Memo {
        Memo {
            entries: Mutex::new(Vec::new()),
            capacity,
        }
    }

    fn lookup<T: Any + Send + Sync>(&self, key: &str) -> Option<Arc<T>> {
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let i = m.iter().position(|(k, _)| k == key)?;
        let e = m.remove(i);
        let hit = e.1.clone().downcast::<T>().ok();
        m.push(e);
        hit
    }

    fn store<T: Any + Send + Sync>(&self, key: String, v: Arc<T>) {
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|(k, _)| *k != key);
        m.push((key, v));
        while m.len() > self.capacity {
            m.remove(0);
        }
    }

    /// The value for `key`, computed by `make` on a miss. `make` runs without
    /// the lock held (two threads may compute the same value; both results
    /// are equal by the keying contract). Errors are not memoized.
    pub(crate) fn get_or_try<T, E>(
        &self,
        key: String,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E>
    where
        T: Any + Send + Sync,
    {
        if let Some(v) = self.lookup::<T>(&key) {
            return Ok(v);
        }
        let v = Arc::new(make()?);
        self.store(key, v.clone());
        Ok(v)
    }

    /// Infallible form of `get_or_try`.
    pub(crate) fn get<T: Any + Send + Sync>(
        &self,
        key: String,
        make: impl FnOnce() -> T,
    ) -> Arc<T> {
        match self.get_or_try::<T, std::convert::Infallible>(key, || Ok(make())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

/// `get_or_try` on the process-wide memo.
pub(crate) fn get_or_try<T, E>(
    key: String,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<Arc<T>, E>
where
    T: Any + Send + Sync,
{
    MEMO.get_or_try(key, make)
}

/// `get` on the process-wide memo.
pub(crate) fn get<T: Any + Send + Sync>(key: String, make: impl FnOnce() -> T) -> Arc<T> {
    MEMO.get(key, make)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn hits_return_the_same_value_and_misses_recompute() {
        let memo = Memo::new(4);
        let calls = AtomicUsize::new(0);
        let make = || {
            calls.fetch_add(1, Ordering::SeqCst);
            vec![1.0f64, 2.0]
        };
        let a = memo.get("a".into(), make);
        let b = memo.get("a".into(), make);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A different type under the same key is a miss, not a bad cast.
        let c: Arc<u32> = memo.get("a".into(), || 7u32);
        assert_eq!(*c, 7);
        // Errors are not stored.
        let e: Result<Arc<u8>, &str> = memo.get_or_try("e".into(), || Err("no"));
        assert!(e.is_err());
        let ok: Result<Arc<u8>, &str> = memo.get_or_try("e".into(), || Ok(3));
        assert_eq!(*ok.unwrap(), 3);
    }

    #[test]
    fn capacity_evicts_the_least_recently_used() {
        let memo = Memo::new(3);
        for i in 0..3usize {
            memo.get(format!("k{i}"), || i);
        }
        // Touch k0 so k1 is the least recently used, then overflow.
        memo.get("k0".into(), || 99usize);
        memo.get("k3".into(), || 3usize);
        assert_eq!(*memo.get("k0".into(), || 99usize), 0);
        assert_eq!(*memo.get("k1".into(), || 42usize), 42);
    }
}

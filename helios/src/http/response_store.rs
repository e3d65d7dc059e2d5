//! The bounded in-memory store behind the Responses API's `store` and
//! `previous_response_id`.
//!
//! A stored response keeps the conversation a continuation needs: every
//! item that reached the model (its own input, after whatever its own
//! `previous_response_id` chain contributed) followed by its output items
//! (reasoning, messages, function calls), as Responses input items. A
//! continuation's conversation is that list followed by its new input, so a
//! chain never has to be walked again and survives the eviction of its
//! ancestors. `instructions` are not kept: OpenAI does not carry them over.
//!
//! The store holds at most [`CAPACITY`] responses; storing one more evicts
//! the least recently used (stored or continued). It lives in memory only:
//! a restart forgets every response, and an evicted or unknown id is
//! [`super::HttpError::PreviousResponseNotFound`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;

/// How many responses the server keeps for `previous_response_id`.
pub const CAPACITY: usize = 1024;

/// The conversation items of one stored response, shared with readers.
pub type Items = Arc<Vec<Value>>;

/// Response ids to their conversation items, least recently used evicted
/// first.
#[derive(Debug)]
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each id's items and the tick of its last use.
    entries: HashMap<String, (u64, Items)>,
    /// Ticks of last use to ids, oldest first.
    order: BTreeMap<u64, String>,
    /// The next tick.
    tick: u64,
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        let tick = self.tick;
        self.tick += 1;
        tick
    }
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseStore {
    /// A store of [`CAPACITY`] responses.
    pub fn new() -> Self {
        Self::with_capacity(CAPACITY)
    }

    /// A store of at most `capacity` responses (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The store behind its lock (a panicked holder leaves it intact: every
    /// update is one insertion or removal).
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The items of response `id`, now the most recently used; `None` when
    /// it was never stored or was evicted.
    pub fn get(&self, id: &str) -> Option<Items> {
        let mut inner = self.lock();
        let tick = inner.next_tick();
        let (last, items) = inner.entries.get_mut(id)?;
        let previous = std::mem::replace(last, tick);
        let items = Arc::clone(items);
        inner.order.remove(&previous);
        inner.order.insert(tick, id.to_owned());
        Some(items)
    }

    /// Stores `items` under `id` (replacing an entry of the same id),
    /// evicting the least recently used responses beyond the capacity.
    pub fn insert(&self, id: String, items: Vec<Value>) {
        let mut inner = self.lock();
        let tick = inner.next_tick();
        if let Some((previous, _)) = inner.entries.remove(&id) {
            inner.order.remove(&previous);
        }
        inner.order.insert(tick, id.clone());
        inner.entries.insert(id, (tick, Arc::new(items)));
        while inner.entries.len() > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.entries.remove(&oldest);
        }
    }

    /// How many responses are stored.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether none is.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn items(text: &str) -> Vec<Value> {
        vec![json!({"type": "message", "role": "user", "content": text})]
    }

    #[test]
    fn the_default_store_holds_the_documented_capacity() {
        let store = ResponseStore::new();
        for index in 0..=CAPACITY {
            store.insert(format!("resp_{index}"), items("w1"));
        }
        assert_eq!(store.len(), CAPACITY);
        assert!(store.get("resp_0").is_none(), "the oldest is evicted");
        assert!(store.get(&format!("resp_{CAPACITY}")).is_some());
    }

    #[test]
    fn storing_beyond_the_capacity_evicts_the_least_recently_used() {
        let store = ResponseStore::with_capacity(2);
        assert!(store.is_empty());
        store.insert("a".into(), items("one"));
        store.insert("b".into(), items("two"));
        // Continuing `a` makes `b` the oldest.
        assert_eq!(store.get("a").unwrap()[0]["content"], "one");
        store.insert("c".into(), items("three"));
        assert_eq!(store.len(), 2);
        assert!(store.get("b").is_none(), "b was evicted");
        assert_eq!(store.get("a").unwrap()[0]["content"], "one");
        assert_eq!(store.get("c").unwrap()[0]["content"], "three");
        store.insert("d".into(), items("four"));
        assert!(store.get("a").is_none(), "a was evicted after c was read");
        assert!(store.get("c").is_some() && store.get("d").is_some());
        assert!(store.get("unknown").is_none());
    }

    #[test]
    fn storing_an_id_again_replaces_it_without_growing() {
        let store = ResponseStore::with_capacity(2);
        store.insert("a".into(), items("one"));
        store.insert("a".into(), items("again"));
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap()[0]["content"], "again");
        store.insert("b".into(), items("two"));
        store.insert("c".into(), items("three"));
        assert!(store.get("a").is_none());
        assert_eq!(store.len(), 2);
    }
}

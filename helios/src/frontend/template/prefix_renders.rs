//! Recent renderings of truncated conversations, for message marks.
//!
//! An agent's next turn is its last turn's conversation with a call and its
//! result appended, and a server marks the most recent messages of every
//! chat: most of the truncated conversations a turn renders for its marks
//! were rendered by the turn before, each a rendering of the whole history.
//! They are kept here under a key of what the rendering depends on besides
//! the template: the tools, documents and kwargs, and the messages up to the
//! truncation, as JSON.
//!
//! A key that collides, or a template whose output is not a function of its
//! variables (one that prints today's date), can only lose a mark or move it
//! to another message end the prompt shares with that rendering: a kept
//! rendering still marks a prompt only when it is a byte prefix of it, and
//! any such prefix ending on a token boundary is an exact state.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::{Arc, Mutex, PoisonError};

use super::ChatInput;

/// Renderings kept: the most recent messages of several conversations.
const ENTRIES: usize = 64;

/// One truncated conversation's rendering: `None` when the template failed
/// on it.
pub(super) type Rendering = Option<Arc<str>>;

/// The most recently used renderings, by key.
#[derive(Debug, Default)]
pub(super) struct PrefixRenders {
    entries: Mutex<VecDeque<(u64, Rendering)>>,
    /// Lookups that found nothing (the renderings made), for tests.
    #[cfg(test)]
    pub(super) misses: std::sync::atomic::AtomicUsize,
}

impl PrefixRenders {
    /// The rendering kept under `key`, made the most recent.
    pub(super) fn get(&self, key: u64) -> Option<Rendering> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(index) = entries.iter().position(|(k, _)| *k == key) else {
            #[cfg(test)]
            self.misses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        };
        let entry = entries.remove(index).expect("found");
        let rendering = entry.1.clone();
        entries.push_front(entry);
        Some(rendering)
    }

    /// Keeps `rendering` under `key`, dropping the least recently used
    /// beyond [`ENTRIES`].
    pub(super) fn put(&self, key: u64, rendering: Rendering) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|(k, _)| *k != key);
        entries.push_front((key, rendering));
        entries.truncate(ENTRIES);
    }
}

/// The key of each truncation of `input`'s conversation: element `k - 1`
/// for the conversation truncated after message `k`.
pub(super) fn truncation_keys(input: &ChatInput) -> Vec<u64> {
    let mut hasher = DefaultHasher::new();
    let part = |hasher: &mut DefaultHasher, json: &serde_json::Value| {
        let bytes = serde_json::to_vec(json).unwrap_or_default();
        hasher.write_usize(bytes.len());
        hasher.write(&bytes);
    };
    for list in [&input.tools, &input.documents] {
        match list {
            Some(values) => {
                hasher.write_usize(values.len());
                values.iter().for_each(|value| part(&mut hasher, value));
            }
            None => hasher.write_u8(0xff),
        }
    }
    hasher.write_usize(input.kwargs.len());
    for (name, value) in &input.kwargs {
        hasher.write_usize(name.len());
        hasher.write(name.as_bytes());
        part(&mut hasher, value);
    }
    (input.messages.iter())
        .map(|message| {
            part(&mut hasher, message);
            hasher.clone().finish()
        })
        .collect()
}

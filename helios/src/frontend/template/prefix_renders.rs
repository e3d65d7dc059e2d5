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
//! any such prefix ending on a token boundary is an exact state. The keys'
//! hasher is seeded per process, and what is kept is bounded in entries and
//! in bytes.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use super::ChatInput;

/// Renderings kept at most: the eight most recent messages of 128
/// conversations.
const ENTRIES: usize = 1024;
/// Bytes of rendering kept at most: eight truncations of 8 conversations of
/// 500 KB (about 120K tokens) each, or of many more short ones.
const BYTES: usize = 32 << 20;

/// One truncated conversation's rendering: `None` when the template failed
/// on it.
pub(super) type Rendering = Option<Arc<str>>;

/// The most recently used renderings, by key, within [`ENTRIES`] and
/// [`BYTES`].
#[derive(Debug, Default)]
pub(super) struct PrefixRenders {
    entries: Mutex<Entries>,
    /// The keys' hasher, seeded per process: which conversations another
    /// client's requests rendered is not for a client to probe.
    keys: RandomState,
    /// Lookups that found nothing (the renderings made), for tests.
    #[cfg(test)]
    pub(super) misses: std::sync::atomic::AtomicUsize,
}

/// Renderings, most recent first, and their bytes.
#[derive(Debug, Default)]
struct Entries {
    list: VecDeque<(u64, Rendering)>,
    bytes: usize,
}

fn bytes_of(rendering: &Rendering) -> usize {
    rendering.as_ref().map_or(0, |text| text.len())
}

impl PrefixRenders {
    /// The rendering kept under `key`, made the most recent.
    pub(super) fn get(&self, key: u64) -> Option<Rendering> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(index) = entries.list.iter().position(|(k, _)| *k == key) else {
            #[cfg(test)]
            self.misses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        };
        let entry = entries.list.remove(index).expect("found");
        let rendering = entry.1.clone();
        entries.list.push_front(entry);
        Some(rendering)
    }

    /// Keeps `rendering` under `key`, dropping the least recently used
    /// beyond [`ENTRIES`] or [`BYTES`] (a rendering larger than that is not
    /// kept).
    pub(super) fn put(&self, key: u64, rendering: Rendering) {
        if bytes_of(&rendering) > BYTES {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = entries.list.iter().position(|(k, _)| *k == key) {
            let (_, old) = entries.list.remove(index).expect("found");
            entries.bytes -= bytes_of(&old);
        }
        entries.bytes += bytes_of(&rendering);
        entries.list.push_front((key, rendering));
        while entries.list.len() > ENTRIES || entries.bytes > BYTES {
            let (_, dropped) = entries.list.pop_back().expect("over a bound, so not empty");
            entries.bytes -= bytes_of(&dropped);
        }
    }

    /// The bytes of rendering kept, for tests.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.bytes
    }

    /// The key of each truncation of `input`'s conversation: element `k - 1`
    /// for the conversation truncated after message `k`.
    pub(super) fn truncation_keys(&self, input: &ChatInput) -> Vec<u64> {
        let mut hasher = self.keys.build_hasher();
        let mut buffer = Vec::new();
        let mut part = |hasher: &mut dyn Hasher, json: &serde_json::Value| {
            buffer.clear();
            // Serializing a JSON value cannot fail.
            let _ = serde_json::to_writer(&mut buffer, json);
            hasher.write_usize(buffer.len());
            hasher.write(&buffer);
        };
        for list in [&input.tools, &input.documents] {
            match list {
                Some(values) => {
                    hasher.write_u8(1);
                    hasher.write_usize(values.len());
                    values.iter().for_each(|value| part(&mut hasher, value));
                }
                None => hasher.write_u8(0),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: usize) -> Rendering {
        Some(Arc::from("x".repeat(bytes)))
    }

    #[test]
    fn renderings_are_kept_within_the_byte_budget_least_recent_first() {
        let renders = PrefixRenders::default();
        let third = BYTES / 3;
        for key in 0..3 {
            renders.put(key, text(third));
        }
        assert_eq!(renders.bytes(), 3 * third);
        // Key 0 becomes the most recent; key 1 is dropped for key 3.
        assert!(renders.get(0).is_some());
        renders.put(3, text(third));
        assert!(renders.get(1).is_none());
        assert!(renders.get(0).is_some() && renders.get(2).is_some());
        assert_eq!(renders.bytes(), 3 * third);
        // Replacing an entry counts its bytes once; too large a one is not kept.
        renders.put(3, None);
        assert_eq!(renders.bytes(), 2 * third);
        renders.put(4, text(BYTES + 1));
        assert!(renders.get(4).is_none());
        assert_eq!(renders.get(3), Some(None));
    }

    #[test]
    fn keys_tell_lists_and_truncations_apart() {
        let renders = PrefixRenders::default();
        let message = serde_json::json!({"role": "user", "content": "hi"});
        let input = |tools: Option<Vec<serde_json::Value>>, documents| ChatInput {
            messages: vec![message.clone(), message.clone()],
            tools,
            documents,
            ..ChatInput::default()
        };
        let bare = renders.truncation_keys(&input(None, None));
        let empty_tools = renders.truncation_keys(&input(Some(vec![]), None));
        let empty_documents = renders.truncation_keys(&input(None, Some(vec![])));
        assert_eq!(bare.len(), 2);
        assert_ne!(bare[0], bare[1]);
        assert_ne!(bare, empty_tools);
        assert_ne!(empty_tools, empty_documents);
        assert_eq!(bare, renders.truncation_keys(&input(None, None)));
    }
}

//! Prefix identity: chained SHA-256 keys over fixed 64-token blocks.
//!
//! The design: "Prefix identity uses fixed 64-token hash blocks independently
//! of physical storage", and "the chained prefix digest includes conditioning
//! identities at the point where those inputs enter the token stream". The
//! identities that hold for the whole stream (the model and its token layout)
//! enter at the root as an opaque salt; positioned conditioning (images) is
//! not part of this module yet.
//!
//! Byte encoding (all integers little-endian, every token id as `u32`), each
//! key the SHA-256 of:
//! - root: `b"flare.prefix.root.v1"`, the salt length as `u64`, the salt;
//! - block `i` (tokens `[64 i, 64 i + 64)`): `b"flare.prefix.block.v1"`, the
//!   32-byte key of the chain after `i` blocks, the 64 token ids;
//! - partial tail of `r` tokens (`1 <= r < 64`) after `i` complete blocks:
//!   `b"flare.prefix.partial.v1"`, the 32-byte chain key after `i` blocks,
//!   `r` as `u32`, the `r` token ids.
//!
//! The three domain tags differ, so a partial key can never equal a block key
//! and cannot be a chain parent. The encoding is part of the cache contract:
//! changing it must change the tags.

use std::fmt;

use sha2::{Digest, Sha256};

/// Tokens in one hash block, independent of the physical page size.
pub const BLOCK_TOKENS: u32 = 64;

const ROOT_TAG: &[u8] = b"flare.prefix.root.v1";
const BLOCK_TAG: &[u8] = b"flare.prefix.block.v1";
const PARTIAL_TAG: &[u8] = b"flare.prefix.partial.v1";

/// The key of a chain after a whole number of blocks (the root after none).
/// Only these keys can be chain parents.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey([u8; 32]);

impl BlockKey {
    /// The raw digest.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockKey({})", short_hex(&self.0))
    }
}

/// The identity of a prefix of any length: the chain key of its complete
/// blocks (its anchor) and, when its length is not a multiple of
/// [`BLOCK_TOKENS`], the key of its partial tail. Equal endpoints of equal
/// token streams under the same salt have equal keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    tokens: u32,
    anchor: BlockKey,
    digest: [u8; 32],
}

impl EndpointKey {
    /// Tokens in the prefix.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The chain key after the prefix's complete blocks.
    pub fn anchor(&self) -> BlockKey {
        self.anchor
    }

    /// The prefix's own digest: the anchor's bytes when the prefix is a
    /// whole number of blocks, the partial-tail key otherwise.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

impl fmt::Debug for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EndpointKey({} tokens, {})",
            self.tokens,
            short_hex(&self.digest)
        )
    }
}

fn short_hex(bytes: &[u8; 32]) -> String {
    bytes[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The block chain of a token stream: the stream and the chain key after
/// each whole number of its blocks. Extended as a request consumes tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixChain {
    tokens: Vec<u32>,
    /// `anchors[i]`: the chain key after `i` complete blocks (`anchors[0]` is
    /// the root); `anchors.len() == tokens.len() / 64 + 1`.
    anchors: Vec<BlockKey>,
}

impl PrefixChain {
    /// The chain of `tokens` under a root `salt` (the conditioning identity
    /// that holds for the whole stream: model and token layout).
    pub fn new(salt: &[u8], tokens: &[u32]) -> Self {
        let mut root = Sha256::new();
        root.update(ROOT_TAG);
        root.update((salt.len() as u64).to_le_bytes());
        root.update(salt);
        let mut chain = Self {
            tokens: Vec::new(),
            anchors: vec![BlockKey(root.finalize().into())],
        };
        chain.extend(tokens);
        chain
    }

    /// Appends tokens, hashing every block they complete.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        let block = BLOCK_TOKENS as usize;
        while self.anchors.len() <= self.tokens.len() / block {
            let i = self.anchors.len() - 1;
            let mut hasher = Sha256::new();
            hasher.update(BLOCK_TAG);
            hasher.update(self.anchors[i].0);
            for token in &self.tokens[i * block..(i + 1) * block] {
                hasher.update(token.to_le_bytes());
            }
            self.anchors.push(BlockKey(hasher.finalize().into()));
        }
    }

    /// The token stream.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Tokens in the stream.
    pub fn len(&self) -> u32 {
        u32::try_from(self.tokens.len()).expect("token counts are u32")
    }

    /// Whether the stream holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The chain key after `blocks` complete blocks (0: the root).
    ///
    /// # Panics
    /// When the stream holds fewer than `blocks` complete blocks.
    pub fn anchor(&self, blocks: u32) -> BlockKey {
        self.anchors[blocks as usize]
    }

    /// The key of the prefix of `endpoint` tokens, or `None` beyond the
    /// stream.
    pub fn endpoint_key(&self, endpoint: u32) -> Option<EndpointKey> {
        if endpoint > self.len() {
            return None;
        }
        let blocks = endpoint / BLOCK_TOKENS;
        let rest = endpoint % BLOCK_TOKENS;
        let anchor = self.anchor(blocks);
        let digest = if rest == 0 {
            anchor.0
        } else {
            let start = (blocks * BLOCK_TOKENS) as usize;
            let mut hasher = Sha256::new();
            hasher.update(PARTIAL_TAG);
            hasher.update(anchor.0);
            hasher.update(rest.to_le_bytes());
            for token in &self.tokens[start..start + rest as usize] {
                hasher.update(token.to_le_bytes());
            }
            hasher.finalize().into()
        };
        Some(EndpointKey {
            tokens: endpoint,
            anchor,
            digest,
        })
    }

    /// The longest cached prefix of at most `limit` tokens.
    ///
    /// `cached(anchor)` lists the cached endpoints whose anchor is `anchor`
    /// (endpoints in `[64 i, 64 i + 63]` of some stream), each with a value.
    /// Blocks are probed from the deepest down, so the cost is one map probe
    /// per block and one partial hash per candidate, never a hash per
    /// token position.
    pub fn longest_cached<T, I>(
        &self,
        limit: u32,
        mut cached: impl FnMut(&BlockKey) -> I,
    ) -> Option<(EndpointKey, T)>
    where
        I: IntoIterator<Item = (EndpointKey, T)>,
    {
        let limit = limit.min(self.len());
        for blocks in (0..=limit / BLOCK_TOKENS).rev() {
            let anchor = self.anchor(blocks);
            let best = cached(&anchor)
                .into_iter()
                .filter(|(key, _)| key.tokens <= limit)
                .filter(|(key, _)| self.endpoint_key(key.tokens).as_ref() == Some(key))
                .max_by_key(|(key, _)| key.tokens);
            if best.is_some() {
                return best;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn stream(len: u32, seed: u32) -> Vec<u32> {
        (0..len)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
            .collect()
    }

    #[test]
    fn keys_depend_on_salt_tokens_and_length_only() {
        let tokens = stream(200, 1);
        let a = PrefixChain::new(b"model-a", &tokens);
        let b = PrefixChain::new(b"model-b", &tokens);
        assert_ne!(a.endpoint_key(130), b.endpoint_key(130));
        // Extending in pieces gives the same keys as hashing at once.
        let mut pieces = PrefixChain::new(b"model-a", &tokens[..7]);
        pieces.extend(&tokens[7..100]);
        pieces.extend(&tokens[100..]);
        assert_eq!(pieces, a);
        // A longer stream keeps the keys of its prefixes.
        let short = PrefixChain::new(b"model-a", &tokens[..130]);
        assert_eq!(short.endpoint_key(130), a.endpoint_key(130));
        assert_eq!(short.endpoint_key(64), a.endpoint_key(64));
        // One changed token changes every key from its block on.
        let mut changed = tokens.clone();
        changed[70] ^= 1;
        let c = PrefixChain::new(b"model-a", &changed);
        assert_eq!(c.endpoint_key(64), a.endpoint_key(64));
        assert_eq!(c.endpoint_key(70), a.endpoint_key(70));
        assert_ne!(c.endpoint_key(71), a.endpoint_key(71));
        assert_ne!(c.endpoint_key(192), a.endpoint_key(192));
    }

    #[test]
    fn partial_keys_differ_from_block_keys_and_each_other() {
        let chain = PrefixChain::new(b"", &stream(128, 9));
        let aligned = chain.endpoint_key(64).unwrap();
        assert_eq!(aligned.digest(), aligned.anchor().bytes());
        let keys: Vec<_> = (0..=128).map(|t| chain.endpoint_key(t).unwrap()).collect();
        let mut digests: Vec<_> = keys.iter().map(|k| *k.digest()).collect();
        digests.sort_unstable();
        digests.dedup();
        assert_eq!(digests.len(), keys.len());
        assert_eq!(chain.endpoint_key(129), None);
        assert_eq!(chain.endpoint_key(100).unwrap().anchor(), chain.anchor(1));
    }

    #[test]
    fn the_encoding_is_pinned() {
        // Part of the cache contract: a change here must change the tags.
        let chain = PrefixChain::new(b"salt", &(0..70).collect::<Vec<u32>>());
        let hex =
            |bytes: &[u8; 32]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
        let mut root = Sha256::new();
        root.update(b"flare.prefix.root.v1");
        root.update(4u64.to_le_bytes());
        root.update(b"salt");
        let root: [u8; 32] = root.finalize().into();
        assert_eq!(chain.anchor(0).bytes(), &root);
        let mut block = Sha256::new();
        block.update(b"flare.prefix.block.v1");
        block.update(root);
        for t in 0u32..64 {
            block.update(t.to_le_bytes());
        }
        let block: [u8; 32] = block.finalize().into();
        assert_eq!(hex(chain.anchor(1).bytes()), hex(&block));
        let mut partial = Sha256::new();
        partial.update(b"flare.prefix.partial.v1");
        partial.update(block);
        partial.update(6u32.to_le_bytes());
        for t in 64u32..70 {
            partial.update(t.to_le_bytes());
        }
        let partial: [u8; 32] = partial.finalize().into();
        assert_eq!(chain.endpoint_key(70).unwrap().digest(), &partial);
    }

    #[test]
    fn longest_cached_finds_the_deepest_matching_endpoint() {
        let tokens = stream(300, 3);
        let cached_chain = PrefixChain::new(b"m", &tokens);
        let mut index: HashMap<BlockKey, Vec<(EndpointKey, u32)>> = HashMap::new();
        for t in [10, 64, 130, 200] {
            let key = cached_chain.endpoint_key(t).unwrap();
            index.entry(key.anchor()).or_default().push((key, t));
        }
        let lookup = |anchor: &BlockKey| index.get(anchor).cloned().unwrap_or_default();
        // The same stream, longer: the deepest endpoint within the limit.
        let query = PrefixChain::new(b"m", &tokens);
        assert_eq!(query.longest_cached(300, lookup).map(|(_, t)| t), Some(200));
        assert_eq!(query.longest_cached(199, lookup).map(|(_, t)| t), Some(130));
        assert_eq!(query.longest_cached(63, lookup).map(|(_, t)| t), Some(10));
        assert_eq!(query.longest_cached(9, lookup).map(|(_, t)| t), None);
        // A stream that diverges at token 150 still hits 130, not 200.
        let mut diverged = tokens.clone();
        diverged[150] += 1;
        let query = PrefixChain::new(b"m", &diverged);
        assert_eq!(query.longest_cached(300, lookup).map(|(_, t)| t), Some(130));
        // Diverging inside the partial tail of 130 (same anchor) falls back.
        let mut diverged = tokens.clone();
        diverged[129] += 1;
        let query = PrefixChain::new(b"m", &diverged);
        assert_eq!(query.longest_cached(300, lookup).map(|(_, t)| t), Some(64));
        // Another salt matches nothing.
        let query = PrefixChain::new(b"other", &tokens);
        assert_eq!(query.longest_cached(300, lookup).map(|(_, t)| t), None);
    }
}

//! The grammar engine of a core and the per-request constraint.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::Value;

use super::token_bytes::{check_round_trip, vocabulary_bytes};
use super::GrammarError;
use crate::frontend::Tokenizer;

/// The largest grammar text (a schema's JSON, a Lark or regex source)
/// accepted, in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 64 * 1024;

/// Compiled grammars kept, by text; the least recently used goes first.
pub const CACHE_CAPACITY: usize = 256;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid against this schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
    /// A regular expression.
    Regex(String),
}

impl GrammarSpec {
    /// The cache key: the kind and the grammar's text.
    fn key(&self) -> String {
        match self {
            Self::JsonSchema(schema) => format!("json_schema:{schema}"),
            Self::JsonObject => "json_object".to_owned(),
            Self::Lark(source) => format!("lark:{source}"),
            Self::Regex(source) => format!("regex:{source}"),
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema.clone()),
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            Self::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
            Self::Regex(source) => TopLevelGrammar::from_regex(source),
        }
    }
}

/// Compiled grammars by key, bounded, least recently used out.
#[derive(Default)]
struct Cache {
    parsers: HashMap<String, TokenParser>,
    order: VecDeque<String>,
}

impl Cache {
    fn get(&mut self, key: &str) -> Option<TokenParser> {
        let parser = self.parsers.get(key)?.deep_clone();
        self.order.retain(|k| k != key);
        self.order.push_back(key.to_owned());
        Some(parser)
    }

    fn insert(&mut self, key: String, parser: &TokenParser) {
        if self.parsers.len() >= CACHE_CAPACITY {
            if let Some(oldest) = self.order.pop_front() {
                self.parsers.remove(&oldest);
            }
        }
        self.order.push_back(key.clone());
        self.parsers.insert(key, parser.deep_clone());
    }
}

/// The grammar engine of one core: its token trie and compiled grammars.
pub struct GrammarEngine {
    factory: ParserFactory,
    /// Ids the tokenizer has (the trie's vocabulary).
    vocab_size: usize,
    /// Words of a mask: the logits width in 32-bit words.
    mask_words: usize,
    /// Every id that ends generation; the first is the trie's EOS.
    stops: Arc<[u32]>,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for GrammarEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEngine")
            .field("vocab_size", &self.vocab_size)
            .field("mask_words", &self.mask_words)
            .field("stops", &self.stops)
            .finish()
    }
}

impl GrammarEngine {
    /// The engine over `tokenizer` (whose serialization is
    /// `tokenizer_json`), ending at `stops` (non-empty), with masks as wide
    /// as `logits_width` (at least the vocabulary). `delimiters` are the
    /// output protocol's marker tokens: the protocol reads them by id, so a
    /// grammar matches them only as tokens (`<[id]>`), never as text.
    pub fn new(
        tokenizer: &Tokenizer,
        tokenizer_json: &str,
        stops: &[u32],
        logits_width: usize,
        delimiters: &[u32],
    ) -> Result<Self, GrammarError> {
        let mut words = vocabulary_bytes(tokenizer, tokenizer_json)?;
        check_round_trip(tokenizer, &words)?;
        for &id in delimiters {
            if let Some(word) = words.get_mut(id as usize) {
                if word.first() != Some(&super::token_bytes::SPECIAL_MARKER) {
                    word.insert(0, super::token_bytes::SPECIAL_MARKER);
                }
            }
        }
        let engine = |reason: String| GrammarError::Engine { reason };
        let &eos = stops
            .first()
            .ok_or_else(|| engine("no stop token".to_owned()))?;
        if logits_width < words.len() {
            return Err(engine(format!(
                "the logits width {logits_width} is less than the vocabulary {}",
                words.len()
            )));
        }
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&(env as _)).map_err(|e| engine(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            max_grammar_size: 200_000,
            initial_lexer_fuel: 1_000_000,
            ..ParserLimits::default()
        };
        Ok(Self {
            factory,
            vocab_size: words.len(),
            mask_words: logits_width.div_ceil(32),
            stops: stops.into(),
            cache: Mutex::new(Cache::default()),
        })
    }

    /// Words of one packed mask.
    pub fn mask_words(&self) -> usize {
        self.mask_words
    }

    /// A constraint for one request: `spec` compiled, or taken from the
    /// cache.
    pub fn constraint(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let key = spec.key();
        if key.len() > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::TooLarge {
                bytes: key.len(),
                limit: MAX_GRAMMAR_BYTES,
            });
        }
        let cached = self.lock().get(&key);
        let parser = match cached {
            Some(parser) => parser,
            None => {
                let parser = (self.factory.create_parser(spec.grammar())).map_err(|e| {
                    GrammarError::Compile {
                        reason: e.to_string(),
                    }
                })?;
                self.lock().insert(key, &parser);
                parser
            }
        };
        let matcher = Matcher::new(Ok(parser));
        if let Some(reason) = matcher.get_error() {
            return Err(GrammarError::Compile { reason });
        }
        Ok(Constraint {
            matcher,
            vocab_size: self.vocab_size,
            mask_words: self.mask_words,
            stops: Arc::clone(&self.stops),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
    vocab_size: usize,
    mask_words: usize,
    stops: Arc<[u32]>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("mask_words", &self.mask_words)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    fn failed(&self, error: impl std::fmt::Display) -> GrammarError {
        GrammarError::Matcher {
            reason: self
                .matcher
                .get_error()
                .unwrap_or_else(|| error.to_string()),
        }
    }

    /// Writes the next token's mask into `mask` (`mask_words` words): the
    /// tokens the grammar allows, every stop token when it may end here,
    /// nothing past the vocabulary.
    pub fn mask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.failed(e))?;
        mask.fill(0);
        let words = allowed.as_slice();
        let whole = (self.vocab_size / 32).min(mask.len()).min(words.len());
        mask[..whole].copy_from_slice(&words[..whole]);
        for id in whole * 32..self.vocab_size.min(mask.len() * 32) {
            if allowed.is_allowed(id as u32) {
                mask[id / 32] |= 1 << (id % 32);
            }
        }
        let ends = allowed.is_allowed(self.stops[0]);
        for &stop in self.stops.iter() {
            let stop = stop as usize;
            if stop / 32 < mask.len() {
                let bit = 1 << (stop % 32);
                if ends {
                    mask[stop / 32] |= bit;
                } else {
                    mask[stop / 32] &= !bit;
                }
            }
        }
        Ok(())
    }

    /// Advances on the sampled `token`; a stop token is the grammar's end.
    pub fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.stops.contains(&token) {
            // A grammar that can take nothing more has ended already.
            if self.matcher.is_stopped() {
                return Ok(());
            }
            return (self.matcher.consume_token(self.stops[0])).map_err(|e| self.failed(e));
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failed(e))
    }

    /// Whether the output may end here.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar is done (it ended, or can take nothing more).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

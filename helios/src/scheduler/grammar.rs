//! A request's grammar constraint as the scheduler holds it.
//!
//! The scheduler advances a constrained request's matcher on each sampled
//! token when it applies the completion, and asks it for the next token's
//! mask when it submits the launch that samples it. So the mask a launch
//! carries always follows every token the request sampled before it: a
//! constrained request is batched only once its earlier samples were
//! applied, and while one decodes the loop keeps one launch in flight
//! (`collect.rs`). A matcher's failure fails its request only.

use std::sync::{Arc, Mutex, PoisonError};

use crate::grammar::{Constraint, GrammarError};

/// A shared handle to one request's [`Constraint`] (cloning the spec shares
/// it; equality is identity).
#[derive(Clone)]
pub struct Grammar(Arc<Mutex<Constraint>>);

impl Grammar {
    /// The handle of `constraint`.
    pub fn new(constraint: Constraint) -> Self {
        Self(Arc::new(Mutex::new(constraint)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Constraint> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next token's packed mask, `words` words.
    pub fn mask(&self, words: usize) -> Result<Vec<u32>, GrammarError> {
        let mut mask = vec![0u32; words];
        self.lock().mask(&mut mask)?;
        Ok(mask)
    }

    /// Advances on a sampled token.
    pub fn advance(&self, token: u32) -> Result<(), GrammarError> {
        self.lock().advance(token)
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar(..)")
    }
}

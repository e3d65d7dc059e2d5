//! Stop sequences over the streamed output text.

use super::FrontendError;

/// What one piece of output text did to the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStep {
    /// No stop sequence completed. `text` can be shown now; text that could
    /// still begin a stop sequence is held back.
    Continue {
        /// Text released to the client (possibly empty).
        text: String,
    },
    /// A stop sequence completed: generation ends. `text` is the output that
    /// precedes the stop sequence and was not released yet; the stop sequence
    /// itself and anything after it are dropped.
    Stopped {
        /// The last text to release.
        text: String,
        /// Which stop sequence matched (its index in the request's list).
        stop: usize,
    },
}

/// Finds a request's stop sequences in its output text, across token
/// boundaries, without ever releasing text that a stop sequence may still
/// claim.
///
/// The stream stops at the first position where any stop sequence *ends*; if
/// several end there, the one that starts first (the longest) is the match.
/// The result does not depend on how the text was split into pieces.
///
/// Invariant (why held text suffices): the held text is the longest suffix of
/// the unreleased text that is a proper prefix of some stop sequence, so a stop
/// sequence can never start inside text already released.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; an empty stop sequence is refused (it would stop
    /// before any output). An empty list never stops.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Result<Self, FrontendError> {
        if let Some(index) = stops.iter().position(|stop| stop.as_ref().is_empty()) {
            return Err(FrontendError::EmptyStop { index });
        }
        Ok(Self {
            stops: stops.iter().map(|stop| stop.as_ref().to_owned()).collect(),
            held: String::new(),
            stopped: false,
        })
    }

    /// The stop sequences, in the request's order.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Whether a stop sequence has matched; later pushes release nothing.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Text held back because it may still begin a stop sequence.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feeds the next piece of output text (a detokenizer delta).
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.stopped {
            return StopStep::Continue {
                text: String::new(),
            };
        }
        self.held.push_str(delta);
        if let Some((start, stop)) = self.first_match() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.held);
            text.truncate(start);
            return StopStep::Stopped { text, stop };
        }
        let keep = self.partial_suffix_start();
        let rest = self.held.split_off(keep);
        let text = std::mem::replace(&mut self.held, rest);
        StopStep::Continue { text }
    }

    /// Releases the held text at the end of generation (EOS or length): what
    /// was held could not become a stop sequence after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The match that ends first, then starts first: `(start, stop index)`.
    fn first_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| {
                let start = self.held.find(stop.as_str())?;
                Some((start + stop.len(), start, index))
            })
            .min()
            .map(|(_, start, index)| (start, index))
    }

    /// Where the longest suffix of `held` that is a proper prefix of a stop
    /// sequence begins (`held.len()` when there is none).
    fn partial_suffix_start(&self) -> usize {
        self.held
            .char_indices()
            .map(|(start, _)| start)
            .find(|&start| {
                let suffix = &self.held[start..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > suffix.len() && stop.starts_with(suffix))
            })
            .unwrap_or(self.held.len())
    }
}

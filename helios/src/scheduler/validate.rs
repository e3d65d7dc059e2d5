//! Validation of completion records against what was submitted, before any
//! scheduler state changes.
//!
//! The host knows exactly what each launch does to each slot: records are
//! applied in submission order, so the confirmed device progress of a
//! request plus the row's operation gives the exact expected `consumed`,
//! `generated` and `done` values. Anything else is an invalid record.

use super::engine::Row;
use super::error::InvalidRecord;
use super::executor::{done, CompletionRecord};
use super::geometry::Geometry;
use super::ids::{RequestId, Slot};
use super::request::Confirmed;

/// What a row's request looked like when its record arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct Expectation {
    pub(super) slot: Slot,
    pub(super) confirmed: Confirmed,
    /// The device's `max_new` for this admission.
    pub(super) budget: u32,
    /// The request's last output token, which a resample must repeat.
    pub(super) last_token: Option<u32>,
    /// The request was cancelled or failed: its late records are dropped.
    pub(super) ignored: bool,
}

/// What a valid record row means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Padding, or a request whose records no longer matter.
    Ignored,
    /// A finished request's row: nothing changed.
    Inactive,
    /// A chunk that does not end the prompt was consumed.
    Prefilled { consumed: u32 },
    /// A resample repeated the confirmed sample: nothing changed.
    Resampled,
    /// A token was sampled.
    Sampled {
        token: u32,
        consumed: u32,
        generated: u32,
        done: i32,
    },
}

/// Per row, its outcome or why its record is invalid; `Err` when the
/// completion as a whole cannot be trusted (wrong row count, bad padding).
pub(super) type Verdict = Result<Vec<Result<Outcome, InvalidRecord>>, InvalidRecord>;

/// Checks a launch's records.
pub(super) fn check_records(
    rows: &[Row],
    records: &[CompletionRecord],
    geometry: &Geometry,
    expect: impl Fn(RequestId) -> Option<Expectation>,
) -> Verdict {
    if rows.len() != records.len() {
        return Err(InvalidRecord::RowCount {
            expected: rows.len(),
            found: records.len(),
        });
    }
    let mut outcomes = Vec::with_capacity(rows.len());
    for (index, (row, record)) in rows.iter().zip(records).enumerate() {
        let check = Check {
            index,
            record,
            geometry,
        };
        let id = match *row {
            Row::Padding => {
                check.slot(Slot::NULL)?;
                check.valid(false)?;
                outcomes.push(Ok(Outcome::Ignored));
                continue;
            }
            Row::Chunk { id, .. }
            | Row::Decode { id }
            | Row::Resume { id }
            | Row::Resample { id } => id,
        };
        let outcome = match expect(id) {
            Some(expectation) if !expectation.ignored => check.row(*row, &expectation),
            _ => Ok(Outcome::Ignored),
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// One record against its row.
struct Check<'a> {
    index: usize,
    record: &'a CompletionRecord,
    geometry: &'a Geometry,
}

impl Check<'_> {
    fn row(&self, row: Row, expectation: &Expectation) -> Result<Outcome, InvalidRecord> {
        self.slot(expectation.slot)?;
        let confirmed = expectation.confirmed;
        match row {
            Row::Chunk { len, samples, .. } => {
                let consumed = confirmed.consumed + len;
                if samples {
                    self.sampled(consumed, expectation)
                } else {
                    self.unchanged(Confirmed {
                        consumed,
                        ..confirmed
                    })?;
                    Ok(Outcome::Prefilled { consumed })
                }
            }
            Row::Decode { .. } if confirmed.done != done::RUNNING => {
                self.unchanged(confirmed)?;
                Ok(Outcome::Inactive)
            }
            Row::Decode { .. } => self.sampled(confirmed.consumed + 1, expectation),
            Row::Resume { .. } => self.sampled(confirmed.consumed, expectation),
            Row::Resample { .. } => self.resampled(expectation),
            Row::Padding => unreachable!("padding rows are checked by the caller"),
        }
    }

    fn slot(&self, expected: Slot) -> Result<(), InvalidRecord> {
        if i64::from(self.record.slot) == i64::from(expected.0) {
            return Ok(());
        }
        Err(InvalidRecord::Slot {
            row: self.index,
            expected,
            found: self.record.slot,
        })
    }

    fn valid(&self, expected: bool) -> Result<(), InvalidRecord> {
        if self.record.valid == i32::from(expected) {
            return Ok(());
        }
        Err(InvalidRecord::Valid {
            row: self.index,
            expected,
            found: self.record.valid,
        })
    }

    fn counts(&self, consumed: u32, generated: u32) -> Result<(), InvalidRecord> {
        let (row, record) = (self.index, self.record);
        if i64::from(record.consumed) != i64::from(consumed) {
            return Err(InvalidRecord::Consumed {
                row,
                expected: consumed,
                found: record.consumed,
            });
        }
        if i64::from(record.generated) != i64::from(generated) {
            return Err(InvalidRecord::Generated {
                row,
                expected: generated,
                found: record.generated,
            });
        }
        Ok(())
    }

    fn done(&self, expected: i32) -> Result<(), InvalidRecord> {
        if self.record.done == expected {
            return Ok(());
        }
        Err(InvalidRecord::Done {
            row: self.index,
            expected,
            found: self.record.done,
        })
    }

    /// A row that did not sample leaves the slot's counts as `expected`.
    fn unchanged(&self, expected: Confirmed) -> Result<(), InvalidRecord> {
        self.valid(false)?;
        self.counts(expected.consumed, expected.generated)?;
        self.done(expected.done)
    }

    /// A resample: the slot's counts, flag and token are the confirmed
    /// sample's again (the same hidden vector, counter and seed sampled).
    fn resampled(&self, expectation: &Expectation) -> Result<Outcome, InvalidRecord> {
        self.valid(true)?;
        let confirmed = expectation.confirmed;
        self.counts(confirmed.consumed, confirmed.generated)?;
        self.done(confirmed.done)?;
        let repeats = expectation
            .last_token
            .is_some_and(|token| i64::from(token) == i64::from(self.record.token));
        if !repeats {
            return Err(InvalidRecord::ResampleDiffers {
                row: self.index,
                expected: expectation.last_token,
                found: self.record.token,
            });
        }
        Ok(Outcome::Resampled)
    }

    /// A row that sampled one token after consuming up to `consumed`.
    fn sampled(&self, consumed: u32, expectation: &Expectation) -> Result<Outcome, InvalidRecord> {
        self.valid(true)?;
        let generated = expectation.confirmed.generated + 1;
        self.counts(consumed, generated)?;
        let vocab_size = self.geometry.vocab_size();
        let token = u32::try_from(self.record.token)
            .ok()
            .filter(|&token| token < vocab_size)
            .ok_or(InvalidRecord::Token {
                row: self.index,
                token: self.record.token,
                vocab_size,
            })?;
        let expected_done = if self.geometry.is_stop(token) {
            done::STOP
        } else if generated >= expectation.budget {
            done::LENGTH
        } else {
            done::RUNNING
        };
        self.done(expected_done)?;
        Ok(Outcome::Sampled {
            token,
            consumed,
            generated,
            done: expected_done,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proto::PreparedContract;

    fn geometry() -> Geometry {
        let contract = PreparedContract {
            page_size: 16,
            max_concurrency: 2,
            context_limit: 256,
            prefill_chunk_size: 32,
            decode_capacities: vec![1, 2],
            prefill_capacities: vec![32],
            kv_pages: 9,
            vocab_size: 10,
            ..PreparedContract::default()
        };
        Geometry::from_contract(&contract, &[2]).unwrap()
    }

    const ID: RequestId = RequestId(7);

    fn expectation(consumed: u32, generated: u32, done: i32) -> Expectation {
        Expectation {
            slot: Slot(1),
            confirmed: Confirmed {
                consumed,
                generated,
                done,
            },
            budget: 4,
            last_token: None,
            ignored: false,
        }
    }

    fn record(
        token: i32,
        generated: i32,
        consumed: i32,
        done: i32,
        valid: i32,
    ) -> CompletionRecord {
        CompletionRecord {
            slot: 1,
            token,
            generated,
            consumed,
            done,
            valid,
        }
    }

    fn check(
        row: Row,
        record: CompletionRecord,
        expect: Expectation,
    ) -> Result<Outcome, InvalidRecord> {
        let padding = CompletionRecord {
            token: -1,
            ..CompletionRecord::default()
        };
        let rows = [row, Row::Padding];
        let verdict = check_records(&rows, &[record, padding], &geometry(), |id| {
            (id == ID).then_some(expect)
        });
        let mut outcomes = verdict.expect("two rows, valid padding");
        outcomes.remove(0)
    }

    const DECODE: Row = Row::Decode { id: ID };

    #[test]
    fn a_decode_sample_advances_both_counts_by_one() {
        let outcome = check(DECODE, record(5, 2, 11, 0, 1), expectation(10, 1, 0));
        let sampled = Outcome::Sampled {
            token: 5,
            consumed: 11,
            generated: 2,
            done: done::RUNNING,
        };
        assert_eq!(outcome, Ok(sampled));
    }

    #[test]
    fn the_finish_flag_follows_the_token_and_the_budget() {
        let stop = check(DECODE, record(2, 2, 11, 1, 1), expectation(10, 1, 0));
        assert!(matches!(
            stop,
            Ok(Outcome::Sampled {
                done: done::STOP,
                ..
            })
        ));
        let length = check(DECODE, record(5, 4, 11, 2, 1), expectation(10, 3, 0));
        assert!(matches!(
            length,
            Ok(Outcome::Sampled {
                done: done::LENGTH,
                ..
            })
        ));
        let missing = check(DECODE, record(5, 4, 11, 0, 1), expectation(10, 3, 0));
        assert_eq!(
            missing,
            Err(InvalidRecord::Done {
                row: 0,
                expected: 2,
                found: 0
            })
        );
    }

    #[test]
    fn a_finished_slot_must_not_change() {
        let masked = check(DECODE, record(-1, 3, 10, 1, 0), expectation(10, 3, 1));
        assert_eq!(masked, Ok(Outcome::Inactive));
        let moved = check(DECODE, record(-1, 3, 11, 1, 0), expectation(10, 3, 1));
        assert!(matches!(
            moved,
            Err(InvalidRecord::Consumed { expected: 10, .. })
        ));
        let sampled = check(DECODE, record(4, 4, 11, 0, 1), expectation(10, 3, 1));
        assert!(matches!(
            sampled,
            Err(InvalidRecord::Valid {
                expected: false,
                ..
            })
        ));
    }

    #[test]
    fn a_chunk_consumes_its_tokens_and_samples_only_at_the_prompt_end() {
        let middle = Row::Chunk {
            id: ID,
            len: 32,
            samples: false,
        };
        let outcome = check(middle, record(-1, 0, 32, 0, 0), expectation(0, 0, 0));
        assert_eq!(outcome, Ok(Outcome::Prefilled { consumed: 32 }));
        let last = Row::Chunk {
            id: ID,
            len: 8,
            samples: true,
        };
        let outcome = check(last, record(9, 1, 40, 0, 1), expectation(32, 0, 0));
        assert!(matches!(outcome, Ok(Outcome::Sampled { token: 9, .. })));
        let out_of_vocab = check(last, record(10, 1, 40, 0, 1), expectation(32, 0, 0));
        assert!(matches!(
            out_of_vocab,
            Err(InvalidRecord::Token { token: 10, .. })
        ));
    }

    #[test]
    fn a_resample_repeats_the_confirmed_sample_or_is_invalid() {
        let resample = Row::Resample { id: ID };
        // The resume sampled token 5 at 40 consumed: the resample after the
        // captures' admits must give it back, counts and flag included.
        let expect = Expectation {
            last_token: Some(5),
            ..expectation(40, 1, 0)
        };
        let repeated = check(resample, record(5, 1, 40, 0, 1), expect);
        assert_eq!(repeated, Ok(Outcome::Resampled));
        let other = check(resample, record(6, 1, 40, 0, 1), expect);
        assert_eq!(
            other,
            Err(InvalidRecord::ResampleDiffers {
                row: 0,
                expected: Some(5),
                found: 6
            })
        );
        let advanced = check(resample, record(5, 2, 40, 0, 1), expect);
        assert!(matches!(
            advanced,
            Err(InvalidRecord::Generated { expected: 1, .. })
        ));
        // A first token that stopped the request is resampled as a stop.
        let stopped = Expectation {
            last_token: Some(2),
            ..expectation(40, 1, done::STOP)
        };
        let stop = check(resample, record(2, 1, 40, done::STOP, 1), stopped);
        assert_eq!(stop, Ok(Outcome::Resampled));
        let running = check(resample, record(2, 1, 40, 0, 1), stopped);
        assert!(matches!(running, Err(InvalidRecord::Done { .. })));
    }

    #[test]
    fn records_of_ended_requests_are_ignored() {
        let expect = Expectation {
            ignored: true,
            ..expectation(10, 1, 0)
        };
        let garbage = CompletionRecord {
            slot: 9,
            ..record(99, 99, 99, 99, 99)
        };
        assert_eq!(check(DECODE, garbage, expect), Ok(Outcome::Ignored));
    }

    #[test]
    fn bad_padding_or_row_count_rejects_the_whole_completion() {
        let rows = [DECODE, Row::Padding];
        let sampled = record(5, 2, 11, 0, 1);
        let expect = |_| Some(expectation(10, 1, 0));
        let short = check_records(&rows, &[sampled], &geometry(), expect);
        assert_eq!(
            short,
            Err(InvalidRecord::RowCount {
                expected: 2,
                found: 1
            })
        );
        let live_padding = record(5, 2, 11, 0, 1);
        let padded = check_records(&rows, &[sampled, live_padding], &geometry(), expect);
        assert!(matches!(padded, Err(InvalidRecord::Slot { row: 1, .. })));
    }
}

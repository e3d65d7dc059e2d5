//! Errors of the prefix cache. Endpoint mapping has its own
//! ([`super::EndpointError`]).

use thiserror::Error;

use crate::scheduler::Page;

use super::ids::{CheckpointId, SnapshotRow};
use super::publication::Publication;

/// A configuration or call the checkpoint store rejects.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PrefixError {
    /// The page geometry declares 0 tokens per page.
    #[error("page_tokens is 0")]
    ZeroPageTokens,
    /// The row layout declares no part.
    #[error("the row layout declares no part")]
    EmptyRowLayout,
    /// A row part of 0 bytes.
    #[error("row part {name} has 0 bytes")]
    EmptyRowPart {
        /// The part.
        name: String,
    },
    /// Two row parts with one name.
    #[error("row part {name} is declared twice")]
    DuplicateRowPart {
        /// The part.
        name: String,
    },
    /// The id names no live checkpoint.
    #[error("{0} is not in the store")]
    UnknownCheckpoint(CheckpointId),
    /// A checkpoint of no token.
    #[error("a checkpoint needs at least one consumed token")]
    EmptyEndpoint,
    /// The endpoint lies past the published token stream.
    #[error("endpoint {endpoint} is past the stream's {tokens} tokens")]
    EndpointBeyondChain {
        /// The endpoint.
        endpoint: u32,
        /// Tokens in the stream.
        tokens: u32,
    },
    /// The endpoint does not extend its parent.
    #[error("endpoint {endpoint} does not extend the parent's {parent_tokens} tokens")]
    EndpointNotAfterParent {
        /// The endpoint.
        endpoint: u32,
        /// The parent's endpoint.
        parent_tokens: u32,
    },
    /// The parent is not a prefix of the published stream.
    #[error("{parent} is not a prefix of the published stream")]
    ParentNotPrefix {
        /// The parent.
        parent: CheckpointId,
    },
    /// The publication hands over the wrong number of complete pages.
    #[error("the publication hands over {given} pages, its endpoint completes {expected}")]
    PageCount {
        /// Complete pages past the parent's.
        expected: u32,
        /// Pages handed over.
        given: u32,
    },
    /// A handed-over page is the null page, repeated, or already cached.
    #[error("{page} is not a private page of the publishing request")]
    PageNotPrivate {
        /// The page.
        page: Page,
    },
    /// The reservation's row is not reserved in this store.
    #[error("{row} is not reserved in this store")]
    ForeignReservation {
        /// The row.
        row: SnapshotRow,
    },
}

/// A publication the store refused, with everything it held, so nothing
/// leaks.
#[derive(Debug, Error)]
#[error("publication rejected: {error}")]
pub struct RejectedPublication {
    /// Why.
    #[source]
    pub error: PrefixError,
    /// The reservation, parent pin and pages, untouched.
    pub publication: Publication,
}

/// No snapshot row can be had: every row is reserved by a copy, held by a
/// pinned or in-use checkpoint, or needed to keep a branch. The design:
/// inference continues without publishing that checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("no snapshot row: {reserved} of {rows} reserved, the rest held by retained checkpoints")]
pub struct NoSnapshotRow {
    /// Rows in the pool.
    pub rows: u32,
    /// Rows reserved by captures in flight.
    pub reserved: u32,
}

//! Publication: a completed snapshot copy becomes a visible checkpoint.
//!
//! The design: "At each required prefill endpoint, the scheduler drains
//! submitted work, snapshots the exact live state, and publishes only after
//! the copy fence completes. The published endpoint pins the request's
//! shared parent and transfers its completed private pages into that chain
//! without changing physical page order." And: "A duplicate publication
//! releases only its unused snapshot reservation; it does not replace
//! computed live pages with another request's physical page chain."
//!
//! The new checkpoint's parent link is the request's pinned ancestor (the
//! checkpoint it restored from or last published), and the request's pin
//! moves to the new checkpoint: its chain keeps the parent's pages alive
//! structurally, and thinning may later fold the parent into it.
//!
//! A checkpoint published for extension only (an interior endpoint captured
//! after a chunk that ran past it, on a core whose continuation is
//! positional KV alone) holds exact pages and tail but the hidden vector of
//! a later position: lookup never offers it to a request whose whole history
//! it covers (`store.rs`). An exact capture of the same endpoint is a
//! duplicate like any other: its row holds another request's tail over the
//! checkpoint's pages, whose low bits may differ (another chunk partition),
//! so swapping rows would restore a state no request computed.

use crate::scheduler::Page;

use super::checkpoint::Checkpoint;
use super::error::{PrefixError, RejectedPublication};
use super::identity::{EndpointKey, PrefixChain};
use super::ids::{CheckpointId, Pin, SnapshotReservation};
use super::store::CheckpointStore;

/// A capture whose snapshot copy has completed.
#[derive(Debug)]
pub struct Publication {
    /// The row the copy wrote.
    pub reservation: SnapshotReservation,
    /// The request's pinned ancestor, whose complete pages lead its page
    /// table; `None` when it restored nothing and published nothing yet.
    pub parent: Option<Pin>,
    /// The consumed count the snapshot froze.
    pub endpoint: u32,
    /// Whether the row holds the endpoint's pages and tail but not its
    /// hidden vector (the live state had run past it): the checkpoint is
    /// published for extension only.
    pub extension_only: bool,
    /// The request's private pages completed past the parent's, in logical
    /// order: `endpoint / page - parent_tokens / page` of them. Its partial
    /// tail page stays private (the row holds a copy).
    pub pages: Vec<Page>,
}

/// What a publication became.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    /// A new checkpoint holding the pages; the request now pins it (the
    /// parent pin was handed back).
    New(Pin),
    /// The endpoint was already cached: the reservation went back to the
    /// pool and the request keeps its parent pin and its private pages.
    Duplicate {
        /// The checkpoint already at the endpoint.
        existing: CheckpointId,
        /// The request's parent pin, unchanged.
        parent: Option<Pin>,
        /// The request's pages, still private.
        pages: Vec<Page>,
    },
}

impl CheckpointStore {
    /// Publishes the endpoint `publication.endpoint` of `chain` (the
    /// request's consumed token stream).
    ///
    /// An endpoint already cached is a duplicate whatever the parent and
    /// pages (a request may capture the endpoint it just published, as when
    /// one output token makes prompt and terminal endpoints equal): nothing
    /// but the reservation changes hands, so nothing else is checked.
    pub fn publish(
        &mut self,
        chain: &PrefixChain,
        publication: Publication,
    ) -> Result<Published, Box<RejectedPublication>> {
        let key = match self.check_endpoint(chain, &publication) {
            Ok(key) => key,
            Err(error) => return Err(Box::new(RejectedPublication { error, publication })),
        };
        let now = self.tick();
        if let Some(&existing) = self.by_key.get(&key) {
            let Publication {
                reservation,
                parent,
                pages,
                ..
            } = publication;
            self.rows.unreserve(reservation.row);
            self.checkpoints
                .get_mut(&existing)
                .expect("indexed")
                .last_use = now;
            self.metrics.duplicate_publications += 1;
            return Ok(Published::Duplicate {
                existing,
                parent,
                pages,
            });
        }
        if let Err(error) = self.check_chain(chain, &publication) {
            return Err(Box::new(RejectedPublication { error, publication }));
        }
        let Publication {
            reservation,
            parent,
            pages,
            extension_only,
            ..
        } = publication;
        let id = CheckpointId(self.next_id);
        self.next_id += 1;
        self.rows.adopt(reservation.row);
        self.cached_pages.extend(pages.iter().copied());
        let parent_id = parent.as_ref().map(Pin::checkpoint);
        self.checkpoints.insert(
            id,
            Checkpoint {
                key,
                parent: parent_id,
                children: Vec::new(),
                segment: pages,
                row: reservation.row,
                extension_only,
                pins: 1,
                uses: 0,
                last_use: now,
            },
        );
        self.outstanding_pins += 1;
        self.index(id);
        if let Some(parent) = parent {
            self.node_mut(parent.id).children.push(id);
            self.unpin(parent);
        }
        self.metrics.published += 1;
        self.metrics.extension_only += u64::from(extension_only);
        Ok(Published::New(Pin { id }))
    }

    /// The endpoint's key, for a nonempty endpoint within the stream and a
    /// reservation of this store.
    fn check_endpoint(
        &self,
        chain: &PrefixChain,
        publication: &Publication,
    ) -> Result<EndpointKey, PrefixError> {
        let endpoint = publication.endpoint;
        if endpoint == 0 {
            return Err(PrefixError::EmptyEndpoint);
        }
        let row = publication.reservation.row;
        if !self.rows.is_reserved(row) {
            return Err(PrefixError::ForeignReservation { row });
        }
        chain
            .endpoint_key(endpoint)
            .ok_or(PrefixError::EndpointBeyondChain {
                endpoint,
                tokens: chain.len(),
            })
    }

    /// The parent extends into the endpoint and the pages complete it.
    fn check_chain(
        &self,
        chain: &PrefixChain,
        publication: &Publication,
    ) -> Result<(), PrefixError> {
        let endpoint = publication.endpoint;
        let parent_tokens = match &publication.parent {
            None => 0,
            Some(pin) => {
                let parent = (self.checkpoints.get(&pin.id))
                    .ok_or(PrefixError::UnknownCheckpoint(pin.id))?;
                if parent.tokens() >= endpoint {
                    return Err(PrefixError::EndpointNotAfterParent {
                        endpoint,
                        parent_tokens: parent.tokens(),
                    });
                }
                if chain.endpoint_key(parent.tokens()) != Some(parent.key) {
                    return Err(PrefixError::ParentNotPrefix { parent: pin.id });
                }
                parent.tokens()
            }
        };
        let expected =
            self.geometry.complete_pages(endpoint) - self.geometry.complete_pages(parent_tokens);
        let given = u32::try_from(publication.pages.len()).unwrap_or(u32::MAX);
        if given != expected {
            return Err(PrefixError::PageCount { expected, given });
        }
        for (i, &page) in publication.pages.iter().enumerate() {
            if page.is_null()
                || self.cached_pages.contains(&page)
                || publication.pages[..i].contains(&page)
            {
                return Err(PrefixError::PageNotPrivate { page });
            }
        }
        Ok(())
    }
}

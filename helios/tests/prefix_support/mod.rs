//! Shared setup of the prefix-cache tests: a CPU device that plays the
//! maintenance graphs over page and row contents, requests that consume,
//! capture and restore through the store, and whole-state checks.
//!
//! The device interprets rows by part name, as a recipe's captured graphs
//! would; the store never does. A request's model state is a pure function
//! of its consumed tokens, so every restore and every cached chain can be
//! compared with a direct computation.
#![allow(dead_code)] // each test crate uses a different part

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use helios::prefix::{
    CheckpointId, CheckpointStore, Eviction, GpuUse, PageGeometry, Pin, PrefixChain, Publication,
    Published, RestorePlan, RowLayout, SnapshotReservation, SnapshotRow, StoreConfig,
};
use helios::scheduler::Page;

/// The salt every test stream shares.
pub const SALT: &[u8] = b"test-model";

/// What a continuation row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// Dense attention: partial tail page, final hidden vector.
    Dense,
    /// Synthetic hybrid recurrent model: recurrent matrix and convolution
    /// history besides the dense parts.
    Recurrent,
}

impl Recipe {
    pub const ALL: [Recipe; 2] = [Recipe::Dense, Recipe::Recurrent];

    /// The recipe's declared row layout at this page size.
    pub fn layout(self, page_tokens: u32) -> RowLayout {
        let tail = u64::from(page_tokens) * 4;
        match self {
            Recipe::Dense => {
                RowLayout::new([("kv_tail", tail), ("hidden", 8), ("consumed", 4)]).unwrap()
            }
            Recipe::Recurrent => RowLayout::new([
                ("recurrent", 32),
                ("conv", 12),
                ("kv_tail", tail),
                ("hidden", 8),
                ("consumed", 4),
            ])
            .unwrap(),
        }
    }
}

/// The page geometries every lifecycle test covers.
pub const GEOMETRIES: [u32; 3] = [64, 128, 256];

/// Marks a KV position never written.
const EMPTY: u32 = u32::MAX;

/// A request's model state after consuming some tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelState {
    pub consumed: u32,
    pub hidden: u64,
    pub recurrent: [u64; 4],
    pub conv: [u32; 3],
}

impl ModelState {
    pub fn new() -> Self {
        Self {
            consumed: 0,
            hidden: 0x9e37_79b9,
            recurrent: [0; 4],
            conv: [EMPTY; 3],
        }
    }

    /// Consumes one token under `recipe`.
    pub fn consume(&mut self, recipe: Recipe, token: u32) {
        self.consumed += 1;
        self.hidden = (self.hidden ^ u64::from(token)).wrapping_mul(0x100_0000_01b3);
        if recipe == Recipe::Recurrent {
            for (i, lane) in self.recurrent.iter_mut().enumerate() {
                *lane = lane
                    .wrapping_mul(2 * i as u64 + 3)
                    .wrapping_add(u64::from(token));
            }
            self.conv = [self.conv[1], self.conv[2], token];
        }
    }

    /// The state after consuming `tokens` from the start.
    pub fn of(recipe: Recipe, tokens: &[u32]) -> Self {
        let mut state = Self::new();
        for &token in tokens {
            state.consume(recipe, token);
        }
        state
    }
}

impl Default for ModelState {
    fn default() -> Self {
        Self::new()
    }
}

/// KV pages and snapshot rows with contents, a free list of pages, and the
/// maintenance operations over them.
pub struct Device {
    pub recipe: Recipe,
    pub page_tokens: u32,
    pub layout: RowLayout,
    /// Page contents by page id (page 0 is the null page).
    pub pages: Vec<Vec<u32>>,
    pub free: VecDeque<Page>,
    /// Pages the store holds: immutable.
    pub cached: HashSet<Page>,
    pub rows: Vec<Option<BTreeMap<String, Vec<u8>>>>,
}

impl Device {
    pub fn new(recipe: Recipe, page_tokens: u32, kv_pages: u32, rows: u32) -> Self {
        Self {
            recipe,
            page_tokens,
            layout: recipe.layout(page_tokens),
            pages: vec![vec![EMPTY; page_tokens as usize]; kv_pages as usize],
            free: (1..kv_pages).map(Page).collect(),
            cached: HashSet::new(),
            rows: vec![None; rows as usize],
        }
    }

    /// Writes the token at `position` of a request's page table.
    pub fn write(&mut self, table: &[Page], position: u32, token: u32) {
        let page = table[(position / self.page_tokens) as usize];
        assert!(
            !self.cached.contains(&page) && !page.is_null(),
            "a write to {page}, which is not private"
        );
        self.pages[page.0 as usize][(position % self.page_tokens) as usize] = token;
    }

    /// The snapshot graph: freezes a request's exact state into `row`.
    pub fn snapshot(&mut self, row: SnapshotRow, table: &[Page], state: &ModelState) {
        let tail_page = (!state.consumed.is_multiple_of(self.page_tokens))
            .then(|| table[(state.consumed / self.page_tokens) as usize]);
        let mut parts = BTreeMap::new();
        for part in self.layout.parts() {
            let bytes: Vec<u8> = match part.name.as_str() {
                "kv_tail" => {
                    let tail = match tail_page {
                        Some(page) => self.pages[page.0 as usize].clone(),
                        None => vec![EMPTY; self.page_tokens as usize],
                    };
                    tail.iter().flat_map(|t| t.to_le_bytes()).collect()
                }
                "hidden" => state.hidden.to_le_bytes().to_vec(),
                "consumed" => state.consumed.to_le_bytes().to_vec(),
                "recurrent" => state
                    .recurrent
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "conv" => state.conv.iter().flat_map(|v| v.to_le_bytes()).collect(),
                other => panic!("unknown part {other}"),
            };
            assert_eq!(bytes.len() as u64, part.bytes, "{} bytes", part.name);
            parts.insert(part.name.clone(), bytes);
        }
        self.rows[row.0 as usize] = Some(parts);
    }

    /// A row's saved state and KV tail, read without changing anything.
    pub fn row_state(&self, row: SnapshotRow) -> (ModelState, Vec<u32>) {
        let parts = self.rows[row.0 as usize].as_ref().expect("a written row");
        let words = |name: &str| -> Vec<u32> {
            (parts
                .get(name)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .chunks(4))
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
        };
        let longs = |name: &str| -> Vec<u64> {
            (parts
                .get(name)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .chunks(8))
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
        };
        let mut state = ModelState::new();
        state.consumed = words("consumed")[0];
        state.hidden = longs("hidden")[0];
        if parts.contains_key("recurrent") {
            state.recurrent = longs("recurrent").try_into().unwrap();
            state.conv = words("conv").try_into().unwrap();
        }
        (state, words("kv_tail"))
    }

    /// The restore graph: installs `plan.row` into a request whose page
    /// table holds the shared pages then `tail` (a private page) when the
    /// endpoint is not aligned. Checks the expected consumed count first,
    /// as the graph's status does.
    pub fn restore(&mut self, plan: &RestorePlan, tail: Option<Page>) -> ModelState {
        let (state, kv_tail) = self.row_state(plan.row);
        assert_eq!(
            state.consumed, plan.consumed,
            "the row holds another endpoint"
        );
        assert_eq!(tail.is_some(), plan.needs_private_tail());
        if let Some(page) = tail {
            assert!(!self.cached.contains(&page), "restoring into a shared page");
            self.pages[page.0 as usize] = kv_tail;
        }
        state
    }
}

/// One request: its whole token stream, what it consumed, its page table
/// and its pinned ancestor.
pub struct Request {
    /// Every token it will consume, then its last sampled (pending) token.
    pub stream: Vec<u32>,
    /// The consumed tokens' chain.
    pub chain: PrefixChain,
    /// Its page table: `shared` leading pages belong to its pinned chain,
    /// the rest are private.
    pub pages: Vec<Page>,
    pub shared: usize,
    pub pin: Option<Pin>,
    pub state: ModelState,
    /// Tokens its admission reused.
    pub reused: u32,
}

impl Request {
    pub fn consumed(&self) -> u32 {
        self.state.consumed
    }
}

/// What a capture became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    New(CheckpointId),
    Duplicate(CheckpointId),
    /// No row could be had: inference continues without publishing.
    Refused,
}

/// Out of KV pages: nothing more could be reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfPages;

/// The store, the device and what every live checkpoint must contain.
pub struct Harness {
    pub store: CheckpointStore,
    pub device: Device,
    /// The tokens of every live checkpoint.
    pub contents: HashMap<CheckpointId, Vec<u32>>,
    pub kv_pages: u32,
}

impl Harness {
    pub fn new(recipe: Recipe, page_tokens: u32, rows: u32, kv_pages: u32) -> Self {
        let config = StoreConfig {
            geometry: PageGeometry::new(page_tokens).unwrap(),
            rows,
            layout: recipe.layout(page_tokens),
        };
        Self {
            store: CheckpointStore::new(config),
            device: Device::new(recipe, page_tokens, kv_pages, rows),
            contents: HashMap::new(),
            kv_pages,
        }
    }

    pub fn page_tokens(&self) -> u32 {
        self.device.page_tokens
    }

    /// Admits a request for `stream`, reusing the longest cached prefix of
    /// its first `limit` tokens: pin, restore, check the restored state
    /// exactly. The restore's GPU use ends at once.
    pub fn admit(&mut self, stream: &[u32], limit: u32) -> Result<Request, OutOfPages> {
        let (request, restore) = self.admit_async(stream, limit)?;
        if let Some(gpu_use) = restore {
            self.store.end_use(gpu_use);
        }
        Ok(request)
    }

    /// As [`Self::admit`], the restore's GPU use left outstanding: the
    /// caller ends it when the copy "completes".
    pub fn admit_async(
        &mut self,
        stream: &[u32],
        limit: u32,
    ) -> Result<(Request, Option<GpuUse>), OutOfPages> {
        let chain = PrefixChain::new(SALT, &stream[..limit as usize]);
        let mut request = Request {
            stream: stream.to_vec(),
            chain: PrefixChain::new(SALT, &[]),
            pages: Vec::new(),
            shared: 0,
            pin: None,
            state: ModelState::new(),
            reused: 0,
        };
        let Some((pin, hit)) = self.store.acquire(&chain, limit) else {
            return Ok((request, None));
        };
        let plan = self.store.restore_plan(&pin);
        let tail = if plan.needs_private_tail() {
            match self.take_page() {
                Some(page) => Some(page),
                None => {
                    self.store.unpin(pin);
                    return Err(OutOfPages);
                }
            }
        } else {
            None
        };
        let gpu_use = self.store.begin_use(&pin);
        request.state = self.device.restore(&plan, tail);
        request.pages = plan.shared_pages.clone();
        request.shared = request.pages.len();
        request.pages.extend(tail);
        request.pin = Some(pin);
        request.reused = hit.tokens();
        request.chain = PrefixChain::new(SALT, &stream[..hit.tokens() as usize]);
        self.check_request(&request);
        Ok((request, Some(gpu_use)))
    }

    /// Takes a free page, reclaiming cached pages under page pressure.
    pub fn take_page(&mut self) -> Option<Page> {
        if self.device.free.is_empty() {
            let eviction = self.store.reclaim_pages(1);
            self.apply(eviction);
        }
        self.device.free.pop_front()
    }

    /// Consumes the request's stream up to `upto` tokens.
    pub fn consume(&mut self, request: &mut Request, upto: u32) -> Result<(), OutOfPages> {
        assert!(
            upto < request.stream.len() as u32,
            "the last token stays pending"
        );
        let page_tokens = self.page_tokens();
        while request.consumed() < upto {
            let position = request.consumed();
            if position / page_tokens >= request.pages.len() as u32 {
                let page = self.take_page().ok_or(OutOfPages)?;
                request.pages.push(page);
            }
            let token = request.stream[position as usize];
            self.device.write(&request.pages, position, token);
            request.state.consume(self.device.recipe, token);
            request.chain.extend(&[token]);
        }
        Ok(())
    }

    /// Takes a row and runs the snapshot graph at the consumed endpoint.
    pub fn launch_snapshot(&mut self, request: &Request) -> Option<SnapshotReservation> {
        let grant = self.store.reserve_snapshot().ok()?;
        self.apply(grant.eviction);
        let row = grant.reservation.row();
        self.device.snapshot(row, &request.pages, &request.state);
        Some(grant.reservation)
    }

    /// Publishes a completed snapshot of the request's consumed endpoint.
    pub fn complete_snapshot(
        &mut self,
        request: &mut Request,
        reservation: SnapshotReservation,
    ) -> Capture {
        let endpoint = request.consumed();
        let complete = (endpoint / self.page_tokens()) as usize;
        let publication = Publication {
            reservation,
            parent: request.pin.take(),
            endpoint,
            extension_only: false,
            pages: request.pages[request.shared..complete].to_vec(),
        };
        match self.store.publish(&request.chain, publication).unwrap() {
            Published::New(pin) => {
                let id = pin.checkpoint();
                self.device
                    .cached
                    .extend(&request.pages[request.shared..complete]);
                request.shared = complete;
                request.pin = Some(pin);
                self.contents.insert(id, request.chain.tokens().to_vec());
                Capture::New(id)
            }
            Published::Duplicate {
                existing,
                parent,
                pages,
            } => {
                assert_eq!(pages, request.pages[request.shared..complete]);
                request.pin = parent;
                Capture::Duplicate(existing)
            }
        }
    }

    /// Drain, snapshot, publish after the copy: at once.
    pub fn capture(&mut self, request: &mut Request) -> Capture {
        match self.launch_snapshot(request) {
            Some(reservation) => self.complete_snapshot(request, reservation),
            None => Capture::Refused,
        }
    }

    /// Consumes up to `endpoint` and captures there.
    pub fn capture_at(&mut self, request: &mut Request, endpoint: u32) -> Capture {
        self.consume(request, endpoint).unwrap();
        self.capture(request)
    }

    /// Ends a request: its pin goes back, its private pages are freed.
    pub fn finish(&mut self, mut request: Request) {
        if let Some(pin) = request.pin.take() {
            self.store.unpin(pin);
        }
        let private = request.pages.split_off(request.shared);
        self.device.free.extend(private);
    }

    /// Gives freed pages back to the pool and forgets retired checkpoints.
    pub fn apply(&mut self, eviction: Eviction) {
        for id in eviction.evicted.iter().chain(&eviction.thinned) {
            assert!(self.contents.remove(id).is_some(), "{id} was live");
        }
        for page in &eviction.pages {
            assert!(self.device.cached.remove(page), "{page} was cached");
            self.device.pages[page.0 as usize] = vec![EMPTY; self.page_tokens() as usize];
        }
        self.device.free.extend(eviction.pages);
    }

    /// The request's page table and state match its consumed tokens and
    /// its pinned chain.
    pub fn check_request(&self, request: &Request) {
        let consumed = request.consumed();
        assert_eq!(request.chain.tokens(), &request.stream[..consumed as usize]);
        let expected = ModelState::of(self.device.recipe, request.chain.tokens());
        assert_eq!(
            request.state, expected,
            "the live state after {consumed} tokens"
        );
        let page_tokens = self.page_tokens() as usize;
        for (i, written) in request.chain.tokens().chunks(page_tokens).enumerate() {
            let page = request.pages[i];
            assert_eq!(
                self.device.pages[page.0 as usize][..written.len()],
                *written,
                "page {i} of the request's page table"
            );
        }
        match &request.pin {
            Some(pin) => {
                let chain = self.store.chain_pages(pin.checkpoint());
                assert_eq!(chain, request.pages[..request.shared]);
            }
            None => assert_eq!(request.shared, 0),
        }
        for page in &request.pages[request.shared..] {
            assert!(
                !self.device.cached.contains(page),
                "{page} private and cached"
            );
        }
    }

    /// Every invariant: the store's own, every cached chain's contents and
    /// row, and exact page accounting against the given live requests.
    pub fn check(&self, live: &[&Request]) {
        self.store.verify().unwrap();
        assert_eq!(self.contents.len(), self.store.len());
        for id in self.store.ids() {
            self.check_checkpoint(id);
        }
        let mut seen: HashSet<Page> = self.device.free.iter().copied().collect();
        assert_eq!(seen.len(), self.device.free.len(), "a page free twice");
        for page in &self.device.cached {
            assert!(seen.insert(*page), "{page} cached and free");
        }
        for request in live {
            self.check_request(request);
            for page in &request.pages[request.shared..] {
                assert!(seen.insert(*page), "{page} private and elsewhere too");
            }
        }
        assert_eq!(seen.len() as u32, self.kv_pages - 1, "pages leaked");
        let pressure = self.store.pressure();
        assert_eq!(pressure.pages.held as usize, self.device.cached.len());
    }

    /// One cached checkpoint's chain and row hold exactly its tokens.
    pub fn check_checkpoint(&self, id: CheckpointId) {
        let tokens = &self.contents[&id];
        let info = self.store.checkpoint(id).unwrap();
        assert_eq!(info.tokens() as usize, tokens.len());
        let page_tokens = self.page_tokens() as usize;
        let pages = self.store.chain_pages(id);
        assert_eq!(pages.len(), tokens.len() / page_tokens);
        for (i, page) in pages.iter().enumerate() {
            assert!(self.device.cached.contains(page));
            assert_eq!(
                self.device.pages[page.0 as usize],
                tokens[i * page_tokens..(i + 1) * page_tokens],
                "{id}: page {i} of its chain"
            );
        }
        let (state, kv_tail) = self.device.row_state(info.row);
        assert_eq!(
            state,
            ModelState::of(self.device.recipe, tokens),
            "{id}: row state"
        );
        let tail = &tokens[pages.len() * page_tokens..];
        assert_eq!(&kv_tail[..tail.len()], tail, "{id}: row tail");
    }

    /// Ends everything: every live request finishes, every checkpoint is
    /// evicted; nothing may remain lent, held or leaked.
    pub fn drain(&mut self, live: Vec<Request>) {
        for request in live {
            self.finish(request);
        }
        let eviction = self.store.clear_unused();
        self.apply(eviction);
        assert!(self.store.is_empty());
        assert_eq!(self.store.outstanding(), Default::default());
        let pressure = self.store.pressure();
        assert_eq!(pressure.rows.free, pressure.rows.rows);
        assert_eq!(self.device.free.len() as u32, self.kv_pages - 1);
        self.check(&[]);
    }
}

#[path = "../rng/mod.rs"]
mod rng;
pub use rng::Rng;

/// `len` tokens derived from `seed`.
pub fn tokens(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed ^ 0x70_6b65);
    (0..len).map(|_| rng.below(50_000) as u32).collect()
}

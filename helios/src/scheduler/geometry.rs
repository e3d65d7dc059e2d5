//! The scheduler's view of the prepared contract: capacities and page
//! geometry, nothing model-specific.

use crate::core::proto::PreparedContract;
use crate::core::ValidCore;

use super::error::GeometryError;

/// The declared geometry every scheduling decision derives from.
///
/// Built from the core's `PreparedContract` (capacities, page size, KV pages,
/// vocabulary) and its frontend's EOS ids (the device's stop tokens). The
/// capacity lists are strictly ascending and end at `max_concurrency` and
/// `prefill_chunk_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    page_size: u32,
    max_concurrency: u32,
    context_limit: u32,
    prefill_chunk_size: u32,
    decode_capacities: Vec<u32>,
    prefill_capacities: Vec<u32>,
    kv_pages: u32,
    vocab_size: u32,
    stop_tokens: Vec<u32>,
}

impl Geometry {
    /// The geometry of a validated core: its contract and its EOS ids.
    pub fn from_core(core: &ValidCore) -> Result<Self, GeometryError> {
        Self::from_contract(core.contract(), &core.frontend().eos_token_ids)
    }

    /// The geometry of a contract whose graphs stop on `stop_tokens`.
    pub fn from_contract(
        contract: &PreparedContract,
        stop_tokens: &[u32],
    ) -> Result<Self, GeometryError> {
        let invalid = |field, reason| Err(GeometryError { field, reason });
        if contract.page_size == 0 {
            return invalid("page_size", "is 0");
        }
        if contract.max_concurrency == 0 {
            return invalid("max_concurrency", "is 0");
        }
        check_capacities(&contract.decode_capacities, contract.max_concurrency).map_err(
            |reason| GeometryError {
                field: "decode_capacities",
                reason,
            },
        )?;
        check_capacities(&contract.prefill_capacities, contract.prefill_chunk_size).map_err(
            |reason| GeometryError {
                field: "prefill_capacities",
                reason,
            },
        )?;
        if contract.context_limit == 0 {
            return invalid("context_limit", "is 0");
        }
        if contract.kv_pages < 2 {
            return invalid("kv_pages", "must be at least 2 (page 0 is the null page)");
        }
        if contract.vocab_size == 0 {
            return invalid("vocab_size", "is 0");
        }
        if stop_tokens.is_empty() {
            return invalid("stop_tokens", "is empty");
        }
        if stop_tokens
            .iter()
            .any(|&token| token >= contract.vocab_size)
        {
            return invalid("stop_tokens", "holds a token outside the vocabulary");
        }
        Ok(Self {
            page_size: contract.page_size,
            max_concurrency: contract.max_concurrency,
            context_limit: contract.context_limit,
            prefill_chunk_size: contract.prefill_chunk_size,
            decode_capacities: contract.decode_capacities.clone(),
            prefill_capacities: contract.prefill_capacities.clone(),
            kv_pages: contract.kv_pages,
            vocab_size: contract.vocab_size,
            stop_tokens: stop_tokens.to_vec(),
        })
    }

    /// Tokens per KV page.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Live slots (`1..=max_concurrency`; slot 0 is the null slot).
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency
    }

    /// The most tokens (prompt plus output) one request may hold.
    pub fn context_limit(&self) -> u32 {
        self.context_limit
    }

    /// The longest prefill chunk.
    pub fn prefill_chunk_size(&self) -> u32 {
        self.prefill_chunk_size
    }

    /// Captured decode capacities, ascending.
    pub fn decode_capacities(&self) -> &[u32] {
        &self.decode_capacities
    }

    /// Captured prefill capacities, ascending.
    pub fn prefill_capacities(&self) -> &[u32] {
        &self.prefill_capacities
    }

    /// The same geometry over `kv_pages` backed pages (at least 2, at most
    /// the prepared count): a loaded core may back fewer pages than it was
    /// prepared with.
    pub fn with_kv_pages(mut self, kv_pages: u32) -> Result<Self, GeometryError> {
        if kv_pages < 2 || kv_pages > self.kv_pages {
            return Err(GeometryError {
                field: "kv_pages",
                reason: "backed pages must be at least 2 and at most the prepared count",
            });
        }
        self.kv_pages = kv_pages;
        Ok(self)
    }

    /// Pages the KV region holds, the null page included.
    pub fn kv_pages(&self) -> u32 {
        self.kv_pages
    }

    /// Pages requests can use: every page but the null page.
    pub fn usable_pages(&self) -> u32 {
        self.kv_pages - 1
    }

    /// Size of the vocabulary: valid tokens are `0..vocab_size`.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Tokens whose sampling finishes a request with reason stop.
    pub fn stop_tokens(&self) -> &[u32] {
        &self.stop_tokens
    }

    /// Whether sampling `token` finishes a request.
    pub fn is_stop(&self, token: u32) -> bool {
        self.stop_tokens.contains(&token)
    }

    /// Pages that hold `tokens` tokens.
    pub fn pages_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.page_size)
    }

    /// The smallest decode capacity that holds `rows` rows.
    pub fn decode_capacity(&self, rows: u32) -> Option<u32> {
        smallest_at_least(&self.decode_capacities, rows)
    }

    /// The smallest prefill capacity that holds `tokens` tokens.
    pub fn prefill_capacity(&self, tokens: u32) -> Option<u32> {
        smallest_at_least(&self.prefill_capacities, tokens)
    }
}

/// Non-empty, positive, strictly ascending and ending at `last`.
fn check_capacities(capacities: &[u32], last: u32) -> Result<(), &'static str> {
    match capacities {
        [] => Err("is empty"),
        [0, ..] => Err("starts at 0"),
        _ if capacities.windows(2).any(|pair| pair[0] >= pair[1]) => {
            Err("is not strictly ascending")
        }
        [.., end] if *end != last => Err("does not end at its maximum"),
        _ => Ok(()),
    }
}

fn smallest_at_least(capacities: &[u32], wanted: u32) -> Option<u32> {
    capacities
        .iter()
        .copied()
        .find(|&capacity| capacity >= wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract() -> PreparedContract {
        PreparedContract {
            page_size: 16,
            max_concurrency: 4,
            context_limit: 512,
            prefill_chunk_size: 64,
            decode_capacities: vec![1, 2, 4],
            prefill_capacities: vec![32, 64],
            kv_pages: 9,
            vocab_size: 100,
            ..PreparedContract::default()
        }
    }

    #[test]
    fn capacities_round_up_to_the_smallest_captured_one() {
        let geometry = Geometry::from_contract(&contract(), &[2]).unwrap();
        assert_eq!(geometry.decode_capacity(3), Some(4));
        assert_eq!(geometry.decode_capacity(5), None);
        assert_eq!(geometry.prefill_capacity(1), Some(32));
        assert_eq!(geometry.prefill_capacity(33), Some(64));
        assert_eq!(geometry.pages_for(0), 0);
        assert_eq!(geometry.pages_for(17), 2);
        assert_eq!(geometry.usable_pages(), 8);
    }

    #[test]
    fn a_loaded_core_may_back_fewer_pages_never_more() {
        let geometry = Geometry::from_contract(&contract(), &[2]).unwrap();
        let smaller = geometry.clone().with_kv_pages(5).unwrap();
        assert_eq!(smaller.kv_pages(), 5);
        assert_eq!(smaller.usable_pages(), 4);
        for pages in [1, 10] {
            let error = geometry.clone().with_kv_pages(pages).unwrap_err();
            assert_eq!(error.field, "kv_pages");
        }
    }

    #[test]
    fn a_validated_core_yields_its_contract_geometry() {
        let core = ValidCore::new(crate::core::sample::tiny_core()).unwrap();
        let geometry = Geometry::from_core(&core).unwrap();
        assert_eq!(
            geometry.decode_capacities(),
            crate::core::sample::SAMPLE_DECODE
        );
        assert_eq!(
            geometry.prefill_capacities(),
            crate::core::sample::SAMPLE_PREFILL
        );
        assert_eq!(geometry.stop_tokens(), core.frontend().eos_token_ids);
        assert_eq!(geometry.usable_pages(), core.contract().kv_pages - 1);
    }

    #[test]
    fn unusable_contracts_name_the_field() {
        let field = |change: fn(&mut PreparedContract), stop: &[u32]| {
            let mut contract = contract();
            change(&mut contract);
            Geometry::from_contract(&contract, stop).unwrap_err().field
        };
        assert_eq!(field(|c| c.page_size = 0, &[2]), "page_size");
        assert_eq!(
            field(|c| c.decode_capacities = vec![1, 2], &[2]),
            "decode_capacities"
        );
        assert_eq!(
            field(|c| c.prefill_capacities = vec![64, 32], &[2]),
            "prefill_capacities"
        );
        assert_eq!(field(|c| c.kv_pages = 1, &[2]), "kv_pages");
        assert_eq!(field(|_| {}, &[]), "stop_tokens");
        assert_eq!(field(|_| {}, &[100]), "stop_tokens");
    }
}

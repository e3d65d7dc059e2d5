//! Page geometry: the model's declared physical tokens per page.
//!
//! The design: "The scheduler and prefix cache use the model's declared
//! physical token capacity per page" (64, 128 or 256 tokens). A checkpoint
//! at endpoint `t` owns `t / page` complete pages, shared with its chain;
//! its partial tail (`t % page` tokens) lives in its continuation row.

use super::error::PrefixError;

/// Tokens per physical page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageGeometry {
    page_tokens: u32,
}

impl PageGeometry {
    /// A geometry of `page_tokens` tokens per page.
    pub fn new(page_tokens: u32) -> Result<Self, PrefixError> {
        if page_tokens == 0 {
            return Err(PrefixError::ZeroPageTokens);
        }
        Ok(Self { page_tokens })
    }

    /// Tokens per page.
    pub fn page_tokens(self) -> u32 {
        self.page_tokens
    }

    /// Complete pages of a prefix of `tokens`: the pages a checkpoint there
    /// shares with its chain.
    pub fn complete_pages(self, tokens: u32) -> u32 {
        tokens / self.page_tokens
    }

    /// Tokens past the last complete page: the partial tail a checkpoint's
    /// row holds (0 at an aligned endpoint, where no tail page exists).
    pub fn tail_tokens(self, tokens: u32) -> u32 {
        tokens % self.page_tokens
    }

    /// Pages that hold `tokens` tokens, the partial tail included.
    pub fn pages_for(self, tokens: u32) -> u32 {
        tokens.div_ceil(self.page_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_pages_and_tails() {
        assert_eq!(PageGeometry::new(0), Err(PrefixError::ZeroPageTokens));
        let page = PageGeometry::new(128).unwrap();
        assert_eq!((page.complete_pages(127), page.tail_tokens(127)), (0, 127));
        assert_eq!((page.complete_pages(128), page.tail_tokens(128)), (1, 0));
        assert_eq!((page.complete_pages(300), page.tail_tokens(300)), (2, 44));
        assert_eq!(
            (page.pages_for(0), page.pages_for(128), page.pages_for(129)),
            (0, 1, 2)
        );
    }
}

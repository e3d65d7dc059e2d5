//! What a continuation row holds, as the recipe declares it.
//!
//! The design: "The runtime core declares every rank's byte layout, so
//! storage needs no model-specific interpretation." A row layout is a list
//! of named parts with their byte sizes (the dense recipe: the private
//! partial tail page and the saved final hidden vector; a recurrent recipe:
//! recurrent matrices, convolution histories, ...). The store carries it for
//! accounting and never looks inside a row.

use super::error::PrefixError;

/// One named part of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPart {
    /// The recipe's name for it, for example `kv_tail` or `hidden`.
    pub name: String,
    /// Its bytes.
    pub bytes: u64,
}

/// The declared layout of one continuation row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    parts: Vec<RowPart>,
}

impl RowLayout {
    /// A layout of `(name, bytes)` parts: at least one, each nonempty, names
    /// unique.
    pub fn new<S: Into<String>>(
        parts: impl IntoIterator<Item = (S, u64)>,
    ) -> Result<Self, PrefixError> {
        let parts: Vec<RowPart> = (parts.into_iter())
            .map(|(name, bytes)| RowPart {
                name: name.into(),
                bytes,
            })
            .collect();
        if parts.is_empty() {
            return Err(PrefixError::EmptyRowLayout);
        }
        for (i, part) in parts.iter().enumerate() {
            if part.bytes == 0 {
                return Err(PrefixError::EmptyRowPart {
                    name: part.name.clone(),
                });
            }
            if parts[..i].iter().any(|other| other.name == part.name) {
                return Err(PrefixError::DuplicateRowPart {
                    name: part.name.clone(),
                });
            }
        }
        Ok(Self { parts })
    }

    /// The parts, in declaration order.
    pub fn parts(&self) -> &[RowPart] {
        &self.parts
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.parts.iter().map(|part| part.bytes).sum()
    }

    /// The byte range of a part within a row, parts packed in order.
    pub fn part_range(&self, name: &str) -> Option<std::ops::Range<u64>> {
        let mut start = 0;
        for part in &self.parts {
            if part.name == name {
                return Some(start..start + part.bytes);
            }
            start += part.bytes;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_packed_in_order_and_validated() {
        let layout = RowLayout::new([("kv_tail", 4096), ("hidden", 1152)]).unwrap();
        assert_eq!(layout.row_bytes(), 5248);
        assert_eq!(layout.part_range("hidden"), Some(4096..5248));
        assert_eq!(layout.part_range("recurrent"), None);
        let none: [(&str, u64); 0] = [];
        assert_eq!(RowLayout::new(none), Err(PrefixError::EmptyRowLayout));
        assert_eq!(
            RowLayout::new([("conv", 0)]),
            Err(PrefixError::EmptyRowPart {
                name: "conv".into()
            })
        );
        assert_eq!(
            RowLayout::new([("conv", 8), ("conv", 8)]),
            Err(PrefixError::DuplicateRowPart {
                name: "conv".into()
            })
        );
    }
}

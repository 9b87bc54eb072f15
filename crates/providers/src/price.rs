//! Prices by model name ([`PriceTable`]), loaded from JSON, for [`Provider::prices`].
//!
//! ```
//! use tower_agent_core::{Cost, ModelPrice, Usage};
//! use tower_agent_providers::PriceTable;
//!
//! let table = PriceTable::from_json(r#"{
//!     "claude-sonnet-4-5": { "input": 3.0, "cached_input": 0.3, "output": 15.0 },
//!     "gpt-4o-mini":       { "input": 0.15, "output": 0.6 }
//! }"#)?
//! .with("gpt-4o-mini", ModelPrice::per_million(0.15, 0.075, 0.6)); // an override
//!
//! // A dated version finds its model.
//! let sonnet = table.get("claude-sonnet-4-5-20250929").expect("priced");
//! assert_eq!(sonnet.cost(&Usage::new(10_000, 1_000).with_cached(8_000)), Cost::from_dollars(0.0234));
//! assert!(table.get("unknown-model").is_none());
//! # Ok::<(), tower_agent_core::Error>(())
//! ```
//!
//! [`Provider::prices`]: crate::Provider::prices

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tower_agent_core::{Error, ErrorKind, ModelPrice};

/// Prices by model name. A name finds its own entry, or else the entry it is a dated or
/// `-latest` version of (`claude-sonnet-4-5-20250929` and `gpt-4o-2024-08-06` find
/// `claude-sonnet-4-5` and `gpt-4o`); never another model that shares its start (`o3-pro` does
/// not find `o3`, `gpt-4o` does not find `gpt-4`).
///
/// Loaded from JSON (an object from model names to [`ModelPrice`]s) and overridden entry by
/// entry; serializes to the same JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable {
    prices: BTreeMap<String, ModelPrice>,
}

impl PriceTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table from JSON:
    /// `{"model": {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}}`
    /// (`cached_input` and `cache_write` may be left out).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::BadRequest`] when the text is not such an object, or a price is negative
    /// or not finite, naming where.
    pub fn from_json(json: &str) -> Result<Self, Error> {
        let table: PriceTable = serde_json::from_str(json)
            .map_err(|e| Error::new(ErrorKind::BadRequest, format!("not a price table: {e}")))?;
        for (model, price) in &table.prices {
            let prices = [
                Some(price.input),
                price.cached_input,
                price.cache_write,
                Some(price.output),
            ];
            if prices
                .into_iter()
                .flatten()
                .any(|p| !p.is_finite() || p < 0.0)
            {
                return Err(Error::new(
                    ErrorKind::BadRequest,
                    format!("the price of `{model}` is negative or not a number"),
                ));
            }
        }
        Ok(table)
    }

    /// A table from a JSON file ([`PriceTable::from_json`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`] when the file cannot be read, [`ErrorKind::BadRequest`] when it
    /// is not a price table.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                ErrorKind::Backend,
                format!("cannot read the price table {}: {e}", path.display()),
            )
        })?;
        Self::from_json(&text)
    }

    /// The table with `model` priced at `price` (replacing its entry).
    pub fn with(mut self, model: impl Into<String>, price: ModelPrice) -> Self {
        self.prices.insert(model.into(), price);
        self
    }

    /// The table with every entry of `other` added, replacing entries of the same name.
    pub fn merge(mut self, other: PriceTable) -> Self {
        self.prices.extend(other.prices);
        self
    }

    /// The price of `model`: its own entry, or the entry it is a version of (the rest of its
    /// name is `-latest`, or `-` and a date of digits and dashes).
    pub fn get(&self, model: &str) -> Option<ModelPrice> {
        if let Some(price) = self.prices.get(model) {
            return Some(*price);
        }
        let version_of = |name: &str| {
            model.strip_prefix(name).is_some_and(|rest| {
                rest == "-latest"
                    || rest.strip_prefix('-').is_some_and(|date| {
                        !date.is_empty() && date.chars().all(|c| c.is_ascii_digit() || c == '-')
                    })
            })
        };
        self.prices
            .iter()
            .find(|(name, _)| version_of(name))
            .map(|(_, price)| *price)
    }

    /// The priced model names, in order.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.prices.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_reads_cache_write_prices_and_refuses_negative_ones() {
        let table = PriceTable::from_json(
            r#"{"claude": {"input": 3, "cached_input": 0.3, "cache_write": 3.75, "output": 15}}"#,
        )
        .expect("a table");
        assert_eq!(table.get("claude").and_then(|p| p.cache_write), Some(3.75));
        let bad =
            PriceTable::from_json(r#"{"claude": {"input": 3, "cache_write": -1, "output": 15}}"#);
        assert!(bad.expect_err("negative").to_string().contains("`claude`"));
    }

    #[test]
    fn a_table_finds_the_longest_family_and_refuses_bad_prices() {
        let table = PriceTable::from_json(
            r#"{"gpt-4o": {"input": 2.5, "output": 10}, "gpt-4o-mini": {"input": 0.15, "output": 0.6}}"#,
        )
        .unwrap();
        assert_eq!(
            table.get("gpt-4o-mini-2024-07-18").map(|p| p.input),
            Some(0.15)
        );
        assert_eq!(table.get("gpt-4o-2024-08-06").map(|p| p.input), Some(2.5));
        assert_eq!(table.get("gpt-4o-latest").map(|p| p.input), Some(2.5));
        assert_eq!(table.get("gpt-4"), None);
        // Another model that starts the same is not priced as this one.
        assert_eq!(table.get("gpt-4o-audio-preview"), None);
        assert_eq!(table.get("gpt-4o-"), None);
        assert_eq!(
            table.models().collect::<Vec<_>>(),
            ["gpt-4o", "gpt-4o-mini"]
        );
        let back = PriceTable::from_json(&serde_json::to_string(&table).unwrap()).unwrap();
        assert_eq!(back, table);

        for bad in [
            r#"{"m": {"input": -1, "output": 1}}"#,
            r#"{"m": {"input": 1}}"#,
            r#"["m"]"#,
        ] {
            let err = PriceTable::from_json(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRequest, "{bad}");
        }
        let missing = PriceTable::from_file("/nonexistent/prices.json").unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Backend);
    }
}

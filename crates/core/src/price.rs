//! The prices of a model ([`ModelPrice`]) and a table of them loadable from JSON
//! ([`PriceTable`]); amounts are [`Cost`]s.
//!
//! A provider given its price puts the cost of every call in its [`Usage`]; the run's usage
//! adds them up. The budget layer of `tower-agent-layers` reserves a call's worst case before
//! it is sent.
//!
//! ```
//! use tower_agent_core::{Cost, ModelPrice, PriceTable, Usage};
//!
//! let table = PriceTable::from_json(r#"{
//!     "claude-sonnet-4-5": { "input": 3.0, "cached_input": 0.3, "output": 15.0 },
//!     "gpt-4o-mini":       { "input": 0.15, "output": 0.6 }
//! }"#)?
//! .with("gpt-4o-mini", ModelPrice::per_million(0.15, 0.075, 0.6)); // an override
//!
//! // A dated version finds its model.
//! let sonnet = table.get("claude-sonnet-4-5-20250929").expect("priced");
//! let usage = Usage::new(10_000, 1_000).with_cached(8_000);
//! // 2,000 × $3 + 8,000 × $0.30 + 1,000 × $15, per million tokens.
//! assert_eq!(sonnet.cost(&usage), Cost::from_dollars(0.0234));
//! assert_eq!(sonnet.cost(&usage).to_string(), "$0.023400");
//! assert!(table.get("unknown-model").is_none());
//! # Ok::<(), tower_agent_core::Error>(())
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cost::Cost;
use crate::error::{Error, ErrorKind};
use crate::session::Usage;

/// A model's prices, in dollars per million tokens: prompt tokens, prompt tokens read from
/// the provider's cache (the prompt price when not given), prompt tokens written to it (the
/// prompt price when not given: Anthropic bills 1.25 times it for a five-minute cache, twice
/// for an hour), completion tokens (reasoning included).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelPrice {
    /// Dollars per million prompt tokens.
    pub input: f64,
    /// Dollars per million prompt tokens read from the cache; `None`: the prompt price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Dollars per million prompt tokens written to the cache; `None`: the prompt price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Dollars per million completion tokens.
    pub output: f64,
}

impl ModelPrice {
    /// Prices in dollars per million tokens.
    pub const fn per_million(input: f64, cached_input: f64, output: f64) -> Self {
        Self {
            input,
            cached_input: Some(cached_input),
            cache_write: None,
            output,
        }
    }

    /// The same prices with prompt tokens written to the cache at `per_million` dollars.
    ///
    /// ```
    /// use tower_agent_core::{Cost, ModelPrice, Usage};
    ///
    /// // Anthropic's five-minute cache: writes at 1.25 times the prompt price.
    /// let sonnet = ModelPrice::per_million(3.0, 0.3, 15.0).with_cache_write(3.75);
    /// let first = Usage::new(10_000, 0).with_cache_writes(8_000);
    /// // 2,000 × $3 + 8,000 × $3.75 per million tokens.
    /// assert_eq!(sonnet.cost(&first), Cost::from_dollars(0.036));
    /// ```
    pub const fn with_cache_write(mut self, per_million: f64) -> Self {
        self.cache_write = Some(per_million);
        self
    }

    /// What `usage` costs at these prices. Cached and written tokens are parts of the prompt
    /// tokens (a provider that reports more is held to them, the cached ones first).
    pub fn cost(&self, usage: &Usage) -> Cost {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let written = usage
            .cache_write_input_tokens
            .min(usage.input_tokens - cached);
        let fresh = usage.input_tokens - cached - written;
        let cached_price = self.cached_input.unwrap_or(self.input);
        let write_price = self.cache_write.unwrap_or(self.input);
        Cost::from_dollars(
            (fresh as f64 * self.input
                + cached as f64 * cached_price
                + written as f64 * write_price
                + usage.output_tokens as f64 * self.output)
                / 1e6,
        )
    }

    /// The most a call of `input` prompt tokens and at most `output` completion tokens can
    /// cost: none read from the cache, and all written to it when writing costs more.
    ///
    /// ```
    /// use tower_agent_core::{Cost, ModelPrice};
    ///
    /// let price = ModelPrice::per_million(3.0, 0.3, 15.0);
    /// assert_eq!(price.worst_case(1_000_000, 0), Cost::from_dollars(3.0));
    /// assert_eq!(price.with_cache_write(6.0).worst_case(1_000_000, 0), Cost::from_dollars(6.0));
    /// ```
    pub fn worst_case(&self, input: u64, output: u64) -> Cost {
        let written = match self.cache_write {
            Some(write) if write > self.input => input,
            _ => 0,
        };
        self.cost(&Usage::new(input, output).with_cache_writes(written))
    }
}

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
    fn cached_tokens_are_priced_apart_and_never_above_the_input() {
        let price = ModelPrice::per_million(3.0, 0.3, 15.0);
        assert_eq!(
            price.cost(&Usage::new(1_000_000, 0)),
            Cost::from_dollars(3.0)
        );
        assert_eq!(
            price.cost(&Usage::new(1_000_000, 0).with_cached(1_000_000)),
            Cost::from_dollars(0.3)
        );
        // A provider that reported more cached than input tokens: all input, cached.
        assert_eq!(
            price.cost(&Usage::new(10, 0).with_cached(99)),
            Cost::from_nanodollars(3_000)
        );
        let no_cache_price = ModelPrice {
            cached_input: None,
            ..price
        };
        assert_eq!(
            no_cache_price.cost(&Usage::new(1_000_000, 0).with_cached(1_000_000)),
            Cost::from_dollars(3.0)
        );
        assert_eq!(price.worst_case(1_000, 1_000), Cost::from_dollars(0.018));
    }

    #[test]
    fn cache_writes_are_priced_apart_and_never_above_the_input() {
        let price = ModelPrice::per_million(3.0, 0.3, 15.0).with_cache_write(6.0);
        // 1M prompt tokens: 200k read, 500k written, 300k fresh.
        let usage = Usage::new(1_000_000, 0)
            .with_cached(200_000)
            .with_cache_writes(500_000);
        assert_eq!(price.cost(&usage), Cost::from_dollars(0.06 + 3.0 + 0.9));
        // Without a write price, writes are prompt tokens.
        let plain = ModelPrice::per_million(3.0, 0.3, 15.0);
        assert_eq!(plain.cost(&usage), Cost::from_dollars(0.06 + 2.4));
        // A provider that reported more than the prompt: the cached ones first, then writes.
        let over = Usage::new(10, 0).with_cached(4).with_cache_writes(99);
        assert_eq!(price.cost(&over), Cost::from_nanodollars(1_200 + 36_000));
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

//! The prices of a model ([`ModelPrice`]); amounts are [`Cost`]s.
//!
//! A provider given its price puts the cost of every call in its [`Usage`]; the run's usage
//! adds them up. The budget layer of `tower-agent-layers` reserves a call's worst case before
//! it is sent. A table of prices by model name, loaded from JSON, is the providers'
//! `PriceTable`.
//!
//! ```
//! use tower_agent_core::{Cost, ModelPrice, Usage};
//!
//! let sonnet = ModelPrice::per_million(3.0, 0.3, 15.0);
//! let usage = Usage::new(10_000, 1_000).with_cached(8_000);
//! // 2,000 × $3 + 8,000 × $0.30 + 1,000 × $15, per million tokens.
//! assert_eq!(sonnet.cost(&usage), Cost::from_dollars(0.0234));
//! assert_eq!(sonnet.cost(&usage).to_string(), "$0.023400");
//! ```

use serde::{Deserialize, Serialize};

use crate::cost::Cost;
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
    }
}

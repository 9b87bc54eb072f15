//! An exact amount of money: [`Cost`], what calls cost ([`Usage::cost`](crate::Usage)).
//! Models' prices are in [`price`](crate::price).

use std::fmt;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

/// An amount of US dollars, counted in nanodollars so that sums are exact. Serializes as the
/// number of nanodollars.
///
/// ```
/// use tower_agent_core::Cost;
///
/// let a = Cost::from_dollars(0.25);
/// assert_eq!(a.nanodollars(), 250_000_000);
/// assert_eq!((a + a).dollars(), 0.5);
/// assert_eq!(Cost::from_dollars(-1.0), Cost::ZERO, "never negative");
/// assert_eq!(a.saturating_sub(Cost::from_dollars(1.0)), Cost::ZERO);
/// ```
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Cost(u64);

impl Cost {
    /// Nothing.
    pub const ZERO: Cost = Cost(0);

    /// `nanodollars` billionths of a dollar.
    pub const fn from_nanodollars(nanodollars: u64) -> Self {
        Cost(nanodollars)
    }

    /// `dollars`, to the nearest nanodollar; a negative amount or NaN is zero.
    pub fn from_dollars(dollars: f64) -> Self {
        // `as` saturates: NaN and negatives give 0, too large gives u64::MAX.
        Cost((dollars * 1e9).round() as u64)
    }

    /// The amount in nanodollars.
    pub const fn nanodollars(self) -> u64 {
        self.0
    }

    /// The amount in dollars.
    pub fn dollars(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self - other`, or zero.
    pub const fn saturating_sub(self, other: Cost) -> Cost {
        Cost(self.0.saturating_sub(other.0))
    }

    /// Whether the amount is zero.
    pub const fn is_zero(&self) -> bool {
        self.0 == 0
    }
}

impl Add for Cost {
    type Output = Cost;

    fn add(self, rhs: Cost) -> Cost {
        Cost(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, rhs: Cost) {
        *self = *self + rhs;
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::ZERO, Add::add)
    }
}

/// `$` and the dollars with six decimals (`$0.023400`).
impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micro = self.0.saturating_add(500) / 1_000;
        write!(f, "${}.{:06}", micro / 1_000_000, micro % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_add_exactly_and_print_in_dollars() {
        let tenth = Cost::from_dollars(0.1);
        let sum: Cost = std::iter::repeat_n(tenth, 10).sum();
        assert_eq!(sum, Cost::from_dollars(1.0), "no floating-point drift");
        assert_eq!(sum.to_string(), "$1.000000");
        assert_eq!(Cost::from_nanodollars(1_499).to_string(), "$0.000001");
        assert_eq!(Cost::from_dollars(f64::NAN), Cost::ZERO);
        assert_eq!(serde_json::to_string(&tenth).unwrap(), "100000000");
        let most = Cost::from_nanodollars(u64::MAX);
        assert_eq!(most + tenth, most, "sums saturate");
        assert_eq!(most.to_string(), "$18446744073.709551");
    }
}

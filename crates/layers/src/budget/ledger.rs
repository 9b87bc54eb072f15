//! A budget's ledger and the reservations taken on it.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tower_agent_core::Cost;

/// A cost budget: a limit, what was spent, and what calls in flight reserved. Clones share
/// one ledger: give the same `Budget` to every agent that spends from it (a tenant's, a
/// team's), here or in a [`BudgetLayer`](super::BudgetLayer) of each.
///
/// ```
/// use tower_agent_core::Cost;
/// use tower_agent_layers::budget::Budget;
///
/// let tenant = Budget::new(Cost::from_dollars(10.0));
/// let restored = Budget::new(Cost::from_dollars(10.0)).with_spent(Cost::from_dollars(9.5));
/// assert_eq!(restored.remaining(), Cost::from_dollars(0.5));
/// assert_eq!(tenant.spent(), Cost::ZERO);
/// ```
#[derive(Clone)]
pub struct Budget {
    ledger: Arc<Mutex<Ledger>>,
}

#[derive(Debug, Clone, Copy)]
struct Ledger {
    limit: Cost,
    spent: Cost,
    reserved: Cost,
}

impl Budget {
    /// A budget of `limit`, nothing spent.
    pub fn new(limit: Cost) -> Self {
        Self {
            ledger: Arc::new(Mutex::new(Ledger {
                limit,
                spent: Cost::ZERO,
                reserved: Cost::ZERO,
            })),
        }
    }

    /// The budget with `spent` spent already (restored from a database, say).
    pub fn with_spent(self, spent: Cost) -> Self {
        self.lock().spent = spent;
        self
    }

    /// What the budget allows.
    pub fn limit(&self) -> Cost {
        self.lock().limit
    }

    /// What calls that ended cost.
    pub fn spent(&self) -> Cost {
        self.lock().spent
    }

    /// What calls in flight reserved.
    pub fn reserved(&self) -> Cost {
        self.lock().reserved
    }

    /// What is neither spent nor reserved.
    pub fn remaining(&self) -> Cost {
        let ledger = self.lock();
        ledger.limit.saturating_sub(ledger.spent + ledger.reserved)
    }

    /// Reserve `amount` when it fits, in one step under the lock; else what was spent or
    /// reserved, and the limit.
    pub(super) fn reserve(&self, amount: Cost) -> Result<Reservation, (Cost, Cost)> {
        let mut ledger = self.lock();
        let taken = ledger.spent + ledger.reserved;
        if taken + amount > ledger.limit {
            return Err((taken, ledger.limit));
        }
        ledger.reserved += amount;
        Ok(Reservation {
            budget: self.clone(),
            amount,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ledger = *self.lock();
        f.debug_struct("Budget")
            .field("limit", &ledger.limit)
            .field("spent", &ledger.spent)
            .field("reserved", &ledger.reserved)
            .finish()
    }
}

/// An amount reserved on a budget for one call: settled with what the call cost, or released
/// when dropped unsettled (a call cancelled or dropped midway).
pub(super) struct Reservation {
    budget: Budget,
    amount: Cost,
}

impl Reservation {
    /// Replace the reservation with what the call cost.
    pub(super) fn settle(mut self, actual: Cost) {
        let mut ledger = self.budget.lock();
        ledger.reserved = ledger.reserved.saturating_sub(self.amount);
        ledger.spent += actual;
        // Nothing left to release when it drops.
        self.amount = Cost::ZERO;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut ledger = self.budget.lock();
        ledger.reserved = ledger.reserved.saturating_sub(self.amount);
    }
}

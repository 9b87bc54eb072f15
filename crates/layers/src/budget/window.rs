//! Spend windows: a tenant's budget over a day, a month or a conversation, kept in a store
//! every process shares.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Cost, Error, RunContext};

use super::KeyFn;

/// The period a [`SpendWindow`] counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Period {
    /// A calendar day, in UTC.
    Day,
    /// A calendar month, in UTC.
    Month,
    /// One conversation: the session, over all its runs.
    Conversation,
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Period::Day => "day",
            Period::Month => "month",
            Period::Conversation => "conversation",
        })
    }
}

/// A budget over a window of time or a conversation, per tenant (Pydantic's `SpendLimits`,
/// Mastra's cost control), kept in a [`SpendStore`]; see
/// [`BudgetLayer::window`](super::BudgetLayer::window).
///
/// Each model call reserves its worst case in the store before it is sent, in one step there
/// (a row lock in Postgres), so concurrent runs on any number of processes never reserve more
/// than the limit between them; it settles with what it cost.
///
/// ```
/// use tower_agent_core::Cost;
/// use tower_agent_layers::budget::SpendWindow;
///
/// // $5 a day per tenant, the tenant's id read from the session's state.
/// let daily = SpendWindow::day(Cost::from_dollars(5.0)).per(|ctx| ctx.state::<String>("tenant"));
/// # let _ = daily;
/// ```
#[derive(Clone)]
pub struct SpendWindow {
    pub(super) period: Period,
    pub(super) limit: Cost,
    tenant: Option<KeyFn>,
}

impl fmt::Debug for SpendWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpendWindow")
            .field("period", &self.period)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl SpendWindow {
    /// At most `limit` a calendar day (UTC).
    pub fn day(limit: Cost) -> Self {
        Self::new(Period::Day, limit)
    }

    /// At most `limit` a calendar month (UTC).
    pub fn month(limit: Cost) -> Self {
        Self::new(Period::Month, limit)
    }

    /// At most `limit` a conversation (a session, over all its runs; unlike
    /// [`per_session`](super::BudgetLayer::per_session), shared by runs of it at once).
    pub fn conversation(limit: Cost) -> Self {
        Self::new(Period::Conversation, limit)
    }

    fn new(period: Period, limit: Cost) -> Self {
        Self {
            period,
            limit,
            tenant: None,
        }
    }

    /// One window per tenant, the tenant read from the outermost run's context; a run it gives
    /// none is not limited by this window. Without it, every run shares one window.
    pub fn per<F>(mut self, tenant: F) -> Self
    where
        F: Fn(&RunContext) -> Option<String> + Send + Sync + 'static,
    {
        self.tenant = Some(Arc::new(tenant));
        self
    }

    /// The key of the window a call of `ctx` (the outermost run's context) falls in at `now`:
    /// `<tenant>/<period>/<when>` (`acme/day/2026-11-29`, `acme/month/2026-11`,
    /// `acme/conversation/<session id>`; `*` for the tenant without [`per`](Self::per)), to
    /// read what it spent ([`SpendStore::spent`]). A `/` or `%` in the tenant or the session id
    /// is written `%2F` or `%25`, so a key always has three parts. `None` when the run has no
    /// tenant.
    pub fn key(&self, ctx: &RunContext, now: SystemTime) -> Option<String> {
        let tenant = match &self.tenant {
            Some(tenant) => tenant(ctx)?,
            None => "*".to_owned(),
        };
        let days = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() / 86_400);
        let (year, month, day) = civil(days);
        let when = match self.period {
            Period::Day => format!("{year:04}-{month:02}-{day:02}"),
            Period::Month => format!("{year:04}-{month:02}"),
            Period::Conversation => escape(ctx.session_id()),
        };
        Some(format!("{}/{}/{when}", escape(&tenant), self.period))
    }
}

/// `part` with its `%` and `/` escaped, to stand as one part of a key.
fn escape(part: &str) -> String {
    part.replace('%', "%25").replace('/', "%2F")
}

/// The date of the day `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// An amount reserved in a window for one call, until it is settled or released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The window's key.
    pub window: String,
    /// The store's id of the hold.
    pub id: i64,
    /// What it reserved.
    pub amount: Cost,
}

/// Where spend windows are kept: shared by every process that spends from them.
/// [`InMemorySpend`] (one process) and `PostgresSpend` (feature `budget-postgres`, any number)
/// implement it.
pub trait SpendStore: Send + Sync + 'static {
    /// Reserve `amount` in `window` when what was spent and what is held there, plus `amount`,
    /// stay within `limit`, in one step no other reservation can interleave with: the hold;
    /// else `Err` with what is spent and held there now.
    fn reserve<'a>(
        &'a self,
        window: &'a str,
        limit: Cost,
        amount: Cost,
    ) -> BoxFuture<'a, Result<Result<Hold, Cost>, Error>>;

    /// Replace `hold` with what the call cost, spent in its window.
    fn settle(&self, hold: Hold, actual: Cost) -> BoxFuture<'_, Result<(), Error>>;

    /// Give `hold` back: the call was not made, or ended without a cost.
    fn release(&self, hold: Hold) -> BoxFuture<'_, Result<(), Error>>;

    /// What was spent in `window` (holds not counted).
    fn spent<'a>(&'a self, window: &'a str) -> BoxFuture<'a, Result<Cost, Error>>;
}

/// Spend windows in this process's memory: the default, for one process. Clones share them.
///
/// It keeps what the limits need, not a record: a reservation in a tenant's new day or month
/// forgets that tenant's days or months before the previous one (what they spent reads as zero
/// after), so a long-lived process keeps two windows per tenant and period. A conversation's window stays as
/// long as the process (a conversation may go on any time); for many conversations, or to read
/// past spend, keep windows in Postgres (`PostgresSpend`).
#[derive(Clone, Default)]
pub struct InMemorySpend {
    windows: Arc<Mutex<Windows>>,
}

#[derive(Default)]
struct Windows {
    next: i64,
    spent: HashMap<String, Cost>,
    holds: HashMap<i64, (String, Cost)>,
    /// The latest day or month reserved in, by tenant and period (`acme/day`).
    latest: HashMap<String, String>,
}

impl Windows {
    /// When `window` is a day or a month later than any its tenant reserved in before, forget
    /// the tenant's windows of that period before the previous one (a call keyed just before
    /// midnight still finds the day it counts in), unless they hold a reservation.
    fn forget_before(&mut self, window: &str) {
        let mut parts = window.split('/');
        let (Some(tenant), Some(period), Some(when), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let dated = match period {
            "day" => is_date(when, 10),
            "month" => is_date(when, 7),
            _ => false,
        };
        if !dated {
            return;
        }
        let scope = format!("{tenant}/{period}/");
        let previous = match self.latest.get(&scope[..scope.len() - 1]) {
            Some(latest) if latest.as_str() >= when => return,
            latest => latest.cloned(),
        };
        self.latest
            .insert(scope[..scope.len() - 1].to_owned(), when.to_owned());
        let Some(previous) = previous else {
            return;
        };
        let held: std::collections::HashSet<&str> =
            self.holds.values().map(|(w, _)| w.as_str()).collect();
        self.spent.retain(|key, _| {
            let before = key
                .strip_prefix(&scope)
                .is_some_and(|w| w < previous.as_str());
            !before || held.contains(key.as_str())
        });
    }
}

/// `when` is `YYYY-MM-DD` (`len` 10) or `YYYY-MM` (7).
fn is_date(when: &str, len: usize) -> bool {
    when.len() == len
        && when.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        })
}

impl fmt::Debug for InMemorySpend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemorySpend").finish_non_exhaustive()
    }
}

impl InMemorySpend {
    /// No window spent yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SpendStore for InMemorySpend {
    fn reserve<'a>(
        &'a self,
        window: &'a str,
        limit: Cost,
        amount: Cost,
    ) -> BoxFuture<'a, Result<Result<Hold, Cost>, Error>> {
        let mut windows = self.lock();
        windows.forget_before(window);
        let held = windows
            .holds
            .values()
            .filter(|(w, _)| w == window)
            .fold(Cost::ZERO, |sum, (_, amount)| sum + *amount);
        let taken = windows.spent.get(window).copied().unwrap_or(Cost::ZERO) + held;
        let answer = if taken + amount > limit {
            Err(taken)
        } else {
            windows.next += 1;
            let id = windows.next;
            windows.holds.insert(id, (window.to_owned(), amount));
            Ok(Hold {
                window: window.to_owned(),
                id,
                amount,
            })
        };
        Box::pin(std::future::ready(Ok(answer)))
    }

    fn settle(&self, hold: Hold, actual: Cost) -> BoxFuture<'_, Result<(), Error>> {
        let mut windows = self.lock();
        windows.holds.remove(&hold.id);
        *windows.spent.entry(hold.window).or_insert(Cost::ZERO) += actual;
        Box::pin(std::future::ready(Ok(())))
    }

    fn release(&self, hold: Hold) -> BoxFuture<'_, Result<(), Error>> {
        self.lock().holds.remove(&hold.id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn spent<'a>(&'a self, window: &'a str) -> BoxFuture<'a, Result<Cost, Error>> {
        let spent = self.lock().spent.get(window).copied().unwrap_or(Cost::ZERO);
        Box::pin(std::future::ready(Ok(spent)))
    }
}

/// A hold taken for a call: settled, or released when dropped unsettled (a call cancelled or
/// dropped midway; a process killed leaves it to expire in the store).
pub(super) struct HoldGuard {
    store: Arc<dyn SpendStore>,
    hold: Option<Hold>,
}

impl HoldGuard {
    pub(super) fn new(store: Arc<dyn SpendStore>, hold: Hold) -> Self {
        Self {
            store,
            hold: Some(hold),
        }
    }

    /// Settle with what the call cost, on a task of its own: a run cancelled meanwhile does
    /// not lose what the call cost. A store that fails is logged (the call's answer is kept,
    /// and the hold expires).
    pub(super) async fn settle(mut self, actual: Cost) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        let settling = tokio::spawn(async move {
            let window = hold.window.clone();
            if let Err(error) = store.settle(hold, actual).await {
                tracing::warn!(%error, %window, %actual, "the spend window was not settled");
            }
        });
        // Dropped (the run cancelled), the task goes on.
        let _ = settling.await;
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = store.release(hold).await {
                    tracing::warn!(%error, "a spend window's hold was not released");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_dated_in_utc() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(20_786), (2026, 11, 29));
        assert_eq!(civil(19_782), (2024, 2, 29));
        let ctx = RunContext::new();
        let at = UNIX_EPOCH + std::time::Duration::from_secs(20_786 * 86_400 + 86_399);
        let day = SpendWindow::day(Cost::ZERO).per(|_| Some("acme".into()));
        assert_eq!(day.key(&ctx, at).as_deref(), Some("acme/day/2026-11-29"));
        let month = SpendWindow::month(Cost::ZERO);
        assert_eq!(month.key(&ctx, at).as_deref(), Some("*/month/2026-11"));
        let nobody = SpendWindow::day(Cost::ZERO).per(|_| None);
        assert_eq!(nobody.key(&ctx, at), None);
    }

    /// A long-lived process keeps two day windows per tenant: a new day's reservation forgets
    /// the tenant's days before the previous one (not the previous day, where a call keyed
    /// before midnight still counts; not another tenant's; not a day that still holds; never a
    /// conversation, however its session id reads).
    #[tokio::test]
    async fn in_memory_windows_forget_past_days() {
        let store = InMemorySpend::new();
        let (cent, limit) = (Cost::from_dollars(0.01), Cost::from_dollars(0.10));
        let spend = |window: &'static str| {
            let store = store.clone();
            async move {
                let hold = store.reserve(window, limit, cent).await.expect("in memory");
                store
                    .settle(hold.expect("room"), cent)
                    .await
                    .expect("settled");
            }
        };
        let spent = |window: &'static str| {
            let store = store.clone();
            async move { store.spent(window).await.expect("in memory") }
        };
        for window in [
            "acme/day/2026-11-26",
            "acme/day/2026-11-27",
            "globex/day/2026-11-26",
            "acme/month/2026-10",
            "acme/conversation/s1",
            "acme/conversation/2026-11-26",
            "acme/conversation/u1%2Fday%2F2026-11-26",
        ] {
            spend(window).await;
        }
        // Day 27 holds a call while days 28 and 29 open.
        let open = store
            .reserve("acme/day/2026-11-27", limit, cent)
            .await
            .expect("in memory")
            .expect("room");
        for window in [
            "acme/day/2026-11-28",
            "acme/day/2026-11-29",
            "acme/conversation/2026-11-29",
            "acme/conversation/u1%2Fday%2F2026-11-29",
        ] {
            spend(window).await;
        }
        assert_eq!(spent("acme/day/2026-11-26").await, Cost::ZERO, "forgotten");
        for window in [
            "acme/day/2026-11-28",
            "acme/day/2026-11-29",
            "globex/day/2026-11-26",
            "acme/month/2026-10",
            "acme/conversation/s1",
            "acme/conversation/2026-11-26",
            "acme/conversation/u1%2Fday%2F2026-11-26",
        ] {
            assert_eq!(spent(window).await, cent, "{window} kept");
        }
        store.settle(open, cent).await.expect("settled");
        assert_eq!(
            spent("acme/day/2026-11-27").await,
            Cost::from_dollars(0.02),
            "a held day is kept, with what it spent"
        );
        // A call keyed to the previous day, after the next opened, still counts there.
        spend("acme/day/2026-11-28").await;
        assert_eq!(spent("acme/day/2026-11-28").await, Cost::from_dollars(0.02));
        assert_eq!(store.lock().spent.len(), 10);
    }

    /// A `/` in a tenant or a session id cannot make one window read as another's.
    #[test]
    fn key_parts_are_escaped() {
        let ctx = RunContext::new().with_session_id("u1/day/2026-11-29");
        let at = UNIX_EPOCH + std::time::Duration::from_secs(20_786 * 86_400);
        let conversation = SpendWindow::conversation(Cost::ZERO).per(|_| Some("a/b%".into()));
        assert_eq!(
            conversation.key(&ctx, at).as_deref(),
            Some("a%2Fb%25/conversation/u1%2Fday%2F2026-11-29")
        );
    }
}

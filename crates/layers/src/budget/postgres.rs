//! Spend windows in Postgres: one row per window, one per hold, shared by every process.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{IsolationLevel, NoTls};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{Cost, Error};

use super::window::{Hold, SpendStore};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tower_agent_spend (
    window_key TEXT PRIMARY KEY,
    spent BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tower_agent_spend_holds (
    id BIGSERIAL PRIMARY KEY,
    window_key TEXT NOT NULL,
    amount BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS tower_agent_spend_holds_window
    ON tower_agent_spend_holds (window_key);
";

/// Spend windows kept in Postgres (feature `budget-postgres`), shared by every process that
/// connects to the same database: tables `tower_agent_spend` (a window's key and what it
/// spent, in nanodollars) and `tower_agent_spend_holds` (what calls in flight hold), made on
/// [`connect`](PostgresSpend::connect).
///
/// A reservation is one transaction that locks the window's row (`SELECT ... FOR UPDATE`),
/// adds what is held there and inserts the hold only if it fits: two processes reserving at
/// once take turns, and never hold more than the limit between them. A hold of a process
/// killed mid-call expires after [`hold_for`](PostgresSpend::hold_for) (15 minutes by
/// default): until then it counts, so the window errs on the side of the limit.
#[derive(Clone)]
pub struct PostgresSpend {
    pool: Pool,
    hold_for: Duration,
}

impl fmt::Debug for PostgresSpend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSpend")
            .field("hold_for", &self.hold_for)
            .finish_non_exhaustive()
    }
}

fn backend(error: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::backend(format!("spend window store: {error}")).with_source(error)
}

fn nanos(cost: Cost) -> i64 {
    i64::try_from(cost.nanodollars()).unwrap_or(i64::MAX)
}

fn cost(nanos: i64) -> Cost {
    Cost::from_nanodollars(u64::try_from(nanos).unwrap_or(0))
}

impl PostgresSpend {
    /// Connect to `url` with a pool of connections, and make the tables if they are missing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`](tower_agent_core::ErrorKind::Backend) when the url is not one or
    /// the database cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let config: tokio_postgres::Config = url.parse().map_err(backend)?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .build()
            .map_err(backend)?;
        Self::from_pool(pool).await
    }

    /// Over a pool the host made (TLS, another size); the tables are made if missing.
    ///
    /// # Errors
    ///
    /// As [`connect`](PostgresSpend::connect).
    pub async fn from_pool(pool: Pool) -> Result<Self, Error> {
        let client = pool.get().await.map_err(backend)?;
        client.batch_execute(SCHEMA).await.map_err(backend)?;
        Ok(Self {
            pool,
            hold_for: Duration::from_secs(15 * 60),
        })
    }

    /// How long a hold counts when its call never settles (its process was killed): longer
    /// than a model call takes.
    pub fn hold_for(mut self, hold_for: Duration) -> Self {
        self.hold_for = hold_for;
        self
    }

    async fn try_reserve(
        &self,
        window: &str,
        limit: Cost,
        amount: Cost,
    ) -> Result<Result<Hold, Cost>, Error> {
        let mut client = self.pool.get().await.map_err(backend)?;
        // Read committed, whatever the server's default: under the window row's lock, each
        // statement sees the holds the transactions before it committed.
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(backend)?;
        tx.execute(
            "INSERT INTO tower_agent_spend (window_key) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&window],
        )
        .await
        .map_err(backend)?;
        let row = tx
            .query_one(
                "SELECT spent FROM tower_agent_spend WHERE window_key = $1 FOR UPDATE",
                &[&window],
            )
            .await
            .map_err(backend)?;
        let spent: i64 = row.get(0);
        tx.execute(
            "DELETE FROM tower_agent_spend_holds WHERE window_key = $1 AND expires_at <= now()",
            &[&window],
        )
        .await
        .map_err(backend)?;
        let row = tx
            .query_one(
                "SELECT COALESCE(SUM(amount), 0)::BIGINT FROM tower_agent_spend_holds \
                 WHERE window_key = $1",
                &[&window],
            )
            .await
            .map_err(backend)?;
        let held: i64 = row.get(0);
        let taken = cost(spent) + cost(held);
        if taken + amount > limit {
            tx.rollback().await.map_err(backend)?;
            return Ok(Err(taken));
        }
        let seconds = self.hold_for.as_secs_f64();
        let row = tx
            .query_one(
                "INSERT INTO tower_agent_spend_holds (window_key, amount, expires_at) \
                 VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING id",
                &[&window, &nanos(amount), &seconds],
            )
            .await
            .map_err(backend)?;
        let id: i64 = row.get(0);
        tx.commit().await.map_err(backend)?;
        Ok(Ok(Hold {
            window: window.to_owned(),
            id,
            amount,
        }))
    }

    async fn try_settle(&self, hold: Hold, actual: Cost) -> Result<(), Error> {
        let mut client = self.pool.get().await.map_err(backend)?;
        let tx = client.transaction().await.map_err(backend)?;
        // The window's row first, as a reservation locks it first: the two never wait on each
        // other in opposite orders.
        tx.execute(
            "UPDATE tower_agent_spend SET spent = spent + $2 WHERE window_key = $1",
            &[&hold.window, &nanos(actual)],
        )
        .await
        .map_err(backend)?;
        tx.execute(
            "DELETE FROM tower_agent_spend_holds WHERE id = $1",
            &[&hold.id],
        )
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }
}

impl SpendStore for PostgresSpend {
    fn reserve<'a>(
        &'a self,
        window: &'a str,
        limit: Cost,
        amount: Cost,
    ) -> BoxFuture<'a, Result<Result<Hold, Cost>, Error>> {
        Box::pin(self.try_reserve(window, limit, amount))
    }

    fn settle(&self, hold: Hold, actual: Cost) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.try_settle(hold, actual))
    }

    fn release(&self, hold: Hold) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(backend)?;
            client
                .execute(
                    "DELETE FROM tower_agent_spend_holds WHERE id = $1",
                    &[&hold.id],
                )
                .await
                .map_err(backend)?;
            Ok(())
        })
    }

    fn spent<'a>(&'a self, window: &'a str) -> BoxFuture<'a, Result<Cost, Error>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(backend)?;
            let row = client
                .query_opt(
                    "SELECT spent FROM tower_agent_spend WHERE window_key = $1",
                    &[&window],
                )
                .await
                .map_err(backend)?;
            Ok(row.map_or(Cost::ZERO, |row| cost(row.get(0))))
        })
    }
}

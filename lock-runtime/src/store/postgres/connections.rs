//! The PostgreSQL store's connections: a small pool (`deadpool-postgres`, [`POOL_SIZE`]
//! connections per client), each connection lent to one operation at a time, since an
//! operation is a transaction of its own (`postgres.rs`). Connections are made on the client's
//! I/O runtime, whatever runtime the caller is on ([`OnIo`]), with
//! `idle_in_transaction_session_timeout` set, so that a client frozen inside a transaction
//! (holding a key's turn) is cut off by the server. Every statement has the response timeout
//! (a try's: at most what is left of its wait); what a failure leaves to do with the
//! connection ([`Cleanup`]: roll back, or — a statement without an answer, timed out or its
//! connection lost — take it out of the pool and terminate its backend with
//! `pg_terminate_backend`, waiting for it to end) is done after the failure is reported, by
//! the transaction's task, which keeps the client's turn on the keys until then: nothing of
//! it can commit after the clean-up that follows an ambiguous try. Errors read as
//! [`BackendError`]s with PostgreSQL's advice here ([`store_error`], [`pg_error`]). Neighbours: `postgres.rs`
//! runs its transactions here; `schema.rs` is set up through the first connection; `tls.rs`
//! gives the connections their TLS.

use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};

use super::tls::Connector;

use crate::error::{BackendError, BackendErrorKind, LockError};

/// Connections per client: operations on distinct keys run side by side on this many; more
/// wait for one (each operation holds one for two round trips).
pub(crate) const POOL_SIZE: usize = 4;

/// The SQLSTATE of `written_all` (`schema.rs`): a key changed since it was read.
pub(crate) const CHANGED: &str = "DL001";

pub(crate) struct Connections {
    pool: Pool,
    /// Each pooled connection's backend process id, read once (for `discard`).
    pids: std::sync::Mutex<std::collections::HashMap<deadpool::managed::ObjectId, i32>>,
    io: Handle,
    connect_timeout: Duration,
    response_timeout: Duration,
}

/// What must be done with a connection after a round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cleanup {
    /// Nothing: it answered.
    Nothing,
    /// Its transaction was refused: roll it back.
    RollBack,
    /// It did not answer: its statements may still run; end its backend.
    Terminate,
}

/// What a statement that got no answer advises.
pub(crate) const TIMEOUT_ADVICE: &str = "PostgreSQL did not answer in time: it may be \
    overloaded, or up but frozen (stopped, a paused VM or container), or a statement of \
    another session holds what this one waits for; check `pg_stat_activity`, or raise the \
    response timeout (or the request's wait) if it is just slow";

/// Why a statement failed.
pub(crate) enum Failure {
    /// The key's turn did not come within the time left (`lock_timeout`): another operation
    /// on it (or a fenced transaction) held it. A try reads it as the key held.
    TurnNotGiven,
    /// A key changed since it was read (or two operations met in a deadlock the server
    /// broke): read again.
    Changed,
    /// Anything else, as the caller reports it.
    Error(LockError),
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        Failure::Error(err)
    }
}

/// Makes the pool's connections on the client's I/O runtime (the pool would make them on the
/// caller's, which a test or a short-lived runtime may drop with the connection in it).
struct OnIo {
    io: Handle,
    /// TLS, or none (`tls.rs`).
    connector: Connector,
}

impl deadpool_postgres::Connect for OnIo {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let config = config.clone();
        let io = self.io.clone();
        let connector = self.connector.clone();
        Box::pin(async move {
            let on_io = config.clone();
            let on_io_connector = connector.clone();
            let connecting = io.clone().spawn(async move {
                let (client, connection) = on_io.connect(on_io_connector).await?;
                let task = io.spawn(async move {
                    let _ = connection.await;
                });
                Ok((client, task))
            });
            match connecting.await {
                Ok(connected) => connected,
                // The I/O runtime is shutting down: connect here, as the pool would.
                Err(_) => {
                    let (client, connection) = config.connect(connector).await?;
                    Ok((
                        client,
                        tokio::spawn(async move {
                            let _ = connection.await;
                        }),
                    ))
                }
            }
        })
    }
}

impl Connections {
    pub(crate) fn new(
        mut config: Config,
        connector: Connector,
        io: Handle,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, LockError> {
        // A transaction of ours is two round trips apart at most; one left open longer is a
        // client that stopped (frozen, partitioned) while holding a key's turn.
        let idle = (response_timeout * 2).as_millis().max(100);
        let options = format!(
            "{} -c idle_in_transaction_session_timeout={idle}",
            config.get_options().unwrap_or_default()
        );
        config.options(options.trim());
        if config.get_application_name().is_none() {
            config.application_name("distlock");
        }
        config.connect_timeout(connect_timeout);
        let manager = Manager::from_connect(
            config,
            OnIo {
                io: io.clone(),
                connector,
            },
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|err| LockError::Config(format!("the PostgreSQL pool: {err}")))?;
        Ok(Self {
            pool,
            pids: std::sync::Mutex::default(),
            io,
            connect_timeout,
            response_timeout,
        })
    }

    /// The pool (for a task of its own).
    pub(crate) fn pool(&self) -> Pool {
        self.pool.clone()
    }

    /// The response timeout of every statement.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// A connection of the pool for one operation, waiting at most the connect timeout (and
    /// until `cut`).
    pub(crate) async fn checkout(&self, cut: Option<Instant>) -> Result<Object, LockError> {
        let pool = self.pool.clone();
        let getting = self.io.spawn(async move { pool.get().await });
        match tokio::time::timeout(budget(self.connect_timeout, cut), getting).await {
            Ok(Ok(Ok(object))) => Ok(object),
            Ok(Ok(Err(err))) => Err(connect_error(&err.to_string(), &err)),
            Ok(Err(join)) => Err(pg_error(
                "connect",
                BackendErrorKind::Connection,
                format!("the connect task ended: {join}"),
            )
            .into()),
            Err(_) => Err(pg_error(
                "connect",
                BackendErrorKind::Connection,
                format!(
                    "no PostgreSQL connection within {:?}",
                    budget(self.connect_timeout, cut)
                ),
            )
            .connect_timed_out(true)
            .into()),
        }
    }

    /// The backend process id of `connection`, read on its first use.
    pub(crate) async fn pid(&self, connection: &Object) -> Result<i32, LockError> {
        let id = Object::id(connection);
        let known = self
            .pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .copied();
        if let Some(pid) = known {
            return Ok(pid);
        }
        let asked = connection.query_one("SELECT pg_backend_pid()", &[]);
        let row = match tokio::time::timeout(self.response_timeout, asked).await {
            Ok(Ok(row)) => row,
            Ok(Err(err)) => return Err(store_error("connect", &err).into()),
            Err(_) => {
                return Err(pg_error(
                    "connect",
                    BackendErrorKind::Connection,
                    "a new PostgreSQL connection did not answer within the response timeout",
                )
                .into())
            }
        };
        let pid: i32 = row.get(0);
        let mut pids = self
            .pids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if pids.len() > 4 * POOL_SIZE {
            // Entries of connections the pool dropped on its own (closed ones).
            pids.clear();
        }
        pids.insert(id, pid);
        Ok(pid)
    }

    /// How long the statements of one round trip may take: the response timeout, and no
    /// later than `cut`.
    pub(crate) fn budget(&self, cut: Option<Instant>) -> Duration {
        budget(self.response_timeout, cut)
    }

    /// What a round trip came to (`outcome`: its statements run within `budget`), and what
    /// must be done with the connection before anything else uses the keys ([`Cleanup`]),
    /// which the caller does once it has reported the failure: so a request fails at its
    /// budget, and the clean-up goes on behind it.
    pub(crate) fn settle<T>(
        &self,
        operation: &'static str,
        budget: Duration,
        outcome: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> (Result<T, Failure>, Cleanup) {
        match outcome {
            Ok(Ok(answer)) => (Ok(answer), Cleanup::Nothing),
            // The server said no: the transaction is aborted; it is rolled back.
            Ok(Err(err)) if is_retry(&err) => (Err(Failure::Changed), Cleanup::RollBack),
            Ok(Err(err)) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                (Err(Failure::TurnNotGiven), Cleanup::RollBack)
            }
            Ok(Err(err)) if err.code().is_some() => (
                Err(Failure::Error(store_error(operation, &err).into())),
                Cleanup::RollBack,
            ),
            Ok(Err(err)) => (
                Err(Failure::Error(
                    store_error(operation, &err).maybe_applied(true).into(),
                )),
                Cleanup::Terminate,
            ),
            Err(_) => (
                Err(Failure::Error(
                    pg_error(
                        operation,
                        BackendErrorKind::Timeout,
                        format!("no answer from PostgreSQL within {budget:?}"),
                    )
                    .maybe_applied(true)
                    .into(),
                )),
                Cleanup::Terminate,
            ),
        }
    }

    /// Does what [`settle`](Self::settle) said must be done with `connection` (its backend
    /// `pid`).
    pub(crate) async fn clean_up(
        &self,
        connection: &mut Option<Object>,
        pid: i32,
        cleanup: Cleanup,
    ) {
        match cleanup {
            Cleanup::Nothing => {}
            Cleanup::RollBack => self.roll_back(connection, Some(pid)).await,
            Cleanup::Terminate => self.discard(connection, Some(pid)).await,
        }
    }

    /// Ends the connection's transaction, or the connection when that fails.
    pub(crate) async fn roll_back(&self, connection: &mut Option<Object>, pid: Option<i32>) {
        let Some(object) = connection.as_ref() else {
            return;
        };
        let rolled_back =
            tokio::time::timeout(self.response_timeout, object.batch_execute("ROLLBACK")).await;
        if !matches!(rolled_back, Ok(Ok(()))) {
            self.discard(connection, pid).await;
        }
    }

    /// Takes the connection out of the pool (it is closed), and terminates its backend `pid`
    /// from another connection, waiting (at most the response timeout) for it to end.
    async fn discard(&self, connection: &mut Option<Object>, pid: Option<i32>) {
        if let Some(object) = connection.take() {
            self.pids
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&Object::id(&object));
            drop(Object::take(object));
        }
        let Some(pid) = pid else {
            return;
        };
        let millis = i64::try_from(self.response_timeout.as_millis()).unwrap_or(i64::MAX);
        let terminate = async {
            let other = self.checkout(None).await?;
            other
                .query("SELECT pg_terminate_backend($1, $2)", &[&pid, &millis])
                .await
                .map_err(|err| LockError::from(store_error("terminate a stalled backend", &err)))
        };
        let ended = tokio::time::timeout(self.response_timeout * 2, terminate).await;
        if let Ok(Err(err)) = ended {
            tracing::warn!(
                target: crate::telemetry::LOG_TARGET,
                pid,
                %err,
                "could not terminate a stalled PostgreSQL backend; the server ends its \
                 transaction by idle_in_transaction_session_timeout"
            );
        }
    }
}

/// `limit`, or less when `cut` comes first.
fn budget(limit: Duration, cut: Option<Instant>) -> Duration {
    cut.map_or(limit, |cut| {
        limit.min(cut.saturating_duration_since(Instant::now()))
    })
}

/// A failure that only means "again": a key changed since it was read, or the server broke
/// a deadlock between two operations (keys locked in different orders by a hash collision).
fn is_retry(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        code.code() == CHANGED
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

fn connect_error(message: &str, err: &(dyn std::error::Error + 'static)) -> LockError {
    // tokio-postgres' words for a failed TLS set-up: a handshake (a certificate refused, a
    // server that does not offer TLS, the client's certificate refused) or a name.
    if message.contains("error performing TLS handshake") {
        let said = crate::error::with_causes(err);
        return pg_error("connect", BackendErrorKind::Tls, said).into();
    }
    let mut source = err.source();
    while let Some(inner) = source {
        if let Some(pg) = inner.downcast_ref::<tokio_postgres::Error>() {
            if pg.code().is_some() {
                return store_error("connect", pg).into();
            }
        }
        source = inner.source();
    }
    pg_error("connect", BackendErrorKind::Connection, message.to_owned()).into()
}

/// A failure of the PostgreSQL store as a [`BackendError`], with advice about PostgreSQL
/// for its kind (the default advice names Redis).
pub(crate) fn pg_error(
    operation: &'static str,
    kind: BackendErrorKind,
    message: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> BackendError {
    let advice = match kind {
        BackendErrorKind::Timeout => TIMEOUT_ADVICE,
        BackendErrorKind::Connection => CONNECT_ADVICE,
        BackendErrorKind::Tls => TLS_ADVICE,
        _ => "check PostgreSQL's log",
    };
    BackendError::new(operation, kind, message).advice(advice)
}

/// What a failed TLS set-up advises.
const TLS_ADVICE: &str = "check that the server has `ssl = on`, that its certificate names the \
    host in the URL and chains to the CA given by `Config::postgres_ca_pem` (or, without one, to \
    a root this machine trusts), and, if its `pg_hba.conf` asks for a client certificate \
    (`cert`, `clientcert=`), that `Config::postgres_client_cert` gives one its CA signed \
    (docs/tls.md)";

/// What a connection that could not be made advises.
const CONNECT_ADVICE: &str = "check that PostgreSQL is running and reachable at the configured \
    URL (`psql` with the same URL), and that it accepts this client (`pg_hba.conf`)";

/// What PgBouncer's refusal of the store's `options` startup parameter advises (PgBouncer
/// takes only the parameters it tracks unless told to ignore others).
const POOLER_OPTIONS_ADVICE: &str = "a pooler between distlock and PostgreSQL (PgBouncer) \
    refuses the `options` startup parameter, in which the store sets \
    `idle_in_transaction_session_timeout`: add `ignore_startup_parameters = options` to \
    `pgbouncer.ini` (PgBouncer then drops the setting: set its `idle_transaction_timeout` \
    instead) with `pool_mode = session`, or connect to PostgreSQL directly (docs/postgres.md)";

/// What a prepared statement missing from (or already on) the server connection advises.
const POOLER_MODE_ADVICE: &str = "the store's prepared statements are not on the server \
    connection its statement ran on: a pooler in transaction or statement mode (PgBouncer's \
    `pool_mode = transaction`) is between distlock and PostgreSQL, and runs each transaction on \
    whichever server connection is free, where the store needs one session per connection \
    (its prepared statements, `LISTEN`, ending a stalled backend): set `pool_mode = session`, \
    or connect to PostgreSQL directly (docs/postgres.md)";

/// Whether the server said that a prepared statement of the connection is missing, or that
/// one of its name is there already: the connection's statements do not all reach one
/// session, as through a pooler in transaction mode.
pub(crate) fn is_pooled_statement(db: &tokio_postgres::error::DbError) -> bool {
    *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME
        || *db.code() == SqlState::DUPLICATE_PSTATEMENT
}

/// A PostgreSQL failure as a [`BackendError`]: what the server said (read-only, refused
/// credentials, missing privileges, a pooler in the way), or a lost connection.
pub(crate) fn store_error(operation: &'static str, err: &tokio_postgres::Error) -> BackendError {
    let Some(db) = err.as_db_error() else {
        return BackendError::new(operation, BackendErrorKind::Connection, err.to_string())
            .advice(CONNECT_ADVICE);
    };
    let code = db.code();
    let (kind, advice) = if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        (
            BackendErrorKind::Unavailable,
            "the server is read-only (a hot standby, say after a failover): point the URL at \
             the primary",
        )
    } else if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        && db.message().contains("no encryption")
    {
        (
            BackendErrorKind::Authentication,
            "the server takes this client over TLS only (`hostssl` in `pg_hba.conf`): add \
             `sslmode=verify-full` to the URL (distlock's `tls` feature; docs/tls.md)",
        )
    } else if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        && db.message().contains("certificate")
    {
        (
            BackendErrorKind::Authentication,
            "the server asks for a client certificate its CA signed (`cert` or `clientcert=` \
             in `pg_hba.conf`), whose name, for `cert`, is the user's: give it with \
             `Config::postgres_client_cert` (docs/tls.md)",
        )
    } else if *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        (
            BackendErrorKind::Authentication,
            "check the user and password in the URL",
        )
    } else if *code == SqlState::PROTOCOL_VIOLATION
        && db.message().contains("unsupported startup parameter")
    {
        (BackendErrorKind::Server, POOLER_OPTIONS_ADVICE)
    } else if is_pooled_statement(db) {
        (BackendErrorKind::Server, POOLER_MODE_ADVICE)
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        (
            BackendErrorKind::Server,
            "the role lacks a privilege on distlock's schema (docs/postgres.md, \"Role\")",
        )
    } else if *code == SqlState::LOCK_NOT_AVAILABLE || *code == SqlState::QUERY_CANCELED {
        (
            BackendErrorKind::Timeout,
            "the key's turn did not come within the time left",
        )
    } else if *code == SqlState::ADMIN_SHUTDOWN {
        (
            BackendErrorKind::Connection,
            "the server ended the session (it is shutting down, or an administrator \
             terminated the backend)",
        )
    } else if *code == SqlState::CANNOT_CONNECT_NOW || *code == SqlState::CRASH_SHUTDOWN {
        (
            BackendErrorKind::Connection,
            "the server is shutting down or starting",
        )
    } else {
        (
            BackendErrorKind::Server,
            "PostgreSQL refused the request; check its log",
        )
    };
    let said = format!("{} {}: {}", db.severity(), code.code(), db.message());
    BackendError::new(operation, kind, said).advice(advice)
}

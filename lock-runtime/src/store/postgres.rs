//! PostgreSQL as a store: every kind's rules run as their twins (`kind/`, the reference
//! statement of the rules) on the state of the keys they touch, inside a transaction of the
//! store's own (`postgres/transaction.rs`): take the keys' turns and read their rows with the
//! database's clock, run the twin at that time, write back the rows it changed and commit —
//! two round trips. A key's state is one row (`key_state.rs`), its times on the
//! database's clock (`clock_timestamp()` of the read), never a client's. Fencing tokens come
//! from a sequence, taken by the statement that commits the grant: strictly increasing across
//! holders and durable, with no clock in the argument (`docs/guarantees.md`). Renewals are one
//! statement per round, with no turn (`postgres/statements.rs`). Waiters are woken by `NOTIFY`
//! at the commit of the change that frees what they wait for (`postgres/listener.rs`), with
//! the backoff as the fallback. A statement that got no answer fails at its budget, and its
//! backend is terminated behind it while this client keeps its turn on the keys
//! (`postgres/connections.rs`, `store/turns.rs`), so the clean-up of an ambiguous try
//! cannot be overtaken by the try. The store's objects live in a schema of its own
//! (`postgres/schema.rs`), checked (and created when missing) before the first statement.
//! Neighbours: the store contract (`store/mod.rs`), the twins (`kind/twins.rs`,
//! `kind/multi.rs`, the key operations' `twin`s), the operator's fenced transaction
//! (`fenced_postgres.rs`), which takes a key's turn in shared mode.

mod connections;
mod listener;
mod schema;
mod statements;
mod tls;
mod transaction;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Handle;

use self::connections::{pg_error, Connections, Failure};
use self::listener::Listener;
pub use self::schema::postgres_schema_sql;
pub(crate) use self::statements::{holders, shared_turns};
use self::transaction::{Loaded, Shared, Transaction, Write};
use super::every_key::EveryKeyFeed;
use super::glob::glob_matches;
use super::key_state::{announcements, decode, encode, KeyState, Timeline};
use super::turns::Turns;
use super::{Found, Store};
use crate::clock::Clock;
use crate::config::PostgresOptions;
use crate::error::{BackendErrorKind, LockError};
use crate::key_operation::KeyOperation;
use crate::kind::multi::{MultiReply, MultiTry};
use crate::kind::twins::{State, TokenSource};
use crate::kind::{HolderSlot, Holding, Renewal, Try};
use crate::operator_scripts::{ForceUnlock, RawHolder};
use crate::protocol::{AcquireReply, FencingToken, LockKey, Renewed};
use crate::wake::{ReleaseListener, Waiters};

/// The PostgreSQL store of one client.
pub(crate) struct PostgresStore {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    waker: ReleaseListener,
    turns: Turns,
}

impl PostgresStore {
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        options: PostgresOptions,
        connect_timeout: std::time::Duration,
        response_timeout: std::time::Duration,
        io: Handle,
    ) -> Result<Self, LockError> {
        let connector = tls::connector(&mut config, &options)?;
        let waiters = Waiters::default();
        let listener = Listener::new(
            config.clone(),
            connector.clone(),
            io.clone(),
            options.schema.clone(),
            waiters.clone(),
            connect_timeout,
        );
        let waker = ReleaseListener::new(waiters, EveryKeyFeed(listener.clone()));
        let connections = Connections::new(
            config,
            connector,
            io.clone(),
            connect_timeout,
            response_timeout,
        )?;
        Ok(Self {
            shared: Arc::new(Shared::new(connections, options, io)),
            listener,
            waker,
            turns: Turns::default(),
        })
    }

    /// The schema its objects live in (`Config::postgres_schema`).
    pub(crate) fn schema(&self) -> &str {
        &self.shared.options.schema
    }

    /// How long one of its statements may go unanswered (`Config::response_timeout`).
    pub(crate) fn response_timeout(&self) -> std::time::Duration {
        self.shared.connections.response_timeout()
    }

    /// Runs `twin` on the state of `keys` as the database has it, and writes back what it
    /// changed, in one transaction holding the keys' turns (`postgres/transaction.rs`; read
    /// again should a key have changed anyway — a sweep — within the response timeout and
    /// `cut`): the twin's answer, and the tokens it took (its placeholders 1, 2, … are the
    /// positions in that list). The client's own tasks take turns on a key before the
    /// database's turn (`store/turns.rs`), so that they do not hold all its connections
    /// waiting there.
    async fn transact<T>(
        &self,
        operation: &'static str,
        keys: &[&LockKey],
        cut: Option<Instant>,
        mut twin: impl FnMut(&mut State, &Timeline) -> Result<T, LockError>,
    ) -> Result<(T, Vec<u64>), Failure> {
        let names: Vec<&str> = keys.iter().map(|key| key.lock.as_str()).collect();
        let give_up = Instant::now() + self.shared.connections.response_timeout();
        loop {
            let taking = self.turns.take(&names);
            // A try ends at its cut also while another operation of this client on the key
            // (a clean-up, a renewal) holds its turn.
            let turn = match cut {
                Some(cut) => tokio::time::timeout_at(cut.into(), taking)
                    .await
                    .map_err(|_| Failure::TurnNotGiven)?,
                None => taking.await,
            };
            let opened = Transaction::open(&self.shared, operation, &names, cut, turn).await;
            let transaction = match opened {
                Ok(transaction) => transaction,
                Err(Failure::Changed) if Instant::now() < give_up => continue,
                Err(failure) => return Err(failure),
            };
            let (answer, write) = self.run_twin(operation, keys, &transaction.loaded, &mut twin)?;
            let Some(write) = write else {
                transaction.finish();
                return Ok((answer, Vec::new()));
            };
            match transaction.write(operation, write).await {
                Ok(tokens) => return Ok((answer, tokens)),
                Err(Failure::Changed) if Instant::now() < give_up => {}
                Err(Failure::Changed) => {
                    return Err(Failure::Error(
                        pg_error(
                            operation,
                            BackendErrorKind::Timeout,
                            "the keys kept changing between a read and its write for the whole \
                             response timeout",
                        )
                        .into(),
                    ))
                }
                Err(failure) => return Err(failure),
            }
        }
    }

    /// The twin on the loaded state: its answer, and what to write (`None`: nothing changed
    /// and no token was taken).
    fn run_twin<T>(
        &self,
        operation: &'static str,
        keys: &[&LockKey],
        loaded: &Loaded,
        twin: &mut impl FnMut(&mut State, &Timeline) -> Result<T, LockError>,
    ) -> Result<(T, Option<Write>), LockError> {
        let time = &loaded.time;
        let mut state = State {
            tokens: TokenSource::Store {
                taken: 0,
                last: loaded.last_token,
            },
            ..State::default()
        };
        let mut before = HashMap::new();
        for key in keys {
            let (_, row) = &loaded.rows[&key.lock];
            let Some(row) = row else {
                before.insert(key.lock.clone(), KeyState::default());
                continue;
            };
            let read = |row| {
                decode(row, time).map_err(|err| {
                    LockError::from(pg_error(
                        operation,
                        BackendErrorKind::Server,
                        format!(
                            "the row of `{}` in the PostgreSQL table `{}.locks` is not a \
                             distlock lock ({}); it was left untouched",
                            key.name, self.shared.options.schema, err.0
                        ),
                    ))
                })
            };
            // Read once; the twin changes a copy, the original says what the change announces.
            let read = read(row)?;
            let KeyState { entry, record } = read.clone();
            state.locks.insert(key.lock.clone(), entry);
            if let Some(record) = record {
                state.records.insert(key.lock.clone(), record);
            }
            before.insert(key.lock.clone(), read);
        }
        let answer = twin(&mut state, time)?;
        let taken = match state.tokens {
            TokenSource::Store { taken, .. } => taken,
            TokenSource::Counters => 0,
        };
        let mut write = Write {
            tokens: i32::try_from(taken).unwrap_or(i32::MAX),
            ..Write::default()
        };
        let mut done = std::collections::HashSet::new();
        for key in keys {
            if !done.insert(key.lock.as_str()) {
                continue;
            }
            let after = KeyState {
                entry: state.locks.remove(&key.lock).unwrap_or_default(),
                record: state.records.remove(&key.lock),
            };
            let (version, old) = &loaded.rows[&key.lock];
            let new = (!after.is_empty()).then(|| encode(&after, time));
            if new == *old {
                continue;
            }
            let channel = key.channel();
            for payload in announcements(&before[&key.lock], &after) {
                write.notes.push(format!("{payload} {channel}"));
            }
            write.names.push(key.lock.clone());
            write.versions.push(*version);
            write
                .expires
                .push(after.expires().map(|at| time.micros(at)));
            write.states.push(new);
        }
        if write.names.is_empty() && write.tokens == 0 {
            return Ok((answer, None));
        }
        Ok((answer, Some(write)))
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.stop();
    }
}

/// The token a placeholder stands for (`TokenSource::Store`).
fn token(placeholder: u64, tokens: &[u64]) -> Result<FencingToken, LockError> {
    usize::try_from(placeholder)
        .ok()
        .and_then(|i| tokens.get(i.checked_sub(1)?))
        .map(|&token| FencingToken(token))
        .ok_or_else(|| {
            pg_error(
                "acquire",
                BackendErrorKind::Server,
                "PostgreSQL handed out fewer tokens than the grant took",
            )
            .into()
        })
}

impl Store for PostgresStore {
    async fn acquire(&self, attempt: &Try<'_>) -> Result<AcquireReply, LockError> {
        let tried = self
            .transact("acquire", &[attempt.key], attempt.cut, |state, time| {
                let mut attempt = *attempt;
                if let Some(seat) = attempt.seat.as_mut().filter(|seat| seat.place == 0) {
                    // A new fair waiter's place: the database's clock, as on Redis.
                    seat.place = u64::try_from(time.db_micros).unwrap_or(1).max(1);
                }
                state.try_grant(&attempt, time.now)
            })
            .await;
        let (reply, tokens) = match tried {
            Ok(tried) => tried,
            // Another operation had the key for all the time left: as a key held.
            Err(Failure::TurnNotGiven) => return Ok(AcquireReply::Held(None)),
            Err(failure) => return Err(failure.into()),
        };
        match reply {
            AcquireReply::Acquired(Some(FencingToken(placeholder))) => {
                Ok(AcquireReply::Acquired(Some(token(placeholder, &tokens)?)))
            }
            other => Ok(other),
        }
    }

    async fn release(
        &self,
        holding: Holding,
        key: &LockKey,
        owner: &str,
    ) -> Result<bool, LockError> {
        let (was_ours, _) = self
            .transact("release", &[key], None, |state, time| {
                Ok(state.give_back(holding, key, owner, time.now))
            })
            .await?;
        Ok(was_ours)
    }

    /// Every lease in one statement (one per grant of a key renewed twice), with no turn:
    /// the statement changes a grant only where it is still its owner's and unexpired.
    async fn extend_many(&self, leases: &[Renewal<'_>]) -> Result<Vec<Renewed>, LockError> {
        let renewals: Vec<(String, String, &'static str, i64)> = leases
            .iter()
            .map(|renewal| {
                let side = match renewal.kind.holder_slot() {
                    HolderSlot::Writer => "w",
                    HolderSlot::Reader => "r",
                    HolderSlot::Permit => "p",
                };
                let lease = i64::try_from(renewal.lease.as_micros()).unwrap_or(i64::MAX);
                (
                    renewal.key.lock.clone(),
                    renewal.owner.to_owned(),
                    side,
                    lease,
                )
            })
            .collect();
        let renewed = self.shared.renew(&renewals).await?;
        Ok(renewed.into_iter().map(Renewed::from).collect())
    }

    /// Every key read and written in one statement each: all or none.
    async fn acquire_all(&self, attempt: &MultiTry<'_>) -> Result<MultiReply, LockError> {
        let keys: Vec<&LockKey> = attempt.keys.iter().collect();
        let tried = self
            .transact("acquire", &keys, attempt.cut, |state, time| {
                Ok(state.try_grant_all(attempt, time.now))
            })
            .await;
        let (reply, tokens) = match tried {
            Ok(tried) => tried,
            Err(Failure::TurnNotGiven) => return Ok(MultiReply::Held(None, 0)),
            Err(failure) => return Err(failure.into()),
        };
        match reply {
            MultiReply::Acquired(placeholders) => Ok(MultiReply::Acquired(
                placeholders
                    .into_iter()
                    .map(|p| p.map(|FencingToken(p)| token(p, &tokens)).transpose())
                    .collect::<Result<_, _>>()?,
            )),
            other => Ok(other),
        }
    }

    async fn release_all(&self, keys: &[&LockKey], owner: &str) -> Result<bool, LockError> {
        let (all, _) = self
            .transact("release", keys, None, |state, time| {
                Ok(state.give_back_all(keys, owner, time.now))
            })
            .await?;
        Ok(all)
    }

    /// The operation's twin, on the key's row.
    async fn run<O: KeyOperation>(&self, operation: &O) -> Result<O::Output, LockError> {
        let (output, _) = self
            .transact(O::NAME, &[operation.key()], None, |state, time| {
                Ok(operation.twin(state, time.now))
            })
            .await?;
        Ok(output)
    }

    /// The twin of [`ForceUnlock`], with its token from the sequence.
    async fn force_unlock(&self, key: &LockKey) -> Result<(Vec<RawHolder>, u64), LockError> {
        let ((evicted, placeholder), tokens) = self
            .transact(ForceUnlock::NAME, &[key], None, |state, time| {
                Ok(ForceUnlock(key).twin(state, time.now))
            })
            .await?;
        Ok((evicted, token(placeholder, &tokens)?.0))
    }

    /// The keys in use matching `pattern` (read by its literal start, then matched here).
    async fn scan_into(&self, pattern: &str, found: &mut Found) -> Result<(), LockError> {
        let (connection, _) = self.shared.checkout(None).await?;
        let literal: String = pattern
            .chars()
            .take_while(|c| !matches!(c, '*' | '?' | '[' | '\\'))
            .flat_map(|c| match c {
                '%' | '_' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        let sql = statements::scan(&self.shared.options.schema);
        let limit = i64::try_from(found.wanted().saturating_mul(16).max(1024)).unwrap_or(i64::MAX);
        let like = format!("{literal}%");
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&like, &limit];
        let rows = tokio::time::timeout(
            self.shared.connections.response_timeout(),
            connection.query(&sql, &params),
        )
        .await
        .map_err(|_| timed_out("scan"))?
        .map_err(|err| LockError::from(connections::store_error("scan", &err)))?;
        let wanted = found.wanted();
        found.extend(
            rows.iter()
                .map(|row| row.get::<_, String>(0))
                .filter(|name| glob_matches(pattern.as_bytes(), name.as_bytes()))
                .take(wanted),
        );
        Ok(())
    }

    async fn ping(&self) -> Result<(), LockError> {
        let (connection, _) = self.shared.checkout(None).await?;
        tokio::time::timeout(
            self.shared.connections.response_timeout(),
            connection.batch_execute("SELECT 1"),
        )
        .await
        .map_err(|_| timed_out("ping"))?
        .map_err(|err| LockError::from(connections::store_error("ping", &err)))
    }

    fn waker(&self) -> Option<&ReleaseListener> {
        Some(&self.waker)
    }

    /// Leases run on the database's clock, in real time.
    fn clock(&self) -> Clock {
        Clock::Real
    }

    /// Each statement of a try ends at its cut.
    fn cuts_tries(&self) -> bool {
        true
    }
}

/// A try whose cut came while another operation of this client held the key's turn: nothing
/// was sent.
fn timed_out(operation: &'static str) -> LockError {
    pg_error(
        operation,
        BackendErrorKind::Timeout,
        "no answer from PostgreSQL within the response timeout",
    )
    .into()
}

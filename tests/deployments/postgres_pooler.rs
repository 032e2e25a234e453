//! The PostgreSQL store through PgBouncer and across a failover to a promoted standby (the
//! PostgreSQL pitfalls 1, 9 and 10 of `../shared/research-stores.md`, Part 3): in session
//! mode every kind works and a release wakes a waiter by `NOTIFY` through the pooler; in
//! transaction mode, and through a PgBouncer that refuses the store's `options` startup
//! parameter, the store fails with an error that says what to change, never a wrong grant;
//! a synchronous standby promoted after the primary's crash still holds every grant the
//! primary committed, and its tokens go on above the primary's. Each test starts its own
//! server, pooler or standby ([`PgBouncer`], [`PostgresServer::start_standby`]); the store's
//! rows are read over a direct connection of the test's own. Neighbours: `postgres_faults.rs`
//! (one server's faults), `support/pgbouncer.rs` and `support/postgres.rs` (the deployments).

use std::time::Duration;

use crate::postgres_faults::{client, connect, eventually, listening, row_of};
use crate::support::panics::library_panics;
use crate::support::pgbouncer::{PgBouncer, PoolMode};
use crate::support::postgres::{PostgresServer, Replication};
use distlock::{BackendErrorKind, Client, Config, LockError, LockGuard};
use tokio::time::{sleep, timeout, Instant};

/// What the store's error says to do when PgBouncer refuses its `options` parameter.
const IGNORE_OPTIONS: &str = "ignore_startup_parameters = options";

/// What the store's error says to do through a pooler in transaction mode.
const SESSION_MODE: &str = "set `pool_mode = session`";

/// The config of a client at `url`, its sessions named `app`, with timeouts short enough for
/// a fault to show in seconds.
fn config(url: &str, app: &str) -> Config {
    let separator = if url.contains('?') { '&' } else { '?' };
    Config::postgres(&format!("{url}{separator}application_name={app}"))
        .expect("a PostgreSQL URL")
        .response_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
}

/// Whether key `key`'s row has `mark` at the top of its state (`ww`: a waiting writer; `q`:
/// the fair queue).
async fn marked(db: &tokio_postgres::Client, key: &str, mark: &str) -> Result<(), String> {
    db.query_opt(
        "SELECT 1 FROM distlock.locks WHERE name = $1 AND state ? $2",
        &[&row_of(key), &mark],
    )
    .await
    .expect("read a lock's row")
    .map(drop)
    .ok_or_else(|| format!("no `{mark}` in the row yet"))
}

fn token(guard: &LockGuard) -> u64 {
    guard.fencing_token().expect("fenced").get()
}

/// `holder` holds `key` (plain, or fair); `waiter`, whose backoff steps are 5 s, asks for it
/// and is refused (its mark is in the row); `holder` releases: how long the waiter took to get
/// it from the release, and its guard.
async fn handoff(
    holder: &Client,
    waiter: &Client,
    db: &tokio_postgres::Client,
    key: &'static str,
    fair: bool,
) -> (Duration, LockGuard) {
    let request = |client: &Client| {
        let request = client.lock(key).wait(Duration::from_secs(20));
        if fair {
            request.fair()
        } else {
            request
        }
    };
    let guard = request(holder)
        .acquire()
        .await
        .expect("the holder's acquire");
    let waiting = tokio::spawn({
        let request = request(waiter);
        async move {
            let guard = request.acquire().await.expect("the waiter's acquire");
            (guard, Instant::now())
        }
    });
    let mark = if fair { "q" } else { "ww" };
    eventually("the waiter's refused try", Duration::from_secs(10), || {
        marked(db, key, mark)
    })
    .await;
    // From the mark's commit to the waiter's registration for wake-ups: its reply's way back,
    // nothing to watch from here.
    sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    assert!(guard.release().await.expect("the holder's release"));
    let (guard, granted) = waiting.await.expect("the waiter's task");
    (granted - released, guard)
}

// --- Through PgBouncer ----------------------------------------------------------------------

/// Pitfalls 1 and 9. PgBouncer at its defaults refuses the `options` startup parameter the
/// store sends (`idle_in_transaction_session_timeout`): the first request fails at once, not
/// retried for its wait, saying to set `ignore_startup_parameters = options`. With it, in
/// session mode, every kind runs through the pooler (an exclusive grant with its fencing
/// token, readers side by side, a semaphore's permits, a fair queue), and a release hands a
/// plain and a fair lock to a waiter whose backoff steps are 5 s within a second: woken by
/// `NOTIFY`, which its `LISTEN` session (seen on the server, behind PgBouncer) received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_pgbouncer_in_session_mode_every_kind_works_and_notify_wakes() {
    let server = PostgresServer::start();

    let strict = PgBouncer::start_with(&server, PoolMode::Session, &[]);
    let refused = client(config(&strict.url(), "pgp_strict"));
    let started = Instant::now();
    let wait = Duration::from_secs(5);
    let outcome = refused.lock("pgp:strict").wait(wait).acquire().await;
    let took = started.elapsed();
    match outcome {
        Err(LockError::Backend(err)) => {
            assert_eq!(err.kind(), BackendErrorKind::Server, "{err}");
            assert!(err.to_string().contains(IGNORE_OPTIONS), "{err}");
        }
        other => panic!("through PgBouncer at its defaults: {other:?}"),
    }
    assert!(took < wait / 2, "retried for {took:?}");
    drop(strict);

    let bouncer = PgBouncer::start(&server, PoolMode::Session);
    let a = client(config(&bouncer.url(), "pgp_session_a"));
    let waiter_app = "pgp_session_waiter";
    let backoff = Duration::from_secs(5);
    let b = client(config(&bouncer.url(), waiter_app).backoff(backoff, backoff));
    let db = &server.connect().await;

    // Exclusive, fenced.
    let key = "pgp:session";
    let first = a.lock(key).acquire().await.expect("acquire");
    let refused = b.lock(key).wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "a second holder: {refused:?}"
    );
    let first_token = token(&first);
    assert!(first.release().await.expect("release"));
    let second = b
        .lock(key)
        .acquire()
        .await
        .expect("acquire after the release");
    assert!(token(&second) > first_token, "tokens do not rise");
    assert!(second.release().await.expect("release"));

    // Readers side by side, a writer kept out.
    let key = "pgp:session-read";
    let readers = [
        a.read_lock(key).acquire().await.expect("read"),
        b.read_lock(key).acquire().await.expect("read beside it"),
    ];
    let writer = a.lock(key).wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(writer, Err(LockError::Timeout { .. })),
        "{writer:?}"
    );
    for reader in readers {
        assert!(reader.release().await.expect("release a reader"));
    }

    // A semaphore's two permits, a third refused.
    let key = "pgp:session-permits";
    let permits = [
        a.semaphore(key, 2).acquire().await.expect("a permit"),
        b.semaphore(key, 2).acquire().await.expect("another permit"),
    ];
    let third = a.semaphore(key, 2).wait(Duration::ZERO).acquire().await;
    assert!(matches!(third, Err(LockError::Timeout { .. })), "{third:?}");
    for permit in permits {
        assert!(permit.release().await.expect("release a permit"));
    }

    // The waiter's listener starts with its first wait, through PgBouncer.
    let listen_key = "pgp:session-listen";
    let guard = a.lock(listen_key).acquire().await.expect("acquire");
    let waiting = tokio::spawn({
        let request = b.lock(listen_key).wait(Duration::from_secs(20));
        async move { request.acquire().await }
    });
    eventually(
        "the waiter's LISTEN session behind PgBouncer",
        Duration::from_secs(10),
        || listening(db, waiter_app),
    )
    .await;
    assert!(guard.release().await.expect("release"));
    let woken = waiting
        .await
        .expect("the waiter's task")
        .expect("its acquire");
    assert!(woken.release().await.expect("release"));

    for (key, fair) in [("pgp:session-wake", false), ("pgp:session-fair", true)] {
        let (took, guard) = handoff(&a, &b, db, key, fair).await;
        assert!(
            took < Duration::from_secs(1),
            "the {} waiter took {took:?} after the release: not woken by NOTIFY",
            if fair { "fair" } else { "plain" }
        );
        assert!(guard.release().await.expect("the waiter's release"));
    }
}

/// Pitfall 1. Through PgBouncer in transaction mode (1.18: prepared statements not
/// supported), the store's prepared statements land on one server connection and its next
/// statements on another. The first request fails at once, saying to set
/// `pool_mode = session` (PgBouncer hands out its server connections round robin, as a busy
/// pooler does, so the first statement after a prepare runs elsewhere); two clients asking
/// for one key round after round then get at most one grant at a time, with rising tokens,
/// and every failure is that error or a wait that ran out: never two holders, never a hang
/// or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_pgbouncer_in_transaction_mode_is_a_clear_error_never_a_wrong_grant() {
    let server = PostgresServer::start();
    let bouncer = PgBouncer::start_with(
        &server,
        PoolMode::Transaction,
        &[
            ("ignore_startup_parameters", "options"),
            ("server_round_robin", "1"),
        ],
    );
    let panics = library_panics();
    // Two server connections in the pool, so that round robin has a choice.
    let (one, two) = (connect(&bouncer.url()).await, connect(&bouncer.url()).await);
    let (pid_one, pid_two) =
        tokio::join!(backend_in_transaction(&one), backend_in_transaction(&two));
    assert_ne!(
        pid_one, pid_two,
        "PgBouncer gave two open transactions one backend"
    );
    one.batch_execute("COMMIT").await.expect("COMMIT");
    two.batch_execute("COMMIT").await.expect("COMMIT");

    let a = client(config(&bouncer.url(), "pgp_transaction_a"));
    let b = client(config(&bouncer.url(), "pgp_transaction_b"));
    let key = "pgp:transaction";
    let first_wait = Duration::from_secs(5);
    let started = Instant::now();
    let first = a.lock(key).wait(first_wait).acquire().await;
    match first {
        Err(LockError::Backend(err)) => {
            assert_eq!(err.kind(), BackendErrorKind::Server, "{err}");
            assert!(err.to_string().contains(SESSION_MODE), "{err}");
        }
        other => panic!("the first request in transaction mode: {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < first_wait / 2, "retried for {took:?}");

    let wait = Duration::from_millis(500);
    let mut tokens = Vec::new();
    let mut clear_errors = 0;
    for round in 0..10 {
        let bound = wait + Duration::from_secs(5);
        let request = |client: &Client| client.lock(key).lease(Duration::from_secs(1)).wait(wait);
        let (from_a, from_b) = timeout(
            bound,
            futures_util::future::join(request(&a).acquire(), request(&b).acquire()),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: a request hung past {bound:?}"));
        assert!(
            !(from_a.is_ok() && from_b.is_ok()),
            "round {round}: two holders of one key"
        );
        for outcome in [from_a, from_b] {
            match outcome {
                Ok(guard) => {
                    tokens.push(token(&guard));
                    // A release may fail too (then the lease runs out).
                    let _ = guard.release().await;
                }
                Err(LockError::Timeout { .. }) => {}
                Err(LockError::Backend(err)) if err.to_string().contains(SESSION_MODE) => {
                    clear_errors += 1;
                }
                Err(err) => panic!("round {round}: an error that does not say what to do: {err}"),
            }
        }
    }
    eprintln!("in transaction mode: grants with tokens {tokens:?}, {clear_errors} clear errors");
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    assert_eq!(library_panics(), panics, "the library panicked");
}

/// Opens a transaction on `db` (through PgBouncer: it keeps its server connection to the
/// end) and answers its backend's pid.
async fn backend_in_transaction(db: &tokio_postgres::Client) -> String {
    let messages = db
        .simple_query("BEGIN; SELECT pg_backend_pid()")
        .await
        .expect("BEGIN");
    messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a pid")
}

// --- A failover to a promoted standby -------------------------------------------------------

/// Pitfall 10. Holders on a primary with a synchronous standby, their clients' URL naming
/// both servers (`target_session_attrs=read-write`): the primary is killed (SIGKILL of every
/// process) and the standby promoted. The grant the primary had committed is held on the
/// promoted standby, with its lease: another client is refused it; the holder's client renews
/// it there; once the holder releases it, the other gets it. Every token after the failover
/// is above every token before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failover_to_a_synchronous_standby_keeps_grants_and_tokens_rise() {
    let mut primary = PostgresServer::start();
    let standby = primary.start_standby(Replication::Synchronous);
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let holder = client(config(&both, "pgp_failover_holder"));
    let other = client(config(&both, "pgp_failover_other"));
    let key = "pgp:failover";
    let lease = Duration::from_secs(6);

    let mut before = Vec::new();
    for client in [&holder, &other] {
        let guard = client
            .lock("pgp:failover-before")
            .acquire()
            .await
            .expect("acquire");
        before.push(token(&guard));
        assert!(guard.release().await.expect("release"));
    }
    let held = holder
        .lock(key)
        .lease(lease)
        .acquire()
        .await
        .expect("acquire");
    before.push(token(&held));
    let refused = other.lock(key).wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );

    let failed_over = Instant::now();
    primary.kill();
    standby.promote();
    let promoted = failed_over.elapsed();

    // The grant is there, unexpired, on the promoted standby.
    let db = &standby.connect().await;
    let row = db
        .query_opt(
            "SELECT (state->'w'->>1)::bigint, \
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
             FROM distlock.locks WHERE name = $1",
            &[&row_of(key)],
        )
        .await
        .expect("read the holder's row on the promoted standby")
        .expect("the grant the primary committed is not on the promoted standby");
    let (until, now): (i64, i64) = (row.get(0), row.get(1));
    assert!(until > now, "the grant ran out on the promoted standby");

    // Another client reaches the new primary, and is refused the key.
    let refused = eventually(
        "the other client to reach the promoted standby",
        Duration::from_secs(10),
        || async {
            match other.lock(key).wait(Duration::ZERO).acquire().await {
                Err(LockError::Backend(err)) => Err(err.to_string()),
                outcome => Ok(outcome),
            }
        },
    )
    .await;
    let first_answer = failed_over.elapsed();
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "after the failover, a second holder: {refused:?}"
    );

    // The holder's client renews there: the grant's end moves past the one it had.
    eventually("a renewal on the promoted standby", lease, || async move {
        let renewed: i64 = db
            .query_one(
                "SELECT (state->'w'->>1)::bigint FROM distlock.locks WHERE name = $1",
                &[&row_of(key)],
            )
            .await
            .expect("read the row")
            .get(0);
        if renewed > until {
            Ok(())
        } else {
            Err("not renewed yet".to_owned())
        }
    })
    .await;
    assert!(held.is_held(), "the holder lost its grant in the failover");
    assert!(held
        .release()
        .await
        .expect("release on the promoted standby"));

    let after = other
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acquire after the holder's release");
    let (highest, later) = (
        before.iter().max().copied().unwrap_or_default(),
        token(&after),
    );
    assert!(
        later > highest,
        "a token after the failover ({later}) is not above those before it ({before:?})"
    );
    assert!(after.release().await.expect("release"));
    eprintln!(
        "failover: promoted {promoted:?} after the kill, first answer from the new primary \
         {first_answer:?} after it; tokens before {before:?}, after {later}"
    );
}

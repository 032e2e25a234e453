//! Every API name the README and `docs/` mention in their running text (inline code: their
//! code blocks are doctests already, `src/lib.rs`), used here the way the text uses it, so a
//! name renamed, removed or made private fails to compile this binary. The names were
//! collected from the backticked spans of README.md and docs/*.md (`Type::method`,
//! `distlock::…`, `.method()`, variants with their fields). The instance methods run on the
//! in-process store; the global client's functions are only compiled
//! ([`the_global_clients_functions`]), since this binary's global client is `inspect`'s, and
//! so are `Config::from_env`/`from_env_or` (the environment is `inspect`'s too).

use std::time::Duration;

use distlock::fenced::{self, FenceRaise, FencedWrite};
use distlock::{
    BackendError, BackendErrorKind, Client, Config, Election, FencingToken, ForcedUnlock, Holder,
    LeaderChanges, LeaderInfo, Leadership, LockError, LockGuard, LockInfo, LockMode, LockRequest,
    LockState,
};

/// `distlock::init`, `try_init`, `lock(..)`, `read_lock`, `write_lock`, `semaphore`,
/// `lock_all`, `election(name)`, `inspect`, `is_locked`, `ping().await`, `shutdown().await`,
/// `current()`, `fencing_token()?`: compiled, never run.
#[allow(dead_code)]
async fn the_global_clients_functions() -> Result<(), LockError> {
    distlock::init(Config::in_memory())?;
    let _: bool = distlock::try_init(Config::in_memory())?;
    let _: LockRequest = distlock::lock("k").fair();
    let _: LockRequest = distlock::read_lock("k");
    let _: LockRequest = distlock::write_lock("k");
    let _: LockRequest = distlock::semaphore("k", 3);
    let _: LockRequest = distlock::lock_all(["a", "b"]);
    let _: Election = distlock::election("name");
    let _: LockState = distlock::inspect("k").await?;
    let _: bool = distlock::is_locked("k").await?;
    distlock::ping().await?;
    let _: usize = distlock::shutdown().await?;
    let _: Option<LockInfo> = distlock::current();
    let _: FencingToken = distlock::fencing_token()?;
    let _: Option<FencingToken> = distlock::current().and_then(|info| info.fencing_token());
    Ok(())
}

/// `distlock::fenced::set(conn, key, value, token)`, `fenced::pipe(key, token)`,
/// `fenced::fence_key(key)`, `FencedWrite::Applied(replies)` / `Stale { highest }`, over a
/// `redis::aio::ConnectionLike` of the `redis` crate distlock uses: compiled, never run.
#[allow(dead_code)]
async fn the_fenced_writes(
    conn: &mut redis::aio::MultiplexedConnection,
    token: FencingToken,
) -> redis::RedisResult<()> {
    let outcome: FencedWrite = fenced::set(conn, "k", 41, token).await?;
    let _ = outcome.is_applied();
    let piped: FencedWrite<(String,)> = fenced::pipe("k", token)
        .cmd(redis::cmd("SET").arg("k").arg(1))
        .query_async(conn)
        .await?;
    let _: Option<FencingToken> = match piped {
        FencedWrite::Applied((reply,)) => reply.is_empty().then_some(token),
        FencedWrite::Stale { highest } => Some(highest),
    };
    let _: String = fenced::fence_key("k");
    Ok(())
}

/// `fenced::raise(conn, key, token)`, `FenceRaise::Raised { previous }` /
/// `AlreadyAtLeast { highest }`, with `ForcedUnlock::token`, over the `ConnectionManager` the
/// docs recommend: compiled, never run.
#[allow(dead_code)]
async fn the_fence_raise(
    conn: &mut redis::aio::ConnectionManager,
    forced: ForcedUnlock,
) -> redis::RedisResult<()> {
    let _: Option<FencingToken> = match fenced::raise(conn, "k", forced.token).await? {
        FenceRaise::Raised { previous } => previous,
        FenceRaise::AlreadyAtLeast { highest } => Some(highest),
    };
    Ok(())
}

/// `Config::from_url`, `cluster`, `sentinel`, `redlock`, `from_env`, `from_env_or(url)`,
/// `in_memory`, and every setting the README's table names, with the constants beside them.
#[test]
fn every_config_name_the_docs_mention() {
    let _: fn() -> Result<Config, LockError> = Config::from_env;
    let _: fn(&str) -> Result<Config, LockError> = Config::from_env_or;
    let url = "redis://docs.invalid:7000";
    let _: Config = Config::cluster([url, "redis://docs.invalid:7001"]).expect("cluster");
    let _: Config = Config::sentinel([url], "mymaster").expect("sentinel");
    let _: Config =
        Config::redlock([url, "redis://b.invalid:1", "redis://c.invalid:1"]).expect("redlock");
    let _: Config = Config::in_memory();
    let _: Config = Config::from_url(url)
        .expect("from_url")
        .app_name("billing-worker")
        .key_prefix(distlock::DEFAULT_KEY_PREFIX)
        .default_lease(distlock::DEFAULT_LEASE)
        .default_wait(distlock::DEFAULT_WAIT)
        .backoff(distlock::DEFAULT_BACKOFF_MIN, distlock::DEFAULT_BACKOFF_MAX)
        .retry(
            distlock::DEFAULT_RETRY_ATTEMPTS,
            distlock::DEFAULT_RETRY_INTERVAL,
        )
        .fair_heartbeat(distlock::DEFAULT_FAIR_HEARTBEAT)
        .response_timeout(distlock::DEFAULT_RESPONSE_TIMEOUT)
        .connect_timeout(distlock::DEFAULT_CONNECT_TIMEOUT)
        .node_timeout(distlock::DEFAULT_NODE_TIMEOUT)
        .replicas(1, Duration::from_millis(100))
        .fencing(true);
    let _: &str = distlock::DEFAULT_REDIS_URL;
    for name in [
        distlock::ENV_REDIS_URL,
        distlock::ENV_CLUSTER_URLS,
        distlock::ENV_SENTINEL_URLS,
        distlock::ENV_SENTINEL_MASTER,
        distlock::ENV_REDLOCK_URLS,
        distlock::ENV_APP_NAME,
    ] {
        assert!(
            name == "REDIS_URL" || name.starts_with("DISTLOCK_"),
            "{name}"
        );
    }
    assert_eq!(distlock::LOG_TARGET, "distlock");
    assert!(!distlock::METRICS.is_empty());
    assert!(distlock::MIN_LEASE < distlock::MAX_LEASE);
    let _: usize = distlock::MAX_KEY_LEN;
    assert!(distlock::FAIR_HEARTBEAT_BOUNDS.contains(&distlock::DEFAULT_FAIR_HEARTBEAT));
}

/// `LockError`'s variants with the fields the Errors table names, `is_transient()`, and
/// `Backend(err)`'s `err.kind()` with its kinds.
#[test]
fn every_error_name_the_docs_mention() {
    fn what(err: &LockError) -> &'static str {
        match err {
            LockError::Timeout { key, waited } => {
                let _: (&String, &Duration) = (key, waited);
                "timeout"
            }
            LockError::LeaseLost { key } => {
                let _: &String = key;
                "lost"
            }
            LockError::HeldTooLong { key, max_hold } => {
                let _: (&String, &Duration) = (key, max_hold);
                "held too long"
            }
            LockError::ShutDown => "shut down",
            LockError::Backend(err) => backend(err),
            LockError::QuorumUnavailable { .. } => "quorum",
            LockError::NotALock { redis_key, holds } => {
                let _: (&String, &String) = (redis_key, holds);
                "not a lock"
            }
            LockError::FencingCounterTooLarge { redis_key, value } => {
                let _: (&String, &String) = (redis_key, value);
                "counter too large"
            }
            LockError::PermitsMismatch { key, asked, held } => {
                let _: (&String, &u32, &Option<u32>) = (key, asked, held);
                "permits"
            }
            LockError::UpgradeRefused { key } => {
                let _: &String = key;
                "upgrade"
            }
            LockError::NoFencingToken(why) => {
                let _: &&str = why;
                "no token"
            }
            LockError::LeadershipLost { election, epoch } => {
                let _: (&String, &u64) = (election, epoch);
                "leadership lost"
            }
            LockError::NotInitialized => "not initialized",
            LockError::InvalidKey { .. } => "invalid key",
            LockError::Config(..) => "config",
            _ => "other",
        }
    }
    fn backend(err: &BackendError) -> &'static str {
        let _: &'static str = err.operation();
        match err.kind() {
            BackendErrorKind::Connection => "connection",
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Authentication => "authentication",
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Server => "server",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Tls => "tls",
            BackendErrorKind::Unreplicated => "unreplicated",
            _ => "other",
        }
    }
    let quorum = LockError::QuorumUnavailable {
        key: "k".into(),
        answered: 1,
        granted: 1,
        needed: 2,
        nodes: 3,
    };
    assert_eq!(what(&quorum), "quorum");
    assert!(quorum.is_transient());
    assert!(!LockError::ShutDown.is_transient());
    assert_eq!(what(&LockError::Config("x".into())), "config");
}

/// On a client: `Client::new`, `in_memory()`, `lock(key)` with `.lease(d)`, `.wait(d)`,
/// `.max_hold(d)`, `.hold_at_least(d)`, `.watchdog(bool)`, `.fencing(bool)`, `.fair()`,
/// `.acquire().await`, `try_acquire()`, `run(async { … })`; `read_lock`, `write_lock`,
/// `semaphore(key, permits)`, `lock_all(keys)`; the guard's `key()`, `keys()`, `mode()`,
/// `fencing_token()`, `fencing_token_of(key)`, `permits()`, `is_held()`, `lost().await`,
/// `release().await -> bool`; `FencingToken::as_i64`, `from_raw`; the operator's
/// `inspect(key)` (`LockState::queued`, …), `is_locked`, `list(pattern, limit)`,
/// `force_unlock(key)`; `election(name)` with `.value(bytes)`, `campaign()`,
/// `Leadership::epoch()`, `lost()`, `proclaim(bytes)`, `resign()`, `leader()`, `observe()` (a
/// `Stream` of `LeaderInfo`); `ping()` and `shutdown().await`.
#[tokio::test]
async fn every_client_name_the_docs_mention() {
    let _: fn(Config) -> Result<Client, LockError> = Client::new;
    let client = Client::in_memory();
    let short = Duration::from_millis(100);

    let guard: LockGuard = client
        .lock("api:one")
        .lease(Duration::from_secs(5))
        .wait(short)
        .max_hold(Duration::from_secs(10))
        .hold_at_least(Duration::ZERO)
        .watchdog(true)
        .fencing(true)
        .acquire()
        .await
        .expect("free");
    assert_eq!(guard.key(), "api:one");
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["api:one"]);
    assert_eq!(guard.mode(), LockMode::Write);
    let token: FencingToken = guard.fencing_token().expect("fenced");
    assert_eq!(FencingToken::from_raw(token.get()), token);
    assert!(token.as_i64().is_ok());
    assert!(guard.is_held());
    assert_eq!(guard.permits(), None);
    assert!(client.is_locked("api:one").await.expect("is_locked"));
    let busy: Option<LockGuard> = client.lock("api:one").try_acquire().await.expect("try");
    assert!(busy.is_none());
    let state: LockState = client.inspect("api:one").await.expect("inspect");
    assert_eq!(state.queued, 0);
    let _: &Vec<Holder> = &state.holders;
    assert_eq!(
        client.list("api:*", 10).await.expect("list"),
        ["api:one".to_owned()]
    );
    let forced: ForcedUnlock = client.force_unlock("api:one").await.expect("force_unlock");
    assert_eq!(forced.evicted.len(), 1);
    // The evicted holder learns it at its next renewal, a third of its 5 s lease away.
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the evicted holder is told");
    assert!(!guard.is_held());
    let released: bool = guard.release().await.expect("release");
    assert!(!released);

    let fair = client
        .lock("api:fair")
        .fair()
        .acquire()
        .await
        .expect("fair");
    assert!(fair.release().await.expect("release"));
    let read = client.read_lock("api:rw").acquire().await.expect("read");
    assert_eq!(read.mode(), LockMode::Read);
    assert!(read.release().await.expect("release"));
    let write = client.write_lock("api:rw").acquire().await.expect("write");
    assert!(write.release().await.expect("release"));
    let permit = client
        .semaphore("api:sem", 3)
        .acquire()
        .await
        .expect("permit");
    assert_eq!(permit.permits(), Some(3));
    assert!(permit.release().await.expect("release"));
    let both = client
        .lock_all(["api:a", "api:b"])
        .acquire()
        .await
        .expect("both");
    assert!(both.fencing_token_of("api:b").is_some());
    assert!(both.release().await.expect("release"));
    let ran: u32 = client.lock("api:run").run(async { 42 }).await.expect("run");
    assert_eq!(ran, 42);

    let election: Election = client.election("api:leader").value(b"me".to_vec());
    let mut changes: LeaderChanges = election.observe();
    fn is_a_stream_of_leaders(_: &impl futures_util::Stream<Item = LeaderInfo>) {}
    is_a_stream_of_leaders(&changes);
    let leadership: Leadership = election.campaign().await.expect("campaign");
    let epoch: FencingToken = leadership.epoch();
    let leader: LeaderInfo = election.leader().await.expect("leader").expect("one");
    assert_eq!(leader.epoch(), epoch);
    assert_eq!(leader.value(), Some(&b"me"[..]));
    let seen = tokio::time::timeout(Duration::from_secs(10), changes.next())
        .await
        .expect("the leader is observed");
    assert_eq!(seen.map(|info| info.epoch()), Some(epoch));
    assert!(leadership.is_leader());
    let still_leads = futures_util::FutureExt::now_or_never(leadership.lost()).is_none();
    assert!(still_leads, "lost() is pending while it leads");
    leadership
        .proclaim(b"me, moved".to_vec())
        .await
        .expect("proclaim");
    let leader: LeaderInfo = election.leader().await.expect("leader").expect("one");
    assert_eq!(leader.value(), Some(&b"me, moved"[..]));
    assert!(leadership.resign().await.expect("resign"));

    client.ping().await.expect("ping");
    let _: usize = client.shutdown().await.expect("shutdown");
}

/// docs/observability.md: `observe().with_vacancies()`, a `LeaderStates` stream of
/// `Option<LeaderInfo>` (`None`: nobody leads).
#[tokio::test]
async fn the_observability_pages_names() {
    let client = Client::in_memory();
    let mut states: distlock::LeaderStates =
        client.election("api:vacancies").observe().with_vacancies();
    fn is_a_stream_of_states(_: &impl futures_util::Stream<Item = Option<LeaderInfo>>) {}
    is_a_stream_of_states(&states);
    let first: Option<Option<LeaderInfo>> =
        tokio::time::timeout(Duration::from_secs(10), states.next())
            .await
            .expect("the state at the start");
    assert!(first.expect("the stream goes on").is_none(), "nobody leads");
}

/// The certificate setters of docs/tls.md, docs/etcd.md and docs/postgres.md
/// (`Config::etcd_ca_pem`, `etcd_client_cert`, `postgres_ca_pem`, `postgres_client_cert`),
/// each taking PEM: compiled, never run.
#[cfg(all(feature = "etcd", feature = "postgres"))]
#[allow(dead_code)]
fn the_tls_names(ca: &str, cert: Vec<u8>, key: &[u8]) -> Result<(), LockError> {
    let _: Config = Config::etcd(["https://127.0.0.1:2379"])?
        .etcd_ca_pem(ca)
        .etcd_client_cert(cert.clone(), key);
    let _: Config = Config::postgres("postgres://app@127.0.0.1/app?sslmode=verify-full")?
        .postgres_ca_pem(ca)
        .postgres_client_cert(cert, key);
    Ok(())
}

/// The PostgreSQL names of docs/postgres.md, docs/fenced-writes.md and the README
/// (`Config::postgres`, `postgres_schema`, `postgres_create_schema`, `postgres_schema_sql`,
/// `DEFAULT_POSTGRES_SCHEMA`, `DISTLOCK_POSTGRES_URL`, `fenced::postgres::begin`, `update`,
/// `FencedError`): compiled, never run.
#[cfg(feature = "postgres")]
#[allow(dead_code)]
async fn the_postgres_names(
    guard: &LockGuard,
    db: &mut tokio_postgres::Client,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::postgres("postgres://app@127.0.0.1:5432/app")?
        .postgres_schema(distlock::DEFAULT_POSTGRES_SCHEMA)
        .postgres_create_schema(false);
    let _ = Client::new(config)?;
    let _: &str = distlock::ENV_POSTGRES_URL;
    let _: String = distlock::postgres_schema_sql("distlock");
    match fenced::postgres::begin(guard, db).await {
        Ok(transaction) => transaction.commit().await?,
        Err(fenced::postgres::FencedError::NotHolder { .. }) => {}
        Err(other) => return Err(other.into()),
    }
    let token = FencingToken::from_raw(7);
    let _ = fenced::postgres::update("stock", token)
        .set("qty = qty - 1")
        .filter("sku = $1")
        .fence_column("fence");
    Ok(())
}

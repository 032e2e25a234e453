//! `Config::from_env()` picks the deployment from the environment (`REDIS_URL`,
//! `DISTLOCK_CLUSTER_URLS`, `DISTLOCK_SENTINEL_URLS` with `DISTLOCK_SENTINEL_MASTER`,
//! `DISTLOCK_REDLOCK_URLS`), says which variables are at odds, and refuses an environment
//! that names no deployment; `Config::from_env_or(url)` falls back to `url` on purpose. The
//! environment is process-wide, so every test here holds [`ENV`] while it sets and reads it.

use std::sync::{Mutex, MutexGuard};

use distlock::{
    Config, LockError, ENV_APP_NAME, ENV_CLUSTER_URLS, ENV_REDIS_URL, ENV_REDLOCK_URLS,
    ENV_SENTINEL_MASTER, ENV_SENTINEL_URLS,
};

const ALL: [&str; 6] = [
    ENV_REDIS_URL,
    ENV_CLUSTER_URLS,
    ENV_SENTINEL_URLS,
    ENV_SENTINEL_MASTER,
    ENV_REDLOCK_URLS,
    ENV_APP_NAME,
];

/// Held by each test for as long as it touches the environment.
static ENV: Mutex<()> = Mutex::new(());

/// Sets exactly these of distlock's variables (the others removed), and holds [`ENV`].
fn environment(vars: &[(&str, &str)]) -> MutexGuard<'static, ()> {
    let held = ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for name in ALL {
        // SAFETY: every test of this binary holds `ENV` while it touches the environment,
        // and nothing else in the process reads it meanwhile.
        unsafe { std::env::remove_var(name) };
    }
    for (name, value) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(name, value) };
    }
    held
}

/// `from_env` with exactly these variables set, as `Debug` output or the error message.
fn from_env_with(vars: &[(&str, &str)]) -> Result<String, String> {
    let _env = environment(vars);
    Config::from_env()
        .map(|config| format!("{config:?}"))
        .map_err(|err| err.to_string())
}

/// `from_env_or(default_url)` with exactly these variables set, as `Debug` output or the error
/// message.
fn from_env_or_with(default_url: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    let _env = environment(vars);
    Config::from_env_or(default_url)
        .map(|config| format!("{config:?}"))
        .map_err(|err| err.to_string())
}

#[test]
fn from_env_with_nothing_set_is_an_error_that_names_every_variable() {
    let err = {
        let _env = environment(&[]);
        Config::from_env().unwrap_err()
    };
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let message = err.to_string();
    for name in [
        ENV_REDIS_URL,
        ENV_CLUSTER_URLS,
        ENV_SENTINEL_URLS,
        ENV_SENTINEL_MASTER,
        ENV_REDLOCK_URLS,
    ] {
        assert!(message.contains(name), "{name} not in: {message}");
    }
    // It says what to do, and names the explicit fallback.
    assert!(message.contains("from_env_or"), "{message}");
    assert!(!message.contains("6379 ("), "{message}");
    // Blanks are as good as nothing: a variable set to "" in a manifest names nothing.
    let blank = from_env_with(&[(ENV_REDIS_URL, "  ")]).unwrap_err();
    assert!(blank.contains(ENV_REDIS_URL), "{blank}");
    // The application name alone names no deployment either.
    let app_only = from_env_with(&[(ENV_APP_NAME, "billing")]).unwrap_err();
    assert!(app_only.contains(ENV_REDIS_URL), "{app_only}");
}

#[test]
fn from_env_or_with_nothing_set_is_the_given_url() {
    let local = from_env_or_with(distlock::DEFAULT_REDIS_URL, &[]).expect("the given URL");
    assert!(local.contains("Redis(127.0.0.1:6379 (db 0))"), "{local}");
    let given = from_env_or_with("redis://127.0.0.1:7000/4", &[]).expect("the given URL");
    assert!(given.contains("Redis(127.0.0.1:7000 (db 4))"), "{given}");
    // The application name is read either way.
    let named = from_env_or_with("redis://127.0.0.1:7000", &[(ENV_APP_NAME, "billing")])
        .expect("the given URL");
    assert!(named.contains("billing"), "{named}");
    // A given URL that cannot work is the error `from_url` gives.
    let bad = from_env_or_with("http://nope", &[]).unwrap_err();
    assert!(bad.contains("not a Redis scheme"), "{bad}");
}

#[test]
fn from_env_or_takes_the_environment_when_it_names_a_deployment() {
    let single = from_env_or_with(
        distlock::DEFAULT_REDIS_URL,
        &[(ENV_REDIS_URL, "redis://127.0.0.1:6380/2")],
    )
    .expect("REDIS_URL");
    assert!(single.contains("Redis(127.0.0.1:6380 (db 2))"), "{single}");
    assert!(!single.contains("6379"), "{single}");
    let redlock = from_env_or_with(
        distlock::DEFAULT_REDIS_URL,
        &[(ENV_REDLOCK_URLS, "redis://m1:1,redis://m2:2,redis://m3:3")],
    )
    .expect("redlock");
    assert!(redlock.contains("Redlock(m1:1 (db 0), m2:2"), "{redlock}");
    // Variables at odds are the same error as from `from_env`: no fallback hides them.
    let both = from_env_or_with(
        distlock::DEFAULT_REDIS_URL,
        &[
            (ENV_REDIS_URL, "redis://a:1"),
            (ENV_CLUSTER_URLS, "redis://b:2"),
        ],
    )
    .unwrap_err();
    assert!(both.contains(ENV_CLUSTER_URLS), "{both}");
    let no_master =
        from_env_or_with(distlock::DEFAULT_REDIS_URL, &[(ENV_SENTINEL_MASTER, "m")]).unwrap_err();
    assert!(no_master.contains(ENV_SENTINEL_URLS), "{no_master}");
}

#[test]
fn from_env_reads_every_deployment_and_names_conflicts() {
    let single = from_env_with(&[(ENV_REDIS_URL, "redis://127.0.0.1:6380/2")]).expect("single");
    assert!(single.contains("Redis(127.0.0.1:6380 (db 2))"), "{single}");

    let cluster =
        from_env_with(&[(ENV_CLUSTER_URLS, "redis://a:7000, redis://b:7001")]).expect("cluster");
    assert!(
        cluster.contains("Cluster(a:7000 (db 0), b:7001 (db 0))"),
        "{cluster}"
    );

    let sentinel = from_env_with(&[
        (ENV_SENTINEL_URLS, "redis://s1:26379,redis://s2:26379"),
        (ENV_SENTINEL_MASTER, "mymaster"),
    ])
    .expect("sentinel");
    assert!(
        sentinel.contains("Sentinel(mymaster via s1:26379"),
        "{sentinel}"
    );

    let redlock = from_env_with(&[(ENV_REDLOCK_URLS, "redis://m1:1,redis://m2:2,redis://m3:3")])
        .expect("redlock");
    assert!(redlock.contains("Redlock(m1:1 (db 0), m2:2"), "{redlock}");

    let even = from_env_with(&[(ENV_REDLOCK_URLS, "redis://m1:1,redis://m2:2")]).unwrap_err();
    assert!(even.contains("odd number"), "{even}");

    let both = from_env_with(&[
        (ENV_REDIS_URL, "redis://a:1"),
        (ENV_CLUSTER_URLS, "redis://b:2"),
    ])
    .unwrap_err();
    assert!(
        both.contains(ENV_CLUSTER_URLS) && both.contains(ENV_REDIS_URL),
        "{both}"
    );

    let no_master = from_env_with(&[(ENV_SENTINEL_URLS, "redis://s1:26379")]).unwrap_err();
    assert!(no_master.contains(ENV_SENTINEL_MASTER), "{no_master}");

    let no_sentinels = from_env_with(&[(ENV_SENTINEL_MASTER, "mymaster")]).unwrap_err();
    assert!(no_sentinels.contains(ENV_SENTINEL_URLS), "{no_sentinels}");

    let list_as_one = from_env_with(&[(ENV_REDIS_URL, "redis://a:1,redis://b:2")]).unwrap_err();
    assert!(list_as_one.contains("list of URLs"), "{list_as_one}");

    let tls = from_env_with(&[(ENV_CLUSTER_URLS, "rediss://a:7000")]);
    if cfg!(feature = "tls") {
        assert!(tls.is_ok(), "{tls:?}");
    } else {
        let tls = tls.unwrap_err();
        assert!(tls.contains("`tls` feature"), "{tls}");
    }

    let bad_port = from_env_with(&[(ENV_REDIS_URL, "redis://:s3cret@h:637900")]).unwrap_err();
    assert!(bad_port.contains("port that is not a number"), "{bad_port}");
    assert!(!bad_port.contains("s3cret"), "{bad_port}");

    let db_in_query =
        from_env_with(&[(ENV_REDLOCK_URLS, "redis://a:1,redis://b:2?db=1,redis://c:3")])
            .unwrap_err();
    assert!(
        db_in_query.contains("Redlock master URL has the query parameter `db`"),
        "{db_in_query}"
    );

    let no_scheme = from_env_with(&[(ENV_REDLOCK_URLS, "m1:1,m2:2,m3:3")]).unwrap_err();
    assert!(no_scheme.contains("no scheme"), "{no_scheme}");

    let secret = from_env_with(&[(ENV_CLUSTER_URLS, "http://u:s3cret@a:7000")]).unwrap_err();
    assert!(!secret.contains("s3cret"), "{secret}");
}

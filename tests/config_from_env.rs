//! `Config::from_env()` picks the deployment from the environment (`REDIS_URL`,
//! `DISTLOCK_CLUSTER_URLS`, `DISTLOCK_SENTINEL_URLS` with `DISTLOCK_SENTINEL_MASTER`,
//! `DISTLOCK_REDLOCK_URLS`), and says which variables are at odds. The environment is
//! process-wide, so this binary holds one test that walks through the cases in turn.

use distlock::{
    Config, ENV_CLUSTER_URLS, ENV_REDIS_URL, ENV_REDLOCK_URLS, ENV_SENTINEL_MASTER,
    ENV_SENTINEL_URLS,
};

const ALL: [&str; 5] = [
    ENV_REDIS_URL,
    ENV_CLUSTER_URLS,
    ENV_SENTINEL_URLS,
    ENV_SENTINEL_MASTER,
    ENV_REDLOCK_URLS,
];

/// `from_env` with exactly these variables set, as `Debug` output or the error message.
fn from_env_with(vars: &[(&str, &str)]) -> Result<String, String> {
    for name in ALL {
        // SAFETY: this binary has a single test, which runs on one thread.
        unsafe { std::env::remove_var(name) };
    }
    for (name, value) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(name, value) };
    }
    Config::from_env()
        .map(|config| format!("{config:?}"))
        .map_err(|err| err.to_string())
}

#[test]
fn from_env_reads_every_deployment_and_names_conflicts() {
    let default = from_env_with(&[]).expect("defaults to one local server");
    assert!(default.contains("Redis(127.0.0.1:6379"), "{default}");

    let single = from_env_with(&[(ENV_REDIS_URL, "redis://10.0.0.9:6380/2")]).expect("single");
    assert!(single.contains("Redis(10.0.0.9:6380 (db 2))"), "{single}");

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

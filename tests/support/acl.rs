//! An ACL user with exactly the commands the docs list (issue 23, item 6): the list as the
//! ACL paragraph of `docs/keys-and-acls.md` names it, and the scenario that runs every lock kind and the
//! operator's tools through such a user — on a single server
//! (`tests/deployments/redis_faults.rs`) and on the Cluster (`tests/deployments/cluster.rs`).

use std::time::{Duration, Instant};

use distlock::Client;

/// The commands the ACL paragraph of `docs/keys-and-acls.md` ("An ACL user for distlock needs …")
/// names: its backticked spans in capitals, `CLIENT KILL` and the like included.
pub fn readme_acl_commands() -> Vec<String> {
    let readme = include_str!("../../docs/keys-and-acls.md");
    let paragraph = readme
        .split("\n\n")
        .find(|p| p.contains("An ACL user for distlock needs"))
        .expect("docs/keys-and-acls.md has its ACL paragraph");
    let mut commands: Vec<String> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.chars().all(|c| c.is_ascii_uppercase() || c == ' '))
        .map(str::to_owned)
        .collect();
    commands.sort();
    commands.dedup();
    commands
}

/// The rules of an ACL user with the documented commands but those in `without`, on the
/// default key prefix's keys and channels, password `pw`.
pub fn documented_rules(without: &[&str]) -> Vec<String> {
    let mut rules: Vec<String> = ["reset", "on", ">pw", "~distlock:*", "&distlock:*"]
        .map(str::to_owned)
        .to_vec();
    rules.extend(
        readme_acl_commands()
            .iter()
            .filter(|command| !without.contains(&command.as_str()))
            .map(|command| format!("+{}", command.to_ascii_lowercase().replace(' ', "|"))),
    );
    rules
}

/// Every kind — the exclusive lock, write then read, readers then a writer, a semaphore,
/// `lock_all`, a fair lock — held, renewed by the watchdog, waited for by the other client,
/// released and granted to the waiter; an election led, observed and handed over; then
/// `list`, `is_locked` and `force_unlock`. `a` and
/// `b` are two clients as the user under test.
pub async fn every_kind_and_the_operator_tools(a: &Client, b: &Client) {
    // Short enough that the watchdog renews within a few hundred ms.
    let lease = Duration::from_millis(600);
    let wait = Duration::from_secs(10);
    // (what, the holders' requests, the waiter's request, its keys)
    type Requests = Vec<distlock::LockRequest>;
    let cases: Vec<(&str, Requests, distlock::LockRequest, Vec<&str>)> = vec![
        ("lock", vec![a.lock("w")], b.write_lock("w"), vec!["w"]),
        (
            "write then read",
            vec![a.write_lock("wr")],
            b.read_lock("wr"),
            vec!["wr"],
        ),
        (
            "readers then write",
            vec![a.read_lock("rw"), a.read_lock("rw")],
            b.lock("rw"),
            vec!["rw"],
        ),
        (
            "semaphore",
            vec![a.semaphore("s", 2), a.semaphore("s", 2)],
            b.semaphore("s", 2),
            vec!["s"],
        ),
        (
            "lock_all",
            vec![a.lock_all(["m1", "m2"])],
            b.lock_all(["m2", "m1"]),
            vec!["m1", "m2"],
        ),
        (
            "fair",
            vec![a.lock("f").fair()],
            b.lock("f").fair(),
            vec!["f"],
        ),
    ];
    for (what, holders, waiter, keys) in cases {
        let mut held = Vec::new();
        for holder in holders {
            held.push(
                holder
                    .lease(lease)
                    .acquire()
                    .await
                    .unwrap_or_else(|err| panic!("{what}: acquire: {err}")),
            );
        }
        renewed(a, &keys).await;
        let waiting = tokio::spawn(waiter.lease(lease).wait(wait).acquire());
        someone_waits(a, &keys).await;
        let listed = a.list("*", 100).await.expect("list");
        for key in &keys {
            assert!(listed.iter().any(|k| k == key), "{what}: {listed:?}");
        }
        for guard in held {
            assert!(
                guard.release().await.expect("release"),
                "{what}: still ours"
            );
        }
        let granted = waiting
            .await
            .expect("task")
            .unwrap_or_else(|err| panic!("{what}: the waiter: {err}"));
        renewed(b, &keys).await;
        assert!(
            granted.release().await.expect("release"),
            "{what}: still ours"
        );
        for key in &keys {
            assert!(
                !a.is_locked(*key).await.expect("is_locked"),
                "{what}: {key}"
            );
        }
    }
    // An election: a leader's record written, read and withdrawn, an observer woken.
    let leading = a
        .election("leader")
        .lease(lease)
        .value("a")
        .campaign()
        .await
        .expect("campaign");
    renewed(a, &["leader"]).await;
    let mut changes = b.election("leader").observe();
    let seen = changes.next().await.expect("the leader");
    assert_eq!(seen.epoch(), leading.epoch());
    assert_eq!(seen.value(), Some(&b"a"[..]));
    let next = tokio::spawn({
        let b = b.clone();
        async move {
            b.election("leader")
                .lease(lease)
                .wait(wait)
                .campaign()
                .await
        }
    });
    assert!(leading.resign().await.expect("resign"), "still ours");
    let next = next.await.expect("task").expect("the next leader");
    let seen = changes.next().await.expect("the next leader");
    assert_eq!(seen.epoch(), next.epoch());
    assert!(next.resign().await.expect("resign"));
    assert!(b
        .election("leader")
        .leader()
        .await
        .expect("leader")
        .is_none());
    // The operator's tool that breaks a lock.
    let hung = a.read_lock("hung").acquire().await.expect("acquire");
    let forced = b.force_unlock("hung").await.expect("force_unlock");
    assert_eq!(forced.evicted.len(), 1);
    assert!(!b.is_locked("hung").await.expect("is_locked"));
    assert!(!hung.release().await.expect("release"), "evicted");
}

/// Waits until the watchdog has renewed every holder of each of `keys` at least once: a
/// holder's remaining lease only ever shrinks, unless it is renewed.
pub async fn renewed(client: &Client, keys: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut least: std::collections::HashMap<String, (Duration, bool)> = Default::default();
    loop {
        for key in keys {
            let state = client.inspect(*key).await.expect("inspect");
            assert!(!state.holders.is_empty(), "{key} is held: {state:?}");
            for holder in state.holders {
                let remaining = holder.remaining.expect("a lease");
                let (low, grew) = least
                    .entry(format!("{key}/{}", holder.owner))
                    .or_insert((remaining, false));
                *grew |= remaining > *low;
                *low = (*low).min(remaining);
            }
        }
        if least.values().all(|&(_, grew)| grew) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not renewed within 5 s: {least:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a process listens for the release of one of `keys`.
pub async fn someone_waits(client: &Client, keys: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut waiting = 0;
        for key in keys {
            waiting += client
                .inspect(*key)
                .await
                .expect("inspect")
                .waiting_processes;
        }
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no waiter subscribed to {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

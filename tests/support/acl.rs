//! An ACL user with exactly the commands the docs list for its deployment (issue 23, item 6;
//! issue 35, items 4 and 8): the table of `docs/keys-and-acls.md` ("The ACL a user needs"), one
//! column per deployment, and the sentinels' sentence below it; the scenario that runs every
//! lock kind, the operator's tools and `ping` through such a user, and one that freezes a
//! server and thaws it; and what a server's `ACL LOG` holds. `tests/deployments/acl.rs` runs
//! them on a single server, Sentinel, the Cluster and three Redlock masters.

use std::time::{Duration, Instant};

use distlock::Client;

/// The deployments the table of `docs/keys-and-acls.md` has a column for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    Single,
    Sentinel,
    Cluster,
    Redlock,
}

impl Deployment {
    /// The table's header for this deployment's column.
    fn header(self) -> &'static str {
        match self {
            Self::Single => "single server",
            Self::Sentinel => "Sentinel",
            Self::Cluster => "Cluster",
            Self::Redlock => "Redlock",
        }
    }
}

const DOC: &str = include_str!("../../docs/keys-and-acls.md");

/// The backticked spans of `text` that are commands: in capitals, `CLIENT KILL` and the like
/// included.
fn commands_in(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.is_empty()
                && span
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == ' ' || c == '-')
        })
        .map(str::to_owned)
        .collect()
}

/// The cells of a Markdown table row.
fn cells(row: &str) -> Vec<&str> {
    row.trim()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

/// A row of the ACL table: its commands, and its cells (the first one holds the commands).
#[derive(Debug)]
struct Row {
    commands: Vec<String>,
    cells: Vec<&'static str>,
}

/// The ACL table of `docs/keys-and-acls.md`: its header's cells, and its rows.
fn table() -> (Vec<&'static str>, Vec<Row>) {
    let section = DOC
        .split("## The ACL a user needs")
        .nth(1)
        .expect("docs/keys-and-acls.md has the section \"The ACL a user needs\"");
    let mut lines = section
        .lines()
        .skip_while(|line| !line.starts_with("| commands"))
        .take_while(|line| line.starts_with('|'));
    let header = cells(lines.next().expect("the ACL table"));
    let rows: Vec<Row> = lines
        .skip(1) // |---|
        .map(|line| {
            let cells = cells(line);
            Row {
                commands: commands_in(cells[0]),
                cells,
            }
        })
        .collect();
    assert!(rows.len() > 10, "the ACL table has its rows: {rows:?}");
    (header, rows)
}

/// The commands the ACL table of `docs/keys-and-acls.md` lists for `deployment`: every row
/// whose cell in its column is not "—" (needed, optional, or with the failover guard).
pub fn documented_commands(deployment: Deployment) -> Vec<String> {
    let (header, rows) = table();
    let column = header
        .iter()
        .position(|cell| *cell == deployment.header())
        .unwrap_or_else(|| panic!("the ACL table has a column {:?}", deployment.header()));
    let mut commands: Vec<String> = rows
        .into_iter()
        .filter(|row| row.cells.get(column).is_some_and(|cell| *cell != "—"))
        .flat_map(|row| row.commands)
        .collect();
    commands.sort();
    commands.dedup();
    commands
}

/// The ACL rules of `commands`: `+get`, `+client|kill`, `+sentinel|get-master-addr-by-name`.
fn allow(commands: &[String]) -> impl Iterator<Item = String> + '_ {
    commands
        .iter()
        .map(|command| format!("+{}", command.to_ascii_lowercase().replace(' ', "|")))
}

/// The rules of an ACL user with the commands documented for `deployment` but those in
/// `without`, on the default key prefix's keys and channels, password `pw`.
pub fn documented_rules(deployment: Deployment, without: &[&str]) -> Vec<String> {
    let commands: Vec<String> = documented_commands(deployment)
        .into_iter()
        .filter(|command| !without.contains(&command.as_str()))
        .collect();
    let mut rules: Vec<String> = ["reset", "on", ">pw", "~distlock:*", "&distlock:*"]
        .map(str::to_owned)
        .to_vec();
    rules.extend(allow(&commands));
    rules
}

/// The rules of the same user on the sentinels: the commands of the sentence "On the
/// sentinels, …" below the table, password `pw`.
pub fn documented_sentinel_rules() -> Vec<String> {
    let sentence = DOC
        .split("\n\n")
        .find(|p| p.starts_with("On the sentinels"))
        .expect("docs/keys-and-acls.md says what the sentinels' user needs");
    let commands = commands_in(sentence);
    assert!(!commands.is_empty(), "{sentence}");
    let mut rules: Vec<String> = ["reset", "on", ">pw"].map(str::to_owned).to_vec();
    rules.extend(allow(&commands));
    rules
}

/// What `connection`'s server's ACL refused since its last `ACL LOG RESET`, one line per
/// entry: who, what and why, and how often (Redis folds repeats into one entry's `count`).
pub fn acl_log(connection: &mut redis::Connection) -> Vec<String> {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query(connection)
        .expect("ACL LOG");
    let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| {
        entry
            .get(field)
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .unwrap_or_default()
    };
    entries
        .iter()
        .map(|entry| {
            format!(
                "{} refused {} {:?} ({}) × {}",
                text(entry, "username"),
                text(entry, "reason"),
                text(entry, "object"),
                text(entry, "context"),
                text(entry, "count"),
            )
        })
        .collect()
}

/// How many refusals `connection`'s server's `ACL LOG` holds for `object` (a command, lower
/// case), repeats counted.
pub fn refusals_of(connection: &mut redis::Connection, object: &str) -> u64 {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query(connection)
        .expect("ACL LOG");
    entries
        .iter()
        .filter(|entry| {
            entry
                .get("object")
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .is_some_and(|o| o == object)
        })
        .map(|entry| {
            entry
                .get("count")
                .and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
                .unwrap_or(1)
        })
        .sum()
}

/// Makes `name` the user with `rules` on the server of `connection`, and empties its ACL log.
pub fn set_user(connection: &mut redis::Connection, name: &str, rules: &[String]) {
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg(rules)
        .query(connection)
        .unwrap_or_else(|err| panic!("ACL SETUSER {name} {rules:?}: {err}"));
    let () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query(connection)
        .expect("ACL LOG RESET");
}

/// Every kind — the exclusive lock, write then read, readers then a writer, a semaphore,
/// `lock_all`, a fair lock — held, renewed by the watchdog, waited for by the other client,
/// released and granted to the waiter; `try_acquire` refused and granted; a lock held at least
/// a while, released early and taken again once the while is over; an election led, observed
/// and handed over; then `list`, `inspect`, `is_locked`, `force_unlock` and `ping`. `a` and
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
    // `try_acquire`: refused while held (no error), granted once free.
    let held = a.lock("try").acquire().await.expect("acquire");
    let refused = b.lock("try").try_acquire().await.expect("try_acquire");
    assert!(refused.is_none(), "held by a");
    assert!(held.release().await.expect("release"));
    let granted = b.lock("try").try_acquire().await.expect("try_acquire");
    let granted = granted.expect("free");
    assert!(granted.release().await.expect("release"));
    // `hold_at_least`: a release within the window leaves the lock held until its end.
    let window = Duration::from_millis(300);
    let early = a
        .lock("at-least")
        .hold_at_least(window)
        .acquire()
        .await
        .expect("acquire");
    assert!(early.release().await.expect("release"));
    let after = b
        .lock("at-least")
        .wait(wait)
        .acquire()
        .await
        .expect("taken once the window is over");
    assert!(after.release().await.expect("release"));
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
    a.ping().await.expect("ping");
    b.ping().await.expect("ping");
}

/// A server of `a`'s deployment frozen by `freeze` (SIGSTOP) for `frozen_for` — past the
/// client's response or node timeout — while `a` holds a lock whose watchdog renews it, tries
/// to take another and pings; then thawed by `thaw` (SIGCONT). The lock tried is granted
/// (within its wait, which allows for a Sentinel failover), and `a` pings and locks again.
pub async fn through_a_frozen_server(
    a: &Client,
    frozen_for: Duration,
    freeze: impl FnOnce(),
    thaw: impl FnOnce(),
) {
    let settle = Duration::from_secs(60);
    let held = a
        .lock("held-while-frozen")
        .lease(Duration::from_millis(900))
        .acquire()
        .await
        .expect("acquire");
    freeze();
    let tried = tokio::spawn(a.lock("tried-while-frozen").wait(settle).acquire());
    let pinged = tokio::spawn({
        let a = a.clone();
        async move { a.ping().await }
    });
    // The freeze itself: nothing to await but time.
    tokio::time::sleep(frozen_for).await;
    thaw();
    let _ = pinged.await.expect("task");
    let tried = tried.await.expect("task").expect("granted after the thaw");
    assert!(tried.release().await.expect("release"));
    // Lost or not (its renewals went unanswered), it is given back.
    let _ = held.release().await;
    let deadline = Instant::now() + settle;
    while let Err(err) = a.ping().await {
        assert!(Instant::now() < deadline, "no answer since the thaw: {err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = a
        .lock("after-the-thaw")
        .wait(settle)
        .acquire()
        .await
        .expect("acquire");
    assert!(again.release().await.expect("release"));
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

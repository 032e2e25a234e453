//! `mode = "read" | "write" | "exclusive"` of `#[distributed_lock]` end to end on the global
//! client against a real `redis-server`: readers share through the attribute, a read inside a
//! write joins it (downgrade), a read inside a read joins it, and a write inside a read fails at
//! once with `UpgradeRefused` (never a deadlock).

use std::time::Duration;

use crate::init_once;
use distlock::{distributed_lock, LockError, LockMode};
use tokio::sync::Barrier;
use tokio::time::Instant;

fn held() -> distlock::LockInfo {
    distlock::current().expect("inside an annotated fn")
}

#[distributed_lock(key = "doc:{id}", mode = "read", wait = "10s")]
async fn view(id: u32) -> Result<distlock::LockInfo, LockError> {
    Ok(held())
}

#[distributed_lock(key = "doc:{id}", mode = "read", wait = "10s")]
async fn view_twice(id: u32) -> Result<(distlock::LockInfo, distlock::LockInfo, i64), LockError> {
    let outer = held();
    let inner = view(id).await?;
    Ok((outer, inner, init_once().readers(&format!("doc:{id}"))))
}

#[distributed_lock(key = "doc:{id}", mode = "write", wait = "10s")]
async fn edit(id: u32) -> Result<distlock::LockInfo, LockError> {
    Ok(held())
}

#[distributed_lock(key = "doc:{id}", mode = "write")]
async fn edit_then_view(id: u32) -> Result<(distlock::LockInfo, distlock::LockInfo), LockError> {
    let outer = held();
    let inner = view(id).await?;
    Ok((outer, inner))
}

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn view_then_edit(id: u32) -> Result<distlock::LockInfo, LockError> {
    edit(id).await
}

#[distributed_lock(key = "doc:{id}", mode = "exclusive", wait = "0s")]
async fn exclusive(id: u32) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "doc:{id}", mode = "read")]
async fn meet_another_reader(id: u32, barrier: &Barrier) -> Result<(), LockError> {
    // Both readers must be inside at once to pass the barrier.
    tokio::time::timeout(Duration::from_secs(5), barrier.wait())
        .await
        .map_err(|_| LockError::Config("the readers did not share the lock".into()))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_the_lock_through_the_attribute() {
    init_once();
    let barrier = Barrier::new(2);
    let (a, b) = tokio::join!(
        meet_another_reader(1, &barrier),
        meet_another_reader(1, &barrier)
    );
    a.expect("first reader");
    b.expect("second reader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_inside_a_write_joins_it() {
    init_once();
    let (outer, inner) = edit_then_view(2).await.expect("downgrade joins");
    assert_eq!(outer.mode(), LockMode::Write);
    assert_eq!(
        inner.mode(),
        LockMode::Write,
        "the joined read runs under the write grant"
    );
    assert_eq!(
        inner.fencing_token().expect("fenced"),
        outer.fencing_token().expect("fenced")
    );
    assert_eq!(init_once().readers("doc:2"), 0, "no reader entry was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_inside_a_read_joins_it() {
    init_once();
    let (outer, inner, entries) = view_twice(3).await.expect("read in read joins");
    assert_eq!(outer.mode(), LockMode::Read);
    assert_eq!(inner.mode(), LockMode::Read);
    assert_eq!(
        inner.fencing_token().expect("fenced"),
        outer.fencing_token().expect("fenced")
    );
    assert_eq!(
        entries, 1,
        "the inner read joined instead of taking a second entry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_inside_a_read_fails_at_once_naming_the_upgrade() {
    init_once();
    let started = Instant::now();
    let err = view_then_edit(4).await.expect_err("an upgrade is refused");
    // `edit` waits up to 10 s: an upgrade that waited would have deadlocked until then.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the upgrade waited {:?}",
        started.elapsed()
    );
    match &err {
        LockError::UpgradeRefused { key } => assert_eq!(key, "doc:4"),
        other => panic!("expected UpgradeRefused, got {other:?}"),
    }
    assert!(err.to_string().contains("cannot be upgraded"), "{err}");
    // The outer read was released: a writer gets in at once.
    edit(4).await.expect("free after the refused upgrade");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_and_write_modes_are_the_same_lock() {
    init_once();
    let guard = distlock::write_lock("doc:5")
        .acquire()
        .await
        .expect("write");
    let refused = exclusive(5).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    let reader = distlock::read_lock("doc:5")
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(reader, Err(LockError::Timeout { .. })),
        "{reader:?}"
    );
    guard.release().await.expect("release");
    exclusive(5).await.expect("free again");
    let token = view(5)
        .await
        .expect("read")
        .fencing_token()
        .expect("fenced");
    assert!(
        token.get() > 0,
        "a read carries a token (at least the latest write token), not none"
    );
}

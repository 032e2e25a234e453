//! Run-once jobs on every store (issue 27): `try_acquire` answers `None` for a lock held
//! elsewhere — no error, nothing waited — and a grant taken with `hold_at_least` and given back
//! at once stays held, unrenewed, to the end of its window (the release shortens the lease
//! instead of deleting the key), then comes free. Shown to fail with the release deleting as
//! usual (`Lease::holding_now` returning the grant): the lock came free at once.

use std::time::Duration;

use crate::support::stores::Harness;
use tokio::time::Instant;

mod every_store {
    use super::*;

    crate::support::stores::on_every_store!(
        a_busy_lock_is_none_without_an_error_or_a_wait,
        an_early_release_keeps_the_lock_to_the_end_of_hold_at_least,
    );
}

async fn a_busy_lock_is_none_without_an_error_or_a_wait(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let held = a
        .lock("job")
        .try_acquire()
        .await
        .expect("no failure")
        .expect("free");
    let started = Instant::now();
    let busy = b
        .lock("job")
        .wait(Duration::from_secs(30))
        .try_acquire()
        .await
        .expect("busy is no error");
    assert!(busy.is_none(), "held by the other client");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "one try, whatever the request's wait: {:?}",
        started.elapsed()
    );
    assert!(held.release().await.expect("release"));
    let after = b.lock("job").try_acquire().await.expect("no failure");
    assert!(after.is_some(), "free once released");
}

async fn an_early_release_keeps_the_lock_to_the_end_of_hold_at_least(h: Harness) {
    let (a, b) = (h.client(), h.client());
    let window = Duration::from_millis(600);
    let sent = Instant::now();
    let guard = a
        .lock("nightly")
        .hold_at_least(window)
        .try_acquire()
        .await
        .expect("no failure")
        .expect("free");
    assert!(guard.release().await.expect("release"), "it was ours");
    let mut free_after = None;
    while sent.elapsed() < window + Duration::from_secs(5) {
        if let Some(next) = b.lock("nightly").try_acquire().await.expect("no failure") {
            free_after = Some(sent.elapsed());
            assert!(next.release().await.expect("release"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let free_after = free_after.expect("free once the window ended");
    assert!(
        free_after >= window - Duration::from_millis(30),
        "free {free_after:?} after the grant, within its {window:?} window"
    );
}

// Generated code must name only `::distlock::__private`, `::core` and `::std`: shadowing common
// names and a local `distlock` module changes nothing.
#![allow(dead_code, unused_imports)]

mod distlock {}
struct Result;
struct Ok;
struct Err;
struct Option;
struct Box;
struct Some;
struct None;
struct Duration;

#[::distlock::distributed_lock(key = "hygiene:{id}", lease = "1s", wait = "0s")]
async fn shadowed(id: u64) -> ::core::result::Result<u64, ::distlock::LockError> {
    let __distlock_key = "a user binding with the internal name";
    ::core::result::Result::Ok(id)
}

const LEASE: ::core::time::Duration = ::core::time::Duration::from_secs(1);

#[::distlock::distributed_lock(key = "hygiene:{id}", lease = LEASE, max_hold = LEASE, client = locks)]
async fn shadowed_with_expressions(
    id: u64,
    locks: &::distlock::Client,
) -> ::core::result::Result<u64, ::distlock::LockError> {
    let __distlock_client = "a user binding with the internal name";
    let __distlock_lease = "another";
    ::core::result::Result::Ok(id)
}

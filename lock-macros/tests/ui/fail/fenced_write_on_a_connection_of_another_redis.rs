// A connection that is not one of the `redis` 1.x crate distlock uses — as one of `redis` 0.27
// is not — is refused with a message that says which `redis` to depend on.
struct OtherRedisConnection;

async fn sell(token: distlock::FencingToken) {
    let mut connection = OtherRedisConnection;
    let _ = distlock::fenced::set(&mut connection, "stock", 41, token).await;
}

fn main() {
    drop(sell);
}

#[distlock::distributed_lock(key = "k")]
async fn nothing() {}

fn main() {}

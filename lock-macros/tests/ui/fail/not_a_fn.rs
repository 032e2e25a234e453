#[distlock::distributed_lock(key = "k")]
struct NotAFn;

fn main() {}

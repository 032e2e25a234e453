fn locks() -> &'static distlock::Client {
    unimplemented!()
}

#[distlock::distributed_lock(key = "k", client = locks(), client = locks())]
async fn twice() -> Result<(), distlock::LockError> {
    Ok(())
}

fn main() {}

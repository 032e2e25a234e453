// Every mode on free fns and methods; `exclusive` and `write` are the same lock.
#![allow(dead_code)]

struct Catalog;

impl Catalog {
    #[distlock::distributed_lock(key = "catalog:{shop}", mode = "read")]
    async fn show(&self, shop: u32) -> Result<u32, distlock::LockError> {
        Ok(shop)
    }

    #[distlock::distributed_lock(key = "catalog:{shop}", mode = "write", lease = "5s")]
    async fn update(&mut self, shop: u32) -> Result<(), distlock::LockError> {
        Ok(())
    }
}

#[distlock::distributed_lock(key = "doc:{id}", mode = "read", wait = "0s")]
async fn read(id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

#[distlock::distributed_lock(key = "doc:{id}", mode = "exclusive")]
async fn exclusive(id: u64) -> Result<(), distlock::LockError> {
    Ok(())
}

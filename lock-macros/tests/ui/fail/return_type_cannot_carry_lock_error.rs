#[derive(Debug)]
enum AppError {
    NotFound,
}

#[distlock::distributed_lock(key = "k")]
async fn strings() -> Result<(), String> {
    Ok(())
}

#[distlock::distributed_lock(key = "k")]
async fn custom_enum() -> Result<(), AppError> {
    Err(AppError::NotFound)
}

#[distlock::distributed_lock(key = "k")]
async fn number() -> u32 {
    1
}

fn main() {}

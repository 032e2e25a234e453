use std::time::{Duration, Instant};
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args().nth(1).unwrap();
    let config = distlock::Config::etcd([endpoint])?.key_prefix("smoke:");
    let a = distlock::Client::new(config.clone())?;
    let t = Instant::now();
    for _ in 0..200 {
        let g = a.lock("k").lease(Duration::from_secs(3)).acquire().await?;
        g.release().await?;
    }
    println!("200 cycles {:?}", t.elapsed());
    Ok(())
}

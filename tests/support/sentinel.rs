//! A Sentinel deployment for tests: a primary, two replicas and three sentinels on free
//! loopback ports, all ordinary [`RedisServer`]s under the watcher of `mod.rs` (a sentinel is
//! `redis-server sentinel.conf --sentinel` with its own writable config file in a scratch
//! directory). It is ready once every sentinel names the primary and knows both replicas and
//! the other two sentinels, since failovers need all of that; a test can then SIGKILL the
//! primary and wait for the sentinels to promote a replica. Readiness is polled: sentinels
//! offer no event a test could wait on.

use std::path::PathBuf;
use std::time::Duration;

use super::{
    free_port, info_field, query_port, require_redis_server, role_of, scratch_dir, server_args,
    wait_until, RedisServer, Role,
};

const SENTINEL_HINT: &str = "a Redis sentinel could not be started with `redis-server \
    sentinel.conf --sentinel`. Install it: `sudo apt-get install -y redis-sentinel` \
    (Debian/Ubuntu) or `brew install redis` (macOS).";

/// How long readiness or a failover may take before a test gives up. A failover takes a few
/// seconds (down-after 1 s, then election and promotion); a failed election is retried after
/// twice the failover timeout.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A primary with two replicas watched by three sentinels (quorum 2, down after 1 s, failover
/// timeout 3 s). Everything is stopped and the config files removed on drop.
pub struct SentinelSetup {
    master_name: String,
    dir: PathBuf,
    /// The data servers; the first one started as the primary.
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// The server [`kill_primary`](Self::kill_primary) stopped.
    killed: Option<usize>,
}

impl SentinelSetup {
    /// Starts the primary, its two replicas and three sentinels monitoring it as
    /// `master_name`, and waits until the sentinels could carry out a failover.
    pub fn start(master_name: &str) -> Self {
        require_redis_server();
        let dir = scratch_dir("sentinel");
        let primary = RedisServer::start();
        let primary_port = primary.port();
        let mut servers = vec![primary];
        for _ in 0..2 {
            servers.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &primary_port.to_string(),
            ]));
        }
        let replica_ports: Vec<u16> = servers[1..].iter().map(RedisServer::port).collect();
        let sentinels = start_sentinels(&dir, master_name, primary_port, &replica_ports);
        let setup = Self {
            master_name: master_name.to_string(),
            dir,
            servers,
            sentinels,
            killed: None,
        };
        setup.wait_ready();
        setup
    }

    /// The name the sentinels know the primary by.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// `redis://127.0.0.1:PORT` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The sentinels themselves, e.g. to stop one.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The ports of the data servers (primary and replicas), killed ones included.
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// The data server on `port`, for inspection ([`RedisServer::connection`]) or faults.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a data server of this setup"))
    }

    /// The primary's port as the first answering sentinel reports it.
    pub fn current_primary_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|sentinel| self.primary_seen_by(sentinel).ok())
            .expect("no sentinel names a primary")
    }

    /// `redis://127.0.0.1:PORT` of the current primary.
    pub fn primary_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.current_primary_port())
    }

    /// SIGKILLs the current primary and returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.current_primary_port();
        let index = self.index_of_port(port);
        self.servers[index].stop();
        self.killed = Some(index);
        port
    }

    /// Waits until every sentinel names a primary other than `old_port`, that server says
    /// `ROLE` master and every other running data server replicates it in sync. Returns the
    /// new primary's port.
    pub fn wait_for_failover(&self, old_port: u16) -> u16 {
        wait_until(
            &format!("the sentinels to replace the primary on port {old_port}"),
            SETTLE_TIMEOUT,
            || {
                let new_port = self.agreed_primary()?;
                if new_port == old_port {
                    return Err(format!("the sentinels still name port {old_port}"));
                }
                if role_of(new_port) != Some(Role::Primary) {
                    return Err(format!("port {new_port} is not a primary yet"));
                }
                self.replicas_in_sync(new_port)?;
                Ok(new_port)
            },
        )
    }

    /// Brings the server [`kill_primary`](Self::kill_primary) stopped back on its port, empty,
    /// as a replica of the current primary, and waits until it is in sync.
    pub fn restart_killed(&mut self) {
        let index = self.killed.take().expect("no server was killed");
        let primary = self.current_primary_port().to_string();
        let port = self.servers[index].port();
        self.servers[index]
            .restart_with_args(server_args(port, &["--replicaof", "127.0.0.1", &primary]));
        wait_until(
            &format!("port {port} to replicate port {primary}"),
            SETTLE_TIMEOUT,
            || self.replicas_in_sync(self.current_primary_port()),
        );
    }

    fn wait_ready(&self) {
        let primary = self.servers[0].port();
        wait_until("the sentinels to be ready", SETTLE_TIMEOUT, || {
            self.replicas_in_sync(primary)?;
            for sentinel in &self.sentinels {
                let port = self.primary_seen_by(sentinel)?;
                if port != primary {
                    return Err(format!("sentinel {} names port {port}", sentinel.port()));
                }
                for (what, expected) in [("replicas", 2), ("sentinels", 2)] {
                    let known: Vec<redis::Value> = query_port(
                        sentinel.port(),
                        redis::cmd("SENTINEL").arg(what).arg(&self.master_name),
                    )?;
                    if known.len() != expected {
                        return Err(format!(
                            "sentinel {} knows {} {what}",
                            sentinel.port(),
                            known.len()
                        ));
                    }
                }
            }
            Ok(())
        });
    }

    /// The primary every running sentinel names, if they agree.
    fn agreed_primary(&self) -> Result<u16, String> {
        let mut seen = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            seen.push(self.primary_seen_by(sentinel)?);
        }
        seen.dedup();
        match seen.as_slice() {
            [port] => Ok(*port),
            _ => Err(format!("the sentinels name {seen:?}")),
        }
    }

    fn primary_seen_by(&self, sentinel: &RedisServer) -> Result<u16, String> {
        let address: Vec<String> = query_port(
            sentinel.port(),
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master_name),
        )?;
        address
            .get(1)
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| format!("sentinel {} answered {address:?}", sentinel.port()))
    }

    /// Ok when every running data server but `primary` replicates it with the link up.
    fn replicas_in_sync(&self, primary: u16) -> Result<(), String> {
        for server in self.servers.iter().filter(|s| s.is_running()) {
            if server.port() == primary {
                continue;
            }
            if server.role()
                != Some(Role::Replica {
                    primary_port: primary,
                })
            {
                return Err(format!(
                    "port {} does not follow port {primary}",
                    server.port()
                ));
            }
            let info: String = query_port(server.port(), redis::cmd("INFO").arg("replication"))?;
            if info_field(&info, "master_link_status") != Some("up") {
                return Err(format!("port {} is not in sync yet", server.port()));
            }
        }
        Ok(())
    }

    fn index_of_port(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|server| server.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a data server of this setup"))
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        // Sentinels first, so none reacts to the servers going away.
        for process in self.sentinels.iter_mut().chain(&mut self.servers) {
            process.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts three sentinels on free ports, each with its own config file (a sentinel rewrites
/// it). Each file already names the replicas and the other sentinels with their ids, as a
/// sentinel's own rewrite would: otherwise they find each other only through hello messages
/// every 2 s.
fn start_sentinels(
    dir: &std::path::Path,
    master_name: &str,
    primary_port: u16,
    replica_ports: &[u16],
) -> Vec<RedisServer> {
    let mut last_error = String::new();
    for _ in 0..5 {
        let mut ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        ports.dedup();
        if ports.len() < 3 {
            continue;
        }
        let ids: Vec<String> = ports
            .iter()
            .map(|_| format!("{:08x}{:032x}", fastrand::u32(..), fastrand::u128(..)))
            .collect();
        let mut sentinels = Vec::new();
        for (index, &port) in ports.iter().enumerate() {
            let mut text = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 dir {dir}\n\
                 sentinel myid {id}\n\
                 sentinel monitor {master_name} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 3000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir = dir.display(),
                id = ids[index],
            );
            for replica in replica_ports {
                text += &format!("sentinel known-replica {master_name} 127.0.0.1 {replica}\n");
            }
            for (other, other_port) in ports.iter().enumerate().filter(|&(o, _)| o != index) {
                text += &format!(
                    "sentinel known-sentinel {master_name} 127.0.0.1 {other_port} {}\n",
                    ids[other]
                );
            }
            let config = dir.join(format!("sentinel-{index}.conf"));
            std::fs::write(&config, text).expect("write a sentinel config file");
            let args = vec![config.to_string_lossy().into_owned(), "--sentinel".into()];
            match RedisServer::launch(port, args) {
                Ok(sentinel) => sentinels.push(sentinel),
                Err(err) => {
                    last_error = err;
                    break;
                }
            }
        }
        if sentinels.len() == 3 {
            return sentinels;
        }
        // A port was taken meanwhile; the files name all three, so start all three afresh.
    }
    panic!("{SENTINEL_HINT}\nLast error: {last_error}");
}

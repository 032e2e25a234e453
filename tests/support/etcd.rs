//! Real etcd members for tests, for the etcd store (issue 39): [`EtcdServer`] is one member
//! with its client and peer URLs on free loopback ports (never etcd's 2379 and 2380) and its
//! data in a [`memory_scratch_dir`](super::memory_scratch_dir) (`/dev/shm`: its `fsync`s cost nothing); [`EtcdCluster`] is three of them that elect a leader among
//! themselves. Each member runs under the shell watcher of [`process`](super::process), which
//! kills it when the test process goes away, and is ready at its own "serving client traffic"
//! log line, which etcd writes once the member has joined its cluster and a leader exists. The
//! faults a store test needs are here: a clean stop, a SIGKILL, a restart on the same data and
//! ports (after a SIGKILL that is a crash recovery), a frozen member (SIGSTOP) and a thawed
//! one, and a leader to find or wait for. [`EtcdServer::enable_auth`] sets up the
//! least-privilege user a store runs as; [`EtcdServer::start_tls`] a member that serves its
//! clients over TLS (client certificates required, or not). [`shared_etcd`] lets one test binary start a single
//! member. Clients are `etcd-client`'s, made on the caller's runtime.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Permission};
use futures_util::future::join_all;

use super::process::{
    find_on_path, signal, stop_all, watcher_command, Launching, StartError, Watched,
};
use super::tls::Certificates;
use super::{free_port, memory_scratch_dir};

const INSTALL_HINT: &str = "etcd was not found on PATH. The tests start their own etcd \
    members and need it installed: `sudo apt-get install -y etcd-server` (Debian/Ubuntu) or \
    `brew install etcd` (macOS).";

/// etcd's default client and peer ports: a member a developer runs there is never a test's.
pub const DEFAULT_PORTS: [u16; 2] = [2379, 2380];

/// How many members an [`EtcdCluster`] has.
pub const CLUSTER_SIZE: usize = 3;

/// The user [`EtcdServer::enable_auth`] makes with every right; a server's own
/// [`client`](EtcdServer::client) is this user's from then on.
pub const ROOT_USER: &str = "root";

/// The user [`EtcdServer::enable_auth`] makes with read and write rights on one prefix.
pub const LIMITED_USER: &str = "distlock";

/// The role that holds [`LIMITED_USER`]'s rights.
const LIMITED_ROLE: &str = "distlock";

/// How long a member may take to be ready (a crash recovery after a SIGKILL included; a
/// cluster's members also wait for each other and an election) or to stop, on a loaded
/// machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`EtcdCluster::leader`] waits for a leader (an election takes one to two election
/// timeouts, 1 to 2 s by default, once the members notice the leader is gone).
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(15);

/// What a member logs once it serves its clients: after it has joined its cluster through a
/// leader, at a start and a restart alike.
const READY: &str = "serving client traffic";

/// How long a new client may take to connect (and to log in, with auth on).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one member may take to answer a status request while a leader is looked for: one
/// that does not (frozen) counts as not answering.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a leader is looked for.
const LEADER_POLL: Duration = Duration::from_millis(50);

/// One member for a whole test binary, started on first use. It dies with the test process
/// (the watcher); its directory is swept by the next run's [`memory_scratch_dir`](super::memory_scratch_dir). It cannot be
/// stopped, killed or restarted (those need `&mut`), and no test should freeze it or turn auth
/// on: a test that needs a fault or auth starts its own. Tests share its keyspace, so each
/// keeps to keys of its own.
pub fn shared_etcd() -> &'static EtcdServer {
    static SHARED: OnceLock<EtcdServer> = OnceLock::new();
    SHARED.get_or_init(EtcdServer::start)
}

/// A running etcd member on `127.0.0.1`: alone in its cluster ([`start`](Self::start)), or
/// one of an [`EtcdCluster`]'s. Without [`enable_auth`](Self::enable_auth) anyone may do
/// anything. Drop kills it (SIGKILL) and removes its data.
pub struct EtcdServer {
    /// `member-N`, its name in its cluster.
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The scratch directory: the member's `data/`.
    dir: PathBuf,
    /// The whole `etcd` command line after the program name, kept for `restart`.
    args: Vec<String>,
    /// The root password once auth is on, shared by a cluster's members.
    root_password: Arc<Mutex<Option<String>>>,
    process: Option<Watched>,
    /// `https` for a member started by [`start_tls`](Self::start_tls), else `http`.
    client_scheme: &'static str,
}

impl EtcdServer {
    /// Starts a one-member cluster on free loopback ports, with etcd's defaults (heartbeat
    /// 100 ms, election timeout 1000 ms: a lease's minimum TTL is then 2 s), and waits until it
    /// serves clients.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start), with `flags` (name, value: `("--election-timeout", "500")`,
    /// passed as `--flag=value`, so booleans work too) after the support's own, so that they
    /// override them.
    pub fn start_with(flags: &[(&str, &str)]) -> Self {
        Self::start_single(flags, None)
    }

    /// A one-member cluster that serves its clients over TLS alone, with `certificates`'
    /// server certificate (for `localhost` and `127.0.0.1`): its [`endpoint`](Self::endpoint)
    /// is `https://127.0.0.1:PORT`. With `client_cert_auth`, it takes only clients that show
    /// a certificate `certificates`' CA signed (`--client-cert-auth`, `--trusted-ca-file`).
    /// Its peers' URL stays plain. The support's own clients speak plaintext: this member's
    /// [`client`](Self::client) cannot reach it.
    pub fn start_tls(certificates: &Certificates, client_cert_auth: bool) -> Self {
        Self::start_single(&[], Some((certificates, client_cert_auth)))
    }

    /// A one-member cluster with `flags`, over TLS with `tls` (certificates, client
    /// certificates required) if given.
    fn start_single(flags: &[(&str, &str)], tls: Option<(&Certificates, bool)>) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let name = member_name(0);
            let (client_port, peer_port) = (free_etcd_port(), free_etcd_port());
            let initial_cluster = format!("{name}={}", url(peer_port));
            let mut server = Self::configure(
                name,
                (client_port, peer_port),
                &initial_cluster,
                &new_token(),
                flags,
                Arc::default(),
            );
            if let Some((certificates, client_cert_auth)) = tls {
                server.serve_tls(certificates, client_cert_auth);
            }
            match server
                .launch()
                .and_then(|member| member.wait_ready(READY, START_TIMEOUT))
            {
                Ok(process) => {
                    server.process = Some(process);
                    return server;
                }
                // Most likely a port was taken in the meantime: other ones.
                Err(StartError::Exited(why)) => last_error = why,
                Err(StartError::NotReady(why)) => panic!("{why}"),
            }
        }
        panic!("could not start etcd on free ports after 5 tries: {last_error}");
    }

    /// `http://127.0.0.1:PORT` (`https://` for [`start_tls`](Self::start_tls)), the
    /// member's client URL.
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.client_scheme, self.client_port)
    }

    /// The port of [`endpoint`](Self::endpoint).
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// `http://127.0.0.1:PORT`, the URL the cluster's members reach this one at.
    pub fn peer_url(&self) -> String {
        url(self.peer_port)
    }

    /// The member's data directory (removed on drop).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Its name in its cluster, `member-N`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member's pid. Panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.running().pid()
    }

    /// Whether the member runs (it may be frozen): not stopped or killed.
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Stops the member cleanly (SIGTERM: a leader hands its leadership over first) and
    /// waits until it has exited. A stopped member is left as it is.
    pub fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            if let Err(err) = process.shut_down("TERM", START_TIMEOUT) {
                panic!("{}: {err}", self.what());
            }
        }
    }

    /// An unclean crash: SIGKILL, waiting until the member is gone. [`restart`](Self::restart)
    /// then recovers what it had written (etcd syncs its log before it answers a write).
    pub fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            if let Err(err) = process.kill(START_TIMEOUT) {
                panic!("{}: {err}", self.what());
            }
        }
    }

    /// Starts the member again on the same data directory and ports, and waits until it
    /// serves clients: in a cluster, once it has rejoined through a leader. A running member
    /// is [`stop`](Self::stop)ped first.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        // The ports were ours a moment ago; give a racing process a few tries' worth of time.
        for _ in 0..20 {
            match self
                .launch()
                .and_then(|member| member.wait_ready(READY, START_TIMEOUT))
            {
                Ok(process) => {
                    self.process = Some(process);
                    return;
                }
                Err(StartError::Exited(why)) => last_error = why,
                Err(StartError::NotReady(why)) => panic!("{why}"),
            }
        }
        panic!("could not restart {}: {last_error}", self.what());
    }

    /// Freezes the member (SIGSTOP) and returns once it is stopped. The kernel still accepts
    /// connections, which wait in the listen queue; requests go unanswered, its peers hear
    /// nothing from it.
    pub fn freeze(&self) {
        stop_all(self.pid()).unwrap_or_else(|err| panic!("freeze {}: {err}", self.what()));
    }

    /// Thaws a frozen member (SIGCONT).
    pub fn thaw(&self) {
        signal("CONT", &[self.pid()]).unwrap_or_else(|err| panic!("thaw {}: {err}", self.what()));
    }

    /// A client of this member alone, on the current runtime; [`ROOT_USER`]'s once
    /// [`enable_auth`](Self::enable_auth) has run. Connecting sends nothing without auth: a
    /// frozen or stopped member fails the first request, not this.
    pub async fn client(&self) -> Client {
        connect(&[self.endpoint()], root_user(&self.root_password))
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// How many unary gRPC calls of `method` (`Txn`, `LeaseGrant`, …) this member has
    /// handled since it started, whatever their outcome: its `grpc_server_handled_total`,
    /// read from `/metrics` on its client port. Panics if the member does not answer within
    /// 10 s.
    pub async fn grpc_calls(&self, method: &str) -> u64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = self.port();
        let reading = async move {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut text = String::new();
            stream.read_to_string(&mut text).await?;
            Ok::<_, std::io::Error>(text)
        };
        let text = tokio::time::timeout(Duration::from_secs(10), reading)
            .await
            .unwrap_or_else(|_| panic!("etcd's /metrics on port {port}: no answer in 10 s"))
            .unwrap_or_else(|err| panic!("etcd's /metrics on port {port}: {err}"));
        let method = format!("grpc_method=\"{method}\"");
        text.lines()
            .filter(|line| line.starts_with("grpc_server_handled_total{") && line.contains(&method))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// A client of this member logged in as `user` (e.g. [`ROOT_USER`] with
    /// [`root_password`](Self::root_password)). Panics if the login fails.
    pub async fn client_as(&self, user: &str, password: &str) -> Client {
        let user = Some((user.to_string(), password.to_string()));
        connect(&[self.endpoint()], user)
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Turns authentication on, for a test of a least-privilege store: makes [`ROOT_USER`]
    /// (a password of its own), a role with read and write rights on the keys that start with
    /// `prefix` (not empty) and nothing else, and [`LIMITED_USER`] with that role. Returns
    /// that user and its password. Panics if auth is on already.
    pub async fn enable_auth(&self, prefix: &str) -> (String, String) {
        enable_auth(self.client().await, &self.root_password, prefix).await
    }

    /// [`ROOT_USER`]'s password, once [`enable_auth`](Self::enable_auth) has run.
    pub fn root_password(&self) -> Option<String> {
        lock(&self.root_password).clone()
    }

    /// What the member says of itself, or why not (not running, no answer in time).
    /// `client` is the one to ask with, made on first use and kept for the next call.
    async fn status(&self, client: &mut Option<Client>) -> Result<MemberStatus, String> {
        if !self.is_running() {
            return Err("not running".to_string());
        }
        let ask = async {
            let client = match client {
                Some(client) => client,
                // Anonymous: a status needs no login, and a login needs a leader.
                None => client.insert(connect(&[self.endpoint()], None).await?),
            };
            let status = client.status().await.map_err(|err| err.to_string())?;
            Ok(MemberStatus {
                id: status.header().map_or(0, |header| header.member_id()),
                leader: status.leader(),
                term: status.raft_term(),
            })
        };
        tokio::time::timeout(STATUS_TIMEOUT, ask)
            .await
            .unwrap_or_else(|_| Err(format!("no answer in {STATUS_TIMEOUT:?}")))
    }

    /// A member named `name` on `(client port, peer port)` of the cluster `initial_cluster`
    /// (`name=peer URL,...`, which etcd reads at the first start only) named `token`, with
    /// the test's `flags` last; not started.
    fn configure(
        name: String,
        (client_port, peer_port): (u16, u16),
        initial_cluster: &str,
        token: &str,
        flags: &[(&str, &str)],
        root_password: Arc<Mutex<Option<String>>>,
    ) -> Self {
        let dir = memory_scratch_dir("etcd");
        let (client_url, peer_url) = (url(client_port), url(peer_port));
        let args: Vec<String> = [
            ("--name", name.as_str()),
            ("--data-dir", &dir.join("data").to_string_lossy()),
            ("--listen-client-urls", &client_url),
            ("--advertise-client-urls", &client_url),
            ("--listen-peer-urls", &peer_url),
            ("--initial-advertise-peer-urls", &peer_url),
            ("--initial-cluster", initial_cluster),
            ("--initial-cluster-token", token),
            ("--initial-cluster-state", "new"),
            // JSON lines on stderr, where the ready line is looked for.
            ("--logger", "zap"),
            ("--log-outputs", "stderr"),
        ]
        .iter()
        .chain(flags)
        .map(|(flag, value)| format!("{flag}={value}"))
        .collect();
        Self {
            name,
            client_port,
            peer_port,
            dir,
            args,
            root_password,
            process: None,
            client_scheme: "http",
        }
    }

    /// Makes a configured member serve its clients over TLS alone (files in its directory).
    fn serve_tls(&mut self, certificates: &Certificates, client_cert_auth: bool) {
        let [ca, cert, key] = certificates.write_server_files(&self.dir);
        let client_url = format!("https://127.0.0.1:{}", self.client_port);
        let mut flags = vec![
            ("--listen-client-urls", client_url.clone()),
            ("--advertise-client-urls", client_url),
            ("--cert-file", cert.to_string_lossy().into_owned()),
            ("--key-file", key.to_string_lossy().into_owned()),
        ];
        if client_cert_auth {
            flags.push(("--client-cert-auth", "true".to_owned()));
            flags.push(("--trusted-ca-file", ca.to_string_lossy().into_owned()));
        }
        // After the support's own flags, so that they override the plain client URLs.
        self.args
            .extend(flags.iter().map(|(flag, value)| format!("{flag}={value}")));
        self.client_scheme = "https";
    }

    /// Runs `etcd` under the watcher; the caller waits for its ready line.
    fn launch(&self) -> Result<Launching, StartError> {
        let mut command = watcher_command(Command::new("sh"), "etcd-watcher");
        command
            .arg(etcd_binary())
            .args(&self.args)
            .current_dir(&self.dir);
        Launching::spawn(command, &self.what())
    }

    /// `etcd member-0 on port 1234`, for messages.
    fn what(&self) -> String {
        format!("etcd {} on port {}", self.name, self.client_port)
    }

    fn running(&self) -> &Watched {
        self.process
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.what()))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // SIGKILL, not a clean stop: the data goes anyway, and a cluster's leader would hand
        // its leadership over first. Never a panic here (a test may be unwinding).
        if let Some(process) = self.process.take() {
            let _ = process.kill(START_TIMEOUT);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three etcd members on loopback that form one cluster (a token of its own, so two clusters
/// of one test process never take each other's members for theirs). Members are numbered
/// 0, 1, 2 in every method. Drop kills them all.
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
    /// The root password once auth is on, shared with every member.
    root_password: Arc<Mutex<Option<String>>>,
}

impl EtcdCluster {
    /// Starts three members together, with etcd's defaults, and waits until each serves
    /// clients: a leader has been elected and every member has joined.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start), with `flags` for every member, as
    /// [`EtcdServer::start_with`] takes them.
    pub fn start_with(flags: &[(&str, &str)]) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let ports: Vec<(u16, u16)> = (0..CLUSTER_SIZE)
                .map(|_| (free_etcd_port(), free_etcd_port()))
                .collect();
            let initial_cluster = ports
                .iter()
                .enumerate()
                .map(|(index, (_, peer_port))| {
                    format!("{}={}", member_name(index), url(*peer_port))
                })
                .collect::<Vec<_>>()
                .join(",");
            let token = new_token();
            let root_password = Arc::default();
            let mut members: Vec<EtcdServer> = ports
                .iter()
                .enumerate()
                .map(|(index, ports)| {
                    EtcdServer::configure(
                        member_name(index),
                        *ports,
                        &initial_cluster,
                        &token,
                        flags,
                        Arc::clone(&root_password),
                    )
                })
                .collect();
            match start_together(&mut members) {
                Ok(()) => {
                    return Self {
                        members,
                        root_password,
                    }
                }
                // Most likely a port was taken in the meantime: other ones. Dropping the
                // members kills those that run.
                Err(StartError::Exited(why)) => last_error = why,
                Err(StartError::NotReady(why)) => panic!("{why}"),
            }
        }
        panic!("could not start an etcd cluster on free ports after 5 tries: {last_error}");
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Member `index`.
    pub fn member(&self, index: usize) -> &EtcdServer {
        &self.members[index]
    }

    /// All members, in order.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// SIGKILLs member `index` ([`EtcdServer::kill`]).
    pub fn kill(&mut self, index: usize) {
        self.members[index].kill();
    }

    /// Stops member `index` cleanly ([`EtcdServer::stop`]).
    pub fn stop(&mut self, index: usize) {
        self.members[index].stop();
    }

    /// Restarts member `index` on its data and ports and waits until it has rejoined
    /// ([`EtcdServer::restart`]): the other members must have a leader.
    pub fn restart(&mut self, index: usize) {
        self.members[index].restart();
    }

    /// Freezes member `index` (SIGSTOP).
    pub fn freeze(&self, index: usize) {
        self.members[index].freeze();
    }

    /// Thaws member `index` (SIGCONT).
    pub fn thaw(&self, index: usize) {
        self.members[index].thaw();
    }

    /// A client of all members (it balances over them), on the current runtime;
    /// [`ROOT_USER`]'s once [`enable_auth`](Self::enable_auth) has run. A request that a dead
    /// member's connection takes fails: a test after a fault may rather take a live
    /// member's own [`client`](EtcdServer::client).
    pub async fn client(&self) -> Client {
        connect(&self.endpoints(), root_user(&self.root_password))
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// A client of all members logged in as `user`. Panics if the login fails.
    pub async fn client_as(&self, user: &str, password: &str) -> Client {
        let user = Some((user.to_string(), password.to_string()));
        connect(&self.endpoints(), user)
            .await
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// [`EtcdServer::enable_auth`] for the whole cluster: the users, the role and auth
    /// itself go through the cluster's log to every member.
    pub async fn enable_auth(&self, prefix: &str) -> (String, String) {
        enable_auth(self.client().await, &self.root_password, prefix).await
    }

    /// [`ROOT_USER`]'s password, once [`enable_auth`](Self::enable_auth) has run.
    pub fn root_password(&self) -> Option<String> {
        lock(&self.root_password).clone()
    }

    /// The index of the current leader, waiting up to [`LEADER_TIMEOUT`] during an election.
    pub async fn leader(&self) -> usize {
        self.wait_for_leader(LEADER_TIMEOUT, None).await
    }

    /// Waits up to `timeout` for a leader other than member `other_than` (after that one was
    /// killed or frozen), or for any leader with `None`, and returns its index. Asked through
    /// the status API: the leader is the member that answers that it leads, at the highest
    /// term any answering member knows (a thawed old leader still thinks it leads, at an old
    /// term), once every member that answers follows it (a member that takes no one for the
    /// leader yet drops the writes it is sent). Members that do not answer (stopped, killed,
    /// frozen) are left out. Panics with what each member said when the time is up.
    pub async fn wait_for_leader(&self, timeout: Duration, other_than: Option<usize>) -> usize {
        let deadline = Instant::now() + timeout;
        let mut clients: Vec<Option<Client>> = vec![None; self.members.len()];
        loop {
            let asked = self
                .members
                .iter()
                .zip(clients.iter_mut())
                .map(|(member, client)| member.status(client));
            let statuses = join_all(asked).await;
            match leader_among(&statuses, other_than) {
                Ok(leader) => return leader,
                Err(why) if Instant::now() >= deadline => {
                    panic!("no etcd leader after {timeout:?}: {why}")
                }
                Err(_) => tokio::time::sleep(LEADER_POLL).await,
            }
        }
    }
}

/// What a member says of itself in a status answer.
#[derive(Debug)]
struct MemberStatus {
    id: u64,
    /// The member it takes for the leader, 0 if none.
    leader: u64,
    term: u64,
}

/// The index of the member that says it leads at the highest term any member answers with,
/// if every member that answers takes it for the leader, unless it is `other_than`; else why
/// there is none.
fn leader_among(
    statuses: &[Result<MemberStatus, String>],
    other_than: Option<usize>,
) -> Result<usize, String> {
    let said = || format!("{statuses:?}");
    let term = statuses
        .iter()
        .flatten()
        .map(|status| status.term)
        .max()
        .ok_or_else(|| format!("no member answers: {}", said()))?;
    let leader = statuses
        .iter()
        .position(|status| {
            status
                .as_ref()
                .is_ok_and(|status| status.id == status.leader && status.term == term)
        })
        .ok_or_else(|| format!("no member leads at term {term}: {}", said()))?;
    if Some(leader) == other_than {
        return Err(format!("member {leader} still leads: {}", said()));
    }
    let id = statuses[leader].as_ref().map_or(0, |status| status.id);
    if statuses.iter().flatten().any(|status| status.leader != id) {
        return Err(format!(
            "not every member follows member {leader}: {}",
            said()
        ));
    }
    Ok(leader)
}

/// Launches every member, then waits for each: none is ready before a quorum runs.
fn start_together(members: &mut [EtcdServer]) -> Result<(), StartError> {
    let mut launched = Vec::new();
    for member in members.iter() {
        match member.launch() {
            Ok(launching) => launched.push(launching),
            Err(err) => {
                launched.into_iter().for_each(Launching::abandon);
                return Err(err);
            }
        }
    }
    let mut launched = launched.into_iter();
    for (member, launching) in members.iter_mut().zip(&mut launched) {
        match launching.wait_ready(READY, START_TIMEOUT) {
            Ok(process) => member.process = Some(process),
            Err(err) => {
                launched.for_each(Launching::abandon);
                return Err(err);
            }
        }
    }
    Ok(())
}

/// Makes the root user, the prefix's role and [`LIMITED_USER`] through `client`, turns auth on
/// and keeps the root password in `root_password`. Returns the limited user and its password.
async fn enable_auth(
    mut client: Client,
    root_password: &Mutex<Option<String>>,
    prefix: &str,
) -> (String, String) {
    assert!(
        !prefix.is_empty(),
        "enable_auth needs a prefix: an empty one is every key"
    );
    assert!(
        lock(root_password).is_none(),
        "auth is on already on this etcd"
    );
    let root = new_password();
    let password = new_password();
    let steps = async {
        client.user_add(ROOT_USER, root.as_str(), None).await?;
        // `root` is a role etcd knows without its being added.
        client.user_grant_role(ROOT_USER, "root").await?;
        client.role_add(LIMITED_ROLE).await?;
        // Read and write on [prefix, the prefix's end).
        let rights = Permission::read_write(prefix).with_prefix();
        client.role_grant_permission(LIMITED_ROLE, rights).await?;
        client
            .user_add(LIMITED_USER, password.as_str(), None)
            .await?;
        client.user_grant_role(LIMITED_USER, LIMITED_ROLE).await?;
        client.auth_enable().await?;
        Ok::<_, etcd_client::Error>(())
    };
    if let Err(err) = steps.await {
        panic!("turn etcd auth on for the prefix {prefix:?}: {err}");
    }
    *lock(root_password) = Some(root);
    (LIMITED_USER.to_string(), password)
}

/// A client of `endpoints`, logged in as `user` if given, or why not.
async fn connect(endpoints: &[String], user: Option<(String, String)>) -> Result<Client, String> {
    let mut options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
    let login = user.as_ref().map(|(name, _)| name.clone());
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    let connecting = Client::connect(endpoints, Some(options));
    let as_whom = login.map_or_else(String::new, |name| format!(" as {name}"));
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(format!("connect to etcd {endpoints:?}{as_whom}: {err}")),
        Err(_) => Err(format!(
            "connect to etcd {endpoints:?}{as_whom}: no answer in {CONNECT_TIMEOUT:?}"
        )),
    }
}

/// The root user and password to connect as, once auth is on.
fn root_user(root_password: &Mutex<Option<String>>) -> Option<(String, String)> {
    lock(root_password)
        .clone()
        .map(|password| (ROOT_USER.to_string(), password))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `http://127.0.0.1:PORT`.
fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn member_name(index: usize) -> String {
    format!("member-{index}")
}

/// A cluster token no other cluster of any test process has.
fn new_token() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("distlock-test-{}-{n}", std::process::id())
}

fn new_password() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A [`free_port`] that is none of etcd's [`DEFAULT_PORTS`].
fn free_etcd_port() -> u16 {
    loop {
        let port = free_port();
        if !DEFAULT_PORTS.contains(&port) {
            return port;
        }
    }
}

/// The `etcd` on PATH. Panics with the install hint.
fn etcd_binary() -> &'static PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        find_etcd(&path).unwrap_or_else(|hint| panic!("{hint}"))
    })
}

/// The `etcd` in the directories of `path` (a `PATH` value), or how to install it.
pub fn find_etcd(path: &OsStr) -> Result<PathBuf, String> {
    find_on_path("etcd", path).ok_or_else(|| INSTALL_HINT.to_string())
}

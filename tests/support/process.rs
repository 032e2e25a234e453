//! A server process the test support starts and the faults it injects into it, whatever the
//! server: the process runs under a shell watcher that kills it, with every process it forked,
//! when the test process goes away (the watcher's stdin pipe closes), and that reports its pid
//! and its exit; a start is ready at the server's own log line, not after a sleep. The faults
//! are signals (a fast shutdown, SIGKILL, SIGSTOP and SIGCONT) and what `/proc` says of a
//! process ([`is_gone`], [`is_stopped`]). `postgres` and `etcd` next door run their servers
//! with it; the Redis servers (`mod.rs`) keep a simpler watcher of their own.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// How long the processes of a SIGKILLed server may take to be gone, or a SIGSTOPped one to
/// stop.
pub const GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shell watcher: starts the server (`"$@"`), reports its pid, and when stdin closes or
/// a line arrives SIGKILLs it with every process it forked (PostgreSQL's backends set up
/// sessions of their own, so no process group holds them all: they are the processes whose
/// parent it is, found in /proc once it is stopped and forks no more). Then reports its exit.
/// With `DISTLOCK_SERVER_CPUS` set (e.g. `0`), the server runs pinned to those CPUs
/// (`taskset`). (A background job's stdin is /dev/null in a non-interactive shell, hence
/// fd 3.)
const WATCHER: &str = r#"
exec 3<&0
${DISTLOCK_SERVER_CPUS:+taskset -c "$DISTLOCK_SERVER_CPUS"} "$@" &
pid=$!
echo "support: pid $pid"
(
  read -r _ <&3
  kill -STOP "$pid"
  for stat in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$stat" || continue
    set -- ${line##*")"}
    if [ "$2" = "$pid" ]; then
      child=${stat#/proc/}
      kill -KILL "${child%/stat}"
    fi
  done
  kill -KILL "$pid"
) 2>/dev/null &
reader=$!
wait "$pid"
status=$?
kill "$reader" 2>/dev/null
echo "support: exited $status"
"#;

/// `shell` (`sh`, or a command that runs it as another user) set up to run the watcher,
/// named `name` in `ps`; the server's program and arguments are to be added.
pub fn watcher_command(mut shell: Command, name: &str) -> Command {
    shell.args(["-c", WATCHER, name]);
    shell
}

/// Why a server did not start.
#[derive(Debug)]
pub enum StartError {
    /// It exited before its ready line, most likely because its port was taken: another
    /// port, or the same one a moment later, may do. With the server's output.
    Exited(String),
    /// It did not say it was ready in time (it was killed), or it could not be run.
    NotReady(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(why) | Self::NotReady(why) => f.write_str(why),
        }
    }
}

/// A server started under the watcher that has not said it is ready yet. Several can be
/// launched before any is waited for: an etcd member is ready only once its peers run.
pub struct Launching {
    what: String,
    watcher: Child,
    stdin: ChildStdin,
    exited: mpsc::Receiver<()>,
    /// The watcher's lines and the server's output, until it is ready.
    lines: mpsc::Receiver<String>,
}

impl Launching {
    /// Spawns `command` (from [`watcher_command`], with the server's program and arguments
    /// added); `what` names the server in errors (`etcd member-0 on port 1234`). The
    /// watcher's lines come on its stdout, the server's log (and `runuser`'s complaints) on
    /// its stderr.
    pub fn spawn(mut command: Command, what: &str) -> Result<Self, StartError> {
        let mut watcher = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| StartError::NotReady(format!("{what}: spawn the watcher: {err}")))?;
        let stdin = watcher.stdin.take().expect("piped stdin");
        let stdout = watcher.stdout.take().expect("piped stdout");
        let stderr = watcher.stderr.take().expect("piped stderr");

        let (events, lines) = mpsc::channel::<String>();
        let (exited_tx, exited) = mpsc::channel::<()>();
        let log_events = events.clone();
        std::thread::spawn(move || forward_lines(stderr, &log_events));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("support: exited") {
                    let _ = exited_tx.send(());
                }
                let _ = events.send(line);
            }
        });
        Ok(Self {
            what: what.to_string(),
            watcher,
            stdin,
            exited,
            lines,
        })
    }

    /// Waits up to `timeout` for a line of the server's log that contains `ready`. A server
    /// that exits first, or does not say it in time (it is killed then), is an error with
    /// its log.
    pub fn wait_ready(self, ready: &str, timeout: Duration) -> Result<Watched, StartError> {
        let deadline = Instant::now() + timeout;
        let mut pid = None;
        let mut log = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                let what = self.what.clone();
                self.abandon();
                return Err(StartError::NotReady(format!(
                    "{what} did not become ready in {timeout:?}:\n{}",
                    log.join("\n")
                )));
            };
            if let Some(found) = line.strip_prefix("support: pid ") {
                pid = found.trim().parse().ok();
            } else if line.starts_with("support: exited") {
                let what = self.what.clone();
                self.abandon();
                return Err(StartError::Exited(format!(
                    "{what} exited at start:\n{}",
                    log.join("\n")
                )));
            } else if line.contains(ready) {
                let Some(pid) = pid else {
                    let what = self.what.clone();
                    self.abandon();
                    return Err(StartError::NotReady(format!(
                        "{what}: the watcher did not report the pid"
                    )));
                };
                // The threads go on reading the server's output, which nobody reads any more:
                // a server whose log pipe filled up would block.
                return Ok(Watched {
                    what: self.what,
                    watcher: self.watcher,
                    stdin: self.stdin,
                    pid,
                    exited: self.exited.into(),
                    exited_seen: false,
                });
            }
            log.push(line);
        }
    }

    /// Gives up on the server: closing the watcher's stdin has it killed. Waits for the
    /// watcher.
    pub fn abandon(mut self) {
        drop(self.stdin);
        let _ = self.watcher.wait();
    }
}

/// A running server under its watcher.
pub struct Watched {
    what: String,
    watcher: Child,
    stdin: ChildStdin,
    /// The server's own process.
    pid: u32,
    /// (In a mutex so a server can live in a `static`.)
    exited: Mutex<mpsc::Receiver<()>>,
    /// Whether `exited` has said so.
    exited_seen: bool,
}

impl Watched {
    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A clean shutdown with `signal` (`INT` for PostgreSQL's fast shutdown, `TERM` for
    /// etcd), waiting up to `timeout` for the exit; a frozen server is thawed first. One that
    /// does not exit in time is killed, and that is the error.
    pub fn shut_down(mut self, signal_name: &str, timeout: Duration) -> Result<(), String> {
        if !self.wait_exited(Duration::ZERO) {
            let _ = signal("CONT", &children_of(self.pid));
            let _ = signal("CONT", &[self.pid]);
            let _ = signal(signal_name, &[self.pid]);
        }
        if !self.wait_exited(timeout) {
            let (what, pid) = (self.what.clone(), self.pid);
            let killed = self.kill(timeout);
            return Err(format!(
                "{what} (pid {pid}) did not shut down in {timeout:?}; killed it ({killed:?})"
            ));
        }
        let _ = self.watcher.wait();
        Ok(())
    }

    /// SIGKILL of the server and every process it forked, all at once (the server stopped
    /// first, so it neither forks nor reacts to a child's death in between), waiting until
    /// all are gone; the watcher gets `timeout` to report the exit before it is asked to
    /// kill them itself.
    pub fn kill(mut self, timeout: Duration) -> Result<(), String> {
        if self.wait_exited(Duration::ZERO) {
            let _ = self.watcher.wait();
            return Ok(());
        }
        let processes = stop_all(self.pid)?;
        signal("KILL", &processes)?;
        if !self.wait_exited(timeout) {
            // The watcher did not report: its own SIGKILLs, as a last resort.
            let _ = self.stdin.write_all(b"kill\n");
            let _ = self.stdin.flush();
        }
        let _ = self.watcher.wait();
        wait_gone(&processes)
    }

    /// Whether the watcher has reported the server's exit, waiting up to `timeout` for it.
    /// Asked with no wait before a signal: a server that exited on its own has been reaped,
    /// and its pid may be another process's by now.
    pub fn wait_exited(&mut self, timeout: Duration) -> bool {
        if !self.exited_seen {
            let exited = self
                .exited
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.exited_seen = exited.recv_timeout(timeout).is_ok();
        }
        self.exited_seen
    }
}

/// Stops the process `pid` and waits until it is stopped (from then on it forks nothing,
/// and reacts to no child's death), then lists it and its children.
pub fn stop_all(pid: u32) -> Result<Vec<u32>, String> {
    signal("STOP", &[pid])?;
    let deadline = Instant::now() + GONE_TIMEOUT;
    while let Err(state) = stopped(pid) {
        if Instant::now() >= deadline {
            return Err(format!("process {pid} did not stop: {state}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut processes = vec![pid];
    processes.extend(children_of(pid));
    Ok(processes)
}

/// Waits until each of `processes` has exited (a zombie counts: it holds no memory, socket
/// or file any more, and only its parent, which may be init, can reap it).
pub fn wait_gone(processes: &[u32]) -> Result<(), String> {
    let deadline = Instant::now() + GONE_TIMEOUT;
    while let Some(pid) = processes.iter().find(|pid| !is_gone(**pid)) {
        if Instant::now() >= deadline {
            return Err(format!("server process {pid} still runs after SIGKILL"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Sends `signal` (`STOP`, `CONT`, `INT`, `TERM`, `KILL`) to `pids` with `kill`; an error if
/// any was not signalled (gone, or not ours).
pub fn signal(signal: &str, pids: &[u32]) -> Result<(), String> {
    if pids.is_empty() {
        return Ok(());
    }
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .map_err(|err| format!("run kill: {err}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pids:?} failed"))
    }
}

/// The live processes whose parent is `pid`, from /proc. Not the zombies: a backend that
/// exited while its parent was stopped waits there to be reaped, and is no process of the
/// server any more.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            stat_of(*child).is_some_and(|(state, parent)| parent == pid && !dead(state))
        })
        .collect()
}

/// A process's state letter and parent pid, from `/proc/PID/stat`; `None` once it is gone.
fn stat_of(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE PPID ...`, where COMM may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// `Ok` once `pid` is stopped by a signal (state `T`).
pub fn stopped(pid: u32) -> Result<(), String> {
    match stat_of(pid) {
        Some(('T', _)) => Ok(()),
        Some((state, _)) => Err(format!("process {pid} is in state {state}")),
        None => Err(format!("process {pid} is gone")),
    }
}

/// Whether `pid` is stopped by a signal (frozen).
pub fn is_stopped(pid: u32) -> bool {
    stopped(pid).is_ok()
}

/// Whether `pid` has exited (gone, or a zombie nobody reaped yet).
pub fn is_gone(pid: u32) -> bool {
    stat_of(pid).is_none_or(|(state, _)| dead(state))
}

/// Whether a `/proc` state letter is a process that has exited (zombie or dead).
fn dead(state: char) -> bool {
    matches!(state, 'Z' | 'X')
}

/// The first file named `program` in the directories of `path` (a `PATH` value), or `None`.
pub fn find_on_path(program: &str, path: &OsStr) -> Option<std::path::PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Sends each line of `from` to `to` until `from` closes. It keeps reading once nobody
/// listens any more: a server whose log pipe filled up would block.
fn forward_lines(from: impl Read, to: &mpsc::Sender<String>) {
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        let _ = to.send(line);
    }
}

//! `distlock`, the operator's command-line tool for distlock's locks: who holds a lock
//! (`status`), which locks are held (`list`), freeing a lock by force (`unlock --force`), a
//! live view (`watch`), on every store the library supports, and raising a fence key on the
//! data's Redis after a forced unlock (`fence raise`). Built on the library's operator tools
//! (`Client::inspect`, `list`, `force_unlock`, `distlock::fenced::raise`). Neighbours:
//! `store.rs` (which store, from the options or the environment) and `output.rs` (text or
//! `--json`).
//!
//! Exit codes: 0 success; 1 the lock is not held (`status`; `unlock --force` of a free lock);
//! 2 usage or configuration errors (also `unlock` without `--force`); 3 the store failed
//! (unreachable, too few Redlock masters, a fence key that holds no fence, …). A reader that goes away (`distlock watch k |
//! head -1`) ends the command quietly, with exit 0: what was printed stands.

mod output;
mod store;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{Client, Config, FencingToken, LockError};

/// Inspect and steer distlock's locks in Redis, PostgreSQL or etcd.
///
/// The store comes from --url, --cluster, --sentinel/--master, --redlock, --postgres or --etcd, else
/// from the environment as the library reads it (REDIS_URL, DISTLOCK_CLUSTER_URLS,
/// DISTLOCK_SENTINEL_URLS with DISTLOCK_SENTINEL_MASTER, DISTLOCK_REDLOCK_URLS,
/// DISTLOCK_POSTGRES_URL, DISTLOCK_ETCD_ENDPOINTS).
///
/// `fence raise` talks to the data's Redis instead (--data-url).
///
/// Exit codes: 0 ok, 1 not locked (status, unlock), 2 usage or configuration error,
/// 3 the store failed.
#[derive(Debug, Parser)]
#[command(name = "distlock", version)]
struct Cli {
    #[command(flatten)]
    store: store::StoreArgs,
    /// Print JSON (one document; `watch`: one per line) instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Who holds the lock KEY: its writer or readers (app, host, pid, since when), the lease
    /// left, waiters, the fencing token ceiling, and for an election its leader's epoch and
    /// published value. Exits 1 when it is not locked.
    Status {
        /// The lock's name, as the application passes it (without the prefix).
        key: String,
    },
    /// The held locks whose names match PATTERN (Redis glob; default `*`), found with SCAN.
    List {
        /// A glob over lock names: `*`, `?`, `[a-z]`, `[^a-z]`, `\` escapes.
        #[arg(default_value = "*")]
        pattern: String,
        /// Show at most this many names.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
    /// Free the lock KEY whatever holds it. The evicted holders run on until their next
    /// renewal: only a fenced store is safe. Prints the token to fence with and the
    /// `fence raise` command to run next. Needs --force.
    Unlock {
        /// The lock's name.
        key: String,
        /// Really free it (without it, the tool says what it would do and exits 2).
        #[arg(long)]
        force: bool,
    },
    /// Show the lock KEY's holder, waiters and lease, refreshing.
    Watch {
        /// The lock's name.
        key: String,
        /// Time between refreshes, e.g. `500ms`, `2s`.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        count: Option<u64>,
    },
    /// Print the SQL that makes distlock's objects on PostgreSQL (its schema, table, sequence
    /// and function; idempotent), for teams that run their own migrations and set
    /// `Config::postgres_create_schema(false)`. Connects to nothing.
    Schema,
    /// Fence keys of fenced writes (`distlock::fenced`), on the Redis that holds the data.
    Fence {
        #[command(subcommand)]
        command: FenceCommand,
    },
}

#[derive(Debug, Subcommand)]
enum FenceCommand {
    /// Raise the fence of the data key KEY to TOKEN (the token `unlock --force` printed), so
    /// fenced writes with a lower token are refused: an evicted holder's late writes. A fence
    /// at TOKEN or higher is left as it is (never lowered); a fence key that holds something
    /// else is an error, left untouched.
    Raise {
        /// The data key the fenced writes guard (its fence key is `{KEY}:fence`, or
        /// `KEY:fence` when KEY has a hash tag).
        key: String,
        /// The fencing token, e.g. the one `unlock --force` printed.
        token: u64,
        /// The Redis that holds the data (not necessarily the locks' store), e.g.
        /// `redis://data.internal:6379/0`.
        #[arg(long, value_name = "URL")]
        data_url: String,
    },
}

/// How long `fence raise` waits to connect to the data's Redis, and for its answer.
const DATA_TIMEOUT: Duration = Duration::from_secs(5);

/// How a command ended.
enum Outcome {
    Done,
    NotLocked,
    /// The command was not carried out, and this says why and what to run instead (exit 2, as
    /// for a usage error): not a [`LockError`], since nothing failed.
    Refused(String),
    /// Whatever read the output went away (a closed pipe): the command stopped there.
    ReaderGone,
}

/// Why a command failed.
enum Failure {
    Lock(LockError),
    /// The data's Redis failed (`fence raise`), or refused the key (not a fence).
    Data(redis::RedisError),
    /// Writing the output failed for another reason than a reader gone (a full disk, say).
    Output(std::io::Error),
}

impl From<LockError> for Failure {
    fn from(err: LockError) -> Self {
        Failure::Lock(err)
    }
}

/// Prints one line on stdout. `Ok(false)`: the reader went away (`EPIPE`), so nothing more
/// is worth printing; `println!` would panic there. A command that prints once keeps its
/// outcome (and exit code) either way; one that prints on stops ([`print_or_stop!`]).
fn print_line(line: &str) -> Result<bool, Failure> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(err) => Err(Failure::Output(err)),
    }
}

/// Says on stderr why the command failed; a closed stderr leaves only the exit code
/// (`eprintln!` would panic there).
fn complain(why: &str) {
    let _ = writeln!(std::io::stderr(), "distlock: {why}");
}

/// Prints `line`, or ends the command with [`Outcome::ReaderGone`] when nobody reads.
macro_rules! print_or_stop {
    ($line:expr) => {
        if !print_line(&$line)? {
            return Ok(Outcome::ReaderGone);
        }
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            complain(&format!("cannot start the async runtime: {err}"));
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(Outcome::Done | Outcome::ReaderGone) => ExitCode::SUCCESS,
        Ok(Outcome::NotLocked) => ExitCode::from(1),
        Ok(Outcome::Refused(why)) => {
            complain(&why);
            ExitCode::from(2)
        }
        Err(Failure::Data(err)) => {
            complain(&format!("the data's Redis: {err}"));
            ExitCode::from(3)
        }
        Err(Failure::Output(err)) => {
            complain(&format!("cannot write the output: {err}"));
            ExitCode::from(3)
        }
        Err(Failure::Lock(err)) => {
            complain(&err.to_string());
            ExitCode::from(match err {
                LockError::Config(_) | LockError::InvalidKey { .. } => 2,
                _ => 3,
            })
        }
    }
}

async fn run(cli: &Cli) -> Result<Outcome, Failure> {
    if let Command::Schema = &cli.command {
        let schema = cli
            .store
            .postgres_schema
            .as_deref()
            .unwrap_or(distlock::DEFAULT_POSTGRES_SCHEMA);
        // Checked as the library checks it: the schema goes into the SQL unquoted.
        if !schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            || schema.is_empty()
            || schema.starts_with(|c: char| c.is_ascii_digit())
        {
            return Ok(Outcome::Refused(format!(
                "--postgres-schema {schema:?} is not a lower-case SQL identifier (letters a-z, \
                 digits and `_`, not starting with a digit)"
            )));
        }
        print_line(&distlock::postgres_schema_sql(schema))?;
        return Ok(Outcome::Done);
    }
    if let Command::Fence { command } = &cli.command {
        // The locks' store plays no part (nor its options and variables): the fence lives
        // beside the data.
        return fence(command, cli.json).await;
    }
    let client = Client::new(cli.store.config()?)?;
    match &cli.command {
        Command::Status { key } => {
            let state = client.inspect(key.as_str()).await?;
            if cli.json {
                print_line(&output::json(&output::JsonState::from(&state)))?;
            } else {
                print_line(&output::state_text(&state))?;
            }
            Ok(if state.is_locked() {
                Outcome::Done
            } else {
                Outcome::NotLocked
            })
        }
        Command::List { pattern, limit } => {
            let locks = client.list(pattern, *limit).await?;
            if cli.json {
                print_or_stop!(output::json(&output::JsonList::new(pattern, &locks)));
            } else {
                for lock in &locks {
                    print_or_stop!(lock.to_string());
                }
            }
            Ok(Outcome::Done)
        }
        Command::Unlock { key, force: false } => {
            let state = client.inspect(key.as_str()).await?;
            let mut what = format!(
                "refusing to unlock `{key}` without --force. It would free the lock whatever \
                 holds it and evict {} holder(s):",
                state.holders.len()
            );
            for holder in &state.holders {
                what.push_str("\n  ");
                what.push_str(&output::holder_text(holder));
            }
            what.push_str(
                "\nAn evicted holder keeps running until its next renewal, beside the next \
                 holder: only a store fenced with the printed token is safe. Run again with \
                 --force to do it.",
            );
            Ok(Outcome::Refused(what))
        }
        Command::Unlock { key, force: true } => {
            let forced = client.force_unlock(key.as_str()).await?;
            if cli.json {
                print_line(&output::json(&output::JsonForced::from(&forced)))?;
            } else {
                print_line(&output::forced_text(&forced))?;
            }
            Ok(if forced.evicted.is_empty() {
                Outcome::NotLocked
            } else {
                Outcome::Done
            })
        }
        Command::Watch {
            key,
            interval,
            count,
        } => {
            let mut shown = 0u64;
            loop {
                let state = client.inspect(key.as_str()).await?;
                if cli.json {
                    print_or_stop!(output::json(&output::JsonState::from(&state)));
                } else {
                    print_or_stop!(format!("{}\n", output::state_text(&state)));
                }
                shown += 1;
                if count.is_some_and(|count| shown >= count) {
                    return Ok(Outcome::Done);
                }
                tokio::time::sleep(*interval).await;
            }
        }
        Command::Fence { command } => fence(command, cli.json).await,
        Command::Schema => Ok(Outcome::Done),
    }
}

/// `fence raise`: connects to the data's Redis and raises `key`'s fence to `token`.
async fn fence(command: &FenceCommand, json: bool) -> Result<Outcome, Failure> {
    let FenceCommand::Raise {
        key,
        token,
        data_url,
    } = command;
    let token = FencingToken::from_raw(*token);
    // The library's URL check names the bad part of a URL (exit 2) and readies TLS for
    // `rediss://`; nothing connects.
    let _checked = Config::from_url(data_url).map_err(|err| match err {
        LockError::Config(why) => LockError::Config(format!("--data-url: {why}")),
        other => other,
    })?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(DATA_TIMEOUT))
        .set_response_timeout(Some(DATA_TIMEOUT));
    let mut conn = redis::Client::open(data_url.as_str())
        .map_err(Failure::Data)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(Failure::Data)?;
    let raised = distlock::fenced::raise(&mut conn, key, token)
        .await
        .map_err(Failure::Data)?;
    if json {
        print_line(&output::json(&output::JsonFenceRaise::new(
            key, token, raised,
        )))?;
    } else {
        print_line(&output::fence_raise_text(key, token, raised))?;
    }
    Ok(Outcome::Done)
}

//! How the tool shows what it found: a few lines of text for people, or one JSON document
//! per answer (`--json`; `watch` prints one per line). The JSON shapes are the `Json*` structs
//! below, kept stable for scripts. Neighbours: `main.rs` runs the commands and picks the form.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::fenced::FenceRaise;
use distlock::{FencingToken, ForcedUnlock, Holder, LockMode, LockState};
use serde::Serialize;

/// One holder, as `--json` shows it.
#[derive(Debug, Serialize)]
pub struct JsonHolder {
    owner: String,
    app: Option<String>,
    host: Option<String>,
    pid: Option<u32>,
    /// When the holder took the lock, ms since the Unix epoch on the holder's clock.
    since_ms: Option<u64>,
    /// Remaining lease in ms; null when the key has no expiry.
    remaining_ms: Option<u64>,
}

impl From<&Holder> for JsonHolder {
    fn from(holder: &Holder) -> Self {
        Self {
            owner: holder.owner.clone(),
            app: holder.app.clone(),
            host: holder.host.clone(),
            pid: holder.pid,
            since_ms: holder.since.map(epoch_ms),
            remaining_ms: holder.remaining.map(ms),
        }
    }
}

/// `status` and `watch`, as `--json` shows them.
#[derive(Debug, Serialize)]
pub struct JsonState {
    key: String,
    locked: bool,
    /// `"write"`, `"read"`, `"semaphore"`, or null when free.
    mode: Option<&'static str>,
    /// A semaphore's number of permits; null otherwise.
    permits: Option<u32>,
    holders: Vec<JsonHolder>,
    remaining_ms: Option<u64>,
    writer_waiting: bool,
    waiting_processes: u64,
    /// Fair waiters in the lock's queue.
    queued: u64,
    token_ceiling: u64,
    /// The leader when the lock is an election's; null otherwise.
    leader: Option<JsonLeader>,
}

/// An election's leader, as `--json` shows it (the holder is the lock's).
#[derive(Debug, Serialize)]
pub struct JsonLeader {
    epoch: u64,
    /// The published value as text (bytes that are not UTF-8 as `\xNN` escapes); null
    /// when none was published.
    value: Option<String>,
}

impl From<&LockState> for JsonState {
    fn from(state: &LockState) -> Self {
        Self {
            key: state.key.clone(),
            locked: state.is_locked(),
            mode: state.mode.map(mode_name),
            permits: state.permits,
            holders: state.holders.iter().map(JsonHolder::from).collect(),
            remaining_ms: state.remaining.map(ms),
            writer_waiting: state.writer_waiting,
            waiting_processes: state.waiting_processes,
            queued: state.queued,
            token_ceiling: state.token_ceiling.get(),
            leader: state.leader.as_ref().map(|leader| JsonLeader {
                epoch: leader.epoch().get(),
                value: leader.value().map(value_text),
            }),
        }
    }
}

/// A published value as text: UTF-8 with control characters escaped (a value cannot drive
/// the terminal), anything else with its bytes escaped (`\xNN`).
fn value_text(value: &[u8]) -> String {
    std::str::from_utf8(value).map_or_else(
        |_| value.escape_ascii().to_string(),
        |text| text.escape_debug().to_string(),
    )
}

/// `unlock --force`, as `--json` shows it.
#[derive(Debug, Serialize)]
pub struct JsonForced {
    key: String,
    evicted: Vec<JsonHolder>,
    /// Hand this to the fenced store: every evicted holder's token is below it.
    token: u64,
    /// The command that raises a Redis fence to `token` ([`next_command`]); null when
    /// nothing was evicted.
    next: Option<String>,
}

impl From<&ForcedUnlock> for JsonForced {
    fn from(forced: &ForcedUnlock) -> Self {
        Self {
            key: forced.key.clone(),
            evicted: forced.evicted.iter().map(JsonHolder::from).collect(),
            token: forced.token.get(),
            next: (!forced.evicted.is_empty()).then(|| next_command(forced)),
        }
    }
}

/// What to run after a forced unlock: `distlock fence raise KEY TOKEN --data-url DATA_URL`,
/// with the lock's name as the data key (the usual case: the lock `order:42` guards the key
/// `order:42`; the text says to change it otherwise). `DATA_URL` is left for the operator to
/// fill in: only they know which Redis holds the data; pasted as it is, the command fails
/// with a usage error and changes nothing.
pub fn next_command(forced: &ForcedUnlock) -> String {
    format!(
        "distlock fence raise {} {} --data-url DATA_URL",
        shell_word(&forced.key),
        forced.token
    )
}

/// `word` as one shell word: as it is when it has only characters no shell treats
/// specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/@%+=,".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `fence raise`, as `--json` shows it.
#[derive(Debug, Serialize)]
pub struct JsonFenceRaise {
    key: String,
    fence_key: String,
    /// The token asked for.
    token: u64,
    /// Whether the fence was lower (or absent) and now holds `token`.
    raised: bool,
    /// The fence's token before, null when there was none.
    previous: Option<u64>,
    /// The fence's token now: `token`, or the higher one it held.
    fence: u64,
}

impl JsonFenceRaise {
    pub fn new(key: &str, token: FencingToken, raise: FenceRaise) -> Self {
        let (raised, previous) = match raise {
            FenceRaise::Raised { previous } => (true, previous.map(FencingToken::get)),
            FenceRaise::AlreadyAtLeast { highest } => (false, Some(highest.get())),
        };
        Self {
            key: key.to_owned(),
            fence_key: distlock::fenced::fence_key(key),
            token: token.get(),
            raised,
            previous,
            fence: raise.highest(token).get(),
        }
    }
}

/// `fence raise` for people.
pub fn fence_raise_text(key: &str, token: FencingToken, raise: FenceRaise) -> String {
    let fence_key = distlock::fenced::fence_key(key);
    match raise {
        FenceRaise::Raised {
            previous: Some(previous),
        } => format!(
            "{key}: fence {fence_key} raised from {previous} to {token}; fenced writes with a \
             lower token are refused"
        ),
        FenceRaise::Raised { previous: None } => format!(
            "{key}: fence {fence_key} set to {token} (there was none); fenced writes with a \
             lower token are refused"
        ),
        FenceRaise::AlreadyAtLeast { highest } => format!(
            "{key}: fence {fence_key} already at {highest}, not below {token}: left as it was \
             (a fence is never lowered)"
        ),
    }
}

/// `list`, as `--json` shows it.
#[derive(Debug, Serialize)]
pub struct JsonList<'a> {
    pattern: &'a str,
    locks: &'a [String],
}

impl<'a> JsonList<'a> {
    pub fn new(pattern: &'a str, locks: &'a [String]) -> Self {
        Self { pattern, locks }
    }
}

/// The value as one line of JSON.
pub fn json(value: &impl Serialize) -> String {
    // Plain data with string keys: serialising cannot fail.
    serde_json::to_string(value).unwrap_or_else(|err| format!("{{\"error\":\"{err}\"}}"))
}

/// `status` for people.
pub fn state_text(state: &LockState) -> String {
    let mut text = match state.mode {
        None => format!("{}: not locked", state.key),
        Some(LockMode::Semaphore) => format!(
            "{}: locked (semaphore, {} of {} permits held), {} left",
            state.key,
            state.holders.len(),
            state
                .permits
                .map_or_else(|| "?".to_owned(), |p| p.to_string()),
            lease_text(state.remaining)
        ),
        Some(mode) => format!(
            "{}: locked ({}), {} left",
            state.key,
            mode_name(mode),
            lease_text(state.remaining)
        ),
    };
    for holder in &state.holders {
        text.push_str("\n  ");
        text.push_str(&holder_text(holder));
    }
    if let Some(leader) = &state.leader {
        text.push_str(&format!(
            "\n  election leader: epoch {}, value {}",
            leader.epoch(),
            leader
                .value()
                .map_or_else(|| "none".to_owned(), |v| format!("\"{}\"", value_text(v)))
        ));
    }
    text.push_str(&format!(
        "\n  writer waiting: {}, waiting processes: {}, fair waiters queued: {}, token ceiling: {}",
        if state.writer_waiting { "yes" } else { "no" },
        state.waiting_processes,
        state.queued,
        state.token_ceiling
    ));
    text
}

/// `unlock --force` for people.
pub fn forced_text(forced: &ForcedUnlock) -> String {
    if forced.evicted.is_empty() {
        // Nobody was evicted, so there is no late writer for a token to keep out.
        return format!("{}: was not locked; nothing evicted", forced.key);
    }
    let mut text = format!(
        "{}: unlocked by force, {} holder(s) evicted",
        forced.key,
        forced.evicted.len()
    );
    for holder in &forced.evicted {
        text.push_str("\n  evicted ");
        text.push_str(&holder_text(holder));
    }
    text.push_str(&format!(
        "\n  fencing token {}: every evicted holder's token is below it; give it to your \
         fenced store so their late writes are rejected",
        forced.token
    ));
    text.push_str(&format!(
        "\n  next: raise the fence of each key the lock guards (DATA_URL: the Redis holding \
         the data; change the key if it is not the lock's name):\n    {}\n  (SQL: UPDATE … \
         SET fence = {} WHERE … AND fence < {})",
        next_command(forced),
        forced.token,
        forced.token
    ));
    text
}

/// One holder on one line: app, host, pid, since when, lease left, owner token.
pub fn holder_text(holder: &Holder) -> String {
    let lease = lease_text(holder.remaining);
    match (&holder.app, &holder.host, holder.pid, holder.since) {
        (Some(app), Some(host), Some(pid), Some(since)) => {
            let held_for = SystemTime::now()
                .duration_since(since)
                .map(|d| format!(" ({} ago)", humantime::format_duration(round_ms(d))))
                .unwrap_or_default();
            format!(
                "holder app={app} host={host} pid={pid} since={}{held_for} lease={lease} owner={}",
                humantime::format_rfc3339_millis(since),
                holder.owner
            )
        }
        _ => format!(
            "holder owner={} (not written by distlock: no holder record) lease={lease}",
            holder.owner
        ),
    }
}

fn lease_text(remaining: Option<Duration>) -> String {
    match remaining {
        Some(remaining) => humantime::format_duration(round_ms(remaining)).to_string(),
        None => "no expiry".to_owned(),
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(ms(d))
}

fn mode_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Write => "write",
        LockMode::Read => "read",
        LockMode::Semaphore => "semaphore",
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, ms)
}

//! Who holds a lock: the holder record every grant carries in its owner token, and the
//! operator's views built from it — [`LockState`] ([`Client::inspect`](crate::Client::inspect)),
//! an election's [`LeaderInfo`] (the record beside the lock, shown only beside its holder),
//! [`ForcedUnlock`] ([`Client::force_unlock`](crate::Client::force_unlock)) and the key names
//! [`Client::list`](crate::Client::list) finds. Neighbours: `operator_scripts.rs` has the scripts
//! and reads their replies into raw views, the stores in `store/` run them (and merge the
//! views of Redlock's masters), `acquire/pending.rs` makes the owner tokens with [`HolderTag`].
//!
//! An owner token is `<uuid>:<since>:<pid>:<host>:<app>`: 32 hex digits of a v4 UUID (which
//! keeps every try's token unique), the holder's wall clock at the try in ms since the Unix
//! epoch, its process id, its host name and the application name from
//! [`Config::app_name`](crate::Config::app_name). Host and app are sanitized (see
//! [`sanitize`]) so the token always parses back. Scripts compare tokens as opaque strings.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::protocol::RawRecord;
use crate::protocol::{FencingToken, LockMode};

/// Longest host name kept in an owner token, in bytes.
const MAX_HOST_LEN: usize = 64;
/// Longest application name kept in an owner token, in bytes.
pub(crate) const MAX_APP_LEN: usize = 48;

/// One holder of a lock — its writer, or one of its readers — as recorded in its owner token.
///
/// `app`, `host`, `pid` and `since` are `None` for an owner token distlock did not write (a
/// foreign tool, or a version before holder records): then only [`owner`](Self::owner) says
/// anything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The raw owner token, unique per grant.
    pub owner: String,
    /// The holder's application name ([`Config::app_name`](crate::Config::app_name)).
    pub app: Option<String>,
    /// The holder's host name.
    pub host: Option<String>,
    /// The holder's process id.
    pub pid: Option<u32>,
    /// When the holder's try for this grant started, on the holder's own clock (it may differ
    /// from yours).
    pub since: Option<SystemTime>,
    /// How long its lease has left (`None`: the key has no expiry).
    pub remaining: Option<Duration>,
}

impl Holder {
    /// Reads the holder record out of an owner token.
    pub(crate) fn parse(owner: String, remaining: Option<Duration>) -> Self {
        let mut holder = Holder {
            owner,
            app: None,
            host: None,
            pid: None,
            since: None,
            remaining,
        };
        let mut parts = holder.owner.splitn(5, ':');
        let (Some(uuid), Some(since), Some(pid), Some(host), Some(app)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return holder;
        };
        let (Ok(since), Ok(pid)) = (since.parse::<u64>(), pid.parse::<u32>()) else {
            return holder;
        };
        // Past the year 9999 is no time a holder wrote (and no time RFC 3339 can show).
        if since >= LAST_MILLISECOND_OF_9999 {
            return holder;
        }
        if uuid.len() != 32 || !uuid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return holder;
        }
        holder.since = UNIX_EPOCH.checked_add(Duration::from_millis(since));
        holder.pid = Some(pid);
        holder.host = Some(host.to_owned());
        holder.app = Some(app.to_owned());
        holder
    }
}

/// What [`Client::inspect`](crate::Client::inspect) found of one lock.
///
/// On Redlock it is what a majority of the masters agree on: a holder is shown when a quorum
/// of masters has its owner token, with the lease the quorum keeps (the quorum-th longest of
/// the masters' remaining leases); waiting processes are the most any master counts (a waiting
/// process listens on every master it reaches) and the writer-waiting mark counts if any
/// master has it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The key as the user names it.
    pub key: String,
    /// Which side holds the lock; `None` when it is free. [`LockMode::Semaphore`] when
    /// permits of a semaphore hold it.
    pub mode: Option<LockMode>,
    /// The writer, or every reader, or every permit holder of a semaphore; empty when the
    /// lock is free.
    pub holders: Vec<Holder>,
    /// The key's number of permits while it is a semaphore ([`semaphore`](crate::semaphore)),
    /// `None` otherwise.
    pub permits: Option<u32>,
    /// How long the lock stays held if nobody renews it: the longest lease among the holders.
    pub remaining: Option<Duration>,
    /// A writer waits for the lock and keeps new readers out (writer preference).
    pub writer_waiting: bool,
    /// Processes listening for the lock's release: each has at least one task waiting for
    /// this lock or, for an election, observing it ([`Election::observe`](crate::Election::observe)),
    /// or did very recently (a subscription ends shortly after its last waiter).
    pub waiting_processes: u64,
    /// Fair waiters in the lock's queue ([`LockRequest::fair`](crate::LockRequest::fair)),
    /// not counting those whose heartbeat has lapsed. On Redlock, the most any master queues.
    pub queued: u64,
    /// A value no fencing token handed out for this key so far exceeds: the server clock in
    /// microseconds on a single node, Sentinel and Cluster (their tokens are that clock, read
    /// at the grant, so no key keeps a last token); on Redlock the highest of the masters'
    /// counters and clocks. Write it into a fenced store as the lowest accepted token to
    /// reject every holder so far — [`Client::force_unlock`](crate::Client::force_unlock)
    /// returns such a token after freeing the lock.
    pub token_ceiling: FencingToken,
    /// The leader, when the lock is an [election](crate::Election)'s and its holder has
    /// written its leader record (epoch, value); `None` otherwise.
    pub leader: Option<LeaderInfo>,
}

impl LockState {
    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        !self.holders.is_empty()
    }
}

/// Who leads an election: the epoch, the leader's holder record and the value it published
/// ([`Election::leader`](crate::Election::leader), [`Election::observe`](crate::Election::observe),
/// [`LockState::leader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    epoch: FencingToken,
    holder: Holder,
    value: Option<Vec<u8>>,
    /// Which of the leader's values this is (`RawRecord::revision`).
    revision: u64,
}

impl LeaderInfo {
    /// The leader record in `view`, if its writer holds the lock.
    pub(crate) fn from_view(
        record: Option<RawRecord>,
        mode: Option<LockMode>,
        holders: &[Holder],
    ) -> Option<Self> {
        let record = record?;
        match (mode, holders) {
            (Some(LockMode::Write), [holder]) if holder.owner == record.owner => Some(Self {
                epoch: FencingToken(record.epoch),
                holder: holder.clone(),
                value: record.value,
                revision: record.revision,
            }),
            _ => None,
        }
    }

    /// The leader's epoch: its grant's fencing token.
    pub fn epoch(&self) -> FencingToken {
        self.epoch
    }

    /// The leader's holder record: app, host, pid, since when, and its remaining lease.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// When the leader's campaign took the lock, on the leader's clock.
    pub fn since(&self) -> Option<SystemTime> {
        self.holder.since
    }

    /// What the leader published: its campaign's [`Election::value`](crate::Election::value),
    /// or the value of its latest [`Leadership::proclaim`](crate::Leadership::proclaim).
    pub fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// Where this record stands among all leaders' values: by epoch, then by the leader's
    /// proclaims (`election/observe.rs` yields only a later one than it yielded last).
    pub(crate) fn published(&self) -> (FencingToken, u64) {
        (self.epoch, self.revision)
    }
}

/// What [`Client::force_unlock`](crate::Client::force_unlock) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedUnlock {
    /// The key as the user names it.
    pub key: String,
    /// The holders it evicted (none when the lock was free).
    pub evicted: Vec<Holder>,
    /// A fencing token greater than every token handed out for the key so far; every later
    /// grant's token is greater still. Hand it to the fenced store, so it rejects the
    /// evicted holders' late writes.
    pub token: FencingToken,
}

/// This process's part of every owner token: `<pid>:<host>:<app>`, made once per client.
#[derive(Debug, Clone)]
pub(crate) struct HolderTag(String);

/// 10000-01-01T00:00:00Z in ms since the epoch: `since` must be before it.
const LAST_MILLISECOND_OF_9999: u64 = 253_402_300_800_000;

impl HolderTag {
    /// The tag of this process, with `app` as the application name (sanitized; the
    /// executable's file name when `None`).
    pub(crate) fn of_this_process(app: Option<&str>) -> Self {
        let host = gethostname::gethostname();
        let host = sanitize(&host.to_string_lossy(), MAX_HOST_LEN);
        let app = match app {
            Some(app) => sanitize(app, MAX_APP_LEN),
            None => sanitize(&executable_name(), MAX_APP_LEN),
        };
        Self(format!("{}:{host}:{app}", std::process::id()))
    }

    /// A fresh owner token for a try that starts now.
    pub(crate) fn owner(&self, uuid: &str) -> String {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Built by hand: `format!` costs as much as the rest of a try's client work.
        let mut owner = String::with_capacity(uuid.len() + 22 + self.0.len());
        owner.push_str(uuid);
        owner.push(':');
        push_decimal(&mut owner, since);
        owner.push(':');
        owner.push_str(&self.0);
        owner
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// The running executable's file name without extension, or `unknown`.
fn executable_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A name fit for an owner token: letters, digits, `.`, `-` and `_` kept, every other
/// character (the `:` separator, spaces, non-ASCII) made `_`, cut to `max` bytes; `unknown`
/// when nothing is left. Never an error: a holder record is for people to read.
pub(crate) fn sanitize(name: &str, max: usize) -> String {
    let clean: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}

/// The `SCAN … MATCH` patterns that find the lock keys whose names match the glob `pattern`
/// under `prefix` (see [`LockKey`](crate::store::LockKey)): `prefix{name}`, and for names
/// starting with `}` (only when the pattern can match one) `prefix{#<16 hex>}name#`. Companion
/// keys (`…:fence`, `…:writer-waiting`) match neither.
pub(crate) fn scan_patterns(prefix: &str, pattern: &str) -> Vec<String> {
    let prefix = escape_glob(prefix);
    let mut patterns = vec![format!("{prefix}{{{pattern}}}")];
    if pattern.starts_with(['*', '?', '[', '}', '\\']) {
        patterns.push(format!("{prefix}{{#{}}}{pattern}#", "?".repeat(16)));
    }
    patterns
}

/// The user's name of a lock key found by [`scan_patterns`], or `None` for another key.
pub(crate) fn name_of(prefix: &str, key: &str) -> Option<String> {
    let tagged = key.strip_prefix(prefix)?;
    if let Some(rest) = tagged.strip_prefix("{#") {
        // `{#<16 hex>}name#`, name starting with `}`.
        let (hash, name) = (rest.get(..16)?, rest.get(17..)?);
        if rest.as_bytes().get(16) == Some(&b'}')
            && hash.bytes().all(|b| b.is_ascii_hexdigit())
            && name.starts_with('}')
        {
            return name.strip_suffix('#').map(str::to_owned);
        }
    }
    tagged
        .strip_prefix('{')?
        .strip_suffix('}')
        .map(str::to_owned)
}

/// `text` with Redis glob's special characters escaped.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::LockKey;
    use crate::store::glob::glob_matches;

    #[test]
    fn an_owner_token_carries_its_holder_and_parses_back() {
        let tag = HolderTag::of_this_process(Some("billing: nightly run"));
        let owner = tag.owner("0123456789abcdef0123456789abcdef");
        assert!(owner.len() < 140, "{owner}");
        let holder = Holder::parse(owner, Some(Duration::from_secs(3)));
        assert_eq!(holder.app.as_deref(), Some("billing__nightly_run"));
        assert_eq!(holder.pid, Some(std::process::id()));
        assert!(holder.host.as_deref().is_some_and(|h| !h.is_empty()));
        let since = holder.since.expect("since");
        assert!(SystemTime::now().duration_since(since).unwrap() < Duration::from_secs(5));
    }

    #[test]
    fn globs_match_as_redis_does_and_in_linear_time() {
        for (pattern, text, expected) in [
            ("*", "", true),
            ("*", "order:42", true),
            ("order:*", "order:42", true),
            ("order:?2", "order:42", true),
            ("order:[0-9][0-9]", "order:42", true),
            ("order:[^4]*", "order:42", false),
            ("*:4*2", "order:42", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("\\*x", "*x", true),
            ("\\*x", "ax", false),
            ("", "a", false),
        ] {
            assert_eq!(
                glob_matches(pattern.as_bytes(), text.as_bytes()),
                expected,
                "{pattern} ~ {text}"
            );
        }
        let started = std::time::Instant::now();
        let text = "a".repeat(200);
        assert!(!glob_matches(b"*a*a*a*a*a*a*a*a*a*a*b", text.as_bytes()));
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_since_past_the_year_9999_is_no_holder_record() {
        let holder = Holder::parse(
            "0123456789abcdef0123456789abcdef:300000000000000:1:h:a".to_owned(),
            None,
        );
        assert_eq!(holder.since, None);
        assert_eq!(holder.app, None);
    }

    #[test]
    fn decimals_are_written_as_format_would() {
        for n in [0, 7, 10, 1_795_468_000_123, u64::MAX] {
            let mut out = String::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn a_foreign_owner_is_shown_raw() {
        for owner in [
            "deadbeef",
            "a:b:c:d:e",
            "0123456789abcdef0123456789abcdef:x:1:h:a",
        ] {
            let holder = Holder::parse(owner.to_owned(), None);
            assert_eq!(holder.owner, owner);
            assert_eq!((holder.app, holder.pid, holder.since), (None, None, None));
        }
    }

    #[test]
    fn names_are_sanitized_and_bounded_never_refused() {
        assert_eq!(sanitize("web-1.example", 64), "web-1.example");
        assert_eq!(sanitize("a:b c/ü", 64), "a_b_c__");
        assert_eq!(sanitize("   ", 64), "unknown");
        assert_eq!(sanitize(&"x".repeat(500), MAX_APP_LEN).len(), MAX_APP_LEN);
    }

    #[test]
    fn listed_names_come_back_from_lock_keys_of_both_forms_and_not_from_companions() {
        for name in ["order:42", "a}b", "}x", "{}", "}:fence"] {
            let key = LockKey::new("p:", name.to_owned()).unwrap();
            assert_eq!(
                name_of("p:", &key.lock).as_deref(),
                Some(name),
                "{}",
                key.lock
            );
            assert_eq!(name_of("p:", &key.fence()), None, "{}", key.fence());
            assert_eq!(name_of("p:", &key.writer_waiting()), None);
        }
        assert_eq!(scan_patterns("p*:", "order:*"), vec!["p\\*:{order:*}"]);
        assert_eq!(scan_patterns("p:", "*").len(), 2);
    }

    #[test]
    fn the_in_process_glob_matches_as_redis_does() {
        let yes = |p: &str, t: &str| glob_matches(p.as_bytes(), t.as_bytes());
        assert!(yes("p:{order:*}", "p:{order:42}"));
        assert!(!yes("p:{order:*}", "p:{order:42}:fence"));
        assert!(yes("a?c", "abc") && !yes("a?c", "ac"));
        assert!(yes("[a-c]x", "bx") && !yes("[^a-c]x", "bx") && yes("[^a-c]x", "dx"));
        assert!(yes("p\\*", "p*") && !yes("p\\*", "pq"));
        assert!(yes("*", "") && yes("**x", "abx"));
    }
}

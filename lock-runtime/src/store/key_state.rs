//! A key's state as a store without scripts keeps it in its own form (a PostgreSQL row's
//! `jsonb`, an etcd key's value): the kinds' [`TwinEntry`] and an election's leader record
//! ([`KeyState`]), as JSON ([`encode`], [`decode`]), its times in microseconds on a clock the
//! store names — PostgreSQL's (`clock_timestamp()` of the statement that read it), etcd's
//! writer's — read into the twins' [`Instant`]s through the [`Timeline`] of the read and
//! written back through the same one. Also what a change of a key's state announces to waiters
//! ([`announcements`]). Neighbours: `postgres.rs` and `etcd.rs` load states, run the twins on
//! them and write the changed ones back; the twins (`kind/`) never see a store.
//!
//! The layout, kept short because it travels in every statement:
//! `{"w": [owner, until], "r": {owner: until}, "ww": until, "p": {"n": count, "h": {owner:
//! until}}, "q": {waiter: [ticket, deadline]}, "rec": {"e": epoch, "o": owner, "v": hex,
//! "rv": revision}}`, each part absent when empty. `docs/postgres.md` and `docs/etcd.md` show
//! it to operators.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::kind::fair::{FairQueue, WAKE_PREFIX};
use crate::kind::semaphore::Permits;
use crate::kind::TwinEntry;
use crate::protocol::{RawRecord, PROCLAIMED_PREFIX};

/// A store's clock as one read saw it (microseconds since the Unix epoch: PostgreSQL's
/// `clock_timestamp()`, the etcd store's own wall clock) beside the process' [`Instant`] when
/// its answer came: the twins run at that instant, and every time of a state maps through the
/// pair. A time read this way is at most as
/// late as the database's at the write that follows, so a lease written from it ends no later
/// than the database would say (the holder's own deadline starts before the read was sent).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeline {
    pub(crate) db_micros: i64,
    pub(crate) now: Instant,
}

impl Timeline {
    /// The instant of a database time.
    pub(crate) fn instant(&self, micros: i64) -> Instant {
        let offset = Duration::from_micros(micros.abs_diff(self.db_micros));
        if micros >= self.db_micros {
            self.now.checked_add(offset).unwrap_or(self.now)
        } else {
            // Before the process' clock began: long past, as good as now for "expired".
            self.now.checked_sub(offset).unwrap_or(self.now)
        }
    }

    /// The database time of an instant.
    pub(crate) fn micros(&self, at: Instant) -> i64 {
        let since = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        if at >= self.now {
            self.db_micros.saturating_add(since(at - self.now))
        } else {
            self.db_micros.saturating_sub(since(self.now - at))
        }
    }
}

/// One key's state: the kinds' entry and the leader record kept beside it.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyState {
    pub(crate) entry: TwinEntry,
    pub(crate) record: Option<RawRecord>,
}

impl KeyState {
    /// Nothing in it: the row may go.
    pub(crate) fn is_empty(&self) -> bool {
        self.entry.is_empty() && self.record.is_none()
    }

    /// The latest time anything in it runs out (`None`: a record, kept until replaced).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn expires(&self) -> Option<Instant> {
        if self.record.is_some() {
            return None;
        }
        let entry = &self.entry;
        entry
            .writer
            .iter()
            .map(|(_, until)| *until)
            .chain(entry.readers.values().copied())
            .chain(entry.writer_waiting)
            .chain(
                entry
                    .permits
                    .iter()
                    .flat_map(|p| p.holders.values().copied()),
            )
            .chain(
                entry
                    .queue
                    .iter()
                    .flat_map(|q| q.waiters().map(|(_, _, deadline)| deadline)),
            )
            .max()
    }
}

fn holders(map: &HashMap<String, Instant>, time: &Timeline) -> Value {
    Value::Object(
        map.iter()
            .map(|(owner, &until)| (owner.clone(), json!(time.micros(until))))
            .collect(),
    )
}

/// The row's `jsonb` of a key's state.
pub(crate) fn encode(state: &KeyState, time: &Timeline) -> Value {
    let entry = &state.entry;
    let mut row = Map::new();
    if let Some((owner, until)) = &entry.writer {
        row.insert("w".into(), json!([owner, time.micros(*until)]));
    }
    if !entry.readers.is_empty() {
        row.insert("r".into(), holders(&entry.readers, time));
    }
    if let Some(until) = entry.writer_waiting {
        row.insert("ww".into(), json!(time.micros(until)));
    }
    if let Some(permits) = &entry.permits {
        row.insert(
            "p".into(),
            json!({"n": permits.count, "h": holders(&permits.holders, time)}),
        );
    }
    if let Some(queue) = &entry.queue {
        let waiters: Map<String, Value> = queue
            .waiters()
            .map(|(waiter, ticket, deadline)| {
                (waiter.to_owned(), json!([ticket, time.micros(deadline)]))
            })
            .collect();
        row.insert("q".into(), Value::Object(waiters));
    }
    if let Some(record) = &state.record {
        row.insert(
            "rec".into(),
            json!({
                "e": record.epoch,
                "o": record.owner,
                "v": record.value.as_deref().map(hex),
                "rv": record.revision,
            }),
        );
    }
    Value::Object(row)
}

/// Why a row's `jsonb` is not a key's state: the row is not the library's (a table of the same
/// name written by someone else, or a newer layout).
#[derive(Debug)]
pub(crate) struct NotAState(pub(crate) String);

/// The key's state in a row's `jsonb`.
pub(crate) fn decode(row: &Value, time: &Timeline) -> Result<KeyState, NotAState> {
    let fail = |what: &str| NotAState(format!("{what} in {row}"));
    let object = row.as_object().ok_or_else(|| fail("not an object"))?;
    let at = |value: &Value, what: &str| {
        value
            .as_i64()
            .map(|micros| time.instant(micros))
            .ok_or_else(|| fail(what))
    };
    let holders = |value: &Value, what: &str| -> Result<HashMap<String, Instant>, NotAState> {
        value
            .as_object()
            .ok_or_else(|| fail(what))?
            .iter()
            .map(|(owner, until)| Ok((owner.clone(), at(until, what)?)))
            .collect()
    };
    let mut state = KeyState::default();
    for (field, value) in object {
        match field.as_str() {
            "w" => {
                let pair = value.as_array().filter(|pair| pair.len() == 2);
                let pair = pair.ok_or_else(|| fail("a writer that is not [owner, until]"))?;
                let owner = pair[0].as_str().ok_or_else(|| fail("a writer's owner"))?;
                state.entry.writer = Some((owner.to_owned(), at(&pair[1], "a writer's lease")?));
            }
            "r" => state.entry.readers = holders(value, "readers")?,
            "ww" => state.entry.writer_waiting = Some(at(value, "a writer-waiting mark")?),
            "p" => {
                let count = value
                    .get("n")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| fail("a semaphore's count"))?;
                let holders = holders(value.get("h").unwrap_or(&Value::Null), "permits")?;
                state.entry.permits = Some(Permits { count, holders });
            }
            "q" => {
                let waiters = value
                    .as_object()
                    .ok_or_else(|| fail("a queue"))?
                    .iter()
                    .map(|(waiter, seat)| {
                        let seat = seat.as_array().filter(|seat| seat.len() == 2);
                        let seat = seat.ok_or_else(|| fail("a queue seat"))?;
                        let ticket = seat[0].as_u64().ok_or_else(|| fail("a ticket"))?;
                        Ok((waiter.clone(), ticket, at(&seat[1], "a seat's deadline")?))
                    })
                    .collect::<Result<Vec<_>, NotAState>>()?;
                state.entry.queue = Some(FairQueue::from_waiters(waiters));
            }
            "rec" => {
                let epoch = value.get("e").and_then(Value::as_u64);
                let owner = value.get("o").and_then(Value::as_str);
                let revision = value.get("rv").and_then(Value::as_u64);
                let (Some(epoch), Some(owner), Some(revision)) = (epoch, owner, revision) else {
                    return Err(fail("a leader record"));
                };
                let value = match value.get("v") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(hex)) => {
                        Some(unhex(hex).ok_or_else(|| fail("a leader record's value"))?)
                    }
                    Some(_) => return Err(fail("a leader record's value")),
                };
                state.record = Some(RawRecord {
                    epoch,
                    owner: owner.to_owned(),
                    value,
                    revision,
                });
            }
            _ => return Err(fail(&format!("an unknown field `{field}`"))),
        }
    }
    Ok(state)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What a change of a key's state announces on its release channel, as the scripts publish
/// it (`kind/wake_rule.rs` reads it): a release when a holder is gone, the queue's head by name
/// when the queue has one and it changed or a holder left, and a new leader's record. A
/// holder that expired counts as gone: its waiters learn it at once.
pub(crate) fn announcements(before: &KeyState, after: &KeyState) -> Vec<String> {
    let mut out = Vec::new();
    let holders = |entry: &TwinEntry| -> Vec<String> {
        let mut all: Vec<String> = entry
            .writer
            .iter()
            .map(|(owner, _)| owner.clone())
            .chain(entry.readers.keys().cloned())
            .chain(entry.permits.iter().flat_map(|p| p.holders.keys().cloned()))
            .collect();
        all.sort_unstable();
        all
    };
    let (was, is) = (holders(&before.entry), holders(&after.entry));
    let released = was.iter().any(|owner| is.binary_search(owner).is_err());
    if released {
        out.push(String::new());
    }
    let head = |state: &KeyState| -> Option<String> {
        state
            .entry
            .queue
            .as_ref()
            .and_then(|queue| queue.first().map(str::to_owned))
    };
    if let Some(new_head) = head(after) {
        if released || head(before).as_ref() != Some(&new_head) {
            let prefix = String::from_utf8_lossy(WAKE_PREFIX);
            out.push(format!("{prefix}{new_head}"));
        }
    }
    if let Some(record) = &after.record {
        let changed = before
            .record
            .as_ref()
            .is_none_or(|old| (old.epoch, old.revision) != (record.epoch, record.revision));
        if changed {
            let prefix = String::from_utf8_lossy(PROCLAIMED_PREFIX);
            out.push(format!("{prefix}{}", record.epoch));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline() -> Timeline {
        Timeline {
            db_micros: 1_700_000_000_000_000,
            now: Instant::now(),
        }
    }

    #[test]
    fn a_state_reads_back_as_it_was_written() {
        let time = timeline();
        let later = time.now + Duration::from_secs(3);
        let mut state = KeyState::default();
        state.entry.writer = Some(("owner-a".into(), later));
        state.entry.readers.insert("reader".into(), later);
        state.entry.writer_waiting = Some(later);
        state.entry.permits = Some(Permits {
            count: 3,
            holders: HashMap::from([("p".to_owned(), later)]),
        });
        state.entry.queue = Some(FairQueue::from_waiters([("w1".to_owned(), 7, later)]));
        state.record = Some(RawRecord {
            epoch: 9,
            owner: "owner-a".into(),
            value: Some(vec![0, 1, 255]),
            revision: 2,
        });
        let json = encode(&state, &time);
        let back = decode(&json, &time).expect("decodes");
        assert_eq!(encode(&back, &time), json);
        assert_eq!(back.record, state.record);
        assert_eq!(
            back.entry.writer.as_ref().map(|w| time.micros(w.1)),
            Some(time.db_micros + 3_000_000)
        );
    }

    #[test]
    fn a_row_of_another_shape_is_refused() {
        let time = timeline();
        for row in [json!([1]), json!({"w": "x"}), json!({"zz": 1})] {
            assert!(decode(&row, &time).is_err(), "{row} was read as a state");
        }
    }

    #[test]
    fn a_release_announces_and_a_refused_try_does_not() {
        let time = timeline();
        let mut before = KeyState::default();
        before.entry.writer = Some(("a".into(), time.now + Duration::from_secs(1)));
        let after = KeyState::default();
        assert_eq!(announcements(&before, &after), vec![String::new()]);
        let mut marked = KeyState::default();
        marked.entry.writer = before.entry.writer.clone();
        marked.entry.writer_waiting = Some(time.now);
        assert!(announcements(&before, &marked).is_empty());
    }
}

//! Where the etcd store keeps a lock: the etcd keys of one lock key and how they are named.
//! A lock key (`{prefix}{{name}}`, `protocol.rs`) becomes a directory of its own: its `/`
//! and `%` escaped, so that no other lock's keys share it, then `/`, then `s` (the lock's
//! bookkeeping: the kinds' state but its holders as JSON, `key_state.rs`: the fair queue, the
//! writer-waiting mark, an election's record) and `h/<side>/<owner>` (one key per grant, on the
//! grant's etcd lease, whose create revision is the grant's fencing token; the side `w`, `r` or
//! `p` — writer, reader, permit — so that a grant's transaction can watch the sides it excludes
//! alone). A permit's key is its seat, `h/p/<n>` for `n` below the semaphore's count (its owner
//! in its value): a key can be created only where none is, so two permits taken at once in
//! different seats need not wait for each other, and no more than the count can exist.
//! Neighbours: `etcd.rs` reads and writes these keys; `watcher.rs` reads them back from
//! events.

use crate::kind::HolderSlot;

/// `lock` with `%` and `/` escaped: a path segment no other lock key escapes to.
pub(super) fn escape(lock: &str) -> String {
    let mut out = String::with_capacity(lock.len());
    for c in lock.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The lock key an escaped segment names.
pub(super) fn unescape(segment: &str) -> String {
    segment.replace("%2F", "/").replace("%25", "%")
}

/// Every etcd key of `lock` starts with this.
pub(super) fn directory(lock: &str) -> String {
    format!("{}/", escape(lock))
}

/// The lock's bookkeeping: the kinds' state as JSON.
pub(super) fn state_key(lock: &str) -> String {
    format!("{}/s", escape(lock))
}

/// What comes after a lock's directory in a grant's key.
pub(super) const HOLDER: &str = "h/";

/// The side of a grant in `slot`, as its key names it.
pub(super) fn side(slot: HolderSlot) -> char {
    match slot {
        HolderSlot::Writer => 'w',
        HolderSlot::Reader => 'r',
        HolderSlot::Permit => 'p',
    }
}

/// The key of `owner`'s grant on `side` (`w`, `r`, `p`).
pub(super) fn holder_key(lock: &str, side: char, owner: &str) -> String {
    format!("{}/{HOLDER}{side}/{owner}", escape(lock))
}

/// The key of seat `seat` of `lock`'s semaphore.
pub(super) fn permit_key(lock: &str, seat: u32) -> String {
    format!("{}/{HOLDER}p/{seat}", escape(lock))
}

/// The seat a permit's key names.
pub(super) fn seat_of(key: &str) -> Option<u32> {
    key.rsplit_once('/')?.1.parse().ok()
}

/// The start of the keys of `lock`'s grants: all of them, or those of one side.
pub(super) fn holders_of(lock: &str, side: Option<char>) -> String {
    match side {
        Some(side) => format!("{}/{HOLDER}{side}/", escape(lock)),
        None => format!("{}/{HOLDER}", escape(lock)),
    }
}

/// The end of the range of every key that starts with `prefix` (etcd's prefix range: the
/// prefix with its last byte raised; `\0` — every key — for an empty one).
pub(super) fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What an etcd key of the store is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Part<'a> {
    /// A lock's bookkeeping.
    State,
    /// A grant: its side (`w`, `r`, `p`) and its owner (a permit: its seat).
    Holder(char, &'a str),
}

/// The lock key and the part an etcd key of the store names; `None` for any other key.
pub(super) fn parse(key: &str) -> Option<(String, Part<'_>)> {
    let (segment, rest) = key.split_once('/')?;
    let part = match rest {
        "s" => Part::State,
        _ => {
            let (side, owner) = rest.strip_prefix(HOLDER)?.split_once('/')?;
            let side = match side {
                "w" => 'w',
                "r" => 'r',
                "p" => 'p',
                _ => return None,
            };
            Part::Holder(side, owner)
        }
    };
    Some((unescape(segment), part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_owns_its_directory_whatever_it_holds() {
        let a = directory("distlock:{a}");
        let b = state_key("distlock:{a}/h/x}");
        assert!(!b.starts_with(&a), "{b} is inside {a}");
        assert_eq!(
            parse(&holder_key("p:{a/%b}", 'r', "o-1")),
            Some(("p:{a/%b}".to_owned(), Part::Holder('r', "o-1")))
        );
        assert_eq!(
            parse(&state_key("p:{50%/}")),
            Some(("p:{50%/}".to_owned(), Part::State))
        );
        assert_eq!(parse("unrelated"), None);
        assert_eq!(parse("a/h/x/o"), None);
        assert!(holder_key("l", 'w', "o").starts_with(&holders_of("l", Some('w'))));
        assert!(holders_of("l", Some('p')).starts_with(&holders_of("l", None)));
        assert_eq!(range_end("ab"), b"ac".to_vec());
        assert_eq!(range_end(""), vec![0]);
    }
}

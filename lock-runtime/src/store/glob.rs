//! Redis' glob (`SCAN … MATCH`, `KEYS`), for the stores that have no Redis server to ask:
//! the in-process store (`memory.rs`) lists its keys with it, as an engine without Redis will.
//! The patterns themselves are made by the operator's listing (`inspect.rs`).

/// Whether `text` matches the Redis glob `pattern` (`*`, `?`, `[abc]`, `[^a-z]`, `\\x`), as
/// `SCAN … MATCH` decides it. Linear
/// backtracking to the last `*` only, so no pattern makes it exponential.
pub(crate) fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // After the last `*` seen: where the pattern goes on, and how much of the text it took.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pattern.get(p) == Some(&b'*') {
            p += 1;
            star = Some((p, t));
            continue;
        }
        if t == text.len() && p == pattern.len() {
            return true;
        }
        let step = match (pattern.get(p..), text.get(t)) {
            (Some(rest), Some(&c)) if !rest.is_empty() => match_one(rest, c),
            _ => None,
        };
        match step {
            Some(used) => {
                p += used;
                t += 1;
            }
            None => match star {
                // The last `*` takes one more character, and the rest is tried again.
                Some((after, taken)) if taken < text.len() => {
                    star = Some((after, taken + 1));
                    p = after;
                    t = taken + 1;
                }
                _ => return false,
            },
        }
    }
}

/// Whether the first element of `pattern` (not `*`) matches `c`: how many pattern bytes it
/// took, or `None`.
fn match_one(pattern: &[u8], c: u8) -> Option<usize> {
    let (&first, rest) = pattern.split_first()?;
    let (matched, used) = match first {
        b'?' => (true, 1),
        b'\\' if !rest.is_empty() => (rest[0] == c, 2),
        b'[' => match rest.iter().position(|&b| b == b']') {
            Some(end) => {
                let class = &rest[..end];
                let (negated, class) = match class.split_first() {
                    Some((b'^', class)) => (true, class),
                    _ => (false, class),
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == b'-' {
                        let (lo, hi) = (class[i].min(class[i + 2]), class[i].max(class[i + 2]));
                        hit |= (lo..=hi).contains(&c);
                        i += 3;
                    } else {
                        hit |= class[i] == c;
                        i += 1;
                    }
                }
                (hit != negated, end + 2)
            }
            None => (first == c, 1),
        },
        _ => (first == c, 1),
    };
    matched.then_some(used)
}

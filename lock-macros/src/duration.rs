//! Durations written as `250ms`, `15s`, `2m`, `1h` or compounds like `1m30s`, parsed at compile
//! time into milliseconds.

/// The grammar, for error messages.
pub(crate) const EXPECTED: &str = "expected a duration like `250ms`, `15s`, `2m`, `1h` or `1m30s`";

/// Parses `text` into milliseconds, or says what is wrong.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!("empty duration; {EXPECTED}"));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    let mut last_unit_rank = u8::MAX;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("`{text}`: a number must come first; {EXPECTED}"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}`: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, after) = rest.split_at(unit_len);
        let (scale, rank) = match unit {
            "h" => (3_600_000, 4),
            "m" => (60_000, 3),
            "s" => (1_000, 2),
            "ms" => (1, 1),
            "" => {
                return Err(format!(
                    "`{text}`: missing unit after `{number}`; {EXPECTED}"
                ))
            }
            other => return Err(format!("`{text}`: unknown unit `{other}`; {EXPECTED}")),
        };
        if rank >= last_unit_rank {
            return Err(format!(
                "`{text}`: units must go from larger to smaller, each once; {EXPECTED}"
            ));
        }
        last_unit_rank = rank;
        total = number
            .checked_mul(scale)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("`{text}`: duration too large"))?;
        rest = after;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("15s"), Ok(15_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn rejects_everything_else_with_the_grammar() {
        for bad in [
            "", "15", "s", "1.5s", "15 s", "10d", "1s1m", "1s1s", "-1s", "ms",
        ] {
            let err = parse_millis(bad).unwrap_err();
            assert!(
                err.contains("expected a duration") || err.contains("too large"),
                "{bad}: {err}"
            );
        }
        assert!(parse_millis("99999999999999999999h").is_err());
        assert!(parse_millis("6000000000000h").is_err()); // 2.16e19 ms > u64::MAX
    }
}

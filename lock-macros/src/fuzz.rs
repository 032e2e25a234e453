//! A short fuzz run (proptest) of the attribute's literal parsers: the duration grammar
//! (`duration::parse_millis`), the key-template scanner (`key::scan`) and the walk over a fn's
//! parameters (`key::parameter_names`). Each is fed arbitrary strings and strings from a small
//! grammar of the pieces they care about; none may panic, and what they accept must mean what
//! the documentation says.
//!
//! The default run is 2,000 cases per property (a few seconds). For a longer run:
//!
//! ```text
//! PROPTEST_CASES=200000 cargo test -p lock-macros --lib fuzz --release
//! ```
//!
//! (`PROPTEST_CASES` overrides the case count below; a failure is shrunk to a minimal input and
//! saved under `lock-macros/proptest-regressions/` to be replayed first on the next run.)

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

use crate::duration::parse_millis;
use crate::key::{parameter_names, scan, Template};

/// 2,000 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases)
    }
}

fn scanned(text: &str) -> syn::Result<Template> {
    scan(&syn::LitStr::new(text, proc_macro2::Span::call_site()))
}

/// Reads a `format!` string: its literal text (`{{` → `{`, `}}` → `}`) and how many `{}` it
/// takes, or `None` when a brace is neither doubled nor part of a `{}` (`format!` would reject
/// it).
fn read_format(format: &str) -> Option<(String, usize)> {
    let mut text = String::new();
    let mut count = 0;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('{', Some('{')) | ('}', Some('}')) => {
                text.push(c);
                chars.next();
            }
            ('{', Some('}')) => {
                count += 1;
                chars.next();
            }
            ('{' | '}', _) => return None,
            _ => text.push(c),
        }
    }
    Some((text, count))
}

/// Pieces a duration is made of, and pieces that are almost right.
fn duration_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..100_000, prop_oneof![Just("h"), Just("m"), Just("s"), Just("ms")])
            .prop_map(|(n, unit)| format!("{n}{unit}")),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => "[0-9]{15,25}",
        1 => prop_oneof![
            Just("ms"), Just("s"), Just("m"), Just("h"), Just("d"), Just("us"), Just("µs"),
            Just(" "), Just("."), Just("-"), Just("+"), Just("_"), Just("½"), Just("٣"),
            Just("１"), Just("\u{0}"), Just("é"), Just("MS"),
        ]
        .prop_map(str::to_owned),
    ]
}

/// Pieces a key template is made of: text (also unicode), braces, placeholders good and bad.
fn template_piece() -> impl Strategy<Value = String> {
    let ident = prop_oneof![
        "[a-z_][a-z0-9_]{0,6}",
        Just("self".to_owned()),
        Just("Self".to_owned()),
        Just("type".to_owned()),
        Just("r#type".to_owned()),
        Just("r#self".to_owned()),
        Just("r#r#x".to_owned()),
        Just("_".to_owned()),
        Just("é".to_owned()),
        Just("名前".to_owned()),
        Just("0".to_owned()),
        Just("99999999999".to_owned()),
        Just("".to_owned()),
        Just(" id ".to_owned()),
        Just("a½".to_owned()),
    ];
    let path = prop::collection::vec(ident, 1..4).prop_map(|parts| parts.join("."));
    prop_oneof![
        3 => "[a-z:/ -]{1,5}",
        2 => path.clone().prop_map(|p| format!("{{{p}}}")),
        1 => path,
        1 => prop_oneof![
            Just("{"), Just("}"), Just("{{"), Just("}}"), Just("{}"), Just("}{"), Just("."),
            Just("ключ"), Just("🔒"), Just("שלום"), Just("\u{0}"), Just("\n"), Just("\t"),
            Just("r#"), Just("\u{200d}"), Just("e\u{301}"),
        ]
        .prop_map(str::to_owned),
    ]
}

/// Fn signatures built from patterns and receivers, some of them odd, and whether the
/// signature has a receiver.
fn signature() -> impl Strategy<Value = (bool, String)> {
    let pattern = prop_oneof![
        "v_[a-z0-9_]{0,5}",
        Just("_".to_owned()),
        Just("mut m".to_owned()),
        Just("ref r".to_owned()),
        Just("(a, b)".to_owned()),
        Just("(a, (b, _))".to_owned()),
        Just("Path(id)".to_owned()),
        Just("S { x, y: z, .. }".to_owned()),
        Just("[f, .., l]".to_owned()),
        Just("&(p, q)".to_owned()),
        Just("whole @ (u, v)".to_owned()),
        Just("r#type".to_owned()),
        Just("é".to_owned()),
    ];
    let receiver = prop_oneof![
        Just(""),
        Just("self, "),
        Just("&self, "),
        Just("&mut self, "),
        Just("self: Arc<Self>, "),
        Just("mut self, "),
    ];
    (receiver, prop::collection::vec(pattern, 0..4)).prop_map(|(receiver, patterns)| {
        let params: Vec<String> = patterns.iter().map(|p| format!("{p}: T")).collect();
        (
            !receiver.is_empty(),
            format!("async fn f({receiver}{}) -> R", params.join(", ")),
        )
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn parse_millis_never_panics_on_any_string(text in any::<String>()) {
        let _ = parse_millis(&text);
    }

    #[test]
    fn parse_millis_never_panics_on_grammar_pieces(
        pieces in prop::collection::vec(duration_piece(), 0..6),
    ) {
        let text = pieces.concat();
        if let Err(message) = parse_millis(&text) {
            prop_assert!(!message.is_empty());
            prop_assert!(
                message.contains("expected a duration") || message.contains("too large"),
                "{text:?}: {message}"
            );
        }
    }

    #[test]
    fn parse_millis_reads_each_unit_exactly(n in 0u64..=u64::MAX / 3_600_000) {
        prop_assert_eq!(parse_millis(&format!("{n}ms")), Ok(n));
        prop_assert_eq!(parse_millis(&format!("{n}s")), Ok(n * 1_000));
        prop_assert_eq!(parse_millis(&format!("{n}m")), Ok(n * 60_000));
        prop_assert_eq!(parse_millis(&format!("{n}h")), Ok(n * 3_600_000));
    }

    #[test]
    fn parse_millis_of_any_ms_count_is_that_count(n in any::<u64>()) {
        prop_assert_eq!(parse_millis(&format!("{n}ms")), Ok(n));
        // Leading zeros do not count against the size of the number.
        prop_assert_eq!(parse_millis(&format!("{n:0>30}ms")), Ok(n));
    }

    #[test]
    fn parse_millis_adds_compound_units(
        h in 0u64..10_000, m in 0u64..10_000, s in 0u64..10_000, ms in 0u64..10_000,
        use_h: bool, use_m: bool, use_s: bool, use_ms: bool,
    ) {
        let mut text = String::new();
        let mut expected = 0;
        for (used, n, unit, scale) in [
            (use_h, h, "h", 3_600_000),
            (use_m, m, "m", 60_000),
            (use_s, s, "s", 1_000),
            (use_ms, ms, "ms", 1),
        ] {
            if used {
                text.push_str(&format!("{n}{unit}"));
                expected += n * scale;
            }
        }
        if text.is_empty() {
            prop_assert!(parse_millis(&text).is_err());
        } else {
            prop_assert_eq!(parse_millis(&text), Ok(expected), "{}", text);
        }
    }

    #[test]
    fn parse_millis_rejects_units_out_of_order_or_repeated(
        a in 0u64..1000, b in 0u64..1000,
        (first, second) in (0usize..4).prop_flat_map(|first| (Just(first), first..4)),
    ) {
        let units = ["ms", "s", "m", "h"]; // smallest first
        let text = format!("{a}{}{b}{}", units[first], units[second]);
        prop_assert!(parse_millis(&text).is_err(), "{text}");
    }

    #[test]
    fn scan_never_panics_on_any_string(text in any::<String>()) {
        check_scan(&text)?;
    }

    #[test]
    fn scan_never_panics_on_template_pieces(
        pieces in prop::collection::vec(template_piece(), 0..8),
    ) {
        check_scan(&pieces.concat())?;
    }

    #[test]
    fn text_without_braces_scans_to_itself(text in "[^{}]{1,40}") {
        let template = scanned(&text).expect("no braces, nothing to reject");
        prop_assert_eq!(&template.format, &text);
        prop_assert!(template.placeholders.is_empty());
    }

    #[test]
    fn doubled_braces_are_literal_braces(
        parts in prop::collection::vec(
            prop_oneof![Just("{{"), Just("}}"), Just("x"), Just("ключ"), Just(" ")], 1..12,
        ),
    ) {
        let text = parts.concat();
        let template = scanned(&text).expect("only escaped braces");
        prop_assert_eq!(&template.format, &text);
        prop_assert!(template.placeholders.is_empty());
    }

    #[test]
    fn well_formed_placeholders_are_found_in_order(
        roots in prop::collection::vec("[a-z][a-z0-9_]{0,6}", 1..5),
        seps in prop::collection::vec("[a-z:/ -]{0,4}", 5),
    ) {
        // Keywords are allowed too (resolved as raw identifiers), except the path roots.
        prop_assume!(roots.iter().all(|r| !matches!(r.as_str(), "crate" | "super")));
        let mut text = seps[0].clone();
        for (root, sep) in roots.iter().zip(&seps[1..]) {
            text.push_str(&format!("{{{root}}}{sep}"));
        }
        let template = scanned(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let found: Vec<&str> = template.placeholders.iter().map(|p| p.root.as_str()).collect();
        prop_assert_eq!(found, roots.iter().map(String::as_str).collect::<Vec<_>>());
        prop_assert_eq!(
            read_format(&template.format),
            Some((seps[..=roots.len()].concat(), roots.len()))
        );
    }

    #[test]
    fn parameter_names_never_panics_and_finds_plain_names((has_receiver, sig) in signature()) {
        let parsed: syn::Signature = syn::parse_str(&sig).unwrap_or_else(|e| panic!("{sig}: {e}"));
        let names: Vec<String> = parameter_names(&parsed).iter().map(|i| i.to_string()).collect();
        prop_assert_eq!(names.contains(&"self".to_owned()), has_receiver, "{}", sig);
        for param in parsed.inputs.iter() {
            if let syn::FnArg::Typed(typed) = param {
                if let syn::Pat::Ident(ident) = &*typed.pat {
                    prop_assert!(names.contains(&ident.ident.to_string()), "{sig}: {names:?}");
                }
            }
        }
        prop_assert!(!names.iter().any(|n| n == "_" || n == "S" || n == "Path"), "{sig}: {names:?}");
    }
}

/// No panic; on success the format string takes exactly one argument per placeholder and keeps
/// the template's literal text; on failure the message points the user at the grammar.
fn check_scan(text: &str) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| scanned(text));
    let Ok(outcome) = outcome else {
        return Err(TestCaseError::fail(format!("scan panicked on {text:?}")));
    };
    match outcome {
        Ok(template) => {
            let read = read_format(&template.format);
            prop_assert!(
                read.is_some(),
                "{:?} scanned to {:?}, which `format!` rejects",
                text,
                template.format
            );
            let (literal, count) = read.unwrap_or_default();
            prop_assert_eq!(count, template.placeholders.len(), "{:?}", text);
            // Every placeholder's text is gone and the rest is kept.
            prop_assert_eq!(literal, literal_text_of_template(text), "{:?}", text);
            for placeholder in &template.placeholders {
                prop_assert!(!placeholder.root.is_empty(), "{:?}", text);
                prop_assert!(!placeholder.root.starts_with("r#"), "{:?}", text);
            }
        }
        Err(err) => {
            let message = err.to_string();
            prop_assert!(
                message.contains("for literal braces") || message.contains("must not be empty"),
                "{:?}: {}",
                text,
                message
            );
        }
    }
    Ok(())
}

/// The literal text of a template the scanner accepted: `{{` → `{`, `}}` → `}`, placeholders
/// (a lone `{` up to the next `}`) dropped.
fn literal_text_of_template(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['{', '}']) {
        out.push_str(&rest[..at]);
        let brace = &rest[at..at + 1];
        let after = &rest[at + 1..];
        if after.starts_with(brace) {
            out.push_str(brace);
            rest = &after[1..];
        } else {
            let end = after.find('}').map_or(after.len(), |e| e + 1);
            rest = &after[end..];
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn the_grammar_helpers_agree_with_hand_made_cases() {
    assert_eq!(read_format("a{}b{{c}}{}"), Some(("ab{c}".to_owned(), 2)));
    assert_eq!(read_format("{}}}"), Some(("}".to_owned(), 1)));
    assert_eq!(read_format("{"), None);
    assert_eq!(read_format("}{"), None);
    assert_eq!(literal_text_of_template("a{x}b{{c}}"), "ab{c}");
    assert_eq!(literal_text_of_template("{type}}}"), "}");
}

/// Placeholder parts that `syn::parse_str::<Ident>` accepts only after skipping whitespace or
/// a comment, or that stay raw after one `r#` is stripped, are errors (they once made
/// `Ident::new` panic inside the attribute).
#[test]
fn placeholder_parts_that_syn_accepts_loosely_are_errors() {
    for template in [
        "{a .b}",
        "{a. b}",
        "{a\t.b}",
        "{a//c}",
        "{a/*x*/}",
        "{a.b/**/}",
        "{r#r#x}",
        "{a.r#r#x}",
    ] {
        let outcome = std::panic::catch_unwind(|| scanned(template).is_ok());
        assert_eq!(outcome.ok(), Some(false), "{template:?}");
    }
    // Whitespace around the whole placeholder is trimmed first.
    assert!(scanned("{ a }").is_ok());
    assert!(scanned("{a.b }").is_ok());
}

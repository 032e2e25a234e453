//! The promise ledger (`docs/promises.md`) names the test behind each promise the docs make;
//! this module fails when a named test does not exist, so a renamed or deleted test cannot
//! leave a promise looking checked. A reference is `` `path::fn` `` (a file from the
//! repository root, then the test fn's name as written there). It exists when the file has
//! `fn name(` (or `fn name<`) and the fn is a test: a test attribute sits above it, or the
//! name is used elsewhere in the file outside a comment and not as a call — a conformance
//! macro's list (`on_every_store!(name, …)`) or a harness-less binary's scenario table. In
//! `tests/crash.rs` and `tests/torture.rs` (`harness = false`, they have a `fn main`) the
//! scenario's name must also be in its table as a string, `"name"`. No server needed.

use std::path::Path;

/// The ledger, from the repository root.
const LEDGER: &str = "docs/promises.md";

/// A test reference in the ledger: the file and the fn.
#[derive(Debug, PartialEq)]
struct TestRef {
    path: String,
    name: String,
}

/// Every `` `path.rs::name` `` span in `text`, in order, duplicates kept.
fn test_refs(text: &str) -> Vec<TestRef> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (path, name) = span.split_once("::")?;
            let is_ident = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            (path.ends_with(".rs") && !path.contains(' ') && is_ident).then(|| TestRef {
                path: path.to_owned(),
                name: name.to_owned(),
            })
        })
        .collect()
}

/// Whether `c` can be part of a Rust identifier.
fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The byte offsets where `name` occurs in `line` as a whole identifier.
fn occurrences(line: &str, name: &str) -> Vec<usize> {
    line.match_indices(name)
        .map(|(at, _)| at)
        .filter(|&at| {
            let before = line[..at].chars().next_back();
            let after = line[at + name.len()..].chars().next();
            !before.is_some_and(ident_char) && !after.is_some_and(ident_char)
        })
        .collect()
}

/// Why `name` is not a test in `source` (the text of the file), or `None` when it is one.
fn missing_reason(source: &str, name: &str, harnessless: bool) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let defined_at = lines.iter().position(|line| {
        let code = line.trim_start();
        let code = code.strip_prefix("pub ").unwrap_or(code);
        let code = code.strip_prefix("async ").unwrap_or(code);
        code.strip_prefix("fn ")
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with('(') || rest.starts_with('<'))
    });
    let Some(defined_at) = defined_at else {
        return Some(format!("no `fn {name}(` in the file"));
    };
    // A test attribute above it, past its doc comments and other attributes.
    let attributed = lines[..defined_at]
        .iter()
        .rev()
        .map(|line| line.trim())
        .take_while(|line| line.starts_with("#[") || line.starts_with("///"))
        .any(|line| line.starts_with("#[test]") || line.starts_with("#[tokio::test"));
    // Used outside a comment, not as a call: a macro's list or a scenario table.
    let listed = lines.iter().enumerate().any(|(at, line)| {
        at != defined_at
            && !line.trim_start().starts_with("//")
            && occurrences(line, name).into_iter().any(|start| {
                let rest = line[start + name.len()..].trim_start();
                !rest.starts_with('(') && !rest.starts_with('<') && !rest.starts_with("::")
            })
    });
    if !attributed && !listed {
        return Some(format!(
            "`fn {name}` is no test: no test attribute above it, and no macro list or \
             scenario table names it"
        ));
    }
    if harnessless && !source.contains(&format!("\"{name}\"")) {
        return Some(format!(
            "scenario `{name}` is not in the binary's scenario table (`\"{name}\"`)"
        ));
    }
    None
}

/// Every reference in `ledger` that does not name an existing test, with why, reading files
/// under `root`; each once, in the ledger's order.
fn missing_tests(root: &Path, ledger: &str) -> Vec<String> {
    let mut refs = test_refs(ledger);
    let mut seen = std::collections::HashSet::new();
    refs.retain(|reference| seen.insert((reference.path.clone(), reference.name.clone())));
    refs.into_iter()
        .filter_map(|reference| {
            let file = root.join(&reference.path);
            let reason = match std::fs::read_to_string(&file) {
                Err(err) => Some(format!("cannot read {}: {err}", reference.path)),
                Ok(source) => {
                    let harnessless = source.lines().any(|line| line.starts_with("fn main()"));
                    missing_reason(&source, &reference.name, harnessless)
                }
            };
            reason.map(|why| format!("{}::{}: {why}", reference.path, reference.name))
        })
        .collect()
}

#[test]
fn every_test_the_promise_ledger_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ledger = std::fs::read_to_string(root.join(LEDGER)).expect("docs/promises.md");
    let refs = test_refs(&ledger);
    assert!(
        !refs.is_empty(),
        "{LEDGER} names no test: the ledger lost its references, or their form changed \
         (`path/to/file.rs::test_fn`)"
    );
    let missing = missing_tests(root, &ledger);
    assert!(
        missing.is_empty(),
        "{LEDGER} names {} test(s) that do not exist; fix the name in the ledger, or move the \
         promise to its \"Not yet checked\" section:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn the_ledger_check_catches_a_misspelt_test_a_helper_and_a_missing_scenario() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let ledger = "\
| a | `tests/conformance/behaviour.rs::the_wait_deadline_is_honoured` |
| b | `tests/conformance/behaviour.rs::the_wait_deadline_is_honored` |
| c | `tests/conformance/behaviour.rs::take` |
| d | `tests/crash.rs::a_crashed_holder_frees_the_lock_within_its_lease` |
| e | `tests/crash.rs::store_config` |
| f | `tests/no_such_file.rs::a_test` |
| g | `tests/deployments/redlock.rs::a_majority_grants_while_a_minority_is_down` |
";
    let missing = missing_tests(root, ledger);
    let names: Vec<&str> = missing
        .iter()
        .map(|line| line.split(": ").next().unwrap_or(line))
        .collect();
    assert_eq!(
        names,
        [
            "tests/conformance/behaviour.rs::the_wait_deadline_is_honored",
            "tests/conformance/behaviour.rs::take",
            "tests/crash.rs::store_config",
            "tests/no_such_file.rs::a_test",
        ],
        "{missing:#?}"
    );
    // A harness-less binary's fn used as a bare name, but missing from the scenario table.
    let binary =
        "fn main() {\n    let scenarios = [(\"listed\", listed), (\"other\", unlisted)];\n}\n\
                  fn listed() {}\nfn unlisted() {}\n";
    assert_eq!(missing_reason(binary, "listed", true), None);
    let unlisted = missing_reason(binary, "unlisted", true).expect("not in the table");
    assert!(unlisted.contains("scenario table"), "{unlisted}");
}

//! `docs/observability.md` lists everything distlock emits, and nothing else: this module reads
//! every `tracing::{trace,debug,info,warn,error}!` event and `…_span!` span in
//! `lock-runtime/src` (comments aside), and every `metrics::{counter,gauge,histogram}!` with
//! the name its constant stands for, and compares them with the page's tables (`## Spans`,
//! `## Events`, `## Metrics`). An event is known by its level and message, each `{…}` of the
//! message's format string written `…`; a span by its name and level; a metric by its name;
//! the fields and labels must match too. It fails naming what the page lacks and what it
//! lists that the code no longer emits. No server needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = "lock-runtime/src";
const PAGE: &str = "docs/observability.md";

/// What is emitted, as the page names it: (`span`/`event`/`metric`, its identity) to its
/// level (or metric type) and fields (or labels).
type Inventory = BTreeMap<(String, String), (String, BTreeSet<String>)>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// `text` with its comments blanked out (string and char literals kept as they are).
fn without_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            let end = string_end(&chars, i);
            out.extend(&chars[i..end]);
            i = end;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && raw_string(&chars, i) {
            let end = raw_string_end(&chars, i);
            out.extend(&chars[i..end]);
            i = end;
        } else if c == '\'' && is_char_literal(&chars, i) {
            let end = chars[i + 1..]
                .iter()
                .enumerate()
                .skip(1)
                .find(|(_, &c)| c == '\'')
                .map_or(chars.len(), |(at, _)| i + 1 + at + 1);
            out.extend(&chars[i..end]);
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The index after the string literal starting (at its quote) at `start`.
fn string_end(chars: &[char], start: usize) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

fn raw_string(chars: &[char], start: usize) -> bool {
    let preceded_by_ident =
        start > 0 && (chars[start - 1].is_alphanumeric() || chars[start - 1] == '_');
    let mut i = start + 1;
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    !preceded_by_ident && chars.get(i) == Some(&'"')
}

fn raw_string_end(chars: &[char], start: usize) -> usize {
    let mut i = start + 1;
    let mut hashes = 0;
    while chars[i] == '#' {
        hashes += 1;
        i += 1;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    chars.len()
}

/// `'x'` or `'\n'`, not a lifetime `'a`.
fn is_char_literal(chars: &[char], start: usize) -> bool {
    match chars.get(start + 1) {
        Some('\\') => true,
        Some(_) => chars.get(start + 2) == Some(&'\''),
        None => false,
    }
}

/// The text between the parenthesis at `open` and its match, and the index after the match.
fn parenthesised(chars: &[char], open: usize) -> (String, usize) {
    let mut depth = 0;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return (chars[open + 1..i].iter().collect(), i + 1);
                }
            }
            '"' => {
                i = string_end(chars, i);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    panic!("an unclosed macro call")
}

/// The arguments of a macro call, split at its top-level commas.
fn arguments(body: &str) -> Vec<String> {
    let chars: Vec<char> = body.chars().collect();
    let mut args = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '"' => {
                let end = string_end(&chars, i);
                current.extend(&chars[i..end]);
                i = end;
                continue;
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                args.push(std::mem::take(&mut current).trim().to_owned());
                i += 1;
                continue;
            }
            _ => {}
        }
        current.push(chars[i]);
        i += 1;
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_owned());
    }
    args
}

/// A string literal's text, unescaped: `\"`, `\\`, and a line continuation (`\` at the end
/// of a line drops the line break and the next line's indentation).
fn literal(arg: &str) -> Option<String> {
    let inner = arg.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\n') => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    Some(out)
}

/// A message as the page writes it: each `{…}` of its format string as `…`.
fn message_shape(format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push('…');
            }
            c => out.push(c),
        }
    }
    out
}

/// A field's name in a `tracing` macro: `name = …`, `name`, `%name`, `?name`.
fn field_name(arg: &str) -> String {
    let chars: Vec<char> = arg.chars().collect();
    let assigned = (0..chars.len()).find(|&i| {
        chars[i] == '='
            && chars.get(i + 1) != Some(&'=')
            && chars.get(i + 1) != Some(&'>')
            && i > 0
            && !matches!(chars[i - 1], '=' | '!' | '<' | '>')
    });
    let name = match assigned {
        Some(at) => arg[..at].trim(),
        None => arg.trim_start_matches(['%', '?']).trim(),
    };
    name.to_owned()
}

const LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];
const METRIC_KINDS: [&str; 3] = ["counter", "gauge", "histogram"];

/// Everything `lock-runtime/src` emits, with where each was found.
fn emitted() -> (Inventory, BTreeMap<(String, String), String>) {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
            (path.display().to_string(), without_comments(&text))
        })
        .collect();
    // The metric names' constants: `const NAME: &str = "distlock_…";`.
    let mut constants = BTreeMap::new();
    for (_, text) in &texts {
        for line in text.lines() {
            let line = line
                .trim()
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub(crate) ");
            if let Some(rest) = line.strip_prefix("const ") {
                if let Some((name, value)) = rest.split_once(": &str = ") {
                    if let Some(value) = literal(value.trim_end_matches(';')) {
                        constants.insert(name.trim().to_owned(), value);
                    }
                }
            }
        }
    }
    let mut found = Inventory::new();
    let mut places = BTreeMap::new();
    let mut add = |kind: &str, id: String, level: String, fields: BTreeSet<String>, at: String| {
        let key = (kind.to_owned(), id);
        places.entry(key.clone()).or_insert(at);
        let entry = found
            .entry(key)
            .or_insert_with(|| (level.clone(), BTreeSet::new()));
        assert_eq!(
            entry.0, level,
            "{kind} `{}` is emitted at two levels (or as two types): give each its own message",
            entry.0
        );
        entry.1.extend(fields);
    };
    for (file, text) in &texts {
        let chars: Vec<char> = text.chars().collect();
        let mut macros = Vec::new();
        for level in LEVELS {
            macros.push((format!("tracing::{level}!("), "event", level));
            macros.push((format!("tracing::{level}_span!("), "span", level));
        }
        for kind in METRIC_KINDS {
            macros.push((format!("metrics::{kind}!("), "metric", kind));
        }
        for (call, what, level) in &macros {
            let mut from = 0;
            while let Some(at) = text[from..].find(call.as_str()) {
                let start = from + at;
                from = start + call.len();
                let preceded = text[..start].chars().next_back();
                if preceded.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let line = text[..start].lines().count();
                let place = format!("{file}:{line}");
                let open = text[..from].chars().count() - 1;
                let (body, _) = parenthesised(&chars, open);
                let args = arguments(&body);
                match *what {
                    "metric" => {
                        let constant = &args[0];
                        let name = constants.get(constant).cloned().unwrap_or_else(|| {
                            panic!("{place}: the metric name `{constant}` is no `const …: &str` of {SRC}")
                        });
                        let labels = args[1..]
                            .iter()
                            .filter_map(|arg| {
                                let (label, _) = arg.split_once("=>")?;
                                literal(label.trim())
                            })
                            .collect();
                        add("metric", name, (*level).to_owned(), labels, place);
                    }
                    _ => {
                        let mut fields = BTreeSet::new();
                        let mut id = None;
                        for arg in &args {
                            if arg.starts_with("target:") || arg.starts_with("parent:") {
                                continue;
                            }
                            if let Some(text) = literal(arg) {
                                if id.is_some() {
                                    break;
                                }
                                id = Some(text);
                                if *what == "event" {
                                    break; // the rest are the message's arguments
                                }
                                continue;
                            }
                            fields.insert(field_name(arg));
                        }
                        let id = id.unwrap_or_else(|| {
                            panic!("{place}: a {what} without a literal message or name")
                        });
                        let id = if *what == "event" {
                            message_shape(&id)
                        } else {
                            id
                        };
                        add(what, id, level.to_uppercase(), fields, place);
                    }
                }
            }
        }
    }
    (found, places)
}

/// The rows of the tables under `## {heading}` of `page` (its `###` parts included), each
/// row's first three cells; headers (the row above a `|---|` rule) aside.
fn table<'a>(page: &'a str, heading: &str) -> Vec<[&'a str; 3]> {
    let section = page
        .split("\n## ")
        .find(|section| section.starts_with(heading))
        .unwrap_or_else(|| panic!("{PAGE} has no `## {heading}` section"));
    let lines: Vec<&str> = section
        .lines()
        .filter(|line| line.starts_with('|'))
        .collect();
    let rule = |line: &str| line.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '));
    (0..lines.len())
        .filter(|&i| !rule(lines[i]) && !lines.get(i + 1).is_some_and(|next| rule(next)))
        .map(|i| lines[i])
        .map(|row| {
            let cells: Vec<&str> = row
                .split(" | ")
                .map(|cell| cell.trim_matches(['|', ' ']))
                .collect();
            assert!(
                cells.len() >= 3,
                "a row of `## {heading}` has fewer than 3 cells: {row}"
            );
            [cells[0], cells[1], cells[2]]
        })
        .collect()
}

/// The backticked spans of a cell.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The first code span of a cell: `` `text` ``, or ``` `` text `` ``` for a text with backticks.
fn code_span(cell: &str) -> Option<String> {
    let start = cell.find('`')?;
    let rest = &cell[start..];
    if let Some(inner) = rest.strip_prefix("`` ") {
        return Some(inner.split(" ``").next()?.to_owned());
    }
    Some(rest[1..].split('`').next()?.to_owned())
}

/// What the page lists.
fn documented() -> Inventory {
    let page = std::fs::read_to_string(PAGE).unwrap_or_else(|err| panic!("reading {PAGE}: {err}"));
    let mut listed = Inventory::new();
    let mut add = |kind: &str, id: String, level: &str, fields: BTreeSet<String>| {
        let previous = listed.insert((kind.to_owned(), id.clone()), (level.to_owned(), fields));
        assert!(previous.is_none(), "{PAGE} lists the {kind} `{id}` twice");
    };
    for [name, level, fields] in table(&page, "Spans") {
        let name = backticked(name)
            .into_iter()
            .next()
            .expect("a span's name in backticks");
        add(
            "span",
            name,
            level,
            backticked(fields).into_iter().collect(),
        );
    }
    for [message, level, fields] in table(&page, "Events") {
        let message = code_span(message).expect("an event's message in backticks");
        add(
            "event",
            message,
            level,
            backticked(fields).into_iter().collect(),
        );
    }
    for [name, kind, labels] in table(&page, "Metrics") {
        let name = backticked(name)
            .into_iter()
            .next()
            .expect("a metric's name in backticks");
        add(
            "metric",
            name,
            kind,
            backticked(labels).into_iter().collect(),
        );
    }
    listed
}

/// The page's entry for what the code emits as `key`: the same identity, or — for an event —
/// the longest message of the page that ends in `…` and begins the code's message (a long
/// message is listed by its beginning).
fn entry_for<'a>(page: &'a Inventory, key: &(String, String)) -> Option<&'a (String, String)> {
    if let Some((found, _)) = page.get_key_value(key) {
        return Some(found);
    }
    let (kind, id) = key;
    page.keys()
        .filter(|(listed_kind, listed)| {
            listed_kind == kind
                && kind == "event"
                && listed
                    .strip_suffix('…')
                    .is_some_and(|start| !start.is_empty() && id.starts_with(start))
        })
        .max_by_key(|(_, listed)| listed.len())
}

#[test]
fn the_observability_page_lists_every_span_event_and_metric_the_code_emits_and_no_other() {
    let (code, places) = emitted();
    let page = documented();
    assert!(
        code.len() > 40,
        "the scan found too little to be right: {code:#?}"
    );
    let mut problems = Vec::new();
    let mut matched = BTreeSet::new();
    for (key, (level, fields)) in &code {
        let (kind, id) = key;
        let at = &places[key];
        let listed = entry_for(&page, key);
        if let Some(listed) = listed {
            matched.insert(listed.clone());
        }
        match listed.and_then(|listed| page.get(listed)) {
            None => problems.push(format!(
                "{at}: the {kind} `{id}` ({level}, {fields:?}) is not in {PAGE}"
            )),
            Some((listed_level, listed_fields)) => {
                if listed_level != level {
                    problems.push(format!(
                        "{at}: the {kind} `{id}` is {level}; {PAGE} says {listed_level}"
                    ));
                }
                if listed_fields != fields {
                    problems.push(format!(
                        "{at}: the {kind} `{id}` has the fields/labels {fields:?}; {PAGE} lists {listed_fields:?}"
                    ));
                }
            }
        }
    }
    for ((kind, id), _) in page.iter().filter(|(key, _)| !matched.contains(*key)) {
        problems.push(format!(
            "{PAGE} lists the {kind} `{id}`, which {SRC} no longer emits"
        ));
    }
    assert!(
        problems.is_empty(),
        "{PAGE} and the code disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_reads_messages_fields_and_comments_as_the_page_writes_them() {
    assert_eq!(message_shape("lease lost: {why}"), "lease lost: …");
    assert_eq!(
        message_shape("a {{literal}} brace, {x:?}"),
        "a {literal} brace, …"
    );
    assert_eq!(field_name("key = %lease.key.name"), "key");
    assert_eq!(field_name("%election"), "election");
    assert_eq!(field_name("?released"), "released");
    assert_eq!(
        arguments(r#"target: T, a = f(1, 2), "m, {x}", x"#),
        ["target: T", "a = f(1, 2)", "\"m, {x}\"", "x"]
    );
    let text = without_comments("a // tracing::info!(\"x\")\n\"// kept\" /* b */ c");
    assert!(!text.contains("tracing"), "{text}");
    assert!(text.contains("\"// kept\""), "{text}");
}

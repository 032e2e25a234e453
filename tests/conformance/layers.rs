//! The layers of `lock-runtime/src` hold: the table in `ARCHITECTURE.md` ("Layers") puts every
//! file of the crate in one layer, and this module reads it and every file's `crate::…` paths
//! (its `use` lines and the paths written in its code; comments and `#[cfg(test)]` modules
//! aside) and fails, naming the file and the import, when a module imports one of a layer
//! above its own, or imports through the crate root (`crate::Config`: `lib.rs` only
//! re-exports), or when a file is in no row of the table. The table is written once, in
//! ARCHITECTURE.md; this reads it there. No server needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The crate whose layers are checked, and the page whose table states them.
const SRC: &str = "lock-runtime/src";
const ARCHITECTURE: &str = "ARCHITECTURE.md";

/// The layer table: a path of `SRC` (`kind/` for a folder, `config.rs` for a file) and its
/// layer's place, from the bottom (0).
#[derive(Debug)]
struct Layers {
    places: BTreeMap<String, (usize, String)>,
}

impl Layers {
    /// Reads the table under the heading `## Layers` of `page`: each row's first cell names the
    /// layer, its second the files, each in backticks; the rows run from the bottom layer up.
    fn read(page: &str) -> Result<Self, String> {
        let table = page
            .split("\n## ")
            .find(|section| section.starts_with("Layers"))
            .ok_or("ARCHITECTURE.md has no `## Layers` section")?;
        let mut places = BTreeMap::new();
        let rows = table
            .lines()
            .filter(|line| line.starts_with('|'))
            .skip(2) // the header and its rule
            .enumerate();
        for (place, row) in rows {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let (Some(layer), Some(files)) = (cells.get(1), cells.get(2)) else {
                return Err(format!("a row of the layer table has no files cell: {row}"));
            };
            for file in files.split('`').skip(1).step_by(2) {
                if let Some((earlier, _)) =
                    places.insert(file.to_owned(), (place, (*layer).to_owned()))
                {
                    return Err(format!(
                        "`{file}` is in two rows of the layer table ({earlier} and {place})"
                    ));
                }
            }
        }
        if places.is_empty() {
            return Err("the layer table names no file".to_owned());
        }
        Ok(Self { places })
    }

    /// The layer of the module at `path` (`store/redis/first_try.rs`, or a module path's
    /// segments joined with `/`, `store/wake`): the row of the longest prefix the table names.
    fn of(&self, path: &str) -> Option<&(usize, String)> {
        let path = path.trim_end_matches(".rs");
        let segments: Vec<&str> = path.split('/').collect();
        (1..=segments.len()).rev().find_map(|n| {
            let prefix = segments[..n].join("/");
            self.places
                .get(&format!("{prefix}.rs"))
                .or_else(|| self.places.get(&format!("{prefix}/")))
        })
    }
}

/// What is wrong with one import.
#[derive(Debug, PartialEq)]
struct Violation {
    file: String,
    import: String,
    why: String,
}

/// `source` without comments (`//` to the end of the line, outside string literals) and
/// without its test modules (from the first `#[cfg(test)]` on).
fn code_of(source: &str) -> String {
    let source = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut code = String::with_capacity(source.len());
    for line in source.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut end = line.len();
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        code.push_str(&line[..end]);
        code.push('\n');
    }
    code
}

/// Every module path `code` names under `crate::` — as `a/b/c` (segments up to the first
/// that is not a module name) — with the text it was written as. A `use crate::{a::X, b}`
/// tree gives each of its branches.
fn crate_paths(code: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `my_crate::`
        }
        let tree = use_tree(rest);
        for path in expand(tree) {
            found.push((module_path(&path), format!("crate::{path}")));
        }
    }
    found
}

/// The path or `{…}` tree at the start of `text`, up to where it ends.
fn use_tree(text: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return &text[..=i];
                }
            }
            _ if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => {
                return &text[..i];
            }
            _ => {}
        }
    }
    text
}

/// The paths a use tree names: `a::{b, c::{d}}` gives `a::b` and `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::").to_owned()];
    };
    let (head, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let mut branches = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                branches.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    branches.push(&inner[start..]);
    branches
        .into_iter()
        .filter(|branch| !branch.is_empty())
        .flat_map(|branch| expand(branch).into_iter().map(|p| format!("{head}{p}")))
        .map(|p| p.trim_end_matches("::self").to_owned())
        .collect()
}

/// The module part of a path: its leading segments that look like module names (lower
/// case), joined with `/`; an item path ends at its first upper-case or `SHOUTING` segment.
fn module_path(path: &str) -> String {
    let segments: Vec<&str> = path
        .split("::")
        .take_while(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .collect();
    segments.join("/")
}

/// What is wrong with `file`'s imports (`file` relative to `SRC`, `source` its text).
fn violations(layers: &Layers, file: &str, source: &str) -> Vec<Violation> {
    let violation = |import: &str, why: String| Violation {
        file: file.to_owned(),
        import: import.to_owned(),
        why,
    };
    if file == "lib.rs" {
        return Vec::new(); // the facade: it re-exports from every layer
    }
    let Some((own, own_layer)) = layers.of(file) else {
        return vec![violation(
            "",
            format!(
                "{file} is in no row of the layer table in {ARCHITECTURE}: add it to its layer"
            ),
        )];
    };
    let mut found = Vec::new();
    for (module, import) in crate_paths(&code_of(source)) {
        if module.is_empty() {
            found.push(violation(
                &import,
                "imports through the crate root, which only re-exports: name the module the item lives in".to_owned(),
            ));
            continue;
        }
        match layers.of(&module) {
            None => found.push(violation(
                &import,
                format!("`{module}` is in no row of the layer table in {ARCHITECTURE}"),
            )),
            Some((place, layer)) if place > own => found.push(violation(
                &import,
                format!("a module of layer \"{own_layer}\" imports one of layer \"{layer}\", which is above it"),
            )),
            Some(_) => {}
        }
    }
    found
}

/// Every `.rs` file under `dir`, relative to it, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(at) = todo.pop() {
        for entry in std::fs::read_dir(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    files.sort();
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The layer table of ARCHITECTURE.md against every `crate::` path of `lock-runtime/src`.
#[test]
fn layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layers = Layers::read(&read(&root.join(ARCHITECTURE))).unwrap_or_else(|e| panic!("{e}"));
    let src = root.join(SRC);
    let files = rust_files(&src);
    assert!(
        files.len() > 40,
        "found only {} files under {SRC}",
        files.len()
    );
    let found: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let name = file.to_string_lossy().replace('\\', "/");
            violations(&layers, &name, &read(&src.join(file)))
        })
        .map(|v| format!("{SRC}/{}: `{}`: {}", v.file, v.import, v.why))
        .collect();
    assert!(
        found.is_empty(),
        "imports against the layers of {ARCHITECTURE}:\n{}",
        found.join("\n")
    );
}

/// The checker catches what it is for: an upward import (in a `use` tree and written inline),
/// an import through the crate root, a file the table does not name; and it lets through
/// imports down or within a layer, comments and test modules.
#[test]
fn layers_catches_an_upward_import() {
    let page = "# A\n\n## Layers\n\n| layer | files | what |\n|---|---|---|\n\
        | words | `protocol.rs`, `error.rs` | … |\n| stores | `store/` | … |\n\
        | requests | `acquire/`, `request.rs` | … |\n\n## Next\n";
    let layers = Layers::read(page).expect("table");
    let upward = "use crate::error::LockError;\nuse crate::{protocol::LockKey, \
        acquire::{wait::Plan}};\n// use crate::request::LockRequest;\n";
    assert_eq!(
        violations(&layers, "store/redis/renew.rs", upward),
        vec![Violation {
            file: "store/redis/renew.rs".to_owned(),
            import: "crate::acquire::wait::Plan".to_owned(),
            why:
                "a module of layer \"stores\" imports one of layer \"requests\", which is above it"
                    .to_owned(),
        }],
        "only the upward branch of the tree is reported"
    );
    let inline =
        "fn f() { crate::request::build(); }\n#[cfg(test)]\nmod tests { use crate::acquire::X; }";
    assert_eq!(violations(&layers, "store/mod.rs", inline).len(), 1);
    let root = "use crate::LockError;\nuse crate::{Config, error::E};\n";
    let through_root = violations(&layers, "request.rs", root);
    assert_eq!(through_root.len(), 2, "{through_root:?}");
    assert!(through_root.iter().all(|v| v.why.contains("crate root")));
    assert!(violations(&layers, "kind/mod.rs", "")[0]
        .why
        .contains("no row"));
    let down = "use crate::store::wake::W;\nlet s = \"redis://h\"; crate::request::x(); // crate::Config\n";
    assert_eq!(violations(&layers, "acquire/mod.rs", down), vec![]);
}

//! The machine and the build a bench's run is read against: its date, commit, CPUs, CPU
//! model, the servers' version, the pinning and the rounds — printed first, and the first of
//! the JSON lines the run appends to `target/bench.jsonl` (`rounds.rs` writes the rest). Each
//! bench lists its own facts in its own order; the facts every bench asks for are here.
//! Neighbours: `pinning.rs` says where things ran.

use std::process::Command;

/// The facts of one run, in the order they are printed.
pub struct Header {
    /// In the JSON line only, first: the store the bench ran on (`"store": "postgres"`).
    store: Option<&'static str>,
    fields: Vec<(&'static str, Fact)>,
}

/// One value of the header: text, or a count (a number in JSON).
pub enum Fact {
    Text(String),
    Count(usize),
}

impl Fact {
    fn json(&self) -> String {
        match self {
            Fact::Text(text) => json_string(text),
            Fact::Count(count) => count.to_string(),
        }
    }
}

impl std::fmt::Display for Fact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fact::Text(text) => f.write_str(text),
            Fact::Count(count) => write!(f, "{count}"),
        }
    }
}

impl Header {
    /// A header with no facts yet; `store` is written in its JSON line only.
    pub fn new(store: Option<&'static str>) -> Self {
        Self {
            store,
            fields: Vec::new(),
        }
    }

    /// Adds a fact as text.
    pub fn text(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.fields.push((name, Fact::Text(value.into())));
        self
    }

    /// Adds a fact as a count.
    pub fn count(mut self, name: &'static str, value: usize) -> Self {
        self.fields.push((name, Fact::Count(value)));
        self
    }

    pub fn print(&self) {
        for (name, value) in &self.fields {
            println!("{name:<12} {value}");
        }
    }

    /// `{"header": {"date": "...", ...}}`, with `"store"` first if the header has one.
    pub fn json(&self) -> String {
        let store = self
            .store
            .map(|store| format!("\"store\": {}", json_string(store)));
        let fields: Vec<String> = store
            .into_iter()
            .chain(
                self.fields
                    .iter()
                    .map(|(name, value)| format!("\"{name}\": {}", value.json())),
            )
            .collect();
        format!("{{\"header\": {{{}}}}}", fields.join(", "))
    }
}

/// Now, UTC, to the second; `?` if `date` cannot tell.
pub fn date() -> String {
    known(command_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
}

/// The commit of this checkout, `-dirty` if it has changes to tracked files; `?` without git.
pub fn commit() -> String {
    let dir = env!("CARGO_MANIFEST_DIR");
    let Some(hash) = command_line("git", &["-C", dir, "rev-parse", "--short", "HEAD"]) else {
        return known(None);
    };
    let dirty = command_line("git", &["-C", dir, "status", "--porcelain", "-uno"]).is_some();
    if dirty {
        format!("{hash}-dirty")
    } else {
        hash
    }
}

/// The `model name` of the first CPU in `/proc/cpuinfo`, or `?`.
pub fn cpu_model() -> String {
    let model = || {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let line = cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))?;
        Some(line.split_once(':')?.1.trim().to_owned())
    };
    known(model())
}

/// The value, or `?`.
pub fn known(value: Option<String>) -> String {
    value.unwrap_or_else(|| "?".to_owned())
}

/// The first line of what `program args` prints, if it runs and succeeds.
pub fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    let stdout = String::from_utf8(output.stdout).ok()?;
    let line = stdout.lines().next()?.trim().to_owned();
    (output.status.success() && !line.is_empty()).then_some(line)
}

/// `text` as a JSON string.
pub fn json_string(text: &str) -> String {
    let mut quoted = String::from('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

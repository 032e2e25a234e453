//! Rules across the arguments and the fn: a key is required, every placeholder names a
//! parameter, durations parse and a lease is not zero, `mode` and `on_lost` are known, `fair`
//! is only asked of a one-key exclusive lock, the fn is async and returns something. All
//! problems are combined into one error. Duration and client expressions pass through
//! unchecked: the compiler types them, the runtime checks their values.

use syn::ext::IdentExt;
use syn::{LitStr, ReturnType, Signature};

use crate::args::{attribute_span, Args, DurationArg, PermitsArg};
use crate::duration;
use crate::key::{self, Template};

/// The runtime's `MIN_LEASE` and `MAX_LEASE`, in milliseconds.
const MIN_LEASE_MS: u64 = 10;
const MAX_LEASE_MS: u64 = 365 * 24 * 3600 * 1000;

/// Everything `expand` needs, checked.
pub(crate) struct Checked {
    pub(crate) template: Template,
    /// The parameter each placeholder's root names, in order.
    pub(crate) key_roots: Vec<syn::Ident>,
    /// `keys = [..]`: a multi-key lock; `template` is its first key, these the others (each
    /// with its placeholders' roots).
    pub(crate) multi: bool,
    pub(crate) more_keys: Vec<(Template, Vec<syn::Ident>)>,
    pub(crate) mode: Mode,
    /// `permits = …`: the fn takes one of a semaphore's permits (`mode` is then `Write`,
    /// unused).
    pub(crate) permits: Option<Permits>,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    /// `client = …` as written; unset locks through the global client.
    pub(crate) client: Option<syn::Expr>,
    pub(crate) watchdog: bool,
    /// `fencing = …` as written; unset leaves it to the client's config.
    pub(crate) fencing: Option<bool>,
    /// `fair = true`: queued in request order (only on a one-key exclusive lock).
    pub(crate) fair: bool,
    pub(crate) abort_on_lost: bool,
    pub(crate) krate: syn::Path,
}

/// `permits`, checked as far as the macro can.
pub(crate) enum Permits {
    /// A literal: at least 1, at most `u32::MAX`.
    Count(u32),
    /// An expression: the compiler checks its type, the runtime its value.
    Expr(syn::Expr),
}

/// A duration argument, checked as far as the macro can.
pub(crate) enum Duration {
    /// A literal, in milliseconds: valid.
    Millis(u64),
    /// An expression: the compiler checks its type, the runtime its value.
    Expr(syn::Expr),
}

/// The side of the key's read/write lock the fn takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `"exclusive"` (the default) or `"write"`: the same lock.
    Write,
    /// `"read"`: shared among readers.
    Read,
}

/// Reads `mode = "…"`; an unknown value is an error at the literal.
fn mode(lit: &LitStr) -> syn::Result<Mode> {
    let value = lit.value();
    match value.as_str() {
        "exclusive" | "write" => Ok(Mode::Write),
        "read" => Ok(Mode::Read),
        other => {
            let lower = other.trim().to_lowercase();
            let hint = match lower.as_str() {
                "exclusive" | "write" | "read" => format!(" (modes are lower case: `\"{lower}\"`)"),
                "shared" | "reader" | "readers" => " (a shared lock is `\"read\"`)".to_owned(),
                "writer" | "mutex" | "lock" => " (an exclusive lock is `\"exclusive\"`)".to_owned(),
                _ => String::new(),
            };
            Err(syn::Error::new(
                lit.span(),
                format!(
                    "unknown mode `{other}`: expected `\"exclusive\"`, `\"write\"` (the same lock) or `\"read\"`{hint}"
                ),
            ))
        }
    }
}

/// Collects errors, as serde's `Ctxt` does.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    fn check<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }
}

/// Checks `args` against the fn. `names` are the names its parameters bind (for an
/// `#[async_trait]` body, the names it rebinds inside the future).
pub(crate) fn check(
    args: Args,
    sig: &Signature,
    is_async: bool,
    names: &[syn::Ident],
) -> syn::Result<Checked> {
    let mut errors = Errors::default();
    for err in args.errors {
        errors.push(err);
    }
    if !is_async {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "`#[distributed_lock]` can only be applied to an `async fn`",
        ));
    }
    if let ReturnType::Default = sig.output {
        errors.push(syn::Error::new(
            sig.paren_token.span.close(),
            "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<distlock::LockError>`",
        ));
    }

    // A template and the parameter each of its placeholders' roots names.
    let mut scan = |lit: &LitStr| {
        let template = errors.check(key::scan(lit))?;
        let mut roots = Vec::new();
        for placeholder in &template.placeholders {
            match names.iter().find(|n| n.unraw() == placeholder.root) {
                Some(root) => roots.push(root.clone()),
                None => errors.push(unknown_placeholder(lit, &placeholder.root, names)),
            }
        }
        Some((template, roots))
    };
    let mut more_keys = Vec::new();
    let mut repeated = Vec::new();
    let (template, key_roots) = match (&args.key, &args.keys) {
        (Some(lit), _) => scan(lit).unzip(),
        (None, Some((_, lits))) => {
            let mut scanned = Vec::new();
            for (i, lit) in lits.iter().enumerate() {
                if lits[..i]
                    .iter()
                    .any(|earlier| earlier.value() == lit.value())
                {
                    repeated.push(syn::Error::new(
                        lit.span(),
                        "this key template is listed twice in `keys`: give each key once",
                    ));
                }
                scanned.extend(scan(lit));
            }
            let first = (!scanned.is_empty()).then(|| scanned.remove(0));
            more_keys = scanned;
            first.unzip()
        }
        (None, None) if args.key_given => (None, None),
        (None, None) => {
            errors.push(syn::Error::new(
                attribute_span(),
                "missing `key`: add e.g. `key = \"order:{order_id}\"`",
            ));
            (None, None)
        }
    };
    for err in repeated {
        errors.push(err);
    }
    let key_roots = key_roots.unwrap_or_default();
    let multi = args.key.is_none() && args.keys.is_some();
    if let (Some(_), Some((span, _))) = (&args.key, &args.keys) {
        errors.push(syn::Error::new(
            *span,
            "give either `key` (one lock) or `keys` (the locks of several keys at once), not both",
        ));
    }
    if let (Some((span, _)), Some(_)) = (&args.keys, &args.permits) {
        errors.push(syn::Error::new(
            *span,
            "`keys` takes the exclusive locks of several keys; it does not apply to a semaphore \
             (`permits`): remove one of them",
        ));
    }
    if let (true, Some(lit)) = (args.keys.is_some(), &args.mode) {
        if lit.value() == "read" {
            errors.push(syn::Error::new(
                lit.span(),
                "`keys` takes exclusive locks; a multi-key read lock is not supported: remove \
                 `mode = \"read\"`, or take one key",
            ));
        }
    }

    // A fair queue orders the waiters of one key's exclusive lock (`LockRequest::fair`); asking
    // it of another kind is a mistake the attribute can see, so it is caught here, not when
    // the fn is called. `fair = false` asks nothing and goes with every kind.
    if let Some((span, _)) = args.fair.as_ref().filter(|(_, lit)| lit.value) {
        if args
            .mode
            .as_ref()
            .is_some_and(|mode| mode.value() == "read")
        {
            errors.push(syn::Error::new(
                *span,
                "`fair` queues the waiters of the exclusive lock; readers share the lock \
                 and are not queued: remove `fair`, or use `mode = \"exclusive\"` (the same \
                 lock as `\"write\"`)",
            ));
        }
        if args.permits.is_some() {
            errors.push(syn::Error::new(
                *span,
                "`fair` queues the waiters of the exclusive lock; a semaphore (`permits`) \
                 is not fair-queued: remove one of them",
            ));
        }
        if args.keys.is_some() {
            errors.push(syn::Error::new(
                *span,
                "`fair` queues the waiters of one key's exclusive lock; a multi-key lock \
                 (`keys`) is taken in a fixed key order, not queued: remove one of them",
            ));
        }
    }

    let lease_ms = literal(&args.lease).and_then(|lit| errors.check(parse_duration(lit)));
    if let (Some(ms), Some(lit)) = (lease_ms, literal(&args.lease)) {
        let problem = match ms {
            0 => Some("a lease of zero would expire at once; give a positive duration like `15s`"),
            1..MIN_LEASE_MS => {
                Some("a lease must be at least `10ms` (the watchdog renews at a third of it)")
            }
            ms if ms > MAX_LEASE_MS => Some("a lease may be at most a year (`8760h`)"),
            _ => None,
        };
        if let Some(problem) = problem {
            errors.push(syn::Error::new(lit.span(), problem));
        }
    }
    let wait_ms = literal(&args.wait).and_then(|lit| errors.check(parse_duration(lit)));

    let max_hold_ms = literal(&args.max_hold).and_then(|lit| errors.check(parse_duration(lit)));
    // Against an expression or the config's default lease, which the macro cannot see, the
    // runtime checks.
    if let (Some(ms), Some(lit), Some(lease), Some(lease_lit)) = (
        max_hold_ms,
        literal(&args.max_hold),
        lease_ms,
        literal(&args.lease),
    ) {
        if ms < lease {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`max_hold` ({}) is shorter than the lease ({}): the lock would be given up before its first renewal; make `max_hold` at least the lease",
                    lit.value(),
                    lease_lit.value()
                ),
            ));
        }
    }

    let mode = match &args.mode {
        None => Mode::Write,
        Some(lit) => errors.check(mode(lit)).unwrap_or(Mode::Write),
    };

    let permits = match args.permits {
        None => None,
        Some(PermitsArg::Literal(lit)) => match lit.base10_parse::<u32>() {
            Ok(0) => {
                errors.push(syn::Error::new(
                    lit.span(),
                    "a semaphore of zero permits could never be taken; give at least `permits = 1`",
                ));
                None
            }
            Ok(n) => Some(Permits::Count(n)),
            Err(_) => {
                errors.push(syn::Error::new(
                    lit.span(),
                    format!("`permits` takes a whole number from 1 to {}", u32::MAX),
                ));
                None
            }
        },
        Some(PermitsArg::Expr(expr)) => Some(Permits::Expr(expr)),
    };
    if let (Some(_), Some(lit)) = (&permits, &args.mode) {
        errors.push(syn::Error::new(
            lit.span(),
            "`mode` does not apply to a semaphore: with `permits = N` the fn takes one of N \
             permits; remove `mode`, or `permits` for a read/write lock",
        ));
    }

    let abort_on_lost = match &args.on_lost {
        None => true,
        Some(lit) => {
            match lit.value().as_str() {
                "abort" => true,
                "continue" => false,
                other => {
                    errors.push(syn::Error::new(
                    lit.span(),
                    format!("unknown `on_lost` value `{other}`; expected `\"abort\"` or `\"continue\"`"),
                ));
                    true
                }
            }
        }
    };

    let krate = match &args.krate {
        None => syn::parse_quote!(::distlock),
        Some(lit) => errors
            .check(lit.parse::<syn::Path>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    "`crate` takes a path, e.g. `crate = \"my_locks\"`",
                )
            }))
            .unwrap_or_else(|| syn::parse_quote!(::distlock)),
    };

    match (errors.0, template) {
        (Some(err), _) => Err(err),
        (None, Some(template)) => Ok(Checked {
            template,
            key_roots,
            multi,
            more_keys,
            mode,
            permits,
            lease: checked_duration(args.lease, lease_ms),
            wait: checked_duration(args.wait, wait_ms),
            max_hold: checked_duration(args.max_hold, max_hold_ms),
            client: args.client,
            watchdog: args.watchdog.is_none_or(|lit| lit.value),
            fencing: args.fencing.map(|lit| lit.value),
            fair: args.fair.is_some_and(|(_, lit)| lit.value),
            abort_on_lost,
            krate,
        }),
        (None, None) => Err(syn::Error::new(attribute_span(), "missing `key`")),
    }
}

/// The literal of a duration argument, if it was written as one.
fn literal(arg: &Option<DurationArg>) -> Option<&LitStr> {
    match arg {
        Some(DurationArg::Literal(lit)) => Some(lit),
        _ => None,
    }
}

/// A duration argument as `expand` needs it: the parsed literal, or the expression.
fn checked_duration(arg: Option<DurationArg>, millis: Option<u64>) -> Option<Duration> {
    match arg? {
        DurationArg::Literal(_) => millis.map(Duration::Millis),
        DurationArg::Expr(expr) => Some(Duration::Expr(expr)),
    }
}

fn parse_duration(lit: &LitStr) -> syn::Result<u64> {
    duration::parse_millis(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))
}

fn unknown_placeholder(lit: &LitStr, root: &str, names: &[syn::Ident]) -> syn::Error {
    if root == "self" {
        return syn::Error::new(
            lit.span(),
            "`{self…}` needs a method with a `self` receiver; this fn has none",
        );
    }
    let candidates = if names.is_empty() {
        "the fn has no parameters".to_owned()
    } else {
        let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        format!("the parameters are {}", list.join(", "))
    };
    syn::Error::new(
        lit.span(),
        format!("unknown placeholder `{{{root}}}` in the key template: no parameter is named `{root}`; {candidates}"),
    )
}

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
    pub(crate) target: Target,
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) hold_at_least: Option<Duration>,
    /// `client = …` as written; unset locks through the global client.
    pub(crate) client: Option<syn::Expr>,
    pub(crate) watchdog: bool,
    /// `fencing = …` as written; unset leaves it to the client's config.
    pub(crate) fencing: Option<bool>,
    /// `fair = true`: queued in request order (only on a one-key exclusive lock).
    pub(crate) fair: bool,
    pub(crate) abort_on_lost: bool,
    /// `on_busy = "skip"`, with the value's span (the return type's check is reported there).
    pub(crate) skip_on_busy: Option<proc_macro2::Span>,
    pub(crate) krate: syn::Path,
}

/// What the fn locks: the same three cases as the runtime's `LockTarget`
/// (`lock-runtime/src/attribute.rs`), which `expand` builds from this.
pub(crate) enum Target {
    /// `key = "…"`, with its `mode`.
    Key { key: Key, mode: Mode },
    /// `key = "…", permits = …`: one of a semaphore's permits.
    Permits { key: Key, permits: Permits },
    /// `keys = [..]`: the exclusive locks of every key at once, in the order written.
    Keys(Vec<Key>),
}

/// A key template and the parameter each of its placeholders' roots names, in order.
pub(crate) struct Key {
    pub(crate) template: Template,
    pub(crate) roots: Vec<syn::Ident>,
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

/// Checks `args` against the fn, one rule at a time; every problem found is reported. `names`
/// are the names its parameters bind (for an `#[async_trait]` body, the names it rebinds
/// inside the future).
pub(crate) fn check(
    mut args: Args,
    sig: &Signature,
    is_async: bool,
    names: &[syn::Ident],
) -> syn::Result<Checked> {
    let mut errors = Errors::default();
    for err in std::mem::take(&mut args.errors) {
        errors.push(err);
    }
    signature_rule(sig, is_async, &mut errors);
    let keys = keys(&args, names, &mut errors);
    one_target_rule(&args, &mut errors);
    fair_rule(&args, &mut errors);
    let lease_ms = lease_rule(&args, &mut errors);
    let wait_ms = literal(&args.wait).and_then(|lit| errors.check(parse_duration(lit)));
    let max_hold_ms = max_hold_rule(&args, lease_ms, &mut errors);
    let hold_at_least_ms = hold_at_least_rule(&args, max_hold_ms, &mut errors);
    let mode = match &args.mode {
        None => Mode::Write,
        Some(lit) => errors.check(mode(lit)).unwrap_or(Mode::Write),
    };
    let permits = permits_rule(&args, &mut errors);
    if let (Some(_), Some(lit)) = (&permits, &args.mode) {
        errors.push(syn::Error::new(
            lit.span(),
            "`mode` does not apply to a semaphore: with `permits = N` the fn takes one of N \
             permits; remove `mode`, or `permits` for a read/write lock",
        ));
    }
    let target = keys.and_then(|keys| keys.target(mode, permits));
    let abort_on_lost = on_lost_rule(&args, &mut errors);
    let skip_on_busy = on_busy_rule(&args, &mut errors);
    let krate = krate_rule(&args, &mut errors);
    match (errors.0, target) {
        (Some(err), _) => Err(err),
        (None, Some(target)) => Ok(Checked {
            target,
            lease: checked_duration(args.lease, lease_ms),
            wait: checked_duration(args.wait, wait_ms),
            max_hold: checked_duration(args.max_hold, max_hold_ms),
            hold_at_least: checked_duration(args.hold_at_least, hold_at_least_ms),
            client: args.client,
            watchdog: args.watchdog.is_none_or(|lit| lit.value),
            fencing: args.fencing.map(|lit| lit.value),
            fair: args.fair.is_some_and(|(_, lit)| lit.value),
            abort_on_lost,
            skip_on_busy,
            krate,
        }),
        (None, None) => Err(syn::Error::new(attribute_span(), "missing `key`")),
    }
}

/// The fn is async and returns something that can carry a lock error.
fn signature_rule(sig: &Signature, is_async: bool, errors: &mut Errors) {
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
}

/// One target: `key` or `keys`, not both; `keys` is neither a semaphore nor a read lock.
fn one_target_rule(args: &Args, errors: &mut Errors) {
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
}

/// A fair queue orders the waiters of one key's exclusive lock (`LockRequest::fair`); asking
/// it of another kind is a mistake the attribute can see, so it is caught here, not when the
/// fn is called. `fair = false` asks nothing and goes with every kind.
fn fair_rule(args: &Args, errors: &mut Errors) {
    let Some((span, _)) = args.fair.as_ref().filter(|(_, lit)| lit.value) else {
        return;
    };
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

/// A literal lease parses and lies within the runtime's bounds; its milliseconds.
fn lease_rule(args: &Args, errors: &mut Errors) -> Option<u64> {
    let lit = literal(&args.lease)?;
    let ms = errors.check(parse_duration(lit))?;
    if let Some(problem) = lease_problem(ms) {
        errors.push(syn::Error::new(lit.span(), problem));
    }
    Some(ms)
}

/// Why a lease of `ms` milliseconds is refused, if it is: the runtime's `lease_out_of_bounds`
/// at compile time.
fn lease_problem(ms: u64) -> Option<&'static str> {
    match ms {
        0 => Some("a lease of zero would expire at once; give a positive duration like `15s`"),
        1..MIN_LEASE_MS => {
            Some("a lease must be at least `10ms` (the watchdog renews at a third of it)")
        }
        ms if ms > MAX_LEASE_MS => Some("a lease may be at most a year (`8760h`)"),
        _ => None,
    }
}

/// A literal max_hold parses and is at least a literal lease (against an expression or the
/// config's default lease, which the macro cannot see, the runtime checks); its milliseconds.
fn max_hold_rule(args: &Args, lease_ms: Option<u64>, errors: &mut Errors) -> Option<u64> {
    let lit = literal(&args.max_hold)?;
    let ms = errors.check(parse_duration(lit))?;
    if let (Some(lease), Some(lease_lit)) = (lease_ms, literal(&args.lease)) {
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
    Some(ms)
}

/// A literal `hold_at_least` parses and is at most a literal `max_hold` (against an expression
/// the runtime checks), and it keeps only the exclusive lock of one key, not fair; its
/// milliseconds.
fn hold_at_least_rule(args: &Args, max_hold_ms: Option<u64>, errors: &mut Errors) -> Option<u64> {
    let arg = args.hold_at_least.as_ref()?;
    let span = match arg {
        DurationArg::Literal(lit) => lit.span(),
        DurationArg::Expr(expr) => syn::spanned::Spanned::span(expr),
    };
    let read = args.mode.as_ref().is_some_and(|lit| lit.value() == "read");
    let fair = args.fair.as_ref().is_some_and(|(_, lit)| lit.value);
    if read || args.permits.is_some() || args.keys.is_some() || fair {
        errors.push(syn::Error::new(
            span,
            "`hold_at_least` keeps the exclusive lock of one key past its release; it does not \
             apply to `mode = \"read\"`, `permits`, `keys` or `fair = true`",
        ));
    }
    let lit = literal(&args.hold_at_least)?;
    let ms = errors.check(parse_duration(lit))?;
    if let (Some(max_hold), Some(max_lit)) = (max_hold_ms, literal(&args.max_hold)) {
        if ms > max_hold {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "`hold_at_least` ({}) is longer than `max_hold` ({}): the lock could not be held that long; shorten `hold_at_least` or lengthen `max_hold`",
                    lit.value(),
                    max_lit.value()
                ),
            ));
        }
    }
    Some(ms)
}

/// The key templates as written: `key` or `keys`.
enum Keys {
    One(Key),
    Many(Vec<Key>),
}

impl Keys {
    /// The target these keys make with `mode` and `permits` (`None`: `keys` named none).
    fn target(self, mode: Mode, permits: Option<Permits>) -> Option<Target> {
        match (self, permits) {
            (Keys::One(key), Some(permits)) => Some(Target::Permits { key, permits }),
            (Keys::One(key), None) => Some(Target::Key { key, mode }),
            (Keys::Many(keys), _) => (!keys.is_empty()).then_some(Target::Keys(keys)),
        }
    }
}

/// Every placeholder of `key` or of each of `keys` names a parameter, and `keys` lists each
/// template once; `None` when no key could be read (already reported).
fn keys(args: &Args, names: &[syn::Ident], errors: &mut Errors) -> Option<Keys> {
    // A template and the parameter each of its placeholders' roots names.
    let scan = |lit: &LitStr, errors: &mut Errors| {
        let template = errors.check(key::scan(lit))?;
        let mut roots = Vec::new();
        for placeholder in &template.placeholders {
            match names.iter().find(|n| n.unraw() == placeholder.root) {
                Some(root) => roots.push(root.clone()),
                None => errors.push(unknown_placeholder(lit, &placeholder.root, names)),
            }
        }
        Some(Key { template, roots })
    };
    match (&args.key, &args.keys) {
        (Some(lit), _) => scan(lit, errors).map(Keys::One),
        (None, Some((_, lits))) => {
            let mut keys = Vec::new();
            let mut repeated = Vec::new();
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
                keys.extend(scan(lit, errors));
            }
            for err in repeated {
                errors.push(err);
            }
            Some(Keys::Many(keys))
        }
        (None, None) if args.key_given => None,
        (None, None) => {
            errors.push(syn::Error::new(
                attribute_span(),
                "missing `key`: add e.g. `key = \"order:{order_id}\"`",
            ));
            None
        }
    }
}

/// A literal permit count is a whole number from 1 to `u32::MAX`.
fn permits_rule(args: &Args, errors: &mut Errors) -> Option<Permits> {
    match &args.permits {
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
        Some(PermitsArg::Expr(expr)) => Some(Permits::Expr(expr.clone())),
    }
}

/// `on_busy` is `"skip"` (the fn does not run while the lock is held elsewhere) or `"wait"`
/// (the default: wait up to `wait`); the value's span when it is `"skip"`.
fn on_busy_rule(args: &Args, errors: &mut Errors) -> Option<proc_macro2::Span> {
    let lit = args.on_busy.as_ref()?;
    match lit.value().as_str() {
        "skip" => Some(lit.span()),
        "wait" => None,
        other => {
            errors.push(syn::Error::new(
                lit.span(),
                format!("unknown `on_busy` value `{other}`; expected `\"skip\"` or `\"wait\"`"),
            ));
            None
        }
    }
}

/// `on_lost` is `"abort"` (the default) or `"continue"`; whether to abort.
fn on_lost_rule(args: &Args, errors: &mut Errors) -> bool {
    let Some(lit) = &args.on_lost else {
        return true;
    };
    match lit.value().as_str() {
        "abort" => true,
        "continue" => false,
        other => {
            errors.push(syn::Error::new(
                lit.span(),
                format!(
                    "unknown `on_lost` value `{other}`; expected `\"abort\"` or `\"continue\"`"
                ),
            ));
            true
        }
    }
}

/// `crate = "…"` is a path; `::distlock` unless given.
fn krate_rule(args: &Args, errors: &mut Errors) -> syn::Path {
    match &args.krate {
        None => syn::parse_quote!(::distlock),
        Some(lit) => errors
            .check(lit.parse::<syn::Path>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    "`crate` takes a path, e.g. `crate = \"my_locks\"`",
                )
            }))
            .unwrap_or_else(|| syn::parse_quote!(::distlock)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The macro refuses at compile time exactly the leases the runtime refuses at run time
    /// (`distlock::MIN_LEASE` and `MAX_LEASE`, `lease_out_of_bounds` in its `config.rs`): a
    /// literal the macro lets through must not fail when the fn is called, nor the reverse.
    #[test]
    fn the_macros_lease_bounds_are_the_runtimes() {
        let min = u64::try_from(distlock::MIN_LEASE.as_millis()).unwrap();
        let max = u64::try_from(distlock::MAX_LEASE.as_millis()).unwrap();
        assert_eq!((MIN_LEASE_MS, MAX_LEASE_MS), (min, max));
        for ms in [0, 1, min - 1, min, min + 1, 15_000, max - 1, max, max + 1] {
            let runtime_accepts = (distlock::MIN_LEASE..=distlock::MAX_LEASE)
                .contains(&std::time::Duration::from_millis(ms));
            assert_eq!(
                lease_problem(ms).is_none(),
                runtime_accepts,
                "a lease of {ms} ms: the macro and the runtime disagree"
            );
        }
    }
}

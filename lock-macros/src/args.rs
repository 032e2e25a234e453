//! The attribute's arguments: `name = value` pairs, parsed into [`Args`]. Most values are
//! literals; `client` is an expression, and the durations are a literal (checked at compile time
//! by `validate`) or an expression (checked at run time). Every problem is collected (unknown
//! name, duplicate, wrong kind of value) so the user sees them all at once.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, ExprLit, Ident, Lit, LitBool, LitStr, Token};

/// The argument names, for "expected one of" messages.
pub(crate) const NAMES: &str =
    "`key`, `keys`, `mode`, `permits`, `lease`, `wait`, `max_hold`, `hold_at_least`, `watchdog`, `on_lost`, `on_busy`, `fencing`, `fair`, `client`, `crate`";

/// A duration argument as written.
pub(crate) enum DurationArg {
    /// `lease = "15s"`: parsed and checked at compile time.
    Literal(LitStr),
    /// `lease = LEASE`, `lease = self.lease`: a `core::time::Duration`, checked at run time.
    Expr(Expr),
}

/// `permits = …` as written.
pub(crate) enum PermitsArg {
    /// `permits = 5`: checked at compile time.
    Literal(syn::LitInt),
    /// `permits = self.limit`, `permits = LIMIT`: a `u32`, checked at run time.
    Expr(Expr),
}

/// The arguments as written; rules across them are checked in `validate`.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    pub(crate) mode: Option<LitStr>,
    /// `keys = ["acct:{from}", "acct:{to}"]`: a multi-key lock; the name's span, for errors
    /// about it.
    pub(crate) keys: Option<(Span, Vec<LitStr>)>,
    /// `permits = N`: a semaphore of N permits on the key.
    pub(crate) permits: Option<PermitsArg>,
    pub(crate) lease: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) max_hold: Option<DurationArg>,
    /// `hold_at_least = "30s"`: a release before then keeps the lock to the end of the window.
    pub(crate) hold_at_least: Option<DurationArg>,
    pub(crate) watchdog: Option<LitBool>,
    pub(crate) fencing: Option<LitBool>,
    /// `fair = true`: the exclusive lock granted in request order; the name's span, for errors
    /// about it.
    pub(crate) fair: Option<(Span, LitBool)>,
    pub(crate) on_lost: Option<LitStr>,
    /// `on_busy = "skip"`: the fn does not run (and returns "skipped") when the lock is held.
    pub(crate) on_busy: Option<LitStr>,
    pub(crate) krate: Option<LitStr>,
    /// `client = <expr>`: a `&distlock::Client` to lock through instead of the global one.
    pub(crate) client: Option<Expr>,
    /// `key` was written, even if its value was unusable (so "missing `key`" is not said too).
    pub(crate) key_given: bool,
    /// Problems found while parsing; parsing goes on past them.
    pub(crate) errors: Vec<syn::Error>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        if let Err(err) = args.parse_pairs(input) {
            // Keep what was found before the syntax error: the user sees everything at once.
            let mut all = err;
            for earlier in args.errors.drain(..) {
                all.combine(earlier);
            }
            return Err(all);
        }
        Ok(args)
    }
}

impl Args {
    fn parse_pairs(&mut self, input: ParseStream<'_>) -> syn::Result<()> {
        let args = self;
        while !input.is_empty() {
            let name: Ident = if input.peek(Token![crate]) {
                let token: Token![crate] = input.parse()?;
                Ident::new("crate", token.span)
            } else {
                input.parse().map_err(|err| {
                    syn::Error::new(err.span(), format!("expected an argument: one of {NAMES}"))
                })?
            };
            input.parse::<Token![=]>().map_err(|err| {
                syn::Error::new(err.span(), format!("expected `=` after `{name}`"))
            })?;
            let value: Expr = input.parse()?;
            args.accept(&name, value);
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(())
    }

    fn accept(&mut self, name: &Ident, value: Expr) {
        if name == "key" {
            self.key_given = true;
        }
        let value = ungroup(value);
        let result = match name.to_string().as_str() {
            "key" => string(name, value).and_then(|v| set_once(&mut self.key, name, v)),
            "mode" => string(name, value).and_then(|v| set_once(&mut self.mode, name, v)),
            "keys" => {
                self.key_given = true;
                strings(name, value).and_then(|v| set_once(&mut self.keys, name, (name.span(), v)))
            }
            "permits" => permits(name, value).and_then(|v| set_once(&mut self.permits, name, v)),
            "lease" => duration(name, value).and_then(|v| set_once(&mut self.lease, name, v)),
            "wait" => duration(name, value).and_then(|v| set_once(&mut self.wait, name, v)),
            "max_hold" => duration(name, value).and_then(|v| set_once(&mut self.max_hold, name, v)),
            "hold_at_least" => {
                duration(name, value).and_then(|v| set_once(&mut self.hold_at_least, name, v))
            }
            "client" => client(name, value).and_then(|v| set_once(&mut self.client, name, v)),
            "on_lost" => string(name, value).and_then(|v| set_once(&mut self.on_lost, name, v)),
            "on_busy" => string(name, value).and_then(|v| set_once(&mut self.on_busy, name, v)),
            "crate" => string(name, value).and_then(|v| set_once(&mut self.krate, name, v)),
            "watchdog" => boolean(name, value).and_then(|v| set_once(&mut self.watchdog, name, v)),
            "fencing" => boolean(name, value).and_then(|v| set_once(&mut self.fencing, name, v)),
            "fair" => {
                boolean(name, value).and_then(|v| set_once(&mut self.fair, name, (name.span(), v)))
            }
            other => Err(syn::Error::new(
                name.span(),
                format!("unknown argument `{other}`; expected one of {NAMES}"),
            )),
        };
        if let Err(err) = result {
            self.errors.push(err);
        }
    }
}

/// A literal passed through `macro_rules!` (`$key:literal`) arrives wrapped in an invisible
/// group.
fn ungroup(value: Expr) -> Expr {
    match value {
        Expr::Group(group) => ungroup(*group.expr),
        Expr::Paren(paren) => ungroup(*paren.expr),
        other => other,
    }
}

/// Stores `value` unless the argument was given before; the error points at the repeat.
fn set_once<T>(slot: &mut Option<T>, name: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name.span(),
            format!("duplicate argument `{name}`: give it once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn string(name: &Ident, value: Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string literal, e.g. {}", example(name)),
        )),
    }
}

/// A string literal is a duration to parse; any other literal is a mistake (`lease = 15` has
/// no unit); anything else is an expression the compiler types as a `Duration`.
fn duration(name: &Ident, value: Expr) -> syn::Result<DurationArg> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(DurationArg::Literal(lit)),
        Expr::Lit(other) => Err(syn::Error::new_spanned(
            other,
            format!(
                "`{name}` takes a duration literal like {} or a `Duration` expression (a const, a field, `Duration::from_secs(15)`)",
                example(name)
            ),
        )),
        expr => Ok(DurationArg::Expr(expr)),
    }
}

/// `client` is an expression; a literal (`client = "locks"`) is the likely mistake of naming
/// the client instead of writing the expression that reaches it.
fn client(name: &Ident, value: Expr) -> syn::Result<Expr> {
    match value {
        Expr::Lit(lit) => Err(syn::Error::new_spanned(
            lit,
            format!("`{name}` takes an expression that evaluates to a `&distlock::Client`, e.g. `client = self.locks` or `client = &LOCKS`, not a literal"),
        )),
        expr => Ok(expr),
    }
}

/// `keys = [..]`: a non-empty array of string literals; each element that is not one is an
/// error at it.
fn strings(name: &Ident, value: Expr) -> syn::Result<Vec<LitStr>> {
    let array = match value {
        Expr::Array(array) => array,
        other => {
            return Err(syn::Error::new_spanned(
                other,
                format!("`{name}` takes an array of key templates, e.g. `keys = [\"acct:{{from}}\", \"acct:{{to}}\"]`"),
            ))
        }
    };
    if array.elems.is_empty() {
        return Err(syn::Error::new_spanned(
            array,
            format!("`{name}` needs at least one key template"),
        ));
    }
    let mut templates = Vec::new();
    let mut errors: Option<syn::Error> = None;
    for element in array.elems {
        match string(name, ungroup(element)) {
            Ok(lit) => templates.push(lit),
            Err(err) => match &mut errors {
                Some(all) => all.combine(err),
                None => errors = Some(err),
            },
        }
    }
    errors.map_or(Ok(templates), Err)
}

/// An integer literal is the count; another literal is a mistake; anything else is an
/// expression the compiler types as a `u32`.
fn permits(name: &Ident, value: Expr) -> syn::Result<PermitsArg> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => Ok(PermitsArg::Literal(lit)),
        Expr::Lit(other) => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a number of permits like `permits = 5`, or a `u32` expression"),
        )),
        expr => Ok(PermitsArg::Expr(expr)),
    }
}

fn boolean(name: &Ident, value: Expr) -> syn::Result<LitBool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(lit),
            ..
        }) => Ok(lit),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes `true` or `false`"),
        )),
    }
}

fn example(name: &Ident) -> &'static str {
    match name.to_string().as_str() {
        "key" => "`key = \"order:{order_id}\"`",
        "keys" => "`keys = [\"acct:{from}\", \"acct:{to}\"]`",
        "mode" => "`mode = \"read\"`",
        "lease" => "`lease = \"15s\"`",
        "wait" => "`wait = \"5s\"`",
        "max_hold" => "`max_hold = \"5m\"`",
        "hold_at_least" => "`hold_at_least = \"30s\"`",
        "on_lost" => "`on_lost = \"abort\"`",
        "on_busy" => "`on_busy = \"skip\"`",
        _ => "`crate = \"my_locks\"`",
    }
}

/// The span to blame for a missing argument: the attribute itself.
pub(crate) fn attribute_span() -> Span {
    Span::call_site()
}

//! The attribute's arguments: `name = literal` pairs, parsed into [`Args`]. Every problem is
//! collected (unknown name, duplicate, wrong literal kind) so the user sees them all at once.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, ExprLit, Ident, Lit, LitBool, LitStr, Token};

/// The argument names, for "expected one of" messages.
pub(crate) const NAMES: &str = "`key`, `lease`, `wait`, `watchdog`, `on_lost`, `crate`";

/// The arguments as written; rules across them are checked in `validate`.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    pub(crate) lease: Option<LitStr>,
    pub(crate) wait: Option<LitStr>,
    pub(crate) watchdog: Option<LitBool>,
    pub(crate) on_lost: Option<LitStr>,
    pub(crate) krate: Option<LitStr>,
    /// Problems found while parsing; parsing goes on past them.
    pub(crate) errors: Vec<syn::Error>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
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
        Ok(args)
    }
}

impl Args {
    fn accept(&mut self, name: &Ident, value: Expr) {
        let result = match name.to_string().as_str() {
            "key" => string(name, value).and_then(|v| set_once(&mut self.key, name, v)),
            "lease" => string(name, value).and_then(|v| set_once(&mut self.lease, name, v)),
            "wait" => string(name, value).and_then(|v| set_once(&mut self.wait, name, v)),
            "on_lost" => string(name, value).and_then(|v| set_once(&mut self.on_lost, name, v)),
            "crate" => string(name, value).and_then(|v| set_once(&mut self.krate, name, v)),
            "watchdog" => boolean(name, value).and_then(|v| set_once(&mut self.watchdog, name, v)),
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
        "lease" => "`lease = \"15s\"`",
        "wait" => "`wait = \"5s\"`",
        "on_lost" => "`on_lost = \"abort\"`",
        _ => "`crate = \"my_locks\"`",
    }
}

/// The span to blame for a missing argument: the attribute itself.
pub(crate) fn attribute_span() -> Span {
    Span::call_site()
}

//! Key templates: `"order:{order_id}"`, `{name.field.0}`, `{self.field}`, with `{{` and `}}` for
//! literal braces. Scanned once into a `format!` string and the placeholders' paths; each
//! placeholder's root is then resolved against the names the fn's parameters bind.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::{FnArg, Ident, LitStr, Member, Pat, Signature};

/// A placeholder: a root name and the fields or tuple indices after it.
pub(crate) struct Placeholder {
    pub(crate) root: String,
    pub(crate) members: Vec<String>,
}

/// A scanned template: the `format!` string (literal braces doubled, placeholders as `{}`) and
/// the placeholders in order.
pub(crate) struct Template {
    pub(crate) format: String,
    pub(crate) placeholders: Vec<Placeholder>,
}

const GRAMMAR: &str = "write `{name}`, `{name.field}`, `{name.0}` or `{self.field}`, and `{{` / `}}` for literal braces";

/// Scans the template; errors point at the literal and quote the offending part.
pub(crate) fn scan(lit: &LitStr) -> syn::Result<Template> {
    let text = lit.value();
    if text.is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "the lock key must not be empty, e.g. `key = \"order:{order_id}\"`",
        ));
    }
    let mut format = String::new();
    let mut placeholders = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                chars.next();
                format.push_str("{{");
            }
            '{' => {
                let rest = &text[at + 1..];
                let Some(len) = rest.find('}') else {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!("unclosed `{{` in the key template; {GRAMMAR}"),
                    ));
                };
                let inner = &rest[..len];
                if inner.contains('{') {
                    return Err(syn::Error::new(
                        lit.span(),
                        format!("unclosed `{{` before `{{{inner}}}`; {GRAMMAR}"),
                    ));
                }
                placeholders.push(placeholder(lit, inner)?);
                format.push_str("{}");
                for _ in 0..=len {
                    chars.next();
                }
            }
            '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                chars.next();
                format.push_str("}}");
            }
            '}' => {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("unmatched `}}` in the key template; {GRAMMAR}"),
                ))
            }
            c => format.push(c),
        }
    }
    Ok(Template {
        format,
        placeholders,
    })
}

fn placeholder(lit: &LitStr, inner: &str) -> syn::Result<Placeholder> {
    let trimmed = inner.trim();
    if trimmed.is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("empty placeholder `{{{inner}}}` in the key template; {GRAMMAR}"),
        ));
    }
    let mut parts = trimmed.split('.');
    let root = parts.next().unwrap_or_default();
    let is_ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_alphanumeric() || c == '_')
    };
    let is_index = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let members: Vec<String> = parts.map(str::to_owned).collect();
    if !is_ident(root) || !members.iter().all(|m| is_ident(m) || is_index(m)) {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{{{inner}}}` is not a placeholder the key template understands; {GRAMMAR}"),
        ));
    }
    Ok(Placeholder {
        root: root.to_owned(),
        members,
    })
}

/// The names a fn's parameters bind, walking destructuring patterns; `self` if it has a
/// receiver.
pub(crate) fn parameter_names(sig: &Signature) -> Vec<Ident> {
    let mut names = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => {
                names.push(Ident::new("self", receiver.self_token.span));
            }
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
        }
    }
    names
}

fn bound_names(pat: &Pat, names: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            names.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bound_names(&f.pat, names)),
        Pat::Slice(p) => p.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Reference(p) => bound_names(&p.pat, names),
        Pat::Paren(p) => bound_names(&p.pat, names),
        Pat::Type(p) => bound_names(&p.pat, names),
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                bound_names(first, names);
            }
        }
        _ => {}
    }
}

/// The expression that formats `placeholder`: `&(root.member…)`, the root taken from the
/// parameter (so it resolves to the user's binding), and `self` written as `receiver`.
pub(crate) fn argument(
    placeholder: &Placeholder,
    root: &Ident,
    receiver: &TokenStream,
) -> TokenStream {
    let members = placeholder.members.iter().map(|m| {
        let member: Member = match m.parse::<u32>() {
            Ok(index) => Member::Unnamed(syn::Index {
                index,
                span: root.span(),
            }),
            Err(_) => Member::Named(Ident::new(m, root.span())),
        };
        member.into_token_stream()
    });
    let root = if root == "self" {
        receiver.clone()
    } else {
        root.to_token_stream()
    };
    quote!(&(#root #(. #members)*))
}

//! Key templates: `"order:{order_id}"`, `{name.field.0}`, `{self.field}`, with `{{` and `}}` for
//! literal braces. Scanned once into a `format!` string and the placeholders' paths; each
//! placeholder's root is then resolved against the names the fn's parameters bind.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::{FnArg, Ident, LitStr, Member, Pat, Signature};

/// A placeholder: a root name and the fields or tuple indices after it.
pub(crate) struct Placeholder {
    /// The root as written, without `r#`.
    pub(crate) root: String,
    /// Fields and tuple indices, spanned at the key literal.
    pub(crate) members: Vec<Member>,
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
    // Byte offsets throughout: braces are ASCII, so slicing at them is always on a boundary.
    let mut rest = text.as_str();
    while let Some(at) = rest.find(['{', '}']) {
        format.push_str(&rest[..at]);
        let brace = &rest[at..at + 1];
        let after = &rest[at + 1..];
        if after.starts_with(brace) {
            format.push_str(if brace == "{" { "{{" } else { "}}" });
            rest = &after[1..];
            continue;
        }
        if brace == "}" {
            return Err(syn::Error::new(
                lit.span(),
                format!("unmatched `}}` in the key template; {GRAMMAR}"),
            ));
        }
        let Some(len) = after.find('}') else {
            return Err(syn::Error::new(
                lit.span(),
                format!("unclosed `{{` in the key template; {GRAMMAR}"),
            ));
        };
        let inner = &after[..len];
        if inner.contains('{') {
            return Err(syn::Error::new(
                lit.span(),
                format!("unclosed `{{` before `{{{inner}}}`; {GRAMMAR}"),
            ));
        }
        placeholders.push(placeholder(lit, inner)?);
        format.push_str("{}");
        rest = &after[len + 1..];
    }
    format.push_str(rest);
    Ok(Template {
        format,
        placeholders,
    })
}

fn placeholder(lit: &LitStr, inner: &str) -> syn::Result<Placeholder> {
    let trimmed = inner.trim();
    let invalid = |why: &str| {
        syn::Error::new(
            lit.span(),
            format!(
                "`{{{inner}}}` is not a placeholder the key template understands{why}; {GRAMMAR}"
            ),
        )
    };
    if trimmed.is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("empty placeholder `{{{inner}}}` in the key template; {GRAMMAR}"),
        ));
    }
    let mut parts = trimmed.split('.');
    let root = parts.next().unwrap_or_default();
    let root = root.strip_prefix("r#").unwrap_or(root);
    if root != "self" && identifier(root, lit).is_none() {
        return Err(invalid(""));
    }
    let mut members = Vec::new();
    for part in parts {
        let member = if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            let index = part
                .parse::<u32>()
                .map_err(|_| invalid(" (tuple index too large)"))?;
            Member::Unnamed(syn::Index {
                index,
                span: lit.span(),
            })
        } else {
            let name = part.strip_prefix("r#").unwrap_or(part);
            Member::Named(identifier(name, lit).ok_or_else(|| invalid(""))?)
        };
        members.push(member);
    }
    Ok(Placeholder {
        root: root.to_owned(),
        members,
    })
}

/// `name` as an identifier spanned at the literal, raw when it is a keyword (`type`).
fn identifier(name: &str, lit: &LitStr) -> Option<Ident> {
    // syn skips whitespace and comments around a token: insist that it read exactly `name`.
    if name.starts_with("r#") {
        return None; // `r#` was stripped once already
    }
    let valid = syn::parse_str::<Ident>(name).is_ok_and(|ident| ident == name);
    let valid_raw = !valid
        && !matches!(name, "self" | "Self" | "super" | "crate" | "_")
        && syn::parse_str::<Ident>(&format!("r#{name}"))
            .is_ok_and(|ident| ident.to_string().strip_prefix("r#") == Some(name));
    if valid {
        Some(Ident::new(name, lit.span()))
    } else if valid_raw {
        Some(Ident::new_raw(name, lit.span()))
    } else {
        None
    }
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

pub(crate) fn bound_names(pat: &Pat, names: &mut Vec<Ident>) {
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
    let members = &placeholder.members;
    let root = if placeholder.root == "self" {
        receiver.clone()
    } else {
        root.to_token_stream()
    };
    quote!(&(#root #(. #members)*))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(template: &str) -> syn::Result<Template> {
        scan(&LitStr::new(template, proc_macro2::Span::call_site()))
    }

    #[test]
    fn unicode_text_around_placeholders_is_kept() {
        let t = scanned("{é}:{id}/ключ{{x}}").unwrap();
        assert_eq!(t.format, "{}:{}/ключ{{x}}");
        assert_eq!(t.placeholders.len(), 2);
        assert_eq!(t.placeholders[0].root, "é");
        assert_eq!(scanned("{名前}xyz").unwrap().format, "{}xyz");
        assert_eq!(scanned("{{{id}}}").unwrap().format, "{{{}}}");
        assert_eq!(scanned("}}{{").unwrap().format, "}}{{");
    }

    #[test]
    fn odd_member_names_are_errors_not_panics() {
        for bad in [
            "{p.99999999999}",
            "{p.a½}",
            "{p.}",
            "{.p}",
            "{a b}",
            "{0}",
            "{p..q}",
        ] {
            assert!(scanned(bad).is_err(), "{bad}");
        }
        let raw = scanned("{item.type}:{r#type}").unwrap();
        assert_eq!(raw.placeholders[0].members.len(), 1);
        assert_eq!(raw.placeholders[1].root, "type");
    }
}

//! Code generation. Parses the attribute and the fn, works out the fn's [`Shape`] once, checks
//! them (`validate`), and rewrites the body. On any error the fn is emitted unchanged beside
//! the `compile_error!`s, so the rest of the crate (and rust-analyzer) keeps working, and the
//! crate does not build: there is no path that emits the fn unlocked without an error.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Block, Expr, ItemFn, Pat, ReturnType, Stmt, Type};

use crate::args::Args;
use crate::key;
use crate::validate::{self, Checked, Duration, Mode, Permits, Target};

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(err) => {
            let err = syn::Error::new(
                err.span(),
                format!("{err}; `#[distributed_lock]` applies to an `async fn` with a body"),
            );
            return with_error(item, err);
        }
    };
    let args: Args = match syn::parse2(args) {
        Ok(args) => args,
        Err(err) => return with_error(item, err),
    };
    let sig = &function.sig;
    let shape = Shape::of(sig, &mut function.block);
    let names = match &shape {
        Shape::AsyncTrait {
            future,
            ret: Some(ret),
        } => rebound_names(sig, &future.stmts[..ret.index]),
        _ => key::parameter_names(sig),
    };
    let is_async = !matches!(shape, Shape::NotAsync);
    let checked = validate::check(args, sig, is_async, &names);
    match (checked, shape) {
        (Err(err), _) => with_error(item, err),
        (Ok(_), Shape::NotAsync) => with_error(
            item,
            syn::Error::new(
                sig.fn_token.span,
                "`#[distributed_lock]` can only be applied to an `async fn`",
            ),
        ),
        (Ok(_), Shape::AsyncTrait { ret: None, .. }) => with_error(
            item,
            syn::Error::new(
                sig.ident.span(),
                "`#[distributed_lock]` needs the fn to return `Result<T, E>` where `E: From<distlock::LockError>`",
            ),
        ),
        (Ok(checked), Shape::AsyncTrait {
            future,
            ret: Some(ret),
        }) => {
            let output = output_type_of(&sig.output);
            lock_async_trait_future(future, ret, &checked, output);
            quote!(#function)
        }
        (Ok(checked), Shape::AsyncFn) => expand_async_fn(function, &checked),
    }
}

/// What sort of fn the attribute sits on, worked out once from the item (as tracing-attributes'
/// `AsyncInfo` does); every later step matches on it instead of looking again.
enum Shape<'a> {
    /// An `async fn`: its body is the user's code.
    AsyncFn,
    /// What `#[async_trait]` made of an `async fn` (the attribute placed below it): a plain fn
    /// whose body ends in `Box::pin(async move { REBINDINGS; let __ret: R = { BODY }; __ret })`.
    AsyncTrait {
        /// The `async move` block's body.
        future: &'a mut Block,
        /// Its `let __ret` statement; async-trait leaves none out unless the fn returns `()`,
        /// which cannot carry a lock error.
        ret: Option<RetStatement>,
    },
    /// A plain fn: not something the attribute can lock.
    NotAsync,
}

/// Where the user's body sits in an `#[async_trait]` future, and the type it was declared with.
struct RetStatement {
    index: usize,
    ty: Option<Box<Type>>,
}

impl<'a> Shape<'a> {
    fn of(sig: &syn::Signature, body: &'a mut Block) -> Self {
        if sig.asyncness.is_some() {
            return Shape::AsyncFn;
        }
        match boxed_async_block(body) {
            Some(future) => {
                let ret = ret_statement(future);
                Shape::AsyncTrait { future, ret }
            }
            None => Shape::NotAsync,
        }
    }
}

/// The names an `#[async_trait]` body binds before the user's code: `self` (as `__self`) and
/// the parameters it rebinds, including those of destructuring patterns, plus the parameters
/// of reference type, which it captures as they are (`sku: &str` is not rebound).
fn rebound_names(sig: &syn::Signature, bindings: &[Stmt]) -> Vec<syn::Ident> {
    let mut names: Vec<syn::Ident> = key::parameter_names(sig)
        .into_iter()
        .filter(|name| name == "self")
        .collect();
    for input in &sig.inputs {
        if let syn::FnArg::Typed(typed) = input {
            if let (Type::Reference(_), Pat::Ident(ident)) = (&*typed.ty, &*typed.pat) {
                names.push(ident.ident.clone());
            }
        }
    }
    for stmt in bindings {
        if let Stmt::Local(local) = stmt {
            key::bound_names(&local.pat, &mut names);
        }
    }
    names.retain(|name| !name.to_string().starts_with("__"));
    names
}

/// The original item plus the errors (tokio-macros' `token_stream_with_error`).
fn with_error(mut item: TokenStream, err: syn::Error) -> TokenStream {
    item.extend(err.into_compile_error());
    item
}

/// The statements before the locked call, in the order the user's code runs: the client, a
/// permit count written as an expression, the target's keys, then each duration expression, all before the body can move an argument. `receiver` is
/// what `self` is called where they run (`__self` in an `#[async_trait]` future).
//
//     let __distlock_client = ::distlock::__private::client_of(&(self.locks));  // or global_client()
//     let __distlock_target = ::distlock::__private::LockTarget::Key {
//         key: ::distlock::__private::format!("order:{}", &(order_id)), mode: … };
//     let __distlock_lease: ::distlock::__private::Duration = LEASE;  // an expression only
//     let __distlock_spec = ::distlock::__private::LockSpec { lease: Some(__distlock_lease), … };
fn locals(checked: &Checked, receiver: &TokenStream) -> TokenStream {
    let krate = &checked.krate;
    // Each key: `format!(template, arguments…)`.
    let formatted = |template: &key::Template, roots: &[syn::Ident]| {
        let format = &template.format;
        let arguments = template
            .placeholders
            .iter()
            .zip(roots)
            .map(|(placeholder, root)| key::argument(placeholder, root, receiver));
        quote!(#krate::__private::format!(#format #(, #arguments)*))
    };
    let mut locals = TokenStream::new();
    let target_value = match &checked.target {
        Target::Key { key, mode } => {
            let key = formatted(&key.template, &key.roots);
            let mode = match mode {
                Mode::Write => quote!(#krate::__private::LockMode::Write),
                Mode::Read => quote!(#krate::__private::LockMode::Read),
            };
            quote!(#krate::__private::LockTarget::Key { key: #key, mode: #mode })
        }
        Target::Permits { key, permits } => {
            let key = formatted(&key.template, &key.roots);
            let (permits, written) = match permits {
                Permits::Count(n) => (quote!(#n), quote!(::core::option::Option::None)),
                Permits::Expr(expr) => {
                    let local = binding("permits");
                    let written = source_text(expr.to_token_stream());
                    let value = with_receiver(expr.to_token_stream(), receiver);
                    locals.extend(quote! {
                        let #local: u32 = #value;
                    });
                    (
                        quote!(#local),
                        quote!(::core::option::Option::Some(#written)),
                    )
                }
            };
            quote!(#krate::__private::LockTarget::Permits {
                key: #key,
                permits: #permits,
                written: #written,
            })
        }
        // A `Vec<String>` of every key, in the order written.
        Target::Keys(keys) => {
            let keys = keys.iter().map(|key| formatted(&key.template, &key.roots));
            quote!(#krate::__private::LockTarget::Keys(#krate::__private::Vec::from([#(#keys),*])))
        }
    };
    let client = binding("client");
    let client_value = match &checked.client {
        // Spanned at the expression: a value that is no `&Client` is reported there.
        Some(expr) => {
            let expr = with_receiver(expr.to_token_stream(), receiver);
            quote_spanned!(expr_span(&checked.client)=> #krate::__private::client_of(&(#expr)))
        }
        None => quote!(#krate::__private::global_client()),
    };
    let target = binding("target");
    let mut durations = TokenStream::new();
    let mut duration = |name: &str, value: &Option<Duration>| match value {
        None => (
            quote!(::core::option::Option::None),
            quote!(::core::option::Option::None),
        ),
        Some(Duration::Millis(ms)) => (
            quote!(::core::option::Option::Some(#krate::__private::Duration::from_millis(#ms))),
            quote!(::core::option::Option::None),
        ),
        Some(Duration::Expr(expr)) => {
            let local = binding(name);
            let written = source_text(expr.to_token_stream());
            let expr = with_receiver(expr.to_token_stream(), receiver);
            durations.extend(quote! {
                let #local: #krate::__private::Duration = #expr;
            });
            (
                quote!(::core::option::Option::Some(#local)),
                quote!(::core::option::Option::Some(#written)),
            )
        }
    };
    let (lease, lease_expr) = duration("lease", &checked.lease);
    let (wait, _) = duration("wait", &checked.wait);
    let (max_hold, max_hold_expr) = duration("max_hold", &checked.max_hold);
    let (hold_at_least, _) = duration("hold_at_least", &checked.hold_at_least);
    let watchdog = checked.watchdog;
    let fair = checked.fair;
    let fencing = match checked.fencing {
        Some(fencing) => quote!(::core::option::Option::Some(#fencing)),
        None => quote!(::core::option::Option::None),
    };
    let on_lost = if checked.abort_on_lost {
        quote!(#krate::__private::OnLost::Abort)
    } else {
        quote!(#krate::__private::OnLost::Continue)
    };
    let spec = binding("spec");
    quote! {
        let #client = #client_value;
        #locals
        let #target = #target_value;
        #durations
        let #spec = #krate::__private::LockSpec {
            lease: #lease,
            wait: #wait,
            max_hold: #max_hold,
            watchdog: #watchdog,
            on_lost: #on_lost,
            fencing: #fencing,
            lease_expr: #lease_expr,
            max_hold_expr: #max_hold_expr,
            fair: #fair,
            hold_at_least: #hold_at_least,
            busy_expected: false,
        };
    }
}

/// `run_locked(client, target, spec, into, async move { BODY })`, naming the bindings of [`locals`].
fn locked_call(checked: &Checked, body: TokenStream) -> TokenStream {
    let krate = &checked.krate;
    let (client, target, spec, into) = (
        binding("client"),
        binding("target"),
        binding("spec"),
        binding("into"),
    );
    let skipped = binding("skipped");
    quote! {
        #krate::__private::run_locked(#client, #target, #spec, #into, #skipped, async move { #body })
    }
}

/// `let __distlock_skipped = …;`: with `on_busy = "skip"`, the value the fn returns when it is
/// skipped — checked to exist for the return type `ty` (`Result<(), E>`, `Result<Option<T>, E>`)
/// and spanned at the `on_busy` value, so an error is reported there; else `None`.
fn skipped_binding(checked: &Checked, ty: &Type) -> TokenStream {
    let skipped = binding("skipped");
    match checked.skip_on_busy {
        Some(span) => {
            let krate = respanned(checked.krate.to_token_stream(), span);
            // The return type comes in through the binding's type, not the call: the call (the
            // one place the bound is checked) is all at the argument, so its error is too.
            let call = quote_spanned! {span=> #krate::__private::skipped_value() };
            quote! {
                let #skipped: ::core::option::Option<fn() -> #ty> = ::core::option::Option::Some(#call);
            }
        }
        None => quote! {
            let #skipped = ::core::option::Option::None;
        },
    }
}

/// `let __distlock_into = lock_error_into::<R>();` (`impl Trait` in `R` as `_`): the one check that the return type can
/// carry a lock error, spanned at the return type so its error is reported there, once.
fn into_binding(checked: &Checked, ty: &Type, span: Span) -> TokenStream {
    // Every token of the call at the return type, the crate path too: a call whose tokens come
    // from two places is reported at the attribute.
    let krate = respanned(checked.krate.to_token_stream(), span);
    let into = binding("into");
    // The type's own tokens in the turbofish: the error underlines all of it.
    quote_spanned! {span=>
        let #into = #krate::__private::lock_error_into::<#ty>();
    }
}

/// An expression as the user wrote it, near enough for an error message: `Duration::ZERO`,
/// `self.lease`, `f(a, b)` (`stringify!` would space every token: `Duration :: ZERO`).
fn source_text(tokens: TokenStream) -> String {
    let mut text = String::new();
    let mut word_before = false;
    for token in tokens {
        let word = matches!(token, TokenTree::Ident(_) | TokenTree::Literal(_));
        if word && word_before {
            text.push(' ');
        }
        word_before = word;
        match token {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                text.push_str(open);
                text.push_str(&source_text(group.stream()));
                text.push_str(close);
            }
            TokenTree::Punct(punct) => {
                text.push(punct.as_char());
                if punct.as_char() == ',' {
                    text.push(' ');
                }
            }
            other => text.push_str(&other.to_string()),
        }
    }
    text
}

/// `tokens` with every span set to `span`.
fn respanned(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respanned(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            }
            token.set_span(span);
            token
        })
        .collect()
}

/// The span of an optional expression, or the attribute's.
fn expr_span(expr: &Option<syn::Expr>) -> Span {
    expr.as_ref().map_or_else(Span::call_site, Spanned::span)
}

/// `tokens` with every `self` replaced by `receiver`, for expressions moved into an
/// `#[async_trait]` future (where `self` is `__self`).
fn with_receiver(tokens: TokenStream, receiver: &TokenStream) -> TokenStream {
    tokens
        .into_iter()
        .flat_map(|token| match token {
            TokenTree::Ident(ident) if ident == "self" => receiver.clone(),
            TokenTree::Group(group) => {
                let mut inner =
                    Group::new(group.delimiter(), with_receiver(group.stream(), receiver));
                inner.set_span(group.span());
                TokenTree::Group(inner).into()
            }
            other => other.into(),
        })
        .collect()
}

// Input:
//
//     #[distributed_lock(key = "order:{order_id}", lease = "15s", client = self.locks)]
//     async fn reduce_stock(&self, order_id: u64) -> Result<(), AppError> { BODY }
//
// Output:
//
//     async fn reduce_stock(&self, order_id: u64) -> Result<(), AppError> {
//         let __distlock_into = ::distlock::__private::lock_error_into::<Result<(), AppError>>();
//         let __distlock_client = ::distlock::__private::client_of(&(self.locks));
//         let __distlock_target = ::distlock::__private::format!("order:{}", &(order_id));
//         let __distlock_spec = ::distlock::__private::LockSpec { … };
//         ::distlock::__private::run_locked(__distlock_client, __distlock_target, __distlock_spec,
//             __distlock_into, async move {
//                 #[allow(unreachable_code)]
//                 if false { let __distlock_fake: Result<(), AppError> = loop {}; return __distlock_fake; }
//                 BODY
//             })
//         .await
//     }
//
// The arguments are evaluated first, before the body can move an argument; the fake return
// edge pins the async block's output to the fn's return type so `?` and `return` infer as in
// the original.
fn expand_async_fn(function: ItemFn, checked: &Checked) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    // syn files a body's `#![inner]` attributes with the fn's: put them back inside.
    let (outer, inner): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Outer));
    let output = output_type_of(&sig.output);
    // `let` cannot name `impl Trait`: let inference fill those parts in.
    let mut pinned = output.clone();
    ImplTraitToInfer.visit_type_mut(&mut pinned);
    let into = into_binding(checked, &pinned, output.span());
    let skipped = skipped_binding(checked, &pinned);
    let locals = locals(checked, &quote!(self));
    let fake = binding("fake");
    let stmts = &block.stmts;
    let call = locked_call(
        checked,
        quote! {
            #[allow(unreachable_code, clippy::diverging_sub_expression)]
            if false {
                let #fake: #pinned = loop {};
                return #fake;
            }
            #(#stmts)*
        },
    );
    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #into
            #skipped
            #locals
            #call.await
        }
    }
}

fn output_type_of(output: &ReturnType) -> Type {
    match output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => syn::parse_quote!(()),
    }
}

/// Replaces every `impl Trait` in a type with `_`.
struct ImplTraitToInfer;

impl VisitMut for ImplTraitToInfer {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](impl_trait.impl_token.span),
            });
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

/// In an `#[async_trait]` future (`…; let __ret: R = { BODY }; __ret`), the `let __ret`
/// statement.
fn ret_statement(block: &Block) -> Option<RetStatement> {
    block
        .stmts
        .iter()
        .enumerate()
        .find_map(|(index, stmt)| match stmt {
            Stmt::Local(local) => match &local.pat {
                Pat::Type(typed) if matches!(&*typed.pat, Pat::Ident(p) if p.ident == "__ret") => {
                    Some(RetStatement {
                        index,
                        ty: Some(typed.ty.clone()),
                    })
                }
                Pat::Ident(p) if p.ident == "__ret" => Some(RetStatement { index, ty: None }),
                _ => None,
            },
            _ => None,
        })
}

/// The `async move` block of a body ending in `Box::pin(async move { … })`, the shape
/// `#[async_trait]` gives a method.
fn boxed_async_block(block: &mut Block) -> Option<&mut Block> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = block.stmts.last_mut() else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    if path.path.segments.last()?.ident != "pin" || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut()? {
        Expr::Async(inner) => Some(&mut inner.block),
        _ => None,
    }
}

// Input (what `#[async_trait]` made of the method):
//
//     fn reduce<'a, 'async_trait>(&'a self, id: u64) -> Pin<Box<dyn Future<Output = R> + Send + 'async_trait>> {
//         Box::pin(async move {
//             …; let __self = self; let id = id;
//             let __ret: R = { BODY };
//             __ret
//         })
//     }
//
// Output: the same, with the `let __ret` statement replaced by
//
//     let __distlock_into = ::distlock::__private::lock_error_into::<R>();
//     let __distlock_client = …; let __distlock_target = …; let __distlock_spec = …;  // `self` as `__self`
//     let __ret: R = ::distlock::__private::run_locked(__distlock_client, __distlock_target,
//         __distlock_spec, __distlock_into, async move { let __ret: R = { BODY }; __ret }).await;
fn lock_async_trait_future(future: &mut Block, ret: RetStatement, checked: &Checked, output: Type) {
    let renamed_self = future.stmts[..ret.index].iter().any(|stmt| {
        matches!(stmt, Stmt::Local(local) if matches!(&local.pat, Pat::Ident(p) if p.ident == "__self"))
    });
    let receiver = if renamed_self {
        quote!(__self)
    } else {
        quote!(self)
    };
    let locals = locals(checked, &receiver);
    let body = &future.stmts[ret.index];
    let ty = ret.ty.map_or(output, |ty| *ty);
    let into = into_binding(checked, &ty, ty.span());
    let skipped = skipped_binding(checked, &ty);
    let call = locked_call(
        checked,
        quote! {
            #body
            #[allow(unreachable_code)]
            __ret
        },
    );
    let replacement: Vec<Stmt> = syn::parse_quote! {
        #into
        #skipped
        #locals
        let __ret: #ty = #call.await;
    };
    future.stmts.splice(ret.index..=ret.index, replacement);
}

/// An internal binding, `__distlock_<name>`; mixed-site, so it cannot clash with the user's
/// names.
fn binding(name: &str) -> syn::Ident {
    syn::Ident::new(&format!("__distlock_{name}"), Span::mixed_site())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output either locks the body (calls `run_locked`) or carries a compile error:
    /// the attribute never emits an unlocked fn that builds.
    fn locks_or_fails(item: TokenStream) {
        let output = distributed_lock(quote!(key = "k"), item.clone()).to_string();
        let locks = output.contains("run_locked");
        let fails = output.contains("compile_error");
        assert!(
            locks ^ fails,
            "neither locked nor an error for `{item}`:\n{output}"
        );
    }

    #[test]
    fn fair_as_written_reaches_the_lock_spec_and_is_off_unless_asked() {
        let item = quote!(
            async fn f() -> Result<(), E> {
                Ok(())
            }
        );
        for (args, expected) in [
            (quote!(key = "k", fair = true), "fair : true"),
            (quote!(key = "k", fair = false), "fair : false"),
            (quote!(key = "k"), "fair : false"),
        ] {
            let output = distributed_lock(args.clone(), item.clone()).to_string();
            assert!(
                output.contains(expected) && !output.contains("compile_error"),
                "`{args}` should expand to `{expected}`:\n{output}"
            );
        }
    }

    #[test]
    fn self_in_an_expression_becomes_the_receiver_also_inside_groups() {
        let expr = quote!(self.locks(&self.config[0]));
        let replaced = with_receiver(expr, &quote!(__self)).to_string();
        assert_eq!(
            replaced,
            quote!(__self.locks(&__self.config[0])).to_string()
        );
    }

    #[test]
    fn an_expression_is_shown_as_written() {
        for written in [
            "Duration::ZERO",
            "self.lease",
            "Duration::from_millis(500)",
            "settings.lease(1, &x)",
            "LEASES[2]",
        ] {
            let expr: syn::Expr = syn::parse_str(written).unwrap();
            assert_eq!(source_text(expr.to_token_stream()), written);
        }
    }

    #[test]
    fn every_fn_shape_is_locked_or_rejected_never_passed_through() {
        let shapes = [
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
            quote!(
                fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
            quote!(
                fn f() -> Result<(), E> {
                    Box::pin(async move { Ok(()) })
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(async move {
                        let __ret: R = { Ok(()) };
                        __ret
                    })
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(async move {
                        let __ret = { Ok(()) };
                        __ret
                    })
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(async move {
                        let (__ret, x) = (1, 2);
                        __ret
                    })
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(async { Ok(()) }, extra)
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(ready(Ok(())))
                }
            ),
            quote!(
                fn f() -> R {
                    Other::wrap(async move {
                        let __ret: R = { Ok(()) };
                        __ret
                    })
                }
            ),
            quote!(
                fn f() -> R {
                    Box::pin(async move {
                        let __ret: R = { Ok(()) };
                        __ret
                    });
                }
            ),
            quote!(
                async fn f() {}
            ),
            quote!(
                struct S;
            ),
        ];
        for shape in shapes {
            locks_or_fails(shape);
        }
    }
}

//! Code generation. Parses the attribute and the fn, works out the fn's [`Shape`] once, checks
//! them (`validate`), and rewrites the body. On any error the fn is emitted unchanged beside
//! the `compile_error!`s, so the rest of the crate (and rust-analyzer) keeps working, and the
//! crate does not build: there is no path that emits the fn unlocked without an error.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Block, Expr, ItemFn, Pat, ReturnType, Stmt, Type};

use crate::args::Args;
use crate::key;
use crate::validate::{self, Checked, Mode};

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
/// the parameters it rebinds, including those of destructuring patterns.
fn rebound_names(sig: &syn::Signature, bindings: &[Stmt]) -> Vec<syn::Ident> {
    let mut names: Vec<syn::Ident> = key::parameter_names(sig)
        .into_iter()
        .filter(|name| name == "self")
        .collect();
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

/// `let __distlock_key = format!(…);` and the `LockSpec` value, naming `self` as `receiver`.
fn key_and_spec(checked: &Checked, receiver: &TokenStream) -> (TokenStream, TokenStream) {
    let krate = &checked.krate;
    let format = &checked.template.format;
    let arguments = checked
        .template
        .placeholders
        .iter()
        .zip(&checked.key_roots)
        .map(|(placeholder, root)| key::argument(placeholder, root, receiver));
    let binding = key_binding();
    let key = quote! {
        let #binding = #krate::__private::format!(#format #(, #arguments)*);
    };
    let millis = |ms: Option<u64>| match ms {
        Some(ms) => {
            quote!(::core::option::Option::Some(#krate::__private::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    let lease = millis(checked.lease_ms);
    let wait = millis(checked.wait_ms);
    let max_hold = millis(checked.max_hold_ms);
    let watchdog = checked.watchdog;
    let fencing = match checked.fencing {
        Some(fencing) => quote!(::core::option::Option::Some(#fencing)),
        None => quote!(::core::option::Option::None),
    };
    let on_lost = if checked.abort_on_lost {
        quote!(#krate::__private::OnLost::Abort)
    } else {
        quote!(#krate::__private::OnLost::Continue)
    };
    let mode = match checked.mode {
        Mode::Write => quote!(#krate::__private::LockMode::Write),
        Mode::Read => quote!(#krate::__private::LockMode::Read),
    };
    let spec = quote! {
        #krate::__private::LockSpec { mode: #mode, lease: #lease, wait: #wait, max_hold: #max_hold, watchdog: #watchdog, on_lost: #on_lost, fencing: #fencing }
    };
    (key, spec)
}

// Input:
//
//     #[distributed_lock(key = "order:{order_id}", lease = "15s")]
//     async fn reduce_stock(&self, order_id: u64) -> Result<(), AppError> { BODY }
//
// Output:
//
//     async fn reduce_stock(&self, order_id: u64) -> Result<(), AppError> {
//         ::distlock::__private::assert_lock_result::<Result<(), AppError>>();
//         let __distlock_key = ::distlock::__private::format!("order:{}", &(order_id));
//         ::distlock::__private::run_locked(#binding, LockSpec { … }, async move {
//             #[allow(unreachable_code)]
//             if false { let __distlock_fake: Result<(), AppError> = loop {}; return __distlock_fake; }
//             BODY
//         })
//         .await
//     }
//
// The key is built first, before the body can move an argument; the fake return edge pins the
// async block's output to the fn's return type so `?` and `return` infer as in the original.
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
    let krate = &checked.krate;
    let (key, spec) = key_and_spec(checked, &quote!(self));
    // Mixed-site hygiene, but located at the return type, so a type error points there.
    let fake = syn::Ident::new(
        "__distlock_fake",
        Span::mixed_site().located_at(output.span()),
    );
    let assert = quote_spanned! {output.span()=>
        #krate::__private::assert_lock_result_of(&#fake);
    };
    let stmts = &block.stmts;
    let binding = key_binding();
    quote! {
        #(#outer)*
        #vis #sig {
            #(#inner)*
            #key
            #krate::__private::run_locked(#binding, #spec, async move {
                #[allow(unreachable_code, clippy::diverging_sub_expression)]
                if false {
                    let #fake: #pinned = loop {};
                    #assert
                    return #fake;
                }
                #(#stmts)*
            })
            .await
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
//     let __distlock_key = ::distlock::__private::format!("…", &(__self.field), &(id));
//     let __ret: R = ::distlock::__private::run_locked(#binding, LockSpec { … },
//         async move { let __ret: R = { BODY }; __ret }).await;
fn lock_async_trait_future(future: &mut Block, ret: RetStatement, checked: &Checked, output: Type) {
    let krate = checked.krate.clone();
    let renamed_self = future.stmts[..ret.index].iter().any(|stmt| {
        matches!(stmt, Stmt::Local(local) if matches!(&local.pat, Pat::Ident(p) if p.ident == "__self"))
    });
    let receiver = if renamed_self {
        quote!(__self)
    } else {
        quote!(self)
    };
    let (key, spec) = key_and_spec(checked, &receiver);
    let body = &future.stmts[ret.index];
    let ty = ret.ty.map_or(output, |ty| *ty);
    let assert = quote_spanned! {ty.span()=>
        #krate::__private::assert_lock_result::<#ty>();
    };
    let binding = key_binding();
    let replacement: Vec<Stmt> = syn::parse_quote! {
        #assert
        #key
        let __ret: #ty = #krate::__private::run_locked(#binding, #spec, async move {
            #body
            #[allow(unreachable_code)]
            __ret
        })
        .await;
    };
    future.stmts.splice(ret.index..=ret.index, replacement);
}

/// The internal binding of the key; mixed-site, so it cannot clash with the user's names.
fn key_binding() -> syn::Ident {
    syn::Ident::new("__distlock_key", Span::mixed_site())
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

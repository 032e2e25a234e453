//! The `#[distributed_lock]` attribute of [distlock](https://docs.rs/distlock). Use it through
//! the facade (`distlock::distributed_lock`); its documentation lives there.
//!
//! Layout: `args` parses the attribute, `duration` and `key` parse its literals, `validate`
//! checks rules across arguments and the fn, `expand` writes the code.
#![deny(missing_docs)]

mod args;
mod duration;
mod expand;
mod key;
mod validate;

#[cfg(test)]
mod fuzz;

use proc_macro::TokenStream;

/// Runs an async fn under a distributed lock whose key is built from its arguments.
/// See the `distlock` crate for the arguments and examples.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}

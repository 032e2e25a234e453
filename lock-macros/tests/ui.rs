//! The attribute's compile-time contract. Compile-fail cases, a function per message (the
//! attribute's own refusals grouped in a file per theme: trybuild compiles each file as a
//! crate of its own, and every crate costs its dependencies' loading), run through
//! trybuild; the `.stderr` files were made with rustc 1.95.0, and a different compiler may word
//! its own parts differently (refresh them with
//! `TRYBUILD=overwrite cargo test -p lock-macros --test ui` and review the diff). Pass cases —
//! code that must compile — are modules of this test binary, so they build with the test build
//! itself; trybuild, with no pass case, only type-checks its own project (`cargo check`, no
//! code generation for the dependencies), which keeps this test cheap.

#[path = "ui/pass/client_and_duration_expressions.rs"]
#[allow(dead_code)]
mod client_and_duration_expressions;
#[path = "ui/pass/fair.rs"]
mod fair;
#[path = "ui/pass/hygiene.rs"]
mod hygiene;
#[path = "ui/pass/modes.rs"]
mod modes;
#[path = "ui/pass/multi_key.rs"]
#[allow(dead_code)]
mod multi_key;
#[path = "ui/pass/semaphores.rs"]
#[allow(dead_code)]
mod semaphores;

#[test]
fn misuse_fails_to_compile_with_its_message() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}

/// The pass cases that build a value run, as their binaries did: the annotated calls make
/// their futures without a runtime.
#[test]
fn pass_cases_run() {
    fair::run();
    multi_key::run();
    semaphores::run();
}

//! Compile-fail cases (one per message) and hard pass cases. The `.stderr` files were made with
//! rustc 1.95.0; a different compiler may word its own parts differently. Refresh them with
//! `TRYBUILD=overwrite cargo test -p lock-macros --test ui` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}

//! The enforce path's types stay small: a `Context` is built per request,
//! an `Outcome` and the enforce result are returned per request, and the
//! `Enforce` future lives in every async caller's state. A change that
//! grows one of them fails here and says so.

use kv_stage::{Context, EnforceError, info::Enforce, object::Outcome};

#[test]
fn the_enforce_path_types_keep_their_size() {
    let sizes = [
        ("Context", size_of::<Context>()),
        ("Outcome", size_of::<Outcome>()),
        ("Result<Outcome, EnforceError>", size_of::<Result<Outcome, EnforceError>>()),
        ("EnforceError", size_of::<EnforceError>()),
        ("Enforce", size_of::<Enforce<'static>>()),
    ];
    // The error is a box: the result is no larger than the outcome, and a
    // request that fails pays for the allocation, not every request.
    assert_eq!(
        sizes,
        [
            ("Context", 24),
            ("Outcome", 40),
            ("Result<Outcome, EnforceError>", 40),
            ("EnforceError", 8),
            ("Enforce", 128)
        ],
        "a type of the enforce path changed size: if on purpose, say so here and in ARCHITECTURE.md"
    );
}

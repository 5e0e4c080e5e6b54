//! Every Rust snippet of the README and `docs/`, compiled (see
//! `tests/build.rs`): a snippet that stops compiling fails the build.

include!(concat!(env!("OUT_DIR"), "/readme_snippets.rs"));

/// The README has six; none found would mean the extraction broke.
const _: () = assert!(SNIPPETS >= 6);

#[test]
fn every_rust_block_of_the_docs_is_compiled() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = vec![root.join("README.md")];
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        files.extend(dir.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")));
    }
    let blocks: usize = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().filter(|l| l.trim_start().starts_with("```rust") && !l.contains("ignore")).count()
        })
        .sum();
    assert_eq!(blocks, SNIPPETS, "rust blocks in the docs vs snippets compiled");
}

//! Turns every ```rust block of the README (and of `docs/*.md`) into a
//! function of the `readme_snippets` test, so a snippet that no longer
//! compiles fails the build. A block may say what it assumes from the text
//! around it in an HTML comment just before it (invisible on GitHub):
//! `<!-- snippet: opts stage db -->`, each name given a value here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What a block may assume, in the order they are set up.
const NEEDS: [(&str, &str); 4] = [
    ("opts", "let mut opts = rocks_env::rocksdb::Options::default(); opts.create_if_missing(true);"),
    (
        "stage",
        "let stage = std::sync::Arc::new(kv_stage::Stage::new(\"readme\")); \
         rocks_env::RocksLayout::new().install(&stage)?;",
    ),
    (
        "db",
        "let db = rocks_env::StagedDb::builder(opts.clone()).stage(std::sync::Arc::clone(&stage)).open(std::env::temp_dir().join(\"readme\"))?;",
    ),
    (
        "protected",
        "let db = kv_async::ProtectedDb::open(std::env::temp_dir().join(\"readme-protected\"), opts.clone(), \
         kv_async::Protection::default().tenant(\"gold\", \"200ops/s\"))?;",
    ),
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let mut files = vec![root.join("README.md")];
    if let Ok(dir) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> =
            dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "md")).collect();
        docs.sort();
        files.extend(docs);
    }
    let mut out = String::new();
    let mut count = 0usize;
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut needs: Vec<String> = Vec::new();
        let mut block: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match &mut block {
                Some((start, code)) if line.trim_start().starts_with("```") => {
                    count += 1;
                    let mut prelude = String::new();
                    for (name, setup) in NEEDS {
                        if needs.iter().any(|n| n == name) {
                            prelude += setup;
                            prelude.push('\n');
                        }
                    }
                    let rel = file.strip_prefix(&root).unwrap_or(file).display().to_string();
                    writeln!(
                        out,
                        "/// {rel}, line {start}.\n#[allow(unused, clippy::all)]\nfn snippet_{count}() -> Result<(), Box<dyn std::error::Error>> {{\n{prelude}{{\n{code}}}\nOk(())\n}}\n",
                        start = *start + 1
                    )
                    .unwrap();
                    block = None;
                    needs.clear();
                }
                Some((_, code)) => {
                    code.push_str(line);
                    code.push('\n');
                }
                None if line.trim_start().starts_with("```rust") => {
                    if line.contains("ignore") {
                        continue;
                    }
                    block = Some((i, String::new()));
                }
                None => {
                    if let Some(rest) = line.trim().strip_prefix("<!-- snippet:") {
                        let names = rest.trim_end_matches("-->").split_whitespace();
                        needs = names.map(str::to_owned).collect();
                        for n in &needs {
                            assert!(
                                NEEDS.iter().any(|(k, _)| k == n),
                                "{}:{}: unknown snippet need '{n}'",
                                file.display(),
                                i + 1
                            );
                        }
                    } else if !line.trim().is_empty() {
                        needs.clear();
                    }
                }
            }
        }
    }
    writeln!(out, "/// How many blocks were found.\npub const SNIPPETS: usize = {count};").unwrap();
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("readme_snippets.rs");
    std::fs::write(dest, out).expect("write the snippets");
}

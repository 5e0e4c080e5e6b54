//! No import circles: within each crate, the top-level modules (a file
//! `src/x.rs` or a folder `src/x/`, taken as one node) must use each other
//! along a graph without cycles. A module reaches another through any
//! `crate::other` path in its files (a `use`, a type in a signature, a call).
//!
//! The crate root (`lib.rs`, `main.rs`, `bin/`) is outside the graph: it
//! declares and re-exports every module. A circle is reported with the
//! file and line of each step, so the fix can start from the error.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const CRATES: [&str; 8] =
    ["kv-stage", "rocks-env", "controller", "kv-remote", "kv-async", "bench-ycsb", "kv-preload", "tests"];

/// Where module `from` names module `to`: the first file and line.
type Edges = BTreeMap<String, BTreeMap<String, (PathBuf, usize)>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The modules a line names through `crate::`: `crate::a::b` gives `a`,
/// `crate::{a, b::c}` gives `a` and `b` (nested braces further in are the
/// inner paths of `a` or `b`, not modules of the crate root).
fn named_modules(line: &str, out: &mut Vec<String>) {
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        // `kv_stage::` or `$crate::` is not this crate's path.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !item.is_empty() {
                            out.push(std::mem::take(&mut item));
                        }
                        at_start = true;
                    }
                    c if depth == 0 && at_start && (c.is_alphanumeric() || c == '_') => item.push(c),
                    c if depth == 0 && at_start && item.is_empty() && c.is_whitespace() => {}
                    _ if depth == 0 && at_start && !item.is_empty() => {
                        out.push(std::mem::take(&mut item));
                        at_start = false;
                    }
                    _ => {}
                }
            }
            if !item.is_empty() {
                out.push(item);
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
}

fn edges_of(krate: &Path) -> (BTreeSet<String>, Edges) {
    let src = krate.join("src");
    let mut modules = BTreeSet::new();
    for e in fs::read_dir(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display())).flatten() {
        let p = e.path();
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
        if matches!(name.as_str(), "lib" | "main" | "bin") {
            continue;
        }
        if p.is_dir() || p.extension().is_some_and(|x| x == "rs") {
            modules.insert(name);
        }
    }
    let mut edges = Edges::new();
    for m in &modules {
        let mut files = Vec::new();
        let dir = src.join(m);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        let file = src.join(format!("{m}.rs"));
        if file.is_file() {
            files.push(file);
        }
        for f in files {
            let text = fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let mut named = Vec::new();
                named_modules(code, &mut named);
                for to in named {
                    if &to != m && modules.contains(&to) {
                        edges.entry(m.clone()).or_default().entry(to).or_insert_with(|| (f.clone(), n + 1));
                    }
                }
            }
        }
    }
    (modules, edges)
}

/// One cycle of the graph, as its nodes in order, if there is any.
fn find_cycle(modules: &BTreeSet<String>, edges: &Edges) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        m: &str,
        edges: &Edges,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(m.to_owned(), Mark::Open);
        path.push(m.to_owned());
        for to in edges.get(m).into_iter().flat_map(|t| t.keys()) {
            match marks.get(to).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let start = path.iter().position(|p| p == to).expect("an open node is on the path");
                    return Some(path[start..].to_vec());
                }
                Mark::New => {
                    if let Some(c) = visit(to, edges, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(m.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in modules {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(c) = visit(m, edges, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn describe(cycle: &[String], edges: &Edges, root: &Path) -> String {
    let mut s = String::new();
    for (i, from) in cycle.iter().enumerate() {
        let to = &cycle[(i + 1) % cycle.len()];
        let (file, line) = &edges[from][to];
        let shown = file.strip_prefix(root).unwrap_or(file);
        s.push_str(&format!("\n  {from} -> {to} ({}:{line})", shown.display()));
    }
    s
}

#[test]
fn no_crate_has_an_import_circle_between_its_top_level_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let mut circles = Vec::new();
    for c in CRATES {
        let (modules, edges) = edges_of(&root.join(c));
        if let Some(cycle) = find_cycle(&modules, &edges) {
            circles.push(format!("{c}: {}{}", cycle.join(" -> "), describe(&cycle, &edges, &root)));
        }
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_checker_reads_paths_and_groups() {
    let mut named = Vec::new();
    named_modules("use crate::objects::{bucket::now_ns, Drl};", &mut named);
    named_modules("use crate::{clock, stage::{Stage, info::X}, units::Rate};", &mut named);
    named_modules("let x = kv_stage::units::Rate::UNLIMITED; $crate::error::E", &mut named);
    named_modules("fn f(c: &crate::config::Config) -> crate::Result<()>", &mut named);
    assert_eq!(named, ["objects", "clock", "stage", "units", "config", "Result"]);

    let modules: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let mut edges = Edges::new();
    let at = (PathBuf::from("x.rs"), 1);
    edges.entry("a".into()).or_default().insert("b".into(), at.clone());
    edges.entry("b".into()).or_default().insert("c".into(), at.clone());
    assert_eq!(find_cycle(&modules, &edges), None);
    edges.entry("c".into()).or_default().insert("a".into(), at);
    assert_eq!(find_cycle(&modules, &edges), Some(vec!["a".into(), "b".into(), "c".into()]));
}

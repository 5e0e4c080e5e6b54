//! The documents hold together: every relative link of the README,
//! ARCHITECTURE.md, `docs/` and `results/` names a file that exists (and,
//! for `page.md#anchor`, a heading of that page), and the README stays a
//! guide (under 250 lines; the topics live in `docs/`).

use std::fs;
use std::path::{Path, PathBuf};

fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for dir in ["docs", "results"] {
        let mut stack = vec![root.join(dir)];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())).flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "md") {
                    files.push(p);
                }
            }
        }
    }
    files.sort();
    files
}

/// `[text](target)` targets of a page, outside code blocks.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains(char::is_whitespace) {
                out.push((n + 1, target.to_owned()));
            }
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim_start_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let mut broken = Vec::new();
    for file in markdown_files(&root) {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let shown = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, frag) = target.split_once('#').map_or((target.as_str(), None), |(p, f)| (p, Some(f)));
            let page = if path.is_empty() { file.clone() } else { file.parent().expect("a folder").join(path) };
            if !page.exists() {
                broken.push(format!("{shown}:{line}: {target} (no such file)"));
                continue;
            }
            if let Some(frag) = frag.filter(|_| page.extension().is_some_and(|x| x == "md")) {
                let body = fs::read_to_string(&page).unwrap_or_default();
                if !body.lines().filter(|l| l.starts_with('#')).any(|h| anchor(h) == frag) {
                    broken.push(format!("{shown}:{line}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_guide() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines < 250, "README.md has {lines} lines: move the topic into a docs/ page and link it");
    for page in ["embedding", "controllers", "rules", "async", "volumes", "fleet", "benchmarks", "service-recipe"] {
        assert!(readme.contains(&format!("](docs/{page}.md)")), "the README links docs/{page}.md");
    }
}

#[test]
fn anchors_and_links_are_read_as_github_does() {
    assert_eq!(anchor("### Why was a request slow"), "why-was-a-request-slow");
    assert_eq!(anchor("## YCSB, side by side"), "ycsb-side-by-side");
    assert_eq!(anchor("### Unmodified programs: the `LD_PRELOAD` layer"), "unmodified-programs-the-ld_preload-layer");
    let l = links("see [a](x.md#y) and [b](https://e.org)\n```\n[c](not-a-link)\n```\n[d](z/)");
    assert_eq!(l, [(1, "x.md#y".into()), (1, "https://e.org".into()), (5, "z/".into())]);
}

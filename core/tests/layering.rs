//! The crate's modules are layered: `use crate::…` between two top-level modules runs one way only, so
//! that each can be read, tested and changed knowing only what lies below it (DESIGN §2). This test reads
//! `src/` and fails, naming the lines, when two modules reach each other, directly or through others.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module → the top-level modules it names, with where (file:line) for the report.
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The top-level module a file under `src/` belongs to (`lib` for `lib.rs`).
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The module names after each `crate::` on a line (`crate::a::b` → `a`; `crate::{a, b::c}` → `a`, `b`).
/// Items re-exported at the crate root (`crate::Error`) start with a capital and are not modules.
fn named_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let heads: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').collect()
        } else {
            vec![rest]
        };
        for head in heads {
            let name: String = head
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.starts_with(|c: char| c.is_ascii_lowercase()) {
                out.push(name);
            }
        }
    }
    out
}

fn collect(dir: &Path, root: &Path, graph: &mut Graph) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, root, graph);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(root).expect("under src/");
        let from = module_of(rel);
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        // A file's unit tests may use anything: they are not part of the layering.
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for to in named_modules(line) {
                if to != from && from != "lib" {
                    graph
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .push(format!("{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
}

/// A cycle through `start`, if any: the modules in order, `start` first.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &Graph,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flat_map(|e| e.keys()) {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    let mut seen = BTreeSet::new();
    walk(graph, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn imports_between_the_crates_modules_run_one_way() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    collect(&root, &root, &mut graph);
    assert!(
        graph.len() > 10,
        "the modules of {} were not found: {graph:?}",
        root.display()
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_from(&graph, m))
        .map(|cycle| {
            let mut steps = Vec::new();
            for (i, from) in cycle.iter().enumerate() {
                let to = &cycle[(i + 1) % cycle.len()];
                let at = &graph[from][to];
                steps.push(format!("{from} -> {to} (at {})", at.join(", ")));
            }
            steps.join("; ")
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "modules that reach each other:\n  {}",
        cycles.join("\n  ")
    );
}

#[test]
fn the_scanner_sees_grouped_and_nested_module_paths_and_skips_root_items() {
    assert_eq!(
        named_modules("use crate::machine::{Reply, Tally};"),
        ["machine"]
    );
    assert_eq!(
        named_modules("use crate::{batch_queue::Entry, driver::Engine, Error};"),
        ["batch_queue", "driver"]
    );
    assert_eq!(
        named_modules("let d = crate::config::drift(ttl, f) + crate::time::add(a, b);"),
        ["config", "time"]
    );
    assert!(named_modules("pub use crate::Error;").is_empty());
    let mut graph = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph
            .entry(a.into())
            .or_default()
            .insert(b.into(), vec![format!("{a}.rs:1")]);
    }
    assert_eq!(cycle_from(&graph, "a").unwrap(), ["a", "b", "c"]);
    assert_eq!(cycle_from(&graph, "d"), None);
}

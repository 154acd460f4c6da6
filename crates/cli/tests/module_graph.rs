//! Inside every crate of the workspace, modules depend on each other in one direction only: no
//! module reaches, through any chain of `crate::` paths, back to itself. (Between crates Cargo
//! already forbids cycles.) In the pager, for one, a thread's module (fault handling, eviction,
//! reclaim, prefetch hints) may use the engine's parts; a part never uses a thread's module.
//!
//! The graph is read from the source: every `crate::a::...` path outside comments and
//! `#[cfg(test)]` items is an edge from the file's top-level module to `a` (a module's
//! sub-files, `store/...`, count as that module, so edges between them are not checked; a root
//! re-export such as `crate::RegionConfig` counts as the module it comes from). A cycle fails
//! the test with the paths that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A reference found in the source: which top-level module it names, and where.
#[derive(Debug, Clone)]
struct Reference {
    to: String,
    at: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a.rs`, `src/a/mod.rs` and `src/a/b.rs` all belong to module `a`; the crate root
/// (`src/lib.rs`, `src/main.rs`) to none.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(name) => Some(name.to_string()),
        None => Some(first),
    }
}

/// The source without comments (line comments and doc comments; block comments are not used
/// in this crate outside tests) and without `#[cfg(test)]` items.
fn code_only(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        let line = match line.find("//") {
            // A `//` inside a string literal (a URL) cuts the rest of its line, which at worst
            // hides a reference on that line.
            Some(i) => &line[..i],
            None => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    strip_test_items(&code)
}

/// Removes every item after `#[cfg(test)]`: up to its `;` or its matching `}`.
fn strip_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        let end = match (item.find('{'), item.find(';')) {
            (Some(brace), semi) if semi.is_none_or(|s| brace < s) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (j, c) in item[brace..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = brace + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => item.len(),
        };
        // Keep the line count, so that later line numbers still match the file.
        out.extend(item[..end].chars().filter(|&c| c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The first path segment of every entry of a `{...}` group starting at `group[0] == '{'`.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut at_entry_start = true;
    let mut chars = group.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => {
                depth += 1;
                at_entry_start = depth == 1;
            }
            '}' => {
                if depth == 1 {
                    break;
                }
                depth -= 1;
            }
            ',' if depth == 1 => at_entry_start = true,
            c if depth == 1 && at_entry_start && (c.is_alphanumeric() || c == '_') => {
                let len = group[i..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(group.len() - i);
                heads.push(group[i..i + len].to_string());
                at_entry_start = false;
                for _ in 1..len {
                    chars.next();
                }
            }
            _ => {}
        }
    }
    heads
}

/// The top-level module names that `crate::` paths in `code` start with, with their line.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (start, _) in code.match_indices("crate::") {
        // `pub(crate) ...` is not a path; `$crate::` would be a macro's.
        if start > 0 && code[..start].ends_with(|c: char| c.is_alphanumeric() || c == '$') {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let after = &code[start + "crate::".len()..];
        if after.starts_with('{') {
            for head in group_heads(after) {
                found.push((head, line));
            }
        } else {
            let len = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            found.push((after[..len].to_string(), line));
        }
    }
    found
}

/// Root re-exports (`pub use config::{RegionConfig, ...}` in lib.rs): item name → module.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = code_only(lib);
    for stmt in code.split(';') {
        let Some(i) = stmt.find("use ") else { continue };
        let path = stmt[i + 4..].trim();
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        let items = items.trim();
        let names: Vec<String> = if items.starts_with('{') {
            group_heads(items)
        } else {
            vec![items
                .rsplit("::")
                .next()
                .unwrap_or(items)
                .trim()
                .to_string()]
        };
        for name in names {
            map.insert(name, module.trim().to_string());
        }
    }
    map
}

/// Every module's references to other top-level modules, in the crate whose sources are `src`.
fn module_graph(src: &Path) -> BTreeMap<String, Vec<Reference>> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .filter_map(|r| std::fs::read_to_string(src.join(r)).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let reexports = root_reexports(&root);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src, f)).collect();
    let mut graph: BTreeMap<String, Vec<Reference>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(src, file) else {
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        let rel = file.strip_prefix(src).unwrap().display().to_string();
        let refs = graph.entry(from.clone()).or_default();
        for (head, line) in crate_paths(&code) {
            let to = if modules.contains(&head) {
                head.clone()
            } else if let Some(module) = reexports.get(&head) {
                module.clone()
            } else {
                continue; // an item of lib.rs itself
            };
            if to != from {
                refs.push(Reference {
                    to,
                    at: format!("src/{rel}:{line}: crate::{head}"),
                });
            }
        }
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, Vec<Reference>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, Vec<Reference>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for r in self.graph.get(v).into_iter().flatten() {
                let w = r.to.as_str();
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The workspace's crates: every directory of `crates/` with a `src/`.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&crates)
        .unwrap()
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let src = dir.join("src");
            src.is_dir()
                .then(|| (dir.file_name().unwrap().to_string_lossy().into_owned(), src))
        })
        .collect();
    found.sort();
    found
}

#[test]
fn no_crates_modules_form_a_cycle() {
    let crates = crate_sources();
    let names: Vec<&str> = crates.iter().map(|(n, _)| n.as_str()).collect();
    for expected in ["pager", "memnode", "proto", "cli"] {
        assert!(names.contains(&expected), "crates found: {names:?}");
    }
    let mut report = String::new();
    for (name, src) in &crates {
        let graph = module_graph(src);
        if name == "pager" {
            assert!(graph.len() > 20, "pager modules found: {:?}", graph.keys());
        }
        for component in cycles(&graph) {
            report.push_str(&format!(
                "\n{name}: these modules reach each other: {}\n",
                component.join(", ")
            ));
            for from in &component {
                for r in &graph[from] {
                    if component.contains(&r.to) {
                        report.push_str(&format!("  {from} -> {}  ({})\n", r.to, r.at));
                    }
                }
            }
        }
    }
    assert!(report.is_empty(), "{report}");
}

#[test]
fn the_reader_sees_paths_in_groups_and_skips_tests_and_comments() {
    let code = code_only(
        "use crate::{a::X, b::{Y, Z}, c};\n\
         // crate::commented\n\
         pub(crate) fn f() { crate::d::g(); }\n\
         #[cfg(test)]\n\
         mod tests { use crate::e; fn h() { if true { crate::f::i(); } } }\n\
         use crate::after;\n",
    );
    let heads: Vec<(String, usize)> = crate_paths(&code);
    let names: Vec<&str> = heads.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d", "after"]);
    assert_eq!(
        heads.last().unwrap().1,
        6,
        "line numbers survive the stripping"
    );
    let lib = "pub use config::{RegionConfig, Tuning};\npub use region::Region;\n";
    let map = root_reexports(lib);
    assert_eq!(map["RegionConfig"], "config");
    assert_eq!(map["Tuning"], "config");
    assert_eq!(map["Region"], "region");
}

#[test]
fn a_cycle_is_found_and_a_chain_is_not() {
    let edge = |to: &str| Reference {
        to: to.to_string(),
        at: String::new(),
    };
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), vec![edge("b")]);
    graph.insert("b".to_string(), vec![edge("c")]);
    graph.insert("c".to_string(), vec![]);
    assert!(cycles(&graph).is_empty());
    graph.insert("c".to_string(), vec![edge("a")]);
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
}

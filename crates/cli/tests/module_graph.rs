//! Inside every crate of the workspace, modules depend on each other in one direction only: no
//! module reaches, through any chain of paths, back to itself. (Between crates Cargo already
//! forbids cycles.) In the pager, for one, a thread's module (fault handling, eviction,
//! reclaim, prefetch hints) may use the engine's parts; a part never uses a thread's module.
//!
//! The graphs are read from the source, one per directory level: at the crate's root the
//! nodes are its top-level modules (a module's sub-files count as that module), and inside a
//! module's directory (`store/`) they are that module's children. An edge is a `crate::` path
//! (or, from a child's own file, a `super::` path) naming a sibling, outside comments and
//! `#[cfg(test)]` items; at the root a re-export such as `crate::RegionConfig` counts as the
//! module it comes from. A *group* directory, whose `mod.rs` only declares modules (the pager's
//! `fault/`, `evict/`, `observe/`, `memory/`: files grouped by the path they serve), is no
//! module of its own: its children stand in its parent's level as `group::child`, so grouping
//! files changes nothing in what is checked. A child using its parent (a trait in `store/mod.rs`) is not a cycle
//! between siblings and is not checked, nor are paths inside nested `{...}` groups. A cycle
//! fails the test with the paths that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A reference found in the source: which sibling module it names, and where.
#[derive(Debug, Clone)]
struct Reference {
    to: String,
    at: String,
}

/// Every `.rs` file under `dir`, at any depth.
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

/// One module of a directory level: its own file (`a.rs` or `a/mod.rs`, where `super::` means
/// this level), every file it is made of (its sub-directory included), and that directory.
struct Child {
    own: Option<PathBuf>,
    files: Vec<PathBuf>,
    dir: Option<PathBuf>,
}

/// The modules of the level in `dir`, by name (the crate root's `lib.rs`/`main.rs` and a
/// directory's `mod.rs` are the level itself, not one of them).
fn children(dir: &Path) -> BTreeMap<String, Child> {
    let mut found: BTreeMap<String, Child> = BTreeMap::new();
    let blank = || Child {
        own: None,
        files: Vec::new(),
        dir: None,
    };
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() && is_group(&path) {
            for (inner, child) in children(&path) {
                found.insert(format!("{name}::{inner}"), child);
            }
        } else if path.is_dir() {
            let child = found.entry(name).or_insert_with(blank);
            rust_files(&path, &mut child.files);
            let own = path.join("mod.rs");
            if own.exists() {
                child.own = Some(own);
            }
            child.dir = Some(path);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if !matches!(stem, "lib" | "main" | "mod") {
                let child = found.entry(stem.to_string()).or_insert_with(blank);
                child.files.push(path.clone());
                child.own = Some(path);
            }
        }
    }
    found
}

/// Whether the directory `dir` only groups files: its `mod.rs` holds nothing but `mod` and `use`
/// declarations (and comments).
fn is_group(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("mod.rs")) else {
        return false;
    };
    code_only(&text).lines().all(|line| {
        let line = line.trim();
        let decl = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        line.is_empty() || decl.starts_with("mod ") || decl.starts_with("use ")
    })
}

/// The child of a level that the path `path` (its segments after the level's prefix) names:
/// the longest child name (`fault::handler` or `store`) that the path starts with.
fn named_child<'a>(kids: &'a BTreeMap<String, Child>, path: &[String]) -> Option<&'a String> {
    kids.keys()
        .filter(|name| {
            let parts: Vec<&str> = name.split("::").collect();
            parts.len() <= path.len() && parts.iter().zip(path).all(|(a, b)| *a == b.as_str())
        })
        .max_by_key(|name| name.len())
}

/// The source without line comments (doc comments included; the workspace's sources use no
/// block comments) and without `#[cfg(test)]` items.
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

/// The paths starting with `anchor` (`crate::` or `super::`) in `code`: each as its segments
/// up to the item (a group `a::{b, c::D}` gives `a::b` and `a::c`), with its line.
fn paths(code: &str, anchor: &str) -> Vec<(Vec<String>, usize)> {
    let ident_len = |s: &str| {
        s.find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut found = Vec::new();
    for (start, _) in code.match_indices(anchor) {
        // `pub(crate) ...` is not a path, `$crate::` is a macro's, and `super::super::` is
        // read from its first `super::`.
        if start > 0 && code[..start].ends_with(|c: char| c.is_alphanumeric() || "$_:".contains(c))
        {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let mut rest = &code[start + anchor.len()..];
        let mut segments = Vec::new();
        loop {
            if rest.starts_with('{') {
                for head in group_heads(rest) {
                    let mut path = segments.clone();
                    path.push(head);
                    found.push((path, line));
                }
                break;
            }
            let len = ident_len(rest);
            if len == 0 {
                break;
            }
            segments.push(rest[..len].to_string());
            rest = &rest[len..];
            match rest.strip_prefix("::") {
                Some(more) => rest = more,
                None => {
                    found.push((segments, line));
                    break;
                }
            }
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

/// A directory level's graph: its modules and their references to each other.
struct Level {
    /// `crate` or `crate::store`.
    name: String,
    graph: BTreeMap<String, Vec<Reference>>,
}

/// The graphs of every directory level of the crate whose sources are `src`.
fn module_graphs(src: &Path) -> Vec<Level> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .filter_map(|r| std::fs::read_to_string(src.join(r)).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let reexports = root_reexports(&root);
    let mut levels = Vec::new();
    level_graphs(src, src, &[], &reexports, &mut levels);
    levels
}

/// The graph of the level in `dir` (its modules' paths start with `prefix`), then those of the
/// levels below it.
fn level_graphs(
    src: &Path,
    dir: &Path,
    prefix: &[String],
    reexports: &BTreeMap<String, String>,
    out: &mut Vec<Level>,
) {
    let kids = children(dir);
    let mut graph: BTreeMap<String, Vec<Reference>> = BTreeMap::new();
    for (from, child) in &kids {
        let refs = graph.entry(from.clone()).or_default();
        for file in &child.files {
            let code = code_only(&std::fs::read_to_string(file).unwrap());
            let rel = file.strip_prefix(src).unwrap().display().to_string();
            let mut named: Vec<(String, usize, String)> = Vec::new();
            for (path, line) in paths(&code, "crate::") {
                if path.len() > prefix.len() && path[..prefix.len()] == *prefix {
                    let rest = &path[prefix.len()..];
                    let to = match (named_child(&kids, rest), reexports.get(&rest[0])) {
                        (Some(kid), _) => kid.clone(),
                        (None, Some(module)) if prefix.is_empty() => module.clone(),
                        (None, _) => rest[0].clone(),
                    };
                    named.push((to, line, format!("crate::{}", path.join("::"))));
                }
            }
            if child.own.as_ref() == Some(file) {
                // From `group::child`'s own file, `super::` is the group.
                let group: Vec<String> = from.split("::").map(String::from).collect();
                let group = &group[..group.len() - 1];
                for (path, line) in paths(&code, "super::") {
                    let full: Vec<String> = group.iter().chain(&path).cloned().collect();
                    let to = named_child(&kids, &full)
                        .cloned()
                        .unwrap_or(full[0].clone());
                    named.push((to, line, format!("super::{}", path.join("::"))));
                }
            }
            for (to, line, text) in named {
                if to != *from && kids.contains_key(&to) {
                    refs.push(Reference {
                        to,
                        at: format!("src/{rel}:{line}: {text}"),
                    });
                }
            }
        }
    }
    let name = std::iter::once("crate".to_string())
        .chain(prefix.iter().cloned())
        .collect::<Vec<_>>()
        .join("::");
    out.push(Level { name, graph });
    for (child_name, child) in &kids {
        if let Some(sub) = &child.dir {
            let mut deeper = prefix.to_vec();
            deeper.extend(child_name.split("::").map(String::from));
            level_graphs(src, sub, &deeper, reexports, out);
        }
    }
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
        let levels = module_graphs(src);
        if name == "pager" {
            let root = &levels[0].graph;
            assert!(root.len() > 20, "pager modules found: {:?}", root.keys());
            for grouped in [
                "fault::handler",
                "evict::batch",
                "observe::stats",
                "memory::mem",
            ] {
                assert!(root.contains_key(grouped), "{:?}", root.keys());
            }
            let store = levels.iter().find(|l| l.name == "crate::store").unwrap();
            assert!(store.graph.contains_key("shm"), "{:?}", store.graph.keys());
        }
        for level in &levels {
            for component in cycles(&level.graph) {
                report.push_str(&format!(
                    "\n{name}, {}: these modules reach each other: {}\n",
                    level.name,
                    component.join(", ")
                ));
                for from in &component {
                    for r in &level.graph[from] {
                        if component.contains(&r.to) {
                            report.push_str(&format!("  {from} -> {}  ({})\n", r.to, r.at));
                        }
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
    let found = paths(&code, "crate::");
    let names: Vec<String> = found.iter().map(|(p, _)| p.join("::")).collect();
    // A group gives each entry's first segment after the prefix.
    assert_eq!(names, ["a", "b", "c", "d::g", "after"]);
    let deep = paths("use crate::store::{shm::X, socket};", "crate::");
    let deep: Vec<String> = deep.iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(deep, ["store::shm", "store::socket"]);
    assert_eq!(
        found.last().unwrap().1,
        6,
        "line numbers survive the stripping"
    );
    let sup = paths(
        "use super::{x, y::Z}; super::super::w(); self::v();",
        "super::",
    );
    let sup: Vec<String> = sup.iter().map(|(p, _)| p.join("::")).collect();
    assert_eq!(sup, ["x", "y", "super::w"]);
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

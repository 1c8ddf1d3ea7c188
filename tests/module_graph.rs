//! The top-level modules of `src/` import each other without a cycle (docs/ARCHITECTURE.md, section 2).
//!
//! Reads every `src/**/*.rs` except `lib.rs` (the crate root declares and re-exports every module), leaves out
//! comments, string literals and `#[cfg(test)]` items, and takes an edge `A -> B` for each `crate::B` path
//! (also `$crate::B`, `use crate::{B, ..}`, and `super::B` where `super` reaches the crate root) in a file of
//! top-level module `A`. Fails on a cycle, printing it with the files and paths behind each edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// `from -> to -> [(file, path text)]`.
type Graph = BTreeMap<String, BTreeMap<String, Vec<(String, String)>>>;

#[test]
fn top_level_modules_form_a_dag() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src);
    assert!(graph.len() > 3, "found too few modules in {}: {:?}", src.display(), graph.keys().collect::<Vec<_>>());
    if let Some(cycle) = find_cycle(&graph) {
        let mut msg = format!("the modules of src/ import each other in a cycle: {}\n", cycle.join(" -> "));
        for pair in cycle.windows(2) {
            msg += &format!("  {} -> {}:\n", pair[0], pair[1]);
            for (file, path) in &graph[&pair[0]][&pair[1]] {
                msg += &format!("    {file}: {path}\n");
            }
        }
        panic!("{msg}");
    }
}

/// The parser itself, on the shapes the source uses.
#[test]
fn parser_finds_each_form_of_path() {
    let text = r#"
        use crate::a::X;
        use crate::{b, c::{D, E}};
        use super::f::G;
        // use crate::commented;
        /* use crate::block_commented; */
        const S: &str = "crate::in_a_string";
        fn g() { crate::h::call(); $crate::i::J; }
        #[cfg(test)]
        mod tests { use crate::only_in_tests; }
        #[cfg(test)]
        use crate::test_import;
        #[cfg(all(test, feature = "x"))]
        mod feature_tests { use crate::only_in_feature_tests; }
    "#;
    let got: BTreeSet<String> = targets(text, &["top".to_string()]).into_iter().map(|(m, _)| m).collect();
    let want: BTreeSet<String> = ["a", "b", "c", "f", "h", "i"].iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want);
    // Two levels down, `super::` stays inside the module and `super::super::` reaches the root.
    let nested = ["top".to_string(), "sub".to_string(), "leaf".to_string()];
    let got: BTreeSet<String> = targets("use super::x; use super::super::y; use super::super::super::z;", &nested)
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(got, ["top", "z"].iter().map(|s| s.to_string()).collect());
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into()).or_default().entry(b.into()).or_default();
    }
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
    g.get_mut("c").unwrap().remove("a");
    assert_eq!(find_cycle(&g), None);
}

fn import_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    collect(src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        if rel == Path::new("lib.rs") {
            continue;
        }
        let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let last = module.pop().unwrap();
        if last != "mod.rs" {
            module.push(last.trim_end_matches(".rs").to_string());
        }
        let text = fs::read_to_string(&file).unwrap();
        let from = module[0].clone();
        let edges = graph.entry(from.clone()).or_default();
        for (to, path) in targets(&text, &module) {
            if to != from {
                edges.entry(to).or_default().push((format!("src/{}", rel.display()), path));
            }
        }
    }
    graph
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules that `text`, the source of module `module` (its path from the crate root), names,
/// each with the path text that names it.
fn targets(text: &str, module: &[String]) -> Vec<(String, String)> {
    let code = without_test_items(&without_comments_and_strings(text));
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if word_start && code[i..].starts_with("crate::") {
            let rest = i + "crate::".len();
            for name in names_at(&code, rest) {
                out.push((name, path_text(&code, i)));
            }
            i = rest;
        } else if word_start && code[i..].starts_with("super::") {
            let mut ups = 0;
            let mut j = i;
            while code[j..].starts_with("super::") {
                ups += 1;
                j += "super::".len();
            }
            if ups >= module.len() {
                for name in names_at(&code, j) {
                    out.push((name, path_text(&code, i)));
                }
            } else {
                out.push((module[0].clone(), path_text(&code, i)));
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// `line N: <the path starting at start>`, up to the end of its last segment or `{..}` group.
fn path_text(code: &str, start: usize) -> String {
    let b = code.as_bytes();
    let mut j = start;
    let mut depth = 0;
    while j < b.len() {
        match b[j] {
            b'{' => depth += 1,
            b'}' if depth > 0 => depth -= 1,
            c if depth > 0 || is_ident(c) || c == b':' || c == b'$' || c == b'*' => {}
            _ => break,
        }
        j += 1;
        if depth == 0 && b[j - 1] == b'}' {
            break;
        }
    }
    let line = code[..start].matches('\n').count() + 1;
    let path: String = code[start..j].split_whitespace().collect::<Vec<_>>().join(" ");
    format!("line {line}: {path}")
}

/// The first segment(s) of a path after `crate::`: one identifier, or each item of a `{..}` group.
fn names_at(code: &str, at: usize) -> Vec<String> {
    let b = code.as_bytes();
    if b.get(at) == Some(&b'{') {
        let mut names = Vec::new();
        let mut depth = 0;
        let mut expect_name = true;
        let mut j = at;
        while j < b.len() {
            match b[j] {
                b'{' => {
                    depth += 1;
                    expect_name = depth == 1;
                }
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return names;
                    }
                }
                b',' if depth == 1 => expect_name = true,
                c if expect_name && is_ident(c) => {
                    let end = ident_end(b, j);
                    names.push(code[j..end].to_string());
                    expect_name = false;
                    j = end;
                    continue;
                }
                _ => {}
            }
            j += 1;
        }
        names
    } else {
        let end = ident_end(b, at);
        if end == at {
            return Vec::new();
        }
        vec![code[at..end].to_string()]
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn ident_end(b: &[u8], mut j: usize) -> usize {
    while j < b.len() && is_ident(b[j]) {
        j += 1;
    }
    j
}

/// `text` with comments and the contents of string and char literals blanked (lengths kept).
fn without_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i + 1..].starts_with(b"\"") || b[i + 1..].starts_with(b"#")) && (i == 0 || !is_ident(b[i - 1])) {
            // Raw string: r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            out.resize(out.len() + 2 + hashes, b' ');
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            out.resize(out.len() + close.len(), b' ');
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for _ in 0..n.min(b.len() - i) {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && (b.get(i + 2) == Some(&b'\'') || (b.get(i + 1) == Some(&b'\\'))) {
            // A char literal ('x', '\n', '\''), not a lifetime.
            let end = b[i + 2..].iter().position(|&c| c == b'\'').map_or(b.len(), |p| i + 2 + p + 1);
            out.resize(out.len() + (end - i), b' ');
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// `code` with each item compiled only for tests blanked: an item under `#[cfg(test)]` or a `#[cfg(all(test,
/// ..))]`, up to its `;`, or its `{..}` block.
fn without_test_items(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some((start, attr_end)) = next_test_cfg(code, from) {
        let b = code.as_bytes();
        let mut j = attr_end;
        while j < b.len() && b[j] != b';' && b[j] != b'{' {
            j += 1;
        }
        if j < b.len() && b[j] == b'{' {
            let mut depth = 0;
            while j < b.len() {
                match b[j] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        let end = (j + 1).min(b.len());
        for c in &mut out[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).unwrap()
}

/// The next `#[cfg(test)]` or `#[cfg(all(test, ..))]` at or after `from`: its start and the end of the attribute.
fn next_test_cfg(code: &str, from: usize) -> Option<(usize, usize)> {
    ["#[cfg(test)]", "#[cfg(all(test,"]
        .iter()
        .filter_map(|pat| code[from..].find(pat).map(|p| from + p))
        .min()
        .map(|start| (start, start + code[start..].find(']').map_or(code.len() - start, |e| e + 1)))
}

/// A cycle `[a, b, .., a]` if the graph has one (depth-first, in name order, so the report is stable).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(graph: &Graph, node: &str, marks: &mut BTreeMap<String, Mark>, stack: &mut Vec<String>) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(c) = visit(graph, next, marks, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node) {
            if let Some(c) = visit(graph, node, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

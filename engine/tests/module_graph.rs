//! No import cycles between the modules of the CUDA engine
//! (`engine/src/cuda`): each module imports only modules below it, so a
//! reader can take them leaf first (`docs/architecture.md`). Test code
//! (`#[cfg(test)]` and after) is not counted. `graph` reads any directory
//! of modules (`crate::` at a crate root); the kernels crate's own graph
//! still has cycles and is not held to this yet.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name -> the sibling modules its non-test code names through
/// `prefix` (`super::` inside a directory module, `crate::` at a crate
/// root).
fn graph(dir: &Path, prefix: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: Vec<(String, String)> = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let p = e.expect("dir entry").path();
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file name")
            .to_string();
        if name == "mod" || name == "lib" || name == "main" {
            continue;
        }
        let mut text = String::new();
        if p.is_dir() {
            for f in walk(&p) {
                text.push_str(&std::fs::read_to_string(f).expect("read"));
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            text = std::fs::read_to_string(&p).expect("read");
        } else {
            continue;
        }
        files.push((name, text));
    }
    let names: BTreeSet<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let mut g = BTreeMap::new();
    for (name, text) in &files {
        let code = strip_tests(text);
        let mut deps = BTreeSet::new();
        for (i, _) in code.match_indices(prefix) {
            let rest = &code[i + prefix.len()..];
            let mut add = |s: &str| {
                let m = s.trim().split("::").next().unwrap_or("").trim().to_string();
                if names.contains(&m) && &m != name {
                    deps.insert(m);
                }
            };
            if let Some(list) = rest.strip_prefix('{') {
                let end = list.find('}').unwrap_or(list.len());
                list[..end].split(',').for_each(&mut add);
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                add(&rest[..end]);
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// The code before the first `#[cfg(test)]`, with `//` comments removed.
fn strip_tests(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A cycle in `g`, if any, as the modules along it.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            match state.get(d.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == d).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(d, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_cuda_engine_modules_import_each_other_without_cycles() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda");
    let g = graph(&dir, "super::");
    assert!(g.len() >= 8, "modules found: {:?}", g.keys());
    assert!(
        g["stages"].contains("forward_plan"),
        "the parser sees imports"
    );
    if let Some(c) = find_cycle(&g) {
        panic!("engine/src/cuda has an import cycle: {}", c.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::new());
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    g.insert("c".to_string(), BTreeSet::from(["d".to_string()]));
    assert_eq!(find_cycle(&g), None);
}

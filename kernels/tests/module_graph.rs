//! The modules of `kernels/src` must form a DAG: a module may use modules
//! below it and never, through any chain, itself. Lower layers (`problem`,
//! `device`, `verdict`, `compile`, `gpu`) know nothing of the families, so
//! each can be read, tested and changed without the rest.
//!
//! The graph is read from the source text: an edge `a -> b` for every
//! `crate::b` path in the non-test code of top-level module `a` (a file
//! `a.rs` or a directory `a/`). `lib.rs`, which declares and re-exports
//! every module, is not a node; `#[cfg(test)]` items are left out (a test
//! may reach any module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text with comments, string and char literals blanked (so braces and
/// paths inside them are not seen).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let end = rest[body..]
                .find(&close)
                .map_or(rest.len(), |e| body + e + close.len());
            i += end;
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && (rest.starts_with("'\\") || rest.get(2..3) == Some("'")) {
            // A char literal ('x' or an escape); a lifetime has no closing quote.
            let end = rest[1..].find('\'').map_or(rest.len(), |e| e + 2);
            i += end;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().expect("non-empty rest");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The code without `#[cfg(test)]` items (the attribute and the item after
/// it, up to its closing brace or semicolon).
fn without_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Top-level modules named by `crate::` paths in `code`, including the
/// members of `crate::{a, b::c}` groups.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // e.g. `$crate::` or part of a longer identifier
        }
        if let Some(group) = rest.strip_prefix('{') {
            let close = group.find('}').unwrap_or(group.len());
            for part in group[..close].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// module -> (used module -> files that use it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn module_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g = Graph::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src").to_path_buf();
        let first = rel
            .components()
            .next()
            .expect("non-empty path")
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for used in crate_refs(&without_tests(&code_only(&text))) {
            if used != module {
                g.entry(module.clone())
                    .or_default()
                    .entry(used)
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
        g.entry(module).or_default();
    }
    g
}

/// A cycle through the graph, if there is one (depth-first search).
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        g: &Graph,
        v: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(v) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path
                    .iter()
                    .position(|p| p == v)
                    .expect("open node is on the path");
                let mut cycle = path[start..].to_vec();
                cycle.push(v.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(v.to_string(), Mark::Open);
        path.push(v.to_string());
        for w in g.get(v).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(g, w, marks, path) {
                return Some(c);
            }
        }
        path.pop();
        marks.insert(v.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for v in g.keys() {
        if let Some(c) = visit(g, v, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn kernels_modules_have_no_cycle() {
    let g = module_graph();
    // The reader must see the edges that exist: a parser that found none
    // would pass vacuously.
    let has = |a: &str, b: &str| g.get(a).is_some_and(|e| e.contains_key(b));
    assert!(has("families", "kernel_family"), "graph: {g:?}");
    assert!(has("family", "families"), "graph: {g:?}");
    assert!(has("gpu", "device"), "graph: {g:?}");
    if let Some(cycle) = find_cycle(&g) {
        let detail: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let files = &g[&w[0]][&w[1]];
                format!(
                    "{} -> {} ({})",
                    w[0],
                    w[1],
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        panic!("module cycle in kernels/src:\n  {}", detail.join("\n  "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g = Graph::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert(format!("{a}.rs"));
    };
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    assert_eq!(find_cycle(&g), None);
    edge(&mut g, "c", "a");
    let c = find_cycle(&g).expect("a -> b -> c -> a");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
}

#[test]
fn the_reader_skips_comments_strings_and_tests() {
    let src = r#"
use crate::gpu::Gpu; // crate::timing in a comment
const S: &str = "crate::oracle";
/* crate::clocks */
fn f<'a>(x: &'a str) -> char { let _ = crate::problem::Problem::kind; '{' }
#[cfg(test)]
mod tests {
    use crate::check::compare;
    fn g() { let _ = "}"; }
}
pub use crate::{device::Arch, verdict};
"#;
    let refs = crate_refs(&without_tests(&code_only(src)));
    let want: BTreeSet<String> = ["gpu", "problem", "device", "verdict"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(refs, want);
}

//! Every kernel entry waits for the grid ahead before it works.
//!
//! The engine chains a decode step's launches (profile key
//! `decode_launch = "chained"`): each launch is a programmatic dependent of
//! the one before, scheduled while that grid still runs, so a kernel that
//! read its input without `griddepcontrol.wait` (`pdl_enter` or
//! `pdl_await_prior`, kernels/cuda/common.cuh) would race the kernel that
//! writes it, and one that returned before waiting would let its own
//! completion stand for a predecessor that had not finished. This test
//! reads every kernel source: each `extern "C" __global__` entry must reach
//! a wait in its own body or in a function it calls (across the sources,
//! to a depth of three), and an entry that calls `pdl_enter` itself may
//! not `return` before it.

use std::collections::BTreeMap;
use std::path::Path;

/// The text between the `{` at or after `from` and its matching `}`.
fn body_at(src: &str, from: usize) -> Option<&str> {
    let open = from + src[from..].find('{')?;
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&src[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The source with `//` comments removed (the bodies' braces and words
/// then come from code only).
fn strip_comments(src: &str) -> String {
    src.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers directly followed by `(` or `<` (calls and template calls).
fn callees(body: &str) -> Vec<String> {
    let b = body.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            if i < b.len() && (b[i] == b'(' || b[i] == b'<') {
                out.push(body[s..i].to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

const WAITS: [&str; 2] = ["pdl_enter(", "pdl_await_prior("];

fn waits(body: &str, funcs: &BTreeMap<String, Vec<String>>, depth: usize) -> bool {
    if WAITS.iter().any(|w| body.contains(w)) {
        return true;
    }
    depth > 0
        && callees(body).iter().any(|c| {
            funcs
                .get(c)
                .is_some_and(|bodies| bodies.iter().any(|b| waits(b, funcs, depth - 1)))
        })
}

#[test]
fn every_kernel_entry_waits_for_the_grid_ahead() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
    let mut sources = Vec::new();
    for e in std::fs::read_dir(&dir).expect("kernels/cuda") {
        let p = e.expect("entry").path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("cu" | "cuh")) {
            let text = std::fs::read_to_string(&p).expect("source");
            sources.push((p, strip_comments(&text)));
        }
    }
    // Every device function by name (templates and overloads: all bodies).
    let mut funcs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, src) in &sources {
        for (at, _) in src.match_indices("DEVI ") {
            let head = &src[at..];
            let Some(paren) = head.find('(') else {
                continue;
            };
            let name = head[..paren]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .rfind(|w| !w.is_empty())
                .unwrap_or_default()
                .to_string();
            if let Some(body) = body_at(src, at + paren) {
                funcs.entry(name).or_default().push(body.to_string());
            }
        }
    }
    let mut entries = 0;
    let mut missing = Vec::new();
    for (path, src) in &sources {
        for (at, _) in src.match_indices("extern \"C\" __global__") {
            let body = body_at(src, at).expect("an entry has a body");
            entries += 1;
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
            if !waits(body, &funcs, 3) {
                missing.push(format!("{file:?}: the entry at byte {at} never waits"));
            } else if let Some(w) = body.find("pdl_enter(") {
                if body[..w].contains("return") {
                    missing.push(format!(
                        "{file:?}: the entry at byte {at} returns before pdl_enter"
                    ));
                }
            }
        }
    }
    assert!(entries >= 25, "found only {entries} kernel entries");
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn the_scan_finds_a_missing_wait() {
    let src = "DEVI void helper(int x) { pdl_enter(); }\nextern \"C\" __global__ void a() { helper(1); }\nextern \"C\" __global__ void b() { if (x) return; pdl_enter(); }\nextern \"C\" __global__ void c() { int y = 0; }\n";
    let mut funcs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    funcs.insert("helper".into(), vec![" pdl_enter(); ".into()]);
    let bodies: Vec<&str> = src
        .match_indices("extern \"C\" __global__")
        .map(|(at, _)| body_at(src, at).expect("body"))
        .collect();
    assert!(waits(bodies[0], &funcs, 3));
    assert!(waits(bodies[1], &funcs, 3) && bodies[1].contains("return"));
    assert!(!waits(bodies[2], &funcs, 3));
}

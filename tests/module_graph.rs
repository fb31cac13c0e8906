//! No module cycle at any level: reads every `src/**/*.rs`, resolves the paths each
//! file writes (`crate::`, `super::`, `self::`, `use` groups; outside comments and
//! string literals, and outside code under `#[cfg(test)]`), and builds one graph per
//! folder whose nodes are the modules directly inside it (`src/` holds the top-level
//! modules, `src/train/` the files and folders of `train`). It fails naming every
//! cycle of every graph with a reference that makes each of its edges.

// tier: quick (no MPI: job-scripts/run-tests.sh runs this file in parallel)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One reference from one top-level module to another: where it is written.
#[derive(Debug, Clone)]
struct Edge {
    file: String,
    line: usize,
}

/// Top-level module -> the modules it references, with the first reference found.
type Graph = BTreeMap<String, BTreeMap<String, Edge>>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of Rust source that matter for paths, each with its line, without
/// comments, string, byte-string, raw-string and char literals, and lifetimes.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0usize, 1usize);
    let count_lines = |s: &[char]| s.iter().filter(|&&x| x == '\n').count();
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let (mut depth, start) = (0usize, i);
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            line += count_lines(&c[start..i.min(c.len())]);
        } else if let Some(end) = raw_string_end(&c, i) {
            line += count_lines(&c[i..end]);
            i = end;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            let start = i;
            i += if ch == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            line += count_lines(&c[start..i.min(c.len())]);
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            let q = if ch == 'b' { i + 1 } else { i };
            if c.get(q + 1) == Some(&'\\') {
                // An escaped char literal: past the escaped char, up to the closing quote.
                i = q + 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(q + 2) == Some(&'\'') {
                i = q + 3;
            } else {
                // A lifetime or label: the quote alone is dropped.
                i = q + 1;
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            out.push((Tok::Ident(word.trim_start_matches("r#").to_string()), line));
        } else if ch == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Where a raw string literal starting at `i` (`r"`, `r#"`, `br#"`) ends, if one does.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&x| x == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && c[j + 1..].iter().take(hashes).filter(|&&x| x == '#').count() == hashes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

/// The module path of a file under `src/`: `a/b/c.rs` is [a, b, c], `a/b/mod.rs` [a, b].
fn file_module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// When `toks[at..]` starts with `#[cfg(test)]`: the index just past the item it
/// marks (a `;`-ended item, or one whose outermost `{ ... }` closes), and the name of a
/// module it declares in a file of its own (`mod tests;`).
fn cfg_test_item(toks: &[(Tok, usize)], at: usize) -> Option<(usize, Option<String>)> {
    let attr = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let starts = toks.get(at..at + attr.len())?.iter().map(|t| &t.0).eq(attr.iter());
    if !starts {
        return None;
    }
    let item = at + attr.len();
    let file_module = match (toks.get(item), toks.get(item + 1), toks.get(item + 2)) {
        (Some((Tok::Ident(m), _)), Some((Tok::Ident(name), _)), Some((Tok::Punct(';'), _))) if m == "mod" => Some(name.clone()),
        _ => None,
    };
    let mut depth = 0usize;
    for (j, (t, _)) in toks.iter().enumerate().skip(item) {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some((j + 1, file_module));
                }
            }
            Tok::Punct(';') if depth == 0 => return Some((j + 1, file_module)),
            _ => {}
        }
    }
    Some((toks.len(), file_module))
}

/// The modules `src` declares under `#[cfg(test)]` in files of their own: test code
/// is not part of the library's layering (as `cargo modules` leaves it out by default).
fn test_only_children(src: &str) -> Vec<String> {
    let toks = tokens(src);
    (0..toks.len())
        .filter_map(|i| cfg_test_item(&toks, i).and_then(|(_, m)| m))
        .collect()
}

/// The path that follows `toks[j..]` (`a::b::c`, stopping before a non-ident), appended
/// to `base`; a `{ ... }` group yields one path per member, nested groups too.
fn path_tails(toks: &[(Tok, usize)], mut j: usize, base: Vec<String>, line: usize, out: &mut Vec<(Vec<String>, usize)>) {
    let mut path = base;
    let mut line = line;
    loop {
        match toks.get(j) {
            Some((Tok::Ident(h), l)) => {
                path.push(h.clone());
                line = *l;
                if toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path) {
                    j += 2;
                    continue;
                }
            }
            Some((Tok::Punct('{'), _)) => {
                let mut depth = 0usize;
                let mut member_start = true;
                for (k, (t, _)) in toks.iter().enumerate().skip(j) {
                    match t {
                        Tok::Punct('{') => {
                            depth += 1;
                            member_start = depth == 1;
                            if depth == 1 {
                                continue;
                            }
                        }
                        Tok::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Tok::Punct(',') if depth == 1 => {
                            member_start = true;
                            continue;
                        }
                        _ => {}
                    }
                    if member_start && depth == 1 {
                        path_tails(toks, k, path.clone(), line, out);
                    }
                    member_start = false;
                }
                return;
            }
            _ => {}
        }
        break;
    }
    out.push((path, line));
}

/// Every path `src` (the file at module path `file_path`) writes from `crate::`,
/// `super::` or `self::`, resolved to a path from the crate root, each with a line;
/// items under `#[cfg(test)]` are left out.
fn resolved_paths(src: &str, file_path: &[String]) -> Vec<(Vec<String>, usize)> {
    paths_in(src, file_path, false)
}

/// [`resolved_paths`], with the items under `#[cfg(test)]` when `with_tests`.
fn paths_in(src: &str, file_path: &[String], with_tests: bool) -> Vec<(Vec<String>, usize)> {
    let toks = tokens(src);
    let mut found = Vec::new();
    // Inline modules (`mod tests { ... }`) deepen the path `super::` climbs from:
    // each with the brace depth it opened at.
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        if let Some((end, _)) = cfg_test_item(&toks, i).filter(|_| !with_tests) {
            i = end;
            continue;
        }
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().map(|m| m.0) == Some(depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) = (toks.get(i + 1), toks.get(i + 2)) {
                    inline.push((depth, name.clone()));
                }
            }
            Tok::Ident(w) if (w == "crate" || w == "super" || w == "self") && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path) => {
                let mut here: Vec<String> = file_path.to_vec();
                here.extend(inline.iter().map(|m| m.1.clone()));
                let (mut j, line) = (i, toks[i].1);
                let base = if w == "crate" {
                    j += 2;
                    Vec::new()
                } else if w == "self" {
                    j += 2;
                    here
                } else {
                    let mut up = 0usize;
                    while toks.get(j).map(|t| &t.0) == Some(&Tok::Ident("super".into()))
                        && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path)
                    {
                        up += 1;
                        j += 2;
                    }
                    here[..here.len().saturating_sub(up)].to_vec()
                };
                path_tails(&toks, j, base, line, &mut found);
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The top-level modules `src` (the file at module path `file_path`) references
/// outside its own, each with a line; items under `#[cfg(test)]` are left out.
fn references(src: &str, file_path: &[String], modules: &BTreeSet<String>) -> Vec<(String, usize)> {
    resolved_paths(src, file_path)
        .into_iter()
        .filter_map(|(p, line)| p.first().cloned().map(|h| (h, line)))
        .filter(|(h, _)| modules.contains(h) && Some(h) != file_path.first())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The `.rs` files under `src`, each as its path relative to `src` and its text.
fn read_sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    files
        .iter()
        .map(|f| (f.strip_prefix(src).unwrap().to_path_buf(), std::fs::read_to_string(f).unwrap()))
        .collect()
}

/// The library's module files (not `main.rs`, `lib.rs`, nor files under
/// `#[cfg(test)] mod x;`), each with its module path and text, and every module path
/// they make, folders included.
fn library_files(sources: &[(PathBuf, String)]) -> (Vec<(&PathBuf, Vec<String>, &String)>, BTreeSet<Vec<String>>) {
    let is_root = |r: &PathBuf| r.as_os_str() == "main.rs" || r.as_os_str() == "lib.rs";
    // Module paths declared `#[cfg(test)] mod x;`: their files (and those under them) are tests.
    let test_only: Vec<Vec<String>> = sources
        .iter()
        .flat_map(|(r, text)| {
            let parent = if is_root(r) { Vec::new() } else { file_module_path(r) };
            test_only_children(text)
                .into_iter()
                .map(move |m| [parent.clone(), vec![m]].concat())
        })
        .collect();
    let files: Vec<(&PathBuf, Vec<String>, &String)> = sources
        .iter()
        .filter(|(r, _)| !is_root(r))
        .map(|(r, text)| (r, file_module_path(r), text))
        .filter(|(_, path, _)| !path.is_empty() && !test_only.iter().any(|t| path.starts_with(t)))
        .collect();
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .flat_map(|(_, path, _)| (1..=path.len()).map(|n| path[..n].to_vec()))
        .collect();
    (files, modules)
}

/// The graph of the modules directly inside each folder (module path), `[]` being the
/// library's top level: an edge `a -> b` in folder `f` is a path written in `f/a` (its
/// file or anything under it) that names the module `f::b`. References to the folder's
/// own items (its `mod.rs`) and into a module's own children make no edge. The binary's
/// `main.rs` and the crate root `lib.rs` are not modules of it, nor files under
/// `#[cfg(test)] mod x;`.
fn folder_graphs(sources: &[(PathBuf, String)]) -> BTreeMap<Vec<String>, Graph> {
    let (files, modules) = library_files(sources);
    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for (r, path, text) in &files {
        for (to, line) in resolved_paths(text, path) {
            let shared = path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if shared >= path.len() || shared >= to.len() || !modules.contains(&to[..=shared]) {
                continue;
            }
            let folder = path[..shared].to_vec();
            graphs
                .entry(folder)
                .or_default()
                .entry(path[shared].clone())
                .or_default()
                .entry(to[shared].clone())
                .or_insert(Edge {
                    file: format!("src/{}", r.display()),
                    line,
                });
        }
        // Every module is a node of its folder's graph, referencing or not.
        let (parent, name) = path.split_at(path.len() - 1);
        graphs.entry(parent.to_vec()).or_default().entry(name[0].clone()).or_default();
    }
    graphs
}

/// Every reference from a module to an item of a folder it sits in rather than to one of
/// that folder's modules: `a::b` (its file or anything under it) naming `a::X`, an item of
/// `a/mod.rs` (or `crate::X`, of `lib.rs`). Each is keyed by the module that writes it,
/// with the item's path, where it is written first. Such a reference points up: the
/// folder's `mod.rs` declares the module, so the two depend on each other.
fn upward_references(sources: &[(PathBuf, String)]) -> BTreeMap<Vec<String>, BTreeMap<Vec<String>, Edge>> {
    let (files, modules) = library_files(sources);
    let mut found: BTreeMap<Vec<String>, BTreeMap<Vec<String>, Edge>> = BTreeMap::new();
    for (r, path, text) in &files {
        for (to, line) in resolved_paths(text, path) {
            let shared = path.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if shared >= path.len() || shared >= to.len() || modules.contains(&to[..=shared]) {
                continue;
            }
            found
                .entry(path[..=shared].to_vec())
                .or_default()
                .entry(to[..=shared].to_vec())
                .or_insert(Edge {
                    file: format!("src/{}", r.display()),
                    line,
                });
        }
    }
    found
}

/// The graph of the library's top-level modules.
fn graph(src: &Path) -> Graph {
    folder_graphs(&read_sources(src)).remove(&Vec::new()).unwrap_or_default()
}

/// `src/` plus the folder's module path, as a reader finds it: `src/train/`.
fn folder_name(folder: &[String]) -> String {
    folder.iter().fold("src/".to_string(), |s, m| format!("{s}{m}/"))
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.g.get(v) {
            for w in next.keys() {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// One cycle through `scc`'s modules from its first, as `a -> b -> a`, each edge with
/// the reference that makes it.
fn describe(g: &Graph, scc: &[String]) -> String {
    let inside: BTreeSet<&str> = scc.iter().map(String::as_str).collect();
    // Breadth-first from the first module back to it, inside the component.
    let start = scc[0].as_str();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    let mut closing = None;
    while let Some(v) = queue.pop_front() {
        for w in g.get(v).map(|m| m.keys()).into_iter().flatten() {
            let w = w.as_str();
            if w == start {
                closing = Some(v);
                queue.clear();
                break;
            }
            if inside.contains(w) && !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start];
    let mut v = closing.unwrap_or(start);
    while v != start {
        path.push(v);
        v = prev[v];
    }
    path[1..].reverse();
    path.push(start);
    let edges: Vec<String> = path
        .windows(2)
        .map(|w| {
            let e = &g[w[0]][w[1]];
            format!("  {} -> {} ({}:{})", w[0], w[1], e.file, e.line)
        })
        .collect();
    let within: Vec<String> = scc
        .iter()
        .flat_map(|from| {
            g.get(from)
                .into_iter()
                .flatten()
                .filter(|(to, _)| inside.contains(to.as_str()))
                .map(move |(to, e)| format!("    {from} -> {to} ({}:{})", e.file, e.line))
        })
        .collect();
    format!(
        "cycle among {{{}}}:\n{}\n  every reference between them (cut some to break the cycle):\n{}",
        scc.join(", "),
        edges.join("\n"),
        within.join("\n")
    )
}

/// The modules the analysis is made of (what `--no-default-features --features report`
/// builds), as module paths.
const ANALYSIS: &[&str] = &[
    "reduce",
    "record",
    "stats",
    "plot",
    "bounds",
    "compare",
    "link",
    "diagnose",
    "flight",
    "noise_scale",
    "bandwidth",
    "files",
    "stderr",
    "cleanup",
    "trace::event",
    "trace::files",
    "trace::window",
];

/// What the analysis must not reach: the trainer's modules (libtorch, MPI, hwloc and the
/// GPU libraries live there), as module paths.
const TRAINER: &[&str] = &[
    "train",
    "allreduce",
    "trace::writer",
    "amp",
    "optim",
    "comm",
    "device",
    "data",
    "model",
    "world",
    "job",
    "study",
    "topology",
    "telemetry",
    "progress",
];

/// The crates only the trainer links.
const TRAINER_CRATES: &[&str] = &["mpi", "tch", "torch_sys", "hwloc2", "cudarc", "nvml_wrapper"];

/// Whether module path `path` is `module` (`a::b`) or lies inside it.
fn inside(path: &[String], module: &str) -> bool {
    let m: Vec<&str> = module.split("::").collect();
    path.len() >= m.len() && path.iter().zip(&m).all(|(a, b)| a == b)
}

/// Every reference from an analysis module (its tests included: the report build runs
/// them) to a trainer module or crate, as `file:line: what`.
fn analysis_reaches_trainer(sources: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, text) in sources {
        let path = file_module_path(rel);
        if !ANALYSIS.iter().any(|m| inside(&path, m)) {
            continue;
        }
        for (to, line) in paths_in(text, &path, true) {
            if let Some(m) = TRAINER.iter().find(|m| inside(&to, m)) {
                found.push(format!("src/{}:{line}: {} (in {m})", rel.display(), to.join("::")));
            }
        }
        let toks = tokens(text);
        for (k, (t, line)) in toks.iter().enumerate() {
            let Tok::Ident(name) = t else { continue };
            let starts_path = toks.get(k + 1).map(|t| &t.0) == Some(&Tok::Path);
            let after_path = k > 0 && toks[k - 1].0 == Tok::Path;
            if starts_path && !after_path && TRAINER_CRATES.contains(&name.as_str()) {
                found.push(format!("src/{}:{line}: the crate {name}", rel.display()));
            }
        }
    }
    found
}

#[test]
fn a_planted_import_of_the_trainer_in_the_analysis_is_named() {
    let sources: Vec<(PathBuf, String)> = [
        (
            "reduce/read/mod.rs",
            "use crate::record::clock::ClockRow;\nuse crate::trace::files::TRACE_DIR;\nfn f() {}",
        ),
        (
            "reduce/read/limits.rs",
            "// crate::train in a comment\nfn f() -> crate::train::clock::Origin { todo!() }",
        ),
        ("record/key.rs", "#[cfg(test)]\nmod tests { use crate::amp::AmpMode; }"),
        ("compare/mod.rs", "use crate::trace::{event::tid, writer::RankTrace};"),
        ("plot.rs", "fn f(c: &mpi::topology::SimpleCommunicator) { crate::comm::mpi::x(); }"),
        ("train/step.rs", "use crate::comm::CommStats; use tch::Tensor;"),
        ("trace/writer.rs", "use crate::data::loader::BatchSpan;"),
    ]
    .iter()
    .map(|(f, text)| (PathBuf::from(f), text.to_string()))
    .collect();
    assert_eq!(
        analysis_reaches_trainer(&sources),
        [
            "src/reduce/read/limits.rs:2: train::clock::Origin (in train)",
            "src/record/key.rs:2: amp::AmpMode (in amp)",
            "src/compare/mod.rs:1: trace::writer::RankTrace (in trace::writer)",
            "src/plot.rs:1: comm::mpi::x (in comm)",
            "src/plot.rs:1: the crate mpi",
        ]
    );
}

/// `reduce`, `compare`, `diagnose`, the trace merge and the file formats they read build
/// without libtorch, MPI or hwloc: none of them names the trainer's modules or crates.
#[test]
fn the_analysis_reaches_nothing_of_the_trainer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources = read_sources(&src);
    assert!(sources.iter().filter(|(r, _)| r.starts_with("reduce")).count() > 10);
    let found = analysis_reaches_trainer(&sources);
    assert!(
        found.is_empty(),
        "{} reference(s) from the analysis to the trainer (move what they need into `record` or `link`):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_scanner_finds_paths_that_leave_a_module_and_nothing_in_comments_or_strings() {
    let modules: BTreeSet<String> = ["a", "b", "c", "d", "e"].iter().map(|s| s.to_string()).collect();
    let src = r##"
use crate::a::X; // crate::e in a comment
use crate::{b::Y, c};
/* crate::e in a block /* nested */ crate::e */
fn f<'l>(x: &'l str) -> char { let _ = "crate::e"; let _ = r#"crate::e"#; let _ = 'x'; let _ = '\''; '"' }
mod tests { use super::*; use super::super::d::Z; }
fn g() { super::super::e::f(); }
"##;
    let refs: Vec<String> = references(src, &["m".into(), "n".into()], &modules)
        .into_iter()
        .map(|r| r.0)
        .collect();
    // `super::super` from m/n leaves m; from m/n's inline tests it climbs to m only.
    assert_eq!(refs, vec!["a", "b", "c", "e"]);
    let mut g = Graph::new();
    let e = || Edge { file: "f".into(), line: 1 };
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(from.into()).or_default().insert(to.into(), e());
    }
    let found = cycles(&g);
    assert_eq!(found, vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    assert!(describe(&g, &found[0]).contains("a -> b (f:1)\n  b -> c (f:1)\n  c -> a (f:1)"));
}

#[test]
fn code_under_cfg_test_is_left_out() {
    let modules: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let src = r#"
use crate::a::X;
#[cfg(test)]
mod tests { use crate::b::Y; fn f() { if true { crate::b::g(); } } }
#[cfg(test)]
use crate::c::Z;
#[cfg(test)]
mod more;
mod kept;
fn after() { crate::d::h(); }
"#;
    let refs: Vec<String> = references(src, &["m".into()], &modules).into_iter().map(|r| r.0).collect();
    assert_eq!(refs, vec!["a", "d"]);
    assert_eq!(test_only_children(src), vec!["more"]);
}

#[test]
fn a_loop_between_two_files_of_one_folder_is_named() {
    let sources: Vec<(PathBuf, String)> = [
        ("lib.rs", "pub mod top;"),
        ("top/mod.rs", "mod a;\nmod b;\npub use a::A;"),
        ("top/a.rs", "use super::{b::B, c};\npub struct A;"),
        (
            "top/b.rs",
            "// crate::top::a in a comment\n\nfn f() -> crate::top::a::A { todo!() }\npub struct B;",
        ),
        ("top/c.rs", "use self::inner::X;\nmod inner;"),
        ("top/c/inner.rs", "use super::super::d;"),
        ("top/d.rs", "pub fn d() {}"),
    ]
    .iter()
    .map(|(f, text)| (PathBuf::from(f), text.to_string()))
    .collect();
    let graphs = folder_graphs(&sources);
    let top = &graphs[&vec!["top".to_string()]];
    let edges = |from: &str| top[from].keys().cloned().collect::<Vec<_>>();
    // `top/c/inner.rs` is part of `c`; `self::inner` stays inside `c`.
    assert_eq!(
        (edges("a"), edges("b"), edges("c"), edges("d")),
        (vec!["b".into(), "c".into()], vec!["a".into()], vec!["d".to_string()], vec![])
    );
    let found = cycles(top);
    assert_eq!(found, vec![vec!["a".to_string(), "b".into()]]);
    assert_eq!(
        describe(top, &found[0]).lines().take(3).collect::<Vec<_>>(),
        ["cycle among {a, b}:", "  a -> b (src/top/a.rs:1)", "  b -> a (src/top/b.rs:3)"]
    );
    assert_eq!(folder_name(&["top".to_string()]), "src/top/");
}

#[test]
fn no_module_cycle_inside_any_folder_of_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graphs = folder_graphs(&read_sources(&src));
    let train = graphs.get(&vec!["train".to_string()]).map_or(0, BTreeMap::len);
    assert!(train > 10, "found only {train} modules under {}", src.join("train").display());
    let text: Vec<String> = graphs
        .iter()
        .filter(|(folder, _)| !folder.is_empty())
        .flat_map(|(folder, g)| {
            cycles(g)
                .into_iter()
                .map(move |scc| format!("in {}: {}", folder_name(folder), describe(g, &scc)))
        })
        .collect();
    assert!(
        text.is_empty(),
        "{} module cycle(s) inside folders of src/:\n{}",
        text.len(),
        text.join("\n")
    );
}

#[test]
fn no_module_cycle_in_src() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 10, "found only {} modules under {}", g.len(), src.display());
    let found = cycles(&g);
    let text: Vec<String> = found.iter().map(|scc| describe(&g, scc)).collect();
    assert!(found.is_empty(), "{} module cycle(s) in src/:\n{}", found.len(), text.join("\n"));
}

#[test]
fn a_module_naming_an_item_of_its_folders_mod_rs_is_found() {
    let sources: Vec<(PathBuf, String)> = [
        ("lib.rs", "pub mod job;\npub fn root_item() {}"),
        (
            "job/mod.rs",
            "mod abort;\nmod watchdog;\npub use abort::abort_job;\npub fn run_job() {}",
        ),
        ("job/abort.rs", "pub fn abort_job() {}"),
        (
            "job/watchdog.rs",
            "use super::abort::abort_job;\nfn f() { super::abort_job(); }\nmod inner;\n// super::run_job in a comment",
        ),
        (
            "job/watchdog/inner.rs",
            "fn g() { crate::job::run_job(); crate::root_item(); super::super::abort::abort_job(); }",
        ),
    ]
    .iter()
    .map(|(f, text)| (PathBuf::from(f), text.to_string()))
    .collect();
    let up = upward_references(&sources);
    let named = |m: &[&str]| -> Vec<String> {
        let key: Vec<String> = m.iter().map(|s| s.to_string()).collect();
        up.get(&key)
            .map(|items| items.keys().map(|k| k.join("::")).collect())
            .unwrap_or_default()
    };
    // The re-export `job::abort_job` is `mod.rs`'s item; `job::abort` is a module beside it.
    assert_eq!(named(&["job", "watchdog"]), vec!["job::abort_job", "job::run_job"]);
    assert_eq!(named(&["job"]), vec!["root_item"]);
    assert_eq!(
        up[&vec!["job".to_string(), "watchdog".to_string()]][&vec!["job".to_string(), "abort_job".to_string()]].line,
        2
    );
    assert!(named(&["job", "abort"]).is_empty());
}

/// The modules below which their folder's own code runs, so that they must not reach up
/// to it: the watchdog (it ends the job), `job::abort` (everything that ends a job calls
/// it), and the files of `study` (its `mod.rs` only lists them).
const BELOW_THEIR_FOLDER: &[&str] = &[
    "job::abort",
    "job::watchdog",
    "study::args",
    "study::book",
    "study::broadcast",
    "study::estimate",
    "study::finish",
    "study::folder",
    "study::idle",
    "study::layout",
    "study::peer",
    "study::plan",
    "study::point",
    "study::print",
    "study::report",
    "study::runner",
    "study::spec",
    "study::state",
];

#[test]
fn the_watchdog_and_the_study_files_name_no_item_of_their_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let up = upward_references(&read_sources(&src));
    let text: Vec<String> = BELOW_THEIR_FOLDER
        .iter()
        .flat_map(|m| {
            let key: Vec<String> = m.split("::").map(String::from).collect();
            up.get(&key)
                .into_iter()
                .flatten()
                .map(move |(item, e)| format!("  {m} names {} ({}:{})", item.join("::"), e.file, e.line))
        })
        .collect();
    assert!(
        text.is_empty(),
        "{} reference(s) up to an item of the folder (import it from the module beside that defines it):\n{}",
        text.len(),
        text.join("\n")
    );
}

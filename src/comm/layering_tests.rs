//! Structural checks over the source tree: `comm` is a layer below the commands (it
//! names none of them), the sweep and `reduce` do not lean on each other for bandwidth
//! formulas, and every MPI or NCCL all-reduce call, NCCL rendezvous and NCCL dtype
//! table lives in `comm::transport` alone, so training and the sweep run one code path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir` (or `dir` itself when it is a file).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The files of top-level module `name`: `src/name.rs` and everything under `src/name/`.
fn module_files(name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for p in [src().join(format!("{name}.rs")), src().join(name)] {
        if p.exists() {
            files.extend(rust_files(&p));
        }
    }
    assert!(!files.is_empty(), "no source for module {name}");
    files
}

fn ident_at(s: &str) -> String {
    s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// The top-level modules `text` names through `crate::x` paths, `crate::{x, y::z}`
/// groups included (comments count too: a doc link is a dependency of the reader).
pub(crate) fn crate_modules_named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Items at brace depth 0 of the group, each up to its first `::`, `,` or `}`.
            let mut depth = 0usize;
            let mut start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_ascii_alphanumeric() || c == '_') => {
                        out.insert(ident_at(&group[k..]));
                        start = false;
                    }
                    c if start && !c.is_whitespace() => start = false,
                    _ => {}
                }
            }
        } else {
            let name = ident_at(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The non-test code of a file: test modules (`tests.rs`, `*_tests.rs`) and the
/// `#[cfg(test)] mod tests { .. }` block that ends a file are left out, since a test
/// may tie layers together without making the build's modules depend on each other.
fn non_test_code(f: &Path) -> String {
    let name = f.file_name().unwrap().to_string_lossy();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(f).unwrap();
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

fn modules_named_by(module: &str) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for f in module_files(module) {
        all.extend(crate_modules_named(&non_test_code(&f)));
    }
    all.remove(module);
    all
}

#[test]
fn the_scanner_reads_paths_and_groups() {
    let text = "use crate::a::B;\nuse crate::{c, d::{E, F}, g::*};\nlet x = crate::h::f();";
    let got: Vec<String> = crate_modules_named(text).into_iter().collect();
    assert_eq!(got, ["a", "c", "d", "g", "h"]);
}

#[test]
fn comm_names_no_command_module() {
    // comm is what the commands are built from: naming one of them makes a module cycle
    // (comm -> allreduce -> comm was one: the probe lived in comm and called the sweep).
    let named = modules_named_by("comm");
    for command in ["allreduce", "reduce", "train", "study", "cli"] {
        assert!(!named.contains(command), "src/comm names crate::{command}: {named:?}");
    }
}

#[test]
fn the_sweep_and_reduce_share_bandwidth_formulas_through_a_leaf() {
    // allreduce -> reduce (for busbw) and reduce -> allreduce (for the link model) was a cycle.
    let named = modules_named_by("allreduce");
    assert!(!named.contains("reduce"), "src/allreduce names crate::reduce: {named:?}");
    let leaf = modules_named_by("bandwidth");
    assert!(leaf.is_empty(), "src/bandwidth.rs must name no other module: {leaf:?}");
}

/// Files under `src` (outside `allowed`) whose text contains `needle`.
fn files_containing(needle: &str, allowed: &[&str]) -> Vec<String> {
    rust_files(&src())
        .into_iter()
        .filter(|f| {
            let rel = f.strip_prefix(src()).unwrap().to_string_lossy().into_owned();
            !allowed.iter().any(|a| rel.starts_with(a))
        })
        .filter(|f| non_test_code(f).contains(needle))
        .map(|f| f.strip_prefix(src()).unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn every_all_reduce_and_nccl_rendezvous_is_in_the_transport() {
    // device/cuda.rs defines the NCCL wrappers; everything that calls them, and every
    // MPI_Allreduce of a buffer, goes through comm::transport.
    let allowed = ["comm/transport", "device/cuda.rs"];
    for needle in [
        "ffi::MPI_Allreduce(",
        ".all_reduce_sum(",
        ".unique_id()",
        ".init_rank(",
        "NcclDtype::",
    ] {
        let found = files_containing(needle, &allowed);
        assert!(found.is_empty(), "{needle} outside comm/transport: {found:?}");
    }
}

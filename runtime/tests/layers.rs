//! The runtime crate is a one-way stack, and this test keeps it so: a module may name only
//! modules of its own layer or below. From the bottom:
//!
//! 0. `base`: the backend interface, errors, the sans-IO scheduler, control messages,
//!    descriptors, counters; and the buffer module's `lease`, the two calls that hand raw
//!    memory to a transport (kept with the rest of the buffer module's `unsafe`).
//! 1. `reactor`: op cells, commands, posting, completion, peers, shutdown. It never names the
//!    runtime, an endpoint or a buffer type.
//! 2. `driver`: who turns the reactor (its own thread, or `block_on` inline).
//! 3. `runtime`: the handle, its builder and settings, rail groups.
//! 4. everything else: the user API (endpoints, ops, buffers, the handshake, streams,
//!    membership).
use std::path::{Path, PathBuf};

/// The layer of the module at `path` (its segments below `crate`).
fn layer(path: &[&str]) -> usize {
    match path {
        ["base", ..] | ["buf", "lease", ..] => 0,
        ["reactor", ..] => 1,
        ["driver", ..] => 2,
        ["runtime", ..] => 3,
        _ => 4,
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `crate::` paths a line of code names (comments left out).
fn named(line: &str) -> Vec<Vec<String>> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let path: Vec<String> =
            rest[..end].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 30, "the sources were found");
    let mut upward = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src").with_extension("");
        let mut me: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if me.last().is_some_and(|s| s == "mod") {
            me.pop();
        }
        let me: Vec<&str> = me.iter().map(String::as_str).collect();
        let mine = layer(&me);
        let text = std::fs::read_to_string(&file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for path in named(line) {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                // `crate::Name` is the crate root's re-export: the user API.
                let theirs = if path[0].starts_with(char::is_uppercase) { 4 } else { layer(&path) };
                if theirs > mine {
                    upward.push(format!(
                        "{}:{}: layer {mine} names {} (layer {theirs})",
                        rel.display(),
                        n + 1,
                        path.join("::")
                    ));
                }
            }
        }
    }
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
}

#[test]
fn crate_paths_are_named_one_by_one() {
    // A grouped `use crate::{..}` would hide its modules from the check above.
    assert_eq!(named("use crate::{a, b};"), Vec::<Vec<String>>::new());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        assert!(!text.contains("crate::{"), "{}: a grouped crate import", file.display());
        assert!(!text.contains("super::super::"), "{}: reaches out of its folder by super", file.display());
    }
}

//! docs/DESIGN.md's layout lists every file of this crate's `src/` with its
//! one job, and nothing that is gone: a newcomer finds each file there.

use std::collections::BTreeSet;
use std::path::Path;

/// The files the layout block names under `shared/`: a top-level entry
/// `  src/NAME`, or a folder `  src/DIR/` whose entries (`    a.rs, b.rs …`
/// or `    sub/c.rs …`) are relative to it.
fn listed() -> BTreeSet<String> {
    let design = include_str!("../../docs/DESIGN.md");
    let block = design
        .split("## Layout")
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .expect("DESIGN.md has a Layout section with a code block");
    let mut files = BTreeSet::new();
    let mut folder: Option<String> = None;
    for line in block.lines() {
        let indent = line.len() - line.trim_start().len();
        // The names lead the line (`a.rs, b.rs`), its job follows.
        let names: Vec<&str> = line
            .split_whitespace()
            .map(|t| t.trim_end_matches(','))
            .take_while(|t| t.ends_with(".rs") || t.ends_with('/'))
            .collect();
        match (indent, names.as_slice()) {
            (2, [entry]) if entry.ends_with('/') => {
                folder = Some(entry.trim_start_matches("src/").to_string());
            }
            (2, [entry]) => {
                folder = None;
                files.insert(entry.trim_start_matches("src/").to_string());
            }
            (4, names) => {
                if let Some(folder) = &folder {
                    files.extend(names.iter().map(|name| format!("{folder}{name}")));
                }
            }
            _ => folder = None,
        }
    }
    files
}

fn on_disk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            on_disk(&path, &format!("{prefix}{name}/"), out);
        } else if name.ends_with(".rs") {
            out.insert(format!("{prefix}{name}"));
        }
    }
}

#[test]
fn the_design_layout_lists_every_file() {
    let mut files = BTreeSet::new();
    on_disk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "",
        &mut files,
    );
    let listed = listed();
    let missing: Vec<&String> = files.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&files).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/DESIGN.md's layout lacks {missing:?} and lists files that are gone: {gone:?}"
    );
}

//! The crate's root is the plugin contract: every name it exports is used
//! by a plugin or a helper crate plugins build on, or explained to plugin
//! authors in `docs/plugins/writing-a-plugin.md`. A name only the engine
//! needs belongs under `engine` (or in the crate that owns it), so that a
//! change to the engine's wiring does not change what plugins compile
//! against.

use std::path::{Path, PathBuf};

/// The names `src/lib.rs` exports at the root with `pub use` (the alias
/// where there is one), leaving out the `engine` module.
fn root_exports(lib: &str) -> Vec<String> {
    let root = lib.split("pub mod engine").next().unwrap();
    let mut names = Vec::new();
    let mut rest = root;
    while let Some(at) = rest.find("\npub use ") {
        let after = &rest[at + "\npub use ".len()..];
        let end = after.find(';').unwrap();
        let item = &after[..end];
        rest = &after[end..];
        let listed: Vec<&str> = match item.find('{') {
            Some(open) => item[open + 1..item.rfind('}').unwrap()]
                .split(',')
                .collect(),
            None => vec![item],
        };
        for one in listed {
            let one = one.trim();
            if one.is_empty() {
                continue;
            }
            let name = match one.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => one.rsplit("::").next().unwrap().trim(),
            };
            names.push(name.to_string());
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn uses_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !part(before) && !part(after)
    })
}

#[test]
fn every_root_export_is_used_by_a_plugin_or_taught_to_plugin_authors() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = here.join("../..");
    let lib = std::fs::read_to_string(here.join("src/lib.rs")).unwrap();
    let names = root_exports(&lib);
    assert!(names.len() > 40, "parsed the exports: {names:?}");
    assert!(names.iter().any(|n| n == "TypedPlugin") && names.iter().any(|n| n == "event"));
    assert!(
        !names.iter().any(|n| n == "Tap"),
        "engine names are not at the root"
    );

    // Plugins and the helper crates they are allowed to use.
    let mut files = Vec::new();
    rust_files(&workspace.join("plugins"), &mut files);
    for helper in [
        "sink",
        "connections",
        "tls",
        "compress",
        "framing",
        "condition",
    ] {
        rust_files(&workspace.join("crates").join(helper), &mut files);
    }
    let sources: Vec<String> = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .filter(|text| text.contains("logbus_plugin_api"))
        .collect();
    assert!(sources.len() > 50, "found the plugins ({})", sources.len());
    let guide =
        std::fs::read_to_string(workspace.join("docs/plugins/writing-a-plugin.md")).unwrap();

    let unused: Vec<&String> = names
        .iter()
        .filter(|n| !uses_word(&guide, n) && !sources.iter().any(|s| uses_word(s, n)))
        .collect();
    assert!(
        unused.is_empty(),
        "exported at the root of the plugin contract but used by no plugin and not in the guide: {unused:?} \
         (move engine-only names under `engine`)"
    );
}

#[test]
fn the_export_list_is_read_with_aliases_and_groups() {
    let lib = "//! x\n\npub use a::b as c;\npub use d::{E, f::G,\n    H};\npub use i::J;\n\npub mod engine {\n    pub use k::L;\n}\n";
    assert_eq!(root_exports(lib), ["c", "E", "G", "H", "J"]);
}

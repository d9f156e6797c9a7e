//! The workspace's READMEs (each published crate's registry page, and the contributors' README): no Rust
//! example has lines that rustdoc would hide (`# …`). They would show on GitHub and on the registry page as
//! stray `#` lines, and hide what the example needs from its readers. (A workspace check: no crate's tarball
//! holds the other crates' READMEs.)
#![allow(clippy::unwrap_used, missing_docs)]

/// Lines of `text`'s Rust code blocks that rustdoc would hide.
fn hidden_lines(text: &str) -> Vec<String> {
    // `None` outside code blocks, else whether the block is Rust.
    let mut block: Option<bool> = None;
    let mut hidden = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            block = match block {
                Some(_) => None,
                None => Some(fence.is_empty() || fence.starts_with("rust")),
            };
            continue;
        }
        let in_rust = block == Some(true);
        if in_rust && (trimmed == "#" || trimmed.starts_with("# ")) {
            hidden.push(format!("line {}: {line}", i + 1));
        }
    }
    hidden
}

#[test]
fn no_readme_example_has_hidden_lines() {
    for (name, text) in [
        ("README.md", include_str!("../../README.md")),
        ("core/README.md", include_str!("../../core/README.md")),
        (
            "adapters/README.md",
            include_str!("../../adapters/README.md"),
        ),
        ("testkit/README.md", include_str!("../../testkit/README.md")),
    ] {
        assert_eq!(hidden_lines(text), Vec::<String>::new(), "{name}");
    }
    let sample =
        "```toml\n# a comment\n```\n```rust\n# let x = 1;\n#[derive(Debug)]\n```\n# Title\n";
    assert_eq!(
        hidden_lines(sample),
        vec!["line 5: # let x = 1;".to_owned()]
    );
}

/// Each published crate's README is its own registry page, and short enough to be read as one.
#[test]
fn each_crate_readme_fits_its_registry_page() {
    for (name, text) in [
        ("core/README.md", include_str!("../../core/README.md")),
        (
            "adapters/README.md",
            include_str!("../../adapters/README.md"),
        ),
        ("testkit/README.md", include_str!("../../testkit/README.md")),
    ] {
        assert!(
            text.lines().count() <= 260,
            "{name}: {} lines",
            text.lines().count()
        );
    }
}

//! The same source gives the same module, byte for byte, wherever it is built: a copy of the
//! sources in another directory, built by the Makefile's own rule into another target directory,
//! yields the kvroute-lite.wasm `make build` wrote here (so the same image digest). What varies
//! between builders — the checkout's path, the cargo registry's — is remapped by the Makefile;
//! the toolchain is the same one (the Makefile's `RUST_VERSION` names the published one). (The lite module: a minute to build from
//! nothing; the full one differs only by the tiktoken crate.)

use harness::{copy_tree, lite_wasm_path, repo_root};
use std::process::{Command, Stdio};

#[test]
fn a_copy_elsewhere_builds_the_same_module() {
    let here = std::fs::read(lite_wasm_path().unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("kvroute-repro-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let copy = dir.join("elsewhere/kvroute");
    let root = repo_root();
    for file in ["Cargo.toml", "Cargo.lock", "Makefile", "clippy.toml"] {
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(root.join(file), copy.join(file)).unwrap();
    }
    // The workspace's members, as cargo needs them to read the workspace: their manifests and
    // targets (e2e has only its tests).
    for tree in [
        "src",
        "examples",
        "tools",
        "sim/src",
        "harness/src",
        "bench/src",
        "e2e/tests",
    ] {
        copy_tree(&root.join(tree), &copy.join(tree)).unwrap();
    }
    for manifest in [
        "sim/Cargo.toml",
        "harness/Cargo.toml",
        "bench/Cargo.toml",
        "e2e/Cargo.toml",
    ] {
        std::fs::copy(root.join(manifest), copy.join(manifest)).unwrap();
    }
    let out = Command::new("make")
        .current_dir(&copy)
        .args([
            "--no-print-directory",
            "lite-module",
            "LITE_TARGET_DIR=other-target",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("make");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let there = std::fs::read(copy.join("target/wasm32-wasip1/release/kvroute-lite.wasm")).unwrap();
    assert_eq!(there.len(), here.len(), "sizes differ");
    assert!(
        there == here,
        "the module built in {} differs",
        copy.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

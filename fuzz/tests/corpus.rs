//! Every committed seed and regression input through its target's checks, without
//! instrumentation: `cargo test --manifest-path fuzz/Cargo.toml` (part of `make test`).

use std::path::Path;

#[test]
fn every_corpus_file_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for (name, check) in kvroute_fuzz::TARGETS {
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            let mut files: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
            files.sort();
            for file in files {
                let bytes = std::fs::read(&file).unwrap();
                eprintln!("{name}: {}", file.display());
                check(&bytes);
                ran += 1;
            }
        }
        assert!(
            root.join("corpus").join(name).is_dir(),
            "target `{name}` has no seed corpus"
        );
    }
    assert!(ran >= kvroute_fuzz::TARGETS.len());
}

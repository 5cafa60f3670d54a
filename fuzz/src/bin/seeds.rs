//! Writes each fuzz target's seed corpus: `seeds [DIR] [TARGET...]` writes
//! `DIR/TARGET/NAME` (DIR defaults to `corpus`, next to this crate's manifest) for every
//! target or the ones named, after removing the old seeds (files named `seed-*`).
//! Seeds are made with the filesystem's own code, so `make fuzz-seeds` regenerates them
//! when the format changes.

use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let only: Vec<String> = args.collect();
    for (name, seeds) in ninefold_fuzz::TARGETS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("corpus directory");
        for e in std::fs::read_dir(&d)
            .expect("read corpus directory")
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with("seed-") {
                std::fs::remove_file(e.path()).expect("remove an old seed");
            }
        }
        let list = seeds();
        for (seed, bytes) in &list {
            // Every seed must run through its target cleanly.
            ninefold_fuzz::run(name, bytes);
            std::fs::write(d.join(format!("seed-{seed}")), bytes).expect("write a seed");
        }
        println!("{name}: {} seeds", list.len());
    }
}

//! Publishes the linker script's path to dependents (the kernel's build script links the
//! image with it), so the script lives next to the entry code that depends on its layout.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = std::path::Path::new(&dir).join("linker.ld");
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:linker_script={}", script.display());
}

//! Links the appliance image with the boot crate's linker script (target builds only).

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        let script = std::env::var("DEP_NINEFOLD_BOOT_LINKER_SCRIPT")
            .expect("ninefold-boot publishes its linker script");
        println!("cargo:rustc-link-arg-bins=-T{script}");
        println!("cargo:rustc-link-arg-bins=-zmax-page-size=4096");
        println!("cargo:rerun-if-changed={script}");
    }
}

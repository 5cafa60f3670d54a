//! The appliance image: the boot crate enters [`kernel::kmain`].
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
boot::entry_point!(kernel::kmain);
#[cfg(target_os = "none")]
boot::ap_entry_point!(kernel::smp::ap_main);

/// On the host this binary is only a pointer to the real build.
#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("ninefold-kernel runs only as the appliance image: build it with `make image`");
    std::process::exit(2);
}

//! Boot support for the ninefold appliance: everything between the PVH loader and the
//! kernel's Rust entry point.
//!
//! - [`pvh`]: the ELF note that makes the image bootable with QEMU `-kernel` (PVH), the
//!   32-bit entry, early identity paging of the first 4 GiB, and the switch to long mode.
//! - [`info`]: the PVH start info (memory map, command line, RSDP), copied into the kernel
//!   image before anything can overwrite it, and handed to the kernel as a [`BootInfo`].
//! - [`stack`]: stacks with an unmapped guard page below them.
//! - `ap`: the application processors' real-mode trampoline and their way into the
//!   kernel's [`ap_entry_point!`] (`long_mode`: the switch both entries share).
//! - [`layout`]: the section boundaries from `linker.ld`, so the kernel can map text,
//!   rodata and data with the right permissions.
//!
//! The kernel crate defines its entry point with [`entry_point!`]. Everything that touches
//! hardware is compiled only for `target_os = "none"`; the data types and the parsing of
//! the start info also build (and are tested) on the host.
#![cfg_attr(not(test), no_std)]

#[cfg(target_os = "none")]
#[macro_use]
mod long_mode;

#[cfg(target_os = "none")]
pub mod ap;
pub mod info;
pub mod layout;
pub mod stack;

#[cfg(target_os = "none")]
mod pvh;

pub use info::{BootInfo, MemoryKind, MemoryRegion};

/// Declares the kernel's entry point: a `fn(&'static BootInfo) -> !` that the boot code
/// calls once it runs in long mode on the main kernel stack with interrupts disabled.
///
/// ```ignore
/// boot::entry_point!(kernel::kmain);
/// ```
#[macro_export]
macro_rules! entry_point {
    ($path:path) => {
        /// The symbol the boot code calls; the signature is checked here.
        #[unsafe(export_name = "ninefold_kernel_main")]
        pub extern "Rust" fn __ninefold_kernel_main(info: &'static $crate::BootInfo) -> ! {
            let entry: fn(&'static $crate::BootInfo) -> ! = $path;
            entry(info)
        }
    };
}

/// Declares the kernel's entry point for application processors: a `fn(usize) -> !` that
/// the AP trampoline calls, with the CPU index the boot CPU gave to `ap::prepare`, in long
/// mode on the kernel's page tables and the stack it chose, interrupts disabled.
///
/// ```ignore
/// boot::ap_entry_point!(kernel::smp::ap_main);
/// ```
#[macro_export]
macro_rules! ap_entry_point {
    ($path:path) => {
        /// The symbol the AP trampoline calls; the signature is checked here.
        #[unsafe(export_name = "ninefold_kernel_ap_main")]
        pub extern "Rust" fn __ninefold_kernel_ap_main(cpu: usize) -> ! {
            let entry: fn(usize) -> ! = $path;
            entry(cpu)
        }
    };
}

//! The ninefold appliance kernel.
//!
//! One library for the image and its host tests:
//! - pure modules (build everywhere, unit-tested on the host): [`config`] (command line),
//!   [`exec`] (async executor), [`mm`] (memory map, frame allocator), [`net`] (sizing
//!   rules; the network stack and 9P service build only for the appliance), [`pci`] (decoding,
//!   enumeration, capabilities), [`power`] (ACPI register bits, the `\_S5_` scan, SCI
//!   wiring; the power button and soft-off themselves build only for the appliance),
//!   [`report`] (counter snapshots and their formats), [`event`] (the structured events
//!   on the console, for programs), [`time`], [`sync`], [`exit`],
//!   [`clock::skew`] (the TSC check across CPUs);
//! - hardware modules (only for `x86_64-unknown-none`): `hal` (all `unsafe` code),
//!   `apic`, `clock` (the rest of it), `irq`, `platform` (ACPI), `klog`, `fault`, `task`, `selftest`,
//!   `shutdown` (the clean shutdown after a power-button press), `smp` (starting the
//!   other CPUs and sending them work), and
//!   `init` (the boot sequence, [`kmain`]).
//!
//! `unsafe` is denied crate-wide and allowed only in `hal`.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]

extern crate alloc;

pub mod alerts;
pub mod clock;
pub mod config;
pub mod drivers;
pub mod event;
pub mod exec;
pub mod exit;
pub mod mm;
pub mod net;
pub mod pci;
pub mod power;
pub mod report;
pub mod storage;
pub mod sync;
pub mod time;

#[cfg(target_os = "none")]
#[allow(unsafe_code)]
pub mod hal;

#[cfg(target_os = "none")]
pub mod apic;
#[cfg(target_os = "none")]
mod bench;
#[cfg(target_os = "none")]
mod crash;
#[cfg(target_os = "none")]
mod fault;
#[cfg(target_os = "none")]
mod init;
#[cfg(target_os = "none")]
pub mod irq;
#[cfg(target_os = "none")]
mod klog;
#[cfg(target_os = "none")]
mod monitor;
#[cfg(target_os = "none")]
pub mod platform;
#[cfg(target_os = "none")]
mod selftest;
#[cfg(target_os = "none")]
mod shutdown;
#[cfg(target_os = "none")]
pub mod smp;
#[cfg(target_os = "none")]
pub mod task;

#[cfg(target_os = "none")]
pub use init::kmain;

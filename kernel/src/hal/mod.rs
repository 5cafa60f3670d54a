//! The hardware abstraction layer: **all of the kernel's `unsafe` code lives here** (the
//! crate denies `unsafe_code` everywhere else), each use with a `// SAFETY:` comment. The
//! rest of the kernel builds on the safe interfaces below, in the spirit of Asterinas'
//! OSTD:
//!
//! - [`cpu`]: interrupt flag, `hlt`, TSC, CPUID, the interrupt depth, and leaving QEMU.
//! - [`percpu`]: which CPU is running (each CPU's GS base); [`cpu_local`]: per-CPU
//!   values for task context.
//! - [`io_port`]: x86 port I/O.
//! - [`console`]: the serial ports: the console (COM1) and the event channel (COM2).
//! - [`gdt`], [`trap`]: segments, IST stacks, the IDT and the entry stubs of every
//!   exception and interrupt.
//! - [`memory`]: the global frame allocator; [`heap`]: the kernel heap; [`paging`]: page
//!   tables, MMIO and firmware mappings; [`mmio`]: bounds-checked volatile register access;
//!   [`dma`]: memory devices read and write, typed by ownership (a device's bus mastering,
//!   coherent queues, streams lent to the device).
//! - [`smp`]: the application processors' trampoline and start parameters.
//! - [`acpi`]: the identity-mapping handler the `acpi` crate needs, and the DSDT's bytes.
//! - [`virtio`]: the `virtio-drivers` crate behind safe interfaces (its `Hal`, PCI
//!   configuration access, MSI-X routing, and its `unsafe` queue and network APIs made
//!   safe by owning every buffer the device holds). The virtio drivers themselves live in
//!   `drivers/`.

pub mod acpi;
pub mod console;
pub mod cpu;
pub mod cpu_local;
pub mod dma;
pub mod gdt;
pub mod heap;
pub mod io_port;
pub mod memory;
pub mod mmio;
pub mod paging;
pub mod percpu;
pub mod smp;
pub mod trap;
pub mod virtio;

//! Interrupt vectors and their handlers.
//!
//! Vectors 0x30..=0xdf are allocated dynamically ([`allocate`]) to MSI/MSI-X entries and
//! IOAPIC lines; the returned [`IrqHandle`] owns the vector and unregisters it on drop.
//! Handlers run in interrupt context with interrupts disabled: they should do little more
//! than acknowledge the device and [`IrqEvent::signal`](crate::exec::IrqEvent::signal) a
//! task. The local APIC gets its end-of-interrupt after the handler returns.
//!
//! Vectors are the same on every CPU (one IDT): an interrupt runs its vector's handler on
//! whichever CPU the device's message targets ([`IrqHandle::msi_message_to`]). Each
//! vector's handler sits under its own lock, taken by the CPU the interrupt arrives on
//! (and, rarely, to install or remove it), so CPUs taking interrupts on different vectors
//! never meet on a shared lock.

use alloc::sync::Arc;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::apic::lapic;
use crate::pci::MsiMessage;
use crate::sync::IrqLock;

/// The local APIC timer's vector.
pub const TIMER_VECTOR: u8 = 0x20;
/// The local APIC error vector.
pub const ERROR_VECTOR: u8 = 0x21;
/// The inter-processor interrupt that wakes a halted CPU whose executor got work from
/// another CPU (its handler does nothing: ending the halt is the point).
pub const WAKE_VECTOR: u8 = 0x22;
/// The 8259 PICs are remapped here (and masked); only spurious interrupts arrive.
pub const PIC_BASE: u8 = 0xe0;
/// The local APIC's spurious-interrupt vector (no EOI).
pub const SPURIOUS_VECTOR: u8 = 0xff;

const DYNAMIC: core::ops::RangeInclusive<u8> = 0x30..=0xdf;

type Handler = Arc<dyn Fn() + Send + Sync>;

static HANDLERS: [IrqLock<Option<Handler>>; 256] = [const { IrqLock::new(None) }; 256];
static COUNTS: [AtomicU64; 256] = [const { AtomicU64::new(0) }; 256];
static UNHANDLED: AtomicU64 = AtomicU64::new(0);

/// No free vector left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoFreeVector;

impl fmt::Display for NoFreeVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no free interrupt vector")
    }
}

/// An allocated vector with its handler; dropping it unregisters the handler and frees the
/// vector (disable the device's interrupt first).
pub struct IrqHandle {
    vector: u8,
    /// The vector's count when it was allocated (vectors are reused).
    base_count: u64,
}

impl fmt::Debug for IrqHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IrqHandle({:#x})", self.vector)
    }
}

impl IrqHandle {
    /// The vector.
    pub fn vector(&self) -> u8 {
        self.vector
    }

    /// The MSI message that raises this vector on this CPU.
    pub fn msi_message(&self) -> MsiMessage {
        self.msi_message_to(lapic::id())
    }

    /// The MSI message that raises this vector on the CPU with local APIC id `apic_id`.
    pub fn msi_message_to(&self, apic_id: u8) -> MsiMessage {
        MsiMessage::fixed(apic_id, self.vector)
    }

    /// Interrupts delivered to this handle so far.
    pub fn count(&self) -> u64 {
        count(self.vector) - self.base_count
    }
}

impl Drop for IrqHandle {
    fn drop(&mut self) {
        HANDLERS[usize::from(self.vector)].lock(|h| *h = None);
    }
}

/// Allocates a vector and installs `handler` for it.
pub fn allocate(handler: impl Fn() + Send + Sync + 'static) -> Result<IrqHandle, NoFreeVector> {
    let mut handler = Some(Arc::new(handler) as Handler);
    let vector = DYNAMIC
        .clone()
        .find(|&v| {
            // Claimed under the vector's own lock: two CPUs allocating never share one.
            HANDLERS[usize::from(v)].lock(|h| {
                if h.is_none() {
                    *h = handler.take();
                }
                handler.is_none()
            })
        })
        .ok_or(NoFreeVector)?;
    Ok(IrqHandle {
        vector,
        base_count: count(vector),
    })
}

/// Installs the handler of a fixed (non-allocatable) vector, such as the timer's.
pub fn set_fixed_handler(vector: u8, handler: impl Fn() + Send + Sync + 'static) {
    assert!(
        !DYNAMIC.contains(&vector),
        "vector {vector:#x} is dynamically allocated"
    );
    HANDLERS[usize::from(vector)].lock(|h| *h = Some(Arc::new(handler)));
}

/// Interrupts delivered on `vector` so far.
pub fn count(vector: u8) -> u64 {
    COUNTS[usize::from(vector)].load(Ordering::Relaxed)
}

/// Interrupts that arrived on a vector without a handler.
pub fn unhandled() -> u64 {
    UNHANDLED.load(Ordering::Relaxed)
}

/// Runs the handler of `vector` (>= 32) and acknowledges the interrupt. Called from the
/// trap entry path with interrupts disabled.
pub fn dispatch(vector: u8) {
    COUNTS[usize::from(vector)].fetch_add(1, Ordering::Relaxed);
    if vector == SPURIOUS_VECTOR || (PIC_BASE..PIC_BASE + 16).contains(&vector) {
        return; // spurious: no EOI
    }
    // Run under the vector's lock: only a handle being dropped (or the vector being
    // claimed) waits for it.
    let handled = HANDLERS[usize::from(vector)].lock(|h| h.as_ref().map(|h| h()).is_some());
    if !handled {
        UNHANDLED.fetch_add(1, Ordering::Relaxed);
    }
    lapic::eoi();
}

//! Interrupt delivery checks: an IOAPIC line (PIT IRQ 0), an MSI (QEMU's `edu` device) and
//! an MSI-X vector plus DMA (the NVMe driver bringing up a controller).

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use core::time::Duration;

use super::{ensure, Verdict};
use crate::apic::{ioapic, lapic};
use crate::clock::pit;
use crate::config::DiskSelector;
use crate::drivers::nvme::{self, NvmeDisk};
use crate::drivers::select::select;
use crate::event::{Fact, Facts};
use crate::exec::IrqEvent;
use crate::irq::{self, IrqHandle};
use crate::mm::DmaDevice;
use crate::pci::device;
use crate::task;

const WAIT: Duration = Duration::from_secs(2);

/// An interrupt vector whose handler runs `ack` and signals an event.
fn irq_with_event(
    ack: impl Fn() + Send + Sync + 'static,
) -> Result<(IrqHandle, Arc<IrqEvent>), String> {
    let event = Arc::new(IrqEvent::new());
    let e = event.clone();
    let handle = irq::allocate(move || {
        ack();
        e.signal();
    })
    .map_err(|e| format!("{e}"))?;
    Ok((handle, event))
}

/// PIT channel 0 raises ISA IRQ 0 once; the IOAPIC must deliver it.
pub async fn ioapic() -> Verdict {
    let (irq, event) = match irq_with_event(|| {}) {
        Ok(x) => x,
        Err(e) => return Verdict::Fail(e),
    };
    let (gsi, active_low, level) = ioapic::isa_irq(0);
    if ioapic::route(gsi, irq.vector(), lapic::id(), active_low, level).is_err() {
        return Verdict::Skip("no IOAPIC serves ISA IRQ 0");
    }
    pit::oneshot_irq0(5);
    let got = task::timeout(WAIT, event.wait()).await;
    let _ = ioapic::mask(gsi);
    ensure!(
        got.is_ok(),
        "PIT IRQ 0 (GSI {gsi}) not delivered within {WAIT:?}"
    );
    Verdict::Pass(format!(
        "PIT IRQ 0 via GSI {gsi} -> vector {:#x}",
        irq.vector()
    ))
}

/// QEMU's `edu` device (1234:11e8) raises an MSI when its register 0x60 is written.
pub async fn msi() -> Verdict {
    let Some(dev) = device::find(0x1234, 0x11e8).next() else {
        return Verdict::Skip("no edu device (-device edu)");
    };
    let regs = match dev.map_bar(0) {
        Ok(r) => r,
        Err(e) => return Verdict::Fail(format!("mapping BAR0: {e:?}")),
    };
    let id = regs.read32(0x00);
    ensure!(
        id & 0xff == 0xed,
        "edu identification register reads {id:#x}"
    );
    regs.write32(0x04, 0x1234_5678);
    let live = regs.read32(0x04);
    ensure!(live == !0x1234_5678, "edu liveness check read {live:#x}");
    let ack_regs = regs.clone();
    let (irq, event) = match irq_with_event(move || {
        // Acknowledge: write the status back to the interrupt-acknowledge register.
        let status = ack_regs.read32(0x24);
        ack_regs.write32(0x64, status);
    }) {
        Ok(x) => x,
        Err(e) => return Verdict::Fail(e),
    };
    // An MSI is a memory write by the device: it needs bus mastering.
    let dma = match DmaDevice::new(dev) {
        Ok(d) => d,
        Err(e) => return Verdict::Fail(format!("{e:?}")),
    };
    dma.start();
    if dev.enable_msi(&irq).is_err() {
        return Verdict::Fail("edu device has no MSI capability".into());
    }
    regs.write32(0x60, 0x1);
    let got = task::timeout(WAIT, event.wait()).await;
    ensure!(
        got.is_ok(),
        "MSI on vector {:#x} not delivered within {WAIT:?}",
        irq.vector()
    );
    ensure!(irq.count() == 1, "{} interrupts for one MSI", irq.count());
    Verdict::Pass(format!(
        "edu at {} raised vector {:#x}",
        dev.address(),
        irq.vector()
    ))
}

/// The first NVMe controller, brought up by the NVMe driver in interrupt mode, answers
/// its admin commands (Identify among them: the data arrives by DMA) with completions
/// signalled through MSI-X entry 0.
pub async fn msix() -> Verdict {
    let Ok((addr, _)) = select(device::functions(), Some(DiskSelector::Nvme(0))) else {
        return Verdict::Skip("no NVMe controller");
    };
    let pci = device::at(addr).expect("enumerated");
    let disk = match NvmeDisk::open(pci, nvme::Options::default()).await {
        Ok(d) => d,
        Err(e) => return Verdict::Fail(format!("NVMe controller at {addr}: {e}")),
    };
    let Some((vector, count)) = disk.admin_interrupts() else {
        return Verdict::Fail("the driver did not set up MSI-X".into());
    };
    ensure!(
        count > 0,
        "admin commands completed without an MSI-X interrupt on vector {vector:#x}"
    );
    let c = disk.controller();
    Verdict::Measured(
        format!(
            "NVMe at {addr} serial \"{}\" model \"{}\" via MSI-X vector {vector:#x} ({count} interrupts)",
            c.serial, c.model
        ),
        Facts::new()
            .with("serial", Fact::Text(c.serial.clone().into()))
            .with("interrupts", Fact::Number(count)),
    )
}

//! Interrupt delivery checks: an IOAPIC line (PIT IRQ 0), an MSI (QEMU's `edu` device) and
//! an MSI-X vector plus DMA (an NVMe controller answering Identify).

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use core::time::Duration;

use super::{ensure, Verdict};
use crate::apic::{ioapic, lapic};
use crate::clock::pit;
use crate::exec::IrqEvent;
use crate::hal::mmio::MmioRegion;
use crate::irq::{self, IrqHandle};
use crate::mm::DmaBuffer;
use crate::pci::device::{self, PciDevice};
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

/// The first NVMe controller answers an Identify Controller command on its admin queue:
/// the data arrives by DMA and the completion is signalled through MSI-X entry 0.
pub async fn msix() -> Verdict {
    let Some(dev) = device::functions()
        .iter()
        .find(|f| f.class == 0x01 && f.subclass == 0x08 && f.prog_if == 0x02)
        .and_then(|f| device::at(f.addr))
    else {
        return Verdict::Skip("no NVMe controller");
    };
    match identify_nvme(&dev).await {
        Ok((serial, model, vector)) => Verdict::Pass(format!(
            "NVMe at {} serial \"{serial}\" model \"{model}\" via MSI-X vector {vector:#x}",
            dev.address()
        )),
        Err(e) => Verdict::Fail(e),
    }
}

/// NVMe controller registers.
mod nvme {
    pub const CAP: usize = 0x00;
    pub const CC: usize = 0x14;
    pub const CSTS: usize = 0x1c;
    pub const AQA: usize = 0x24;
    pub const ASQ: usize = 0x28;
    pub const ACQ: usize = 0x30;
    pub const DOORBELLS: usize = 0x1000;
}

async fn wait_ready(regs: &MmioRegion, ready: bool) -> Result<(), String> {
    let end = task::now() + WAIT;
    while (regs.read32(nvme::CSTS) & 1 == 1) != ready {
        if task::now() > end {
            return Err(format!("CSTS.RDY did not become {ready}"));
        }
        task::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().into()
}

async fn identify_nvme(dev: &PciDevice) -> Result<(String, String, u8), String> {
    let regs = dev.map_bar(0).map_err(|e| format!("mapping BAR0: {e:?}"))?;
    let cap = regs.read64(nvme::CAP);
    let stride = 4usize << ((cap >> 32) & 0xf);
    regs.write32(nvme::CC, 0);
    wait_ready(&regs, false).await?;

    let oom = |_| String::from("out of DMA memory");
    let sq = DmaBuffer::new(4096).map_err(oom)?;
    let cq = DmaBuffer::new(4096).map_err(oom)?;
    let data = DmaBuffer::new(4096).map_err(oom)?;
    let entries = 16u32;
    regs.write32(nvme::AQA, ((entries - 1) << 16) | (entries - 1));
    regs.write64(nvme::ASQ, sq.phys_addr());
    regs.write64(nvme::ACQ, cq.phys_addr());

    let (irq, event) = irq_with_event(|| {})?;
    let msix = dev.msix().map_err(|e| format!("MSI-X: {e:?}"))?;
    msix.set(0, &irq);
    msix.enable();

    // Enable: 64-byte submission and 16-byte completion entries, 4 KiB pages.
    regs.write32(nvme::CC, (6 << 16) | (4 << 20) | 1);
    wait_ready(&regs, true).await?;

    // Identify Controller: opcode 0x06, command id 1, PRP1 = data, CDW10.CNS = 1.
    sq.write_volatile::<u32>(0, 0x06 | (1 << 16));
    sq.write_volatile::<u64>(24, data.phys_addr());
    sq.write_volatile::<u32>(40, 1);
    regs.write32(nvme::DOORBELLS, 1); // submission queue 0 tail
    let got = task::timeout(WAIT, event.wait()).await;

    let dw3: u32 = cq.read_volatile(12);
    regs.write32(nvme::DOORBELLS + stride, 1); // completion queue 0 head
    regs.write32(nvme::CC, 0);
    msix.disable();
    let result = if got.is_err() {
        Err(format!(
            "no MSI-X interrupt within {WAIT:?} (completion dword 3 {dw3:#x})"
        ))
    } else if dw3 >> 16 & 1 != 1 || dw3 & 0xffff != 1 {
        Err(format!(
            "interrupt without the completion (dword 3 {dw3:#x})"
        ))
    } else if dw3 >> 17 != 0 {
        Err(format!("Identify failed with status {:#x}", dw3 >> 17))
    } else {
        let id = data.as_slice();
        Ok((ascii(&id[4..24]), ascii(&id[24..64]), irq.vector()))
    };
    wait_ready(&regs, false).await?;
    result
}

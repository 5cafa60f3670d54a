//! DMA memory with a real device: QEMU's `edu` device (1234:11e8), whose DMA engine copies
//! between RAM and a 4 KiB buffer of its own.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::{ensure, Verdict};
use crate::hal::memory;
use crate::hal::mmio::MmioRegion;
use crate::mm::{DmaDevice, DmaStream, LentStream, PAGE_SIZE};
use crate::pci::device;
use crate::task;

/// edu's DMA registers: source, destination, byte count, command.
const DMA_SRC: usize = 0x80;
const DMA_DST: usize = 0x88;
const DMA_COUNT: usize = 0x90;
const DMA_CMD: usize = 0x98;
/// Command bits: start (reads back set while running); direction edu → RAM.
const CMD_RUN: u64 = 1;
const CMD_TO_RAM: u64 = 2;
/// edu's own buffer, as its DMA engine addresses it.
const EDU_BUFFER: u64 = 0x40000;
/// Bytes per transfer: edu's range check (QEMU 7.2) refuses one that ends exactly at the
/// end of its 4 KiB buffer, so half of it.
const TRANSFER: usize = 2048;
/// edu reaches only the first 256 MiB (its default DMA mask).
const EDU_REACH: u64 = 1 << 28;
/// The engine runs on a 100 ms timer.
const DMA_WAIT: Duration = Duration::from_secs(2);

/// Runs one edu DMA transfer of `len` bytes and waits for it to finish.
async fn transfer(regs: &MmioRegion, src: u64, dst: u64, len: usize, to_ram: bool) -> bool {
    regs.write64(DMA_SRC, src);
    regs.write64(DMA_DST, dst);
    regs.write64(DMA_COUNT, len as u64);
    regs.write64(DMA_CMD, CMD_RUN | if to_ram { CMD_TO_RAM } else { 0 });
    let end = task::now() + DMA_WAIT;
    while regs.read64(DMA_CMD) & CMD_RUN != 0 {
        if task::now() > end {
            return false;
        }
        task::sleep(Duration::from_millis(10)).await;
    }
    true
}

fn reachable(s: &LentStream) -> bool {
    s.device_addr() + s.len() as u64 <= EDU_REACH
}

/// A stream lent to edu goes into its buffer and comes back, byte for byte, through
/// another stream; a lent stream dropped while edu masters the bus stays allocated
/// (parked) until bus mastering is off, and is freed then.
pub async fn dma() -> Verdict {
    let Some(dev) = device::find(0x1234, 0x11e8).next() else {
        return Verdict::Skip("no edu device (-device edu)");
    };
    let regs = match dev.map_bar(0) {
        Ok(r) => r,
        Err(e) => return Verdict::Fail(format!("mapping BAR0: {e:?}")),
    };
    let dma = match DmaDevice::new(dev) {
        Ok(d) => d,
        Err(e) => return Verdict::Fail(format!("{e:?}")),
    };
    dma.start();
    let pattern: Vec<u8> = (0..TRANSFER).map(|i| (i * 7 + 3) as u8).collect();
    let (Ok(out), Ok(back)) = (
        DmaStream::copy_of(&dma, &pattern),
        DmaStream::alloc(&dma, TRANSFER),
    ) else {
        return Verdict::Fail("no DMA memory".into());
    };
    ensure!(
        back.as_slice().iter().all(|&b| b == 0),
        "a new stream is not zeroed"
    );
    let (out, back) = (out.lend(), back.lend());
    if !reachable(&out) || !reachable(&back) {
        return Verdict::Skip("DMA memory above edu's 256 MiB reach");
    }
    ensure!(
        transfer(&regs, out.device_addr(), EDU_BUFFER, TRANSFER, false).await,
        "edu did not finish reading the stream"
    );
    ensure!(
        transfer(&regs, EDU_BUFFER, back.device_addr(), TRANSFER, true).await,
        "edu did not finish writing the stream"
    );
    drop(out.reclaim());
    let back = back.reclaim();
    ensure!(
        back.as_slice() == pattern.as_slice(),
        "the stream edu wrote does not hold what it read"
    );
    let free = memory::stats().free;
    let Ok(abandoned) = DmaStream::alloc(&dma, 2 * PAGE_SIZE as usize) else {
        return Verdict::Fail("no DMA memory".into());
    };
    drop(abandoned.lend());
    ensure!(
        memory::stats().free == free - 2 && dma.stats().parked == 1,
        "a lent stream dropped while edu masters the bus was freed ({:?})",
        dma.stats()
    );
    dma.stop();
    ensure!(
        memory::stats().free == free && dma.stats().released == 1,
        "the parked stream was not freed when bus mastering went off ({:?})",
        dma.stats()
    );
    Verdict::Pass(format!(
        "edu at {} copied {TRANSFER} bytes in and out by DMA; a dropped lent stream stayed parked until bus mastering was off",
        dev.address()
    ))
}

//! The legacy 8259 PICs: remapped away from the exception vectors and fully masked, so
//! that only the APICs deliver interrupts.

use crate::hal::io_port::IoPort;
use crate::irq::PIC_BASE;

const MASTER_CMD: IoPort<u8> = IoPort::new(0x20);
const MASTER_DATA: IoPort<u8> = IoPort::new(0x21);
const SLAVE_CMD: IoPort<u8> = IoPort::new(0xa0);
const SLAVE_DATA: IoPort<u8> = IoPort::new(0xa1);

/// Remaps both PICs to `PIC_BASE..PIC_BASE + 16` and masks every line. Spurious IRQ 7/15
/// then land on vectors `irq::dispatch` ignores instead of on CPU exceptions.
pub fn disable() {
    MASTER_CMD.write(0x11); // ICW1: init, expect ICW4
    SLAVE_CMD.write(0x11);
    MASTER_DATA.write(PIC_BASE); // ICW2: vector offset
    SLAVE_DATA.write(PIC_BASE + 8);
    MASTER_DATA.write(0x04); // ICW3: slave on IRQ2
    SLAVE_DATA.write(0x02);
    MASTER_DATA.write(0x01); // ICW4: 8086 mode
    SLAVE_DATA.write(0x01);
    MASTER_DATA.write(0xff);
    SLAVE_DATA.write(0xff);
}

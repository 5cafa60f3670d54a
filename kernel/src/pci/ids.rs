//! Names for the devices and classes the appliance meets (QEMU's, mostly).

/// A name for a known vendor:device pair.
pub fn device_name(vendor: u16, device: u16) -> Option<&'static str> {
    Some(match (vendor, device) {
        (0x8086, 0x1237) => "i440FX host bridge",
        (0x8086, 0x7000) => "PIIX3 ISA bridge",
        (0x8086, 0x7010) => "PIIX3 IDE",
        (0x8086, 0x7020) => "PIIX3 USB",
        (0x8086, 0x7113) => "PIIX4 ACPI",
        (0x8086, 0x29c0) => "Q35 host bridge",
        (0x8086, 0x2918) => "ICH9 LPC bridge",
        (0x8086, 0x2922) => "ICH9 AHCI",
        (0x8086, 0x2930) => "ICH9 SMBus",
        (0x8086, 0x100e) => "e1000 NIC",
        (0x8086, 0x10d3) => "e1000e NIC",
        (0x1234, 0x1111) => "VGA (QEMU std)",
        (0x1234, 0x11e8) => "edu test device (QEMU)",
        (0x1b36, 0x0001) => "PCI bridge (QEMU)",
        (0x1b36, 0x0005) => "PCI test device (QEMU)",
        (0x1b36, 0x0010) => "NVMe controller (QEMU)",
        (0x1af4, 0x1000) => "virtio-net (transitional)",
        (0x1af4, 0x1001) => "virtio-blk (transitional)",
        (0x1af4, 0x1041) => "virtio-net",
        (0x1af4, 0x1042) => "virtio-blk",
        (0x1af4, 0x1043) => "virtio-console",
        (0x1af4, 0x1044) => "virtio-rng",
        (0x1af4, 0x1048) => "virtio-scsi",
        _ => return None,
    })
}

/// A name for a class/subclass pair (PCI code and ID assignment spec).
pub fn class_name(class: u8, subclass: u8) -> &'static str {
    match (class, subclass) {
        (0x01, 0x00) => "SCSI controller",
        (0x01, 0x01) => "IDE controller",
        (0x01, 0x06) => "SATA controller",
        (0x01, 0x08) => "NVM controller",
        (0x01, _) => "storage controller",
        (0x02, 0x00) => "Ethernet controller",
        (0x02, _) => "network controller",
        (0x03, _) => "display controller",
        (0x04, _) => "multimedia controller",
        (0x05, _) => "memory controller",
        (0x06, 0x00) => "host bridge",
        (0x06, 0x01) => "ISA bridge",
        (0x06, 0x04) => "PCI bridge",
        (0x06, _) => "bridge",
        (0x07, _) => "communication controller",
        (0x08, _) => "system peripheral",
        (0x0c, 0x03) => "USB controller",
        (0x0c, _) => "serial bus controller",
        _ => "unclassified device",
    }
}

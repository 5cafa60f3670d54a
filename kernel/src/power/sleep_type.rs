//! The sleep type of soft-off (S5), read from the DSDT's `\_S5_` object.
//!
//! ACPI leaves the value written to `PM1x_CNT.SLP_TYP` for each sleep state to the
//! firmware's AML: `\_S5_` is a package whose first two integers are the `SLP_TYPa` and
//! `SLP_TYPb` values. A full AML interpreter could evaluate it; the appliance does the
//! well-known small scan instead (as most hobby and embedded kernels do, and as
//! `docs/kernel.md` explains): find the name `_S5_` declared by a `NameOp` (optionally
//! from the root, `\_S5_`) and bound to a `PackageOp`, and decode the package's first
//! two integer constants. QEMU (`pc` and `q35`), SeaBIOS, OVMF and the PCs this was
//! tried on all declare `_S5_` that way. A `_S5_` built by a method, or any other
//! shape, is not recognised: the caller then has no soft-off and says so.

/// The `SLP_TYP` values that enter S5, for the PM1a and PM1b control registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SleepType {
    /// `SLP_TYPa`.
    pub a: u8,
    /// `SLP_TYPb` (0 when the package has a single element).
    pub b: u8,
}

/// AML opcodes the scan knows (ACPI 6.5, 20.2).
mod op {
    pub const NAME: u8 = 0x08;
    pub const PACKAGE: u8 = 0x12;
    pub const ROOT: u8 = b'\\';
    pub const ZERO: u8 = 0x00;
    pub const ONE: u8 = 0x01;
    pub const BYTE: u8 = 0x0a;
    pub const WORD: u8 = 0x0b;
    pub const DWORD: u8 = 0x0c;
    pub const QWORD: u8 = 0x0e;
}

/// `SLP_TYP` is a 3-bit field.
const MAX_SLEEP_TYPE: u64 = 0b111;

/// Finds `Name (_S5_, Package () { a, b, ... })` in the AML of a DSDT (or SSDT) and
/// returns its sleep types; `None` if there is none of that shape.
pub fn find_s5(aml: &[u8]) -> Option<SleepType> {
    (0..aml.len().saturating_sub(4))
        .filter(|&i| &aml[i..i + 4] == b"_S5_")
        .find_map(|i| s5_at(aml, i))
}

/// Decodes the `_S5_` name at `aml[name..]`, if a `NameOp` declares it as a package.
fn s5_at(aml: &[u8], name: usize) -> Option<SleepType> {
    let declared = match name.checked_sub(1).map(|i| aml[i]) {
        Some(op::NAME) => true,
        Some(op::ROOT) => name >= 2 && aml[name - 2] == op::NAME,
        _ => false,
    };
    if !declared || *aml.get(name + 4)? != op::PACKAGE {
        return None;
    }
    let rest = &aml[name + 5..];
    // PkgLength: the top two bits of the lead byte count the bytes that follow it.
    let length_bytes = 1 + usize::from(rest.first()? >> 6);
    let elements = *rest.get(length_bytes)?;
    if elements == 0 {
        return None;
    }
    let mut at = &rest[length_bytes + 1..];
    let a = integer(&mut at)?;
    let b = if elements >= 2 { integer(&mut at)? } else { 0 };
    if a > MAX_SLEEP_TYPE || b > MAX_SLEEP_TYPE {
        return None;
    }
    Some(SleepType {
        a: a as u8,
        b: b as u8,
    })
}

/// Decodes one integer constant (`Zero`, `One`, or a byte/word/dword/qword prefix and
/// its little-endian value) from the front of `aml`, advancing past it.
fn integer(aml: &mut &[u8]) -> Option<u64> {
    let (&opcode, rest) = aml.split_first()?;
    let width = match opcode {
        op::ZERO | op::ONE => {
            *aml = rest;
            return Some(u64::from(opcode));
        }
        op::BYTE => 1,
        op::WORD => 2,
        op::DWORD => 4,
        op::QWORD => 8,
        _ => return None,
    };
    let bytes = rest.get(..width)?;
    *aml = &rest[width..];
    Some(
        bytes
            .iter()
            .rev()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DSDTs' AML (the tables without their 36-byte headers) as QEMU 7.2 builds them
    /// for its `pc` and `q35` machines, captured from the appliance at boot.
    const QEMU_PC: &[u8] = include_bytes!("fixtures/qemu-7.2-pc-dsdt.aml");
    const QEMU_Q35: &[u8] = include_bytes!("fixtures/qemu-7.2-q35-dsdt.aml");

    #[test]
    fn qemu_machines_soft_off_with_sleep_type_zero() {
        for aml in [QEMU_PC, QEMU_Q35] {
            assert_eq!(find_s5(aml), Some(SleepType { a: 0, b: 0 }));
        }
        // The scan finds the declaration, not just the name: without its NameOp there
        // is none.
        let mut broken = QEMU_Q35.to_vec();
        let at = broken.windows(4).position(|w| w == b"_S5_").unwrap();
        broken[at - 1] = 0xa4;
        assert_eq!(find_s5(&broken), None);
    }

    #[test]
    fn qemu_declares_s5_as_four_zeros() {
        // `Name (_S5, Package (0x04) { Zero, Zero, Zero, Zero })`, as QEMU's DSDT does.
        let aml = [
            0x5b, 0x80, b'X', // unrelated bytes before
            0x08, b'_', b'S', b'5', b'_', 0x12, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(find_s5(&aml), Some(SleepType { a: 0, b: 0 }));
    }

    #[test]
    fn integer_prefixes_and_the_root_prefix_decode() {
        let aml = [
            0x08, b'\\', b'_', b'S', b'5', b'_', 0x12, 0x08, 0x02, 0x0a, 0x07, 0x0b, 0x05, 0x00,
        ];
        assert_eq!(find_s5(&aml), Some(SleepType { a: 7, b: 5 }));
        let one = [0x08, b'_', b'S', b'5', b'_', 0x12, 0x04, 0x01, 0x01];
        assert_eq!(find_s5(&one), Some(SleepType { a: 1, b: 0 }));
        // A two-byte PkgLength (lead byte 0x40 | low nibble, then one more byte).
        let long = [
            0x08, b'_', b'S', b'5', b'_', 0x12, 0x47, 0x00, 0x02, 0x0c, 0x03, 0, 0, 0, 0x01,
        ];
        assert_eq!(find_s5(&long), Some(SleepType { a: 3, b: 1 }));
    }

    #[test]
    fn other_shapes_are_not_guessed() {
        // Only mentioned (a method's body referring to it), not declared.
        let referenced = [0xa4, b'_', b'S', b'5', b'_', 0x12, 0x04, 0x01, 0x00];
        assert_eq!(find_s5(&referenced), None);
        // Declared, but not as a package.
        let integer = [0x08, b'_', b'S', b'5', b'_', 0x0a, 0x05];
        assert_eq!(find_s5(&integer), None);
        // Out of the 3-bit range, an expression instead of a constant, empty, truncated.
        for bad in [
            &[
                0x08, b'_', b'S', b'5', b'_', 0x12, 0x05, 0x02, 0x0a, 0x08, 0x00,
            ][..],
            &[
                0x08, b'_', b'S', b'5', b'_', 0x12, 0x05, 0x02, 0x72, 0x01, 0x01,
            ][..],
            &[0x08, b'_', b'S', b'5', b'_', 0x12, 0x02, 0x00][..],
            &[0x08, b'_', b'S', b'5', b'_', 0x12, 0x05, 0x02, 0x0b, 0x01][..],
            &[0x08, b'_', b'S', b'5'][..],
        ] {
            assert_eq!(find_s5(bad), None, "{bad:x?}");
        }
    }

    #[test]
    fn a_later_declaration_is_found_after_a_mere_mention() {
        let aml = [
            0xa4, b'_', b'S', b'5', b'_', // Return (_S5_)
            0x08, b'_', b'S', b'5', b'_', 0x12, 0x05, 0x02, 0x0a, 0x05, 0x00,
        ];
        assert_eq!(find_s5(&aml), Some(SleepType { a: 5, b: 0 }));
    }
}

//! crc32c (Castagnoli), the checksum of every on-disk structure and data block.

use crc::{Crc, Table, CRC_32_ISCSI};

/// Slice-by-16 tables (16 KiB, built at compile time): 16 bytes per step instead of one.
/// Every fsync checksums at least a data block and a log block, and the appliance has no
/// portable crc32c instruction (QEMU's default TCG CPU has none, and `unsafe` stays out
/// of the filesystem), so with a byte-wise table this was the largest single cost of a
/// 4 KiB write + fsync (docs/benchmarks.md, "Less CPU per request").
static CASTAGNOLI: Crc<u32, Table<16>> = Crc::<u32, Table<16>>::new(&CRC_32_ISCSI);

/// crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    CASTAGNOLI.checksum(data)
}

/// crc32c of the concatenation of `parts` (no copy).
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    let mut digest = CASTAGNOLI.digest();
    for part in parts {
        digest.update(part);
    }
    digest.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_parts(&[b"1234", b"56789"]), 0xE306_9283);
    }

    #[test]
    fn same_as_bytewise() {
        // Lengths around the 16-byte steps, split at every point for the parts form.
        let bytewise = Crc::<u32>::new(&CRC_32_ISCSI);
        let data: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            let d = &data[..len];
            assert_eq!(crc32c(d), bytewise.checksum(d), "len {len}");
            for cut in 0..=len {
                assert_eq!(crc32c_parts(&[&d[..cut], &d[cut..]]), bytewise.checksum(d));
            }
        }
    }
}

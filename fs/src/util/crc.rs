//! crc32c (Castagnoli), the checksum of every on-disk structure and data block.

use crc::{Crc, CRC_32_ISCSI};

const CASTAGNOLI: Crc<u32> = Crc::<u32>::new(&CRC_32_ISCSI);

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
}

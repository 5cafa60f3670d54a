//! crc32c (Castagnoli), the checksum of every on-disk structure and data block.
//!
//! Slice-by-8: eight bytes per step, read as one little-endian `u64`, through eight
//! 256-entry tables built at compile time (8 KiB). Every fsync checksums at least a data
//! block and a log block, and with a byte-wise table that was the largest single CPU cost
//! of a 4 KiB write + fsync (docs/benchmarks.md, "Less CPU per request"). A byte-wise
//! table costs two memory loads per byte (the byte, the table entry); this costs nine per
//! eight bytes, which is what counts under QEMU's TCG, where every guest load goes through
//! the soft TLB. (A slice-by-16 table that reads its bytes one by one, as the `crc`
//! crate's does, still makes two loads per byte.) The appliance may not use the crc32c
//! instruction: the filesystem has no `unsafe`, and QEMU's default TCG CPU lacks it.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// `TABLES[k][b]`: the crc register after byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut b = 0;
    while b < 256 {
        let mut c = b as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            bit += 1;
        }
        t[0][b] = c;
        b += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut b = 0;
        while b < 256 {
            let prev = t[k - 1][b];
            t[k][b] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            b += 1;
        }
        k += 1;
    }
    t
}

/// Runs the crc register `crc` (not inverted) over `data`.
fn update(mut crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes")) ^ u64::from(crc);
        let byte = |i: u32| ((v >> (8 * i)) & 0xff) as usize;
        crc = t[7][byte(0)]
            ^ t[6][byte(1)]
            ^ t[5][byte(2)]
            ^ t[4][byte(3)]
            ^ t[3][byte(4)]
            ^ t[2][byte(5)]
            ^ t[1][byte(6)]
            ^ t[0][byte(7)];
    }
    for &b in words.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ u32::from(b)) & 0xff) as usize];
    }
    crc
}

/// crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    !update(!0, data)
}

/// crc32c of the concatenation of `parts` (no copy).
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    !parts.iter().fold(!0, |crc, part| update(crc, part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_parts(&[b"1234", b"56789"]), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn same_as_the_crc_crate() {
        // Every length around the 8-byte steps, split at every point for the parts form,
        // and a whole block, against the `crc` crate's CRC-32/ISCSI.
        let reference = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i * 37 + i / 251 + 11) as u8)
            .collect();
        assert_eq!(crc32c(&data), reference.checksum(&data));
        for len in 0..100 {
            let d = &data[..len];
            assert_eq!(crc32c(d), reference.checksum(d), "len {len}");
            for cut in 0..=len {
                assert_eq!(crc32c_parts(&[&d[..cut], &d[cut..]]), reference.checksum(d));
            }
        }
    }
}

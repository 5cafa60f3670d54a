//! Keyed hashes. Directory and xattr name hashes are keyed with a per-filesystem secret
//! so that a client cannot choose names that collide; node nonces are derived from the
//! same secret so that a client cannot predict them (see `docs/format.md`).

use core::hash::Hasher;
use siphasher::sip::SipHasher24;

/// SipHash-2-4 of `data` under `key`.
pub fn keyed_hash(key: u64, domain: u64, data: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(key, domain);
    h.write(data);
    h.finish()
}

/// Domain separators, so that the same secret never hashes two kinds of input alike.
pub mod domain {
    /// Directory entry names.
    pub const DIR_NAME: u64 = 0x6469_725f_6e61_6d65;
    /// Xattr names.
    pub const XATTR_NAME: u64 = 0x7861_7474_725f_6e6d;
    /// Btree node nonces.
    pub const NODE_NONCE: u64 = 0x6e6f_6465_5f6e_6f6e;
    /// Back-references: a parent directory and a name in it.
    pub const NAME_REF: u64 = 0x6e61_6d65_5f72_6566;
}

/// The keyed hash of the name `parent/name`: the offset of the `INODE_REF` item that
/// holds this back-reference (see `docs/format.md`).
pub fn name_ref_hash(key: u64, parent: u64, name: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(key, domain::NAME_REF);
    h.write(&parent.to_le_bytes());
    h.write(name);
    h.finish()
}

/// The nonce of a btree node allocated in checkpoint interval `birth_seq` as the
/// `counter`-th allocation of that interval. Unique per allocation (sequences are never
/// reused across crashes) and unpredictable without the filesystem's secret.
pub fn node_nonce(secret: u64, birth_seq: u64, counter: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&birth_seq.to_le_bytes());
    buf[8..].copy_from_slice(&counter.to_le_bytes());
    keyed_hash(secret, domain::NODE_NONCE, &buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_and_separated() {
        let a = keyed_hash(1, domain::DIR_NAME, b"name");
        assert_eq!(a, keyed_hash(1, domain::DIR_NAME, b"name"));
        assert_ne!(a, keyed_hash(2, domain::DIR_NAME, b"name"));
        assert_ne!(a, keyed_hash(1, domain::XATTR_NAME, b"name"));
        assert_ne!(node_nonce(7, 1, 2), node_nonce(7, 2, 1));
        let r = name_ref_hash(1, 5, b"name");
        assert_ne!(r, name_ref_hash(1, 6, b"name"));
        assert_ne!(r, name_ref_hash(2, 5, b"name"));
        assert_ne!(r, keyed_hash(1, domain::DIR_NAME, b"name"));
    }
}

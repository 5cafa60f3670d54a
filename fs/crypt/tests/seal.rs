//! Sealing blocks and values: round trips, every flipped bit detected, nonces, subkeys,
//! keys that never print.

use crypt::{
    DataKey, Entropy, NoEntropy, Nonce, Purpose, SealingKey, Secret, Tampered, Wrapping,
    MAX_VALUE_LEN, TAG_LEN,
};

const BLOCK: usize = 4096;

mod common;
use common::TestEntropy;

fn block(seed: u8) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn data_key() -> SealingKey {
    DataKey::generate(&mut TestEntropy(9))
        .unwrap()
        .subkey(Purpose::Data)
}

#[test]
fn block_round_trip_in_place() {
    let key = data_key();
    let nonce = Nonce::derive([1; 8], 77, 3);
    let plain = block(5);
    let mut buf = plain.clone();
    let tag = key.seal_in_place(&nonce, b"inode 12 block 3", &mut buf);
    assert_eq!(buf.len(), BLOCK, "a block does not grow");
    assert_ne!(buf, plain, "sealed in place");
    key.open_in_place(&nonce, b"inode 12 block 3", &mut buf, &tag)
        .unwrap();
    assert_eq!(buf, plain);
}

#[test]
fn empty_and_odd_lengths_round_trip() {
    let key = data_key();
    for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 255, 4095, 4097, 65536] {
        let nonce = Nonce::derive([2; 8], len as u64, 0);
        let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut buf = plain.clone();
        let tag = key.seal_in_place(&nonce, b"", &mut buf);
        key.open_in_place(&nonce, b"", &mut buf, &tag).unwrap();
        assert_eq!(buf, plain, "len {len}");
    }
}

/// Every single-bit change of the sealed block, its tag, its AAD or its nonce is
/// `Tampered`, and the buffer is then left zeroed (no unauthenticated plaintext).
#[test]
fn every_flipped_bit_is_tampered() {
    let key = data_key();
    let nonce = Nonce::derive([3; 8], 1000, 7);
    let aad = *b"extent 0x1234 @ block 7";
    let mut sealed = block(9);
    let tag = key.seal_in_place(&nonce, &aad, &mut sealed);

    let mut buf = vec![0u8; BLOCK];
    for bit in 0..BLOCK * 8 {
        buf.copy_from_slice(&sealed);
        buf[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            key.open_in_place(&nonce, &aad, &mut buf, &tag),
            Err(Tampered),
            "ciphertext bit {bit}"
        );
        assert!(
            buf.iter().all(|&b| b == 0),
            "zeroed after ciphertext bit {bit}"
        );
    }
    for bit in 0..TAG_LEN * 8 {
        let mut t = tag;
        t[bit / 8] ^= 1 << (bit % 8);
        buf.copy_from_slice(&sealed);
        assert_eq!(
            key.open_in_place(&nonce, &aad, &mut buf, &t),
            Err(Tampered),
            "tag bit {bit}"
        );
    }
    for bit in 0..aad.len() * 8 {
        let mut a = aad;
        a[bit / 8] ^= 1 << (bit % 8);
        buf.copy_from_slice(&sealed);
        assert_eq!(
            key.open_in_place(&nonce, &a, &mut buf, &tag),
            Err(Tampered),
            "aad bit {bit}"
        );
    }
    for bit in 0..24 * 8 {
        let mut n = nonce;
        n.0[bit / 8] ^= 1 << (bit % 8);
        buf.copy_from_slice(&sealed);
        assert_eq!(
            key.open_in_place(&n, &aad, &mut buf, &tag),
            Err(Tampered),
            "nonce bit {bit}"
        );
    }
    // A truncated or extended AAD, and the block under another purpose's key.
    buf.copy_from_slice(&sealed);
    assert!(key
        .open_in_place(&nonce, &aad[..aad.len() - 1], &mut buf, &tag)
        .is_err());
    buf.copy_from_slice(&sealed);
    let other = DataKey::generate(&mut TestEntropy(9))
        .unwrap()
        .subkey(Purpose::Names);
    assert!(other.open_in_place(&nonce, &aad, &mut buf, &tag).is_err());
    // And the untouched block still opens.
    buf.copy_from_slice(&sealed);
    key.open_in_place(&nonce, &aad, &mut buf, &tag).unwrap();
    assert_eq!(buf, block(9));
}

#[test]
fn values_round_trip_and_detect_tampering() {
    let key = DataKey::generate(&mut TestEntropy(4))
        .unwrap()
        .subkey(Purpose::Names);
    let nonce = Nonce::derive([4; 8], 5, 0);
    let sealed = key.seal_value(&nonce, b"dir 2", b"secret.txt").unwrap();
    assert_eq!(sealed.len(), b"secret.txt".len() + TAG_LEN);
    assert_eq!(
        key.open_value(&nonce, b"dir 2", &sealed).unwrap(),
        b"secret.txt"
    );
    for bit in 0..sealed.len() * 8 {
        let mut s = sealed.clone();
        s[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            key.open_value(&nonce, b"dir 2", &s),
            Err(Tampered),
            "bit {bit}"
        );
    }
    assert_eq!(key.open_value(&nonce, b"dir 3", &sealed), Err(Tampered));
    // Short, truncated and oversized inputs are errors, not panics.
    for len in 0..sealed.len() {
        assert_eq!(
            key.open_value(&nonce, b"dir 2", &sealed[..len]),
            Err(Tampered),
            "len {len}"
        );
    }
    assert_eq!(
        key.open_value(&nonce, b"", &vec![0u8; MAX_VALUE_LEN + TAG_LEN + 1]),
        Err(Tampered)
    );
    // The empty value and the largest one.
    let empty = key.seal_value(&nonce, b"", b"").unwrap();
    assert_eq!(empty.len(), TAG_LEN);
    assert_eq!(key.open_value(&nonce, b"", &empty).unwrap(), b"");
    let big = vec![0xabu8; MAX_VALUE_LEN];
    let s = key.seal_value(&nonce, b"", &big).unwrap();
    assert_eq!(key.open_value(&nonce, b"", &s).unwrap(), big);
    assert!(key
        .seal_value(&nonce, b"", &vec![0; MAX_VALUE_LEN + 1])
        .is_none());
}

#[test]
fn nonce_layout_and_distinctness() {
    let n = Nonce::derive(
        [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7],
        0x0102,
        0x0304,
    );
    assert_eq!(
        n.0,
        [
            0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, // salt
            0x02, 0x01, 0, 0, 0, 0, 0, 0, // write id, LE
            0x04, 0x03, 0, 0, 0, 0, 0, 0, // index, LE
        ]
    );
    // Neighbouring triples never collide (the map is injective: fixed-width fields).
    let mut seen = std::collections::HashSet::new();
    for salt in [[0u8; 8], [1; 8]] {
        for w in 0..64u64 {
            for i in 0..64u64 {
                assert!(seen.insert(Nonce::derive(salt, w, i).0));
            }
        }
    }
    let mut rng = TestEntropy(3);
    assert_ne!(
        Nonce::random(&mut rng).unwrap(),
        Nonce::random(&mut rng).unwrap()
    );
}

#[test]
fn subkeys_differ_per_purpose_and_per_data_key() {
    let a = DataKey::from_bytes([1; 32]);
    let b = DataKey::from_bytes([2; 32]);
    let nonce = Nonce::derive([0; 8], 0, 0);
    let purposes = [
        Purpose::Data,
        Purpose::Names,
        Purpose::SymlinkTargets,
        Purpose::XattrValues,
    ];
    let mut tags = std::collections::HashSet::new();
    for key in [&a, &b] {
        for p in purposes {
            let mut buf = [0u8; 32];
            tags.insert(key.subkey(p).seal_in_place(&nonce, b"", &mut buf));
        }
    }
    // The data key itself is never a sealing key either.
    let mut buf = [0u8; 32];
    tags.insert(SealingKey::from_bytes(&[1; 32]).seal_in_place(&nonce, b"", &mut buf));
    assert_eq!(tags.len(), 9, "nine keys, nine different tags");
    // Derivation is deterministic: the same data key gives the same subkey.
    let mut x = *b"same";
    let t1 = a.subkey(Purpose::Names).seal_in_place(&nonce, b"", &mut x);
    let mut y = *b"same";
    let t2 = DataKey::from_bytes([1; 32])
        .subkey(Purpose::Names)
        .seal_in_place(&nonce, b"", &mut y);
    assert_eq!((t1, x), (t2, y));
}

/// The subkey is HKDF-SHA256(salt none, ikm data key, info label), as documented.
#[test]
fn subkey_is_hkdf_sha256_of_the_label() {
    let dk = [0x5au8; 32];
    let mut okm = [0u8; 32];
    hkdf::Hkdf::<sha2::Sha256>::new(None, &dk)
        .expand(b"ninefold-crypt v1 data", &mut okm)
        .unwrap();
    let nonce = Nonce::derive([9; 8], 1, 2);
    let mut a = block(1);
    let mut b = block(1);
    let ta = DataKey::from_bytes(dk)
        .subkey(Purpose::Data)
        .seal_in_place(&nonce, b"x", &mut a);
    let tb = SealingKey::from_bytes(&okm).seal_in_place(&nonce, b"x", &mut b);
    assert_eq!((ta, a), (tb, b));
}

#[test]
fn entropy_failure_is_an_error() {
    struct Dry;
    impl Entropy for Dry {
        fn fill(&mut self, _: &mut [u8]) -> Result<(), NoEntropy> {
            Err(NoEntropy)
        }
    }
    assert!(DataKey::generate(&mut Dry).is_err());
    assert!(Nonce::random(&mut Dry).is_err());
    let key = DataKey::from_bytes([3; 32]);
    assert_eq!(
        crypt::wrap(&key, Wrapping::Raw(&[4; 32]), &mut Dry),
        Err(crypt::WrapError::NoEntropy)
    );
}

/// No key's `Debug` output shows any of its bytes, in any common rendering.
#[test]
fn debug_never_prints_keys() {
    let raw = [0xc3u8; 32];
    let outputs = [
        format!("{:?}", DataKey::from_bytes(raw)),
        format!("{:#?}", DataKey::from_bytes(raw)),
        format!("{:?}", DataKey::from_bytes(raw).subkey(Purpose::Data)),
        format!("{:?}", SealingKey::from_bytes(&raw)),
        format!("{:?}", Secret::Raw(&raw)),
        format!("{:?}", Secret::Passphrase(b"\xc3\xc3hunter2")),
        format!("{:?}", Wrapping::Raw(&raw)),
        format!(
            "{:?}",
            Wrapping::Passphrase(b"hunter2", crypt::KdfParams::DEFAULT)
        ),
    ];
    for out in &outputs {
        assert!(out.contains("<redacted>"), "{out}");
        for needle in ["c3", "C3", "195", "hunter2", "Ã"] {
            assert!(!out.contains(needle), "{out} shows {needle}");
        }
    }
}

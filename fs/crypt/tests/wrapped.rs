//! Wrapped data keys: wrap, unwrap, rewrap; wrong secrets and forged records are errors,
//! never panics, and a forged record cannot make an unlock unbounded.

use crypt::{
    rewrap, unwrap, wrap, DataKey, Entropy, Kdf, KdfParams, Malformed, Secret, UnwrapError,
    WrapError, WrappedKey, Wrapping,
};

mod common;
use common::TestEntropy;

/// The cheapest parameters accepted, so the tests stay fast.
const CHEAP: KdfParams = KdfParams {
    memory_kib: KdfParams::MIN_MEMORY_KIB,
    iterations: 1,
    lanes: 1,
};

const PASS: &[u8] = b"correct horse battery staple";

fn same(a: &DataKey, b: &DataKey) -> bool {
    a.expose() == b.expose()
}

#[test]
fn passphrase_wrap_unwrap_and_wrong_passphrase() {
    let mut rng = TestEntropy(1);
    let key = DataKey::generate(&mut rng).unwrap();
    let record = wrap(&key, Wrapping::Passphrase(PASS, CHEAP), &mut rng).unwrap();
    assert_eq!(record.kdf(), Kdf::Argon2id(CHEAP));
    let bytes = record.encode();
    assert_eq!(bytes.len(), WrappedKey::LEN);
    assert!(
        !bytes.windows(32).any(|w| w == key.expose()),
        "the key is not stored in the clear"
    );
    let decoded = WrappedKey::decode(&bytes).unwrap();
    assert_eq!(decoded, record);
    assert!(same(
        &unwrap(&decoded, Secret::Passphrase(PASS)).unwrap(),
        &key
    ));

    for wrong in [
        &b"correct horse battery stapl"[..],
        b"correct horse battery staple ",
        b"Correct horse battery staple",
        b"x",
        b"",
        &[b'a'; crypt::MAX_PASSPHRASE_LEN + 1],
    ] {
        assert_eq!(
            unwrap(&decoded, Secret::Passphrase(wrong)).unwrap_err(),
            UnwrapError::WrongKeyOrCorrupt
        );
    }
    // The wrong kind of secret.
    assert_eq!(
        unwrap(&decoded, Secret::Raw(&[0; 32])).unwrap_err(),
        UnwrapError::WrongKeyOrCorrupt
    );
}

#[test]
fn raw_wrap_unwrap_and_wrong_key() {
    let mut rng = TestEntropy(2);
    let key = DataKey::generate(&mut rng).unwrap();
    let raw = [0x11u8; 32];
    let record = wrap(&key, Wrapping::Raw(&raw), &mut rng).unwrap();
    assert_eq!(record.kdf(), Kdf::Raw);
    let decoded = WrappedKey::decode(&record.encode()).unwrap();
    assert!(same(&unwrap(&decoded, Secret::Raw(&raw)).unwrap(), &key));
    let mut wrong = raw;
    wrong[31] ^= 1;
    assert!(unwrap(&decoded, Secret::Raw(&wrong)).is_err());
    assert!(unwrap(&decoded, Secret::Passphrase(&raw)).is_err());
}

#[test]
fn two_wraps_of_one_key_differ() {
    let mut rng = TestEntropy(3);
    let key = DataKey::generate(&mut rng).unwrap();
    let a = wrap(&key, Wrapping::Raw(&[5; 32]), &mut rng).unwrap();
    let b = wrap(&key, Wrapping::Raw(&[5; 32]), &mut rng).unwrap();
    assert_ne!(a.encode(), b.encode(), "fresh salt and nonce each time");
}

#[test]
fn rewrap_keeps_the_data_key() {
    let mut rng = TestEntropy(4);
    let key = DataKey::generate(&mut rng).unwrap();
    let old = wrap(&key, Wrapping::Passphrase(PASS, CHEAP), &mut rng).unwrap();
    let new = rewrap(
        &old,
        Secret::Passphrase(PASS),
        Wrapping::Passphrase(b"new passphrase", CHEAP),
        &mut rng,
    )
    .unwrap();
    assert!(same(
        &unwrap(&new, Secret::Passphrase(b"new passphrase")).unwrap(),
        &key
    ));
    assert!(
        unwrap(&new, Secret::Passphrase(PASS)).is_err(),
        "old passphrase no longer opens it"
    );
    // Passphrase to raw and back.
    let raw = rewrap(
        &new,
        Secret::Passphrase(b"new passphrase"),
        Wrapping::Raw(&[9; 32]),
        &mut rng,
    )
    .unwrap();
    assert!(same(&unwrap(&raw, Secret::Raw(&[9; 32])).unwrap(), &key));
    // A wrong old secret changes nothing.
    assert_eq!(
        rewrap(
            &old,
            Secret::Passphrase(b"nope"),
            Wrapping::Raw(&[1; 32]),
            &mut rng
        ),
        Err(WrapError::WrongKeyOrCorrupt)
    );
}

#[test]
fn wrap_refuses_parameters_out_of_bounds() {
    let mut rng = TestEntropy(5);
    let key = DataKey::generate(&mut rng).unwrap();
    let bad = [
        KdfParams {
            memory_kib: KdfParams::MIN_MEMORY_KIB - 1,
            ..CHEAP
        },
        KdfParams {
            memory_kib: KdfParams::MAX_MEMORY_KIB + 1,
            ..CHEAP
        },
        KdfParams {
            iterations: 0,
            ..CHEAP
        },
        KdfParams {
            iterations: KdfParams::MAX_ITERATIONS + 1,
            ..CHEAP
        },
        KdfParams { lanes: 0, ..CHEAP },
        KdfParams {
            lanes: KdfParams::MAX_LANES + 1,
            ..CHEAP
        },
        // Each bound alone passes, together they are too much work.
        KdfParams {
            memory_kib: KdfParams::MAX_MEMORY_KIB,
            iterations: KdfParams::MAX_ITERATIONS,
            lanes: 1,
        },
    ];
    for p in bad {
        assert!(
            matches!(
                wrap(&key, Wrapping::Passphrase(PASS, p), &mut rng),
                Err(WrapError::Invalid(_))
            ),
            "{p:?}"
        );
    }
    assert!(KdfParams::DEFAULT.check().is_ok());
    for pass in [&b""[..], &[b'p'; crypt::MAX_PASSPHRASE_LEN + 1]] {
        assert!(matches!(
            wrap(&key, Wrapping::Passphrase(pass, CHEAP), &mut rng),
            Err(WrapError::Invalid(_))
        ));
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Forged fields are refused by `decode`, before any key derivation: unbounded
/// parameters never reach Argon2id.
#[test]
fn forged_fields_are_malformed() {
    let mut rng = TestEntropy(6);
    let key = DataKey::generate(&mut rng).unwrap();
    let good = wrap(&key, Wrapping::Passphrase(PASS, CHEAP), &mut rng)
        .unwrap()
        .encode();
    let raw_good = wrap(&key, Wrapping::Raw(&[1; 32]), &mut rng)
        .unwrap()
        .encode();

    let forge = |f: &dyn Fn(&mut [u8])| {
        let mut b = good;
        f(&mut b);
        WrappedKey::decode(&b)
    };
    let cases: Vec<(&str, Result<WrappedKey, Malformed>)> = vec![
        ("magic", forge(&|b| b[0] ^= 1)),
        ("version 0", forge(&|b| b[4] = 0)),
        ("version 2", forge(&|b| b[4] = 2)),
        ("kdf 0", forge(&|b| b[5] = 0)),
        ("kdf 3", forge(&|b| b[5] = 3)),
        ("kdf 255", forge(&|b| b[5] = 255)),
        ("reserved", forge(&|b| b[7] = 1)),
        ("memory 0", forge(&|b| put_u32(b, 8, 0))),
        ("memory 8", forge(&|b| put_u32(b, 8, 8))),
        (
            "memory max+1",
            forge(&|b| put_u32(b, 8, KdfParams::MAX_MEMORY_KIB + 1)),
        ),
        ("memory 4 TiB", forge(&|b| put_u32(b, 8, u32::MAX))),
        ("iterations 0", forge(&|b| put_u32(b, 12, 0))),
        (
            "iterations max+1",
            forge(&|b| put_u32(b, 12, KdfParams::MAX_ITERATIONS + 1)),
        ),
        ("iterations 2^32-1", forge(&|b| put_u32(b, 12, u32::MAX))),
        ("lanes 0", forge(&|b| put_u32(b, 16, 0))),
        (
            "lanes max+1",
            forge(&|b| put_u32(b, 16, KdfParams::MAX_LANES + 1)),
        ),
        ("lanes 2^24", forge(&|b| put_u32(b, 16, 1 << 24))),
        (
            "work",
            forge(&|b| {
                put_u32(b, 8, KdfParams::MAX_MEMORY_KIB);
                put_u32(b, 12, KdfParams::MAX_ITERATIONS);
            }),
        ),
        ("raw with parameters", {
            let mut b = raw_good;
            put_u32(&mut b, 12, 1);
            WrappedKey::decode(&b)
        }),
        (
            "argon2id with zero parameters",
            forge(&|b| {
                put_u32(b, 8, 0);
                put_u32(b, 12, 0);
                put_u32(b, 16, 0);
            }),
        ),
    ];
    for (what, result) in cases {
        assert!(result.is_err(), "{what}: accepted");
    }
    for len in [0, 1, WrappedKey::LEN - 1, WrappedKey::LEN + 1, 4096] {
        let mut b = good.to_vec();
        b.resize(len, 0);
        assert_eq!(
            WrappedKey::decode(&b),
            Err(Malformed("wrong length")),
            "len {len}"
        );
    }
    assert!(WrappedKey::decode(&good).is_ok());
    assert!(WrappedKey::decode(&raw_good).is_ok());
}

/// Every single-bit change of a raw-key record is refused by `decode` or by `unwrap`.
#[test]
fn every_flipped_bit_of_a_raw_record_is_refused() {
    let mut rng = TestEntropy(7);
    let key = DataKey::generate(&mut rng).unwrap();
    let good = wrap(&key, Wrapping::Raw(&[7; 32]), &mut rng)
        .unwrap()
        .encode();
    for bit in 0..WrappedKey::LEN * 8 {
        let mut b = good;
        b[bit / 8] ^= 1 << (bit % 8);
        if let Ok(record) = WrappedKey::decode(&b) {
            assert!(unwrap(&record, Secret::Raw(&[7; 32])).is_err(), "bit {bit}");
        }
    }
}

/// A changed byte anywhere in a passphrase record (its parameters, salt, nonce, sealed
/// key or tag) is refused, whether or not the change leaves it decodable.
#[test]
fn every_changed_byte_of_a_passphrase_record_is_refused() {
    let mut rng = TestEntropy(8);
    let key = DataKey::generate(&mut rng).unwrap();
    let good = wrap(&key, Wrapping::Passphrase(PASS, CHEAP), &mut rng)
        .unwrap()
        .encode();
    let mut decodable = 0;
    for at in 0..WrappedKey::LEN {
        let mut b = good;
        b[at] ^= 1;
        if let Ok(record) = WrappedKey::decode(&b) {
            decodable += 1;
            assert!(
                unwrap(&record, Secret::Passphrase(PASS)).is_err(),
                "byte {at}"
            );
        }
    }
    // The salt, nonce, sealed key and tag (88 bytes) and some parameter bytes decode.
    assert!(decodable >= 88, "{decodable}");
}

/// Decoding arbitrary bytes never panics.
#[test]
fn decode_of_noise_never_panics() {
    let mut rng = TestEntropy(10);
    let mut b = [0u8; WrappedKey::LEN];
    for _ in 0..20_000 {
        rng.fill(&mut b).unwrap();
        // Half the time keep a valid-looking prefix, so the later checks are reached.
        if b[0] & 1 == 0 {
            b[..4].copy_from_slice(b"NfWK");
            b[4] = 1;
            b[5] = 1 + (b[5] & 1);
            b[6] = 0;
            b[7] = 0;
        }
        let _ = WrappedKey::decode(&b);
    }
}

/// The record format and the wrapping-key derivations, pinned: records written today must
/// unwrap after any change to the crate. Bytes made by this crate (the standards' vectors
/// are in `kat.rs`), and reproduced independently by `tests/xcheck.py` (pyca/cryptography:
/// HKDF-SHA256, Argon2id and XChaCha20-Poly1305 from the documented layout).
#[test]
fn record_format_is_pinned() {
    let key = DataKey::from_bytes([0x24; 32]);
    let raw = wrap(&key, Wrapping::Raw(&[0x42; 32]), &mut TestEntropy(11))
        .unwrap()
        .encode();
    let pass = wrap(
        &key,
        Wrapping::Passphrase(PASS, CHEAP),
        &mut TestEntropy(12),
    )
    .unwrap()
    .encode();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    assert_eq!(hex(&raw), PINNED_RAW, "raw record");
    assert_eq!(hex(&pass), PINNED_ARGON2ID, "Argon2id record");
    assert!(same(
        &unwrap(&WrappedKey::decode(&raw).unwrap(), Secret::Raw(&[0x42; 32])).unwrap(),
        &key
    ));
}

const PINNED_RAW: &str = "4e66574b01020000000000000000000000000000df961433e9e54d2868b7de3d22838c45898bb821b04858f16923b841dabf3282ed3a3176de911e18b78c379b78e1800e34729a855a68445efdf4ea6815df315f5a402b3867c8d784d588df5568098a1a3beac60e2b34ed2b";
const PINNED_ARGON2ID: &str = "4e66574b0101000000200000010000000100000037fe1f2e53d6c6dec478fb69debbe1d3722421ecdf830660507922e0be08301996990ffcf934a146826fc15b1a7498ff5f29ad572eff08e76c0ee48594a5a2985da70e00fa8e73506fae14137210b4d65d5449149ffcfe45";

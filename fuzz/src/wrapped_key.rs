//! `wrapped_key`: the wrapped data key an encryption root keeps on disk
//! (`crypt::WrappedKey`), which a damaged or forged disk may hold behind a valid
//! checksum.
//!
//! Input: the record's bytes, whole (a record is [`WrappedKey::LEN`] bytes; any other
//! length must be refused). Flags are not used: the input is the record.
//!
//! Checked: no panic; a record that decodes encodes back to the same bytes (one form per
//! record, so nothing read is silently dropped), with its KDF parameters within
//! bounds; a raw-key record unwraps with a fixed key to a key or an error. Passphrase
//! records are not unwrapped here: Argon2id at the bounded parameters takes up to
//! seconds a try (the bound itself is what decoding checks).

use crypt::{unwrap, Kdf, Secret, WrappedKey, KEY_LEN};

/// The target.
pub fn run(data: &[u8]) {
    let Ok(record) = WrappedKey::decode(data) else {
        return;
    };
    assert!(
        record.encode()[..] == *data,
        "a decoded record encodes back to its bytes"
    );
    match record.kdf() {
        Kdf::Argon2id(params) => params.check().expect("decoding bounds the parameters"),
        Kdf::Raw => {
            let _ = unwrap(&record, Secret::Raw(&[7; KEY_LEN]));
        }
    }
}

/// A fixed source of "randomness" for the seeds (they must be the same every time).
struct Counter(u8);

impl crypt::Entropy for Counter {
    fn fill(&mut self, out: &mut [u8]) -> Result<(), crypt::NoEntropy> {
        for b in out {
            self.0 = self.0.wrapping_add(1);
            *b = self.0;
        }
        Ok(())
    }
}

/// Seeds: a raw-key record, a passphrase record at the smallest parameters, and both cut
/// short.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let key = crypt::DataKey::from_bytes([0x42; KEY_LEN]);
    let raw =
        crypt::wrap(&key, crypt::Wrapping::Raw(&[7; KEY_LEN]), &mut Counter(0)).expect("wraps");
    let small = crypt::KdfParams {
        memory_kib: crypt::KdfParams::MIN_MEMORY_KIB,
        iterations: 1,
        lanes: 1,
    };
    let passphrase = crypt::wrap(
        &key,
        crypt::Wrapping::Passphrase(b"correct horse", small),
        &mut Counter(100),
    )
    .expect("wraps");
    let (raw, passphrase) = (raw.encode().to_vec(), passphrase.encode().to_vec());
    vec![
        ("raw".into(), raw.clone()),
        ("passphrase".into(), passphrase.clone()),
        ("raw-short".into(), raw[..60].to_vec()),
        ("passphrase-short".into(), passphrase[..20].to_vec()),
    ]
}

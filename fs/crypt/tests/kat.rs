//! Known-answer tests of every primitive the crate uses, with the vectors of their
//! standards. The bytes below were typed from the standards' texts and checked against a
//! second transcription (the RustCrypto crates' own test data).

use crypt::{Nonce, SealingKey};

/// RFC 8439 section 2.8.2 (and draft-irtf-cfrg-xchacha-03 appendix A.3.1): the key.
const KEY: [u8; 32] = [
    0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8a, 0x8b, 0x8c, 0x8d, 0x8e, 0x8f,
    0x90, 0x91, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9a, 0x9b, 0x9c, 0x9d, 0x9e, 0x9f,
];

/// The same vectors' additional data.
const AAD: [u8; 12] = [
    0x50, 0x51, 0x52, 0x53, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7,
];

/// The same vectors' plaintext (114 bytes).
const PLAINTEXT: &[u8] = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.";

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':')
        .collect();
    assert_eq!(s.len() % 2, 0, "odd hex");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// draft-irtf-cfrg-xchacha-03, appendix A.3.1: AEAD_XChaCha20_Poly1305, the construction
/// the crate seals with, through the crate's own `seal_in_place` / `open_in_place`.
#[test]
fn xchacha20poly1305_draft_irtf_cfrg_xchacha_a_3_1() {
    let nonce: [u8; 24] = unhex("404142434445464748494a4b4c4d4e4f5051525354555657")
        .try_into()
        .unwrap();
    let ciphertext = unhex(
        "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb
         731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452
         2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9
         21f9664c97637da9768812f615c68b13b52e",
    );
    let tag: [u8; 16] = unhex("c0875924c1c7987947deafd8780acf49")
        .try_into()
        .unwrap();

    let key = SealingKey::from_bytes(&KEY);
    let mut buf = PLAINTEXT.to_vec();
    let got = key.seal_in_place(&Nonce(nonce), &AAD, &mut buf);
    assert_eq!(buf, ciphertext, "ciphertext");
    assert_eq!(got, tag, "tag");

    key.open_in_place(&Nonce(nonce), &AAD, &mut buf, &tag)
        .expect("the vector opens");
    assert_eq!(buf, PLAINTEXT);
}

/// RFC 8439 section 2.8.2: AEAD_CHACHA20_POLY1305 with a 96-bit nonce. XChaCha20 is
/// HChaCha20 followed by this construction; the crate does not seal with it, but it is
/// the primitive underneath (and the `chacha20poly1305` crate's base).
#[test]
fn chacha20poly1305_rfc8439_2_8_2() {
    use chacha20poly1305::aead::{AeadInOut, KeyInit};
    let nonce = unhex("070000004041424344454647");
    let ciphertext = unhex(
        "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6
         3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36
         92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc
         3ff4def08e4b7a9de576d26586cec64b6116",
    );
    let tag = unhex("1ae10b594f09e26a7e902ecbd0600691");
    let aead = chacha20poly1305::ChaCha20Poly1305::new(&KEY.into());
    let mut buf = PLAINTEXT.to_vec();
    let nonce: [u8; 12] = nonce.try_into().unwrap();
    let got = aead
        .encrypt_inout_detached(&nonce.into(), &AAD, buf.as_mut_slice().into())
        .unwrap();
    assert_eq!(buf, ciphertext, "ciphertext");
    assert_eq!(got.as_slice(), tag.as_slice(), "tag");
}

/// RFC 9106 section 5.3: Argon2id version 0x13, m = 32 KiB, t = 3, p = 4, with a secret
/// and associated data (the crate uses neither, and never parameters this small, so the
/// vector is checked on the `argon2` crate the wrapping key comes from).
#[test]
fn argon2id_rfc9106_5_3() {
    let params = argon2::ParamsBuilder::new()
        .m_cost(32)
        .t_cost(3)
        .p_cost(4)
        .output_len(32)
        .data(argon2::AssociatedData::new(&[0x04; 12]).unwrap())
        .build()
        .unwrap();
    let ctx = argon2::Argon2::new_with_secret(
        &[0x03; 8],
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        params,
    )
    .unwrap();
    let mut tag = [0u8; 32];
    ctx.hash_password_into(&[0x01; 32], &[0x02; 16], &mut tag)
        .unwrap();
    assert_eq!(
        tag.to_vec(),
        unhex(
            "0d 64 0d f5 8d 78 76 6c 08 c0 37 a3 4a 8b 53 c9
             d0 1e f0 45 2d 75 b6 5e b5 25 20 e9 6b 01 e6 59"
        )
    );
}

struct HkdfCase {
    ikm: &'static str,
    salt: &'static str,
    info: &'static str,
    prk: &'static str,
    okm: &'static str,
}

/// RFC 5869 appendix A, test cases 1-3 (SHA-256). Case 3 (no salt, no info) is the shape
/// of the crate's subkey derivation (no salt).
const HKDF_CASES: [HkdfCase; 3] = [
    HkdfCase {
        ikm: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
        salt: "000102030405060708090a0b0c",
        info: "f0f1f2f3f4f5f6f7f8f9",
        prk: "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5",
        okm: "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf
              34007208d5b887185865",
    },
    HkdfCase {
        ikm: "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
              202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f
              404142434445464748494a4b4c4d4e4f",
        salt: "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f
               808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f
               a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
        info: "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf
               d0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeef
               f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
        prk: "06a6b88c5853361a06104c9ceb35b45cef760014904671014a193f40c15fc244",
        okm: "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c
              59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71
              cc30c58179ec3e87c14c01d5c1f3434f1d87",
    },
    HkdfCase {
        ikm: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
        salt: "",
        info: "",
        prk: "19ef24a32c717b167f33a91d6f648bdf96596776afdb6377ac434c1c293ccb04",
        okm: "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d
              9d201395faa4b61a96c8",
    },
];

#[test]
fn hkdf_sha256_rfc5869_a_1_to_a_3() {
    for (i, case) in HKDF_CASES.iter().enumerate() {
        let salt = unhex(case.salt);
        let salt = (!salt.is_empty()).then_some(salt.as_slice());
        let (prk, hk) = hkdf::Hkdf::<sha2::Sha256>::extract(salt, &unhex(case.ikm));
        assert_eq!(prk.to_vec(), unhex(case.prk), "case {} PRK", i + 1);
        let want = unhex(case.okm);
        let mut okm = vec![0u8; want.len()];
        hk.expand(&unhex(case.info), &mut okm).unwrap();
        assert_eq!(okm, want, "case {} OKM", i + 1);
    }
}

//! Encryption primitives for encrypted exports (issue 39; docs/decisions.md, D12):
//! XChaCha20-Poly1305 sealing of blocks and small values, subkeys by HKDF-SHA256, and a
//! data key wrapped by a key derived from a passphrase (Argon2id) or given raw.
//!
//! # Keys
//! Each encryption root has one random 256-bit [`DataKey`], made once
//! ([`DataKey::generate`]) and never changed. It is stored only wrapped
//! ([`WrappedKey`]: sealed under a key-encryption key from the passphrase or a raw key);
//! changing the passphrase ([`rewrap`]) re-seals the same data key, so no data is
//! rewritten. Nothing is sealed with the data key itself: [`DataKey::subkey`] derives one
//! [`SealingKey`] per [`Purpose`] (file data, names, symlink targets, xattr values), so the
//! nonce spaces of the four kinds of thing are disjoint by construction.
//!
//! Keys are zeroed when dropped, are not `Clone`, and their `Debug` prints `<redacted>`.
//!
//! # Nonces: the rule the filesystem must follow
//! XChaCha20-Poly1305 is broken for a key if one (key, nonce) pair seals two different
//! plaintexts. Block nonces are not stored; they are derived ([`Nonce::derive`]) from
//! three values the filesystem can name for each block without storing the nonce:
//!
//! - `salt`: 64 random bits per encryption root *and per copy of it that writes*. A root
//!   received on another appliance with the same data key (a raw receive) must draw a new
//!   salt before it writes, and blocks must record (directly or through a small table)
//!   the salt they were sealed under;
//! - `write_id`: a 64-bit counter per encryption root that is never reused: taken from a
//!   durable high-water mark, so that after a crash and log replay the counter resumes
//!   *above* every value that may have been used before the crash (reserve ranges
//!   durably before using them), never from the last committed value;
//! - `index`: the block's index within that write (or any number unique within it).
//!
//! Then no (subkey, nonce) pair repeats as long as no (salt, write_id, index) triple is
//! used twice under one [`Purpose`]: a rewrite of a block, a freed block's reuse, a mirror
//! rebuild and a replay all take a fresh `write_id` (mirror rebuild and scrub copy sealed
//! bytes and tags unchanged, which is not a second sealing). Values (names, symlink
//! targets, xattr values) take their nonce the same way from their own write identity.
//! Random nonces ([`Nonce::random`]) are used only where the nonce is stored, as in
//! [`WrappedKey`]: at 192 bits a collision is negligible (about 2^-97 after 2^48 nonces).
//!
//! # Tags
//! A 4096-byte block cannot grow: [`SealingKey::seal_in_place`] encrypts in place and
//! returns the 16-byte [`Tag`], which the filesystem stores beside the block's checksum;
//! [`SealingKey::open_in_place`] checks it before returning anything (a wrong tag, nonce,
//! AAD or ciphertext is [`Tampered`], and the buffer is then zeroed, not left half
//! decrypted). Small values use [`SealingKey::seal_value`], which appends the tag.
//!
//! `no_std` + `alloc`, no `unsafe`, no hardware: randomness comes from the caller
//! ([`Entropy`]); tested on the host. On `x86_64-unknown-none` every primitive runs its
//! portable constant-time software code (no SIMD: D12).
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

use alloc::vec::Vec;
use chacha20poly1305::aead::{AeadInOut, KeyInit};
use chacha20poly1305::XChaCha20Poly1305;
use core::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Bytes in a key: data keys, subkeys, raw wrapping keys (256 bits).
pub const KEY_LEN: usize = 32;
/// Bytes in an authentication tag (Poly1305).
pub const TAG_LEN: usize = 16;
/// Bytes in a nonce (XChaCha20: 192 bits).
pub const NONCE_LEN: usize = 24;
/// Bytes of Argon2id salt in a [`WrappedKey`] (RFC 9106 recommends 128 bits).
pub const KDF_SALT_LEN: usize = 16;
/// The longest passphrase accepted: a bound on the work of a wrap or unwrap.
pub const MAX_PASSPHRASE_LEN: usize = 1024;
/// The largest value [`SealingKey::seal_value`] seals: a name is at most 255 bytes,
/// a symlink target 4095, an xattr value 64 KiB.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

/// A source of random bytes, supplied by the caller (in the appliance RDSEED/RDRAND; on
/// the host the operating system). The crate never gathers entropy itself.
pub trait Entropy {
    /// Fills `dest` with unpredictable bytes, or says it could not.
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), NoEntropy>;
}

/// The caller's [`Entropy`] could not supply random bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoEntropy;

impl fmt::Display for NoEntropy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no entropy available")
    }
}

/// An authentication tag, stored beside the sealed bytes.
pub type Tag = [u8; TAG_LEN];

/// Sealed bytes, their tag, nonce or additional data did not authenticate: the data
/// was changed, or sealed under another key. Never returned with plaintext.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tampered;

impl fmt::Display for Tampered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sealed data failed authentication")
    }
}

/// A 192-bit XChaCha20 nonce.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nonce(pub [u8; NONCE_LEN]);

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce(")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

impl Nonce {
    /// The nonce of one sealing by the filesystem: the root's `salt`, the write's
    /// never-reused `write_id` and the `index` within the write, little-endian, in that
    /// order. Distinct triples give distinct nonces (the crate docs give the rule).
    pub fn derive(salt: [u8; 8], write_id: u64, index: u64) -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        n[..8].copy_from_slice(&salt);
        n[8..16].copy_from_slice(&write_id.to_le_bytes());
        n[16..].copy_from_slice(&index.to_le_bytes());
        Nonce(n)
    }

    /// A random nonce, for sealings whose nonce is stored with them.
    pub fn random(rng: &mut impl Entropy) -> Result<Nonce, NoEntropy> {
        let mut n = [0u8; NONCE_LEN];
        rng.fill(&mut n)?;
        Ok(Nonce(n))
    }
}

/// What a [`SealingKey`] seals. Each purpose has its own subkey, so a nonce used for a
/// name can never collide with one used for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// File data blocks.
    Data,
    /// Directory entry names.
    Names,
    /// Symbolic link targets.
    SymlinkTargets,
    /// Extended attribute values.
    XattrValues,
}

impl Purpose {
    /// HKDF `info` for the purpose's subkey. Stable: changing it changes every key.
    fn info(self) -> &'static [u8] {
        match self {
            Purpose::Data => b"ninefold-crypt v1 data",
            Purpose::Names => b"ninefold-crypt v1 names",
            Purpose::SymlinkTargets => b"ninefold-crypt v1 symlink targets",
            Purpose::XattrValues => b"ninefold-crypt v1 xattr values",
        }
    }
}

/// The random 256-bit key of one encryption root. Zeroed on drop; not `Clone`; its
/// `Debug` prints `<redacted>`.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct DataKey([u8; KEY_LEN]);

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(<redacted>)")
    }
}

impl DataKey {
    /// A new random data key (once per encryption root).
    pub fn generate(rng: &mut impl Entropy) -> Result<DataKey, NoEntropy> {
        let mut key = DataKey([0; KEY_LEN]);
        rng.fill(&mut key.0)?;
        Ok(key)
    }

    /// A data key from its bytes (tests, and a raw receive that carries the key).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    /// The key's bytes, for comparing two keys in constant time or handing the key on.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The subkey for one [`Purpose`]: HKDF-SHA256 (RFC 5869) with no salt, the data key
    /// as input key material and the purpose's label as `info`.
    pub fn subkey(&self, purpose: Purpose) -> SealingKey {
        let key = Zeroizing::new(hkdf_sha256(None, &self.0, purpose.info()));
        SealingKey::new(&key)
    }
}

/// HKDF-SHA256 of `ikm` with `salt` and `info`, 32 bytes out.
fn hkdf_sha256(salt: Option<&[u8]>, ikm: &[u8], info: &[u8]) -> [u8; KEY_LEN] {
    let mut okm = [0u8; KEY_LEN];
    hkdf::Hkdf::<sha2::Sha256>::new(salt, ikm)
        .expand(info, &mut okm)
        // 32 bytes is far below HKDF's 255 * 32 limit.
        .expect("HKDF-SHA256 yields 32 bytes");
    okm
}

/// An XChaCha20-Poly1305 key ready to seal and open. Zeroed on drop (the cipher zeroes
/// its key copy); not `Clone`; `Debug` prints `<redacted>`.
pub struct SealingKey {
    aead: XChaCha20Poly1305,
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealingKey(<redacted>)")
    }
}

impl SealingKey {
    /// A sealing key from raw bytes: for known-answer tests and keys made elsewhere.
    /// The filesystem takes its keys from [`DataKey::subkey`].
    pub fn from_bytes(key: &[u8; KEY_LEN]) -> SealingKey {
        SealingKey::new(key)
    }

    fn new(key: &[u8; KEY_LEN]) -> SealingKey {
        SealingKey {
            aead: XChaCha20Poly1305::new(key.into()),
        }
    }

    /// Encrypts `buf` in place under `nonce`, authenticating it and `aad` (e.g. the
    /// block's address or inode), and returns the tag to store beside it.
    ///
    /// `buf` may be any length up to 256 GiB (XChaCha20's limit; a block is 4 KiB).
    pub fn seal_in_place(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Tag {
        let tag = self
            .aead
            .encrypt_inout_detached(&nonce.0.into(), aad, buf.into())
            // Fails only beyond 2^38 bytes of plaintext or 2^64 of AAD.
            .expect("XChaCha20-Poly1305 seals any buffer that fits in memory");
        tag.into()
    }

    /// Checks `tag` over `buf` (sealed in place), `nonce` and `aad`, and decrypts `buf` in
    /// place. On [`Tampered`] `buf` is zeroed: no unauthenticated plaintext is left.
    pub fn open_in_place(
        &self,
        nonce: &Nonce,
        aad: &[u8],
        buf: &mut [u8],
        tag: &Tag,
    ) -> Result<(), Tampered> {
        // The crate checks the tag before decrypting; zeroing keeps the promise even if
        // it decrypted first.
        match self
            .aead
            .decrypt_inout_detached(&nonce.0.into(), aad, buf.into(), tag.into())
        {
            Ok(()) => Ok(()),
            Err(_) => {
                buf.zeroize();
                Err(Tampered)
            }
        }
    }

    /// Seals a small value (a name, a symlink target, an xattr value; at most
    /// [`MAX_VALUE_LEN`] bytes): the ciphertext followed by the tag, `TAG_LEN` bytes longer
    /// than `value`. `None` if `value` is too long.
    pub fn seal_value(&self, nonce: &Nonce, aad: &[u8], value: &[u8]) -> Option<Vec<u8>> {
        if value.len() > MAX_VALUE_LEN {
            return None;
        }
        let mut out = Vec::with_capacity(value.len() + TAG_LEN);
        out.extend_from_slice(value);
        let tag = self.seal_in_place(nonce, aad, &mut out);
        out.extend_from_slice(&tag);
        Some(out)
    }

    /// Opens a value sealed by [`seal_value`](Self::seal_value). Anything shorter than a
    /// tag, longer than [`MAX_VALUE_LEN`] plus a tag, or failing authentication is
    /// [`Tampered`].
    pub fn open_value(
        &self,
        nonce: &Nonce,
        aad: &[u8],
        sealed: &[u8],
    ) -> Result<Vec<u8>, Tampered> {
        let body_len = sealed.len().checked_sub(TAG_LEN).ok_or(Tampered)?;
        if body_len > MAX_VALUE_LEN {
            return Err(Tampered);
        }
        let (body, tag) = sealed.split_at(body_len);
        let tag: Tag = tag.try_into().map_err(|_| Tampered)?;
        let mut out = Vec::from(body);
        self.open_in_place(nonce, aad, &mut out, &tag)?;
        Ok(out)
    }
}

/// Argon2id parameters of a passphrase-wrapped key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
    /// Lanes (computed one after another here: no threads).
    pub lanes: u32,
}

impl KdfParams {
    /// The parameters new keys are wrapped with (D12): 64 MiB, 6 passes, 1 lane. About
    /// 0.4 s in the appliance's code on the development machine (0.25 s on the host with
    /// AVX2): twice the passes of RFC 9106's memory-constrained recommendation (64 MiB,
    /// t = 3), since an unlock is rare; 64 MiB, needed only during an unlock, is half the
    /// smallest appliance's memory.
    pub const DEFAULT: KdfParams = KdfParams {
        memory_kib: 64 * 1024,
        iterations: 6,
        lanes: 1,
    };
    /// The least memory accepted, in KiB (8 MiB): below it a wrap protects little.
    pub const MIN_MEMORY_KIB: u32 = 8 * 1024;
    /// The most memory accepted, in KiB (256 MiB): a forged record cannot ask for more.
    pub const MAX_MEMORY_KIB: u32 = 256 * 1024;
    /// The most passes accepted.
    pub const MAX_ITERATIONS: u32 = 24;
    /// The most lanes accepted (lanes run one after another here, so they add no speed).
    pub const MAX_LANES: u32 = 4;
    /// The most work accepted, memory (KiB) times passes: 4x [`DEFAULT`](Self::DEFAULT)'s,
    /// so a forged record costs at most about 2 s of unlock, and 256 MiB.
    pub const MAX_WORK_KIB: u64 = 4 * 64 * 1024 * 6;

    /// Whether these parameters are within the bounds above (checked before any use, on
    /// wrap and on decode).
    pub fn check(&self) -> Result<(), Malformed> {
        if self.memory_kib < Self::MIN_MEMORY_KIB || self.memory_kib > Self::MAX_MEMORY_KIB {
            return Err(Malformed("KDF memory out of bounds"));
        }
        if self.iterations == 0 || self.iterations > Self::MAX_ITERATIONS {
            return Err(Malformed("KDF iterations out of bounds"));
        }
        if self.lanes == 0 || self.lanes > Self::MAX_LANES {
            return Err(Malformed("KDF lanes out of bounds"));
        }
        // Argon2 needs at least 8 KiB per lane; MIN_MEMORY_KIB and MAX_LANES ensure it.
        let work = u64::from(self.memory_kib) * u64::from(self.iterations);
        if work > Self::MAX_WORK_KIB {
            return Err(Malformed("KDF work out of bounds"));
        }
        Ok(())
    }

    /// Derives a 32-byte key from `passphrase` and `salt` with Argon2id (version 0x13).
    /// The parameters must have passed [`check`](Self::check). `None` if memory could
    /// not be allocated.
    fn derive(
        &self,
        passphrase: &[u8],
        salt: &[u8; KDF_SALT_LEN],
    ) -> Option<Zeroizing<[u8; KEY_LEN]>> {
        let params =
            argon2::Params::new(self.memory_kib, self.iterations, self.lanes, Some(KEY_LEN))
                .ok()?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = Zeroizing::new([0u8; KEY_LEN]);
        argon
            .hash_password_into(passphrase, salt, out.as_mut())
            .ok()?;
        Some(out)
    }
}

/// What wraps a data key: a passphrase through Argon2id, or a raw 256-bit key.
#[derive(Clone, Copy)]
pub enum Wrapping<'a> {
    /// A passphrase (1 to [`MAX_PASSPHRASE_LEN`] bytes) and the Argon2id parameters to
    /// derive the wrapping key with.
    Passphrase(&'a [u8], KdfParams),
    /// A raw key (e.g. from a key file or `fw_cfg`).
    Raw(&'a [u8; KEY_LEN]),
}

impl fmt::Debug for Wrapping<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wrapping::Passphrase(_, params) => {
                write!(f, "Wrapping::Passphrase(<redacted>, {params:?})")
            }
            Wrapping::Raw(_) => f.write_str("Wrapping::Raw(<redacted>)"),
        }
    }
}

/// What unwraps a data key: the passphrase or the raw key it was wrapped with (the
/// parameters come from the record).
#[derive(Clone, Copy)]
pub enum Secret<'a> {
    /// A passphrase.
    Passphrase(&'a [u8]),
    /// A raw key.
    Raw(&'a [u8; KEY_LEN]),
}

impl fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Passphrase(_) => f.write_str("Secret::Passphrase(<redacted>)"),
            Secret::Raw(_) => f.write_str("Secret::Raw(<redacted>)"),
        }
    }
}

/// A wrapped-key record that cannot be decoded or used: a damaged or forged disk, or
/// parameters out of bounds. The reason is short and names the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed wrapped key: {}", self.0)
    }
}

/// Why [`wrap`] or [`rewrap`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrapError {
    /// The parameters or the passphrase's length are out of bounds.
    Invalid(Malformed),
    /// The caller's entropy failed.
    NoEntropy,
    /// Argon2id's memory could not be allocated.
    OutOfMemory,
    /// [`rewrap`]: the old secret did not unwrap the record.
    WrongKeyOrCorrupt,
}

impl fmt::Display for WrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WrapError::Invalid(m) => m.fmt(f),
            WrapError::NoEntropy => NoEntropy.fmt(f),
            WrapError::OutOfMemory => f.write_str("out of memory for the key derivation"),
            WrapError::WrongKeyOrCorrupt => UnwrapError::WrongKeyOrCorrupt.fmt(f),
        }
    }
}

impl From<NoEntropy> for WrapError {
    fn from(_: NoEntropy) -> Self {
        WrapError::NoEntropy
    }
}

/// Why [`unwrap`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwrapError {
    /// The secret does not unwrap the record: a wrong passphrase or key, the wrong kind
    /// of secret, or a record changed after it was written (these cannot be told apart).
    WrongKeyOrCorrupt,
    /// Argon2id's memory (the record's [`KdfParams::memory_kib`], at most 256 MiB) could
    /// not be allocated; nothing was tried, the passphrase may be right.
    OutOfMemory,
}

impl fmt::Display for UnwrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnwrapError::WrongKeyOrCorrupt => "wrong key or passphrase, or a damaged wrapped key",
            UnwrapError::OutOfMemory => "out of memory for the key derivation",
        })
    }
}

/// How the wrapping key of a [`WrappedKey`] is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kdf {
    /// Argon2id (RFC 9106, version 0x13) of a passphrase.
    Argon2id(KdfParams),
    /// A raw key, through HKDF-SHA256 with the record's salt.
    Raw,
}

/// A data key sealed under a wrapping key, as stored on disk: [`WrappedKey::LEN`] bytes,
/// little-endian:
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 4 | magic `NfWK` |
/// | 4 | 1 | version, 1 |
/// | 5 | 1 | KDF: 1 Argon2id, 2 raw |
/// | 6 | 2 | reserved, 0 |
/// | 8 | 4 | Argon2id memory, KiB (0 for raw) |
/// | 12 | 4 | Argon2id iterations (0 for raw) |
/// | 16 | 4 | Argon2id lanes (0 for raw) |
/// | 20 | 16 | salt |
/// | 36 | 24 | nonce |
/// | 60 | 32 | the data key, sealed |
/// | 92 | 16 | tag |
///
/// The first 60 bytes (the header) are the AEAD's additional data, so no field can be
/// changed without the unwrap failing.
#[derive(Clone, PartialEq, Eq)]
pub struct WrappedKey {
    kdf: Kdf,
    salt: [u8; KDF_SALT_LEN],
    nonce: Nonce,
    sealed: [u8; KEY_LEN],
    tag: Tag,
}

impl fmt::Debug for WrappedKey {
    // The sealed key is not secret, but there is nothing to read in it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrappedKey")
            .field("kdf", &self.kdf)
            .finish_non_exhaustive()
    }
}

const MAGIC: [u8; 4] = *b"NfWK";
const VERSION: u8 = 1;
const KDF_ARGON2ID: u8 = 1;
const KDF_RAW: u8 = 2;
const HEADER_LEN: usize = 60;

impl WrappedKey {
    /// Bytes in an encoded record.
    pub const LEN: usize = HEADER_LEN + KEY_LEN + TAG_LEN;

    /// How the wrapping key is made (the parameters an unwrap will spend).
    pub fn kdf(&self) -> Kdf {
        self.kdf
    }

    fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        let params = match self.kdf {
            Kdf::Argon2id(p) => {
                h[5] = KDF_ARGON2ID;
                p
            }
            Kdf::Raw => {
                h[5] = KDF_RAW;
                KdfParams {
                    memory_kib: 0,
                    iterations: 0,
                    lanes: 0,
                }
            }
        };
        h[8..12].copy_from_slice(&params.memory_kib.to_le_bytes());
        h[12..16].copy_from_slice(&params.iterations.to_le_bytes());
        h[16..20].copy_from_slice(&params.lanes.to_le_bytes());
        h[20..36].copy_from_slice(&self.salt);
        h[36..60].copy_from_slice(&self.nonce.0);
        h
    }

    /// The record's bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..HEADER_LEN].copy_from_slice(&self.header());
        out[HEADER_LEN..HEADER_LEN + KEY_LEN].copy_from_slice(&self.sealed);
        out[HEADER_LEN + KEY_LEN..].copy_from_slice(&self.tag);
        out
    }

    /// Reads a record from untrusted bytes: exactly [`LEN`](Self::LEN) bytes, the magic,
    /// a known version and KDF, zero reserved bytes, raw records' parameters zero and
    /// Argon2id parameters within [`KdfParams::check`]'s bounds, so an unwrap of any
    /// decoded record is bounded in time and memory. Never panics, allocates nothing.
    pub fn decode(bytes: &[u8]) -> Result<WrappedKey, Malformed> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().map_err(|_| Malformed("wrong length"))?;
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if bytes[..4] != MAGIC {
            return Err(Malformed("bad magic"));
        }
        if bytes[4] != VERSION {
            return Err(Malformed("unknown version"));
        }
        if bytes[6..8] != [0, 0] {
            return Err(Malformed("reserved bytes not zero"));
        }
        let params = KdfParams {
            memory_kib: u32_at(8),
            iterations: u32_at(12),
            lanes: u32_at(16),
        };
        let kdf = match bytes[5] {
            KDF_ARGON2ID => {
                params.check()?;
                Kdf::Argon2id(params)
            }
            KDF_RAW => {
                if params
                    != (KdfParams {
                        memory_kib: 0,
                        iterations: 0,
                        lanes: 0,
                    })
                {
                    return Err(Malformed("raw key with KDF parameters"));
                }
                Kdf::Raw
            }
            _ => return Err(Malformed("unknown KDF")),
        };
        let mut salt = [0u8; KDF_SALT_LEN];
        salt.copy_from_slice(&bytes[20..36]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[36..60]);
        let mut sealed = [0u8; KEY_LEN];
        sealed.copy_from_slice(&bytes[HEADER_LEN..HEADER_LEN + KEY_LEN]);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&bytes[HEADER_LEN + KEY_LEN..]);
        Ok(WrappedKey {
            kdf,
            salt,
            nonce: Nonce(nonce),
            sealed,
            tag,
        })
    }
}

/// The key-encryption key for a record's KDF and salt from `secret`, if they match in
/// kind and Argon2id could allocate its memory.
fn wrapping_key(
    kdf: &Kdf,
    salt: &[u8; KDF_SALT_LEN],
    secret: Secret<'_>,
) -> Result<SealingKey, UnwrapError> {
    let kek = match (kdf, secret) {
        (Kdf::Argon2id(params), Secret::Passphrase(pass)) => {
            if pass.is_empty() || pass.len() > MAX_PASSPHRASE_LEN {
                return Err(UnwrapError::WrongKeyOrCorrupt);
            }
            params.derive(pass, salt).ok_or(UnwrapError::OutOfMemory)?
        }
        (Kdf::Raw, Secret::Raw(raw)) => Zeroizing::new(hkdf_sha256(
            Some(salt),
            raw,
            b"ninefold-crypt v1 raw wrapping key",
        )),
        _ => return Err(UnwrapError::WrongKeyOrCorrupt),
    };
    Ok(SealingKey::new(&kek))
}

/// Wraps `data_key`: a fresh random salt and nonce from `rng`, the wrapping key from
/// `wrapping`, the data key sealed under it with the record's header as additional data.
pub fn wrap(
    data_key: &DataKey,
    wrapping: Wrapping<'_>,
    rng: &mut impl Entropy,
) -> Result<WrappedKey, WrapError> {
    let (kdf, secret) = match wrapping {
        Wrapping::Passphrase(pass, params) => {
            params.check().map_err(WrapError::Invalid)?;
            if pass.is_empty() || pass.len() > MAX_PASSPHRASE_LEN {
                return Err(WrapError::Invalid(Malformed(
                    "passphrase length out of bounds",
                )));
            }
            (Kdf::Argon2id(params), Secret::Passphrase(pass))
        }
        Wrapping::Raw(raw) => (Kdf::Raw, Secret::Raw(raw)),
    };
    let mut salt = [0u8; KDF_SALT_LEN];
    rng.fill(&mut salt)?;
    let nonce = Nonce::random(rng)?;
    let mut record = WrappedKey {
        kdf,
        salt,
        nonce,
        sealed: *data_key.expose(),
        tag: [0; TAG_LEN],
    };
    // The only failure after the checks above is Argon2id's allocation.
    let kek = wrapping_key(&kdf, &salt, secret).map_err(|_| WrapError::OutOfMemory)?;
    let header = record.header();
    record.tag = kek.seal_in_place(&record.nonce, &header, &mut record.sealed);
    Ok(record)
}

/// Unwraps a record with the secret it was wrapped with. Time and memory are bounded by
/// [`KdfParams`]' limits, which [`WrappedKey::decode`] enforced.
pub fn unwrap(record: &WrappedKey, secret: Secret<'_>) -> Result<DataKey, UnwrapError> {
    let kek = wrapping_key(&record.kdf, &record.salt, secret)?;
    let mut key = DataKey([0; KEY_LEN]);
    key.0 = record.sealed;
    kek.open_in_place(&record.nonce, &record.header(), &mut key.0, &record.tag)
        .map_err(|_| UnwrapError::WrongKeyOrCorrupt)?;
    Ok(key)
}

/// Changes the secret that wraps a record's data key without changing the key (so
/// nothing sealed under it is rewritten): unwraps with `old`, wraps with `new` under a
/// fresh salt and nonce.
pub fn rewrap(
    record: &WrappedKey,
    old: Secret<'_>,
    new: Wrapping<'_>,
    rng: &mut impl Entropy,
) -> Result<WrappedKey, WrapError> {
    let key = unwrap(record, old).map_err(|e| match e {
        UnwrapError::WrongKeyOrCorrupt => WrapError::WrongKeyOrCorrupt,
        UnwrapError::OutOfMemory => WrapError::OutOfMemory,
    })?;
    wrap(&key, new, rng)
}

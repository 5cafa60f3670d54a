//! Speed of the two candidate AEADs on 4 KiB blocks, and the time of an unlock (Argon2id
//! at the chosen parameters) (D12). Prints figures; nothing passes or fails on time.
//!
//!   cargo bench -p ninefold-crypt --bench aeads
//!
//! Speeds are single-threaded MB/s (10^6 bytes) of plaintext, sealing in place with a
//! detached tag and opening (tag checked, then decrypted), 16 bytes of AAD per block as
//! the filesystem will pass; each figure is the best and the median of
//! `CRYPT_BENCH_RUNS` runs (default 7) of `CRYPT_BENCH_MIB` MiB (default 32). Argon2id
//! times are the best and median of `CRYPT_BENCH_KDF_RUNS` unlocks (default 5).
//!
//! On the host the crates pick their SIMD backends at run time (AVX2 ChaCha20 and
//! Poly1305, AES-NI and PCLMULQDQ). The appliance (`x86_64-unknown-none`, soft-float)
//! gets none of them, so measure what it would run with the portable backends forced:
//!
//!   RUSTFLAGS='--cfg chacha20_backend="soft" --cfg poly1305_backend="soft"
//!     --cfg aes_backend="soft" --cfg polyval_backend="soft"' \
//!     cargo bench -p ninefold-crypt --bench aeads --target-dir target/soft
//!
//! (Argon2 has no such switch; its AVX2 code is used on the host only.)

use aes_gcm::aead::{AeadInOut, KeyInit};
use crypt::{KdfParams, Nonce, SealingKey, Wrapping};
use std::hint::black_box;
use std::time::{Duration, Instant};

const BLOCK: usize = 4096;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn best_median(mut v: Vec<f64>, higher_is_better: bool) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = v[v.len() / 2];
    let best = if higher_is_better {
        v[v.len() - 1]
    } else {
        v[0]
    };
    (best, median)
}

/// One AEAD under test: seal a block in place returning the tag, open it.
trait Candidate {
    fn name(&self) -> &'static str;
    fn seal(&self, i: u64, aad: &[u8], buf: &mut [u8]) -> [u8; 16];
    fn open(&self, i: u64, aad: &[u8], buf: &mut [u8], tag: &[u8; 16]) -> bool;
}

struct XChaCha(SealingKey);
impl Candidate for XChaCha {
    fn name(&self) -> &'static str {
        "XChaCha20-Poly1305 (crypt)"
    }
    fn seal(&self, i: u64, aad: &[u8], buf: &mut [u8]) -> [u8; 16] {
        self.0.seal_in_place(&Nonce::derive([7; 8], i, 0), aad, buf)
    }
    fn open(&self, i: u64, aad: &[u8], buf: &mut [u8], tag: &[u8; 16]) -> bool {
        self.0
            .open_in_place(&Nonce::derive([7; 8], i, 0), aad, buf, tag)
            .is_ok()
    }
}

struct AesGcm(aes_gcm::Aes256Gcm);
impl AesGcm {
    fn nonce(i: u64) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&i.to_le_bytes());
        n
    }
}
impl Candidate for AesGcm {
    fn name(&self) -> &'static str {
        "AES-256-GCM (aes-gcm)"
    }
    fn seal(&self, i: u64, aad: &[u8], buf: &mut [u8]) -> [u8; 16] {
        self.0
            .encrypt_inout_detached(&Self::nonce(i).into(), aad, buf.into())
            .unwrap()
            .into()
    }
    fn open(&self, i: u64, aad: &[u8], buf: &mut [u8], tag: &[u8; 16]) -> bool {
        self.0
            .decrypt_inout_detached(&Self::nonce(i).into(), aad, buf.into(), tag.into())
            .is_ok()
    }
}

fn measure(c: &dyn Candidate, blocks: usize, runs: usize) {
    let mut data = vec![0u8; blocks * BLOCK];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let original = data.clone();
    let mut tags = vec![[0u8; 16]; blocks];
    let (mut seal, mut open) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        for (i, (chunk, tag)) in data.chunks_mut(BLOCK).zip(tags.iter_mut()).enumerate() {
            let aad = (i as u64).to_le_bytes().repeat(2);
            *tag = c.seal(i as u64, &aad, chunk);
        }
        seal.push((blocks * BLOCK) as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        for (i, (chunk, tag)) in data.chunks_mut(BLOCK).zip(tags.iter()).enumerate() {
            let aad = (i as u64).to_le_bytes().repeat(2);
            assert!(c.open(i as u64, &aad, chunk, tag));
        }
        open.push((blocks * BLOCK) as f64 / t.elapsed().as_secs_f64() / 1e6);
        assert!(data == original);
        black_box(&tags);
    }
    let (sb, sm) = best_median(seal, true);
    let (ob, om) = best_median(open, true);
    println!(
        "{:<28} seal {:>6.0} / {:>6.0} MB/s   open {:>6.0} / {:>6.0} MB/s   (best / median of {runs})",
        c.name(),
        sb,
        sm,
        ob,
        om
    );
}

struct TestEntropy(u64);
impl crypt::Entropy for TestEntropy {
    fn fill(&mut self, dest: &mut [u8]) -> Result<(), crypt::NoEntropy> {
        for b in dest {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (self.0 >> 56) as u8;
        }
        Ok(())
    }
}

fn kdf(params: KdfParams, runs: usize, label: &str) {
    let mut rng = TestEntropy(1);
    let key = crypt::DataKey::generate(&mut rng).unwrap();
    let pass = b"correct horse battery staple";
    let record = crypt::wrap(&key, Wrapping::Passphrase(pass, params), &mut rng).unwrap();
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let k = crypt::unwrap(&record, crypt::Secret::Passphrase(pass)).unwrap();
        times.push(t.elapsed().as_secs_f64());
        assert_eq!(k.expose(), key.expose());
    }
    let (b, m) = best_median(times, false);
    println!(
        "Argon2id m={:>3} MiB t={} p={}{label:<10} unlock {:>6.0} / {:>6.0} ms (best / median of {runs})",
        params.memory_kib / 1024,
        params.iterations,
        params.lanes,
        Duration::from_secs_f64(b).as_secs_f64() * 1e3,
        Duration::from_secs_f64(m).as_secs_f64() * 1e3,
    );
}

fn main() {
    let runs = env_usize("CRYPT_BENCH_RUNS", 7).max(1);
    let blocks = env_usize("CRYPT_BENCH_MIB", 32) * 1024 * 1024 / BLOCK;
    let kdf_runs = env_usize("CRYPT_BENCH_KDF_RUNS", 5).max(1);
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average: {}", load.trim());
    }
    let key = [0x42u8; 32];
    let candidates: [Box<dyn Candidate>; 2] = [
        Box::new(XChaCha(SealingKey::from_bytes(&key))),
        Box::new(AesGcm(aes_gcm::Aes256Gcm::new(&key.into()))),
    ];
    for c in &candidates {
        measure(c.as_ref(), blocks, runs);
    }
    if std::env::var_os("CRYPT_BENCH_NO_KDF").is_none() {
        kdf(KdfParams::DEFAULT, kdf_runs, " (chosen)");
        for (m, t) in [(64, 3), (32, 3), (128, 3), (256, 3)] {
            let p = KdfParams {
                memory_kib: m * 1024,
                iterations: t,
                lanes: 1,
            };
            kdf(p, kdf_runs, "");
        }
    }
}

//! Speed and ratio of each algorithm on 128 KiB extents of three kinds of data (D11).
//! Prints figures; nothing passes or fails on time.
//!
//!   cargo bench -p ninefold-compress --bench codecs
//!
//! Data (each cut into 128 KiB extents, at most `COMPRESS_BENCH_MIB` MiB, default 64):
//! - `text`: the repository's own `*.rs` and `*.md` files, concatenated;
//! - `image`: the file named by `COMPRESS_BENCH_IMAGE` (e.g. an ext4 image made with
//!   `mkfs.ext4 -d /usr/lib`), else `/usr/bin`'s files concatenated as a stand-in;
//! - `random`: a xorshift stream.
//!
//! Speeds are single-threaded, in MB/s (10^6 bytes) of logical data; each figure is the
//! best and the median of `COMPRESS_BENCH_RUNS` runs (default 5). The ratio is logical
//! bytes over stored bytes as the filesystem would store them: compressed extents in
//! whole 4 KiB blocks, the others plain.
//!
//! `zstd:1` is ruzstd 0.9 (a dev-dependency: the crate does not offer zstd, D11) at its
//! only level, `Fastest`, framed and judged by the same one-block rule, so the decision
//! can be measured again when ruzstd grows levels.

use compress::{compress_extent, decompress_extent, Algorithm, Header, MAX_EXTENT_LOGICAL};
use std::path::{Path, PathBuf};
use std::time::Instant;

const BLOCK_SIZE: usize = 4096;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Files under `dir` (recursively, in name order) whose names end with one of `exts`
/// (all files if `exts` is empty), skipping build output and VCS directories.
fn collect_files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if !matches!(
                name.as_ref(),
                "target" | "build" | ".git" | "corpus" | "regressions"
            ) {
                collect_files(&path, exts, out);
            }
        } else if kind.is_file() && (exts.is_empty() || exts.iter().any(|e| name.ends_with(e))) {
            out.push(path);
        }
    }
}

fn concat(files: &[PathBuf], limit: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for file in files {
        if data.len() >= limit {
            break;
        }
        if let Ok(bytes) = std::fs::read(file) {
            data.extend_from_slice(&bytes);
        }
    }
    data.truncate(limit);
    data
}

fn random(len: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(len);
    data
}

/// What is measured: the crate's algorithms, and ruzstd for comparison.
#[derive(Clone, Copy)]
enum Codec {
    Crate(Algorithm),
    RuzstdFastest,
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::Crate(algorithm) => write!(f, "{algorithm}"),
            Codec::RuzstdFastest => f.write_str("zstd:1 (ruzstd)"),
        }
    }
}

impl Codec {
    fn compress(self, logical: &[u8]) -> Option<Vec<u8>> {
        match self {
            Codec::Crate(algorithm) => compress_extent(algorithm, logical, BLOCK_SIZE),
            Codec::RuzstdFastest => {
                // The crate's framing (a header's worth of bytes, then the frame), the
                // same one-block rule.
                let mut stored = vec![0u8; Header::LEN];
                ruzstd::encoding::compress(
                    logical,
                    &mut stored,
                    ruzstd::encoding::CompressionLevel::Fastest,
                );
                let blocks = stored.len().div_ceil(BLOCK_SIZE);
                if blocks >= logical.len().div_ceil(BLOCK_SIZE) {
                    return None;
                }
                stored.resize(blocks * BLOCK_SIZE, 0);
                Some(stored)
            }
        }
    }

    fn decompress(self, stored: &[u8], out: &mut [u8]) {
        match self {
            Codec::Crate(_) => decompress_extent(stored, out).expect("round trip"),
            Codec::RuzstdFastest => {
                let mut decoder = ruzstd::decoding::FrameDecoder::new();
                // One frame, then the zero padding: decode the frame only.
                let mut source = &stored[Header::LEN..];
                decoder.reset(&mut source).expect("frame header");
                decoder
                    .decode_blocks(&mut source, ruzstd::decoding::BlockDecodingStrategy::All)
                    .expect("frame");
                let n = std::io::Read::read(&mut decoder, out).expect("drain");
                assert_eq!(n, out.len(), "round trip");
            }
        }
    }
}

struct Figures {
    compress_mbs: Vec<f64>,
    decompress_mbs: Vec<f64>,
    stored: usize,
    plain_extents: usize,
}

fn best_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

fn measure(codec: Codec, data: &[u8], runs: usize) -> Figures {
    let extents: Vec<&[u8]> = data.chunks(MAX_EXTENT_LOGICAL).collect();
    let mut figures = Figures {
        compress_mbs: Vec::new(),
        decompress_mbs: Vec::new(),
        stored: 0,
        plain_extents: 0,
    };
    let mut stored: Vec<Option<Vec<u8>>> = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        stored = extents.iter().map(|e| codec.compress(e)).collect();
        let secs = start.elapsed().as_secs_f64();
        figures.compress_mbs.push(data.len() as f64 / secs / 1e6);
    }
    figures.stored = extents
        .iter()
        .zip(&stored)
        .map(|(e, s)| match s {
            Some(s) => s.len(),
            None => e.len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE,
        })
        .sum();
    figures.plain_extents = stored.iter().filter(|s| s.is_none()).count();
    let compressed: Vec<(&Vec<u8>, usize)> = extents
        .iter()
        .zip(&stored)
        .filter_map(|(e, s)| s.as_ref().map(|s| (s, e.len())))
        .collect();
    let compressed_logical: usize = compressed.iter().map(|(_, len)| len).sum();
    let mut out = vec![0u8; MAX_EXTENT_LOGICAL];
    if compressed_logical > 0 {
        for _ in 0..runs {
            let start = Instant::now();
            for (s, len) in &compressed {
                codec.decompress(s, &mut out[..*len]);
            }
            let secs = start.elapsed().as_secs_f64();
            figures
                .decompress_mbs
                .push(compressed_logical as f64 / secs / 1e6);
        }
    }
    // Checked once, outside the timing: every extent comes back as it was.
    for ((e, s), _) in extents.iter().zip(&stored).zip(0..) {
        if let Some(s) = s {
            codec.decompress(s, &mut out[..e.len()]);
            assert_eq!(&out[..e.len()], *e, "round trip");
        }
    }
    figures
}

fn main() {
    let limit = env_usize("COMPRESS_BENCH_MIB", 64) << 20;
    let runs = env_usize("COMPRESS_BENCH_RUNS", 5).max(1);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");

    let mut sources = Vec::new();
    collect_files(&repo, &[".rs", ".md"], &mut sources);
    let text = concat(&sources, limit);

    let (image_name, image) = match std::env::var("COMPRESS_BENCH_IMAGE") {
        Ok(path) => {
            let mut data = std::fs::read(&path).expect("COMPRESS_BENCH_IMAGE");
            data.truncate(limit);
            (format!("image ({path})"), data)
        }
        Err(_) => {
            let mut bins = Vec::new();
            collect_files(Path::new("/usr/bin"), &[], &mut bins);
            (
                "image (/usr/bin concatenated)".to_string(),
                concat(&bins, limit),
            )
        }
    };
    let random = random(limit);

    let codecs = [Codec::Crate(Algorithm::Lz4), Codec::RuzstdFastest];
    println!("compress bench: 128 KiB extents, 4 KiB blocks, {runs} runs, MB/s best / median");
    println!(
        "| data | MiB | algorithm | compress MB/s | decompress MB/s | ratio (stored) | extents plain |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, data) in [
        (format!("text ({} files)", sources.len()), &text),
        (image_name, &image),
        ("random".to_string(), &random),
    ] {
        for codec in codecs {
            let f = measure(codec, data, runs);
            let (cb, cm) = best_median(f.compress_mbs);
            let decompress = if f.decompress_mbs.is_empty() {
                "-".to_string()
            } else {
                let (db, dm) = best_median(f.decompress_mbs);
                format!("{db:.0} / {dm:.0}")
            };
            let extents = data.len().div_ceil(MAX_EXTENT_LOGICAL);
            println!(
                "| {name} | {:.1} | {codec} | {cb:.0} / {cm:.0} | {decompress} | {:.2} | {} of {extents} |",
                data.len() as f64 / (1 << 20) as f64,
                data.len() as f64 / f.stored as f64,
                f.plain_extents,
            );
        }
    }
}

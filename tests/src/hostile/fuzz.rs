//! Seeded random and mutated 9P frames for the fuzzing probe: the same seed gives the
//! same byte stream, so a run that upsets the appliance can be repeated
//! (`NINEFOLD_HOSTILE_SEED`).
//!
//! Frames are mostly well formed requests of every type with small fids, short and
//! hostile names, odd offsets and counts; then mutated (bytes overwritten, the size
//! field included, truncated or extended), random bodies behind a correct header, junk,
//! and frames cut off before the connection is closed. Requests that would change the
//! connection's identity (`Tattach`, `Tauth`) are never sent, so the fuzzer acts as
//! its unprivileged user only.

use ninep::wire::{lock, Data, Tmsg};
use oorandom::Rand64;

/// What kind of bytes a [`Piece`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A well-formed request.
    Valid,
    /// A well-formed request with bytes overwritten, cut or appended.
    Mutated,
    /// A correct size and tag around a random type and body.
    RandomBody,
    /// Random bytes.
    Junk,
    /// The start of a request; the connection is closed after it.
    Cut,
}

impl Kind {
    /// Every kind, for reports.
    pub const ALL: [Kind; 5] = [
        Kind::Valid,
        Kind::Mutated,
        Kind::RandomBody,
        Kind::Junk,
        Kind::Cut,
    ];
}

/// Bytes to send, and what they are.
#[derive(Clone, Debug)]
pub struct Piece {
    /// What they are.
    pub kind: Kind,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Names the fuzzer uses: ordinary, `.`/`..`, empty, with a slash or NUL, the longest.
const NAMES: [&[u8]; 9] = [
    b"a",
    b"b",
    b"sub",
    b".",
    b"..",
    b"",
    b"x/y",
    b"nul\0",
    &[b'n'; 255],
];
const XATTR_NAMES: [&[u8]; 4] = [b"user.a", b"trusted.t", b"security.s", b"bogus"];

/// A seeded source of frames. See the module documentation.
#[derive(Debug)]
pub struct FrameFuzzer {
    rng: Rand64,
    msize: u32,
    tag: u16,
}

impl FrameFuzzer {
    /// The fuzzer of connection `stream` of run `seed`, for `msize`.
    pub fn new(seed: u64, stream: u64, msize: u32) -> FrameFuzzer {
        FrameFuzzer {
            rng: Rand64::new((u128::from(seed) << 64) | u128::from(stream)),
            msize,
            tag: 0,
        }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.rand_range(0..n.max(1))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    fn fid(&mut self) -> u32 {
        if self.chance(3) {
            self.rng.rand_u64() as u32
        } else {
            self.below(8) as u32
        }
    }

    fn offset(&mut self) -> u64 {
        match self.below(4) {
            0 => 0,
            1 => self.below(1 << 16),
            2 => self.below(64 << 20),
            _ => self.rng.rand_u64(),
        }
    }

    fn count(&mut self) -> u32 {
        match self.below(3) {
            0 => self.below(4096) as u32,
            1 => self.msize - 11,
            _ => self.rng.rand_u64() as u32,
        }
    }

    fn next_tag(&mut self) -> u16 {
        // Mostly fresh tags; sometimes one that may still be in flight, or NOTAG.
        if self.chance(2) {
            return self.pick(&[self.tag, ninep::wire::NOTAG]);
        }
        self.tag = self.tag % 60_000 + 1;
        self.tag
    }

    /// A well-formed request (never `Tattach` or `Tauth`).
    fn valid(&mut self) -> Vec<u8> {
        let tag = self.next_tag();
        let (fid, fid2) = (self.fid(), self.fid());
        let name = self.pick(&NAMES);
        let name2 = self.pick(&NAMES);
        let xattr = self.pick(&XATTR_NAMES);
        let data = vec![self.below(256) as u8; self.below(8192) as usize];
        let mode = self.below(0o10000) as u32;
        let gid = self.pick(&[0, 4242, 1000, u32::MAX]);
        let flags = self.pick(&[0, 1, 2, 0o100 | 2, 0o1000 | 1, 0o2000 | 1, 0o200000, 3]);
        let (offset, count) = (self.offset(), self.count());
        let names: Vec<&[u8]> = (0..self.below(17)).map(|_| self.pick(&NAMES)).collect();
        let msg = match self.below(27) {
            0 if self.chance(20) => Tmsg::Version {
                msize: self.pick(&[0, 511, 8192, self.msize, u32::MAX]),
                version: self.pick(&[&b"9P2000.L"[..], b"9P2000", b""]),
            },
            0 | 1 => Tmsg::Flush {
                oldtag: self.below(u64::from(self.tag) + 2) as u16,
            },
            2 | 3 => Tmsg::Walk {
                fid,
                newfid: fid2,
                names,
            },
            4 => Tmsg::Lopen { fid, flags },
            5 => Tmsg::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            },
            6 | 7 => Tmsg::Read { fid, offset, count },
            8 => Tmsg::Write {
                fid,
                offset: offset % (64 << 20),
                data: Data(&data),
            },
            9 => Tmsg::Clunk { fid },
            10 => Tmsg::Remove { fid },
            11 => Tmsg::Statfs { fid },
            12 => Tmsg::Symlink {
                fid,
                name,
                target: name2,
                gid,
            },
            13 => Tmsg::Mknod {
                dfid: fid,
                name,
                mode: mode | self.pick(&[0o100000, 0o20000, 0o10000, 0o140000, 0]),
                major: self.below(300) as u32,
                minor: self.below(300) as u32,
                gid,
            },
            14 => Tmsg::Rename {
                fid,
                dfid: fid2,
                name,
            },
            15 => Tmsg::Readlink { fid },
            16 => Tmsg::Getattr {
                fid,
                request_mask: self.rng.rand_u64(),
            },
            17 => Tmsg::Setattr {
                fid,
                valid: self.below(0x200) as u32,
                mode,
                uid: self.pick(&[0, 4242, 1000]),
                gid,
                size: offset % (64 << 20),
                atime_sec: self.rng.rand_u64(),
                atime_nsec: self.below(2_000_000_000),
                mtime_sec: self.rng.rand_u64(),
                mtime_nsec: self.below(2_000_000_000),
            },
            18 => Tmsg::Xattrwalk {
                fid,
                newfid: fid2,
                name: xattr,
            },
            19 => Tmsg::Xattrcreate {
                fid,
                name: xattr,
                attr_size: self.pick(&[0, 1, 100, 65536, 65537, u64::MAX]),
                flags: self.below(4) as u32,
            },
            20 => Tmsg::Readdir { fid, offset, count },
            21 => Tmsg::Fsync {
                fid,
                datasync: self.below(2) as u32,
            },
            22 => Tmsg::Lock {
                fid,
                lock_type: self.pick(&[lock::RDLCK, lock::WRLCK, lock::UNLCK, 9]),
                flags: self.below(4) as u32,
                start: offset,
                length: self.offset(),
                proc_id: self.below(4) as u32,
                client_id: name,
            },
            23 => Tmsg::Getlock {
                fid,
                lock_type: self.pick(&[lock::RDLCK, lock::WRLCK, lock::UNLCK, 9]),
                start: offset,
                length: self.offset(),
                proc_id: self.below(4) as u32,
                client_id: name,
            },
            24 => Tmsg::Link {
                dfid: fid,
                fid: fid2,
                name,
            },
            25 => Tmsg::Mkdir {
                dfid: fid,
                name,
                mode,
                gid,
            },
            _ => {
                if self.chance(50) {
                    Tmsg::Renameat {
                        olddirfid: fid,
                        oldname: name,
                        newdirfid: fid2,
                        newname: name2,
                    }
                } else {
                    Tmsg::Unlinkat {
                        dirfid: fid,
                        name,
                        flags: self.pick(&[0, 0x200, 1]),
                    }
                }
            }
        };
        let mut out = Vec::new();
        msg.encode(tag, &mut out).expect("request encodes");
        out
    }

    /// Overwrites, cuts or extends a valid frame.
    fn mutate(&mut self, mut f: Vec<u8>) -> Vec<u8> {
        for _ in 0..=self.below(3) {
            let at = self.below(f.len() as u64) as usize;
            f[at] = self.rng.rand_u64() as u8;
        }
        if self.chance(30) {
            let keep = self.below(f.len() as u64 + 1) as usize;
            f.truncate(keep.max(7));
        }
        if self.chance(20) {
            for _ in 0..self.below(64) {
                f.push(self.rng.rand_u64() as u8);
            }
        }
        // Mostly keep the size field honest, so the connection survives to see more.
        if self.chance(80) {
            let len = f.len() as u32;
            f[..4].copy_from_slice(&len.to_le_bytes());
        }
        f
    }

    /// A correct header around a random type (known or not) and body.
    fn random_body(&mut self) -> Vec<u8> {
        let body_len = self.below(96) as usize;
        let mut f = ((7 + body_len) as u32).to_le_bytes().to_vec();
        f.push(self.rng.rand_u64() as u8);
        f.extend_from_slice(&self.next_tag().to_le_bytes());
        for _ in 0..body_len {
            f.push(self.rng.rand_u64() as u8);
        }
        f
    }

    fn junk(&mut self) -> Vec<u8> {
        (0..=self.below(64))
            .map(|_| self.rng.rand_u64() as u8)
            .collect()
    }

    /// Whether `f` would change who the connection acts as.
    fn changes_identity(f: &[u8]) -> bool {
        matches!(
            Tmsg::decode(f),
            Ok((_, Tmsg::Attach { .. } | Tmsg::Auth { .. }))
        )
    }

    /// The next piece.
    pub fn next_piece(&mut self) -> Piece {
        loop {
            let roll = self.below(100);
            let (kind, bytes) = match roll {
                0..=54 => (Kind::Valid, self.valid()),
                55..=84 => {
                    let f = self.valid();
                    (Kind::Mutated, self.mutate(f))
                }
                85..=94 => (Kind::RandomBody, self.random_body()),
                95..=97 => (Kind::Junk, self.junk()),
                _ => {
                    let mut f = self.valid();
                    let keep = self.below(f.len() as u64) as usize;
                    f.truncate(keep);
                    (Kind::Cut, f)
                }
            };
            if !Self::changes_identity(&bytes) {
                return Piece { kind, bytes };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_repeats_its_stream() {
        let stream = |seed| {
            let mut f = FrameFuzzer::new(seed, 3, 1 << 20);
            (0..500).map(|_| f.next_piece().bytes).collect::<Vec<_>>()
        };
        assert_eq!(stream(7), stream(7));
        assert_ne!(stream(7), stream(8));
    }

    #[test]
    fn every_kind_comes_and_no_frame_changes_identity() {
        let mut f = FrameFuzzer::new(1, 0, 1 << 20);
        let mut seen = std::collections::BTreeSet::new();
        let mut decodable = 0;
        for _ in 0..5000 {
            let p = f.next_piece();
            assert!(!FrameFuzzer::changes_identity(&p.bytes));
            decodable += usize::from(Tmsg::decode(&p.bytes).is_ok());
            seen.insert(p.kind);
        }
        assert_eq!(seen.len(), Kind::ALL.len());
        // Most frames are requests the server gets to judge, not just junk.
        assert!(decodable > 2500, "{decodable}");
    }
}

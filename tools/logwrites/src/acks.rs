//! The acknowledgement log: what a client was told while a trace was recorded.
//!
//! A client that records a trace notes, for every path it changes, each *version* of the
//! path (its content, or its absence) with the log's length when the request that made it
//! was sent, and every sync that returned success with the log's length when the reply
//! arrived. Lengths of the log file stand in for time: QEMU appends an entry when the
//! request completes, before the guest hears of it, so an entry inside the length noted
//! at a reply preceded that reply ([`Trace::entries_within`](crate::Trace::entries_within)).
//!
//! The file holds one JSON object per line ([`Record`]). [`AckLog::allowed`] then says,
//! for a crash after the first `n` entries, which versions a path may show: the crash
//! contract (docs/durability.md) lets it hold any version from its latest acknowledged
//! one up to the last one sent before the crash, whole, and nothing else.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

const CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_XZ);

/// A path's state: absent, or a regular file with this content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Content {
    /// Length in bytes.
    pub len: u64,
    /// CRC-64/XZ of the bytes.
    pub crc: u64,
}

impl Content {
    /// The summary of `data`.
    pub fn of(data: &[u8]) -> Content {
        Content {
            len: data.len() as u64,
            crc: CRC.checksum(data),
        }
    }
}

/// One line of the acknowledgement log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// The request that makes `path` hold `content` (`None`: absent) was sent when the log
    /// was `sent` bytes long. Versions of a path are numbered 1, 2, ... in order; before
    /// version 1 the path is absent.
    Version {
        /// Path from the filesystem's root, `/`-separated, no leading `/`.
        path: String,
        /// Version number.
        version: u64,
        /// The path's content from then on, or `None` if the request removed it.
        content: Option<Content>,
        /// Log length when the request was sent.
        sent: u64,
    },
    /// A sync (`op`: fsync, fdatasync, syncfs, ...) that made `version` of `path` durable
    /// returned success when the log was `acked` bytes long.
    Ack {
        /// The path.
        path: String,
        /// The version it made durable.
        version: u64,
        /// What returned.
        op: String,
        /// Log length when the reply arrived.
        acked: u64,
    },
}

/// A version of a path, as [`AckLog`] keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    /// Version number (0: absent before the first request).
    pub version: u64,
    /// Content, `None` if absent.
    pub content: Option<Content>,
    /// Log length when sent (0 for version 0).
    pub sent: u64,
}

/// Everything one path went through.
#[derive(Clone, Debug, Default)]
pub struct PathHistory {
    /// Versions in order, starting with version 0 (absent).
    pub versions: Vec<Version>,
    /// Acknowledgements: (log length at the reply, version, op), in log order.
    pub acks: Vec<(u64, u64, String)>,
}

/// A parsed acknowledgement log.
#[derive(Clone, Debug, Default)]
pub struct AckLog {
    /// By path.
    pub paths: BTreeMap<String, PathHistory>,
}

impl AckLog {
    /// Reads the JSON lines of `r`.
    pub fn read(r: impl BufRead) -> Result<AckLog, String> {
        let mut log = AckLog::default();
        for (n, line) in r.lines().enumerate() {
            let line = line.map_err(|e| e.to_string())?;
            if line.trim().is_empty() {
                continue;
            }
            let record: Record =
                serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", n + 1))?;
            log.add(record)
                .map_err(|e| format!("line {}: {e}", n + 1))?;
        }
        Ok(log)
    }

    /// Reads the file at `path`.
    pub fn open(path: &std::path::Path) -> Result<AckLog, String> {
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        AckLog::read(std::io::BufReader::new(f)).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Adds one record (versions of a path must come in order).
    pub fn add(&mut self, record: Record) -> Result<(), String> {
        match record {
            Record::Version {
                path,
                version,
                content,
                sent,
            } => {
                let h = self.history(path);
                let expected = h.versions.len() as u64;
                if version != expected {
                    return Err(format!("version {version}, expected {expected}"));
                }
                h.versions.push(Version {
                    version,
                    content,
                    sent,
                });
            }
            Record::Ack {
                path,
                version,
                op,
                acked,
            } => {
                let h = self.history(path);
                if version == 0 || version >= h.versions.len() as u64 {
                    return Err(format!("ack of unknown version {version}"));
                }
                h.acks.push((acked, version, op));
            }
        }
        Ok(())
    }

    fn history(&mut self, path: String) -> &mut PathHistory {
        self.paths.entry(path).or_insert_with(|| PathHistory {
            versions: vec![Version {
                version: 0,
                content: None,
                sent: 0,
            }],
            acks: Vec::new(),
        })
    }

    /// Acknowledged syncs in the log.
    pub fn ack_count(&self) -> usize {
        self.paths.values().map(|h| h.acks.len()).sum()
    }
}

impl PathHistory {
    /// The versions the path may show after a crash at which `completed(len)` says
    /// whether the entries within the first `len` log bytes had completed: from the
    /// newest acknowledged one (whose reply came after completed entries only) to the
    /// newest one sent before the crash. Also returns the acknowledgement that set the
    /// lower bound, if any.
    pub fn allowed(
        &self,
        completed: impl Fn(u64) -> bool,
    ) -> (&[Version], Option<&(u64, u64, String)>) {
        let ack = self
            .acks
            .iter()
            .filter(|(acked, _, _)| completed(*acked))
            .max_by_key(|(_, v, _)| *v);
        let low = ack.map_or(0, |a| a.1) as usize;
        // A request sent when the log was `sent` long can only have reached the media if
        // the crash came after those entries completed.
        let high = self
            .versions
            .iter()
            .rposition(|v| completed(v.sent))
            .unwrap_or(0)
            .max(low);
        (&self.versions[low..=high], ack)
    }
}

/// Writes an acknowledgement log as a client records a trace.
#[derive(Debug)]
pub struct AckWriter<W: Write> {
    out: W,
    versions: BTreeMap<String, u64>,
}

impl<W: Write> AckWriter<W> {
    /// Writes to `out`.
    pub fn new(out: W) -> AckWriter<W> {
        AckWriter {
            out,
            versions: BTreeMap::new(),
        }
    }

    fn put(&mut self, r: &Record) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, r)?;
        self.out.write_all(b"\n")
    }

    /// Notes that a request making `path` hold `content` (`None`: absent) is about to be
    /// sent, the log being `sent` bytes long; returns the new version's number.
    pub fn version(
        &mut self,
        path: &str,
        content: Option<&[u8]>,
        sent: u64,
    ) -> std::io::Result<u64> {
        let v = self.versions.entry(path.to_string()).or_insert(0);
        *v += 1;
        let version = *v;
        self.put(&Record::Version {
            path: path.to_string(),
            version,
            content: content.map(Content::of),
            sent,
        })?;
        Ok(version)
    }

    /// Notes that a sync making `version` of `path` durable returned success, the log
    /// being `acked` bytes long.
    pub fn ack(&mut self, path: &str, version: u64, op: &str, acked: u64) -> std::io::Result<()> {
        self.put(&Record::Ack {
            path: path.to_string(),
            version,
            op: op.to_string(),
            acked,
        })
    }

    /// The newest version of `path` noted (0: none).
    pub fn current(&self, path: &str) -> u64 {
        self.versions.get(path).copied().unwrap_or(0)
    }

    /// Flushes and returns the writer.
    pub fn into_inner(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_versions_run_from_the_last_ack_to_the_last_sent() {
        let mut w = AckWriter::new(Vec::new());
        // v1 created (sent at 100), v2 written (sent 200), acked at 300, v3 sent at 400,
        // removed (v4) at 600.
        assert_eq!(w.version("a", Some(b""), 100).unwrap(), 1);
        assert_eq!(w.version("a", Some(b"xy"), 200).unwrap(), 2);
        w.ack("a", 2, "fsync", 300).unwrap();
        w.version("a", Some(b"xyz"), 400).unwrap();
        w.version("a", None, 600).unwrap();
        let bytes = w.into_inner().unwrap();
        let log = AckLog::read(&bytes[..]).unwrap();
        assert_eq!(log.ack_count(), 1);
        let h = &log.paths["a"];
        let at = |len: u64| {
            h.allowed(move |l| l <= len)
                .0
                .iter()
                .map(|v| v.version)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(50), [0]);
        assert_eq!(at(250), [0, 1, 2]);
        assert_eq!(at(300), [2]);
        assert_eq!(at(450), [2, 3]);
        assert_eq!(at(700), [2, 3, 4]);
        assert_eq!(h.versions[2].content, Some(Content::of(b"xy")));
        assert_eq!(h.versions[4].content, None);
    }

    #[test]
    fn rejects_versions_out_of_order_and_acks_of_unknown_versions() {
        let bad = br#"{"kind":"version","path":"a","version":2,"content":null,"sent":0}"#;
        assert!(AckLog::read(&bad[..]).unwrap_err().contains("expected 1"));
        let bad = br#"{"kind":"ack","path":"a","version":1,"op":"fsync","acked":0}"#;
        assert!(AckLog::read(&bad[..])
            .unwrap_err()
            .contains("unknown version"));
    }
}

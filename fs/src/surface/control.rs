//! The administration commands (the `ctl` file of the administration export, and
//! `ninefold ctl` on the host): one table, one parser, one executor.
//!
//! A command is a line of words. [`COMMANDS`] lists each command's words, the number of
//! arguments it takes and how it is built; adding a command is one entry there and one
//! arm in [`NineFs::execute`].

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;

use crate::format::BLOCK_SIZE;
use crate::volume::NineFs;
use block::BlockDevice;

/// An administration command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Make everything durable (a checkpoint).
    Sync,
    /// Start a scrub pass (the owner runs it in the background, rate-limited).
    ScrubStart,
    /// Stop the running scrub pass.
    ScrubStop,
    /// Grow the filesystem to the device's size.
    Grow,
    /// Take a read-only snapshot of the whole filesystem under this name.
    SnapshotCreate(String),
    /// Delete the named snapshot.
    SnapshotDelete(String),
    /// List the snapshots.
    SnapshotList,
    /// List the quota roots: limits and usage.
    QuotaList,
    /// Show the quota a path (from the filesystem's root) is charged to.
    QuotaShow(String),
    /// Make directory `path` a quota root or change its limits: `limits` are
    /// `bytes=SIZE` and `inodes=N` words (`none`: no limit; a limit not named is kept).
    QuotaSet {
        /// The directory, from the filesystem's root.
        path: String,
        /// The limit words, checked when the command runs.
        limits: Vec<String>,
    },
    /// Stream snapshot `.0` (with `.1`, only the changes since that one) through the
    /// `send` file (`features::streams::jobs`).
    SendStart(String, Option<String>),
    /// Stop the running send.
    SendStop,
    /// Take a stream through the `receive` file.
    ReceiveStart,
    /// Stop the running receive.
    ReceiveStop,
    /// Roll the live tree back to the last received snapshot.
    ReceiveRollback,
    /// Replace leg `place` of a mirrored volume with the device `device` names and
    /// rebuild it online. The owner (appliance, `ninefold serve`) opens the device and
    /// puts it in the leg's place (`block::MirrorDisk::attach`) before
    /// [`NineFs::execute`] runs the rest ([`NineFs::replace`]).
    Replace {
        /// The leg's place (0-based, as `ctl status` and the labels count).
        place: usize,
        /// The new device, as the owner selects devices.
        device: String,
    },
}

/// One entry of the command table.
#[derive(Debug)]
pub struct CommandSpec {
    /// The words that name the command.
    pub words: &'static [&'static str],
    /// How many arguments follow them.
    pub args: usize,
    /// Words that may follow the arguments, all or none: lower-case ones as they are,
    /// upper-case ones name more arguments (`send start NAME [from BASE]`).
    pub optional: &'static [&'static str],
    /// What it does (for `help` and errors).
    pub help: &'static str,
    /// Builds the command from its arguments.
    pub build: fn(&[&str]) -> Command,
}

/// Every command.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        words: &["sync"],
        args: 0,
        optional: &[],
        help: "make everything durable",
        build: |_| Command::Sync,
    },
    CommandSpec {
        words: &["scrub", "start"],
        args: 0,
        optional: &[],
        help: "start a scrub pass (verify every checksum)",
        build: |_| Command::ScrubStart,
    },
    CommandSpec {
        words: &["scrub", "stop"],
        args: 0,
        optional: &[],
        help: "stop the running scrub pass",
        build: |_| Command::ScrubStop,
    },
    CommandSpec {
        words: &["grow"],
        args: 0,
        optional: &[],
        help: "grow the filesystem to the device's size",
        build: |_| Command::Grow,
    },
    CommandSpec {
        words: &["snapshot", "create"],
        args: 1,
        optional: &[],
        help: "take a read-only snapshot NAME (reachable at /.snapshots/NAME)",
        build: |a| Command::SnapshotCreate(a[0].to_string()),
    },
    CommandSpec {
        words: &["snapshot", "delete"],
        args: 1,
        optional: &[],
        help: "delete snapshot NAME, freeing what only it holds",
        build: |a| Command::SnapshotDelete(a[0].to_string()),
    },
    CommandSpec {
        words: &["snapshot", "list"],
        args: 0,
        optional: &[],
        help: "list the snapshots: id, name, checkpoint, creation time",
        build: |_| Command::SnapshotList,
    },
    CommandSpec {
        words: &["quota", "list"],
        args: 0,
        optional: &[],
        help: "list the quota roots (export quota=, inodes=): limits and usage",
        build: |_| Command::QuotaList,
    },
    CommandSpec {
        words: &["quota", "show"],
        args: 1,
        optional: &[],
        help: "show the quota PATH (from the filesystem's root) is charged to",
        build: |a| Command::QuotaShow(a[0].to_string()),
    },
    CommandSpec {
        words: &["quota", "set"],
        args: 2,
        optional: &["LIMIT"],
        help: "make directory PATH a quota root or change its limits: bytes=SIZE inodes=N (none: no limit)",
        build: |a| Command::QuotaSet {
            path: a[0].to_string(),
            limits: a[1..].iter().map(|w| w.to_string()).collect(),
        },
    },
    CommandSpec {
        words: &["send", "start"],
        args: 1,
        optional: &["from", "BASE"],
        help: "stream snapshot NAME (from BASE: only what changed since it) out of the send file",
        build: |a| Command::SendStart(a[0].to_string(), a.get(2).map(|b| b.to_string())),
    },
    CommandSpec {
        words: &["send", "stop"],
        args: 0,
        optional: &[],
        help: "stop the running send",
        build: |_| Command::SendStop,
    },
    CommandSpec {
        words: &["receive", "start"],
        args: 0,
        optional: &[],
        help: "take a stream written to the receive file (twice: checked, then applied)",
        build: |_| Command::ReceiveStart,
    },
    CommandSpec {
        words: &["receive", "stop"],
        args: 0,
        optional: &[],
        help: "stop the running receive",
        build: |_| Command::ReceiveStop,
    },
    CommandSpec {
        words: &["receive", "rollback"],
        args: 0,
        optional: &[],
        help: "roll the live tree back to the last received snapshot",
        build: |_| Command::ReceiveRollback,
    },
    CommandSpec {
        words: &["replace"],
        args: 2,
        optional: &[],
        help: "replace leg OLD (its place) of a mirror with device NEW and rebuild it online",
        build: |a| Command::Replace {
            // Not a number: no such place (refused by the executor).
            place: a[0].parse().unwrap_or(usize::MAX),
            device: a[1].to_string(),
        },
    },
];

/// Why a command line was not understood.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandError {
    /// Nothing but white space.
    Empty,
    /// No command starts with these words.
    Unknown(String),
    /// The command takes a different number of arguments.
    Arguments(&'static [&'static str], usize),
    /// The words after the arguments are not the command's optional ones (the
    /// command's words, its number of arguments, its optional words).
    Usage(&'static [&'static str], usize, &'static [&'static str]),
}

impl core::fmt::Display for CommandError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CommandError::Empty => f.write_str("empty command"),
            CommandError::Unknown(line) => {
                write!(f, "unknown command {line:?}; commands: ")?;
                for (i, c) in COMMANDS.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, c.words.join(" "))?;
                }
                Ok(())
            }
            CommandError::Arguments(words, n) => {
                write!(f, "{} takes {n} argument(s)", words.join(" "))
            }
            CommandError::Usage(words, args, optional) => write!(
                f,
                "usage: {} ARG{} [{}]",
                words.join(" "),
                if *args > 1 { "S" } else { "" },
                optional.join(" ")
            ),
        }
    }
}

impl Command {
    /// Parses one command line (words separated by white space; a trailing newline, as
    /// `echo` writes, is fine).
    pub fn parse(line: &str) -> Result<Command, CommandError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            return Err(CommandError::Empty);
        }
        let spec = COMMANDS
            .iter()
            .filter(|c| words.starts_with(c.words))
            .max_by_key(|c| c.words.len())
            .ok_or_else(|| CommandError::Unknown(words.join(" ")))?;
        let args = &words[spec.words.len()..];
        if args.len() == spec.args + spec.optional.len() && !spec.optional.is_empty() {
            let tail = &args[spec.args..];
            let literal = |w: &&str| w.chars().all(|c| !c.is_ascii_uppercase());
            if spec
                .optional
                .iter()
                .zip(tail)
                .any(|(o, w)| literal(o) && o != w)
            {
                return Err(CommandError::Usage(spec.words, spec.args, spec.optional));
            }
        } else if args.len() != spec.args {
            return Err(match spec.optional.is_empty() {
                true => CommandError::Arguments(spec.words, spec.args),
                false => CommandError::Usage(spec.words, spec.args, spec.optional),
            });
        }
        Ok((spec.build)(args))
    }
}

/// The reply naming the quota `path` (inode `ino`) is charged to.
async fn quota_of<D: BlockDevice>(
    fs: &NineFs<D>,
    path: &str,
    ino: vfs::Ino,
) -> Result<String, String> {
    match vfs::FileSystem::quota(fs, ino).await {
        Ok(Some(q)) => Ok(format!(
            "{path}: {}",
            crate::features::quota::describe_info(&q)
        )),
        Ok(None) => Ok(format!("{path}: no quota")),
        Err(e) => Err(format!("{path}: failed: {e}")),
    }
}

/// Runs `cmd`; `Ok` carries a one-line reply.
pub async fn execute<D: BlockDevice>(fs: &NineFs<D>, cmd: &Command) -> Result<String, String> {
    let failed = |e: vfs::Errno| format!("failed: {e}");
    match cmd {
        Command::Sync => {
            vfs::FileSystem::sync(fs).await.map_err(failed)?;
            Ok("synced".to_string())
        }
        Command::ScrubStart => match fs.scrub_start().await.map_err(failed)? {
            true => Ok("scrub started".to_string()),
            false => Err("a scrub pass is already running".to_string()),
        },
        Command::ScrubStop => match fs.scrub_stop() {
            true => Ok("scrub stopped".to_string()),
            false => Err("no scrub pass is running".to_string()),
        },
        Command::Grow => match fs.grow().await.map_err(failed)? {
            Some(g) => Ok(format!(
                "grew from {} to {} blocks ({} groups added)",
                g.old_blocks, g.new_blocks, g.groups_added
            )),
            None => Ok(format!(
                "not grown: the device ({} blocks) is not larger than the filesystem",
                fs.engine.dev.blocks()
            )),
        },
        Command::SnapshotCreate(name) => {
            let s = fs.snapshot_create(name).await.map_err(failed)?;
            Ok(format!(
                "created snapshot {} {:?} at checkpoint {}",
                s.id, s.name, s.seq
            ))
        }
        Command::SnapshotDelete(name) => {
            if fs.sending(name) {
                return Err(format!("snapshot {name:?} is being sent (send stop first)"));
            }
            fs.snapshot_delete(name).await.map_err(failed)?;
            Ok(format!("deleted snapshot {name:?}"))
        }
        Command::SnapshotList => {
            let list = fs.snapshots().await.map_err(failed)?;
            let mut out = format!("{} snapshot(s)", list.len());
            for s in list {
                let _ = write!(
                    out,
                    "\n{} {} checkpoint {} created {}",
                    s.id, s.name, s.seq, s.created.sec
                );
            }
            Ok(out)
        }
        Command::Replace { place, device } => {
            fs.replace_named(*place, device).await?;
            Ok(format!("leg {place} replaced by {device}: rebuilding"))
        }
        Command::QuotaList => {
            let list = fs.quotas().await.map_err(|e| e.to_string())?;
            let mut out = format!("{} quota root(s)", list.len());
            for (root, q) in list {
                let _ = write!(out, "\n{}", crate::features::quota::describe(root, &q));
            }
            Ok(out)
        }
        Command::QuotaShow(path) => {
            let ino = vfs::lookup_path(fs, path)
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            quota_of(fs, path, ino).await
        }
        Command::QuotaSet { path, limits } => {
            let change = vfs::LimitChange::parse(limits.iter().map(String::as_str))?;
            let ino = vfs::lookup_path(fs, path)
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            // A limit not named keeps its value on a quota root that exists.
            let old = vfs::FileSystem::quota(fs, ino).await.map_err(failed)?;
            let old = old.filter(|q| q.root == ino).map(|q| q.limits);
            vfs::FileSystem::set_quota(fs, ino, change.applied_to(old))
                .await
                .map_err(|e| format!("{path}: failed: {e}"))?;
            quota_of(fs, path, ino).await
        }
        Command::SendStart(name, base) => fs.send_start(name, base.as_deref()).await,
        Command::SendStop => match fs.send_stop() {
            true => Ok("send stopped".to_string()),
            false => Err("no send is running".to_string()),
        },
        Command::ReceiveStart => fs.receive_start(),
        Command::ReceiveStop => match fs.receive_stop() {
            true => Ok("receive stopped".to_string()),
            false => Err("no receive is running".to_string()),
        },
        Command::ReceiveRollback => match fs.receive_rollback().await {
            Ok(Some(name)) => Ok(format!("rolled back to snapshot {name:?}")),
            Ok(None) => Ok(
                "nothing was received: the live tree emptied, as before the \
                full receive that stopped half way"
                    .to_string(),
            ),
            Err(e) => Err(format!("rollback refused: {e}")),
        },
    }
}

/// The status text: `key value` lines.
pub fn status_text<D: BlockDevice>(fs: &NineFs<D>) -> String {
    let sb = fs.superblock();
    let stats = fs.stats();
    let (free, read_only, failed) = {
        let c = fs.engine.core.lock();
        (c.space.free_after_checkpoint(), c.read_only, c.failed)
    };
    let (log_used, log_size) = fs.log_usage();
    let state = if failed {
        "failed"
    } else if read_only {
        "read-only"
    } else {
        "read-write"
    };
    let mut s = String::new();
    let b = BLOCK_SIZE as u64;
    let _ = writeln!(s, "state {state}");
    let _ = writeln!(s, "size_bytes {}", sb.layout.total_blocks * b);
    let _ = writeln!(s, "free_bytes {}", free * b);
    let _ = writeln!(s, "device_bytes {}", fs.engine.dev.blocks() * b);
    let _ = writeln!(s, "log_used_bytes {} of {}", log_used * b, log_size * b);
    let _ = writeln!(s, "checkpoint {}", sb.checkpoint_seq);
    let _ = writeln!(s, "grows {}", stats.grows);
    let _ = writeln!(s, "snapshots {}", stats.snapshots);
    if stats.legs > 0 {
        let _ = writeln!(s, "legs {} failed {}", stats.legs, stats.failed_legs);
    }
    if let Some(r) = fs.rebuild_progress() {
        let _ = writeln!(
            s,
            "rebuild leg {} blocks {} of {} copied_bytes {} rate_bytes {}",
            r.place,
            r.cursor,
            r.total,
            r.copied * b,
            r.rate(fs.now())
        );
    }
    let _ = writeln!(s, "corruptions {}", stats.corruptions);
    match fs.scrub_report() {
        None => {
            let _ = writeln!(s, "scrub never");
        }
        Some(r) => {
            let state = match (fs.scrub_running(), r.complete) {
                (true, _) => "running",
                (false, true) => "complete",
                (false, false) => "stopped",
            };
            let _ = writeln!(
                s,
                "scrub {state} bytes {} errors {} skipped {}",
                r.bytes, r.error_count, r.skipped
            );
        }
    }
    let _ = writeln!(s, "scrub_runs {}", stats.scrub_runs);
    fs.stream_status(&mut s);
    s
}

impl<D: BlockDevice> vfs::Control for NineFs<D> {
    async fn control(&self, line: &str) -> Result<String, String> {
        let cmd = Command::parse(line).map_err(|e| e.to_string())?;
        let result = execute(self, &cmd).await;
        match &result {
            Ok(reply) => log::info!("ctl: {}: {reply}", line.trim()),
            Err(e) => log::warn!("ctl: {}: {e}", line.trim()),
        }
        result
    }

    fn status(&self) -> String {
        status_text(self)
    }

    fn scrub_report(&self) -> String {
        match NineFs::scrub_report(self) {
            Some(r) => r.to_string(),
            None => "state never\n".to_string(),
        }
    }

    async fn send_read(&self, offset: u64, buf: &mut [u8]) -> vfs::FsResult<usize> {
        NineFs::send_read(self, offset, buf).await
    }

    async fn receive_write(&self, offset: u64, data: &[u8]) -> vfs::FsResult<usize> {
        NineFs::receive_write(self, offset, data).await
    }

    fn receive_closed(&self) {
        NineFs::receive_closed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_by_their_words() {
        assert_eq!(Command::parse("sync\n"), Ok(Command::Sync));
        assert_eq!(Command::parse("  scrub   start "), Ok(Command::ScrubStart));
        assert_eq!(Command::parse("scrub stop"), Ok(Command::ScrubStop));
        assert_eq!(Command::parse("grow"), Ok(Command::Grow));
        assert_eq!(
            Command::parse("snapshot create nightly\n"),
            Ok(Command::SnapshotCreate("nightly".into()))
        );
        assert_eq!(
            Command::parse("snapshot delete nightly"),
            Ok(Command::SnapshotDelete("nightly".into()))
        );
        assert_eq!(Command::parse("snapshot list"), Ok(Command::SnapshotList));
        assert_eq!(Command::parse("quota list"), Ok(Command::QuotaList));
        assert_eq!(
            Command::parse("quota show /a"),
            Ok(Command::QuotaShow("/a".into()))
        );
        assert_eq!(
            Command::parse("quota set /a bytes=1G inodes=none"),
            Ok(Command::QuotaSet {
                path: "/a".into(),
                limits: vec!["bytes=1G".into(), "inodes=none".into()]
            })
        );
        assert!(Command::parse("quota set /a").is_err());
        assert_eq!(
            Command::parse("send start b"),
            Ok(Command::SendStart("b".into(), None))
        );
        assert_eq!(
            Command::parse("send start b from a\n"),
            Ok(Command::SendStart("b".into(), Some("a".into())))
        );
        assert_eq!(Command::parse("send stop"), Ok(Command::SendStop));
        assert_eq!(Command::parse("receive start"), Ok(Command::ReceiveStart));
        assert_eq!(Command::parse("receive stop"), Ok(Command::ReceiveStop));
        assert_eq!(
            Command::parse("receive rollback"),
            Ok(Command::ReceiveRollback)
        );
        for bad in ["send start b since a", "send start b from", "send start"] {
            assert_eq!(
                Command::parse(bad).unwrap_err().to_string(),
                "usage: send start ARG [from BASE]",
                "{bad}"
            );
        }
        assert_eq!(
            Command::parse("snapshot create"),
            Err(CommandError::Arguments(&["snapshot", "create"], 1))
        );
    }

    #[test]
    fn bad_lines_say_why() {
        assert_eq!(Command::parse(" \n"), Err(CommandError::Empty));
        let e = Command::parse("snapshot rename x").unwrap_err();
        assert!(matches!(e, CommandError::Unknown(_)));
        assert!(e.to_string().contains("scrub start"), "{e}");
        assert_eq!(
            Command::parse("scrub"),
            Err(CommandError::Unknown("scrub".into()))
        );
        assert_eq!(
            Command::parse("sync now"),
            Err(CommandError::Arguments(&["sync"], 0))
        );
        assert_eq!(
            Command::parse("scrub start 5").unwrap_err().to_string(),
            "scrub start takes 0 argument(s)"
        );
    }

    #[test]
    fn the_table_is_unambiguous() {
        for (i, a) in COMMANDS.iter().enumerate() {
            for b in &COMMANDS[i + 1..] {
                assert_ne!(a.words, b.words);
            }
            assert!(!a.help.is_empty());
        }
    }
}

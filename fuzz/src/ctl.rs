//! `ctl`: the administration command parser (`volume::control::Command::parse`) and
//! its executor (`NineFs::execute`) on the rich image: what a client with access to the
//! administration export's `ctl` file can write.
//!
//! Input: a flags byte, then text; each line (at most 16) is one command. Lines that
//! parse are executed in order unless flags bit 0 is set (parse only).
//!
//! Checked: no panic; every refusal prints; after the commands, the filesystem
//! unmounts cleanly and is fsck-clean.

use ninefs::surface::control::Command;

use crate::envelope::Envelope;
use crate::{block_on, images};

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let text = String::from_utf8_lossy(env.rest());
    let cmds: Vec<Command> = text
        .lines()
        .take(16)
        .filter_map(|l| match Command::parse(l) {
            Ok(c) => Some(c),
            Err(e) => {
                let _ = e.to_string();
                None
            }
        })
        .collect();
    if env.flags & 1 != 0 || cmds.is_empty() {
        return;
    }
    let fs = images::mount(images::rich_image()).expect("mount");
    for c in &cmds {
        let _ = block_on(fs.execute(c));
        let _ = fs.status_text();
    }
    // A scrub, a send or a receive started by a command is left to the unmount.
    let disk = block_on(fs.unmount()).expect("unmount after commands");
    let r = images::check(&disk.snapshot()).expect("fsck runs");
    assert!(
        r.is_clean(),
        "after {cmds:?}: {:?}",
        &r.errors[..r.errors.len().min(5)]
    );
}

/// Seeds: every command, valid and with wrong arguments.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let scripts: &[(&str, &str)] = &[
        ("snapshots", "snapshot create a\nsnapshot list\nsnapshot delete s1\nsnapshot create s1\nsnapshot delete a\n"),
        ("sync-scrub", "sync\nscrub start\nscrub stop\nscrub stop\n"),
        ("grow", "grow\n"),
        ("quota", "quota list\n"),
        ("send", "send start s1\nsend stop\nsend start s1 s1\nsend stop\n"),
        ("receive", "receive start\nreceive stop\nreceive rollback\n"),
        ("replace", "replace 0 nvme1\nreplace 7 x\n"),
        ("bad", "snapshot create\nsnapshot create ../x\nsnapshot create .snapshots\nunknown words\n\n   \nsend start a b c\n"),
    ];
    scripts
        .iter()
        .map(|(n, s)| (n.to_string(), [&[0u8][..], s.as_bytes()].concat()))
        .collect()
}

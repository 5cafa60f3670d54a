//! Access probes: a non-root or squashed client trying to gain root's uid or a group it
//! is not in, and a client outside an export's allow-list trying to attach.

use ninep::testing::{Client, Stat};
use ninep::wire::{open_flags, setattr};
use vfs::Errno;

use super::{fixture, Ctx, Outcome};
use crate::hostile::raw::attached;
use crate::ninep::Lossy;

/// The unprivileged user of the probes, in group [`USER`] only (`group=` below).
pub const USER: u32 = 1000;
/// uid and gid of squashed users (the exports' default anonymous identity).
pub const NOBODY: u32 = 65534;
/// An export that squashes every user.
pub const SQUASHED_EXPORT: &str = "squashed";
/// An export whose allow-list leaves the host (QEMU user networking: 10.0.2.2) out.
pub const LOCKED_EXPORT: &str = "locked";
/// The kernel options the access probes rely on: the whole filesystem at aname `""`,
/// the two exports above, and [`USER`]'s group.
pub const KERNEL_OPTIONS: &str =
    "export=:/ export=squashed:/:squash=all export=locked:/:allow=192.0.2.1/32 group=1000:1000";

const S_ISGID: u32 = 0o2000;

/// Checks that `st`, made by a client acting as `creator` (in `groups`) asking for gid 0,
/// is not in group 0 and not set-gid in a group the creator is not in.
fn no_escalation(out: &mut Outcome, what: &str, st: &Stat, groups: &[u32]) {
    out.check(st.gid != 0, || {
        format!("{what} got group 0 (uid {}, mode {:o})", st.uid, st.mode)
    });
    out.check(st.mode & S_ISGID == 0 || groups.contains(&st.gid), || {
        format!(
            "{what} is set-gid in group {}, which its creator is not in (mode {:o})",
            st.gid, st.mode
        )
    });
}

/// Creates `name` in directory fid 1 by each way 9P has (file, directory, node, symlink),
/// asking for gid 0 and set-gid, and checks each result.
fn create_everything(c: &mut Client<Lossy>, out: &mut Outcome, who: &str, groups: &[u32]) {
    let mode = 0o2755;
    let file = format!("{who}-file");
    let made = c
        .walk(1, 2, "")
        .and_then(|_| c.lcreate(2, &file, open_flags::RDWR, mode))
        .and_then(|_| c.getattr(2));
    match made {
        Ok(st) => no_escalation(out, &format!("{who}'s Tlcreate"), &st, groups),
        Err(e) => out.fail(format!("{who}: Tlcreate: {e}")),
    }
    let dir = format!("{who}-dir");
    let made = c
        .mkdir(1, &dir, mode)
        .and_then(|_| c.walk(1, 3, &dir))
        .and_then(|_| c.getattr(3));
    match made {
        Ok(st) => no_escalation(out, &format!("{who}'s Tmkdir"), &st, groups),
        Err(e) => out.fail(format!("{who}: Tmkdir: {e}")),
    }
    let node = format!("{who}-node");
    let made = c
        .mknod(1, &node, vfs::mode::S_IFREG | mode, 0, 0)
        .and_then(|_| c.walk(1, 4, &node))
        .and_then(|_| c.getattr(4));
    match made {
        Ok(st) => no_escalation(out, &format!("{who}'s Tmknod"), &st, groups),
        Err(e) => out.fail(format!("{who}: Tmknod: {e}")),
    }
    let link = format!("{who}-link");
    let made = c
        .symlink(1, &link, "target")
        .and_then(|_| c.walk(1, 5, &link))
        .and_then(|_| c.getattr(5));
    match made {
        Ok(st) => out.check(st.gid != 0, || format!("{who}'s Tsymlink got group 0")),
        Err(e) => out.fail(format!("{who}: Tsymlink: {e}")),
    }
    // Giving the file away to root, or to root's group, is not the user's to do.
    for (what, valid, uid, gid) in [
        ("chown to uid 0", setattr::UID, 0, 0),
        ("chgrp to gid 0", setattr::GID, 0, 0),
    ] {
        let got = c.setattr(2, valid, 0, uid, gid, 0);
        out.check(got == Err(Errno::EPERM), || {
            format!("{who}: {what} of its own file answered {got:?}, not EPERM")
        });
    }
    for fid in 2..=5 {
        let _ = c.clunk(fid);
    }
}

/// (f) uid 1000 (in group 1000 only) creates with gid 0 and mode 02755 in its own
/// directory and tries to give its file to root; a squashed root does the same in a
/// world-writable directory. Nobody ends up with root's uid or group 0, nor a set-gid
/// file in a group they are not in.
pub fn group_escalation(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    match attached(ctx.port, USER, "").and_then(|mut c| c.walk(0, 1, fixture::USER_DIR).map(|_| c))
    {
        Ok(mut c) => create_everything(&mut c, &mut out, "uid 1000", &[USER]),
        Err(e) => out.fail(format!(
            "uid 1000 could not attach and walk to its directory: {e}"
        )),
    }
    match attached(ctx.port, 0, SQUASHED_EXPORT) {
        Ok(mut c) => {
            let made = c
                .walk(0, 1, fixture::OPEN_DIR)
                .and_then(|_| c.walk(1, 2, ""))
                .and_then(|_| c.lcreate(2, "squashed-file", open_flags::RDWR, 0o2755))
                .and_then(|_| c.getattr(2));
            match made {
                Ok(st) => {
                    out.check(st.uid == NOBODY, || {
                        format!(
                            "a squashed root's file is owned by uid {}, not {NOBODY}",
                            st.uid
                        )
                    });
                    no_escalation(&mut out, "a squashed root's Tlcreate", &st, &[NOBODY]);
                    let got = c.setattr(2, setattr::UID, 0, 0, 0, 0);
                    out.check(got == Err(Errno::EPERM), || {
                        format!("a squashed root's chown to uid 0 answered {got:?}, not EPERM")
                    });
                }
                Err(e) => out.fail(format!("a squashed root could not create a file: {e}")),
            }
        }
        Err(e) => out.fail(format!(
            "attach to the squash=all export {SQUASHED_EXPORT:?}: {e} (is export= supported?)"
        )),
    }
    out
}

/// A client outside an export's `allow=` list cannot attach to it: `EACCES`.
pub fn allow_list(ctx: &Ctx<'_>) -> Outcome {
    let mut out = Outcome::default();
    match attached(ctx.port, 0, LOCKED_EXPORT) {
        Ok(_) => out.fail(format!(
            "a client outside {LOCKED_EXPORT:?}'s allow-list attached to it"
        )),
        Err(e) => {
            out.note("refused", 1);
            out.check(e == Errno::EACCES, || {
                format!("attach outside the allow-list answered {e}, not EACCES")
            });
        }
    }
    // Attaching where it is allowed still works on a new connection.
    out.check(attached(ctx.port, 0, "").is_ok(), || {
        "attach to the default export failed".into()
    });
    out
}

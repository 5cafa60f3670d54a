//! Access control through the test client over in-memory connections: export
//! allow-lists by client address, the implicit export, and the group rules of creates
//! and setattr (no user gets a group they are not in).

mod common;

use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use ninep::conn::Connection;
use ninep::server::{AccessConfig, Config, Export, Server};
use ninep::testing::Client;
use ninep::wire::{open_flags as of, setattr, Tmsg};
use vfs::Errno;

const RDWR: u32 = of::RDWR;

/// A client over an in-memory connection to a model-filesystem server.
type TestClient = Client<Local<Model>>;

/// A versioned client on a connection from `peer`.
fn client_from(server: &Arc<Server<Model>>, peer: &str) -> TestClient {
    let peer: IpAddr = peer.parse().unwrap();
    let mut c = Client::new(Local {
        conn: Connection::from_peer(server.clone(), peer),
    });
    c.version(1 << 20, b"9P2000.L").unwrap();
    c
}

/// A server configured as the kernel command line `options` say.
fn configured(options: &[(&str, &str)]) -> Arc<Server<Model>> {
    let mut access = AccessConfig::default();
    for (key, value) in options {
        match *key {
            "export" => access.add_export(value),
            "allow" => access.set_allow(value),
            "group" => access.add_group(value),
            _ => unreachable!("{key}"),
        }
        .unwrap();
    }
    model_server(access.server_config(Export::root(""), Config::default()))
}

#[test]
fn attach_checks_the_exports_allow_list() {
    let server = configured(&[
        ("export", "lan:/:allow=10.0.2.0/24"),
        ("export", "host:/:allow=10.0.2.2,fd00::/8"),
        ("export", "open:/:allow=any"),
        ("export", "default:/"),
        ("allow", "192.168.1.0/24"),
    ]);
    let mut host = client_from(&server, "10.0.2.2");
    host.attach(0, 0, "lan").unwrap();
    host.attach(1, 0, "host").unwrap();
    host.attach(2, 0, "open").unwrap();
    // `default` names no list: the server's `allow=` applies.
    assert_eq!(host.attach(3, 0, "default"), Err(Errno::EACCES));
    let mut neighbour = client_from(&server, "10.0.2.3");
    neighbour.attach(0, 0, "lan").unwrap();
    assert_eq!(neighbour.attach(1, 0, "host"), Err(Errno::EACCES));
    let mut far = client_from(&server, "192.168.1.20");
    far.attach(0, 0, "default").unwrap();
    assert_eq!(far.attach(1, 0, "lan"), Err(Errno::EACCES));
    let mut v6 = client_from(&server, "fd00::5");
    v6.attach(0, 0, "host").unwrap();
    // A dual-stack socket's IPv4 client is that IPv4 address.
    let mut mapped = client_from(&server, "::ffff:10.0.2.2");
    mapped.attach(0, 0, "host").unwrap();
    // An unknown address passes only an allow-all list.
    let mut unknown = client(&server);
    assert_eq!(unknown.attach(0, 0, "lan"), Err(Errno::EACCES));
    unknown.attach(0, 0, "open").unwrap();
    // Unknown export names stay ENOENT, and are not counted as refusals.
    assert_eq!(host.attach(4, 0, "nope"), Err(Errno::ENOENT));
    assert_eq!(server.stats().refused_attaches, 4);
    // Refused attaches bind nothing.
    assert_eq!(host.clunk(3), Err(Errno::EBADF));
}

#[test]
fn connections_only_from_addresses_some_export_allows() {
    let server = configured(&[
        ("export", "a:/:allow=10.0.2.0/24"),
        ("export", "b:/"),
        ("allow", "fd00::/8"),
    ]);
    let peer = |s: &str| Some(s.parse::<IpAddr>().unwrap());
    assert!(server.admit(peer("10.0.2.9")));
    assert!(server.admit(peer("fd00::1")));
    assert!(!server.admit(peer("10.0.3.1")));
    assert!(!server.admit(None));
    assert_eq!(server.stats().refused_connections, 2);
    // Whoever any export lets in is admitted.
    let open = model_server(Config::default());
    assert!(open.admit(None) && open.admit(peer("203.0.113.1")));
    assert_eq!(open.stats().refused_connections, 0);
}

#[test]
fn the_whole_filesystem_is_exported_only_while_no_export_is_named() {
    let implicit = configured(&[("allow", "10.0.2.2")]);
    assert_eq!(implicit.config().exports, vec![Export::root("")]);
    let mut c = client_from(&implicit, "10.0.2.2");
    c.attach(0, 0, "").unwrap();
    c.mkdir(0, "srv", 0o755).unwrap();
    let mut other = client_from(&implicit, "10.0.2.3");
    assert_eq!(other.attach(0, 0, ""), Err(Errno::EACCES));

    // Named exports: no implicit one, so aname "" is gone...
    let named = configured(&[("export", "admin:/"), ("export", "srv:/srv:ro")]);
    let mut c = client_from(&named, "10.0.2.2");
    assert_eq!(c.attach(0, 0, ""), Err(Errno::ENOENT));
    c.attach(0, 0, "admin").unwrap();
    let srv = c.mkdir(0, "srv", 0o755).unwrap();
    // ...and a path export is its directory, by name or by path.
    assert_eq!(c.attach(1, 0, "srv").unwrap(), srv);
    assert_eq!(c.attach(2, 0, "/srv").unwrap(), srv);
    assert_eq!(c.mkdir(1, "sub", 0o755), Err(Errno::EROFS));
    // ...unless an export has the empty name: then "" is that one, here a subtree.
    let subtree = configured(&[("export", "admin:/"), ("export", ":/pub")]);
    let mut c = client_from(&subtree, "10.0.2.2");
    assert_eq!(c.attach(0, 0, ""), Err(Errno::ENOENT), "no /pub yet");
    c.attach(0, 0, "admin").unwrap();
    let public = c.mkdir(0, "pub", 0o755).unwrap();
    assert_eq!(c.attach(1, 0, "").unwrap(), public);
}

#[test]
fn an_aname_selects_by_name_before_by_path() {
    let server = configured(&[
        ("export", "admin:/"),
        ("export", "data:/srv:allow=192.0.2.1"),
        ("export", "/srv:/srv:ro"),
    ]);
    let mut c = client_from(&server, "10.0.2.2");
    c.attach(0, 0, "admin").unwrap();
    c.mkdir(0, "srv", 0o755).unwrap();
    // "/srv" is the name of an export the host may use, and the path of one it may not.
    c.attach(1, 0, "/srv").unwrap();
    assert_eq!(
        c.mkdir(1, "x", 0o755),
        Err(Errno::EROFS),
        "the export named /srv"
    );
    assert_eq!(c.attach(2, 0, "data"), Err(Errno::EACCES));
}

/// The gid a non-root user asks for on each kind of create.
const FOREIGN_GID: u32 = 0;

/// Creates `name` in directory fid `dfid` by every request that names a gid: `Tlcreate`
/// (a regular file, through a fresh fid `spare`), `Tmkdir`, `Tmknod` (a FIFO) and
/// `Tsymlink`, each asking for group `gid` and bits `perm`.
fn create_all(c: &mut TestClient, dfid: u32, spare: u32, gid: u32, perm: u32) {
    c.walk(dfid, spare, "").unwrap();
    let names = ["file", "dir", "fifo", "link"].map(|kind| format!("{kind}-{gid}"));
    let requests = [
        Tmsg::Lcreate {
            fid: spare,
            name: names[0].as_bytes(),
            flags: RDWR,
            mode: perm,
            gid,
        },
        Tmsg::Mkdir {
            dfid,
            name: names[1].as_bytes(),
            mode: perm,
            gid,
        },
        Tmsg::Mknod {
            dfid,
            name: names[2].as_bytes(),
            mode: 0o010_000 | perm,
            major: 0,
            minor: 0,
            gid,
        },
        Tmsg::Symlink {
            fid: dfid,
            name: names[3].as_bytes(),
            target: b"file",
            gid,
        },
    ];
    for msg in &requests {
        c.rpc(msg).unwrap();
    }
    c.clunk(spare).unwrap();
}

/// `(uid, gid, mode)` of `path` under fid `dir`.
fn owner_of(c: &mut TestClient, dir: u32, path: &str) -> (u32, u32, u32) {
    c.walk(dir, 99, path).unwrap();
    let st = c.getattr(99).unwrap();
    c.clunk(99).unwrap();
    (st.uid, st.gid, st.mode)
}

/// A server with a world-writable directory `shared` owned `0:50`, uid 1001 in group
/// 100, uid 1000 in group 300 only (its groups known, none of the files'), and a client
/// for uid 1000 and one for root attached at fid 0.
fn shared_dir() -> (Arc<Server<Model>>, TestClient, TestClient) {
    let server = configured(&[("group", "1001:100"), ("group", "1000:300")]);
    let mut root = client(&server);
    root.attach(0, 0, "").unwrap();
    root.mkdir(0, "shared", 0o777).unwrap();
    root.walk(0, 1, "shared").unwrap();
    root.setattr(1, setattr::GID | setattr::MODE, 0o777, 0, 50, 0)
        .unwrap();
    let mut user = client(&server);
    user.attach(0, 1000, "").unwrap();
    (server, user, root)
}

#[test]
fn creates_never_give_a_user_a_group_they_are_not_in() {
    let (server, mut user, _root) = shared_dir();
    user.walk(0, 1, "shared").unwrap();
    // uid 1000 asks for root's group and a set-gid file.
    create_all(&mut user, 1, 2, FOREIGN_GID, 0o2755);
    for kind in ["file", "fifo", "link"] {
        let (uid, gid, mode) = owner_of(&mut user, 1, &format!("{kind}-0"));
        assert_eq!((uid, gid), (1000, 50), "{kind}: the directory's group");
        assert_eq!(mode & 0o2000, 0, "{kind}: no set-gid bit");
    }
    let (uid, gid, mode) = owner_of(&mut user, 1, "dir-0");
    assert_eq!((uid, gid, mode & 0o7777), (1000, 50, 0o755));

    // A member of group 100 gets it, set-gid included.
    let mut member = client(&server);
    member.attach(0, 1001, "").unwrap();
    member.walk(0, 1, "shared").unwrap();
    create_all(&mut member, 1, 2, 100, 0o2755);
    for kind in ["file", "fifo"] {
        let (_, gid, mode) = owner_of(&mut member, 1, &format!("{kind}-100"));
        assert_eq!((gid, mode & 0o7777), (100, 0o2755), "{kind}");
    }
    assert_eq!(owner_of(&mut member, 1, "link-100").1, 100);
    // mkdir takes no set-id bits from the request.
    assert_eq!(owner_of(&mut member, 1, "dir-100").2 & 0o7777, 0o755);
}

#[test]
fn root_names_any_group() {
    let (_server, _user, mut root) = shared_dir();
    create_all(&mut root, 1, 2, 4242, 0o2755);
    let (uid, gid, mode) = owner_of(&mut root, 1, "file-4242");
    assert_eq!((uid, gid, mode & 0o7777), (0, 4242, 0o2755));
    assert_eq!(owner_of(&mut root, 1, "fifo-4242").1, 4242);
}

#[test]
fn set_gid_directories_pass_their_group_on() {
    let (_server, mut user, mut root) = shared_dir();
    root.mkdir(1, "team", 0o777).unwrap();
    root.walk(1, 2, "team").unwrap();
    root.setattr(2, setattr::GID | setattr::MODE, 0o2777, 0, 100, 0)
        .unwrap();
    user.walk(0, 1, "shared/team").unwrap();
    create_all(&mut user, 1, 2, 1000, 0o2755);
    // The directory's group, but no set-gid file in a group its creator is not in.
    let (_, gid, mode) = owner_of(&mut user, 1, "file-1000");
    assert_eq!((gid, mode & 0o7777), (100, 0o755));
    // A new directory inherits group and set-gid bit.
    let (_, gid, mode) = owner_of(&mut user, 1, "dir-1000");
    assert_eq!((gid, mode & 0o7777), (100, 0o2755));
    assert_eq!(owner_of(&mut user, 1, "link-1000").1, 100);
}

#[test]
fn setattr_changes_groups_only_within_the_users_groups() {
    let (server, mut user, mut root) = shared_dir();
    let mut member = client(&server);
    member.attach(0, 1001, "").unwrap();
    member.walk(0, 1, "shared").unwrap();
    member.walk(1, 2, "").unwrap();
    member.lcreate(2, "mine", RDWR, 0o644).unwrap();
    // The file got the directory's group (gid 0 was asked for, 1001 is in 100 only).
    assert_eq!(member.getattr(2).unwrap().gid, 50);
    // The owner may give it to a group they are in, not to another one.
    assert_eq!(
        member.setattr(2, setattr::GID, 0, 0, 0, 0),
        Err(Errno::EPERM)
    );
    member.setattr(2, setattr::GID, 0, 0, 100, 0).unwrap();
    assert_eq!(member.getattr(2).unwrap().gid, 100);
    // Someone else may not, not even to the group it already has.
    user.walk(0, 1, "shared/mine").unwrap();
    assert_eq!(
        user.setattr(1, setattr::GID, 0, 0, 100, 0),
        Err(Errno::EPERM)
    );
    assert_eq!(
        user.setattr(1, setattr::UID, 0, 1001, 0, 0),
        Err(Errno::EPERM)
    );
    // Keeping one's own uid is no change; giving the file away is root's.
    member.setattr(2, setattr::UID, 0, 1001, 0, 0).unwrap();
    assert_eq!(
        member.setattr(2, setattr::UID, 0, 1000, 0, 0),
        Err(Errno::EPERM)
    );
    // chmod g+s: kept for a member of the file's group...
    member.setattr(2, setattr::MODE, 0o2755, 0, 0, 0).unwrap();
    assert_eq!(member.getattr(2).unwrap().mode & 0o7777, 0o2755);
    // ...cleared when the same request moves it to a group the user is not in (root
    // moves it here; the owner is not in 50 any more than in 0)...
    root.walk(1, 3, "mine").unwrap();
    root.setattr(3, setattr::GID, 0, 0, 50, 0).unwrap();
    member.setattr(2, setattr::MODE, 0o2755, 0, 0, 0).unwrap();
    assert_eq!(member.getattr(2).unwrap().mode & 0o7777, 0o755);
    // ...and kept for root, whatever the group.
    root.setattr(3, setattr::MODE, 0o2755, 0, 0, 0).unwrap();
    assert_eq!(root.getattr(3).unwrap().mode & 0o7777, 0o2755);
    // Moving to one's group and setting set-gid in one request works.
    member
        .setattr(2, setattr::GID | setattr::MODE, 0o2750, 0, 100, 0)
        .unwrap();
    let st = member.getattr(2).unwrap();
    assert_eq!((st.gid, st.mode & 0o7777), (100, 0o2750));
}

#[test]
fn squashed_users_create_as_the_anonymous_group() {
    let server = configured(&[
        ("export", "pub:/:squash=all:anonuid=4000:anongid=4001"),
        ("export", "admin:/"),
    ]);
    let mut admin = client(&server);
    admin.attach(0, 0, "admin").unwrap();
    admin.setattr(0, setattr::MODE, 0o777, 0, 0, 0).unwrap();
    let mut c = client(&server);
    c.attach(0, 1000, "pub").unwrap();
    c.walk(0, 1, "").unwrap();
    c.rpc(&Tmsg::Lcreate {
        fid: 1,
        name: b"f",
        flags: RDWR,
        mode: 0o2644,
        gid: 0,
    })
    .unwrap();
    // The anonymous group, in which the squashed user may keep set-gid.
    let st = c.getattr(1).unwrap();
    assert_eq!((st.uid, st.gid, st.mode & 0o7777), (4000, 4001, 0o2644));
}

#[test]
fn writes_truncates_and_chowns_drop_set_id_bits() {
    let (_server, mut user, mut root) = shared_dir();
    // A root-owned set-uid, set-gid, world-writable program in `shared`.
    root.walk(1, 2, "").unwrap();
    root.lcreate(2, "prog", RDWR, 0o6777).unwrap();
    root.clunk(2).unwrap();
    assert_eq!(owner_of(&mut root, 1, "prog").2 & 0o7777, 0o6777);
    // A write by uid 1000 drops both bits (group-executable), whatever the client asks.
    user.walk(0, 1, "shared/prog").unwrap();
    user.lopen(1, RDWR).unwrap();
    user.write(1, 0, b"#!/bin/sh\nid\n").unwrap();
    assert_eq!(owner_of(&mut root, 1, "prog").2 & 0o7777, 0o777);
    // Root's own writes keep them.
    root.walk(1, 3, "prog").unwrap();
    root.setattr(3, setattr::MODE, 0o6777, 0, 0, 0).unwrap();
    root.lopen(3, RDWR).unwrap();
    root.write(3, 0, b"x").unwrap();
    assert_eq!(owner_of(&mut root, 1, "prog").2 & 0o7777, 0o6777);
    // A truncate by uid 1000 drops them.
    user.setattr(1, setattr::SIZE, 0, 0, 0, 1).unwrap();
    assert_eq!(owner_of(&mut root, 1, "prog").2 & 0o7777, 0o777);
    // A chown of a regular file drops them, even by root.
    root.setattr(3, setattr::MODE, 0o4755, 0, 0, 0).unwrap();
    root.setattr(3, setattr::UID, 0, 1000, 0, 0).unwrap();
    assert_eq!(owner_of(&mut root, 1, "prog"), (1000, 0, 0o100_755));
}

/// `chmod` of `path` under fid `dir` to `mode` by `c` (through fid 98); the permission
/// bits it then has.
fn chmod(c: &mut TestClient, dir: u32, path: &str, mode: u32) -> u32 {
    c.walk(dir, 98, path).unwrap();
    c.setattr(98, setattr::MODE, mode, 0, 0, 0).unwrap();
    let st = c.getattr(98).unwrap();
    c.clunk(98).unwrap();
    st.mode & 0o7777
}

/// pjdfstest `chmod` (`clear_isgid_bit`): a user the server has no `group=` entry for
/// chmods its own file, of its own primary group, to 02755. 9P2000.L's `Tsetattr`
/// carries no groups, so only the client knows the user is in that group; Linux's
/// client clears the bit itself when the caller is not (`setattr_prepare`), so the
/// server stores the mode it is sent. A user whose groups are configured is still
/// checked by the server.
#[test]
fn chmod_by_a_user_whose_groups_the_server_does_not_know_keeps_what_the_client_sent() {
    let server = configured(&[("group", "1001:100")]);
    let mut root = client(&server);
    root.attach(0, 0, "").unwrap();
    root.mkdir(0, "home", 0o777).unwrap();
    root.walk(0, 1, "home").unwrap();
    let mut user = client(&server);
    user.attach(0, 2000, "").unwrap();
    user.walk(0, 1, "home").unwrap();
    user.walk(1, 2, "").unwrap();
    user.lcreate(2, "own", RDWR, 0o644).unwrap();
    user.mkdir(1, "own-dir", 0o755).unwrap();
    // Its primary group 2000, which the server knows nothing about.
    root.walk(1, 2, "own").unwrap();
    root.setattr(2, setattr::GID, 0, 0, 2000, 0).unwrap();
    root.walk(1, 3, "own-dir").unwrap();
    root.setattr(3, setattr::GID, 0, 0, 2000, 0).unwrap();
    assert_eq!(chmod(&mut user, 1, "own", 0o2755), 0o2755);
    assert_eq!(chmod(&mut user, 1, "own-dir", 0o2775), 0o2775);
    // The same request from uid 1001, whose groups are configured (100 only), on a
    // file of group 2000: the server knows it is not a member.
    root.setattr(2, setattr::UID | setattr::MODE, 0o644, 1001, 0, 0)
        .unwrap();
    let mut member = client(&server);
    member.attach(0, 1001, "").unwrap();
    member.walk(0, 1, "home").unwrap();
    assert_eq!(chmod(&mut member, 1, "own", 0o2755), 0o755);
}

#[test]
fn chmod_keeps_set_gid_only_for_root_and_members_of_the_files_group() {
    let (server, mut user, mut root) = shared_dir();
    let mut member = client(&server);
    member.attach(0, 1001, "").unwrap();
    user.walk(0, 1, "shared").unwrap();
    member.walk(0, 1, "shared").unwrap();
    // uid 1000's file and directory get the directory's group 50, which it is not in.
    user.walk(1, 2, "").unwrap();
    user.lcreate(2, "theirs", RDWR, 0o644).unwrap();
    user.mkdir(1, "their-dir", 0o755).unwrap();
    // uid 1001's, given to its group 100.
    member.walk(1, 2, "").unwrap();
    member.lcreate(2, "ours", RDWR, 0o644).unwrap();
    member.setattr(2, setattr::GID, 0, 0, 100, 0).unwrap();
    member.mkdir(1, "our-dir", 0o755).unwrap();
    member.walk(1, 3, "our-dir").unwrap();
    member.setattr(3, setattr::GID, 0, 0, 100, 0).unwrap();
    for (file, dir) in [("theirs", "their-dir"), ("ours", "our-dir")] {
        assert_eq!(owner_of(&mut root, 1, file).1 == 100, file == "ours");
        assert_eq!(owner_of(&mut root, 1, dir).1 == 100, dir == "our-dir");
    }

    // The owner, not in the group: chmod g+s goes through without the bit, for a file
    // and a directory alike (Linux's setattr_copy).
    assert_eq!(chmod(&mut user, 1, "theirs", 0o2755), 0o755);
    assert_eq!(chmod(&mut user, 1, "their-dir", 0o2775), 0o775);
    // Set-uid is not a group matter: it stays.
    assert_eq!(chmod(&mut user, 1, "theirs", 0o6755), 0o4755);
    // The owner in the group keeps it.
    assert_eq!(chmod(&mut member, 1, "ours", 0o2755), 0o2755);
    assert_eq!(chmod(&mut member, 1, "our-dir", 0o2775), 0o2775);
    // Root keeps it on anything, in any group.
    assert_eq!(chmod(&mut root, 1, "theirs", 0o2755), 0o2755);
    assert_eq!(chmod(&mut root, 1, "their-dir", 0o2775), 0o2775);
    // A directory that got set-gid and group 100 from its parent: its owner, not in
    // 100, loses the bit on any chmod that restates it (GNU chmod restates a
    // directory's set-gid bit), as on Linux.
    root.walk(1, 4, "our-dir").unwrap();
    root.setattr(4, setattr::MODE, 0o2777, 0, 0, 0).unwrap();
    user.walk(1, 5, "our-dir").unwrap();
    user.mkdir(5, "inherited", 0o755).unwrap();
    let (uid, gid, mode) = owner_of(&mut user, 5, "inherited");
    assert_eq!((uid, gid, mode & 0o7777), (1000, 100, 0o2755));
    assert_eq!(chmod(&mut user, 5, "inherited", 0o2750), 0o750);
    // A request that does not set the mode leaves the bit alone.
    user.walk(5, 6, "inherited").unwrap();
    root.walk(4, 7, "inherited").unwrap();
    root.setattr(7, setattr::MODE, 0o2755, 0, 0, 0).unwrap();
    user.setattr(6, setattr::ATIME | setattr::MTIME, 0, 0, 0, 0)
        .unwrap();
    assert_eq!(owner_of(&mut user, 5, "inherited").2 & 0o7777, 0o2755);
}

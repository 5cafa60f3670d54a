//! The administration export over in-memory connections: the synthetic tree's files,
//! commands written to `ctl` (replies and errors read back), scrub status, the
//! allow-list, and that the real tree neither shows nor reaches it.

mod common;

use std::net::IpAddr;
use std::sync::Arc;

use block::MemDisk;
use common::*;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs, ScrubProgress};
use ninep::admin::AdminFs;
use ninep::conn::Connection;
use ninep::server::{AccessConfig, Config, Export, Server};
use ninep::testing::Client;
use ninep::wire::open_flags as of;
use vfs::Errno;

type Fs = AdminFs<NineFs<MemDisk>>;

fn server() -> Arc<Server<Fs>> {
    let disk = MemDisk::new(4096, 8192);
    pollster::block_on(format(&disk, &FormatOptions::default())).unwrap();
    let fs = pollster::block_on(NineFs::mount(
        disk,
        MountOptions::default(),
        Box::new(Ticks::default()),
    ))
    .unwrap();
    let mut access = AccessConfig::default();
    access.set_admin_allow("10.0.2.2").unwrap();
    let config = access.server_config(Export::root(""), Config::default());
    Arc::new(Server::new(AdminFs::new(fs), config))
}

fn client_from(server: &Arc<Server<Fs>>, peer: &str) -> Client<Local<Fs>> {
    let peer: IpAddr = peer.parse().unwrap();
    let mut c = Client::new(Local {
        conn: Connection::from_peer(server.clone(), peer),
    });
    c.version(1 << 20, b"9P2000.L").unwrap();
    c
}

/// Reads the whole of `path` in the admin export attached at fid 0.
fn read(c: &mut Client<Local<Fs>>, path: &str) -> String {
    c.walk(0, 9, path).unwrap();
    c.lopen(9, of::RDONLY).unwrap();
    let data = c.read(9, 0, 65536).unwrap();
    c.clunk(9).unwrap();
    String::from_utf8(data).unwrap()
}

/// The names in directory `fid`.
fn list(c: &mut Client<Local<Fs>>, fid: u32) -> Vec<String> {
    c.walk(fid, 20, "").unwrap();
    c.lopen(20, of::RDONLY).unwrap();
    let entries = c.readdir_all(20, 4096).unwrap();
    c.clunk(20).unwrap();
    entries
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

/// Writes `command` to `ctl`.
fn command(c: &mut Client<Local<Fs>>, command: &str) -> Result<u32, Errno> {
    c.walk(0, 8, "ctl").unwrap();
    c.lopen(8, of::WRONLY | of::TRUNC).unwrap();
    let r = c.write(8, 0, command.as_bytes());
    c.clunk(8).unwrap();
    r
}

#[test]
fn ctl_runs_commands_and_status_files_report() {
    let server = server();
    let mut c = client_from(&server, "10.0.2.2");
    c.attach(0, 0, "ctl").unwrap();
    assert_eq!(
        list(&mut c, 0),
        [".", "..", "ctl", "status", "scrub", "send", "receive"]
    );
    assert!(read(&mut c, "status").contains("state read-write"));
    assert_eq!(read(&mut c, "scrub"), "state never\n");

    assert_eq!(command(&mut c, "sync\n"), Ok(5));
    assert_eq!(read(&mut c, "ctl"), "synced\n");
    assert_eq!(command(&mut c, "scrub start\n"), Ok(12));
    assert!(read(&mut c, "status").contains("scrub running"));
    // The owner runs the pass (the appliance in the background).
    let fs = server.fs().inner();
    while pollster::block_on(fs.scrub_step(1 << 20)).unwrap() == ScrubProgress::Running {}
    assert!(read(&mut c, "status").contains("scrub complete bytes"));
    let report = read(&mut c, "scrub");
    assert!(report.starts_with("state complete\n"), "{report}");
    assert!(report.contains("errors 0\n"), "{report}");
    assert_eq!(command(&mut c, "grow"), Ok(4));
    assert!(read(&mut c, "ctl").starts_with("not grown"));

    // Snapshots by command.
    assert!(command(&mut c, "snapshot create x").is_ok());
    assert!(read(&mut c, "ctl").starts_with("created snapshot 1 \"x\""));
    assert!(command(&mut c, "snapshot create x").is_err(), "EEXIST");
    assert!(read(&mut c, "ctl").starts_with("error: failed: EEXIST"));
    // A bad command is EINVAL, and ctl says why.
    assert_eq!(command(&mut c, "snapshot rename x"), Err(Errno::EINVAL));
    assert!(read(&mut c, "ctl").starts_with("error: unknown command"));
    assert_eq!(command(&mut c, "scrub stop"), Err(Errno::EINVAL));
    assert_eq!(read(&mut c, "ctl"), "error: no scrub pass is running\n");
    // The status files are read-only; nothing can be made in the tree.
    c.walk(0, 7, "status").unwrap();
    // (root passes the permission bits; the tree refuses the write itself)
    c.lopen(7, of::WRONLY).unwrap();
    assert_eq!(c.write(7, 0, b"x"), Err(Errno::EACCES));
    assert!(c.lcreate(0, "x", of::RDWR, 0o644).is_err());
}

#[test]
fn only_the_allow_list_reaches_it_and_the_real_tree_does_not_show_it() {
    let server = server();
    let mut other = client_from(&server, "10.0.2.3");
    assert_eq!(other.attach(0, 0, "ctl"), Err(Errno::EACCES));
    // The real tree: no trace of the admin files, `..` stays at the root.
    other.attach(1, 0, "").unwrap();
    assert_eq!(other.walk(1, 2, "ctl"), Err(Errno::ENOENT));
    assert_eq!(list(&mut other, 1), [".", ".."]);
    // From the admin root, `..` stays there too.
    let mut admin = client_from(&server, "10.0.2.2");
    let root = admin.attach(0, 0, "ctl").unwrap();
    let qids = admin.walk(0, 1, "..").unwrap();
    assert_eq!(qids[0], root);
}

//! `O_APPEND` writes from several connections at once, on the real filesystem over a
//! device whose every request yields (so the requests of both connections interleave at
//! each device access): no record overwrites another.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use block::MemDisk;
use block::YieldDisk;
use common::*;
use ninefs::volume::{format, FormatOptions, MountOptions, NineFs};
use ninep::conn::Connection;
use ninep::server::{Config, Server};
use ninep::wire::{open_flags as of, Data, Tmsg};

type Fs = NineFs<YieldDisk<MemDisk>>;

/// Records per connection, all sent at once (so they are in flight together).
const RECORDS: usize = 24;
/// Record length: not a block multiple, so appends share blocks.
const RECORD_LEN: usize = 1500;

fn server() -> Arc<Server<Fs>> {
    let disk = MemDisk::new(4096, 16 * 1024);
    let opts = FormatOptions {
        secret: 7,
        ..FormatOptions::default()
    };
    pollster::block_on(format(&disk, &opts)).unwrap();
    let fs = pollster::block_on(NineFs::mount(
        YieldDisk::new(disk),
        MountOptions::default(),
        Box::new(Ticks::default()),
    ))
    .unwrap();
    Arc::new(Server::new(fs, Config::default()))
}

/// A connection whose fid 1 is `/log` opened with `O_APPEND` (created if missing).
fn appender(server: &Arc<Server<Fs>>) -> Connection<Fs> {
    let mut c = client(server);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "log", of::WRONLY | of::CREATE | of::APPEND, 0o644)
        .unwrap();
    c.io.conn
}

/// Drives a connection in memory like [`Local`], but polls until the reply is there
/// (requests that reach the device take several polls on a [`YieldDisk`]).
struct Patient(Connection<Fs>);

impl ninep::testing::Exchange for Patient {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        assert_eq!(self.0.receive(request), request.len(), "request taken");
        for _ in 0..10_000 {
            poll(&mut self.0);
            if let Some(reply) = self.0.take_output() {
                return reply;
            }
        }
        panic!("no reply");
    }
}

/// Record `i` of connection `conn`: its name, padded to [`RECORD_LEN`].
fn record(conn: usize, i: usize) -> Vec<u8> {
    let mut r = format!("<conn {conn} record {i:03}>").into_bytes();
    r.resize(RECORD_LEN, b'.');
    r
}

#[test]
fn appends_from_two_connections_never_overwrite_each_other() {
    let server = server();
    let mut conns = [appender(&server), appender(&server)];
    for (c, conn) in conns.iter_mut().enumerate() {
        for i in 0..RECORDS {
            let data = record(c, i);
            // The offset is ignored for an O_APPEND fid.
            let req = frame(
                i as u16,
                Tmsg::Write {
                    fid: 1,
                    offset: 0,
                    data: Data(&data),
                },
            );
            assert_eq!(conn.receive(&req), req.len());
        }
    }
    let mut answered = 0;
    for _ in 0..100_000 {
        if answered == 2 * RECORDS {
            break;
        }
        for conn in conns.iter_mut() {
            poll(conn);
            for (tag, ty) in replies(conn) {
                assert_eq!(ty, 119, "tag {tag}: not an Rwrite");
                answered += 1;
            }
        }
    }
    assert_eq!(answered, 2 * RECORDS, "the appends did not finish");
    assert_eq!(server.stats().writes, 2 * RECORDS as u64);
    // The file is the records, each exactly once, none torn.
    let mut c = ninep::testing::Client::new(Patient(Connection::new(server.clone())));
    c.version(1 << 20, b"9P2000.L").unwrap();
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "log").unwrap();
    c.lopen(1, of::RDONLY).unwrap();
    let size = c.getattr(1).unwrap().size;
    assert_eq!(size, (2 * RECORDS * RECORD_LEN) as u64, "records were lost");
    let mut content = Vec::new();
    while (content.len() as u64) < size {
        let chunk = c.read(1, content.len() as u64, 64 * 1024).unwrap();
        assert!(!chunk.is_empty());
        content.extend(chunk);
    }
    let found: BTreeSet<Vec<u8>> = content.chunks(RECORD_LEN).map(|r| r.to_vec()).collect();
    let expected: BTreeSet<Vec<u8>> = (0..2)
        .flat_map(|conn| (0..RECORDS).map(move |i| record(conn, i)))
        .collect();
    assert!(found == expected, "records torn or duplicated");
}

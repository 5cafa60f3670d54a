//! `receive`: a snapshot stream received (`NineFs::receive`: the whole-stream check,
//! then the apply) into a small filesystem, which is then walked, unmounted and
//! checked. A stream can come from anywhere a backup can (F4 of issue 40).
//!
//! Input: a flags byte, then the stream. Unless flags bit 0 is set, every whole
//! record's chained checksum is resealed and, with bit 2 clear, the END record's count
//! too. Bit 1 selects the target: clear, an empty filesystem (for full streams); set,
//! one that received the seeds' base snapshot `s1` (for incrementals).
//!
//! Checked: no panic, no hang; a refused stream leaves the live tree as it was, and the
//! filesystem is fsck-clean after a clean unmount whatever the stream did (gated while
//! F4 is open).

use std::sync::OnceLock;

use block::MemDisk;

use crate::envelope::Envelope;
use crate::{block_on, images, reseal, walk};

/// The source's streams: the full stream of `s1` and the incremental `s1` -> `s2`.
fn streams() -> &'static (Vec<u8>, Vec<u8>) {
    static S: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    S.get_or_init(|| {
        let fs = images::mount(images::rich_image()).expect("mount");
        block_on(async {
            fs.snapshot_create("s2").await.unwrap();
            let send = |name: &'static str, base: Option<&'static str>| {
                let fs = &fs;
                async move {
                    let mut out = Vec::new();
                    fs.send(name, base, &mut |b: &[u8]| {
                        out.extend_from_slice(b);
                        Ok(())
                    })
                    .await
                    .unwrap();
                    out
                }
            };
            (send("s1", None).await, send("s2", Some("s1")).await)
        })
    })
}

/// An image that received `s1` (the base of the incremental), cleanly unmounted.
fn base_image() -> Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let fs = images::mount(images::empty_image()).expect("mount");
        block_on(fs.receive(&streams().0)).expect("the full stream is received");
        block_on(fs.unmount()).expect("unmount").snapshot()
    })
    .clone()
}

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let f = env.flags;
    let mut stream = env.rest().to_vec();
    if f & 1 == 0 {
        reseal::stream(&mut stream, f & 4 == 0);
    }
    let img = if f & 2 != 0 {
        base_image()
    } else {
        images::empty_image()
    };
    let fs = images::mount(img).expect("the target mounts");
    let before = block_on(walk::walk(&fs));
    let result = block_on(fs.receive(&stream));
    let after = block_on(walk::walk(&fs));
    if result.is_err() {
        assert_eq!(
            before, after,
            "a refused stream ({result:?}) changed the live tree"
        );
    }
    let disk: MemDisk = block_on(fs.unmount()).expect("unmount after a receive");
    let r = images::check(&disk.snapshot()).expect("fsck runs");
    assert!(
        r.is_clean(),
        "after a receive ({result:?}): {:?}",
        &r.errors[..r.errors.len().min(5)]
    );
}

/// Seeds: the full stream (into an empty filesystem) and the incremental (into one
/// holding its base), and each into the other target (refused).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let (full, incr) = streams();
    let with = |flags: u8, s: &[u8]| [&[flags][..], s].concat();
    vec![
        ("full".into(), with(0, full)),
        ("incremental".into(), with(2, incr)),
        ("full-onto-base".into(), with(2, full)),
        ("incremental-onto-empty".into(), with(0, incr)),
    ]
}

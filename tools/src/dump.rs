//! `ninefold dump`: print the superblock and the snapshots, a tree's nodes and items, or
//! one inode's items. A reader that stops reading (`ninefold dump IMAGE | head`) ends
//! the dump quietly.

use std::io::{self, Write};
use std::path::PathBuf;

use clap::Args;
use fsck::inspect::{describe_item, describe_snapshot, Image};
use ninefs::format::superblock::NodePtr;
use ninefs::format::{Key, TreeId};

use crate::image;

/// Arguments of `ninefold dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The image file, or the legs of a mirrored volume (any order; legs may be missing).
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Print this tree's nodes and items: fs, extent, csum or log.
    #[arg(long)]
    pub tree: Option<String>,
    /// Print the items of this inode (from the fs tree).
    #[arg(long)]
    pub inode: Option<u64>,
}

/// Why a dump stopped early.
#[derive(Debug)]
enum Stop {
    /// Writing the output failed (a reader that went away: `BrokenPipe`).
    Output(io::Error),
    /// The image could not be read.
    Image(String),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Stop {
        Stop::Output(e)
    }
}

impl From<String> for Stop {
    fn from(e: String) -> Stop {
        Stop::Image(e)
    }
}

/// Runs `dump`.
pub fn run(args: DumpArgs) -> Result<(), String> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    match dump(&args, &mut out).and_then(|()| Ok(out.flush()?)) {
        Ok(()) => Ok(()),
        // The reader has what it wanted (`| head`): not an error.
        Err(Stop::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(Stop::Output(e)) => Err(format!("writing the dump: {e}")),
        Err(Stop::Image(e)) => Err(e),
    }
}

fn dump(args: &DumpArgs, out: &mut impl Write) -> Result<(), Stop> {
    let disk = image::open_volume(&args.images, false)?;
    let img = pollster::block_on(Image::open(&disk)).map_err(|e| e.to_string())?;
    print_superblock(&img, out)?;
    for (id, snap) in pollster::block_on(img.snapshots())? {
        writeln!(out, "  {}", describe_snapshot(id, &snap))?;
    }
    if let Some(name) = &args.tree {
        let tree = TreeId::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| format!("unknown tree {name:?} (fs, extent, csum, log)"))?;
        pollster::block_on(walk(&img, tree, None, out))?;
    }
    if let Some(ino) = args.inode {
        pollster::block_on(walk(&img, TreeId::Fs, Some(ino), out))?;
    }
    Ok(())
}

fn print_superblock<D: block::BlockDevice>(img: &Image<D>, out: &mut impl Write) -> io::Result<()> {
    let sb = &img.sb;
    let l = sb.layout;
    writeln!(
        out,
        "superblock: generation {} checkpoint {} {}",
        sb.generation,
        sb.checkpoint_seq,
        if img.clean() { "clean" } else { "not clean" }
    )?;
    writeln!(
        out,
        "  label {:?} uuid {} node size {} blocks {} groups {} log {}+{} free {} inodes {} next_ino {} mounts {}",
        String::from_utf8_lossy(sb.label_bytes()),
        sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        sb.node_size,
        l.total_blocks,
        l.groups,
        l.log_start,
        l.log_blocks,
        sb.free_blocks,
        sb.inode_count,
        sb.next_ino,
        sb.mount_count
    )?;
    if sb.leg_count() > 0 {
        use ninefs::format::superblock::leg;
        let states: Vec<&str> = sb.legs[..sb.leg_count()]
            .iter()
            .map(|&s| match s {
                leg::ACTIVE => "active",
                leg::REBUILDING => "rebuilding",
                _ => "failed",
            })
            .collect();
        writeln!(out, "  legs: {}", states.join(" "))?;
    }
    for tree in TreeId::ALL {
        let r = sb.root(tree);
        writeln!(
            out,
            "  {} root: block {} ({} blocks committed), level {}",
            tree.name(),
            r.ptr.addr,
            r.ptr.blocks,
            r.level
        )?;
    }
    Ok(())
}

/// Prints a tree depth-first; with `only`, just that inode's items (and no node lines).
async fn walk<D: block::BlockDevice>(
    img: &Image<D>,
    tree: TreeId,
    only: Option<u64>,
    out: &mut impl Write,
) -> io::Result<()> {
    let root = img.sb.root(tree);
    if root.ptr.addr == 0 {
        writeln!(out, "{} tree: empty", tree.name())?;
        return Ok(());
    }
    let mut stack: Vec<(u8, NodePtr)> = vec![(root.level, root.ptr)];
    // Each node once, however often a forged tree points to it.
    let mut seen = std::collections::BTreeSet::new();
    while let Some((level, ptr)) = stack.pop() {
        if !seen.insert(ptr.addr) {
            writeln!(out, "node at block {}: referenced again", ptr.addr)?;
            continue;
        }
        let node = match img.read_node(tree, level, ptr).await {
            Ok(n) => n,
            Err(e) => {
                writeln!(out, "node at block {}: {e:?}", ptr.addr)?;
                continue;
            }
        };
        if only.is_none() {
            writeln!(
                out,
                "node block {} level {} committed {} blocks, {} keys, {} bytes of keys",
                ptr.addr,
                level,
                ptr.blocks,
                node.live_count(),
                node.live_bytes()
            )?;
        }
        let entries: Vec<(Key, Vec<u8>)> = node
            .iter_from(&Key::MIN)
            .map(|(k, v)| (k, v.to_vec()))
            .collect();
        if level > 0 {
            for (sep, v) in entries.iter().rev() {
                if let Some(child) = NodePtr::from_bytes(v) {
                    let next_is_relevant = only.is_none_or(|ino| sep.objectid <= ino);
                    if next_is_relevant {
                        stack.push((level - 1, child));
                    }
                }
            }
            continue;
        }
        for (k, v) in entries {
            if only.is_none_or(|ino| k.objectid == ino) {
                writeln!(out, "  {}", describe_item(tree, &k, &v))?;
            }
        }
    }
    Ok(())
}

//! Opening image files for the subcommands: one image, or the legs of a mirrored
//! volume (`ninefold mkfs A.img B.img`), put in place by their labels, in any order and
//! with legs missing.

use std::path::{Path, PathBuf};

use block::{BlockDevice, FileDisk, MirrorDisk};
use ninefs::format::label::{DeviceLabel, LABEL_BLOCK};
use ninefs::format::BLOCK_SIZE;
use ninefs::io::Dev;

/// What the subcommands mount: the legs of a volume (one, for a plain image).
pub type Volume = MirrorDisk<FileDisk>;

/// The label in block 0 of `disk`, if it is a leg of a mirrored volume.
pub fn label(disk: &FileDisk, path: &Path) -> Result<Option<DeviceLabel>, String> {
    let dev = Dev::new(disk).map_err(|e| format!("{}: {e:?}", path.display()))?;
    let mut buf = vec![0u8; BLOCK_SIZE];
    pollster::block_on(dev.read(LABEL_BLOCK, &mut buf))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    DeviceLabel::decode(&buf).map_err(|e| format!("{}: device label: {e:?}", path.display()))
}

/// Opens the images of one volume: a plain image, or legs of a mirrored volume (each
/// put in the place its label names; places not given are missing, and said so).
pub fn open_volume(paths: &[PathBuf], writable: bool) -> Result<Volume, String> {
    let mut legs: Vec<Option<FileDisk>> = Vec::new();
    let mut volume: Option<[u8; 16]> = None;
    for path in paths {
        let disk = open(path, writable)?;
        let Some(l) = label(&disk, path)? else {
            if paths.len() > 1 {
                return Err(format!(
                    "{}: not a leg of a mirrored volume",
                    path.display()
                ));
            }
            return MirrorDisk::new(vec![Some(disk)]).map_err(|e| e.to_string());
        };
        if volume.is_some_and(|u| u != l.uuid || legs.len() != l.legs as usize) {
            return Err(format!("{}: a leg of another volume", path.display()));
        }
        volume = Some(l.uuid);
        legs.resize_with(l.legs as usize, || None);
        let place = &mut legs[l.place as usize];
        if place.is_some() {
            return Err(format!("{}: leg {} given twice", path.display(), l.place));
        }
        *place = Some(disk);
    }
    for (i, _) in legs.iter().enumerate().filter(|(_, l)| l.is_none()) {
        eprintln!(
            "ninefold: leg {i} of {} missing: the others serve",
            legs.len()
        );
    }
    MirrorDisk::new(legs).map_err(|e| e.to_string())
}

/// How `ctl replace LEG PATH` opens PATH for `ninefold serve`: an image file (made
/// beforehand, e.g. `truncate -s`, no smaller than the volume), never one of the
/// volume's own (`in_use`).
pub fn leg_opener(in_use: &[PathBuf]) -> block::Opener<FileDisk> {
    let in_use: Vec<PathBuf> = in_use
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    block::Opener(Box::new(move |name: String| {
        let path = PathBuf::from(&name);
        let opened = match path.canonicalize() {
            Ok(c) if in_use.contains(&c) => Err(format!("{name}: an image of the volume")),
            Ok(_) => open(&path, true),
            Err(e) => Err(format!("{name}: {e}")),
        };
        Box::pin(async move { opened })
    }))
}

/// Writes each leg's label (after mkfs of a mirrored volume of `uuid`).
pub fn write_labels(legs: &[FileDisk], uuid: [u8; 16]) -> Result<(), String> {
    for (place, disk) in legs.iter().enumerate() {
        let label = DeviceLabel {
            uuid,
            place: place as u32,
            legs: legs.len() as u32,
        };
        let dev = Dev::new(disk).map_err(|e| format!("{e:?}"))?;
        pollster::block_on(async {
            dev.write(LABEL_BLOCK, &label.encode(), block::WriteFlags::NONE)
                .await?;
            dev.flush().await
        })
        .map_err(|e| format!("writing the label of leg {place}: {e}"))?;
    }
    Ok(())
}

/// Each leg's state and counters, one line each (nothing for a plain image).
pub fn describe_legs(volume: &Volume) -> String {
    if volume.copies() < 2 {
        return String::new();
    }
    volume
        .legs()
        .iter()
        .enumerate()
        .map(|(i, l)| {
            format!(
                "leg {i}: {:?}, {} read errors, {} write errors, {} repairs\n",
                l.state, l.read_errors, l.write_errors, l.repairs
            )
        })
        .collect()
}

/// Opens an existing image with the largest block size that divides its length.
pub fn open(path: &Path, writable: bool) -> Result<FileDisk, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let block = if len.is_multiple_of(4096) { 4096 } else { 512 };
    FileDisk::open(path, block, writable).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a size such as `1G`, `512MiB`, `4096`, `64k` (as export options do).
pub fn parse_size(s: &str) -> Result<u64, String> {
    vfs::parse_size(s).map_err(|e| format!("bad size {s:?}: {e}"))
}

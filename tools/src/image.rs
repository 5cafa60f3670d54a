//! Opening image files for the subcommands.

use std::path::Path;

use block::FileDisk;

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
    ninep::server::access::parse_size(s).map_err(|e| format!("bad size {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert!(parse_size("12x").is_err());
        assert!(parse_size("").is_err());
    }
}

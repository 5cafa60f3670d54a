//! Limits as operators write them: sizes (`512M`, `20G`), counts, `none`, and the
//! `bytes=`/`inodes=` words that change a quota root's limits. One parser for the export
//! options, the administration commands and the host tools.

use alloc::format;
use alloc::string::String;

use crate::QuotaLimits;

/// Parses a size such as `4096`, `64k`, `512MiB`, `1G`, `2T` (binary units).
pub fn parse_size(s: &str) -> Result<u64, &'static str> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "expected a size such as 4096, 64K, 512M, 1G")?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err("bad size unit (use K, M, G or T)"),
    };
    n.checked_mul(1u64 << shift).ok_or("size too large")
}

/// Parses a limit: a size (`size`) or a count, or `none` (no limit).
pub fn parse_limit(s: &str, size: bool) -> Result<Option<u64>, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    if size {
        return parse_size(s)
            .map(Some)
            .map_err(|e| format!("bad size {s:?}: {e}"));
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("bad inode count {s:?}"))
}

/// A change of a quota root's limits: each one set (`Some(Some(v))`), cleared
/// (`Some(None)`, written `none`) or kept as it is (`None`: not given).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitChange {
    /// Most bytes of file data.
    pub bytes: Option<Option<u64>>,
    /// Most inodes.
    pub inodes: Option<Option<u64>>,
}

impl LimitChange {
    /// Parses `bytes=SIZE` and `inodes=N` words (either may be `none`; at least one).
    pub fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<LimitChange, String> {
        let mut change = LimitChange::default();
        for word in words {
            match word.split_once('=') {
                Some(("bytes", v)) if change.bytes.is_none() => {
                    change.bytes = Some(parse_limit(v, true)?)
                }
                Some(("inodes", v)) if change.inodes.is_none() => {
                    change.inodes = Some(parse_limit(v, false)?)
                }
                _ => {
                    return Err(format!(
                        "expected bytes=SIZE or inodes=N (once each), not {word:?}"
                    ))
                }
            }
        }
        if change.is_empty() {
            return Err("expected bytes=SIZE or inodes=N".into());
        }
        Ok(change)
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_none() && self.inodes.is_none()
    }

    /// The limits after the change of `old` (the root's limits, `None` if it is not a
    /// quota root yet: a limit not given is then none).
    pub fn applied_to(&self, old: Option<QuotaLimits>) -> QuotaLimits {
        let old = old.unwrap_or_default();
        QuotaLimits {
            bytes: self.bytes.unwrap_or(old.bytes),
            inodes: self.inodes.unwrap_or(old.inodes),
        }
    }
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
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn limit_changes_keep_what_they_do_not_name() {
        let old = QuotaLimits {
            bytes: Some(1 << 30),
            inodes: Some(1000),
        };
        let c = LimitChange::parse(["inodes=none"]).unwrap();
        assert_eq!(
            c.applied_to(Some(old)),
            QuotaLimits {
                bytes: Some(1 << 30),
                inodes: None
            }
        );
        let c = LimitChange::parse(["bytes=2G", "inodes=5"]).unwrap();
        assert_eq!(
            c.applied_to(None),
            QuotaLimits {
                bytes: Some(2 << 30),
                inodes: Some(5)
            }
        );
        assert_eq!(
            LimitChange::parse(["bytes=1G"])
                .unwrap()
                .applied_to(None)
                .inodes,
            None
        );
        assert!(LimitChange::parse([]).is_err());
        assert!(LimitChange::parse(["bytes=1G", "bytes=2G"]).is_err());
        assert!(LimitChange::parse(["size=1G"]).is_err());
        assert!(LimitChange::parse(["inodes=1k"]).is_err());
    }
}

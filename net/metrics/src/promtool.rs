//! `promtool check metrics` on an exposition (feature `promtool`, std, for tests): the
//! Prometheus project's own linter, Debian's package `prometheus` (scripts/deps.sh
//! installs it).

use std::io::Write;
use std::process::{Command, Stdio};
use std::string::String;

/// What promtool says of `text`: `Ok` when it found nothing, `Err(what it said)` when it
/// found problems, `None` when it is not installed.
pub fn check(text: &str) -> Option<Result<(), String>> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let fed = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(text.as_bytes()));
    let out = child.wait_with_output().ok()?;
    let said = std::format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(match fed {
        Some(Ok(())) if out.status.success() && said.trim().is_empty() => Ok(()),
        _ => Err(std::format!("{}: {said}", out.status)),
    })
}

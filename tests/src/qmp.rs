//! QEMU's machine protocol (QMP) on a Unix socket (`Qemu::qmp`): what a test needs to
//! act on the machine from outside, such as pressing its ACPI power button
//! (`system_powerdown`, what `virsh shutdown` sends).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long QEMU may take to open its QMP socket and answer.
const QMP_WAIT: Duration = Duration::from_secs(30);

/// Runs one QMP command (no arguments) on the socket at `path`: connects (retrying while
/// QEMU starts), leaves capabilities negotiation, sends `command` and waits for its
/// `return`. Events QEMU sends meanwhile are skipped.
pub fn execute(path: &Path, command: &str) -> Result<(), String> {
    let deadline = Instant::now() + QMP_WAIT;
    let stream = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("QMP socket {}: {e}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    stream
        .set_read_timeout(Some(QMP_WAIT))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    let greeting = next_message(&mut reader)?;
    if greeting.get("QMP").is_none() {
        return Err(format!("not a QMP greeting: {greeting}"));
    }
    for cmd in ["qmp_capabilities", command] {
        writeln!(writer, "{}", serde_json::json!({ "execute": cmd }))
            .map_err(|e| format!("QMP {cmd}: {e}"))?;
        loop {
            let reply = next_message(&mut reader)?;
            if reply.get("return").is_some() {
                break;
            }
            if let Some(e) = reply.get("error") {
                return Err(format!("QMP {cmd}: {e}"));
            }
        }
    }
    Ok(())
}

/// The next JSON message (one per line).
fn next_message(reader: &mut impl BufRead) -> Result<serde_json::Value, String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => Err("QMP: QEMU closed the socket".into()),
        Ok(_) => serde_json::from_str(&line).map_err(|e| format!("QMP: {e}: {line:?}")),
        Err(e) => Err(format!("QMP: {e}")),
    }
}

//! The appliance's counters service (`stats=PORT`), read over a host forward.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The counters as JSON (the service's answer to `json`).
pub fn json(port: u16) -> serde_json::Value {
    let text = request(port, "json");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats port answered {text:?}: {e}"))
}

/// The counters as JSON, or why they could not be read (the service did not answer
/// within `wait`, or answered something else).
pub fn try_json(port: u16, wait: Duration) -> Result<serde_json::Value, String> {
    let text = try_request(port, "json", wait).map_err(|e| format!("stats port: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("stats port answered {text:?}: {e}"))
}

/// The service's answer to one request line.
pub fn request(port: u16, line: &str) -> String {
    try_request(port, line, Duration::from_secs(30)).expect("reading the stats answer")
}

/// The service's answer to one request line, if it comes within `wait`.
pub fn try_request(port: u16, line: &str, wait: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(wait))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A counter by JSON pointer, 0 if the document has none (a counter another version
/// of the appliance does not keep).
pub fn counter_or_zero(v: &serde_json::Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// A counter by JSON pointer (`/devices/0/counters/flushes`).
pub fn counter(v: &serde_json::Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no counter {pointer} in {v}"))
}

//! The appliance's counters service (`stats=PORT`), read over a host forward.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The counters as JSON (the service's answer to `json`).
pub fn json(port: u16) -> serde_json::Value {
    let text = request(port, "json");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats port answered {text:?}: {e}"))
}

/// The service's answer to one request line.
pub fn request(port: u16, line: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the stats forward");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .expect("reading the stats answer");
    out
}

/// A counter by JSON pointer (`/devices/0/counters/flushes`).
pub fn counter(v: &serde_json::Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or_else(|| panic!("no counter {pointer} in {v}"))
}

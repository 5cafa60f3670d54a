//! The appliance's counters service (`stats=PORT`), read over a host forward: JSON,
//! `stat` lines, and `/metrics` in the Prometheus text format.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The counters as JSON (the service's answer to `json`).
pub fn json(port: u16) -> serde_json::Value {
    json_at(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// The counters as JSON, from the service at `addr` (the appliance's own address on a
/// tap device).
pub fn json_at(addr: SocketAddr) -> serde_json::Value {
    let text =
        exchange_at(addr, "json\n", Duration::from_secs(30)).expect("reading the stats answer");
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
    exchange(port, &format!("{line}\n"), wait)
}

/// Sends `request`, reads the answer until the service closes.
fn exchange(port: u16, request: &str, wait: Duration) -> std::io::Result<String> {
    exchange_at(SocketAddr::from(([127, 0, 0, 1], port)), request, wait)
}

/// [`exchange`] with the service at `addr`.
fn exchange_at(addr: SocketAddr, request: &str, wait: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, wait)?;
    s.set_read_timeout(Some(wait))?;
    s.write_all(request.as_bytes())?;
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

/// The body of the service's answer to `GET path` over HTTP, with its `Content-Type`;
/// panics unless the answer is `200 OK`.
pub fn http_get(port: u16, path: &str) -> (String, String) {
    let get = format!("GET {path} HTTP/1.1\r\nHost: appliance\r\nAccept: */*\r\n\r\n");
    let answer = exchange(port, &get, Duration::from_secs(30)).expect("reading the answer");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .unwrap_or_else(|| panic!("no Content-Type in {head}"))
        .to_string();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no Content-Length in {head}"));
    assert_eq!(body.len(), length, "the whole body arrived");
    (content_type, body.to_string())
}

pub use metrics::parse::{parse as parse_metrics, sample, Sample};

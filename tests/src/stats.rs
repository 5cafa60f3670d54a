//! The appliance's counters service (`stats=PORT`), read over a host forward: JSON,
//! `stat` lines, and `/metrics` in the Prometheus text format.

use std::collections::BTreeMap;
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

/// One sample of the Prometheus text format: metric name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The name (`ninefold_device_flushes_total`, `..._bucket`).
    pub name: String,
    /// Its labels, by name.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// The samples of a Prometheus text exposition (`/metrics`), strictly parsed: every
/// line is a comment or `name{label="value",...} number`; label values are unescaped.
pub fn parse_metrics(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let bad = || format!("bad sample line {line:?}");
        let name_end = line.find(['{', ' ']).ok_or_else(bad)?;
        let name = &line[..name_end];
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(mut l) = rest.strip_prefix('{') {
            while !l.starts_with('}') {
                let (label, after) = l.split_once("=\"").ok_or_else(bad)?;
                let mut value = String::new();
                let mut chars = after.char_indices();
                let end = loop {
                    match chars.next().ok_or_else(bad)? {
                        (i, '"') => break i,
                        (_, '\\') => match chars.next().ok_or_else(bad)?.1 {
                            'n' => value.push('\n'),
                            c => value.push(c),
                        },
                        (_, c) => value.push(c),
                    }
                };
                labels.insert(label.trim_start_matches(',').to_string(), value);
                l = &after[end + 1..];
            }
            rest = &l[1..];
        }
        let value = rest.trim().parse::<f64>().map_err(|_| bad())?;
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    Ok(samples)
}

/// The value of the sample `name` whose labels include `labels`, if there is one.
pub fn sample(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(l, v)| s.labels.get(*l).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_with_escaped_labels_and_rejects_garbage() {
        let text = "# HELP x_total A \\\\ counter.\n# TYPE x_total counter\n\
                    x_total{a=\"q\\\"uote\",b=\"back\\\\slash\\n\"} 3\nup 1.5e-3\n";
        let s = parse_metrics(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["a"], "q\"uote");
        assert_eq!(s[0].labels["b"], "back\\slash\n");
        assert_eq!(sample(&s, "x_total", &[("a", "q\"uote")]), Some(3.0));
        assert_eq!(sample(&s, "up", &[]), Some(0.0015));
        assert!(parse_metrics("x{a=\"1\" 2\n").is_err());
        assert!(parse_metrics("x one\n").is_err());
    }
}

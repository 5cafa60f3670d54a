//! The counters endpoint's protocol: one request per connection, read from its first
//! line, answered with one of a counters document's formats, then the connection closes.
//! The appliance's counters service (`stats=PORT`) and `ninefold serve --stats ADDR`
//! answer the same way:
//!
//! | request | answer |
//! |---|---|
//! | nothing (the client only connects), `json` | the JSON document |
//! | `stat` | one `/sys/block/DEV/stat`-style line per device |
//! | `metrics` | the Prometheus text format |
//! | `GET /stat HTTP/1.x` | the `stat` lines, as an HTTP/1.0 response |
//! | `GET /metrics HTTP/1.x` | the Prometheus text format, as an HTTP/1.0 response |
//! | `GET /anything-else HTTP/1.x` | the JSON document, as an HTTP/1.0 response |
//!
//! So `nc ADDR PORT` prints JSON, `curl http://ADDR:PORT/` works too, and Prometheus
//! scrapes `http://ADDR:PORT/metrics`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::text::CONTENT_TYPE;

/// A counters document in each format the endpoint serves.
pub trait Report {
    /// The JSON document, one line.
    fn json(&self) -> String;
    /// The `/sys/block`-style lines (empty without devices).
    fn stat_lines(&self) -> String;
    /// The Prometheus text format.
    fn prometheus(&self) -> String;
}

/// What a client asked for (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The answer's format.
    pub format: Format,
    /// Asked over HTTP: the answer is an HTTP response.
    pub http: bool,
}

/// The formats of the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The JSON document.
    Json,
    /// The `/sys/block`-style lines.
    Stat,
    /// The Prometheus text format.
    Metrics,
}

impl Request {
    /// Reads the request from the first line a client sent (empty: it sent nothing).
    pub fn parse(line: &[u8]) -> Request {
        let line = core::str::from_utf8(line).unwrap_or("").trim();
        let (word, http) = match line.strip_prefix("GET ") {
            Some(rest) => {
                let target = rest.split_ascii_whitespace().next().unwrap_or("/");
                let path = target.split('?').next().unwrap_or(target);
                (path.trim_start_matches('/'), true)
            }
            None => (line, false),
        };
        let format = match word {
            "stat" => Format::Stat,
            "metrics" => Format::Metrics,
            _ => Format::Json,
        };
        Request { format, http }
    }

    /// The answer to this request from `report`.
    pub fn answer(self, report: &impl Report) -> Vec<u8> {
        let (body, kind) = match self.format {
            Format::Stat => (report.stat_lines(), "text/plain"),
            Format::Metrics => (report.prometheus(), CONTENT_TYPE),
            Format::Json => {
                let mut j = report.json();
                j.push('\n');
                (j, "application/json")
            }
        };
        if !self.http {
            return body.into_bytes();
        }
        format!(
            "HTTP/1.0 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    struct Fixed;

    impl Report for Fixed {
        fn json(&self) -> String {
            r#"{"uptime_ms":5}"#.to_string()
        }
        fn stat_lines(&self) -> String {
            "disk 1 0 8\n".to_string()
        }
        fn prometheus(&self) -> String {
            "x_total 1\n".to_string()
        }
    }

    #[test]
    fn requests_and_answers() {
        let plain = |format| Request {
            format,
            http: false,
        };
        let http = |format| Request { format, http: true };
        assert_eq!(Request::parse(b""), plain(Format::Json));
        assert_eq!(Request::parse(b"json\n"), plain(Format::Json));
        assert_eq!(Request::parse(b"stat\r\n"), plain(Format::Stat));
        assert_eq!(Request::parse(b"metrics"), plain(Format::Metrics));
        assert_eq!(
            Request::parse(b"GET /stat HTTP/1.1\r\n"),
            http(Format::Stat)
        );
        assert_eq!(
            Request::parse(b"GET /metrics?name[]=x HTTP/1.1"),
            http(Format::Metrics)
        );
        assert_eq!(Request::parse(b"GET / HTTP/1.1"), http(Format::Json));
        assert_eq!(Request::parse(&[0xff, 0xfe]), plain(Format::Json));
        let answer = String::from_utf8(http(Format::Json).answer(&Fixed)).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200 OK"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert_eq!(body, "{\"uptime_ms\":5}\n");
        assert_eq!(plain(Format::Stat).answer(&Fixed), b"disk 1 0 8\n");
        let metrics =
            String::from_utf8(Request::parse(b"GET /metrics HTTP/1.1").answer(&Fixed)).unwrap();
        assert!(metrics.contains("Content-Type: text/plain; version=0.0.4"));
        assert!(metrics.ends_with("\r\n\r\nx_total 1\n"));
    }
}

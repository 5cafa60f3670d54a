//! The Prometheus text exposition format, version 0.0.4: an [`Exposition`] collects
//! samples by metric family and renders them, each family once, its `# HELP` and
//! `# TYPE` lines first and its samples together (the format requires both).
//!
//! ```text
//! # HELP ninefold_device_flushes_total Flushes the device performed.
//! # TYPE ninefold_device_flushes_total counter
//! ninefold_device_flushes_total{device="nvme@00:04.0"} 12
//! ```
//!
//! Values are integers, or integers scaled by a power of ten ([`Value::Scaled`]: nanoseconds
//! as seconds), rendered as exact decimals, so no float formatting is involved.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::{self, Write};

use crate::histogram::{LatencyHistogram, BOUNDS_NS};

/// The media type of the format, for an HTTP `Content-Type` header.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Nanoseconds per second: the scale of durations kept in nanoseconds.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// What a metric family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (from 0 at boot); the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in cumulative buckets, with their sum and count.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A whole number.
    Int(u64),
    /// `raw / per_unit`, where `per_unit` is a power of ten (`raw` nanoseconds with
    /// `per_unit` [`NS_PER_SEC`] are seconds).
    Scaled {
        /// The number kept.
        raw: u64,
        /// How many of `raw` make one unit.
        per_unit: u64,
    },
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Scaled { raw, per_unit } if per_unit <= 1 => write!(f, "{raw}"),
            Value::Scaled { raw, per_unit } => {
                let (whole, mut frac) = (raw / per_unit, raw % per_unit);
                if frac == 0 {
                    return write!(f, "{whole}");
                }
                let mut digits = per_unit.ilog10() as usize;
                while frac % 10 == 0 {
                    frac /= 10;
                    digits -= 1;
                }
                write!(f, "{whole}.{frac:0digits$}")
            }
        }
    }
}

/// Why a sample was not added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The name is not a valid metric name, or a label name not a valid label name.
    BadName(String),
    /// The family exists with another kind.
    KindClash(String),
    /// The family already has a series with these labels.
    Duplicate(String),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::BadName(n) => write!(f, "{n}: not a valid metric or label name"),
            Refused::KindClash(n) => write!(f, "{n}: already a metric of another kind"),
            Refused::Duplicate(n) => write!(f, "{n}: the same series twice"),
        }
    }
}

/// Label names and values of one series.
pub type Labels = Vec<(String, String)>;

#[derive(Debug)]
enum Series {
    Scalar(Value),
    Histogram(LatencyHistogram),
}

#[derive(Debug)]
struct Family {
    kind: Kind,
    help: String,
    series: Vec<(Labels, Series)>,
}

/// Samples collected by family, rendered by [`Exposition::render`].
#[derive(Debug, Default)]
pub struct Exposition {
    families: BTreeMap<String, Family>,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a counter sample. `name` should end in `_total`.
    pub fn counter(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels,
        value: Value,
    ) -> Result<(), Refused> {
        self.add(name, Kind::Counter, help, labels, Series::Scalar(value))
    }

    /// Adds a gauge sample.
    pub fn gauge(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels,
        value: Value,
    ) -> Result<(), Refused> {
        self.add(name, Kind::Gauge, help, labels, Series::Scalar(value))
    }

    /// Adds a histogram of durations (rendered in seconds: `name` should end in
    /// `_seconds`): its `_bucket` series, one per bound of [`BOUNDS_NS`] and `+Inf`,
    /// then `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels,
        histogram: &LatencyHistogram,
    ) -> Result<(), Refused> {
        if labels.iter().any(|(l, _)| l == "le") {
            return Err(Refused::BadName("le".to_string()));
        }
        self.add(
            name,
            Kind::Histogram,
            help,
            labels,
            Series::Histogram(*histogram),
        )
    }

    /// Families collected.
    pub fn len(&self) -> usize {
        self.families.len()
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.families.is_empty()
    }

    fn add(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        labels: Labels,
        series: Series,
    ) -> Result<(), Refused> {
        if !is_metric_name(name) {
            return Err(Refused::BadName(name.to_string()));
        }
        if let Some((bad, _)) = labels.iter().find(|(l, _)| !is_label_name(l)) {
            return Err(Refused::BadName(bad.clone()));
        }
        let family = self
            .families
            .entry(name.to_string())
            .or_insert_with(|| Family {
                kind,
                help: help.to_string(),
                series: Vec::new(),
            });
        if family.kind != kind {
            return Err(Refused::KindClash(name.to_string()));
        }
        if family.series.iter().any(|(l, _)| *l == labels) {
            return Err(Refused::Duplicate(name.to_string()));
        }
        family.series.push((labels, series));
        Ok(())
    }

    /// The exposition as text: families by name, each with its `# HELP` and `# TYPE`
    /// lines and then its samples.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, family) in &self.families {
            let _ = writeln!(out, "# HELP {name} {}", Escaped::help(&family.help));
            let _ = writeln!(out, "# TYPE {name} {}", family.kind.name());
            for (labels, series) in &family.series {
                match series {
                    Series::Scalar(v) => sample(&mut out, name, "", labels, None, *v),
                    Series::Histogram(h) => {
                        let cumulative = h.cumulative();
                        for (i, &n) in cumulative.iter().enumerate() {
                            let le = match BOUNDS_NS.get(i) {
                                Some(&ns) => seconds(ns).to_string(),
                                None => "+Inf".to_string(),
                            };
                            sample(&mut out, name, "_bucket", labels, Some(&le), Value::Int(n));
                        }
                        sample(&mut out, name, "_sum", labels, None, seconds(h.sum_ns));
                        sample(&mut out, name, "_count", labels, None, Value::Int(h.count));
                    }
                }
            }
        }
        out
    }
}

/// `ns` nanoseconds as seconds.
pub fn seconds(ns: u64) -> Value {
    Value::Scaled {
        raw: ns,
        per_unit: NS_PER_SEC,
    }
}

/// One sample line: `name{labels,le="..."} value`.
fn sample(out: &mut String, name: &str, suffix: &str, labels: &Labels, le: Option<&str>, v: Value) {
    out.push_str(name);
    out.push_str(suffix);
    let le = le.map(|le| ("le", le));
    let all = labels
        .iter()
        .map(|(l, v)| (l.as_str(), v.as_str()))
        .chain(le);
    for (i, (label, value)) in all.enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        let _ = write!(out, "{label}=\"{}\"", Escaped::label(value));
    }
    if !labels.is_empty() || le.is_some() {
        out.push('}');
    }
    let _ = writeln!(out, " {v}");
}

/// Text escaped for a `# HELP` line (backslash and newline) or a label value (also the
/// double quote).
struct Escaped<'a> {
    text: &'a str,
    quote: bool,
}

impl<'a> Escaped<'a> {
    fn help(text: &'a str) -> Self {
        Escaped { text, quote: false }
    }

    fn label(text: &'a str) -> Self {
        Escaped { text, quote: true }
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.text.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '"' if self.quote => f.write_str("\\\"")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__` (reserved).
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(l, v)| (l.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn values_are_exact_decimals() {
        let s = |raw, per_unit| Value::Scaled { raw, per_unit }.to_string();
        assert_eq!(Value::Int(42).to_string(), "42");
        assert_eq!(s(1_500_000_000, NS_PER_SEC), "1.5");
        assert_eq!(s(50_000, NS_PER_SEC), "0.00005");
        assert_eq!(s(3_000_000_000, NS_PER_SEC), "3");
        assert_eq!(s(1, NS_PER_SEC), "0.000000001");
        assert_eq!(s(1234, 1000), "1.234");
        assert_eq!(s(7, 1), "7");
    }

    #[test]
    fn families_render_once_with_help_and_type_and_their_samples_together() {
        let mut e = Exposition::new();
        let help = "Flushes the device performed.";
        e.counter(
            "a_flushes_total",
            help,
            labels(&[("device", "nvme0")]),
            Value::Int(3),
        )
        .unwrap();
        e.gauge("a_memory_bytes", "Bytes in use.", vec![], Value::Int(7))
            .unwrap();
        e.counter(
            "a_flushes_total",
            help,
            labels(&[("device", "vda")]),
            Value::Int(4),
        )
        .unwrap();
        let text = e.render();
        assert_eq!(
            text,
            "# HELP a_flushes_total Flushes the device performed.\n\
             # TYPE a_flushes_total counter\n\
             a_flushes_total{device=\"nvme0\"} 3\n\
             a_flushes_total{device=\"vda\"} 4\n\
             # HELP a_memory_bytes Bytes in use.\n\
             # TYPE a_memory_bytes gauge\n\
             a_memory_bytes 7\n"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut e = Exposition::new();
        e.gauge(
            "x",
            "a \\ backslash,\na newline and \"quotes\"",
            labels(&[("path", "C:\\dir\n\"q\"")]),
            Value::Int(1),
        )
        .unwrap();
        let text = e.render();
        assert!(
            text.contains("# HELP x a \\\\ backslash,\\na newline and \"quotes\"\n"),
            "{text}"
        );
        assert!(
            text.contains("x{path=\"C:\\\\dir\\n\\\"q\\\"\"} 1\n"),
            "{text}"
        );
        assert_eq!(
            text.lines().count(),
            3,
            "escaped newlines stay on their line"
        );
    }

    #[test]
    fn histograms_have_cumulative_buckets_sum_and_count() {
        let mut h = LatencyHistogram::default();
        for ns in [10_000, 60_000, 60_000, 2_000_000, 20_000_000_000] {
            h.record(ns);
        }
        let mut e = Exposition::new();
        let l = labels(&[("type", "Twrite")]);
        e.histogram("lat_seconds", "Latency.", l, &h).unwrap();
        let text = e.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "# TYPE lat_seconds histogram");
        assert_eq!(lines.len(), 2 + BOUNDS_NS.len() + 1 + 2);
        assert_eq!(
            lines[2],
            "lat_seconds_bucket{type=\"Twrite\",le=\"0.00005\"} 1"
        );
        assert_eq!(
            lines[3],
            "lat_seconds_bucket{type=\"Twrite\",le=\"0.0001\"} 3"
        );
        assert_eq!(
            lines[7],
            "lat_seconds_bucket{type=\"Twrite\",le=\"0.0025\"} 4"
        );
        assert_eq!(lines[18], "lat_seconds_bucket{type=\"Twrite\",le=\"10\"} 4");
        assert_eq!(
            lines[19],
            "lat_seconds_bucket{type=\"Twrite\",le=\"+Inf\"} 5"
        );
        assert_eq!(lines[20], "lat_seconds_sum{type=\"Twrite\"} 20.00213");
        assert_eq!(lines[21], "lat_seconds_count{type=\"Twrite\"} 5");
    }

    #[test]
    fn bad_names_clashes_and_duplicates_are_refused() {
        let mut e = Exposition::new();
        let one = Value::Int(1);
        assert!(matches!(
            e.gauge("9p_x", "", vec![], one),
            Err(Refused::BadName(_))
        ));
        assert!(matches!(
            e.gauge("x", "", labels(&[("a-b", "v")]), one),
            Err(Refused::BadName(_))
        ));
        assert!(matches!(
            e.gauge("x", "", labels(&[("__name__", "v")]), one),
            Err(Refused::BadName(_))
        ));
        e.gauge("x", "", vec![], one).unwrap();
        assert!(matches!(
            e.counter("x", "", vec![], one),
            Err(Refused::KindClash(_))
        ));
        assert!(matches!(
            e.gauge("x", "", vec![], one),
            Err(Refused::Duplicate(_))
        ));
        let h = LatencyHistogram::default();
        assert!(e.histogram("h", "", labels(&[("le", "1")]), &h).is_err());
        assert_eq!(e.len(), 1);
    }
}

//! Metrics from a counters document: walks the JSON a `Serialize` counter set produces
//! (the same value the JSON endpoints serve) and turns every number in it into a sample,
//! so a counter added to a counter set reaches `/metrics` as it reaches the JSON, with
//! no list of fields to keep in step.
//!
//! Names come from the path, node_exporter style: `{"fs": {"log": {"commits": 3}}}`
//! with prefix `ninefold` is `ninefold_fs_log_commits_total 3`. Along the way:
//!
//! - numbers (non-negative integers) are counters (`_total`) unless a [`Rule`] says
//!   gauge; booleans are gauges
//!   (0 or 1); strings and nulls are not samples (a string can label its array
//!   element, see [`Rule::elements`]);
//! - units become base units: a key ending `_ns` or `_ms` is in seconds (`flush_ns` ->
//!   `flush_seconds_total`), and `bytes` moves last (`bytes_written` -> `written_bytes`);
//! - an object `{"count", "sum_ns", "buckets"}` (a serialised
//!   [`LatencyHistogram`]) is a histogram, `_seconds`;
//! - rules name what the path cannot: map keys that are label values
//!   ([`Rule::keys`]: `checkpoints: {"sync": 3}` -> `{cause="sync"}`), arrays whose
//!   elements name themselves ([`Rule::elements`]: `devices[i].name` -> `{device=...}`),
//!   gauges, better names, help texts, and what to leave out.
//!
//! A rule's path is the document path with dots, `*` for a map key or array element:
//! `devices.*.counters.flushes`. A sample the exposition refuses (a name clash) is
//! skipped and reported by [`Walk::refused`]; a test of the schema keeps it empty.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value as Json;

use crate::histogram::{LatencyHistogram, BUCKETS};
pub use crate::rule::{Action, Rule};
use crate::text::{Exposition, Labels, Refused, Value};

/// How a document becomes metrics: a name prefix and the rules.
#[derive(Clone, Copy, Debug)]
pub struct Schema<'a> {
    /// The first word of every name (`ninefold`).
    pub prefix: &'a str,
    /// The rules, in sets: each part of a document (the filesystem's `fs`, the 9P
    /// service's `9p`, ...) defines its own set once, beside its counters, and every
    /// document that holds the part takes its set. A path without a rule gets the
    /// defaults.
    pub rules: &'a [&'a [Rule]],
}

/// The result of a walk: the metrics, and what could not be exposed.
#[derive(Debug, Default)]
pub struct Walk {
    /// The metrics.
    pub exposition: Exposition,
    /// Samples refused (name clashes: a schema error, see the module documentation).
    pub refused: Vec<Refused>,
}

impl Schema<'_> {
    /// The metrics of `document`.
    pub fn walk(&self, document: &Json) -> Walk {
        let mut walk = Walk::default();
        let mut at = Node {
            path: Vec::new(),
            words: Vec::new(),
            labels: Vec::new(),
            key: "",
            name: None,
        };
        self.node(&mut walk, document, &mut at);
        walk
    }

    fn rule(&self, path: &str) -> Option<&Rule> {
        self.rules
            .iter()
            .flat_map(|set| set.iter())
            .find(|r| r.path == path)
    }

    fn node<'d>(&self, walk: &mut Walk, value: &'d Json, at: &mut Node<'d>) {
        let path = at.path.join(".");
        let rule = self.rule(&path);
        let action = rule.map(|r| r.action);
        if action == Some(Action::Skip) {
            return;
        }
        match value {
            Json::Object(map) => {
                if let Some(h) = histogram(value) {
                    return self.leaf(walk, at, &path, rule, Leaf::Histogram(h));
                }
                let keyed = match action {
                    Some(Action::Keys { label }) => Some(label),
                    _ => None,
                };
                let word = match rule.and_then(|r| r.name) {
                    Some(w) if keyed.is_none() => w,
                    _ => at.key,
                };
                let pushed = push_word(&mut at.words, word);
                for (k, v) in map {
                    match keyed {
                        Some(label) => {
                            at.labels.push((label.to_string(), k.clone()));
                            let name = rule.and_then(|r| r.name);
                            at.descend("*", "", name, |at| self.node(walk, v, at));
                            at.labels.pop();
                        }
                        None => at.descend(k, k, None, |at| self.node(walk, v, at)),
                    }
                }
                if pushed {
                    at.words.pop();
                }
            }
            Json::Array(items) => {
                let word = rule.and_then(|r| r.name).unwrap_or(at.key);
                let pushed = push_word(&mut at.words, word);
                for (i, item) in items.iter().enumerate() {
                    let (label, value) = match action {
                        Some(Action::Elements { label, field }) => (
                            label,
                            item.get(field)
                                .and_then(Json::as_str)
                                .map_or_else(|| i.to_string(), str::to_string),
                        ),
                        _ => ("index", i.to_string()),
                    };
                    at.labels.push((label.to_string(), value));
                    at.descend("*", "", None, |at| self.node(walk, item, at));
                    at.labels.pop();
                }
                if pushed {
                    at.words.pop();
                }
            }
            Json::Number(n) => {
                if let Some(n) = n.as_u64() {
                    let gauge = action == Some(Action::Gauge);
                    self.leaf(walk, at, &path, rule, Leaf::Number { n, gauge });
                }
            }
            Json::Bool(b) => {
                let n = u64::from(*b);
                self.leaf(walk, at, &path, rule, Leaf::Number { n, gauge: true });
            }
            Json::String(_) | Json::Null => {}
        }
    }

    fn leaf(&self, walk: &mut Walk, at: &Node, path: &str, rule: Option<&Rule>, leaf: Leaf) {
        let (base, scale) = unit(at.key);
        let name = match rule.and_then(|r| r.name).or(at.name) {
            Some(name) => format!("{}_{name}", self.prefix),
            None => {
                let mut words = at.words.clone();
                if !base.is_empty() {
                    words.push(&base);
                }
                format!("{}_{}", self.prefix, words.join("_"))
            }
        };
        let default_help;
        let help = match rule.and_then(|r| r.help) {
            Some(h) => h,
            None => {
                default_help = format!("`{path}` in the counters document.");
                &default_help
            }
        };
        let labels: Labels = at.labels.clone();
        let e = &mut walk.exposition;
        let added = match leaf {
            Leaf::Histogram(h) => {
                let name = with_suffix(name, "_seconds");
                e.histogram(&name, help, labels, &h)
            }
            Leaf::Number { n, gauge } => {
                let value = match scale {
                    1 => Value::Int(n),
                    per_unit => Value::Scaled { raw: n, per_unit },
                };
                if gauge {
                    e.gauge(&name, help, labels, value)
                } else {
                    e.counter(&with_suffix(name, "_total"), help, labels, value)
                }
            }
        };
        if let Err(r) = added {
            walk.refused.push(r);
        }
    }
}

/// Where the walk is: the document path, the words of the names below, the labels.
struct Node<'a> {
    path: Vec<&'a str>,
    words: Vec<&'a str>,
    labels: Labels,
    /// The key of the node (its last name word, unless a rule renames it).
    key: &'a str,
    /// The name the node has from the map of [`Action::Keys`] it is a value of.
    name: Option<&'static str>,
}

impl<'a> Node<'a> {
    /// Runs `f` one level down, at `segment` of the path, under `key`, named `name`.
    fn descend(
        &mut self,
        segment: &'a str,
        key: &'a str,
        name: Option<&'static str>,
        f: impl FnOnce(&mut Self),
    ) {
        let outer = (
            core::mem::replace(&mut self.key, key),
            core::mem::replace(&mut self.name, name),
        );
        self.path.push(segment);
        f(self);
        self.path.pop();
        (self.key, self.name) = outer;
    }
}

enum Leaf {
    Number { n: u64, gauge: bool },
    Histogram(LatencyHistogram),
}

fn push_word<'a>(words: &mut Vec<&'a str>, word: &'a str) -> bool {
    if word.is_empty() {
        return false;
    }
    words.push(word);
    true
}

fn with_suffix(mut name: String, suffix: &str) -> String {
    if !name.ends_with(suffix) {
        name.push_str(suffix);
    }
    name
}

/// A key's name word in base units, and how many of its unit make one base unit:
/// `flush_ns` -> (`flush_seconds`, 10^9), `bytes_written` -> (`written_bytes`, 1).
fn unit(key: &str) -> (String, u64) {
    if let Some(stem) = key.strip_suffix("_ns") {
        return (format!("{stem}_seconds"), crate::text::NS_PER_SEC);
    }
    if let Some(stem) = key.strip_suffix("_ms") {
        return (format!("{stem}_seconds"), 1000);
    }
    let words: Vec<&str> = key.split('_').collect();
    if words.len() > 1 && words[..words.len() - 1].contains(&"bytes") {
        let mut rest: Vec<&str> = words.into_iter().filter(|w| *w != "bytes").collect();
        rest.push("bytes");
        return (rest.join("_"), 1);
    }
    (key.to_string(), 1)
}

/// The histogram a serialised [`LatencyHistogram`] is, if `value` is one.
fn histogram(value: &Json) -> Option<LatencyHistogram> {
    let map = value.as_object()?;
    if map.len() != 3 {
        return None;
    }
    let count = map.get("count")?.as_u64()?;
    let sum_ns = map.get("sum_ns")?.as_u64()?;
    let list = map.get("buckets")?.as_array()?;
    if list.len() != BUCKETS {
        return None;
    }
    let mut buckets = [0u64; BUCKETS];
    for (b, v) in buckets.iter_mut().zip(list) {
        *b = v.as_u64()?;
    }
    Some(LatencyHistogram {
        count,
        sum_ns,
        buckets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RULES: &[Rule] = &[
        Rule::elements("devices", "device", "name").named("device"),
        Rule::rename("devices.*.counters", ""),
        Rule::counter("devices.*.device_flushes")
            .named("device_flushes")
            .help("Flushes the device performed."),
        Rule::counter("devices.*.counters.flushes").named("device_flush_requests"),
        Rule::gauge("devices.*.block_size").named("device_block_size_bytes"),
        Rule::histogram("devices.*.counters.flush_latency").named("device_flush_duration_seconds"),
        Rule::keys("fs.checkpoints", "cause"),
        Rule::keys("fs.node_writes", "cause"),
        Rule::counter("fs.node_writes.*.writes").named("fs_node_writes"),
        Rule::counter("fs.node_writes.*.bytes").named("fs_node_written_bytes"),
        Rule::gauge("fs.cache_bytes"),
        Rule::skip("9p.requests"),
        Rule::keys("9p.request_latency", "type").named("9p_request_duration_seconds"),
    ];

    fn schema() -> Schema<'static> {
        Schema {
            prefix: "ninefold",
            rules: &[RULES],
        }
    }

    fn metrics(doc: &Json) -> String {
        let walk = schema().walk(doc);
        assert_eq!(walk.refused, [], "{}", walk.exposition.render());
        walk.exposition.render()
    }

    fn hist(ns: &[u64]) -> Json {
        let mut h = LatencyHistogram::default();
        ns.iter().for_each(|&n| h.record(n));
        serde_json::to_value(h).unwrap()
    }

    #[test]
    fn names_units_and_kinds_follow_the_path_and_the_rules() {
        let doc = json!({
            "uptime_ms": 1500,
            "devices": [
                {"name": "nvme@00:04.0", "block_size": 512, "native_fua": true,
                 "device_flushes": 9,
                 "counters": {"bytes_written": 4096, "flushes": 7, "flush_ns": 2_500_000,
                              "flush_latency": hist(&[60_000, 70_000])}},
                {"name": "vda", "block_size": 4096, "native_fua": false,
                 "device_flushes": 1,
                 "counters": {"bytes_written": 0, "flushes": 1, "flush_ns": 0,
                              "flush_latency": hist(&[])}},
            ],
            "fs": {"label": "data", "cache_bytes": 100, "data_bytes_written": 5,
                   "checkpoints": {"sync": 2, "timer": 0},
                   "node_writes": {"sync": {"writes": 1, "bytes": 4096}},
                   "log": {"commits": 3}},
            "9p": null,
        });
        let text = metrics(&doc);
        for line in [
            "ninefold_uptime_seconds_total 1.5",
            "ninefold_device_written_bytes_total{device=\"nvme@00:04.0\"} 4096",
            "ninefold_device_flush_seconds_total{device=\"nvme@00:04.0\"} 0.0025",
            "ninefold_device_flush_requests_total{device=\"vda\"} 1",
            "# HELP ninefold_device_flushes_total Flushes the device performed.",
            "ninefold_device_flushes_total{device=\"nvme@00:04.0\"} 9",
            "# TYPE ninefold_device_block_size_bytes gauge",
            "ninefold_device_block_size_bytes{device=\"vda\"} 4096",
            "ninefold_device_native_fua{device=\"vda\"} 0",
            "# TYPE ninefold_device_flush_duration_seconds histogram",
            "ninefold_device_flush_duration_seconds_bucket{device=\"nvme@00:04.0\",le=\"0.0001\"} 2",
            "ninefold_device_flush_duration_seconds_count{device=\"vda\"} 0",
            "# TYPE ninefold_fs_cache_bytes gauge",
            "ninefold_fs_data_written_bytes_total 5",
            "ninefold_fs_checkpoints_total{cause=\"sync\"} 2",
            "ninefold_fs_checkpoints_total{cause=\"timer\"} 0",
            "ninefold_fs_node_writes_total{cause=\"sync\"} 1",
            "ninefold_fs_node_written_bytes_total{cause=\"sync\"} 4096",
            "# HELP ninefold_fs_log_commits_total `fs.log.commits` in the counters document.",
            "ninefold_fs_log_commits_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("label"), "strings are not samples");
    }

    #[test]
    fn keyed_histograms_skips_and_clashes() {
        let doc = json!({"9p": {
            "requests": 5,
            "request_latency": {"Twrite": hist(&[1_000_000]), "Tread": hist(&[1, 2])},
        }});
        let text = metrics(&doc);
        assert!(!text.contains("ninefold_9p_requests"), "{text}");
        assert!(text.contains("ninefold_9p_request_duration_seconds_count{type=\"Tread\"} 2\n"));
        assert!(text.contains(
            "ninefold_9p_request_duration_seconds_bucket{type=\"Twrite\",le=\"0.001\"} 1\n"
        ));

        // Two paths that name the same metric: the second is refused, not rendered.
        let clash = json!({"a": {"b_total": 1}, "a_b": 2});
        let walk = schema().walk(&clash);
        assert_eq!(walk.refused.len(), 1);
        let text = walk.exposition.render();
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("ninefold_a_b_total "))
                .count(),
            1
        );
    }

    #[test]
    fn units() {
        assert_eq!(
            unit("flush_ns"),
            ("flush_seconds".to_string(), 1_000_000_000)
        );
        assert_eq!(unit("idle_ms"), ("idle_seconds".to_string(), 1000));
        assert_eq!(unit("bytes_read"), ("read_bytes".to_string(), 1));
        assert_eq!(unit("node_load_bytes"), ("node_load_bytes".to_string(), 1));
        assert_eq!(unit("bytes"), ("bytes".to_string(), 1));
        assert_eq!(unit("commits"), ("commits".to_string(), 1));
    }
}

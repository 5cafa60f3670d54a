//! Reading the Prometheus text format back: the samples of an exposition (what
//! [`crate::text`] writes, or any `/metrics`), for the host's tests and `ninefold top`.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

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
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
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
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["a"], "q\"uote");
        assert_eq!(s[0].labels["b"], "back\\slash\n");
        assert_eq!(sample(&s, "x_total", &[("a", "q\"uote")]), Some(3.0));
        assert_eq!(sample(&s, "up", &[]), Some(0.0015));
        assert!(parse("x{a=\"1\" 2\n").is_err());
        assert!(parse("x one\n").is_err());
    }
}

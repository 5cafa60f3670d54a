//! `/metrics` of the appliance's counters port, as Prometheus scrapes it: the appliance
//! boots on an NVMe disk, a client does 9P traffic (writes, an fsync, reads, an error),
//! and the exposition fetched over HTTP must pass `promtool check metrics` (Debian's
//! `prometheus` package; `scripts/deps.sh` installs it) and count what was done: requests
//! by type, device flushes after the fsync, one latency observation per answered request
//! and per device FLUSH, cumulative buckets. The JSON answers keep working beside it.
//!
//! Host ports: 9P on 16100, the counters service on 16101.

use std::time::Duration;

use ninefold_tests::ninep::connect;
use ninefold_tests::stats::{self, parse_metrics, sample, Sample};
use ninefold_tests::{FsImage, Qemu};
use ninep::wire::open_flags;
use serde_json::json;
use vfs::Errno;

/// How long the appliance may take to boot and get its DHCP lease under TCG.
const UP: Duration = Duration::from_secs(60);

/// The samples of `name` (every label set), in the order exposed.
fn series<'a>(samples: &'a [Sample], name: &str) -> Vec<&'a Sample> {
    samples.iter().filter(|s| s.name == name).collect()
}

/// The metric names every query of the Grafana dashboard (`docs/grafana/ninefold.json`)
/// uses.
fn dashboard_metrics() -> std::collections::BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/grafana/ninefold.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = std::collections::BTreeSet::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            let expr = target["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(at) = rest.find("ninefold_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.insert(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
    }
    assert!(names.len() > 20, "{names:?}");
    names
}

#[test]
fn metrics_pass_promtool_and_count_the_traffic() {
    let (port, stats_port) = (16100, 16101);
    let image = FsImage::formatted("128M");
    let mut vm = Qemu::serving()
        .memory("128M")
        .virtio_net_forwards(&[(port, 564), (stats_port, 5641)])
        .nvme_image("nf-metrics", &image)
        .timeout(Duration::from_secs(180))
        .spawn();
    vm.wait_for_event(
        "listening",
        json!({"service": "9p", "address": "10.0.2.15", "port": 564}),
    );

    let (kind, before) = stats::http_get(stats_port, "/metrics");
    assert_eq!(kind, "text/plain; version=0.0.4; charset=utf-8");
    let before = parse_metrics(&before).unwrap();

    let mut c = connect(port, UP);
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "f", open_flags::RDWR, 0o644).unwrap();
    const WRITES: u64 = 5;
    for i in 0..WRITES {
        c.write(1, i * 4096, &[i as u8; 4096]).unwrap();
    }
    c.fsync(1, false).unwrap();
    assert_eq!(c.read(1, 4096, 4096).unwrap(), [1u8; 4096]);
    assert_eq!(c.read(77, 0, 1).unwrap_err(), Errno::EBADF);
    c.clunk(1).unwrap();

    let (_, text) = stats::http_get(stats_port, "/metrics");
    let verdict = metrics::promtool::check(&text)
        .expect("running promtool (Debian package prometheus: scripts/deps.sh installs it)");
    if let Err(problems) = verdict {
        vm.fail(&format!("promtool check metrics:\n{problems}\n{text}"));
    }
    let after = parse_metrics(&text).unwrap();
    // The Grafana dashboard in the repo asks only for what the appliance exports.
    for name in dashboard_metrics() {
        if !after.iter().any(|s| s.name == name) {
            vm.fail(&format!(
                "docs/grafana/ninefold.json queries {name}, which the appliance does not export"
            ));
        }
    }
    let delta = |name: &str, labels: &[(&str, &str)]| {
        let now = sample(&after, name, labels).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        now - sample(&before, name, labels).unwrap_or(0.0)
    };

    // Requests by type, and the fsync acknowledged.
    let requests = "ninefold_9p_requests_total";
    assert_eq!(delta(requests, &[("type", "Twrite")]), WRITES as f64);
    assert_eq!(delta(requests, &[("type", "Tfsync")]), 1.0);
    assert_eq!(delta(requests, &[("type", "Tread")]), 2.0);
    assert_eq!(delta(requests, &[("type", "Tlcreate")]), 1.0);
    assert_eq!(delta("ninefold_fsyncs_total", &[]), 1.0);
    assert_eq!(delta("ninefold_9p_error_replies_total", &[]), 1.0);

    // Every request answered was timed once: per type, the histogram's count is the
    // number received (nothing is in flight), its buckets cumulative up to `+Inf` = count.
    let latency = "ninefold_9p_request_duration_seconds";
    let received = series(&after, requests);
    assert!(received.len() >= 6, "{received:?}");
    for r in received {
        let ty = r.labels["type"].as_str();
        let count = sample(&after, &format!("{latency}_count"), &[("type", ty)]);
        assert_eq!(count, Some(r.value), "{ty}: received vs timed\n{text}");
        check_buckets(&after, latency, ("type", ty), r.value);
    }
    assert!(sample(&after, &format!("{latency}_sum"), &[("type", "Tfsync")]).unwrap() > 0.0);

    // The device: the fsync made it flush, and every FLUSH request was timed.
    let flushes = series(&after, "ninefold_device_flushes_total");
    assert_eq!(flushes.len(), 1, "one device");
    let device = flushes[0].labels["device"].as_str();
    assert!(device.starts_with("nvme@"), "{device}");
    let dev = [("device", device)];
    assert!(
        delta("ninefold_device_flushes_total", &dev) >= 1.0,
        "{text}"
    );
    assert!(delta("ninefold_device_written_bytes_total", &dev) >= (WRITES * 4096) as f64);
    let flush_requests = sample(&after, "ninefold_device_flush_requests_total", &dev).unwrap();
    let flush_latency = "ninefold_device_flush_duration_seconds";
    assert_eq!(
        sample(&after, &format!("{flush_latency}_count"), &dev),
        Some(flush_requests)
    );
    check_buckets(&after, flush_latency, ("device", device), flush_requests);

    // Gauges and what must stay zero.
    assert!(sample(&after, "ninefold_9p_memory_limit_bytes", &[]).unwrap() > 0.0);
    assert!(sample(&after, "ninefold_heap_allocated_bytes", &[]).unwrap() > 0.0);
    assert_eq!(sample(&after, "ninefold_9p_connections", &[]), Some(1.0));
    assert_eq!(
        sample(&after, "ninefold_fs_corruptions_total", &[]),
        Some(0.0)
    );
    assert_eq!(sample(&after, "ninefold_fs_failed", &[]), Some(0.0));

    // The JSON answers, as before: plain and over HTTP.
    let json = stats::json(stats_port);
    assert_eq!(
        stats::counter(&json, "/9p/requests_by_type/Twrite") as f64,
        sample(&after, requests, &[("type", "Twrite")]).unwrap()
    );
    let (kind, body) = stats::http_get(stats_port, "/");
    assert_eq!(kind, "application/json");
    assert!(serde_json::from_str::<serde_json::Value>(&body).is_ok());

    drop(c);
    let boot = vm.stop();
    boot.expect_no_line("!!!");
    boot.expect_no_line("metric left out");
    image.fsck();
}

/// The `_bucket` series of histogram `name` for `label`: one per bound, `le` ascending,
/// counts never decreasing, the last `le="+Inf"` equal to `count`.
fn check_buckets(samples: &[Sample], name: &str, label: (&str, &str), count: f64) {
    let buckets: Vec<&Sample> = series(samples, &format!("{name}_bucket"))
        .into_iter()
        .filter(|s| s.labels.get(label.0).map(String::as_str) == Some(label.1))
        .collect();
    assert_eq!(buckets.len(), metrics::histogram::BUCKETS, "{label:?}");
    let bound = |s: &Sample| s.labels["le"].parse::<f64>().unwrap();
    for pair in buckets.windows(2) {
        assert!(bound(pair[0]) < bound(pair[1]), "{label:?}: le ascending");
        assert!(pair[0].value <= pair[1].value, "{label:?}: cumulative");
    }
    let last = buckets.last().unwrap();
    assert_eq!(last.labels["le"], "+Inf");
    assert_eq!(last.value, count, "{label:?}: +Inf is the count");
}

//! `cmdline`: the appliance's kernel command line (`kernel::config::Config::parse`,
//! `log_level`), built for the host. Whoever controls the VM's definition writes it.
//!
//! Input: a flags byte, then the command line (UTF-8; invalid sequences replaced).
//!
//! Checked: no panic; every ignored option prints; the effective configuration, printed
//! in command-line syntax (as the `config` event shows it), parses back to itself with
//! nothing ignored.

use kernel::config::{log_level, Config};

use crate::envelope::Envelope;

/// The target.
pub fn run(data: &[u8]) {
    let env = Envelope::new(data);
    let line = String::from_utf8_lossy(env.rest());
    let mut ignored = Vec::new();
    let c = Config::parse(&line, |i| ignored.push(i.to_string()));
    let _ = log_level(&line);
    let effective = c.to_string();
    let mut again_ignored = Vec::new();
    let again = Config::parse(&effective, |i| again_ignored.push(i.to_string()));
    assert!(
        again_ignored.is_empty(),
        "the effective line {effective:?} has ignored options: {again_ignored:?}"
    );
    assert_eq!(
        again, c,
        "the effective line {effective:?} parses to another configuration"
    );
}

/// Seeds: the README's examples, every option with a value, and malformed ones.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let lines: &[(&str, &str)] = &[
        ("default", "port=564 fs=disk"),
        ("network", "log=debug ip=10.0.2.15/24 gw=10.0.2.2 port=5640 mtu=9000 offload=off stats=5641"),
        ("disk", "disk=nvme0 mkfs=force fs=memory nvme=poll nvme_queues=4 discard=30 degraded=refuse"),
        ("limits", "msize=1048576 max_conns=64 max_conns_per_client=8 max_fids=4096 max_in_flight=64 client_mem=16M max_conns_per_tenant=16 max_fids_per_tenant=9000 max_locks_per_tenant=100 max_in_flight_per_tenant=128 client_mem_per_tenant=32M handshake_timeout=3 idle_timeout=600"),
        ("exports", "export=:/ export=squashed:/:squash=all export=locked:/:allow=192.0.2.1/32 group=1000:1000,1001 allow=10.0.2.0/24 stats_allow=127.0.0.1/32 admin_allow=10.0.2.2/32"),
        ("rates", "rebuild_rate=100 scrub_rate=50 stream_rate=8 data_cache=64M readahead=1M stream_buffer=256 scrub_interval=3600 snapshots=3"),
        ("cpus", "cpus=4 serve_cpus=1-3,5 selftest selftest=block bench=dev benchtime=5 shutdown_timeout=45 poweroff"),
        ("faults", "fault=write:0.01,read:0.001 fault_seed=7 crash=panic"),
        ("malformed", "ip=300.1.1.1/40 gw=x port=0 mtu=1 cpus=0 serve_cpus=9-1 export=: group=x: msize= log= unknown=1 =5"),
    ];
    lines
        .iter()
        .map(|(n, l)| (n.to_string(), [&[0u8][..], l.as_bytes()].concat()))
        .collect()
}

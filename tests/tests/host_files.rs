//! The files docs/real-host.md gives an operator for a real host (`docs/host/`), checked as
//! far as this machine allows: the libvirt domain against libvirt's own schema (xmllint
//! and the schemas from Debian's libvirt0, fetched by `scripts/deps.sh`), the systemd unit
//! with `systemd-analyze verify`, and the plain QEMU launcher booted for real — TCG, an
//! image file standing in for the passed-through NVMe drive and user networking for the
//! bridge, but the same static-address kernel command line — serving 9P, then stopped
//! through its QMP socket as `virsh shutdown` would, leaving a clean image.
//!
//! Host port: 9P on 16650.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ninefold_tests::ninep::connect;
use ninefold_tests::{image, qmp, tool, FsImage};
use ninep::wire::open_flags;

/// `docs/host/NAME` in this checkout.
fn host_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/host")
        .join(name)
}

#[test]
fn libvirt_domain_matches_libvirts_schema() {
    let schemas = std::env::var_os("NINEFOLD_LIBVIRT_SCHEMAS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/libvirt-schemas"));
    let domain_rng = schemas.join("domain.rng");
    assert!(
        domain_rng.is_file(),
        "{} missing: scripts/deps.sh fetches libvirt's schemas",
        domain_rng.display()
    );
    let validate = |xml: &Path| {
        Command::new("xmllint")
            .args(["--noout", "--relaxng"])
            .arg(&domain_rng)
            .arg(xml)
            .output()
            .expect("running xmllint (libxml2-utils; scripts/deps.sh installs it)")
    };
    let domain = host_file("ninefold.xml");
    let out = validate(&domain);
    assert!(
        out.status.success(),
        "{} is not a valid libvirt domain: {}",
        domain.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    // The check can fail: a domain with a device libvirt does not know is refused.
    let text = std::fs::read_to_string(&domain).unwrap();
    let broken = std::env::temp_dir().join(format!("ninefold-domain-{}.xml", std::process::id()));
    std::fs::write(&broken, text.replace("<memballoon", "<balloon")).unwrap();
    assert!(
        !validate(&broken).status.success(),
        "xmllint accepts a broken domain"
    );
    let _ = std::fs::remove_file(broken);
}

#[test]
fn systemd_unit_verifies() {
    // `systemd-analyze verify` checks that ExecStart's binary exists: point it at the
    // tool this checkout built.
    let unit = std::fs::read_to_string(host_file("ninefold-serve.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/ninefold serve "));
    let dir = std::env::temp_dir().join(format!("ninefold-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ninefold-serve.service");
    let here = unit.replace("/usr/local/bin/ninefold", tool().to_str().unwrap());
    std::fs::write(&path, here).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("running systemd-analyze (package systemd)");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    // Unknown keys are only warnings for systemd; the unit must have none.
    assert!(
        said.trim().is_empty(),
        "systemd-analyze verify warns: {said}"
    );

    // Its ExecStart line is a command `ninefold serve` accepts (it fails on the missing
    // image, not on the flags).
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/ninefold "))
        .unwrap();
    let out = Command::new(tool())
        .args(exec.split_whitespace())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/var/lib/ninefold/data.img"),
        "ninefold {exec}: {err}"
    );
}

#[test]
fn plain_qemu_command_boots_with_a_static_address() {
    const PORT: u16 = 16650;
    let disk = FsImage::formatted("128M");
    let qmp_socket = std::env::temp_dir().join(format!("ninefold-host-{}.qmp", std::process::id()));
    let mut child = Command::new("bash")
        .arg(host_file("ninefold-qemu.sh"))
        .env("KERNEL", image())
        .env("DISK", disk.path())
        .env("NET", format!("user:{PORT}"))
        .env("IP", "10.0.2.15/24")
        .env("GW", "10.0.2.2")
        .env("ACCEL", "tcg")
        .env("MEM", "256M")
        .env("CPUS", "1")
        .env("QMP", &qmp_socket)
        .env(
            "QEMU",
            std::env::var("NINEFOLD_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("running docs/host/ninefold-qemu.sh");
    // The serial console, line by line, from a reader thread.
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut console = Vec::new();
    let wait_for = |needle: &str, console: &mut Vec<String>| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
                console.push(line.clone());
                if line.contains(needle) {
                    return;
                }
            }
        }
        panic!("no {needle:?} on the console:\n{}", console.join("\n"));
    };
    wait_for(
        "net: static address 10.0.2.15/24, gateway 10.0.2.2",
        &mut console,
    );
    wait_for("9p: listening on 10.0.2.15:564", &mut console);

    let mut c = connect(PORT, Duration::from_secs(60));
    c.attach(0, 0, "").unwrap();
    c.walk(0, 1, "").unwrap();
    c.lcreate(1, "from-the-host-script", open_flags::RDWR, 0o644)
        .unwrap();
    c.write(1, 0, b"served").unwrap();
    drop(c);

    // `virsh shutdown`: the power button through the QMP socket the script opened.
    qmp::execute(&qmp_socket, "system_powerdown").expect("QMP system_powerdown");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no power-off within 60 s:\n{}", console.join("\n"));
        }
        while let Ok(line) = lines.try_recv() {
            console.push(line);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = std::fs::remove_file(&qmp_socket);
    // The rest of the console, up to its end (the reader stops at EOF).
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        console.push(line);
    }
    assert!(status.success(), "QEMU after power-off: {status}");
    assert!(
        console.iter().any(|l| l.contains("shutdown: done in")),
        "a clean shutdown on the console:\n{}",
        console.join("\n")
    );
    // The power button unmounts cleanly.
    disk.fsck_unmounted_cleanly();
}

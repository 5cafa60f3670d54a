//! `--connect ADDR[:PORT]`: the administration commands against a running appliance (or
//! `ninefold serve`), through its `ctl` export over 9P2000.L — the same files an
//! operator reaches by mounting it (`docs/operating.md`, "The control file"), with no
//! mount and no Linux client.
//!
//! [`Remote`] is a small blocking 9P client over the project's own codec
//! (`ninep::wire`): one request in flight, every reply checked (tag, type, size), every
//! failure a message that says what to do. The server is another machine, so nothing it
//! sends is trusted: a reply that does not decode or does not match its request ends
//! the session.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use ninep::wire::{self, Rmsg, Tmsg};
use vfs::Errno;

/// The 9P port when `--connect` names none.
pub const DEFAULT_PORT: u16 = 564;
/// The message size asked for: replies as large as the server's streams' chunks.
const MSIZE: u32 = 1 << 20;
/// How long connecting and each reply may take before the command gives up. Long: a
/// `sync` waits for a checkpoint, a `send` read for the sender.
const TIMEOUT: Duration = Duration::from_secs(300);
/// The fid of the export's root; the files' fids follow it.
const ROOT: u32 = 0;
/// `Tlopen` flags (Linux's).
const O_RDONLY: u32 = 0;
const O_WRONLY: u32 = 1;
const O_TRUNC: u32 = 0o1000;

/// The `ctl` export's files (`ninep::admin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    /// Commands in, the last command's reply out.
    Ctl,
    /// `key value` lines of the filesystem's state.
    Status,
    /// The scrub pass's report.
    Scrub,
    /// The stream of the running send.
    Send,
    /// Where a receive's stream is written (twice).
    Receive,
}

impl File {
    fn name(self) -> &'static str {
        match self {
            File::Ctl => "ctl",
            File::Status => "status",
            File::Scrub => "scrub",
            File::Send => "send",
            File::Receive => "receive",
        }
    }
}

/// A session with an appliance's administration export.
#[derive(Debug)]
pub struct Remote {
    stream: TcpStream,
    /// Where it is, for messages.
    addr: SocketAddr,
    /// The negotiated message size.
    msize: u32,
    tag: u16,
    /// The next fid to use for a file.
    next_fid: u32,
}

/// `ADDR[:PORT]` (a host name or an IPv4 address; `[v6]:PORT` too) as socket addresses,
/// `default_port` when it names none.
pub fn resolve(target: &str, default_port: u16) -> Result<Vec<SocketAddr>, String> {
    let with_port = match target.rsplit_once(':') {
        Some((_, port)) if !target.ends_with(']') && port.parse::<u16>().is_ok() => {
            target.to_string()
        }
        _ => format!("{target}:{default_port}"),
    };
    let addrs: Vec<SocketAddr> = with_port
        .to_socket_addrs()
        .map_err(|e| format!("--connect {target}: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("--connect {target}: no address"));
    }
    Ok(addrs)
}

impl Remote {
    /// Connects to `target` (`ADDR[:PORT]`, port 564 by default) and attaches to its
    /// administration export.
    pub fn connect(target: &str) -> Result<Remote, String> {
        let mut last = None;
        for addr in resolve(target, DEFAULT_PORT)? {
            match TcpStream::connect_timeout(&addr, TIMEOUT.min(Duration::from_secs(20))) {
                Ok(stream) => return Remote::start(stream, addr),
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        Err(format!(
            "cannot connect to {target} ({}); is the appliance running and its 9P port \
             (port=, default {DEFAULT_PORT}) reachable from here?",
            last.unwrap_or_default()
        ))
    }

    fn start(stream: TcpStream, addr: SocketAddr) -> Result<Remote, String> {
        stream
            .set_read_timeout(Some(TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| format!("{addr}: {e}"))?;
        let mut remote = Remote {
            stream,
            addr,
            msize: MSIZE,
            tag: 0,
            next_fid: ROOT + 1,
        };
        let version = Tmsg::Version {
            msize: MSIZE,
            version: b"9P2000.L",
        };
        let (msize, version) = remote.call(&version, |r| match r {
            Rmsg::Version { msize, version } => Some((msize, version == b"9P2000.L")),
            _ => None,
        })?;
        if !version {
            return Err(format!("{addr}: the server does not speak 9P2000.L"));
        }
        // Room for a header and a useful amount of data.
        if msize < 4096 {
            return Err(format!("{addr}: message size {msize} too small"));
        }
        remote.msize = msize.min(MSIZE);
        let attach = Tmsg::Attach {
            fid: ROOT,
            afid: wire::NOFID,
            uname: b"root",
            aname: b"ctl",
            n_uname: 0,
        };
        remote
            .call(&attach, |r| matches!(r, Rmsg::Attach { .. }).then_some(()))
            .map_err(|e| {
                if e.contains("EACCES") || e.contains("ENOENT") {
                    format!(
                        "{e}: the appliance serves its administration export (aname ctl) \
                         only to the addresses admin_allow= lists (ninefold serve \
                         --admin-allow); add this host's"
                    )
                } else {
                    e
                }
            })?;
        Ok(remote)
    }

    /// Runs one command of the `ctl` file (`sync`, `snapshot create NAME`, ...) and
    /// returns its reply; a refused or failed command is an `Err` with the appliance's
    /// reason.
    pub fn command(&mut self, line: &str) -> Result<String, String> {
        let fid = self.open(File::Ctl, O_WRONLY | O_TRUNC)?;
        let written = self.write_at(fid, 0, line.as_bytes());
        let _ = self.clunk(fid);
        let reply = self.read_all(File::Ctl)?;
        let reply = String::from_utf8_lossy(&reply).trim_end().to_string();
        match written {
            Ok(_) => Ok(reply),
            // The reason is the reply (`error: ...`); a bare errno if there is none.
            Err(e) => Err(match reply.strip_prefix("error: ") {
                Some(why) => why.to_string(),
                None => e,
            }),
        }
    }

    /// The whole of a small file (`status`, `scrub`, `ctl`).
    pub fn read_all(&mut self, file: File) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        self.read_stream(file, &mut |chunk| {
            out.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(out)
    }

    /// Reads `file` from its start to its end (a read of 0 bytes), giving each chunk
    /// to `sink` as it comes; returns the bytes read.
    pub fn read_stream(
        &mut self,
        file: File,
        sink: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<u64, String> {
        let fid = self.open(file, O_RDONLY)?;
        let count = self.msize - wire::SMALL_REPLY as u32;
        let mut offset = 0u64;
        let done = loop {
            let read = Tmsg::Read { fid, offset, count };
            let chunk = self.call(&read, |r| match r {
                Rmsg::Read { data } if data.0.len() <= count as usize => Some(data.0.to_vec()),
                _ => None,
            });
            match chunk {
                Ok(c) if c.is_empty() => break Ok(offset),
                Ok(c) => {
                    offset += c.len() as u64;
                    if let Err(e) = sink(&c) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(format!("reading {}: {e}", file.name())),
            }
        };
        let _ = self.clunk(fid);
        done
    }

    /// Writes everything `source` gives into `file` from offset 0, then closes it (for
    /// `receive`, the end of a pass); returns the bytes written.
    pub fn write_stream(&mut self, file: File, source: &mut dyn Read) -> Result<u64, String> {
        let fid = self.open(file, O_WRONLY)?;
        let mut buf = vec![0u8; (self.msize - wire::SMALL_REPLY as u32) as usize];
        let mut offset = 0u64;
        let done = loop {
            let n = match source.read(&mut buf) {
                Ok(0) => break Ok(offset),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(format!("reading the stream: {e}")),
            };
            let mut at = 0;
            while at < n {
                match self.write_at(fid, offset, &buf[at..n]) {
                    Ok(w) => {
                        at += w;
                        offset += w as u64;
                    }
                    Err(e) => return self.clunk(fid).and(Err(e)),
                }
            }
        };
        // The clunk is what ends the pass: its failure is the command's.
        let closed = self.clunk(fid);
        done.and_then(|n| closed.map(|()| n))
    }

    fn open(&mut self, file: File, flags: u32) -> Result<u32, String> {
        let fid = self.next_fid;
        self.next_fid = self.next_fid.wrapping_add(1).max(ROOT + 1);
        let walk = Tmsg::Walk {
            fid: ROOT,
            newfid: fid,
            names: vec![file.name().as_bytes()],
        };
        self.call(&walk, |r| match r {
            Rmsg::Walk { qids } if qids.len() == 1 => Some(()),
            _ => None,
        })
        .map_err(|e| format!("{}: {e}", file.name()))?;
        let opened = self.call(&Tmsg::Lopen { fid, flags }, |r| {
            matches!(r, Rmsg::Lopen { .. }).then_some(())
        });
        match opened {
            Ok(()) => Ok(fid),
            Err(e) => {
                let _ = self.clunk(fid);
                Err(format!("opening {}: {e}", file.name()))
            }
        }
    }

    fn write_at(&mut self, fid: u32, offset: u64, data: &[u8]) -> Result<usize, String> {
        let max = (self.msize as usize)
            .saturating_sub(wire::SMALL_REPLY)
            .max(1);
        let data = &data[..data.len().min(max)];
        let msg = Tmsg::Write {
            fid,
            offset,
            data: wire::Data(data),
        };
        let n = self.call(&msg, |r| match r {
            Rmsg::Write { count } => Some(count as usize),
            _ => None,
        })?;
        if n == 0 || n > data.len() {
            return Err(format!("the server wrote {n} of {} bytes", data.len()));
        }
        Ok(n)
    }

    fn clunk(&mut self, fid: u32) -> Result<(), String> {
        self.call(&Tmsg::Clunk { fid }, |r| {
            matches!(r, Rmsg::Clunk {}).then_some(())
        })
    }

    /// Sends `msg` and decodes its reply with `pick`, which returns `None` for a reply
    /// of the wrong kind. An `Rlerror` is the errno, named.
    fn call<T>(
        &mut self,
        msg: &Tmsg<'_>,
        pick: impl FnOnce(Rmsg<'_>) -> Option<T>,
    ) -> Result<T, String> {
        self.tag = self.tag % 0xfffe + 1;
        let mut frame = Vec::new();
        msg.encode(self.tag, &mut frame)
            .map_err(|e| format!("encoding {:?}: {e:?}", msg.msg_type()))?;
        self.stream
            .write_all(&frame)
            .map_err(|e| format!("{}: sending: {e}", self.addr))?;
        let reply = self.read_frame()?;
        let (tag, r) = Rmsg::decode(&reply)
            .map_err(|e| format!("{}: a reply that does not decode: {e:?}", self.addr))?;
        if tag != self.tag {
            return Err(format!(
                "{}: a reply to tag {tag}, not {}",
                self.addr, self.tag
            ));
        }
        if let Rmsg::Lerror { ecode } = r {
            let text = std::io::Error::from_raw_os_error(ecode as i32);
            return Err(format!("{} ({text})", Errno(ecode).name()));
        }
        pick(r).ok_or_else(|| format!("{}: an unexpected reply", self.addr))
    }

    fn read_frame(&mut self) -> Result<Vec<u8>, String> {
        let addr = self.addr;
        let gone = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format!("{addr}: the connection was closed"),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("{addr}: no reply in {} s", TIMEOUT.as_secs())
            }
            _ => format!("{addr}: {e}"),
        };
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(gone)?;
        let len = u32::from_le_bytes(size);
        if !(7..=self.msize.max(MSIZE)).contains(&len) {
            return Err(format!("{addr}: a reply of {len} bytes"));
        }
        let mut frame = vec![0u8; len as usize];
        frame[..4].copy_from_slice(&size);
        self.stream.read_exact(&mut frame[4..]).map_err(gone)?;
        Ok(frame)
    }
}

/// Where an administration command runs: an image file on this host (mounted, changed,
/// unmounted), or a running appliance (`--connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An image file.
    Image(std::path::PathBuf),
    /// `ADDR[:PORT]` of a running appliance or `ninefold serve`.
    Appliance(String),
}

/// Splits a command's operands: with `--connect`, they are all the command's own; without,
/// the first is the image (`usage` names what is expected, for the error).
pub fn target(
    connect: Option<&str>,
    mut operands: Vec<String>,
    usage: &str,
) -> Result<(Target, Vec<String>), String> {
    match connect {
        Some(addr) => Ok((Target::Appliance(addr.to_string()), operands)),
        None if operands.is_empty() => Err(format!(
            "expected {usage} (or --connect ADDR[:PORT] for a running appliance)"
        )),
        None => {
            let image = operands.remove(0);
            Ok((Target::Image(image.into()), operands))
        }
    }
}

/// The value of `key` in the `status` file's `key value` lines (the rest of the line).
pub fn status_value<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(' ').unwrap_or((l, ""));
        (k == key).then_some(v.trim())
    })
}

/// Waits until the `status` line `key` (`scrub`, `send`, `receive`) no longer starts
/// with one of `busy` (e.g. `running`), checking every `every`; returns the status text
/// then.
pub fn wait_while(
    remote: &mut Remote,
    key: &str,
    busy: &[&str],
    every: Duration,
) -> Result<String, String> {
    loop {
        let status = String::from_utf8_lossy(&remote.read_all(File::Status)?).into_owned();
        let state = status_value(&status, key).unwrap_or("");
        if !busy.iter().any(|b| state.starts_with(b)) {
            return Ok(status);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_without_a_port_gets_564() {
        let a = resolve("127.0.0.1", DEFAULT_PORT).unwrap();
        assert_eq!(a[0].port(), DEFAULT_PORT);
        let a = resolve("127.0.0.1:5640", DEFAULT_PORT).unwrap();
        assert_eq!(a[0].port(), 5640);
        let a = resolve("[::1]", 7).unwrap();
        assert_eq!(a[0].port(), 7);
        assert!(resolve("no.such.host.invalid", 1).is_err());
    }

    #[test]
    fn operands_name_the_image_unless_connected() {
        let ops = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (t, rest) = target(None, ops(&["a.img", "sync"]), "IMAGE COMMAND").unwrap();
        assert_eq!((t, rest), (Target::Image("a.img".into()), ops(&["sync"])));
        let (t, rest) = target(Some("h:1"), ops(&["sync"]), "IMAGE COMMAND").unwrap();
        assert_eq!((t, rest), (Target::Appliance("h:1".into()), ops(&["sync"])));
        assert!(target(None, vec![], "IMAGE")
            .unwrap_err()
            .contains("--connect"));
    }

    #[test]
    fn status_values_by_key() {
        let s = "state clean\nscrub complete bytes 10 errors 0 skipped 0\nscrubs 2\n";
        assert_eq!(
            status_value(s, "scrub"),
            Some("complete bytes 10 errors 0 skipped 0")
        );
        assert_eq!(status_value(s, "scrubs"), Some("2"));
        assert_eq!(status_value(s, "send"), None);
    }
}

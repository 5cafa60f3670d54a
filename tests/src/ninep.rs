//! A 9P2000.L client over real TCP, for tests that drive the appliance through QEMU's
//! host forward (`Qemu::virtio_net_forward`), or at its own address on a tap device
//! (`Qemu::virtio_net_tap`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ninep::testing::{Client, Exchange};

/// How long one request may take before the test fails (TCG is slow, not this slow).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// One request, one reply, over a blocking socket.
#[derive(Debug)]
pub struct Tcp(pub TcpStream);

impl Exchange for Tcp {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        self.0.write_all(request).expect("sending a request");
        read_frame(&mut self.0).expect("reading a reply")
    }
}

/// Reads one 9P frame.
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let len = u32::from_le_bytes(size) as usize;
    if !(7..=(16 << 20)).contains(&len) {
        return Err(std::io::Error::other(format!("frame size {len}")));
    }
    let mut frame = size.to_vec();
    frame.resize(len, 0);
    s.read_exact(&mut frame[4..])?;
    Ok(frame)
}

/// A TCP connection to `127.0.0.1:port`. QEMU's user-mode forward accepts on the host
/// before the guest does, so a refused or not-yet-listening guest shows as a connection
/// that closes; [`connect`] retries the first exchange for that reason.
pub fn stream(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the forward");
    s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A versioned client (msize 1 MiB) on `127.0.0.1:port`, retrying for up to `wait` while
/// the appliance comes up.
pub fn connect(port: u16, wait: Duration) -> Client<Tcp> {
    connect_to(SocketAddr::from(([127, 0, 0, 1], port)), wait)
}

/// A versioned client (msize 1 MiB) on `addr`, retrying for up to `wait` while the
/// appliance comes up.
pub fn connect_to(addr: SocketAddr, wait: Duration) -> Client<Tcp> {
    let s = versioned_timed_to(addr, wait)
        .map(|(s, _)| s)
        .unwrap_or_else(|| panic!("no 9P server answered on {addr} within {wait:?}"));
    Client::new(Tcp(s))
}

/// Like [`connect`], but the client survives the server's death: see [`Lossy`]. If no
/// server answers within `wait`, the client starts out gone.
pub fn connect_lossy(port: u16, wait: Duration) -> Client<Lossy> {
    Client::new(Lossy(versioned(port, wait)))
}

/// [`connect_lossy`], and how the connection was made (`None`: no server answered).
pub fn connect_lossy_timed(port: u16, wait: Duration) -> (Client<Lossy>, Option<Handshake>) {
    let (stream, handshake) = versioned_timed(port, wait).unzip();
    (Client::new(Lossy(stream)), handshake)
}

/// A connection to a server that may die at any moment (the kill test): once the socket
/// fails, every request (the one in flight included) gets `Rlerror(ECONNRESET)`, so a
/// reply is seen only if the server really sent it.
#[derive(Debug)]
pub struct Lossy(Option<TcpStream>);

/// The errno [`Lossy`] answers with once the connection is gone.
pub const GONE: vfs::Errno = vfs::Errno(104);

impl Lossy {
    /// A connection on `stream`, as it is (not versioned).
    pub fn new(stream: TcpStream) -> Lossy {
        Lossy(Some(stream))
    }

    /// Whether the connection has failed.
    pub fn is_gone(&self) -> bool {
        self.0.is_none()
    }

    /// The socket, while the connection lasts (for sending raw frames on it).
    pub fn stream(&self) -> Option<&TcpStream> {
        self.0.as_ref()
    }
}

impl Exchange for Lossy {
    fn exchange(&mut self, request: &[u8]) -> Vec<u8> {
        if let Some(s) = self.0.as_mut() {
            match s.write_all(request).and_then(|()| read_frame(s)) {
                Ok(reply) => return reply,
                Err(_) => self.0 = None,
            }
        }
        let mut frame = Vec::new();
        let tag = u16::from_le_bytes([request[5], request[6]]);
        ninep::wire::Rmsg::Lerror { ecode: GONE.0 }
            .encode(tag, &mut frame)
            .expect("Rlerror encodes");
        frame
    }
}

/// How a connection was made ([`versioned_timed`]): the successful try's `connect()` and
/// `Tversion` exchange, and the time lost to failed tries before it. Through QEMU's user
/// network `connect()` completes when QEMU's host socket accepts, before the appliance
/// has seen a SYN: a connection request the appliance loses shows in `version` (its reply
/// waits for QEMU to retransmit the SYN), one the host drops (QEMU's listen backlog
/// full) in `connect`, and one refused (reset) as a failed try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handshake {
    /// Tries (`connect` and `Tversion`), the successful one included.
    pub tries: u32,
    /// Time spent in failed tries and the pauses after them.
    pub retrying: Duration,
    /// The successful try's `connect()`.
    pub connect: Duration,
    /// Its `Tversion` exchange.
    pub version: Duration,
}

/// A TCP connection to `127.0.0.1:port` on which `Tversion` (msize 1 MiB) succeeded,
/// tried for up to `wait`.
fn versioned(port: u16, wait: Duration) -> Option<TcpStream> {
    versioned_timed(port, wait).map(|(s, _)| s)
}

/// [`versioned`], and how long each part of it took.
pub fn versioned_timed(port: u16, wait: Duration) -> Option<(TcpStream, Handshake)> {
    versioned_timed_to(SocketAddr::from(([127, 0, 0, 1], port)), wait)
}

/// [`versioned_timed`] to `addr`.
fn versioned_timed_to(addr: SocketAddr, wait: Duration) -> Option<(TcpStream, Handshake)> {
    let started = Instant::now();
    let deadline = started + wait;
    let mut tries = 0;
    loop {
        if Instant::now() >= deadline {
            return None;
        }
        tries += 1;
        let before = Instant::now();
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let connected = Instant::now();
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        let mut frame = Vec::new();
        ninep::wire::Tmsg::Version {
            msize: 1 << 20,
            version: b"9P2000.L",
        }
        .encode(0xffff, &mut frame)
        .unwrap();
        let ok = s.write_all(&frame).is_ok() && read_frame(&mut s).is_ok();
        if ok {
            let handshake = Handshake {
                tries,
                retrying: before - started,
                connect: connected - before,
                version: connected.elapsed(),
            };
            return Some((s, handshake));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ninefold serve --read-only` of `image` on the host (port chosen by it) and a
/// versioned client (msize 1 MiB) of it; kill the server when done.
pub fn serve_on_host(image: &std::path::Path) -> (std::process::Child, Client<Tcp>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut server = Command::new(crate::tool())
        .arg("serve")
        .arg(image)
        .args([
            "--read-only",
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("ninefold serve said {line:?}"))
        .to_string();
    let mut c = Client::new(Tcp(TcpStream::connect(&addr).unwrap()));
    c.version(1 << 20, b"9P2000.L").unwrap();
    (server, c)
}

//! The watchdog's channel between rank 0 and every other rank: TCP, authenticated,
//! bounded.
//!
//! Rank 0 makes a secret for the job (32 random bytes) and MPI broadcasts it with the
//! addresses it listens on; no one outside the job learns it. A connection starts with
//! a handshake in which each side proves that it holds the secret (HMAC-SHA-256 over
//! the other side's fresh nonce), so neither a stranger nor a rank of another job gets
//! in. After it, every line is `<seq> <mac> <body>`: the mac covers the direction, both
//! nonces, the rank, a sequence number that only grows (a replayed or reordered line is
//! refused) and the body. Anything else closes the connection.
//!
//! Reading is bounded whatever arrives: lines of at most [`MAX_LINE`] bytes, at most
//! [`READ_BUDGET`] bytes per connection per poll, line splitting linear in the bytes
//! read, at most [`MAX_HANDSHAKES`] handshakes at a time, each done within
//! [`HANDSHAKE`], one authenticated connection per rank, and a closed peer's socket is
//! released at once.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The channel's format; a peer speaking another is refused.
pub(crate) const VERSION: u32 = 2;
const MAGIC: &str = "ddpbench-watchdog";
/// The longest line accepted (a rank's status is a few hundred bytes).
pub(crate) const MAX_LINE: usize = 64 * 1024;
/// Bytes read from one connection in one poll.
pub(crate) const READ_BUDGET: usize = 256 * 1024;
/// Connections in their handshake at one time; more are closed as they arrive.
pub(crate) const MAX_HANDSHAKES: usize = 64;
/// Time a connection has to complete its handshake.
pub(crate) const HANDSHAKE: Duration = Duration::from_secs(3);
/// Connections accepted in one poll (the rest wait in the kernel's queue).
const MAX_ACCEPTS: usize = 1024;
/// Authenticated lines handled per connection per poll (a rank sends one a second).
const MAX_LINES: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// The job's shared secret.
#[derive(Clone)]
pub(crate) struct Secret([u8; 32]);

fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut filled = 0;
    while filled < N {
        // SAFETY: getrandom writes at most `N - filled` bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), N - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(b)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn nonce() -> std::io::Result<String> {
    Ok(hex(&random_bytes::<16>()?))
}

impl Secret {
    pub(crate) fn generate() -> std::io::Result<Secret> {
        Ok(Secret(random_bytes()?))
    }

    pub(crate) fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub(crate) fn from_hex(s: &str) -> Option<Secret> {
        unhex(s)?.try_into().ok().map(Secret)
    }

    fn keyed(&self, parts: &[&str]) -> HmacSha256 {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for p in parts {
            m.update(p.as_bytes());
            m.update(b"|");
        }
        m
    }

    fn mac(&self, parts: &[&str]) -> String {
        hex(&self.keyed(parts).finalize().into_bytes())
    }

    /// Whether `mac_hex` is the mac of `parts` (compared in constant time).
    fn verify(&self, parts: &[&str], mac_hex: &str) -> bool {
        unhex(mac_hex).is_some_and(|m| self.keyed(parts).verify_slice(&m).is_ok())
    }
}

/// Newline-framed lines on a non-blocking stream, read within bounds.
struct Frames {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a newline.
    scanned: usize,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

impl Frames {
    fn new(stream: TcpStream) -> Frames {
        let _ = stream.set_nonblocking(true);
        let _ = stream.set_nodelay(true);
        Frames {
            stream,
            buf: Vec::new(),
            scanned: 0,
            closed: None,
        }
    }

    fn close(&mut self, why: impl Into<String>) {
        if self.closed.is_none() {
            self.closed = Some(why.into());
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Up to `max_lines` complete lines, reading at most [`READ_BUDGET`] bytes; a line
    /// longer than [`MAX_LINE`] closes the connection.
    fn lines(&mut self, max_lines: usize) -> Vec<String> {
        let mut chunk = [0u8; 16 * 1024];
        let mut read = 0;
        while self.closed.is_none() && read < READ_BUDGET && self.buf.len() < READ_BUDGET + MAX_LINE {
            match self.stream.read(&mut chunk) {
                Ok(0) => self.close("closed by the peer"),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    read += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => self.close(format!("read failed: {e}")),
            }
        }
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = self.scanned;
        while out.len() < max_lines {
            let Some(off) = self.buf[i..].iter().position(|&b| b == b'\n') else {
                i = self.buf.len();
                break;
            };
            let end = i + off;
            if end - start > MAX_LINE {
                break;
            }
            out.push(String::from_utf8_lossy(&self.buf[start..end]).into_owned());
            start = end + 1;
            i = start;
        }
        self.buf.drain(..start);
        self.scanned = i - start;
        let first_line = self.buf.iter().position(|&b| b == b'\n').unwrap_or(self.buf.len());
        if first_line > MAX_LINE {
            self.close(format!("a line longer than {MAX_LINE} bytes"));
        }
        out
    }

    fn send(&mut self, line: &str) {
        if self.closed.is_some() {
            return;
        }
        let mut msg = line.replace('\n', " ");
        msg.push('\n');
        // A few hundred bytes on a socket with room; a peer that does not read is closed.
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_millis(200);
        while sent < msg.len() {
            match self.stream.write(&msg.as_bytes()[sent..]) {
                Ok(0) => return self.close("write returned 0"),
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return self.close(format!("write failed: {e}")),
            }
        }
    }
}

/// Which way a line goes (part of its mac, so a line cannot be reflected back).
#[derive(Clone, Copy)]
enum Side {
    Root,
    Member,
}

/// An authenticated connection's keys and counters.
struct Session {
    secret: Arc<Secret>,
    side: Side,
    rank: usize,
    root_nonce: String,
    member_nonce: String,
    sent: u64,
    received: u64,
}

impl Session {
    fn parts<'a>(&'a self, dir: &'a str, seq: &'a str, rank: &'a str, body: &'a str) -> [&'a str; 7] {
        [MAGIC, dir, &self.root_nonce, &self.member_nonce, rank, seq, body]
    }

    fn seal(&mut self, body: &str) -> String {
        self.sent += 1;
        let dir = match self.side {
            Side::Root => "to-member",
            Side::Member => "to-root",
        };
        let (seq, rank) = (self.sent.to_string(), self.rank.to_string());
        let mac = self.secret.mac(&self.parts(dir, &seq, &rank, body));
        format!("{seq} {mac} {body}")
    }

    /// The body of an authenticated line, or why the line is refused.
    fn open(&mut self, line: &str) -> Result<String, String> {
        let mut it = line.splitn(3, ' ');
        let (Some(seq), Some(mac), Some(body)) = (it.next(), it.next(), it.next()) else {
            return Err("a line that is not `<seq> <mac> <body>`".into());
        };
        let n: u64 = seq.parse().map_err(|_| "a line without a sequence number".to_string())?;
        let dir = match self.side {
            Side::Root => "to-root",
            Side::Member => "to-member",
        };
        let rank = self.rank.to_string();
        if !self.secret.verify(&self.parts(dir, seq, &rank, body), mac) {
            return Err("a line whose mac is wrong".into());
        }
        if n <= self.received {
            return Err(format!("line {n} after line {} (replayed)", self.received));
        }
        self.received = n;
        Ok(body.to_string())
    }
}

/// A connection in its handshake at rank 0.
struct Handshake {
    frames: Frames,
    since: Instant,
    root_nonce: String,
    /// Set once the hello came: the rank it claims and its nonce.
    hello: Option<(usize, String)>,
}

/// An authenticated connection at rank 0.
struct Peer {
    frames: Frames,
    session: Session,
}

/// Rank 0's end: listens, authenticates, and hands over the lines of each rank.
pub(crate) struct Hub {
    listeners: Vec<TcpListener>,
    secret: Arc<Secret>,
    size: usize,
    handshakes: Vec<Handshake>,
    peers: Vec<Option<Peer>>,
    /// Connections refused so far (only the first few are logged).
    pub refused: u64,
}

/// What one poll of the hub received.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Authenticated lines: (rank, body).
    pub lines: Vec<(usize, String)>,
    /// Connections refused in this poll, with why.
    pub refused: Vec<String>,
}

impl Hub {
    /// Listens on port 0 of each address (one port, the first one's, where it can).
    pub(crate) fn bind(addresses: &[IpAddr], secret: Arc<Secret>, size: usize) -> std::io::Result<(Hub, Vec<SocketAddr>)> {
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for ip in addresses {
            let port = bound.first().map(|a: &SocketAddr| a.port()).unwrap_or(0);
            let l = TcpListener::bind((*ip, port)).or_else(|_| TcpListener::bind((*ip, 0)))?;
            l.set_nonblocking(true)?;
            bound.push(l.local_addr()?);
            listeners.push(l);
        }
        let hub = Hub {
            listeners,
            secret,
            size,
            handshakes: Vec::new(),
            peers: (0..size).map(|_| None).collect(),
            refused: 0,
        };
        Ok((hub, bound))
    }

    /// True while a rank other than 0 has no authenticated connection.
    pub(crate) fn missing_ranks(&self) -> bool {
        self.peers.iter().skip(1).any(Option::is_none)
    }

    /// Accepts, advances handshakes and reads every authenticated connection, within
    /// the bounds of the module's constants.
    pub(crate) fn poll(&mut self) -> Received {
        let mut got = Received::default();
        self.accept(&mut got);
        self.advance_handshakes(&mut got);
        for slot in self.peers.iter_mut() {
            let Some(peer) = slot else { continue };
            for line in peer.frames.lines(MAX_LINES) {
                match peer.session.open(&line) {
                    Ok(body) => got.lines.push((peer.session.rank, body)),
                    Err(why) => {
                        got.refused.push(format!("rank {}'s connection: {why}", peer.session.rank));
                        peer.frames.close(why);
                        break;
                    }
                }
            }
            if peer.frames.closed.is_some() {
                *slot = None;
            }
        }
        self.refused += got.refused.len() as u64;
        got
    }

    fn accept(&mut self, got: &mut Received) {
        for l in &self.listeners {
            for _ in 0..MAX_ACCEPTS {
                let Ok((stream, from)) = l.accept() else { break };
                if self.handshakes.len() >= MAX_HANDSHAKES {
                    drop(stream);
                    got.refused.push(format!("{from}: {MAX_HANDSHAKES} handshakes already under way"));
                    continue;
                }
                match nonce() {
                    Ok(root_nonce) => self.handshakes.push(Handshake {
                        frames: Frames::new(stream),
                        since: Instant::now(),
                        root_nonce,
                        hello: None,
                    }),
                    Err(e) => got.refused.push(format!("{from}: no random nonce ({e})")),
                }
            }
        }
    }

    fn advance_handshakes(&mut self, got: &mut Received) {
        let mut i = 0;
        while i < self.handshakes.len() {
            let h = &mut self.handshakes[i];
            let from = h.frames.stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            let step = match h.frames.lines(1).pop() {
                Some(line) => self.handshake_step(i, &line),
                None if h.frames.closed.is_some() => Err(h.frames.closed.clone().unwrap_or_default()),
                None if h.since.elapsed() > HANDSHAKE => Err(format!("no handshake within {} s", HANDSHAKE.as_secs())),
                None => Ok(false),
            };
            match step {
                Ok(true) => {
                    let h = self.handshakes.swap_remove(i);
                    self.promote(h);
                }
                Ok(false) => i += 1,
                Err(why) => {
                    let mut h = self.handshakes.swap_remove(i);
                    h.frames.close(why.clone());
                    if why != "closed by the peer" {
                        got.refused.push(format!("{from}: {why}"));
                    }
                }
            }
        }
    }

    /// One handshake line of connection `i`: Ok(true) once authenticated.
    fn handshake_step(&mut self, i: usize, line: &str) -> Result<bool, String> {
        let size = self.size;
        let secret = self.secret.clone();
        let h = &mut self.handshakes[i];
        let words: Vec<&str> = line.split(' ').collect();
        match (&h.hello, words.as_slice()) {
            (None, [MAGIC, version, "hello", rank, member_nonce]) => {
                if *version != VERSION.to_string() {
                    return Err(format!("channel version {version}, this job speaks {VERSION}"));
                }
                let rank: usize = rank.parse().map_err(|_| format!("hello from rank {rank:?}"))?;
                if rank == 0 || rank >= size {
                    return Err(format!("hello from rank {rank}, not a rank of this job's {size}"));
                }
                if unhex(member_nonce).is_none_or(|n| n.len() != 16) {
                    return Err("a hello without a 16-byte nonce".into());
                }
                let proof = secret.mac(&[MAGIC, "root-proof", member_nonce, &rank.to_string()]);
                h.frames.send(&format!("{MAGIC} {VERSION} challenge {} {proof}", h.root_nonce));
                h.hello = Some((rank, member_nonce.to_string()));
                Ok(false)
            }
            (Some((rank, _)), [MAGIC, _, "auth", proof]) => {
                if secret.verify(&[MAGIC, "member-proof", &h.root_nonce, &rank.to_string()], proof) {
                    Ok(true)
                } else {
                    Err(format!("rank {rank}'s proof is wrong (not this job's secret)"))
                }
            }
            _ => Err(format!("not a {MAGIC} {VERSION} handshake: {:?}", truncate(line, 60))),
        }
    }

    fn promote(&mut self, h: Handshake) {
        let Some((rank, member_nonce)) = h.hello else { return };
        let mut session = Session {
            secret: self.secret.clone(),
            side: Side::Root,
            rank,
            root_nonce: h.root_nonce,
            member_nonce,
            sent: 0,
            received: 0,
        };
        let mut frames = h.frames;
        let welcome = session.seal("welcome");
        frames.send(&welcome);
        // A rank that connects again (after its link broke) replaces its old connection.
        self.peers[rank] = Some(Peer { frames, session });
    }

    /// Sends `body` to rank `rank`, if it is connected.
    pub(crate) fn send(&mut self, rank: usize, body: &str) {
        if let Some(Some(p)) = self.peers.get_mut(rank) {
            let line = p.session.seal(body);
            p.frames.send(&line);
        }
    }

    /// Sends `body` to every connected rank.
    pub(crate) fn send_all(&mut self, body: &str) {
        for r in 0..self.peers.len() {
            self.send(r, body);
        }
    }

    /// Open connections: authenticated ones and handshakes.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.peers.iter().flatten().count() + self.handshakes.len()
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// A rank's end of the channel: its authenticated connection to rank 0.
pub(crate) struct Uplink {
    frames: Frames,
    session: Session,
}

impl Uplink {
    /// Connects to the first of `addresses` where rank 0 proves it holds the secret,
    /// and proves the same in turn. Blocks for at most a few seconds per address.
    pub(crate) fn connect(addresses: &[SocketAddr], secret: Arc<Secret>, rank: usize) -> Result<Uplink, String> {
        let mut why = Vec::new();
        for addr in addresses {
            match Uplink::connect_one(addr, secret.clone(), rank) {
                Ok(u) => return Ok(u),
                Err(e) => why.push(format!("{addr}: {e}")),
            }
        }
        Err(why.join("; "))
    }

    fn connect_one(addr: &SocketAddr, secret: Arc<Secret>, rank: usize) -> Result<Uplink, String> {
        let stream = TcpStream::connect_timeout(addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let mut frames = Frames::new(stream);
        let member_nonce = nonce().map_err(|e| e.to_string())?;
        frames.send(&format!("{MAGIC} {VERSION} hello {rank} {member_nonce}"));
        let challenge = wait_line(&mut frames)?;
        let words: Vec<&str> = challenge.split(' ').collect();
        let [MAGIC, _, "challenge", root_nonce, proof] = words.as_slice() else {
            return Err(format!("not rank 0's watchdog: {:?}", truncate(&challenge, 60)));
        };
        if !secret.verify(&[MAGIC, "root-proof", &member_nonce, &rank.to_string()], proof) {
            return Err("the listener there does not hold this job's secret".into());
        }
        let mine = secret.mac(&[MAGIC, "member-proof", root_nonce, &rank.to_string()]);
        frames.send(&format!("{MAGIC} {VERSION} auth {mine}"));
        let mut session = Session {
            secret,
            side: Side::Member,
            rank,
            root_nonce: root_nonce.to_string(),
            member_nonce,
            sent: 0,
            received: 0,
        };
        match session.open(&wait_line(&mut frames)?)?.as_str() {
            "welcome" => Ok(Uplink { frames, session }),
            other => Err(format!("rank 0 said {other:?} instead of welcome")),
        }
    }

    pub(crate) fn send(&mut self, body: &str) {
        let line = self.session.seal(body);
        self.frames.send(&line);
    }

    /// Authenticated lines from rank 0; a line that fails closes the link.
    pub(crate) fn receive(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for line in self.frames.lines(MAX_LINES) {
            match self.session.open(&line) {
                Ok(body) => out.push(body),
                Err(why) => {
                    self.frames.close(why);
                    break;
                }
            }
        }
        out
    }

    /// Why the link ended, once it has.
    pub(crate) fn closed(&self) -> Option<&str> {
        self.frames.closed.as_deref()
    }
}

/// The next line within [`HANDSHAKE`].
fn wait_line(frames: &mut Frames) -> Result<String, String> {
    let deadline = Instant::now() + HANDSHAKE;
    loop {
        if let Some(line) = frames.lines(1).pop() {
            return Ok(line);
        }
        if let Some(why) = &frames.closed {
            return Err(why.clone());
        }
        if Instant::now() > deadline {
            return Err(format!("no answer within {} s", HANDSHAKE.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a rank tells rank 0 about its network: its host name and IPv4 addresses with
/// their prefix lengths (loopback left out).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct NetIdentity {
    pub host: String,
    pub ipv4: Vec<(Ipv4Addr, u8)>,
}

impl NetIdentity {
    pub(crate) fn here(host: &str) -> NetIdentity {
        NetIdentity {
            host: host.to_string(),
            ipv4: interface_ipv4s(),
        }
    }

    /// Whether `other` reaches this node's loopback: the same host name, or an address
    /// of the same network namespace.
    fn shares_loopback(&self, other: &NetIdentity) -> bool {
        other.host == self.host
            || other.ipv4.iter().any(|(ip, _)| self.ipv4.iter().any(|(mine, _)| mine == ip))
            || (other.ipv4.is_empty() && self.ipv4.is_empty())
    }
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    u32::from(a) & mask == u32::from(b) & mask
}

/// The addresses rank 0 listens on: loopback when a peer shares its node, and for the
/// others each of rank 0's addresses on a subnet they are on; only when a peer shares
/// no subnet with rank 0 (a routed network) every address of rank 0.
pub(crate) fn listen_addresses(root: &NetIdentity, peers: &[NetIdentity]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    let push = |ip: IpAddr, out: &mut Vec<IpAddr>| {
        if !out.contains(&ip) {
            out.push(ip);
        }
    };
    let mut unrouted = false;
    for p in peers {
        if root.shares_loopback(p) {
            push(IpAddr::V4(Ipv4Addr::LOCALHOST), &mut out);
            continue;
        }
        let near: Vec<Ipv4Addr> = root
            .ipv4
            .iter()
            .filter(|(mine, prefix)| p.ipv4.iter().any(|(theirs, _)| same_subnet(*mine, *theirs, *prefix)))
            .map(|(mine, _)| *mine)
            .collect();
        match near.first() {
            Some(ip) => push(IpAddr::V4(*ip), &mut out),
            None => unrouted = true,
        }
    }
    if unrouted {
        for (ip, _) in &root.ipv4 {
            push(IpAddr::V4(*ip), &mut out);
        }
    }
    if out.is_empty() {
        out.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    out
}

/// The node's IPv4 addresses other than loopback, with their prefix lengths.
fn interface_ipv4s() -> Vec<(Ipv4Addr, u8)> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs fills a list that freeifaddrs releases; entries are read only
    // while the list lives, and sockaddr is read as sockaddr_in only for AF_INET.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut p = list;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            if !a.is_null() && i32::from((*a).sa_family) == libc::AF_INET {
                let sin = &*(a as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let m = (*p).ifa_netmask;
                let prefix = if m.is_null() {
                    32
                } else {
                    u32::from_be((*(m as *const libc::sockaddr_in)).sin_addr.s_addr).count_ones() as u8
                };
                if !ip.is_loopback() && !out.iter().any(|(x, _)| *x == ip) {
                    out.push((ip, prefix));
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(size: usize) -> (Hub, Vec<SocketAddr>, Arc<Secret>) {
        let secret = Arc::new(Secret::generate().unwrap());
        let (h, a) = Hub::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], secret.clone(), size).unwrap();
        (h, a, secret)
    }

    /// Connects rank `rank` while the hub polls in this thread.
    fn join(hub: &mut Hub, addrs: &[SocketAddr], secret: Arc<Secret>, rank: usize) -> Result<Uplink, String> {
        let addrs = addrs.to_vec();
        let t = std::thread::spawn(move || Uplink::connect(&addrs, secret, rank));
        while !t.is_finished() {
            hub.poll();
            std::thread::sleep(Duration::from_millis(2));
        }
        t.join().unwrap()
    }

    fn poll_until<T>(hub: &mut Hub, mut f: impl FnMut(Received) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(t) = f(hub.poll()) {
                return t;
            }
            assert!(Instant::now() < deadline, "nothing came");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Rank 0 ticks fast while ranks are missing: until each rank other than 0 is in,
    /// and again when one's connection closes.
    #[test]
    fn missing_ranks_are_those_without_a_connection() {
        assert!(!hub(1).0.missing_ranks(), "a job of one rank waits for nobody");
        let (mut hub, addrs, secret) = hub(3);
        assert!(hub.missing_ranks());
        let _one = join(&mut hub, &addrs, secret.clone(), 1).unwrap();
        assert!(hub.missing_ranks(), "rank 2 is not in");
        let two = join(&mut hub, &addrs, secret.clone(), 2).unwrap();
        assert!(!hub.missing_ranks());
        drop(two);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !hub.missing_ranks() && Instant::now() < deadline {
            hub.poll();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(hub.missing_ranks(), "rank 2's connection closed");
    }

    #[test]
    fn a_rank_with_the_secret_gets_in_and_lines_go_both_ways() {
        let (mut hub, addrs, secret) = hub(4);
        let mut up = join(&mut hub, &addrs, secret, 2).unwrap();
        up.send("report {}");
        let lines = poll_until(&mut hub, |r| (!r.lines.is_empty()).then_some(r.lines));
        assert_eq!(lines, vec![(2, "report {}".to_string())]);
        hub.send(2, "ack");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        while got.is_empty() && Instant::now() < deadline {
            got = up.receive();
        }
        assert_eq!(got, vec!["ack".to_string()]);
    }

    #[test]
    fn a_rank_without_the_secret_is_refused_and_its_hub_unheard() {
        let (mut hub, addrs, _) = hub(2);
        let wrong = Arc::new(Secret::generate().unwrap());
        let e = join(&mut hub, &addrs, wrong, 1).err().unwrap();
        assert!(e.contains("does not hold this job's secret"), "{e}");
        // The hub, for its part, sees the stranger leave and keeps nothing of it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while hub.connections() > 0 && Instant::now() < deadline {
            hub.poll();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(hub.connections(), 0);
    }

    #[test]
    fn a_forged_report_line_is_refused_before_it_is_read() {
        let (mut hub, addrs, _) = hub(2);
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        s.write_all(b"{\"rank\":1,\"pending\":{\"seq\":999999},\"waited_s\":1e9}\n")
            .unwrap();
        let refused = poll_until(&mut hub, |r| (!r.refused.is_empty()).then_some(r.refused));
        assert!(refused[0].contains("not a ddpbench-watchdog 2 handshake"), "{refused:?}");
        assert_eq!(hub.connections(), 0);
        // Ranks outside the job and other versions are refused too.
        for hello in [
            "ddpbench-watchdog 2 hello 7 00112233445566778899aabbccddeeff",
            "ddpbench-watchdog 1 hello 1 00",
        ] {
            let mut s = TcpStream::connect(addrs[0]).unwrap();
            s.write_all(format!("{hello}\n").as_bytes()).unwrap();
            let refused = poll_until(&mut hub, |r| (!r.refused.is_empty()).then_some(r.refused));
            assert!(
                refused[0].contains("not a rank of this job") || refused[0].contains("version 1"),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_replayed_or_tampered_line_closes_the_link() {
        let (mut hub, addrs, secret) = hub(2);
        let mut up = join(&mut hub, &addrs, secret, 1).unwrap();
        let line = up.session.seal("report {}");
        up.frames.send(&line);
        up.frames.send(&line);
        let r = poll_until(&mut hub, |r| (!r.refused.is_empty()).then_some(r));
        assert_eq!(r.lines.len(), 1);
        assert!(r.refused[0].contains("replayed"), "{:?}", r.refused);
        assert_eq!(hub.connections(), 0);
    }

    #[test]
    fn floods_are_read_within_bounds_and_closed() {
        let (mut hub, addrs, _) = hub(2);
        // Newlines alone: the first (empty) line is not a hello.
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        let burst = vec![b'\n'; 4 << 20];
        let writer = std::thread::spawn(move || {
            let _ = s.write_all(&burst);
        });
        let refused = poll_until(&mut hub, |r| (!r.refused.is_empty()).then_some(r.refused));
        assert!(refused[0].contains("handshake"), "{refused:?}");
        writer.join().unwrap();
        // A line with no end: closed once it passes MAX_LINE, never held beyond the budget.
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        let endless = vec![b'x'; MAX_LINE + 10];
        s.write_all(&endless).unwrap();
        let refused = poll_until(&mut hub, |r| (!r.refused.is_empty()).then_some(r.refused));
        assert!(refused[0].contains("longer than"), "{refused:?}");
        assert_eq!(hub.connections(), 0);
    }

    #[test]
    fn connections_that_close_are_released_and_handshakes_are_capped() {
        let (mut hub, addrs, _) = hub(2);
        // Connect-and-close cycles (in rounds: the kernel queues at most 128 unaccepted).
        for _ in 0..20 {
            for _ in 0..50 {
                drop(TcpStream::connect(addrs[0]).unwrap());
            }
            hub.poll();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            hub.poll();
            if hub.connections() == 0 || Instant::now() > deadline {
                break;
            }
        }
        assert_eq!(hub.connections(), 0);
        // Silent connections: at most MAX_HANDSHAKES held, the rest closed on arrival.
        let held: Vec<TcpStream> = (0..MAX_HANDSHAKES + 10).map(|_| TcpStream::connect(addrs[0]).unwrap()).collect();
        let refused = poll_until(&mut hub, |r| (r.refused.len() >= 10).then_some(r.refused));
        assert!(refused.iter().all(|r| r.contains("handshakes already under way")), "{refused:?}");
        assert_eq!(hub.connections(), MAX_HANDSHAKES);
        drop(held);
    }

    /// Reads `f` until it holds `held` bytes of an unfinished line, collecting its lines.
    fn read_until_held(f: &mut Frames, held: &[u8]) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut lines = Vec::new();
        loop {
            lines.extend(f.lines(10));
            if f.buf == held {
                return lines;
            }
            assert!(Instant::now() < deadline, "holds {:?}, not {held:?}", f.buf);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn line_splitting_is_exact_across_reads() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        let mut f = Frames::new(r);
        w.write_all(b"ab").unwrap();
        assert!(read_until_held(&mut f, b"ab").is_empty());
        w.write_all(b"c\nd\n\nef").unwrap();
        assert_eq!(read_until_held(&mut f, b"ef"), vec!["abc", "d", ""]);
        w.write_all(b"g\n").unwrap();
        assert_eq!(read_until_held(&mut f, b""), vec!["efg"]);
    }

    #[test]
    fn rank_0_listens_only_where_its_peers_are() {
        let root = NetIdentity {
            host: "a".into(),
            ipv4: vec![("10.0.0.1".parse().unwrap(), 24), ("192.168.5.1".parse().unwrap(), 16)],
        };
        let same_host = NetIdentity {
            host: "a".into(),
            ipv4: root.ipv4.clone(),
        };
        let remote = NetIdentity {
            host: "b".into(),
            ipv4: vec![("192.168.7.9".parse().unwrap(), 16)],
        };
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(listen_addresses(&root, std::slice::from_ref(&same_host)), vec![lo]);
        assert_eq!(
            listen_addresses(&root, &[same_host, remote.clone()]),
            vec![lo, "192.168.5.1".parse::<IpAddr>().unwrap()]
        );
        // A peer on no subnet of rank 0's (a routed network): every address of rank 0.
        let far = NetIdentity {
            host: "c".into(),
            ipv4: vec![("172.16.0.3".parse().unwrap(), 24)],
        };
        assert_eq!(listen_addresses(&root, &[far]).len(), 2);
        // Another UTS namespace in the same network namespace shares loopback.
        let twin = NetIdentity {
            host: "n2".into(),
            ipv4: root.ipv4.clone(),
        };
        assert_eq!(listen_addresses(&root, &[twin]), vec![lo]);
    }
}

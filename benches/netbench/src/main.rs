//! netbench: TCP throughput and request/response latency between two endpoints
//! (pods, host-network pods, a Service), standard library only, for
//! scripts/bench-peers. One server, two client modes, one JSON line per run:
//!
//!   netbench server [--port 5201]
//!   netbench stream --to HOST:PORT [--streams 1] [--seconds 10]
//!   netbench rr --to HOST:PORT [--count 10000] [--size 1] [--warmup 1000]
//!   netbench idle                      (sleeps; a client pod to exec into)
//!
//! Protocol: the client opens with a 9-byte header, a mode byte (b'S' or b'R')
//! and the request and response sizes (u32, big endian). Stream: the client
//! writes 128 KiB buffers until its time is up, shuts its side down, and the
//! server answers with the byte count it read (u64): the figure is what arrived,
//! over the time until that answer. Request/response: the server reads a request
//! and writes a response until the client closes; the client times each round
//! trip (TCP_NODELAY on both sides) after untimed warm-up ones.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const CHUNK: usize = 128 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
const MAX_MESSAGE: u32 = 1 << 20;

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netbench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let (mode, rest) = args
        .split_first()
        .ok_or("usage: netbench server|stream|rr|idle [--key value]...")?;
    let opts = Opts::parse(rest)?;
    match mode.as_str() {
        "server" => server(opts.num("port", 5201)?),
        "stream" => stream(
            &opts.text("to")?,
            opts.num("streams", 1)?,
            opts.num("seconds", 10.0)?,
        ),
        "rr" => rr(
            &opts.text("to")?,
            opts.num("count", 10_000)?,
            opts.num("size", 1)?,
            opts.num("warmup", 1_000)?,
        ),
        "idle" => loop {
            thread::sleep(Duration::from_secs(3600));
        },
        other => Err(format!("unknown mode {other:?}")),
    }
}

/// `--key value` pairs, each key at most once.
struct Opts(Vec<(String, String)>);

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let key = flag
                .strip_prefix("--")
                .ok_or_else(|| format!("expected --key, got {flag:?}"))?;
            let value = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            if pairs.iter().any(|(k, _)| k == key) {
                return Err(format!("--{key} given twice"));
            }
            pairs.push((key.to_string(), value.clone()));
        }
        Ok(Opts(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self, key: &str) -> Result<String> {
        self.get(key)
            .map(str::to_string)
            .ok_or_else(|| format!("--{key} is required"))
    }

    fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{key}: {v:?} is not a number")),
        }
    }
}

fn server(port: u16) -> Result<()> {
    let listener =
        TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listen on :{port}: {e}"))?;
    eprintln!("netbench: listening on :{port}");
    for conn in listener.incoming() {
        match conn {
            Ok(sock) => {
                thread::spawn(move || {
                    let peer = sock
                        .peer_addr()
                        .map_or_else(|_| "?".to_string(), |a| a.to_string());
                    if let Err(e) = serve(sock) {
                        eprintln!("netbench: {peer}: {e}");
                    }
                });
            }
            Err(e) => eprintln!("netbench: accept: {e}"),
        }
    }
    Ok(())
}

fn serve(mut sock: TcpStream) -> io::Result<()> {
    let mut header = [0u8; 9];
    sock.read_exact(&mut header)?;
    let size =
        |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let (req, resp) = (size(1), size(5));
    match header[0] {
        b'S' => {
            let mut buf = vec![0u8; 2 * CHUNK];
            let mut total: u64 = 0;
            loop {
                match sock.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            sock.write_all(&total.to_be_bytes())
        }
        b'R' if req <= MAX_MESSAGE && resp <= MAX_MESSAGE && req > 0 => {
            sock.set_nodelay(true)?;
            let mut request = vec![0u8; req as usize];
            let response = vec![b'r'; resp as usize];
            loop {
                match sock.read_exact(&mut request) {
                    Ok(()) => sock.write_all(&response)?,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad header {header:?}"),
        )),
    }
}

/// Connects, retrying while the server is not up yet (a pod just started).
fn connect(to: &str) -> Result<TcpStream> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        let addrs: Vec<_> = to
            .to_socket_addrs()
            .map_err(|e| format!("resolve {to}: {e}"))?
            .collect();
        let mut last = format!("{to} resolves to no address");
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("connect {addr}: {e}"),
            }
        }
        if Instant::now() > deadline {
            return Err(last);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn header(mode: u8, req: u32, resp: u32) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[0] = mode;
    h[1..5].copy_from_slice(&req.to_be_bytes());
    h[5..9].copy_from_slice(&resp.to_be_bytes());
    h
}

fn stream(to: &str, streams: usize, seconds: f64) -> Result<()> {
    if streams == 0 || !seconds.is_finite() || seconds <= 0.0 {
        return Err("--streams and --seconds must be positive".into());
    }
    let mut socks = Vec::with_capacity(streams);
    for _ in 0..streams {
        let mut s = connect(to)?;
        s.write_all(&header(b'S', 0, 0))
            .map_err(|e| format!("{to}: header: {e}"))?;
        socks.push(s);
    }
    let start = Arc::new(Barrier::new(streams + 1));
    let run = Duration::from_secs_f64(seconds);
    let workers: Vec<_> = socks
        .into_iter()
        .map(|mut s| {
            let start = Arc::clone(&start);
            thread::spawn(move || -> Result<(u64, Instant)> {
                let buf = vec![b's'; CHUNK];
                start.wait();
                let end = Instant::now() + run;
                while Instant::now() < end {
                    s.write_all(&buf).map_err(|e| format!("write: {e}"))?;
                }
                s.shutdown(Shutdown::Write)
                    .map_err(|e| format!("shutdown: {e}"))?;
                let mut count = [0u8; 8];
                s.read_exact(&mut count)
                    .map_err(|e| format!("the server's byte count: {e}"))?;
                Ok((u64::from_be_bytes(count), Instant::now()))
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let mut per_stream = Vec::with_capacity(streams);
    let mut last = t0;
    for w in workers {
        let (bytes, done) = w
            .join()
            .map_err(|_| "a stream thread panicked".to_string())??;
        per_stream.push(bytes);
        last = last.max(done);
    }
    let secs = last.duration_since(t0).as_secs_f64();
    let total: u64 = per_stream.iter().sum();
    let gbit = |b: u64| b as f64 * 8.0 / secs / 1e9;
    let each: Vec<String> = per_stream
        .iter()
        .map(|&b| format!("{:.3}", gbit(b)))
        .collect();
    println!(
        "{{\"mode\":\"stream\",\"to\":\"{}\",\"streams\":{streams},\"seconds\":{secs:.3},\"bytes\":{total},\"gbit_s\":{:.3},\"per_stream_gbit_s\":[{}],\"load1\":{}}}",
        escape(to),
        gbit(total),
        each.join(","),
        load1()
    );
    Ok(())
}

fn rr(to: &str, count: usize, size: u32, warmup: usize) -> Result<()> {
    if count == 0 || size == 0 || size > MAX_MESSAGE {
        return Err(format!(
            "--count must be positive and --size within 1..={MAX_MESSAGE}"
        ));
    }
    let mut s = connect(to)?;
    s.set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    s.write_all(&header(b'R', size, size))
        .map_err(|e| format!("{to}: header: {e}"))?;
    let req = vec![b'q'; size as usize];
    let mut resp = vec![0u8; size as usize];
    let mut one = |s: &mut TcpStream| -> Result<()> {
        s.write_all(&req).map_err(|e| format!("request: {e}"))?;
        s.read_exact(&mut resp)
            .map_err(|e| format!("response: {e}"))
    };
    for _ in 0..warmup {
        one(&mut s)?;
    }
    let mut rtt_ns = Vec::with_capacity(count);
    let t0 = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        one(&mut s)?;
        rtt_ns.push(t.elapsed().as_nanos() as u64);
    }
    let secs = t0.elapsed().as_secs_f64();
    rtt_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let pct = |q: f64| us(rtt_ns[((rtt_ns.len() - 1) as f64 * q).round() as usize]);
    let mean = us(rtt_ns.iter().sum::<u64>() / rtt_ns.len() as u64);
    println!(
        "{{\"mode\":\"rr\",\"to\":\"{}\",\"count\":{count},\"size\":{size},\"seconds\":{secs:.3},\"p50_us\":{:.1},\"p90_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},\"mean_us\":{mean:.1},\"load1\":{}}}",
        escape(to),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.999),
        pct(1.0),
        load1()
    );
    Ok(())
}

/// The machine's 1-minute load average (/proc/loadavg is not namespaced), or
/// null when it cannot be read.
fn load1() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .filter(|v| v.parse::<f64>().is_ok())
        .unwrap_or_else(|| "null".to_string())
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

//! `iii-shell probe network [ADDR:PORT]`: what network a command reaches, seen from inside it.
//!
//! Prints one verdict line, `network MODE (MECHANISM)`, then one line per socket it tried
//! (`socket inet dgram ok` or `socket inet dgram errno=13 (Permission denied)`), and with an
//! address a UDP `sendto` and a TCP `connect` to it. `doctor` shows the verdict line of a
//! probe command; the escape suite reads the errno lines.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The sockets tried, by label: (family, type, protocol).
const SOCKETS: [(&str, i32, i32, i32); 8] = [
    ("inet stream", libc::AF_INET, libc::SOCK_STREAM, 0),
    ("inet dgram", libc::AF_INET, libc::SOCK_DGRAM, 0),
    ("inet6 dgram", libc::AF_INET6, libc::SOCK_DGRAM, 0),
    (
        "inet raw",
        libc::AF_INET,
        libc::SOCK_RAW,
        libc::IPPROTO_ICMP,
    ),
    ("packet raw", libc::AF_PACKET, libc::SOCK_RAW, 0),
    (
        "netlink route",
        libc::AF_NETLINK,
        libc::SOCK_RAW,
        libc::NETLINK_ROUTE,
    ),
    ("unix stream", libc::AF_UNIX, libc::SOCK_STREAM, 0),
    ("unix dgram", libc::AF_UNIX, libc::SOCK_DGRAM, 0),
];

fn socket(family: i32, ty: i32, proto: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with plain integers; a returned descriptor is owned here.
    let fd = unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn socketpair(family: i32) -> io::Result<()> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair(2) writes two descriptors into `fds`, closed right after.
    let rc = unsafe {
        libc::socketpair(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    for fd in fds {
        // SAFETY: both were returned by socketpair(2) and are ours.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    Ok(())
}

fn line(label: &str, r: &io::Result<()>) -> String {
    match r {
        Ok(()) => format!("{label} ok"),
        Err(e) => format!(
            "{label} errno={} ({})",
            e.raw_os_error().unwrap_or(0),
            io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(0))
        ),
    }
}

/// The interfaces this process sees (`/proc/net/dev`), `lo` included.
fn interfaces() -> Vec<String> {
    std::fs::read_to_string("/proc/net/dev")
        .unwrap_or_default()
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_string()))
        .collect()
}

/// A TCP bind on 127.0.0.1, port 0.
fn tcp_bind() -> io::Result<()> {
    std::net::TcpListener::bind("127.0.0.1:0").map(drop)
}

/// The verdict from what was tried: a refused IP socket is `deny`; a namespace whose only
/// interface is `lo` is `loopback`; a refused TCP bind is `deny_bind`; else `allow`.
fn verdict(inet: &io::Result<()>, ifaces: &[String], bind: &io::Result<()>) -> String {
    match (inet, bind) {
        (Err(e), _) => {
            format!("network deny (IP sockets refused: {e}; seccomp socket-family rule)")
        }
        (Ok(()), _) if ifaces.iter().all(|i| i == "lo") => {
            "network loopback (a network namespace of its own: only lo)".into()
        }
        (Ok(()), Err(e)) => format!("network deny_bind (TCP bind refused: {e}; Landlock)"),
        (Ok(()), Ok(())) => "network allow (the host's network)".into(),
    }
}

/// UDP sendto and TCP connect (1 s) to `addr`.
fn reach(addr: std::net::SocketAddr) -> [String; 2] {
    let udp = std::net::UdpSocket::bind(if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .and_then(|s| s.send_to(b"probe", addr).map(drop));
    let tcp =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).map(drop);
    [
        line(&format!("udp sendto {addr}"), &udp),
        line(&format!("tcp connect {addr}"), &tcp),
    ]
}

/// Runs the probe; the exit status is 2 on a bad address.
pub fn run(args: &[String]) -> i32 {
    let addr = match args.first().map(|a| a.parse::<std::net::SocketAddr>()) {
        None => None,
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
            eprintln!("probe network: {e}: give ADDR:PORT");
            return 2;
        }
    };
    let tried: Vec<(String, io::Result<()>)> = SOCKETS
        .iter()
        .map(|&(label, f, t, p)| (format!("socket {label}"), socket(f, t, p).map(drop)))
        .chain([
            ("socketpair unix".to_string(), socketpair(libc::AF_UNIX)),
            ("socketpair inet".to_string(), socketpair(libc::AF_INET)),
        ])
        .collect();
    let inet = socket(libc::AF_INET, libc::SOCK_DGRAM, 0).map(drop);
    println!("{}", verdict(&inet, &interfaces(), &tcp_bind()));
    for (label, r) in &tried {
        println!("{}", line(label, r));
    }
    if let Some(a) = addr {
        for l in reach(a) {
            println!("{l}");
        }
    }
    0
}

//! The server's sockets: every accepted connection has Nagle's algorithm
//! off, so each small SSE write leaves at once instead of waiting for the
//! client's delayed ACK of the one before (the first content delta arrived
//! about 40 ms after the role event through httpx).
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::mem::size_of;
use std::net::TcpStream;
use std::os::fd::RawFd;

use axum::routing::get;
use helios::serve::serve_http_with;

/// The local port of socket `fd`, when it is an IPv4 socket.
fn local_port(fd: RawFd) -> Option<u16> {
    // SAFETY: `address` is a properly sized sockaddr_in; the kernel writes
    // at most `length` bytes of it.
    unsafe {
        let mut address: libc::sockaddr_in = std::mem::zeroed();
        let mut length = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let named = libc::getsockname(fd, (&raw mut address).cast(), &raw mut length);
        (named == 0 && i32::from(address.sin_family) == libc::AF_INET)
            .then(|| u16::from_be(address.sin_port))
    }
}

fn int_option(fd: RawFd, level: i32, name: i32) -> i32 {
    let mut value: libc::c_int = 0;
    let mut length = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` is a c_int and `length` says so.
    let got =
        unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &raw mut length) };
    assert_eq!(got, 0, "getsockopt on fd {fd}");
    value
}

/// TCP_NODELAY of each connection this process accepted on `port`.
fn accepted_nodelay(port: u16) -> Vec<bool> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket || local_port(fd) != Some(port) {
            continue;
        }
        if int_option(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == 1 {
            continue; // the listener
        }
        found.push(int_option(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY) != 0);
    }
    found
}

#[test]
fn accepted_connections_have_nagle_off() {
    let (bound, address) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = axum::Router::new().route("/", get(|| async { "ok" }));
    let server = std::thread::spawn(move || {
        serve_http_with(
            "127.0.0.1:0",
            app,
            async {
                let _ = stopped.await;
            },
            move |address| bound.send(address).unwrap(),
        )
    });
    let address = address.recv().unwrap();
    let mut client = TcpStream::connect(address).unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok") {
        let mut buffer = [0; 512];
        let read = client.read(&mut buffer).unwrap();
        assert!(read > 0, "the server closed the connection");
        answer.extend_from_slice(&buffer[..read]);
    }
    // The connection is open and answered: the server holds its socket.
    let nodelay = accepted_nodelay(address.port());
    assert_eq!(nodelay, vec![true]);
    drop(client);
    stop.send(()).unwrap();
    server.join().unwrap().unwrap();
}

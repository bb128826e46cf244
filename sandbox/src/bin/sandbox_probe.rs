//! `sandbox-probe CONFINEMENT_JSON ACTION ARG...`: confines itself as told, then tries one thing and prints
//! `allowed` or `refused: ERROR`. The crate's tests (tests/escape.rs) run it once per way out.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ringtrain_sandbox::{enter, Confinement, Enforcement};

fn attempt(action: &str, arg: &str) -> std::io::Result<()> {
    match action {
        "read" => std::fs::read(arg).map(drop),
        "list" => std::fs::read_dir(arg).map(drop),
        "write" => std::fs::write(arg, b"written from inside the sandbox"),
        "mkdir" => std::fs::create_dir(arg),
        "symlink" => std::os::unix::fs::symlink("/etc/passwd", arg),
        "exec" => std::process::Command::new(arg).output().map(drop),
        "connect" => {
            let address: SocketAddr = arg.parse().map_err(std::io::Error::other)?;
            TcpStream::connect_timeout(&address, Duration::from_secs(2)).map(drop)
        }
        "bind" => TcpListener::bind(arg).map(drop),
        "udp" => std::net::UdpSocket::bind(arg).map(drop),
        "thread" => std::thread::spawn(|| 1).join().map(drop).map_err(|_| std::io::Error::other("panicked")),
        "shared" => {
            // a kept descriptor (a shared memory segment), used as it is: never opened by its path
            use std::os::unix::fs::FileExt;
            let segment = std::fs::File::from(ringtrain_sandbox::take_passed(std::path::Path::new(arg))?);
            segment.write_all_at(b"shared", 0)
        }
        "unix-connect" => std::os::unix::net::UnixStream::connect(arg).map(drop),
        "unix-send" => std::os::unix::net::UnixDatagram::unbound()?.send_to(b"from a rank", arg).map(drop),
        "unix-pair-send" => {
            // a connected pair of datagram sockets may still send to any socket file by name
            let (one, _other) = std::os::unix::net::UnixDatagram::pair()?;
            one.send_to(b"from a rank", arg).map(drop)
        }
        "abstract-connect" => std::os::unix::net::UnixStream::connect_addr(&abstract_name(arg)?).map(drop),
        "abstract-send" => {
            std::os::unix::net::UnixDatagram::unbound()?.send_to_addr(b"from a rank", &abstract_name(arg)?).map(drop)
        }
        "abstract-receive" => receive_one(arg),
        "nccl-proxy-socket" => nccl_proxy_socket(arg),
        "nccl-settings" => nccl_settings(),
        "big-file" => {
            // a file past the file-size limit: the kernel stops the write (EFBIG once SIGXFSZ is ignored)
            let mut file = std::fs::File::create(arg)?;
            file.write_all(&vec![0u8; 8 << 20])
        }
        other => Err(std::io::Error::other(format!("unknown action {other}"))),
    }
}

fn abstract_name(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// Binds a datagram socket at abstract `name` and waits up to 10 s for one datagram: `allowed` when one
/// came (another process reached this one), `refused` when none did. Says `listening` on stderr once bound.
fn receive_one(name: &str) -> std::io::Result<()> {
    let socket = std::os::unix::net::UnixDatagram::bind_addr(&abstract_name(name)?)?;
    socket.set_read_timeout(Some(Duration::from_secs(10)))?;
    eprintln!("listening");
    let mut buffer = [0u8; 64];
    socket.recv(&mut buffer).map(drop)
}

/// What each NCCL communicator does at its start (`ncclProxyInit`): a datagram Unix socket bound at an
/// abstract name. The rank then sends to it itself, as the only process that may.
fn nccl_proxy_socket(name: &str) -> std::io::Result<()> {
    let address = abstract_name(name)?;
    let socket = std::os::unix::net::UnixDatagram::bind_addr(&address)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    std::os::unix::net::UnixDatagram::unbound()?.send_to_addr(b"to its own proxy", &address)?;
    let mut buffer = [0u8; 64];
    socket.recv(&mut buffer).map(drop)
}

/// Whether NCCL will see the settings the sandbox gives a GPU rank (`ringtrain_sandbox::nccl`).
fn nccl_settings() -> std::io::Result<()> {
    for (name, value) in ringtrain_sandbox::nccl::SETTINGS {
        let found = std::env::var(name).unwrap_or_default();
        if found != *value {
            return Err(std::io::Error::other(format!("{name}={found:?}, not {value}")));
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, confinement, action, arg] = args.as_slice() else {
        eprintln!("usage: sandbox-probe CONFINEMENT_JSON ACTION ARG");
        std::process::exit(2);
    };
    let confinement: Confinement = serde_json::from_str(confinement).expect("a confinement in JSON");
    if action == "big-file" {
        // SIGXFSZ would kill the probe before it could say so
        let _ = rustix_ignore_sigxfsz();
    }
    let applied = match enter(&confinement, Enforcement::Required) {
        Ok(applied) => applied,
        Err(err) => {
            println!("not confined: {err}");
            std::process::exit(3);
        }
    };
    eprintln!("{applied}");
    match attempt(action, arg) {
        Ok(()) => println!("allowed"),
        Err(err) => println!("refused: {err}"),
    }
}

#[allow(unsafe_code)]
fn rustix_ignore_sigxfsz() -> isize {
    // SAFETY: SIG_IGN for SIGXFSZ installs no handler code; the process is single-threaded here.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) as isize }
}

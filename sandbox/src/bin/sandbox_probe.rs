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
        "big-file" => {
            // a file past the file-size limit: the kernel stops the write (EFBIG once SIGXFSZ is ignored)
            let mut file = std::fs::File::create(arg)?;
            file.write_all(&vec![0u8; 8 << 20])
        }
        other => Err(std::io::Error::other(format!("unknown action {other}"))),
    }
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

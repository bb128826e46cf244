//! Each way out of the sandbox, tried from a confined process (the `sandbox-probe` binary) as code that
//! got native execution inside a rank would try it: files outside its own, `$HOME`, other processes'
//! `/proc`, writing outside its folder, links, exec, fork, TCP to fixed ports (Postgres, the API), big
//! files. What a rank needs (its inputs, its folder, threads, the ring's ephemeral ports) still works.

#[path = "support/probe.rs"]
mod support;

use std::net::TcpListener;

use ringtrain_sandbox::{Launch, Network, RankUser};
use support::{assert_allowed, assert_refused, confinement, probe, probe_with, scene};

#[test]
fn a_confined_process_reads_its_own_inputs_and_nothing_else() {
    let s = scene();
    let c = confinement(&s, Network::None);
    assert_allowed(probe(&c, "read", &s.input), "its own input");
    assert_refused(probe(&c, "read", &s.secret), "another job's file");
    assert_refused(probe(&c, "list", s.root.join("other-job")), "another job's folder");
    assert_refused(probe(&c, "list", &s.root), "the folder its inputs are in");
    assert_refused(probe(&c, "read", "/etc/passwd"), "/etc/passwd");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    assert_refused(probe(&c, "list", &home), "$HOME");
    assert_refused(probe(&c, "read", "/proc/1/cmdline"), "another process's /proc");
    assert_refused(probe(&c, "list", "/"), "the root folder");
    // what libtorch and the loader need stays readable
    assert_allowed(probe(&c, "read", "/proc/self/status"), "its own /proc");
    assert_allowed(probe(&c, "list", "/sys/devices/system/cpu"), "the CPU list");
}

#[test]
fn a_confined_process_writes_only_its_private_folder_and_makes_no_links() {
    let s = scene();
    let c = confinement(&s, Network::None);
    assert_allowed(probe(&c, "write", s.private.join("checkpoint")), "its own folder");
    assert_allowed(probe(&c, "mkdir", s.private.join("epoch-0001")), "a folder in its own folder");
    assert_refused(probe(&c, "write", &s.secret), "overwriting another job's file");
    assert_eq!(std::fs::read(&s.secret).unwrap(), b"rt_agent_secret");
    assert_refused(probe(&c, "write", s.root.join("other-job/planted")), "writing in another job's folder");
    assert!(!s.root.join("other-job/planted").exists());
    let canary = std::env::temp_dir().join(format!("ringtrain-canary-{}", std::process::id()));
    assert_refused(probe(&c, "write", &canary), "writing /tmp");
    assert!(!canary.exists());
    assert_refused(probe(&c, "write", &s.input), "overwriting its own input");
    assert_refused(probe(&c, "symlink", s.private.join("link")), "a symbolic link out of its folder");
    assert_refused(probe(&c, "big-file", s.private.join("big")), "a file past its size limit");
}

#[test]
fn a_confined_process_runs_no_program_but_starts_threads() {
    let s = scene();
    let c = confinement(&s, Network::None);
    assert_refused(probe(&c, "exec", "/bin/true"), "running a program");
    assert_refused(probe(&c, "exec", env!("CARGO_BIN_EXE_sandbox-probe")), "running itself again");
    assert_allowed(probe(&c, "thread", "-"), "a thread");
}

/// A TCP port outside the ephemeral range, as Postgres's 5432 or the API's 8080 are.
fn fixed_port_listener() -> TcpListener {
    let (low, _) = ringtrain_sandbox::filesystem::ephemeral_range();
    (20000..low).find_map(|port| TcpListener::bind(("127.0.0.1", port)).ok()).expect("a free fixed port")
}

#[test]
fn a_rank_reaches_the_rings_ports_and_no_fixed_port() {
    let s = scene();
    let database = fixed_port_listener();
    let database = database.local_addr().unwrap().to_string();
    let peer = TcpListener::bind("127.0.0.1:0").unwrap(); // another rank's ring listener: ephemeral
    let peer = peer.local_addr().unwrap().to_string();
    let ring = confinement(&s, Network::Ring { ports: vec![] });
    assert_refused(probe(&ring, "connect", &database), "a rank connecting to a fixed port");
    assert_allowed(probe(&ring, "connect", &peer), "a rank connecting to a peer's ring port");
    assert_allowed(probe(&ring, "bind", "127.0.0.1:0"), "a rank's own ring listener");
    let fixed = fixed_port_listener().local_addr().unwrap().port();
    assert_refused(probe(&ring, "bind", format!("127.0.0.1:{}", fixed + 1)), "binding a fixed port");
    let check = confinement(&s, Network::None);
    assert_refused(probe(&check, "connect", &peer), "a check connecting anywhere");
    assert_refused(probe(&check, "udp", "127.0.0.1:0"), "a check opening any socket");
}

#[test]
fn passed_files_are_read_through_their_descriptor_not_their_path() {
    let s = scene();
    let mut launch = Launch::new();
    let passed = launch.pass(std::fs::File::open(&s.secret).unwrap());
    let mut c = confinement(&s, Network::None);
    c.read = vec![passed.clone()];
    assert_allowed(probe_with(&c, "read", passed.to_str().unwrap(), launch), "the passed file");
    let mut launch = Launch::new();
    let passed = launch.pass(std::fs::File::open(&s.secret).unwrap());
    c.read = vec![passed];
    assert_refused(probe_with(&c, "read", s.input.to_str().unwrap(), launch), "a path it was not passed");
}

#[test]
fn a_kept_descriptor_is_used_as_it_is_and_other_passed_ones_are_closed() {
    use std::os::unix::fs::FileExt;
    let s = scene();
    let segment = std::fs::File::from(ringtrain_sandbox::shared_memory_file(false).unwrap());
    let mut c = confinement(&s, Network::None);
    let mut launch = Launch::new();
    let passed = launch.pass(segment.try_clone().unwrap());
    c.kept = vec![passed.clone()];
    assert_allowed(probe_with(&c, "shared", passed.to_str().unwrap(), launch), "the segment it keeps");
    let mut written = [0u8; 6];
    segment.read_exact_at(&mut written, 0).unwrap();
    assert_eq!(&written, b"shared", "what the confined process wrote is in the parent's segment");

    let mut launch = Launch::new();
    let passed = launch.pass(segment.try_clone().unwrap());
    c.kept = vec![];
    assert_refused(probe_with(&c, "shared", passed.to_str().unwrap(), launch), "a passed descriptor it does not keep");
}

#[test]
fn where_the_parent_is_root_the_child_runs_as_the_rank_user() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: the child runs as this user");
        return;
    }
    let user = RankUser::lookup(ringtrain_sandbox::user::DEFAULT_RANK_USER)
        .expect("scripts/setup.sh makes the rank user on machines where tests run as root");
    let s = scene();
    use std::os::unix::fs::PermissionsExt;
    // the rank user may pass through the test's folder (0700 as made) to its own
    std::fs::set_permissions(&s.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    user.own(&s.private).unwrap();
    let mut launch = Launch::new();
    // the secret is the parent's (root's, 0600): as the rank user even a path granted by Landlock fails
    std::fs::set_permissions(&s.secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    launch.run_as(Some(user));
    let mut c = confinement(&s, Network::None);
    c.read.push(s.secret.clone());
    assert_refused(probe_with(&c, "read", s.secret.to_str().unwrap(), launch), "root's file as the rank user");
    let mut launch = Launch::new();
    launch.run_as(RankUser::lookup(ringtrain_sandbox::user::DEFAULT_RANK_USER).ok());
    let written = s.private.join("out");
    assert_allowed(probe_with(&c, "write", written.to_str().unwrap(), launch), "its own folder");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(std::fs::metadata(&written).unwrap().uid(), 0, "written as the rank user");
}

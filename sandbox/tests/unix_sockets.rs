//! Unix sockets, tried from a confined process as code that got native execution inside a rank would try
//! them: the node's Postgres over its socket file, stream and datagram sockets in /tmp and /run, abstract
//! sockets made outside, and, for GPU ranks (which may open the datagram kind NCCL's proxy binds), another
//! rank's abstract socket. Every way is first shown open to this unconfined test, so a refusal is the
//! sandbox's doing; where the test runs as root, each is tried as the rank user too, with the sockets'
//! permissions open to it (as Postgres's is), so that only the sandbox stands in the way.

#[path = "support/probe.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ringtrain_sandbox::{Confinement, Launch, Network, RankUser};
use support::{assert_allowed, assert_refused, confinement, probe_with, scene, Scene};

/// Sockets of services this test stands up, as a node's daemons would.
struct Services {
    _folders: Vec<tempfile::TempDir>,
    _listeners: Vec<UnixListener>,
    _datagrams: Vec<UnixDatagram>,
    /// Socket files a stream service listens on (the node's Postgres first).
    stream: Vec<PathBuf>,
    /// Socket files a datagram service reads (as the journal's `/dev/log` is).
    datagram: Vec<PathBuf>,
    abstract_stream: String,
    abstract_datagram: String,
}

/// Where the test Postgres listens locally: `.s.PGSQL.PORT` (the port of `DATABASE_URL`, else 5432) in
/// Debian's socket folder, or in the folder of the throwaway cluster `scripts/postgres.sh` starts.
fn postgres_socket() -> PathBuf {
    let url = std::env::var("DATABASE_URL").unwrap_or_default();
    let port = url.rsplit_once(':').and_then(|(_, rest)| rest.split('/').next()?.parse::<u16>().ok()).unwrap_or(5432);
    let name = format!(".s.PGSQL.{port}");
    let mut folders = vec![PathBuf::from("/var/run/postgresql"), PathBuf::from("/tmp")];
    if let Ok(entries) = std::fs::read_dir("/tmp") {
        folders.extend(
            entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.to_string_lossy().contains("ringtrain-pg.")),
        );
    }
    let found = folders.iter().map(|f| f.join(&name)).find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "no Postgres socket {name} in {folders:?}: these tests need the test Postgres (scripts/test.sh starts one)"
        )
    })
}

/// A folder under `parent` every user may pass through, or `None` where this user cannot write there.
fn open_folder(parent: &str) -> Option<tempfile::TempDir> {
    let folder = tempfile::Builder::new().prefix("ringtrain-sockets-").tempdir_in(parent).ok()?;
    std::fs::set_permissions(folder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(folder)
}

fn open_to_all(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
}

fn services() -> Services {
    let pid = std::process::id();
    let mut services = Services {
        _folders: Vec::new(),
        _listeners: Vec::new(),
        _datagrams: Vec::new(),
        stream: vec![postgres_socket()],
        datagram: Vec::new(),
        abstract_stream: format!("ringtrain-test-{pid}-stream"),
        abstract_datagram: format!("ringtrain-test-{pid}-datagram"),
    };
    for parent in ["/tmp", "/run"] {
        let Some(folder) = open_folder(parent) else {
            eprintln!("{parent} is not writable by this user: no socket made there");
            continue;
        };
        let (stream, datagram) = (folder.path().join("service.sock"), folder.path().join("log.sock"));
        services._listeners.push(UnixListener::bind(&stream).unwrap());
        services._datagrams.push(UnixDatagram::bind(&datagram).unwrap());
        open_to_all(&stream);
        open_to_all(&datagram);
        services.stream.push(stream);
        services.datagram.push(datagram);
        services._folders.push(folder);
    }
    use std::os::linux::net::SocketAddrExt;
    let named = |name: &str| std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    services._listeners.push(UnixListener::bind_addr(&named(&services.abstract_stream)).unwrap());
    services._datagrams.push(UnixDatagram::bind_addr(&named(&services.abstract_datagram)).unwrap());
    // open to this unconfined test: what the confined process is refused, it is refused by the sandbox
    for path in &services.stream {
        UnixStream::connect(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    for path in &services.datagram {
        UnixDatagram::unbound().unwrap().send_to(b"from the test", path).unwrap();
    }
    UnixStream::connect_addr(&named(&services.abstract_stream)).unwrap();
    services
}

/// The users the probe runs as: this one, and the rank user where this is root (the scene's folders made
/// reachable for it, as the agent makes a rank's).
fn users(scene: &Scene) -> Vec<Option<RankUser>> {
    if !rustix::process::geteuid().is_root() {
        return vec![None];
    }
    let user = RankUser::lookup(ringtrain_sandbox::user::DEFAULT_RANK_USER)
        .expect("scripts/setup.sh makes the rank user on machines where tests run as root");
    std::fs::set_permissions(&scene.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(scene.root.join("inputs"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&scene.input, std::fs::Permissions::from_mode(0o644)).unwrap();
    user.own(&scene.private).unwrap();
    vec![None, Some(user)]
}

fn probe_as(confinement: &Confinement, user: &Option<RankUser>, action: &str, arg: &str) -> String {
    let mut launch = Launch::new();
    launch.run_as(user.clone());
    probe_with(confinement, action, arg, launch)
}

fn who(user: &Option<RankUser>) -> &str {
    user.as_ref().map_or("this user", |u| u.name.as_str())
}

/// Every way to the services, refused.
fn assert_no_way_out(confined: &Confinement, kind: &str, services: &Services, user: &Option<RankUser>) {
    let who = who(user);
    for path in &services.stream {
        let path = path.to_str().unwrap();
        assert_refused(
            probe_as(confined, user, "unix-connect", path),
            &format!("{kind} as {who} connecting to {path}"),
        );
    }
    for path in &services.datagram {
        let path = path.to_str().unwrap();
        if !confined.gpu {
            assert_refused(probe_as(confined, user, "unix-send", path), &format!("{kind} as {who} sending to {path}"));
            let what = format!("{kind} as {who} sending to {path} from a socket pair");
            assert_refused(probe_as(confined, user, "unix-pair-send", path), &what);
        }
    }
    let (stream, datagram) = (&services.abstract_stream, &services.abstract_datagram);
    let what = format!("{kind} as {who} connecting to the abstract socket @{stream} made outside");
    assert_refused(probe_as(confined, user, "abstract-connect", stream), &what);
    let what = format!("{kind} as {who} sending to the abstract socket @{datagram} made outside");
    assert_refused(probe_as(confined, user, "abstract-send", datagram), &what);
}

#[test]
fn cpu_ranks_and_checks_reach_no_unix_socket() {
    let services = services();
    let s = scene();
    let rank = confinement(&s, Network::Ring { ports: vec![] });
    let check = confinement(&s, Network::None);
    for user in users(&s) {
        assert_no_way_out(&rank, "a CPU rank", &services, &user);
        assert_no_way_out(&check, "a model check", &services, &user);
    }
}

/// A GPU rank may open the datagram Unix socket each NCCL communicator binds for its proxy, and send to
/// it itself; it connects to no stream socket (Postgres's, the test's in /tmp and /run) and reaches no
/// abstract socket of another process: not one made outside, not another rank's. Ranks of one job are
/// kept apart too: NCCL is told to share memory without Unix sockets, so they never need each other's.
/// (A datagram sent to a datagram socket file, such as the journal's, is the one way left to a GPU rank:
/// see "What a rank can reach" in the operator guide.)
#[test]
fn gpu_ranks_open_only_nccls_socket_and_reach_no_other_process() {
    let services = services();
    let s = scene();
    let gpu = Confinement { gpu: true, ..confinement(&s, Network::Ring { ports: vec![] }) };
    let pid = std::process::id();
    for user in users(&s) {
        let who = who(&user);
        let own = format!("ringtrain-test-{pid}-proxy-{who}");
        assert_allowed(
            probe_as(&gpu, &user, "nccl-proxy-socket", &own),
            &format!("a GPU rank's own proxy socket, as {who}"),
        );
        assert_allowed(probe_as(&gpu, &user, "nccl-settings", "-"), "NCCL told to share memory without Unix sockets");
        assert_no_way_out(&gpu, "a GPU rank", &services, &user);

        // another rank (a GPU rank of its own job, or of another team's) listens; this one cannot reach it
        let listening = format!("ringtrain-test-{pid}-rank-{who}");
        let mut other = Command::new(env!("CARGO_BIN_EXE_sandbox-probe"));
        other.arg(serde_json::to_string(&gpu).unwrap()).args(["abstract-receive", &listening]);
        other.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut launch = Launch::new();
        launch.run_as(user.clone());
        launch.apply(&mut other).unwrap();
        let mut other = other.spawn().unwrap();
        let mut stderr = BufReader::new(other.stderr.take().unwrap()).lines();
        let said: Vec<String> = stderr.by_ref().map_while(Result::ok).take_while(|l| l != "listening").collect();
        let cpu = confinement(&s, Network::Ring { ports: vec![] });
        for (kind, sender) in [("a GPU rank", &gpu), ("a CPU rank", &cpu)] {
            let what = format!("{kind} as {who} sending to another GPU rank's socket @{listening} ({said:?})");
            assert_refused(probe_as(sender, &user, "abstract-send", &listening), &what);
        }
        // the listener was there: this unconfined test reaches it, and it says so
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(listening.as_bytes()).unwrap();
        UnixDatagram::unbound().unwrap().send_to_addr(b"from the test", &address).unwrap();
        let output = other.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "allowed",
            "the listening rank got the test's datagram"
        );
    }
}

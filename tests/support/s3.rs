//! A real S3 server for the tests: s3s-fs (the s3s project's file-backed server, which scripts/test.sh
//! installs and names in `RINGTRAIN_S3S_FS`), on a free port, storing each bucket as a folder under its root.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};

pub const ACCESS_KEY: &str = "ringtrain-test";
pub const SECRET_KEY: &str = "s3cr3t-for-the-agent-only";

/// An s3s-fs server; killed when dropped.
pub struct S3Server {
    child: Child,
    port: u16,
    pub endpoint: String,
    /// Where bucket `B`'s object `K` lies: `root/B/K`.
    pub root: PathBuf,
}

impl S3Server {
    /// A server storing under `root`, with the empty buckets `buckets` (a bucket is a folder).
    pub fn start(root: &Path, buckets: &str) -> S3Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        for bucket in buckets.split(',') {
            std::fs::create_dir_all(root.join(bucket)).unwrap();
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        S3Server { child: serve(root, port), port, endpoint, root: root.to_path_buf() }
    }

    /// The server stops answering (killed): a store down.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server answers again, on the same port, with what it stored.
    pub fn restart(&mut self) {
        self.stop();
        self.child = serve(&self.root, self.port);
    }

    /// A client of `bucket` with the server's credentials.
    pub fn client(&self, bucket: &str) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .build()
            .unwrap()
    }

    /// This process's environment set so that the programs the test starts (server, agents) reach this
    /// server with its credentials (nextest runs each test in a process of its own).
    pub fn export_to_environment(&self) {
        std::env::set_var("RINGTRAIN_S3_ENDPOINT", &self.endpoint);
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts s3s-fs on `port` storing under `root`, once it listens.
fn serve(root: &Path, port: u16) -> Child {
    let binary = std::env::var("RINGTRAIN_S3S_FS").unwrap_or_else(|_| "s3s-fs".into());
    let child = Command::new(&binary)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS_KEY])
        .args(["--secret-key", SECRET_KEY])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start the S3 server {binary:?}: {e} (scripts/test.sh installs s3s-fs and sets RINGTRAIN_S3S_FS)")
        });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "the S3 server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

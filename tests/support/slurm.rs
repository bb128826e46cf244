//! A real Slurm cluster on one machine: Debian's slurmctld and slurmd (22.05) and munge, which
//! scripts/setup.sh installs. Each Slurm node is a host of [`Hosts`] (a network namespace with its own
//! address on a bridge) running one `slurmd`; `slurmctld` listens on this machine's end of the bridge. The
//! configuration is written per cluster (its own ports, state and spool folders), so clusters of tests
//! running side by side do not meet. Needs root (namespaces; the daemons run as root here).
//!
//! Why `nsenter --net` and not `ip netns exec` (what [`Hosts::command`] uses): `ip netns exec` mounts a
//! fresh /sys, and slurmd 22.05 refuses to start without the machine's cgroup file system under
//! /sys/fs/cgroup.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringtrain_slurm::Slurm;

use super::hosts::Hosts;
use super::Process;

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        self.cancel_everything();
    }
}

pub struct SlurmCluster {
    /// slurmd of each host, then slurmctld: killed in that order, before the hosts go.
    daemons: Vec<Process>,
    pub hosts: Hosts,
    pub conf: PathBuf,
    pub partition: String,
    dir: PathBuf,
}

/// The munge daemon Slurm authenticates with, started unless one answers already (one per machine: its
/// socket is a file every namespace sees).
fn ensure_munge() {
    let answers = || {
        Command::new("sh")
            .args(["-c", "munge -n | unmunge"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if answers() {
        return;
    }
    std::fs::create_dir_all("/run/munge").unwrap();
    assert!(Command::new("chown").args(["munge:munge", "/run/munge"]).status().unwrap().success());
    // munged forks into the background; a second one (a test beside this one) exits, finding the first
    let _ = Command::new("runuser").args(["-u", "munge", "--", "/usr/sbin/munged"]).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers() {
        assert!(Instant::now() < deadline, "munged does not answer (scripts/setup.sh installs munge)");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl SlurmCluster {
    /// `nodes` Slurm nodes of `cpus` CPUs each, in one partition, all idle when this returns.
    pub fn start(dir: &Path, nodes: u32, cpus: u32) -> SlurmCluster {
        ensure_munge();
        let hosts = Hosts::create(nodes);
        let dir = dir.join("slurm");
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let short_host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout).unwrap();
        // ports of this cluster's own: slurmctld's on this machine, and every slurmd's (each in a namespace)
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        let partition = "cpu".to_string();
        let mut conf = format!(
            "ClusterName=rt\nSlurmctldHost={}({})\nSlurmctldPort={port}\nSlurmdPort={}\nAuthType=auth/munge\n\
             CredType=cred/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\nMailProg=/bin/true\nSlurmUser=root\nSlurmdUser=root\nReturnToService=2\n\
             SchedulerType=sched/backfill\nSchedulerParameters=bf_interval=2\nStateSaveLocation={dir}/state\nSlurmdSpoolDir={dir}/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\nSlurmdPidFile={dir}/%n.pid\nSlurmctldLogFile={dir}/slurmctld.log\n\
             SlurmdLogFile={dir}/%n.log\nMinJobAge=30\n",
            short_host.trim(),
            hosts.gateway(),
            port + 1,
            dir = dir.display()
        );
        let names: Vec<String> = (1..=nodes).map(|i| format!("h{i}")).collect();
        for (i, name) in (1..=nodes).zip(&names) {
            conf.push_str(&format!("NodeName={name} NodeAddr={} CPUs={cpus} State=UNKNOWN\n", hosts.address(i)));
        }
        // `urgent`, a partition of a higher tier over the same nodes, whose jobs preempt (cancel) the
        // others' when they need the nodes: Slurm's own preemption
        conf.push_str(&format!(
            "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n\
             PartitionName={partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=1\n\
             PartitionName=urgent Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2\n",
            nodes = names.join(",")
        ));
        let conf_path = dir.join("slurm.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let log = |name: &str| Stdio::from(std::fs::File::create(dir.join(name)).unwrap());
        let controller = Command::new("slurmctld")
            .args(["-D", "-i", "-f"])
            .arg(&conf_path)
            .stdout(log("slurmctld.out"))
            .stderr(log("slurmctld.err"))
            .spawn()
            .expect("slurmctld (scripts/setup.sh installs it)");
        let mut daemons = Vec::new();
        for (i, name) in (1..=nodes).zip(&names) {
            let daemon = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", hosts.namespace(i)))
                .args(["slurmd", "-D", "-f"])
                .arg(&conf_path)
                .args(["-N", name])
                .stdout(log(&format!("{name}.out")))
                .stderr(log(&format!("{name}.err")))
                .spawn()
                .expect("slurmd (scripts/setup.sh installs it)");
            daemons.push(Process(daemon));
        }
        daemons.push(Process(controller));
        let cluster = SlurmCluster { daemons, hosts, conf: conf_path, partition, dir };
        cluster.wait_until_idle(nodes);
        cluster
    }

    /// The product's client of this cluster.
    pub fn slurm(&self) -> Slurm {
        Slurm { bin_dir: None, conf: Some(self.conf.clone()) }
    }

    /// A Slurm command (`sinfo`, `scontrol`, …) against this cluster; its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(program).args(args).env("SLURM_CONF", &self.conf).output().unwrap();
        assert!(out.status.success(), "{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Where this cluster's files are (its logs, for a failing test's message).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cancels every job of this cluster and waits (up to 10 s) for Slurm to end their processes: a
    /// slurmstepd outlives its slurmd, and a failed test must not leave a job's processes behind.
    fn cancel_everything(&self) {
        let listed = |conf: &Path| {
            let out = Command::new("squeue").args(["-h", "-o", "%i"]).env("SLURM_CONF", conf).output();
            out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let ids = listed(&self.conf);
        if ids.is_empty() {
            return;
        }
        let _ = Command::new("scancel").args(&ids).env("SLURM_CONF", &self.conf).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !listed(&self.conf).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_until_idle(&self, nodes: u32) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = Command::new("sinfo").args(["-h", "-o", "%T %D"]).env("SLURM_CONF", &self.conf).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if text == format!("idle {nodes}") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Slurm cluster did not come up in 60 s (sinfo: {text:?}; logs in {})",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

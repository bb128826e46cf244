//! Two `ringtrain serve` replicas on one Postgres, each on a host of its own, behind one address, over
//! TLS: kill -9 of the replica that leads the scheduler, and the other takes over
//! within seconds; the agents on their own hosts, which know only the front's address, carry on with it; a
//! job whose two ranks run on two hosts, training across the kill, and one submitted after it both succeed
//! exactly once, every metric once. The pool (`support::hosts`) needs root, as CI here has.

mod support;

use std::time::{Duration, Instant};

use support::hosts::Pool;
use support::{assert_complete_series, fashion_mnist};

const LONG: Duration = Duration::from_secs(300);
/// How soon the surviving replica must schedule: its next pass (every 2 s) takes the advisory lock the
/// killed one's connection held.
const TAKEOVER: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_takes_over_when_the_leader_is_killed_and_every_job_succeeds_once() {
    // one slot per host: the first job's two ranks run on two hosts, the second job on the third
    let mut pool = Pool::start("failover", 3).await;
    // any replica answers any request: the same job from both
    let from_second = pool.replica_api(1);

    let across = pool.api.submit(&fashion_mnist("failover-across", 2, 12000, 3)).await;
    pool.api.wait_first_iteration(&across, LONG).await;
    assert_eq!(from_second.job(&across).await["id"], across.as_str());
    let leader = pool.kill_the_leader();
    let killed = Instant::now();
    eprintln!("killed the leading replica ({leader})");
    let api = pool.api.clone();

    // only the survivor can schedule this one, on the third host
    let after = api.submit(&fashion_mnist("failover-after", 1, 2000, 1)).await;
    api.wait_job(&after, TAKEOVER, "scheduled by the surviving replica", |job| job["state"] != "queued").await;
    let takeover = killed.elapsed();
    eprintln!("kill -9 of the leader -> the next job scheduled: {:.2} s", takeover.as_secs_f64());
    assert!(takeover < TAKEOVER, "{takeover:?}");

    let events = api.get(&format!("/v1/jobs/{across}/events")).await;
    let placed = events["events"][1]["reason"].as_str().unwrap();
    assert!(placed.contains("2 device(s) of 2 node(s)"), "{placed}");
    for (id, ranks) in [(&across, 2), (&after, 1)] {
        let job = api.wait_state(id, "succeeded", LONG).await;
        // trained on through the failover: never restarted, never preempted
        assert_eq!((job["attempt"].as_i64(), job["preemptions"].as_i64()), (Some(1), Some(0)), "{job}");
        let events = api.get(&format!("/v1/jobs/{id}/events")).await;
        let ended = events["events"].as_array().unwrap().iter().filter(|e| e["to_state"] == "succeeded").count();
        assert_eq!(ended, 1, "{events}");
        let total = job["effective"]["total_iterations"].as_i64().unwrap();
        assert_complete_series(&api.metrics(id, "iteration").await, ranks, total);
    }
}

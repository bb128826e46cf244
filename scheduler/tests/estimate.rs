//! Estimated starts against what then happens: a scripted cluster where every job's run time is known to
//! the test (not to the estimate, which knows only the running jobs' ends), played forward pass by pass.
//! Where the estimate gives a time, the job starts then; where it says unknown, the jobs it names are ones
//! the start really waited for.

mod support;

use std::collections::BTreeMap;

use ringtrain_core::JobId;
use ringtrain_scheduler::{estimate_start, plan, ClusterView, Estimate, QueuedJob, RunningJob, Timeline};
use support::{job, Cluster};

const STOP_SECONDS: f64 = 30.0;

/// The scripted cluster, played forward with every run time known.
struct World {
    view: ClusterView,
    /// Seconds of work each job has (queued jobs; preempted jobs keep what is left).
    work: BTreeMap<JobId, f64>,
    ends: BTreeMap<JobId, f64>,
    preemptible_at: BTreeMap<JobId, f64>,
    started_at: BTreeMap<JobId, f64>,
    ended_at: BTreeMap<JobId, f64>,
}

impl World {
    fn play(mut self) -> BTreeMap<JobId, f64> {
        let mut now = 0.0;
        for _ in 0..1000 {
            let plan = plan(&self.view);
            for start in &plan.starts {
                let at = self.view.queued.iter().position(|q| q.id == start.job).unwrap();
                let q = self.view.queued.swap_remove(at);
                self.started_at.entry(q.id).or_insert(now);
                self.ends.insert(q.id, now + self.work[&q.id]);
                self.view.running.push(RunningJob {
                    id: q.id,
                    team: q.team,
                    priority: q.priority,
                    kind: q.kind,
                    devices: start.devices.clone(),
                    started: now as u64,
                    preemptible: true,
                    preempting: false,
                    grow_to: Vec::new(),
                });
            }
            for preempt in &plan.preemptions {
                let running = self.view.running.iter_mut().find(|r| r.id == preempt.job).unwrap();
                let end = self.ends.remove(&running.id).unwrap();
                self.work.insert(running.id, end - now);
                self.view.queued.push(QueuedJob {
                    id: running.id,
                    team: running.team,
                    priority: running.priority,
                    kind: running.kind,
                    devices: running.devices.len() as u32,
                    submit_seq: 0,
                    larger: Vec::new(),
                    node_group: 1,
                });
                running.id = JobId(uuid::Uuid::from_u128(running.id.0.as_u128() + 1_000_000));
                running.preempting = true;
                running.preemptible = false;
                self.ends.insert(running.id, now + STOP_SECONDS);
            }
            let next = self.ends.values().chain(self.preemptible_at.values()).copied().fold(f64::INFINITY, f64::min);
            if !next.is_finite() {
                break;
            }
            now = next;
            for (id, _) in self.ends.iter().filter(|(_, &end)| end <= now) {
                self.ended_at.insert(*id, now);
            }
            self.ends.retain(|_, end| *end > now);
            self.view.running.retain(|r| self.ended_at.get(&r.id).is_none_or(|&at| at < now));
            for running in &mut self.view.running {
                if self.preemptible_at.get(&running.id).is_some_and(|&at| at <= now) {
                    running.preemptible = true;
                }
            }
            self.preemptible_at.retain(|_, at| *at > now);
        }
        self.started_at
    }
}

/// Checks every queued job's estimate against the played world; the estimates' seconds (None: unknown).
fn check_estimates(
    cluster: Cluster,
    running_ends: &[(u128, f64)],
    work: &[(u128, f64)],
    protected: &[(u128, f64)],
) -> Vec<Option<f64>> {
    let ends: BTreeMap<JobId, f64> = running_ends.iter().map(|&(j, s)| (job(j), s)).collect();
    let preemptible_in: BTreeMap<JobId, f64> = protected.iter().map(|&(j, s)| (job(j), s)).collect();
    let timeline = Timeline {
        ends_in: ends.clone(),
        preemptible_in: preemptible_in.clone(),
        stop_seconds: STOP_SECONDS,
        max_steps: 64,
    };
    let estimates: Vec<(JobId, Estimate)> =
        cluster.view.queued.iter().map(|q| (q.id, estimate_start(&cluster.view, q.id, &timeline))).collect();
    let world = World {
        view: cluster.view.clone(),
        work: work.iter().map(|&(j, s)| (job(j), s)).collect(),
        ends,
        preemptible_at: preemptible_in,
        started_at: BTreeMap::new(),
        ended_at: BTreeMap::new(),
    };
    let started = world.play();
    let mut seconds = Vec::new();
    for (id, estimate) in estimates {
        let actual = started.get(&id).copied();
        match &estimate {
            Estimate::Now => {
                assert_eq!(actual, Some(0.0), "job {id}");
                seconds.push(Some(0.0));
            }
            Estimate::At { seconds: at, after } => {
                assert_eq!(actual, Some(*at), "job {id}: estimated {estimate:?}");
                assert!(!after.is_empty());
                seconds.push(Some(*at));
            }
            Estimate::Unknown { depends_on } => {
                seconds.push(None);
                let actual = actual.unwrap_or_else(|| panic!("job {id} never started"));
                assert!(!depends_on.is_empty(), "job {id}");
                // it depends on a job whose run time the estimate could not know, and which started before it
                assert!(
                    depends_on.iter().all(|j| started.get(j).is_some_and(|&s| s < actual)),
                    "job {id}: {estimate:?}"
                );
            }
        }
    }
    seconds
}

#[test]
fn estimates_match_the_starts_when_they_depend_on_running_jobs_only() {
    // 8 GPUs held by jobs ending at 100, 250 and 400 s
    let cluster = Cluster::new()
        .team(1, 0, 0, 1)
        .node(1, 8, 0)
        .run(10, 1, &[(1, 0), (1, 1), (1, 2), (1, 3)])
        .run(11, 1, &[(1, 4), (1, 5)])
        .run(12, 1, &[(1, 6), (1, 7)])
        .queue(1, 1, 4) // at 100 s, when job 10 ends
        .queue(2, 1, 2) // at 250 s, when job 11 ends
        .queue(3, 1, 6) // after jobs 1 and 2, whose run times are unknown to the estimate
        .queue(4, 1, 8);
    let estimates = check_estimates(
        cluster,
        &[(10, 100.0), (11, 250.0), (12, 400.0)],
        &[(1, 1000.0), (2, 50.0), (3, 10.0), (4, 10.0)],
        &[],
    );
    assert_eq!(estimates, vec![Some(100.0), Some(250.0), None, None]);
}

#[test]
fn a_reclaim_is_estimated_after_its_victim_has_run_its_minimum_time_and_stopped() {
    // team 1 is guaranteed 4 and holds nothing; team 2 borrows all 8 GPUs with a job that may be preempted
    // in 120 s: the reclaim preempts it then, and it has stopped 30 s later
    let cluster = Cluster::new()
        .team(1, 4, 0, 1)
        .team(2, 0, 0, 1)
        .node(1, 8, 0)
        .run_full(20, 2, &(0..8).map(|i| (1, i)).collect::<Vec<_>>(), 0, false, false)
        .queue(5, 1, 4);
    let estimates = check_estimates(cluster, &[(20, 1000.0)], &[(5, 60.0)], &[(20, 120.0)]);
    assert_eq!(estimates, vec![Some(120.0 + STOP_SECONDS)]);
}

#[test]
fn a_job_that_fits_now_starts_now() {
    let cluster = Cluster::new().team(1, 0, 0, 1).node(1, 4, 0).run(10, 1, &[(1, 0)]).queue(1, 1, 3);
    assert_eq!(check_estimates(cluster, &[], &[(1, 10.0)], &[]), vec![Some(0.0)]);
}

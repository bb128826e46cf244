//! The user API's answers, pinned field by field: the JSON the server writes is what the client reads, in
//! both directions. A renamed field, an id that stopped being a plain UUID or a timestamp written another way
//! fails here, not as a "?" in someone's terminal or a broken script (the command line and the generated
//! clients read these same fields). Answers with open-ended parts (a job's spec and result, a study's
//! definition) are pinned as a round trip: what the server sends comes back out of the client's type whole.

use chrono::{DateTime, Utc};
use ringtrain_core::{DeviceId, JobId, NodeId, TeamId};
use ringtrain_views::nodes::{DeviceHolder, DeviceView, NodeList, NodeQuarantine, NodeUse, NodeView};
use serde_json::{json, Value};
use uuid::Uuid;

fn at() -> DateTime<Utc> {
    "2026-12-07T13:00:00Z".parse().unwrap()
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

/// `value` serialises to exactly `wire`, and `wire` reads back as `value`.
fn pinned<T>(value: &T, wire: Value)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    assert_eq!(serde_json::to_value(value).unwrap(), wire, "as the server writes it");
    assert_eq!(&serde_json::from_value::<T>(wire).unwrap(), value, "as the client reads it");
}

#[test]
fn the_pool() {
    let nodes = NodeList {
        nodes: vec![NodeView {
            id: NodeId(id(1)),
            name: "n1".into(),
            address: Some("10.0.0.1".into()),
            state: "up".into(),
            registered_at: at(),
            last_heartbeat: at(),
            devices: vec![
                DeviceView {
                    id: DeviceId(id(2)),
                    index: 0,
                    kind: "gpu".into(),
                    name: "NVIDIA H100".into(),
                    memory_bytes: Some(80 << 30),
                    held_by: Some(DeviceHolder {
                        team_id: TeamId(id(3)),
                        team_name: "alpha".into(),
                        job_id: Some(JobId(id(4))),
                        job_name: Some("resnet-8k".into()),
                        rank: Some(3),
                    }),
                },
                DeviceView {
                    id: DeviceId(id(5)),
                    index: 1,
                    kind: "cpu".into(),
                    name: "cpu slot 1".into(),
                    memory_bytes: None,
                    held_by: None,
                },
            ],
            ranks_use: Some(NodeUse { cpu_cores: 1.5, resident_bytes: 2_097_152.0 }),
            quarantine: Some(NodeQuarantine {
                reason: "its self-test failed: matmul: wrong".into(),
                since: Some(at()),
            }),
        }],
    };
    pinned(
        &nodes,
        json!({"nodes": [{
            "id": id(1).to_string(), "name": "n1", "address": "10.0.0.1", "state": "up",
            "registered_at": "2026-12-07T13:00:00Z", "last_heartbeat": "2026-12-07T13:00:00Z",
            "devices": [
                {"id": id(2).to_string(), "index": 0, "kind": "gpu", "name": "NVIDIA H100",
                 "memory_bytes": 85_899_345_920_i64,
                 "held_by": {"team_id": id(3).to_string(), "team_name": "alpha", "job_id": id(4).to_string(),
                             "job_name": "resnet-8k", "rank": 3}},
                {"id": id(5).to_string(), "index": 1, "kind": "cpu", "name": "cpu slot 1", "memory_bytes": null,
                 "held_by": null}
            ],
            "ranks_use": {"cpu_cores": 1.5, "resident_bytes": 2_097_152.0},
            "quarantine": {"reason": "its self-test failed: matmul: wrong", "since": "2026-12-07T13:00:00Z"}
        }]}),
    );
}

#[test]
fn a_schedule_preview() {
    use ringtrain_core::{Effective, JobSpec};
    use ringtrain_views::schedules::{PreviewComparison, PreviewForWorkers};
    let spec = JobSpec::from_json(
        &json!({"model": {"name": "lenet5"}, "dataset": "fashion-mnist", "workers": 8, "per_worker_batch": 32,
                "epochs": 30, "lr": {"base": 0.1, "reference_batch": 256}})
        .to_string(),
    )
    .unwrap();
    let schedule = Effective::new(&spec, 60_000).unwrap().render(false);
    let preview = PreviewComparison { schedules: vec![PreviewForWorkers { workers: 8, schedule: schedule.clone() }] };
    let wire = serde_json::to_value(&preview).unwrap();
    // the fields the command line's table and scripts read, by name
    let effective = &wire["schedules"][0]["schedule"]["effective"];
    assert_eq!(wire["schedules"][0]["workers"], 8);
    assert_eq!(effective["global_batch"], 256);
    assert_eq!(effective["iterations_per_epoch"], 234);
    assert_eq!(effective["total_iterations"], 7020);
    assert!(effective["scaled_lr"].is_number() && effective["warmup_iterations"].is_number(), "{effective}");
    assert!(effective["warmup_skipped"].is_null(), "{effective}");
    assert!(wire["schedules"][0]["schedule"]["epochs"].is_array());
    assert!(wire["schedules"][0]["schedule"].get("per_iteration").is_none(), "written only when asked for");
    pinned(&preview, wire);
}

#[test]
fn an_upload_in_parts() {
    use ringtrain_views::uploads::UploadView;
    let upload = UploadView {
        id: id(9),
        name: "imagenet-train".into(),
        size_bytes: 150 << 20,
        part_bytes: 64 << 20,
        parts: 3,
        received: vec![1],
        missing: vec![2, 3],
        created_at: at(),
    };
    pinned(
        &upload,
        json!({"id": id(9).to_string(), "name": "imagenet-train", "size_bytes": 157_286_400, "part_bytes": 67_108_864,
               "parts": 3, "received": [1], "missing": [2, 3], "created_at": "2026-12-07T13:00:00Z"}),
    );
}

/// `wire` reads as a `T` and writes back as exactly `wire`: nothing the server sends is lost on the way
/// through the client's type.
fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(wire: &Value) -> T {
    let read: T = serde_json::from_value(wire.clone()).unwrap();
    assert_eq!(&serde_json::to_value(&read).unwrap(), wire, "written back as it came");
    read
}

fn job_wire(fields: Value) -> Value {
    let mut wire = json!({
        "id": id(1), "name": "resnet-8k", "state": "succeeded", "team_id": id(2), "priority": 0, "device": "cpu",
        "workers": 8, "devices": 2, "study": {"id": id(3), "point": 1}, "attempt": 1, "preemptions": 0,
        "max_restarts": 2, "spec": {"model": {"name": "resnet20"}}, "effective": null, "dataset_size": 60000,
        "created_at": "2026-12-07T13:00:00Z", "updated_at": "2026-12-07T13:00:00Z",
        "started_at": "2026-12-07T13:00:00Z", "finished_at": "2026-12-07T13:00:00Z", "result": null,
        "error": null, "unplaceable": null, "pending_reason": null, "queue_position": null,
        "estimated_start": null, "last_log_lines": null, "progress": null, "resources": null, "placements": null,
        "tags": ["baseline"], "note": "",
        "links": {"self": "/v1/jobs/x", "schedule": "/v1/jobs/x/schedule", "events": "/v1/jobs/x/events",
            "metrics": "/v1/jobs/x/metrics", "logs": "/v1/jobs/x/logs", "checkpoints": "/v1/jobs/x/checkpoints"}
    });
    for (name, value) in fields.as_object().unwrap() {
        wire[name] = value.clone();
    }
    wire
}

#[test]
fn a_finished_job_and_its_result() {
    let placement = json!({"placement": 1, "attempt": 1, "started_at": "2026-12-07T13:00:00Z",
        "ended_at": "2026-12-07T13:00:00Z", "wall_seconds": 151.0, "devices": 2, "device_seconds": 302.0,
        "ended": "succeeded", "resumed_from_iteration": 0, "iterations_lost": 0, "iterations": null,
        "restart_seconds": null});
    let wire = job_wire(json!({
        "result": {"final_test_error": 0.1309, "wall_seconds": 151.0, "trainer_wall_seconds": 149.5,
            "device_seconds": 302.0, "iterations_lost": 0, "samples_per_s": 2405.5, "history": [placement],
            "timeline": {"start_up_s": 0.6, "train_steps_s": 140.0, "evaluation_s": 9.0, "checkpoint_s": 0.2,
                "reporting_s": 0.1, "other_s": 0.2},
            "epochs": [{"epoch": 0, "test_error": 0.2}], "processes": 2, "virtual_ranks": 4},
        "resources": {"device_seconds": 302.0, "peak_rss_bytes": 2.5e8, "cpu_cores": 1.9},
        "placements": [placement],
        "last_log_lines": [{"id": 7, "attempt": 1, "rank": 1, "seq": 3, "at": "2026-12-07T13:00:00Z",
            "stream": "stderr", "line": "done"}]
    }));
    let job: ringtrain_views::jobs::JobView = round_trip(&wire);
    let result = job.result.as_ref().unwrap();
    assert_eq!(result.final_test_error, Some(0.1309));
    assert_eq!(result.history.as_ref().map(Vec::len), Some(1));
    assert_eq!(result.timeline.as_ref().unwrap().start_up_s, 0.6);
    assert!(result.rest.contains_key("epochs") && result.rest.contains_key("virtual_ranks"), "the rest is kept");
    assert_eq!(job.study.as_ref().map(|s| s.point), Some(1));
    assert_eq!(job.placements.as_ref().unwrap()[0].ended, "succeeded");
    assert_eq!(job.last_log_lines.as_ref().unwrap()[0].line, "done");
}

#[test]
fn a_queued_job_and_why_it_waits() {
    let wire = job_wire(json!({"state": "queued", "started_at": null, "finished_at": null, "queue_position": 2,
        "pending_reason": {"code": "waiting_for_devices", "message": "needs 4 cpu devices; 2 are free",
            "needed": 4, "free": 2, "slurm": {"reason": "Resources"}},
        "estimated_start": {"kind": "at", "seconds": 90.0, "at": "2026-12-07T13:01:30Z", "jobs": [id(9), null],
            "basis": "after 2 jobs end"},
        "unplaceable": {"since": "2026-12-07T13:00:00Z", "reason": "needs 8 cpu devices; the pool has 1"}}));
    let job: ringtrain_views::jobs::JobView = round_trip(&wire);
    let reason = job.pending_reason.as_ref().unwrap();
    assert_eq!((reason.code.as_str(), reason.details["needed"].as_u64()), ("waiting_for_devices", Some(4)));
    assert_eq!(job.estimated_start.as_ref().unwrap().jobs, vec![Some(JobId(id(9))), None]);
}

#[test]
fn a_result_the_types_do_not_fit_is_kept_whole() {
    let stored = json!({"final_test_error": "not a number", "epochs": []});
    let result = ringtrain_views::jobs::JobResult::from_json(stored.clone()).unwrap();
    assert_eq!(result.final_test_error, None);
    assert_eq!(serde_json::to_value(&result).unwrap(), stored);
    assert!(ringtrain_views::jobs::JobResult::from_json(json!([1, 2])).is_none());
}

#[test]
fn a_study_and_its_points() {
    let wire = json!({"id": id(3), "name": "scale", "team_id": id(2), "created_at": "2026-12-07T13:00:00Z",
        "reference_point": 0, "states": {"running": 1, "succeeded": 1},
        "points": [{"point": 0, "label": "", "overrides": {}, "job_id": id(1), "state": "succeeded",
            "is_reference": true, "workers": 1, "devices": 1, "global_batch": 32, "scaled_lr": 0.1,
            "warmup": "gradual", "scaling": "linear", "train_error": [0.2], "test_error": [0.1],
            "final_test_error": 0.1, "vs_reference": 0.0, "wall_seconds": 10.0, "samples_per_s": 900.0,
            "error": null, "device_seconds": 10.0, "reused": false, "search": null, "rungs_passed": null,
            "at_rungs": null}],
        "definition": {"template": "goyal"}, "device_hours": 0.01, "max_device_hours": null,
        "search": {"spec": {"kind": "halving"}, "done": false, "best_point": 0, "best_multiplier": null,
            "best_spec": null, "device_hours": 0.01, "grid_device_hours": null, "saved_device_hours": null},
        "links": {"self": "/v1/studies/s", "plot": "/v1/studies/s/plot.svg", "cancel": "/v1/studies/s/cancel"}});
    let study: ringtrain_views::studies::StudyView = round_trip(&wire);
    assert_eq!(study.states["running"], 1);
    assert_eq!(study.points[0].state, ringtrain_core::JobState::Succeeded);
}

#[test]
fn teams_and_tokens() {
    use ringtrain_views::teams::{Budget, BudgetPeriod, Role, Team, TokenInfo};
    pinned(
        &Team {
            id: TeamId(id(2)),
            name: "alpha".into(),
            gpu_quota: 8,
            cpu_quota: 4,
            storage_quota_bytes: None,
            weight: 1,
            budget: Some(Budget { device_hours: 100.0, period: BudgetPeriod::Week }),
            data_roots: vec!["/data/alpha".into()],
            created_at: at(),
        },
        json!({"id": id(2), "name": "alpha", "gpu_quota": 8, "cpu_quota": 4, "storage_quota_bytes": null,
            "weight": 1, "budget": {"device_hours": 100.0, "period": "week"}, "data_roots": ["/data/alpha"],
            "created_at": "2026-12-07T13:00:00Z"}),
    );
    pinned(
        &TokenInfo {
            id: ringtrain_core::TokenId(id(5)),
            role: Role::Member,
            team_id: Some(TeamId(id(2))),
            platform: false,
            label: Some("ci".into()),
            created_at: at(),
            expires_at: None,
            last_used_at: Some(at()),
            revoked_at: None,
        },
        json!({"id": id(5), "role": "member", "team_id": id(2), "platform": false, "label": "ci",
            "created_at": "2026-12-07T13:00:00Z", "expires_at": null, "last_used_at": "2026-12-07T13:00:00Z",
            "revoked_at": null}),
    );
}

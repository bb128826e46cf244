//! The user API's answers, pinned field by field: the JSON the server writes is what the client reads, in
//! both directions. A renamed field, an id that stopped being a plain UUID or a timestamp written another way
//! fails here, not as a "?" in someone's terminal or a broken script (the command line and the generated
//! clients read these same fields).

use chrono::{DateTime, Utc};
use ringtrain_core::{DeviceId, JobId, NodeId, TeamId};
use ringtrain_views::nodes::{DeviceHolder, DeviceView, NodeList, NodeView};
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
            ]
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

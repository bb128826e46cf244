//! The JSON the server and the agents exchange, pinned field by field. An agent and a server of different
//! builds meet on every upgrade of a pool, so a renamed field, a typed id that stopped being a plain UUID
//! or an enum spelled another way must fail here, not in a rolling upgrade. Each test writes the JSON as the
//! other side sends it and checks both directions.

use chrono::{DateTime, Utc};
use ringtrain_core::{AssignmentId, AssignmentState, CheckpointId, DeviceId, JobId, ModelId, NodeId};
use ringtrain_protocol::agent::ModelFile;
use ringtrain_protocol::{Assignment, Checkpoint, Poll, ResultReport, Work};
use serde_json::{json, Value};
use uuid::Uuid;

fn at() -> DateTime<Utc> {
    "2026-12-02T17:00:00Z".parse().unwrap()
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn poll() -> Poll {
    Poll {
        version: 42,
        work: vec![Work {
            assignment: Assignment {
                id: AssignmentId(id(1)),
                job_id: JobId(id(2)),
                attempt: 3,
                node_id: NodeId(id(4)),
                device_id: DeviceId(id(5)),
                rank: 1,
                world_size: 2,
                state: AssignmentState::Delivered,
                endpoint: Some("10.0.0.1:29500".into()),
                preempted: false,
                created_at: at(),
                updated_at: at(),
            },
            spec: json!({"model": {"uploaded": id(6).to_string()}, "dataset": id(7).to_string()}),
            effective: None,
            dataset_size: Some(60_000),
            rendezvous: Some("10.0.0.1:29500".into()),
            resume: Some(Checkpoint {
                id: CheckpointId(id(8)),
                job_id: JobId(id(2)),
                attempt: 2,
                epoch: 3,
                iteration: 450,
                name: "epoch-0003-attempt-2.tar".into(),
                path: "/srv/ringtrain/checkpoints/secret/epoch-0003-attempt-2.tar".into(),
                size_bytes: 1024,
                sha256: "ab".repeat(32),
                is_final: false,
                created_at: at(),
            }),
            rendezvous_secret: Some("s3cret".into()),
            dataset_sha256: Some("cd".repeat(32)),
            dataset_root: None,
            model: Some(ModelFile { id: ModelId(id(6)), sha256: "ef".repeat(32), inputs: vec!["x".into()] }),
            device_index: 1,
            init_weights: false,
            ranks_on_one_node: true,
        }],
        stop: vec![AssignmentId(id(9))],
        preempt: vec![],
    }
}

/// The poll's answer as an agent reads it: ids are plain UUID strings, states lowercase, and the server's
/// path of a checkpoint is never sent.
fn poll_json() -> Value {
    json!({
        "version": 42,
        "work": [{
            "assignment": {
                "id": "00000000-0000-0000-0000-000000000001",
                "job_id": "00000000-0000-0000-0000-000000000002",
                "attempt": 3,
                "node_id": "00000000-0000-0000-0000-000000000004",
                "device_id": "00000000-0000-0000-0000-000000000005",
                "rank": 1,
                "world_size": 2,
                "state": "delivered",
                "endpoint": "10.0.0.1:29500",
                "preempted": false,
                "created_at": "2026-12-02T17:00:00Z",
                "updated_at": "2026-12-02T17:00:00Z"
            },
            "spec": {
                "model": {"uploaded": "00000000-0000-0000-0000-000000000006"},
                "dataset": "00000000-0000-0000-0000-000000000007"
            },
            "effective": null,
            "dataset_size": 60000,
            "rendezvous": "10.0.0.1:29500",
            "resume": {
                "id": "00000000-0000-0000-0000-000000000008",
                "job_id": "00000000-0000-0000-0000-000000000002",
                "attempt": 2,
                "epoch": 3,
                "iteration": 450,
                "name": "epoch-0003-attempt-2.tar",
                "size_bytes": 1024,
                "sha256": "ab".repeat(32),
                "is_final": false,
                "created_at": "2026-12-02T17:00:00Z"
            },
            "rendezvous_secret": "s3cret",
            "dataset_sha256": "cd".repeat(32),
            "dataset_root": null,
            "model": {"id": "00000000-0000-0000-0000-000000000006", "sha256": "ef".repeat(32), "inputs": ["x"]},
            "device_index": 1,
            "init_weights": false,
            "ranks_on_one_node": true
        }],
        "stop": ["00000000-0000-0000-0000-000000000009"],
        "preempt": []
    })
}

#[test]
fn a_poll_answer_has_the_shape_agents_read() {
    assert_eq!(serde_json::to_value(poll()).unwrap(), poll_json());
    let read: Poll = serde_json::from_value(poll_json()).unwrap();
    let work = &read.work[0];
    assert_eq!(work.assignment, poll().work[0].assignment);
    assert_eq!(work.model, poll().work[0].model);
    // the path stays on the server: what an agent reads back has none
    assert_eq!(work.resume.as_ref().unwrap().path, "");
    assert_eq!(work.job_spec().unwrap().model.uploaded, Some(ModelId(id(6))));
}

#[test]
fn an_older_servers_poll_without_the_later_fields_still_reads() {
    // `preempt`, `rendezvous_secret`, `dataset_sha256`, `model`, `init_weights` and `ranks_on_one_node` came
    // after the first agents
    let mut older = poll_json();
    older.as_object_mut().unwrap().remove("preempt");
    for field in ["rendezvous_secret", "dataset_sha256", "model", "init_weights", "ranks_on_one_node"] {
        older["work"][0].as_object_mut().unwrap().remove(field);
    }
    let read: Poll = serde_json::from_value(older).unwrap();
    assert!(read.preempt.is_empty());
    assert_eq!((read.work[0].rendezvous_secret.as_ref(), read.work[0].model.as_ref()), (None, None));
    assert!(!read.work[0].ranks_on_one_node, "the ring, as before");
}

#[test]
fn result_reports_spell_their_outcome_in_lowercase_and_refuse_unknown_fields() {
    let failed = ResultReport::failed(2, "rank 1 was killed", true);
    assert_eq!(
        serde_json::to_value(&failed).unwrap(),
        json!({"attempt": 2, "outcome": "failed", "result": null, "error": "rank 1 was killed", "retryable": true})
    );
    let succeeded: ResultReport =
        serde_json::from_value(json!({"attempt": 1, "outcome": "succeeded", "result": {"final_test_error": 0.1}}))
            .unwrap();
    assert!(!succeeded.retryable);
    let typo = serde_json::from_value::<ResultReport>(json!({"attempt": 1, "outcome": "succeeded", "retry": true}));
    assert!(typo.unwrap_err().to_string().contains("unknown field `retry`"));
}

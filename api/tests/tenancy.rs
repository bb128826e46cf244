//! Tenancy: a team's admin is not a platform admin, and the token lifecycle (list without secrets, revoke,
//! expire). Each test here failed on the code before team admins and platform admins were told apart.

mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{safetensors_file, spec, TestApp, ADMIN};
use ringtrain_api::token_cache::Found;
use ringtrain_core::{DeviceId, JobId, NodeId, TokenId};
use ringtrain_store::{hash_token, Backend, NewAssignment, NewCheckpoint};
use serde_json::{json, Value};

/// Registers a node with one CPU for `agent` and returns its id and its device's.
async fn node(app: &TestApp, agent: &str, name: &str) -> (NodeId, DeviceId) {
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let reply =
        app.post("/v1/agent/nodes", agent, &json!({"name": name, "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    (
        reply.body["id"].as_str().unwrap().parse().unwrap(),
        reply.body["devices"][0]["id"].as_str().unwrap().parse().unwrap(),
    )
}

/// A job of two ranks started as the scheduler would: rank 0 on `first`'s node, rank 1 on `second`'s.
async fn two_agent_job(
    app: &TestApp,
    team: &common::Team,
    first: &str,
    second: &str,
    spec: serde_json::Value,
) -> (String, i32) {
    let job = app.submit(&team.member, &spec).await;
    let (n0, d0) = node(app, first, "node-0").await;
    let (n1, d1) = node(app, second, "node-1").await;
    let ranks =
        [NewAssignment { node_id: n0, device_id: d0, rank: 0 }, NewAssignment { node_id: n1, device_id: d1, rank: 1 }];
    let (started, _) = app
        .store
        .start_job(JobId(job.parse().unwrap()), "scheduler-1", Duration::from_secs(60), &ranks)
        .await
        .unwrap()
        .expect("queued");
    (job, started.attempt)
}

/// Checkpoints and successes come only from rank 0's agent of the current attempt, with an iteration the
/// job has; there is no route that registers a path; a stored path outside the server's folder is never
/// served; a dataset goes only to an agent whose ranks train on it.
async fn agents_are_trusted_only_for_their_own_work(app: TestApp) {
    let team = app.team("alpha").await;
    let (rank0, rank1, stranger) = (app.agent_token().await, app.agent_token().await, app.agent_token().await);
    let (job, attempt) = two_agent_job(&app, &team, &rank0, &rank1, spec("trust")).await;
    let upload = |iteration: u64, attempt: i32| {
        format!("/v1/agent/jobs/{job}/checkpoints/epoch-0001?attempt={attempt}&epoch=1&iteration={iteration}")
    };
    // rank 1's agent and a stranger cannot set the resume point; rank 0's can, within the job's 64 iterations
    app.send_bytes(Method::PUT, &upload(16, attempt), &rank1, vec![1; 10]).await.problem(404);
    app.send_bytes(Method::PUT, &upload(16, attempt), &stranger, vec![1; 10]).await.problem(404);
    let huge = app.send_bytes(Method::PUT, &upload(i64::MAX as u64, attempt), &rank0, vec![1; 10]).await;
    assert_eq!(huge.problem(422), vec!["iteration"]);
    assert_eq!(app.send_bytes(Method::PUT, &upload(16, attempt), &rank0, vec![1; 10]).await.status, 201);
    // the old path-registering route is gone
    let path = app.dir.path().join("admin-token");
    std::fs::write(&path, "rt_secret").unwrap();
    let register = json!({"attempt": attempt, "epoch": 1, "iteration": 63, "path": path, "size_bytes": 9, "sha256": "ab".repeat(32)});
    let gone = app.post(&format!("/v1/agent/jobs/{job}/checkpoints"), &rank0, &register).await;
    assert!(gone.status == StatusCode::NOT_FOUND || gone.status == StatusCode::METHOD_NOT_ALLOWED, "{}", gone.text);
    // and a row that points outside the checkpoint folder (an older database) is not served
    let planted = app
        .store
        .add_checkpoint(NewCheckpoint {
            job_id: JobId(job.parse().unwrap()),
            attempt,
            epoch: 1,
            iteration: 63,
            path: path.to_string_lossy().into_owned(),
            size_bytes: 9,
            sha256: "ab".repeat(32),
            is_final: false,
        })
        .await
        .unwrap();
    for (uri, token) in [
        (format!("/v1/agent/jobs/{job}/checkpoints/{}/archive", planted.id), rank0.as_str()),
        (format!("/v1/jobs/{job}/checkpoints/{}/archive", planted.id), team.viewer.as_str()),
    ] {
        let (status, bytes) = app.get_bytes(&uri, token).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
        assert!(
            !String::from_utf8_lossy(&bytes).contains("rt_secret")
                && !String::from_utf8_lossy(&bytes).contains(app.dir.path().to_str().unwrap())
        );
    }
    // only rank 0's agent reports a success
    let running = app.post(&format!("/v1/agent/jobs/{job}/running"), &rank0, &json!({"attempt": attempt})).await;
    assert_eq!(running.status, 200, "{}", running.text);
    let success = json!({"attempt": attempt, "outcome": "succeeded", "result": {}});
    app.post(&format!("/v1/agent/jobs/{job}/result"), &rank1, &success).await.problem(404);
    app.post(&format!("/v1/agent/jobs/{job}/result"), &stranger, &success).await.problem(404);
    app.end_other_ranks(&job, attempt, ringtrain_core::AssignmentState::Done).await;
    let done = app.post(&format!("/v1/agent/jobs/{job}/result"), &rank0, &success).await;
    assert_eq!(done.status, 200, "{}", done.text);
    // a stale attempt cannot upload any more
    app.send_bytes(Method::PUT, &upload(32, attempt - 1), &rank0, vec![1; 10]).await.problem(404);
}

/// Every agent of a placement gets the same rendezvous secret in its poll, for its ranks to prove to each
/// other; users never see it.
async fn a_placement_shares_a_rendezvous_secret_only_with_its_agents(app: TestApp) {
    let team = app.team("alpha").await;
    let (first, second) = (app.agent_token().await, app.agent_token().await);
    let (job, _) = two_agent_job(&app, &team, &first, &second, spec("secret")).await;
    let nodes = app.get("/v1/nodes", ADMIN).await.body;
    let node_id = |name: &str| {
        nodes["nodes"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut secrets = Vec::new();
    for (name, agent) in [("node-0", &first), ("node-1", &second)] {
        let poll = app.get(&format!("/v1/agent/nodes/{}/assignments", node_id(name)), agent).await;
        let secret =
            poll.body["work"][0]["rendezvous_secret"].as_str().unwrap_or_else(|| panic!("{}", poll.text)).to_string();
        assert!(secret.len() >= 32);
        secrets.push(secret);
    }
    assert_eq!(secrets[0], secrets[1]);
    for uri in [format!("/v1/jobs/{job}"), format!("/v1/jobs/{job}/events"), "/v1/nodes".to_string()] {
        assert!(!app.get(&uri, &team.admin).await.text.contains(&secrets[0]), "{uri}");
    }
}

/// The pool shows which team holds each device to everyone, but which job (and rank) only to its own team.
async fn a_device_shows_its_team_to_all_and_its_job_to_its_team(app: TestApp) {
    let (alpha, beta) = (app.team("alpha").await, app.team("beta").await);
    let (first, second) = (app.agent_token().await, app.agent_token().await);
    let (job, _) = two_agent_job(&app, &alpha, &first, &second, spec("holder")).await;
    app.state.changes.bump(); // as the scheduler loop does after a start
    let holders = |body: &serde_json::Value| -> Vec<serde_json::Value> {
        let nodes = body["nodes"].as_array().unwrap();
        nodes.iter().flat_map(|n| n["devices"].as_array().unwrap().clone()).map(|d| d["held_by"].clone()).collect()
    };
    let own = app.get("/v1/nodes", &alpha.viewer).await;
    assert_eq!(own.status, 200, "{}", own.text);
    let mut ranks: Vec<i64> = holders(&own.body)
        .iter()
        .map(|h| {
            assert_eq!(h["team_name"], "alpha", "{}", own.text);
            assert_eq!(h["job_id"], job.as_str(), "{}", own.text);
            assert_eq!(h["job_name"], "holder", "{}", own.text);
            h["rank"].as_i64().unwrap()
        })
        .collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1]);
    let other = app.get("/v1/nodes", &beta.viewer).await;
    for holder in holders(&other.body) {
        assert_eq!(holder["team_name"], "alpha", "{}", other.text);
        assert!(holder["job_id"].is_null() && holder["job_name"].is_null() && holder["rank"].is_null());
    }
    assert!(!other.text.contains(&job) && !other.text.contains("holder"), "{}", other.text);
    // a platform admin sees every job
    assert!(app.get("/v1/nodes", ADMIN).await.text.contains(&job));
}

/// An uploaded dataset goes only to an agent holding a live rank of a job that trains on it.
async fn datasets_go_only_to_agents_that_train_on_them(app: TestApp) {
    let team = app.team("alpha").await;
    let (rank0, rank1, stranger) = (app.agent_token().await, app.agent_token().await, app.agent_token().await);
    let file = safetensors_file(100, |i| (i % 3) as i64);
    let uploaded = app.send_bytes(Method::POST, "/v1/datasets?name=d", &team.member, file).await;
    assert_eq!(uploaded.status, 201, "{}", uploaded.text);
    let dataset = uploaded.body["id"].as_str().unwrap().to_string();
    let uri = format!("/v1/agent/datasets/{dataset}");
    // before any job uses it, no agent gets it
    assert_eq!(app.get_bytes(&uri, &rank0).await.0, StatusCode::NOT_FOUND);
    let mut using = spec("uses-d");
    using["dataset"] = json!(dataset);
    two_agent_job(&app, &team, &rank0, &rank1, using).await;
    assert_eq!(app.get_bytes(&uri, &rank0).await.0, StatusCode::OK);
    assert_eq!(app.get_bytes(&uri, &rank1).await.0, StatusCode::OK);
    assert_eq!(app.get_bytes(&uri, &stranger).await.0, StatusCode::NOT_FOUND);
}

/// Team B's admin can neither mint tokens for team A, nor create teams, nor mint agent tokens: one team's
/// admin is not every tenant's.
async fn a_team_admin_is_not_a_platform_admin(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    for role in ["admin", "member", "viewer"] {
        app.post(&format!("/v1/teams/{}/tokens", a.id), &b.admin, &json!({"role": role})).await.problem(404);
    }
    app.get(&format!("/v1/teams/{}/tokens", a.id), &b.admin).await.problem(404);
    app.post("/v1/teams", &b.admin, &json!({"name": "mine", "gpu_quota": 1000, "cpu_quota": 1000})).await.problem(403);
    app.post("/v1/agent-tokens", &b.admin, &json!({})).await.problem(403);
    app.get("/v1/agent-tokens", &b.admin).await.problem(403);
    // nor can it make a platform admin, even in its own team
    app.post(&format!("/v1/teams/{}/tokens", b.id), &b.admin, &json!({"role": "admin", "platform": true}))
        .await
        .problem(403);
    // what a team admin may do: its own team's tokens, and see its own team only
    let minted = app.post(&format!("/v1/teams/{}/tokens", b.id), &b.admin, &json!({"role": "member"})).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    assert_eq!(minted.body["info"]["platform"], false);
    let teams = app.get("/v1/teams", &b.admin).await;
    let names: Vec<&str> =
        teams.body["teams"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["beta"]);
    // the platform admin sees every team and may make another platform admin
    assert_eq!(app.get("/v1/teams", ADMIN).await.body["teams"].as_array().unwrap().len(), 3);
    let platform =
        app.post(&format!("/v1/teams/{}/tokens", a.id), ADMIN, &json!({"role": "admin", "platform": true})).await;
    assert_eq!(platform.status, 201, "{}", platform.text);
    let second = platform.body["token"].as_str().unwrap();
    assert_eq!(
        app.post("/v1/teams", second, &json!({"name": "gamma", "gpu_quota": 0, "cpu_quota": 1})).await.status,
        201
    );
    let member_platform =
        app.post(&format!("/v1/teams/{}/tokens", a.id), ADMIN, &json!({"role": "member", "platform": true})).await;
    assert_eq!(member_platform.problem(422), vec!["platform"]);
}

/// Tokens are listed without secrets; a revoked token is refused at once; an expired one too.
async fn tokens_are_listed_revoked_and_expire(app: TestApp) {
    let a = app.team("alpha").await;
    let b = app.team("beta").await;
    let listed = app.get(&format!("/v1/teams/{}/tokens", a.id), &a.admin).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let tokens = listed.body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 3);
    for secret in [&a.member, &a.viewer, &a.admin] {
        assert!(!listed.text.contains(secret.as_str()), "a secret is listed");
    }
    assert!(tokens.iter().all(|t| t.get("token").is_none() && t.get("token_hash").is_none()));
    // the admin's own use shows as last_used_at
    assert!(tokens.iter().any(|t| t["role"] == "admin" && !t["last_used_at"].is_null()), "{}", listed.text);
    let member_id = tokens.iter().find(|t| t["role"] == "member").unwrap()["id"].as_str().unwrap().to_string();
    // members and viewers may not list or revoke; other teams' admins do not see the token
    app.get(&format!("/v1/teams/{}/tokens", a.id), &a.member).await.problem(403);
    app.call(Method::DELETE, &format!("/v1/tokens/{member_id}"), Some(&a.viewer), None).await.problem(403);
    app.call(Method::DELETE, &format!("/v1/tokens/{member_id}"), Some(&b.admin), None).await.problem(404);
    assert_eq!(app.get("/v1/jobs", &a.member).await.status, 200);
    // the team's admin revokes it: the next request is 401, and the list says when
    let revoked = app.call(Method::DELETE, &format!("/v1/tokens/{member_id}"), Some(&a.admin), None).await;
    assert_eq!(revoked.status, 204, "{}", revoked.text);
    app.get("/v1/jobs", &a.member).await.problem(401);
    app.post("/v1/jobs", &a.member, &spec("after")).await.problem(401);
    let listed = app.get(&format!("/v1/teams/{}/tokens", a.id), &a.admin).await;
    let entry =
        listed.body["tokens"].as_array().unwrap().iter().find(|t| t["id"] == member_id.as_str()).unwrap().clone();
    assert!(!entry["revoked_at"].is_null());
    // revoking again changes nothing; an unknown id is 404
    assert_eq!(app.call(Method::DELETE, &format!("/v1/tokens/{member_id}"), Some(ADMIN), None).await.status, 204);
    app.call(Method::DELETE, "/v1/tokens/00000000-0000-0000-0000-000000000000", Some(ADMIN), None).await.problem(404);
    // expiry: in the past is refused at creation; a token whose time has passed is 401
    let past = app
        .post(
            &format!("/v1/teams/{}/tokens", a.id),
            &a.admin,
            &json!({"role": "viewer", "expires_at": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(past.problem(422), vec!["expires_at"]);
    let soon = (chrono::Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let short =
        app.post(&format!("/v1/teams/{}/tokens", a.id), &a.admin, &json!({"role": "viewer", "expires_at": soon})).await;
    assert_eq!(short.status, 201, "{}", short.text);
    let short = short.body["token"].as_str().unwrap().to_string();
    assert_eq!(app.get("/v1/jobs", &short).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let expired = app.get("/v1/jobs", &short).await;
    expired.problem(401);
    assert!(expired.text.contains("expired"), "{}", expired.text);
}

/// The bootstrap token is a platform admin that lives in team `default`: an admin of `default` who is not a
/// platform admin neither sees it listed nor can revoke it (404, as if absent), and it keeps working.
async fn a_team_admin_cannot_revoke_a_platform_token(app: TestApp) {
    let teams = app.get("/v1/teams", ADMIN).await;
    let default = teams.body["teams"].as_array().unwrap().iter().find(|t| t["name"] == "default").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let all = app.get(&format!("/v1/teams/{default}/tokens"), ADMIN).await;
    let bootstrap = all.body["tokens"].as_array().unwrap().iter().find(|t| t["platform"] == true).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let minted = app.post(&format!("/v1/teams/{default}/tokens"), ADMIN, &json!({"role": "admin"})).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    let team_admin = minted.body["token"].as_str().unwrap().to_string();

    let listed = app.get(&format!("/v1/teams/{default}/tokens"), &team_admin).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(!listed.text.contains(&bootstrap), "a team admin sees the platform token: {}", listed.text);
    app.call(Method::DELETE, &format!("/v1/tokens/{bootstrap}"), Some(&team_admin), None).await.problem(404);
    assert_eq!(app.get("/v1/teams", ADMIN).await.status, 200, "the bootstrap token still works");
    // its own team's tokens it still revokes
    let own = minted.body["info"]["id"].as_str().unwrap();
    assert_eq!(app.call(Method::DELETE, &format!("/v1/tokens/{own}"), Some(&team_admin), None).await.status, 204);
}

/// `ringtrain admin reset-token`'s work: a new platform admin token that works at once; the lost one and
/// every other platform token are revoked unless kept; team tokens are untouched.
async fn a_lost_admin_token_is_reset_on_the_server_host(app: TestApp) {
    let team = app.team("alpha").await;
    let kept = ringtrain_api::bootstrap::reset_admin_token(app.state.store.as_ref(), false).await.unwrap();
    assert_eq!(kept.revoked, 0);
    assert_eq!(app.get("/v1/teams", &kept.token).await.status, 200, "the new token is a platform admin");
    assert_eq!(app.get("/v1/teams", ADMIN).await.status, 200, "kept: the old one still works");

    let reset = ringtrain_api::bootstrap::reset_admin_token(app.state.store.as_ref(), true).await.unwrap();
    assert_eq!(reset.revoked, 2, "the bootstrap token and the first reset's");
    assert_eq!(app.get("/v1/teams", &reset.token).await.status, 200);
    app.get("/v1/teams", ADMIN).await.problem(401);
    app.get("/v1/teams", &kept.token).await.problem(401);
    assert_eq!(app.get("/v1/jobs", &team.admin).await.status, 200, "a team's own tokens are untouched");
    let minted = app.post("/v1/teams", &reset.token, &json!({"name": "beta", "gpu_quota": 1, "cpu_quota": 1})).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
}

/// `idx:` paths must lie inside the server's --idx-root folders (here /data): no reading the host's files or
/// another team's folders by path.
async fn idx_paths_stay_inside_the_allowed_roots(app: TestApp) {
    let team = app.team("alpha").await;
    for path in ["idx:/etc", "idx:/data/../etc", "idx:relative/mnist", "idx:/database"] {
        let mut job = spec("idx");
        job["dataset"] = json!(path);
        let refused = app.post("/v1/jobs", &team.member, &job).await;
        assert_eq!(refused.problem(422), vec!["dataset"], "{path}");
        assert!(refused.text.contains("inside /data"), "{}", refused.text);
    }
    let mut job = spec("idx");
    job["dataset"] = json!("idx:/data/mnist");
    assert_eq!(app.post("/v1/jobs", &team.member, &job).await.status, 201);
}

/// A team's own data roots (granted by a platform admin): its `shards:` and `idx:` data sets may lie under
/// them, another team's may not; the grant is checked and named when it is not a plain absolute folder, and
/// the agent is told the folder a job's data set was granted under.
async fn a_teams_data_roots_are_its_own(app: TestApp) {
    let (alpha, beta) = (app.team("alpha").await, app.team("beta").await);
    let grant = |roots: Value| json!({"data_roots": roots});
    let refused = app
        .patch(
            &format!("/v1/teams/{}", alpha.id),
            ADMIN,
            &grant(json!(["relative", "/", "/a/../b", "s3://Data/x", "s3://data//x"])),
        )
        .await;
    assert_eq!(
        refused.problem(422),
        vec!["data_roots[0]", "data_roots[1]", "data_roots[2]", "data_roots[3]", "data_roots[4]"],
        "{}",
        refused.text
    );
    app.patch(&format!("/v1/teams/{}", alpha.id), &alpha.admin, &grant(json!(["/shared/alpha"]))).await.problem(403);
    let roots = json!(["/shared/alpha", "s3://datasets/alpha"]);
    let granted = app.patch(&format!("/v1/teams/{}", alpha.id), ADMIN, &grant(roots.clone())).await;
    assert_eq!((granted.status.as_u16(), &granted.body["data_roots"]), (200, &roots));
    let mut job = spec("shards");
    job["dataset"] = json!("shards:/shared/alpha/imagenet");
    let id = app.submit(&alpha.member, &job).await;
    let refused = app.post("/v1/jobs", &beta.member, &job).await;
    assert_eq!(refused.problem(422), vec!["dataset"], "another team's folder: {}", refused.text);
    job["dataset"] = json!("shards:/data/imagenet");
    assert_eq!(app.post("/v1/jobs", &beta.member, &job).await.status, 201, "the server's --idx-root: every team's");
    // the agent holding the job (both jobs fit its 4 devices) is told the folder it was granted under
    let agent = app.agent_token().await;
    let devices: Vec<Value> = (0..4).map(|i| json!({"index": i, "kind": "cpu", "name": format!("cpu {i}")})).collect();
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n1", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(node.status, 200, "{}", node.text);
    let config = ringtrain_scheduler::LoopConfig { owner: "test-scheduler".into(), ..Default::default() };
    app.state.scheduler(config).pass().await.unwrap();
    let node_id = node.body["id"].as_str().unwrap();
    let poll = app.get(&format!("/v1/agent/nodes/{node_id}/assignments"), &agent).await;
    let work = poll.body["work"].as_array().unwrap();
    let mine = work.iter().find(|w| w["assignment"]["job_id"] == id.as_str()).expect("alpha's job placed here");
    assert_eq!(mine["dataset_root"], "/shared/alpha", "{}", poll.text);
    // a bucket prefix, compared part by part: alpha's, not beta's, and not a longer name beside it
    // (submitted after the placement above, which these jobs would crowd)
    let mut in_bucket = spec("bucket");
    in_bucket["dataset"] = json!("shards:s3://datasets/alpha/imagenet");
    assert_eq!(app.post("/v1/jobs", &alpha.member, &in_bucket).await.status, 201);
    assert_eq!(app.post("/v1/jobs", &beta.member, &in_bucket).await.problem(422), vec!["dataset"]);
    in_bucket["dataset"] = json!("shards:s3://datasets/alphabet/imagenet");
    assert_eq!(app.post("/v1/jobs", &alpha.member, &in_bucket).await.problem(422), vec!["dataset"]);
}

/// An agent token belongs to the first node it registers: it cannot add other nodes to the pool.
async fn an_agent_token_belongs_to_one_node(app: TestApp) {
    let agent = app.agent_token().await;
    let first = node(&app, &agent, "first").await;
    let again = node(&app, &agent, "first").await;
    assert_eq!(first.0, again.0, "re-registering keeps the node");
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let other = app.post("/v1/agent/nodes", &agent, &json!({"name": "second", "devices": devices})).await;
    other.problem(409);
    assert!(other.text.contains("first"), "{}", other.text);
}

/// A revoked agent token stops working, and its node is marked as unheard-of so the next scheduler pass
/// finds it lost.
async fn a_revoked_agent_token_loses_its_node(app: TestApp) {
    let agent = app.agent_token().await;
    let devices = json!([{"index": 0, "kind": "cpu", "name": "cpu 0"}]);
    let node =
        app.post("/v1/agent/nodes", &agent, &json!({"name": "n1", "address": "127.0.0.1", "devices": devices})).await;
    assert_eq!(node.status, 200, "{}", node.text);
    let listed = app.get("/v1/agent-tokens", ADMIN).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let id = listed.body["tokens"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(app.call(Method::DELETE, &format!("/v1/tokens/{id}"), Some(ADMIN), None).await.status, 204);
    let node_id = node.body["id"].as_str().unwrap();
    app.post(&format!("/v1/agent/nodes/{node_id}/heartbeat"), &agent, &json!({})).await.problem(401);
    let config = ringtrain_scheduler::LoopConfig { owner: "test-scheduler".into(), ..Default::default() };
    let pass = app.state.scheduler(config).pass().await.unwrap();
    assert_eq!(pass.lost_nodes, 1);
    let nodes = app.get("/v1/nodes", ADMIN).await;
    assert_eq!(nodes.body["nodes"][0]["state"], "lost", "{}", nodes.text);
}

/// Waits up to 10 s for `done`.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A token the server has cached stops working when it is revoked: through this server at once; by another
/// server on the same database, or by `ringtrain admin reset-token` on the host (both the store's revoke,
/// called here directly), as soon as the revocation's announcement arrives. Nothing is cached without a
/// listener to hear revocations: on SQLite, never (the store's tests cut the listener's connection).
async fn a_cached_token_stops_working_when_revoked_anywhere(app: TestApp) {
    tokio::spawn(app.state.clone().listen_to_other_servers());
    let postgres = app.store.backend() == Backend::Postgres;
    if postgres {
        eventually("the listener listens", async || app.state.tokens.is_listening()).await;
    }
    let a = app.team("alpha").await;
    let listed = app.get(&format!("/v1/teams/{}/tokens", a.id), &a.admin).await;
    let id_of = |role: &str| -> TokenId {
        let tokens = listed.body["tokens"].as_array().unwrap();
        tokens.iter().find(|t| t["role"] == role).unwrap()["id"].as_str().unwrap().parse().unwrap()
    };
    let cached = |token: &str| matches!(app.state.tokens.find(&hash_token(token)), Found::Cached(_));
    assert_eq!(app.get("/v1/jobs", &a.member).await.status, 200);
    assert_eq!(app.get("/v1/jobs", &a.viewer).await.status, 200);
    assert_eq!(cached(&a.member), postgres, "cached without a listener, or not cached with one");
    assert!(!cached("rt_not_a_token"));

    // revoked elsewhere: refused once the announcement is heard (on SQLite nothing was cached: at once)
    app.store.revoke_token(id_of("member"), ringtrain_store::now()).await.unwrap();
    if postgres {
        eventually("the revocation reaches the cache", async || !cached(&a.member)).await;
    }
    app.get("/v1/jobs", &a.member).await.problem(401);
    app.post("/v1/jobs", &a.member, &spec("after")).await.problem(401);

    // revoked through this server: refused at once, cached or not
    assert_eq!(app.get("/v1/jobs", &a.viewer).await.status, 200);
    let revoked = app.call(Method::DELETE, &format!("/v1/tokens/{}", id_of("viewer")), Some(&a.admin), None).await;
    assert_eq!(revoked.status, 204, "{}", revoked.text);
    app.get("/v1/jobs", &a.viewer).await.problem(401);
    // the tokens left work on, and a use is still recorded in the database
    assert_eq!(app.get("/v1/jobs", &a.admin).await.status, 200);
    let admin = app.store.get_token(id_of("admin")).await.unwrap().unwrap();
    assert!(admin.last_used_at.is_some());
}

ringtrain_store::on_both_backends!(
    setup = crate::common::TestApp::new;
    agents_are_trusted_only_for_their_own_work,
    datasets_go_only_to_agents_that_train_on_them,
    a_team_admin_is_not_a_platform_admin,
    tokens_are_listed_revoked_and_expire,
    a_team_admin_cannot_revoke_a_platform_token,
    a_lost_admin_token_is_reset_on_the_server_host,
    a_revoked_agent_token_loses_its_node,
    an_agent_token_belongs_to_one_node,
    idx_paths_stay_inside_the_allowed_roots,
    a_teams_data_roots_are_its_own,
    a_placement_shares_a_rendezvous_secret_only_with_its_agents,
    a_device_shows_its_team_to_all_and_its_job_to_its_team,
    a_cached_token_stops_working_when_revoked_anywhere,
);

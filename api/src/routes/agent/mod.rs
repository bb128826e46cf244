//! /v1/agent: what node agents say to the server, with agent tokens; the bodies are the shared wire types of
//! [`ringtrain_protocol`]. An agent registers its node and devices and heartbeats ([`nodes`]), long-polls for
//! the ranks placed on it and moves their assignments along ([`assignments`]), and relays what its ranks
//! report: running, metrics, the result ([`reports`]), and moves their files: checkpoint uploads, and the
//! checkpoint, dataset and model a rank starts from ([`files`]). Job-scoped reports are accepted only from
//! an agent holding an assignment of that job's attempt, and every state change is guarded by the attempt,
//! so a stale agent changes nothing.

pub mod assignments;
pub mod files;
pub mod logs;
pub mod nodes;
pub mod reports;

//! The durations an agent and the server must agree on, in one place. The server's values are
//! configurable (`ApiConfig`, `LoopConfig`) and the agent's are flags (`--heartbeat-s`, `--lease-s`); these
//! are both sides' defaults.

use std::time::Duration;

/// How often an agent heartbeats.
pub const HEARTBEAT: Duration = Duration::from_secs(3);

/// How long a placement lives without a heartbeat from any agent holding one of its ranks. An agent whose
/// heartbeats the server refused for this long stops its ranks itself: the server has requeued their jobs.
pub const LEASE: Duration = Duration::from_secs(30);

/// The longest an agent's long poll waits for something to change (under the server's request timeout).
pub const MAX_POLL_WAIT: Duration = Duration::from_secs(20);

/// A node whose last heartbeat is older is lost, and its ranks with it.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long an agent keeps its ranks running while the server cannot be reached at all (a restart, a
/// deploy, a database failover). The server, once back (or its database), declares no node lost and lets
/// no lease expire for a node timeout, so the agents' next heartbeats renew what kept running.
pub const OUTAGE_GRACE: Duration = Duration::from_secs(600);

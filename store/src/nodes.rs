//! The worker pool: nodes (one per agent host) and their devices, registered and kept alive by agents.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{NodeId, TokenId};
pub use ringtrain_protocol::{Device, Node};

use crate::error::StoreResult;

#[derive(Debug, Clone)]
pub struct NodeRegistration {
    pub name: String,
    pub address: Option<String>,
    pub devices: Vec<NewDevice>,
}

#[derive(Debug, Clone)]
pub struct NewDevice {
    pub index: i32,
    pub kind: DeviceKind,
    pub name: String,
    pub memory_bytes: Option<i64>,
}

#[async_trait]
pub trait NodeStore: Send + Sync {
    /// Registers a node under an agent token, or refreshes it (same name, same token): devices are
    /// upserted by index. Conflict when the name belongs to another agent token.
    async fn register_node(&self, agent_token: TokenId, node: NodeRegistration) -> StoreResult<Node>;
    /// Records a heartbeat (a lost node is up again); false when the node is not this agent's.
    async fn heartbeat(&self, node_id: NodeId, agent_token: TokenId) -> StoreResult<bool>;
    async fn get_node(&self, id: NodeId) -> StoreResult<Option<Node>>;
    /// Every device the node was registered with, retired ones included (by index): the most its agent may
    /// offer again without a platform admin.
    async fn registered_devices(&self, id: NodeId) -> StoreResult<Vec<Device>>;
    async fn list_nodes(&self) -> StoreResult<Vec<Node>>;
    /// The most memory any device of `kind` in service reports (None when none reports it): what a
    /// submission's memory check compares with, in one statement instead of the whole pool.
    async fn largest_device_memory(&self, kind: DeviceKind) -> StoreResult<Option<i64>>;
    /// Marks `up` nodes whose last heartbeat is older than `before` as `lost`; returns their ids.
    async fn mark_lost_nodes(&self, before: DateTime<Utc>) -> StoreResult<Vec<NodeId>>;
    /// Sets the node aside with `reason` (no new placements), or lifts that (None). False when nothing
    /// changed: no such node, already set aside (the first reason stays), or not set aside.
    async fn set_quarantine(&self, id: NodeId, reason: Option<&str>) -> StoreResult<bool>;
}

macro_rules! impl_node_store {
    ($store:ty) => {
        const _: () = {
            use std::collections::HashMap;

            use chrono::{DateTime, Utc};
            use ringtrain_core::spec::DeviceKind;
            use ringtrain_core::{NodeId, TokenId};
            use uuid::Uuid;

            use crate::backend::SqlBackend;
            use crate::nodes::NodeStore;
            use crate::rows::{DeviceRow, NodeRow, DEVICE_COLUMNS, NODE_COLUMNS};
            use crate::{now, Device, Node, NodeRegistration, StoreError, StoreResult};

            #[async_trait::async_trait]
            impl NodeStore for $store {
                async fn register_node(&self, agent_token: TokenId, node: NodeRegistration) -> StoreResult<Node> {
                    let now = now();
                    let mut tx = self.pool().begin().await?;
                    // Upsert by name, but only for the agent token that first registered it: another agent
                    // cannot take over a node (the WHERE turns its attempt into zero rows).
                    let id: Option<(Uuid,)> = sqlx::query_as(
                        "INSERT INTO nodes (id, name, agent_token_id, address, state, registered_at, last_heartbeat) \
                         VALUES ($1, $2, $3, $4, 'up', $5, $5) \
                         ON CONFLICT (name) DO UPDATE SET address = excluded.address, state = 'up', \
                         last_heartbeat = excluded.last_heartbeat WHERE nodes.agent_token_id = excluded.agent_token_id \
                         RETURNING id",
                    )
                    .bind(Uuid::new_v4())
                    .bind(&node.name)
                    .bind(agent_token.0)
                    .bind(&node.address)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
                    let Some((node_id,)) = id else {
                        return Err(StoreError::Conflict(format!(
                            "node {:?} is registered by another agent token",
                            node.name
                        )));
                    };
                    for device in &node.devices {
                        sqlx::query(
                            "INSERT INTO devices (id, node_id, idx, kind, name, memory_bytes) \
                             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (node_id, idx) DO UPDATE SET \
                             kind = excluded.kind, name = excluded.name, memory_bytes = excluded.memory_bytes, \
                             retired = FALSE",
                        )
                        .bind(Uuid::new_v4())
                        .bind(node_id)
                        .bind(device.index)
                        .bind(device.kind.as_str())
                        .bind(&device.name)
                        .bind(device.memory_bytes)
                        .execute(&mut *tx)
                        .await?;
                    }
                    // Devices the node no longer offers are retired (kept for the assignments naming them): the
                    // scheduler must not place ranks on a GPU that died or on CPU slots the agent stopped
                    // offering. A rank still running on one is failed by the scheduler like any rank of a
                    // device it cannot see.
                    let offered: Vec<i32> = node.devices.iter().map(|d| d.index).collect();
                    let mut retire = sqlx::QueryBuilder::<<Self as SqlBackend>::Db>::new(
                        "UPDATE devices SET retired = TRUE WHERE node_id = ",
                    );
                    retire.push_bind(node_id);
                    if !offered.is_empty() {
                        retire.push(" AND idx NOT IN (");
                        let mut list = retire.separated(", ");
                        for index in offered {
                            list.push_bind(index);
                        }
                        retire.push(")");
                    }
                    retire.build().execute(&mut *tx).await?;
                    tx.commit().await?;
                    self.get_node(NodeId(node_id)).await?.ok_or_else(|| StoreError::Corrupt(format!("node {node_id} vanished")))
                }

                async fn heartbeat(&self, node_id: NodeId, agent_token: TokenId) -> StoreResult<bool> {
                    let _urgent = self.write_gate().map(|gate| gate.urgent());
                    let done = sqlx::query(
                        "UPDATE nodes SET last_heartbeat = $3, state = 'up' WHERE id = $1 AND agent_token_id = $2",
                    )
                    .bind(node_id.0)
                    .bind(agent_token.0)
                    .bind(now())
                    .execute(self.pool())
                    .await?;
                    Ok(done.rows_affected() == 1)
                }

                async fn get_node(&self, id: NodeId) -> StoreResult<Option<Node>> {
                    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1");
                    let row: Option<NodeRow> = sqlx::query_as(&sql).bind(id.0).fetch_optional(self.pool()).await?;
                    let Some(row) = row else { return Ok(None) };
                    let sql = format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE node_id = $1 AND NOT retired ORDER BY idx");
                    let devices: Vec<DeviceRow> = sqlx::query_as(&sql).bind(id.0).fetch_all(self.pool()).await?;
                    let devices = devices.into_iter().map(TryInto::try_into).collect::<StoreResult<_>>()?;
                    Ok(Some(row.with_devices(devices)?))
                }

                async fn registered_devices(&self, id: NodeId) -> StoreResult<Vec<Device>> {
                    let sql = format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE node_id = $1 ORDER BY idx");
                    let devices: Vec<DeviceRow> = sqlx::query_as(&sql).bind(id.0).fetch_all(self.pool()).await?;
                    devices.into_iter().map(TryInto::try_into).collect()
                }

                async fn list_nodes(&self) -> StoreResult<Vec<Node>> {
                    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY name");
                    let nodes: Vec<NodeRow> = sqlx::query_as(&sql).fetch_all(self.pool()).await?;
                    let sql = format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE NOT retired ORDER BY node_id, idx");
                    let devices: Vec<DeviceRow> = sqlx::query_as(&sql).fetch_all(self.pool()).await?;
                    let mut by_node: HashMap<Uuid, Vec<Device>> = HashMap::new();
                    for device in devices {
                        by_node.entry(device.node_id).or_default().push(device.try_into()?);
                    }
                    nodes
                        .into_iter()
                        .map(|n| {
                            let devices = by_node.remove(&n.id).unwrap_or_default();
                            n.with_devices(devices)
                        })
                        .collect()
                }

                async fn largest_device_memory(&self, kind: DeviceKind) -> StoreResult<Option<i64>> {
                    let (largest,): (Option<i64>,) =
                        sqlx::query_as("SELECT MAX(memory_bytes) FROM devices WHERE NOT retired AND kind = $1")
                            .bind(kind.as_str())
                            .fetch_one(self.pool())
                            .await?;
                    Ok(largest)
                }

                async fn set_quarantine(&self, id: NodeId, reason: Option<&str>) -> StoreResult<bool> {
                    let done = match reason {
                        Some(reason) => {
                            sqlx::query(
                                "UPDATE nodes SET quarantine = $2, quarantined_at = $3 \
                                 WHERE id = $1 AND quarantine IS NULL",
                            )
                            .bind(id.0)
                            .bind(reason)
                            .bind(now())
                            .execute(self.pool())
                            .await?
                        }
                        None => {
                            sqlx::query(
                                "UPDATE nodes SET quarantine = NULL, quarantined_at = NULL \
                                 WHERE id = $1 AND quarantine IS NOT NULL",
                            )
                            .bind(id.0)
                            .execute(self.pool())
                            .await?
                        }
                    };
                    Ok(done.rows_affected() == 1)
                }

                async fn mark_lost_nodes(&self, before: DateTime<Utc>) -> StoreResult<Vec<NodeId>> {
                    let rows: Vec<(Uuid,)> = sqlx::query_as(
                        "UPDATE nodes SET state = 'lost' WHERE state = 'up' AND last_heartbeat < $1 RETURNING id",
                    )
                    .bind(before)
                    .fetch_all(self.pool())
                    .await?;
                    Ok(rows.into_iter().map(|(id,)| NodeId(id)).collect())
                }
            }
        };
    };
}

pub(crate) use impl_node_store;

// Cluster: nodes, devices and who holds them; the team's queue with the scheduler's reasons.

import { api } from "../api.js";
import { $, add, cell } from "../dom.js";

export const live = true;

function holderText(device) {
  const holder = device.held_by;
  if (!holder) return "free";
  const job = holder.job_id ? ` ${holder.job_name || holder.job_id} rank ${holder.rank}` : "";
  return `${holder.team_name}${job}`;
}

export async function refresh() {
  const [pool, queued] = await Promise.all([api("/v1/nodes"), api("/v1/jobs?state=queued&limit=500")]);
  const rows = $("node-rows");
  rows.replaceChildren();
  for (const node of pool.nodes) {
    const row = document.createElement("tr");
    cell(row, node.name);
    cell(row, node.state);
    cell(row, `${Math.round((Date.now() - Date.parse(node.last_heartbeat)) / 1000)} s ago`);
    const devices = add(add(row, "td"), "ul");
    devices.className = "devices";
    for (const d of node.devices) {
      const memory = d.memory_bytes ? `, ${(d.memory_bytes / 2 ** 30).toFixed(0)} GiB` : "";
      add(devices, "li", `${d.kind} ${d.index} (${d.name}${memory}): ${holderText(d)}`).className = d.held_by
        ? "busy"
        : "free";
    }
    rows.appendChild(row);
  }
  const waiting = queued.jobs
    .filter((job) => job.pending_reason)
    .sort((a, b) => a.device.localeCompare(b.device) || (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9));
  const list = $("queue-rows");
  list.replaceChildren();
  for (const job of waiting) {
    const position = job.queue_position ? `#${job.queue_position} ${job.device}` : job.device;
    add(list, "li", `${position}: ${job.name || job.id}: ${job.pending_reason.message}`);
  }
  $("queue-empty").hidden = waiting.length > 0;
}

/** Nothing to wire: the view only shows. */
export function wire() {}

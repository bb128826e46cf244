// Cluster: nodes, devices and who holds them; the team's queue with the scheduler's reasons.

import { api } from "../api.js";
import { $, add, cell, jobLink, linkedText } from "../dom.js";

export const live = true;

/** Who holds a device: its team, and the job and rank (a link, when the reader may see the job). */
function holder(item, device) {
  const held = device.held_by;
  if (!held) {
    item.append("free");
    return;
  }
  item.append(`${held.team_name}`);
  if (held.job_id) {
    item.append(" ", jobLink(held.job_id, held.job_name || held.job_id), ` rank ${held.rank}`);
  }
}

export async function refresh() {
  const [pool, queued] = await Promise.all([api("/v1/nodes"), api("/v1/jobs?state=queued&limit=500")]);
  const rows = $("node-rows");
  rows.replaceChildren();
  for (const node of pool.nodes) {
    const row = document.createElement("tr");
    cell(row, node.name);
    // a node in quarantine gets no new placements until a platform admin lifts it: say why
    const state = cell(row, node.quarantine ? `${node.state}, in quarantine: ${node.quarantine.reason}` : node.state);
    if (node.quarantine) state.className = "quarantined";
    cell(row, `${Math.round((Date.now() - Date.parse(node.last_heartbeat)) / 1000)} s ago`);
    const use = node.ranks_use;
    const usage = cell(row, use ? `${use.cpu_cores.toFixed(1)} cores, ${(use.resident_bytes / 2 ** 20).toFixed(0)} MiB` : "-");
    usage.className = "ranks-use";
    const devices = add(add(row, "td"), "ul");
    devices.className = "devices";
    for (const d of node.devices) {
      const memory = d.memory_bytes ? `, ${(d.memory_bytes / 2 ** 30).toFixed(0)} GiB` : "";
      const item = add(devices, "li", `${d.kind} ${d.index} (${d.name}${memory}): `);
      holder(item, d);
      item.className = d.held_by ? "busy" : "free";
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
    const item = add(list, "li", `${position}: `);
    item.appendChild(jobLink(job.id, job.name || job.id));
    const why = add(item, "span");
    linkedText(why, `: ${job.pending_reason.message}`);
  }
  $("queue-empty").hidden = waiting.length > 0;
}

/** Nothing to wire: the view only shows. */
export function wire() {}

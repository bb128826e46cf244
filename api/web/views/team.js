// Team (admins): teams and quotas (a platform admin creates teams and sets quotas), and one team's tokens:
// created (shown once) and revoked.

import { api, describe } from "../api.js";
import { $, act, add, button, cell, clock } from "../dom.js";

/** The team whose tokens are listed (the signed-in token's own until another is picked). */
let teamId = null;
/** The shell: navigate(page, arg) and me(). */
let app = null;

/** The view holds forms being typed into: it is drawn once, and again after each change. */
export const live = false;

export async function refresh() {
  const me = app.me();
  const { teams } = await api("/v1/teams");
  teamId = teamId && teams.some((t) => t.id === teamId) ? teamId : me.team_id;
  const rows = $("team-rows");
  rows.replaceChildren();
  for (const team of teams) {
    const row = document.createElement("tr");
    row.dataset.team = team.name;
    cell(row, team.name);
    for (const kind of ["gpu_quota", "cpu_quota"]) {
      if (me.platform) {
        const input = document.createElement("input");
        Object.assign(input, { type: "number", min: 0, value: team[kind] });
        input.dataset.field = kind;
        input.setAttribute("aria-label", `${team.name} ${kind.replace("_", " ")}`);
        add(row, "td").appendChild(input);
      } else {
        cell(row, team[kind]);
      }
    }
    cell(row, team.weight);
    cell(row, team.budget ? `${team.budget.device_hours} device-hours per ${team.budget.period}` : "none");
    // what it used in the last 30 days (the usage route's default range)
    const used = cell(row, "…");
    used.dataset.usage = team.id;
    api(`/v1/teams/${team.id}/usage`).then(
      (usage) => (used.textContent = usage.device_hours.toFixed(2)),
      () => (used.textContent = "-"),
    );
    const actions = add(row, "td");
    actions.appendChild(button("Tokens", () => teamAction(() => (teamId = team.id)), { team: team.id }));
    if (me.platform) actions.appendChild(button("Save quotas", () => saveQuotas(team.id, row)));
    rows.appendChild(row);
  }
  $("team-create").hidden = !me.platform;
  const team = teams.find((t) => t.id === teamId);
  $("tokens-title").textContent = `Tokens of team ${team ? team.name : ""}`;
  const { tokens } = await api(`/v1/teams/${teamId}/tokens`);
  const tokenRows = $("token-rows");
  tokenRows.replaceChildren();
  for (const token of tokens) {
    const row = document.createElement("tr");
    row.dataset.token = token.id;
    cell(row, token.label || token.id.slice(0, 8));
    cell(row, `${token.role}${token.platform ? " (platform)" : ""}`);
    cell(row, clock(token.created_at));
    cell(row, clock(token.last_used_at) || "never");
    cell(row, clock(token.expires_at) || "never");
    const state = add(row, "td");
    if (token.revoked_at) state.textContent = `revoked ${clock(token.revoked_at)}`;
    else if (token.id === me.token_id) state.textContent = "this session";
    else {
      const revoke = button("Revoke", () => revokeToken(token, revoke), { revoke: token.id });
      revoke.setAttribute("aria-label", `revoke ${token.label || token.id}`);
      state.appendChild(revoke);
    }
    tokenRows.appendChild(row);
  }
}

/** An admin's change: its refusal shown in the view's error line, and the view drawn again either way. */
async function teamAction(action) {
  await act($("team-error"), action);
  try {
    await refresh();
  } catch (error) {
    $("team-error").textContent = describe(error);
  }
}

function saveQuotas(id, row) {
  const value = (field) => Number(row.querySelector(`input[data-field=${field}]`).value);
  return teamAction(() =>
    api(`/v1/teams/${id}`, {
      method: "PATCH",
      body: JSON.stringify({ gpu_quota: value("gpu_quota"), cpu_quota: value("cpu_quota") }),
    }),
  );
}

/** Revoking takes a second click on the same button (whoever uses the token is refused from then on). */
function revokeToken(token, revoke) {
  if (revoke.dataset.armed !== "yes") {
    revoke.dataset.armed = "yes";
    revoke.textContent = "Click again to revoke";
    return;
  }
  return teamAction(() => api(`/v1/tokens/${token.id}`, { method: "DELETE" }));
}

function createTeam(event) {
  event.preventDefault();
  teamAction(() =>
    api("/v1/teams", {
      method: "POST",
      body: JSON.stringify({
        name: $("new-team-name").value,
        gpu_quota: Number($("new-team-gpu").value),
        cpu_quota: Number($("new-team-cpu").value),
      }),
    }),
  );
}

function createToken(event) {
  event.preventDefault();
  teamAction(async () => {
    const label = $("new-token-label").value.trim();
    const days = Number($("new-token-days").value);
    const expires = days > 0 ? { expires_at: new Date(Date.now() + days * 864e5).toISOString() } : {};
    const created = await api(`/v1/teams/${teamId}/tokens`, {
      method: "POST",
      body: JSON.stringify({ role: $("new-token-role").value, ...(label ? { label } : {}), ...expires }),
    });
    $("new-token-label").value = "";
    const shown = $("new-token");
    shown.replaceChildren(`New ${created.info.role} token (shown this once, copy it now): `);
    const code = shown.appendChild(document.createElement("code"));
    code.id = "new-token-value";
    code.textContent = created.token;
    const copy = button("Copy", () => navigator.clipboard.writeText(created.token).then(() => (copy.textContent = "Copied")));
    shown.append(" ", copy);
  });
}

export function wire(shell) {
  app = shell;
  $("team-create").addEventListener("submit", createTeam);
  $("token-create").addEventListener("submit", createToken);
}

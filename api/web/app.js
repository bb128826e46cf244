// ringtrain's web page: the same API as curl, from the browser, same origin, no CDN, no build step (native
// ES modules). This is the shell: signing in and out, and navigation between the views, each a module in
// views/ that keeps its own state and wires its own controls once. The token lives in sessionStorage (never
// in a URL); a live view refreshes itself every two seconds while it is shown.
//
// A view module exports `wire(app)` and may export `refresh()` (draws it; async), `open(arg)` (what to
// show, from navigate's argument) and `live` (refresh every two seconds while shown). `app` is
// { navigate(page, arg), me() }.

import { api, TOKEN_KEY } from "./api.js";
import { $ } from "./dom.js";
import * as cluster from "./views/cluster.js";
import * as compare from "./views/compare.js";
import * as job from "./views/job.js";
import * as jobs from "./views/jobs.js";
import * as studies from "./views/studies.js";
import * as submit from "./views/submit.js";
import * as team from "./views/team.js";

/** Every view, by the id of its section (and the data-page of its nav button). */
const VIEWS = { jobs, job, submit, studies, compare, cluster, team };
/** Every section: the sign-in form and the views. */
const PAGES = ["signin", ...Object.keys(VIEWS)];
const REFRESH_MS = 2000;

/** The signed-in token's /v1/me. */
let me = null;
/** The live view's refresh. */
let timer = null;

const app = { navigate: show, me: () => me };

/** Shows `page` alone, given `arg` (a job's id, the jobs to compare, a spec), and keeps it fresh. */
function show(page, arg) {
  clearInterval(timer);
  timer = null;
  for (const id of PAGES) $(id).hidden = id !== page;
  const view = VIEWS[page];
  if (!view) return;
  if (view.open) view.open(arg);
  if (!view.refresh) return;
  // a refresh that fails is retried by the next; actions show their own refusals
  const guarded = () => view.refresh().catch((error) => console.warn(`${page}: ${error.message}`));
  guarded();
  if (view.live) timer = setInterval(guarded, REFRESH_MS);
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("/v1/me");
  } catch (error) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("signin-error").textContent = `Not signed in: ${error.message}`;
    return;
  }
  $("whoami").textContent = `${me.role} of team ${me.team_name}${me.platform ? " (platform admin)" : ""}`;
  $("nav").hidden = false;
  $("team-nav").hidden = me.role !== "admin";
  $("signout").hidden = false;
  $("signin-error").textContent = "";
  show("jobs");
}

document.addEventListener("DOMContentLoaded", () => {
  for (const view of Object.values(VIEWS)) view.wire(app);
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  for (const navButton of document.querySelectorAll("#nav button")) {
    navButton.addEventListener("click", () => show(navButton.dataset.page));
  }
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) signIn(token);
});

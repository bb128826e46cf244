// ringtrain's web page: the same API as curl, from the browser, same origin, no CDN, no build step (native
// ES modules). This is the shell: signing in and out, and navigation between the views, each a module in
// views/ that keeps its own state and wires its own controls once. The token lives in sessionStorage (never
// in a URL); a live view refreshes itself every two seconds while it is shown.
//
// A view module exports `wire(app)` and may export `refresh()` (draws it; async), `open(arg)` (what to
// show, from navigate's argument) and `live` (refresh every two seconds while shown). `app` is
// { navigate(page, arg), me() }.
//
// Every view has an address (`#/jobs`, `#/jobs/ID`, `#/studies/ID`, `#/compare/A,B`, `#/submit`, ...): the
// page shown follows the address, so a reload shows the same view, Back goes to the one before, and a
// job, study or comparison can be linked. navigate() adds a history entry and shows its view.

import { api, onContact, TOKEN_KEY } from "./api.js";
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

const app = { navigate, me: () => me };

/** What navigate() was given that an address cannot hold (the spec "Submit again" opens the editor with). */
let carried = null;

/** The address of a view: `arg` is a job's or study's id, or the ids compared. */
export function address(page, arg) {
  const list = Array.isArray(arg) ? arg.join(",") : arg;
  const path = { job: "jobs" }[page] || page;
  return typeof list === "string" && list ? `#/${path}/${encodeURIComponent(list).replaceAll("%2C", ",")}` : `#/${path}`;
}

/** The view an address names, and its argument; the Jobs list for anything else. */
export function route(hash) {
  const [path, arg] = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (path === "jobs" || path === "job") return arg ? ["job", arg] : ["jobs", undefined];
  if (path === "compare") return ["compare", arg ? arg.split(",").filter(Boolean) : []];
  if (path in VIEWS) return [path, arg || undefined];
  return ["jobs", undefined];
}

/** Goes to `page` by its address (the address changes, and with it the page). */
function navigate(page, arg) {
  carried = arg !== null && typeof arg === "object" && !Array.isArray(arg) ? arg : null;
  const next = address(page, carried ? undefined : arg);
  // a new history entry, shown at once (pushState fires no hashchange; Back and a typed address do)
  if (location.hash !== next) history.pushState(null, "", next);
  showAddress();
}

/** Shows the view the address names. */
function showAddress() {
  if (!me) return;
  const [page, arg] = route(location.hash);
  // an address that names no view (or none at all) is the Jobs list's: say so, without a new history entry
  const canonical = address(page, arg);
  if (location.hash !== canonical) history.replaceState(null, "", canonical);
  show(page, carried ?? arg);
  carried = null;
}

/** Shows `page` alone, given `arg` (a job's id, the jobs to compare, a spec), and keeps it fresh. */
function show(page, arg) {
  clearInterval(timer);
  timer = null;
  for (const id of PAGES) $(id).hidden = id !== page;
  for (const navButton of document.querySelectorAll("#nav button")) {
    const current = navButton.dataset.page === page || (page === "job" && navButton.dataset.page === "jobs");
    if (current) navButton.setAttribute("aria-current", "page");
    else navButton.removeAttribute("aria-current");
  }
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
  showAddress();
}

/** The banner that says the server cannot be reached, from the first failed call until one is answered. */
function showContact(lostSince) {
  const banner = $("contact");
  banner.hidden = lostSince === null;
  if (lostSince !== null) {
    banner.textContent = `Lost contact with the server at ${lostSince.toLocaleTimeString()}; retrying. What is shown may be out of date.`;
  }
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
    navButton.addEventListener("click", () => navigate(navButton.dataset.page));
  }
  window.addEventListener("hashchange", showAddress);
  onContact(showContact);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) signIn(token);
});

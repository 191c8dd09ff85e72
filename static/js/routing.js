// Routing view: start a routing lab run (POST /api/routing), poll its progress, show its rows; a
// live run links to its fleet in the Fleet view and can switch its policy while it runs; a live
// comparison shows its two sides in two columns, each linking to its own fleet.

import { api } from "./api.js";
import { escapeHtml } from "./dom.js";
import { boundsLine, decisionLines, describeRun, fleetHref, resultTable, routingBody, sideColumns } from "./routing-model.js";

// Polling period while a run goes: the server updates progress every 256 requests.
const POLL_MS = 400;

/** @param {(sel: string) => HTMLElement} $ */
export function createRoutingView($) {
  const form = /** @type {HTMLFormElement} */ ($("#f-routing"));
  const status = $("#routing-status");
  /** @type {import("./routing-model.js").RoutingRun|null} */
  let run = null;
  let timer = 0;
  let error = "";

  /** @param {{headers: string[], rows: string[][]}} t */
  const tableHtml = (t) =>
    `<thead><tr>${t.headers.map((h) => `<th>${escapeHtml(h)}</th>`).join("")}</tr></thead>` +
    `<tbody>${t.rows.map((r) => `<tr>${r.map((c) => `<td>${escapeHtml(c)}</td>`).join("")}</tr>`).join("")}</tbody>`;
  /** @param {string[]} lines */
  const listHtml = (lines) => lines.map((l) => `<li>${escapeHtml(l)}</li>`).join("");

  function renderSides() {
    const cols = run ? sideColumns(run) : [];
    const box = $("#routing-sides");
    box.hidden = cols.length === 0;
    document.querySelectorAll("#view-routing .routing-single").forEach((el) => {
      /** @type {HTMLElement} */ (el).hidden = cols.length > 0;
    });
    box.innerHTML = cols
      .map(
        (c) =>
          `<section class="panel routing-side"><div class="panel-head"><h2>${escapeHtml(c.title)}</h2>` +
          `<span class="hint">${escapeHtml(c.hit)}</span></div>` +
          (c.fleet ? `<a class="side-fleet" href="${escapeHtml(c.fleet)}">open fleet ${escapeHtml(c.fleetName || "")} in the Fleet view</a>` : "") +
          `<table class="log">${tableHtml(c.table)}</table>` +
          `<ol class="decisions">${listHtml(c.decisions)}</ol></section>`,
      )
      .join("");
  }

  function render() {
    const box = $("#routing-progress");
    const table = $("#routing-results");
    const bounds = $("#routing-bounds");
    renderSides();
    bounds.textContent = run ? boundsLine(run) : "";
    bounds.hidden = !bounds.textContent;
    if (!run) {
      box.hidden = true;
      table.innerHTML = "";
      $("#routing-decisions").innerHTML = "";
      $("#routing-live").hidden = true;
      return;
    }
    const href = fleetHref(run);
    const live = $("#routing-live");
    live.hidden = run.mode !== "live" || !!run.compare;
    const link = /** @type {HTMLAnchorElement} */ ($("#routing-fleet-link"));
    link.hidden = !href;
    if (href) {
      link.href = href;
      link.textContent = `open fleet ${run.fleet} in the Fleet view`;
    }
    /** @type {HTMLButtonElement} */ ($("#b-routing-switch")).disabled = run.state !== "running";
    const d = describeRun(run);
    box.hidden = false;
    box.dataset.state = d.state;
    /** @type {HTMLElement} */ (box.querySelector("i")).style.width = `${(100 * d.frac).toFixed(1)}%`;
    /** @type {HTMLElement} */ (box.querySelector("span")).textContent = d.text;
    table.innerHTML = tableHtml(resultTable(run));
    $("#routing-decisions").innerHTML = listHtml(decisionLines(run));
  }

  async function poll() {
    timer = 0;
    if (!run) return;
    try {
      run = (await api("GET", `/api/routing/${encodeURIComponent(run.id)}`)).routing;
    } catch (e) {
      error = String(/** @type {Error} */ (e).message || e);
    }
    render();
    if (run && run.state === "running") timer = window.setTimeout(poll, POLL_MS);
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const policies = Array.from(form.querySelectorAll("input[name=policy]:checked")).map((el) => /** @type {HTMLInputElement} */ (el).value);
    const body = routingBody({
      policies,
      replicas: form.replicas.value,
      capacity: form.capacity.value,
      limit: form.limit.value,
      mode: form.mode.value,
      speed: form.speed.value,
      compare: form.compare.checked,
    });
    try {
      run = (await api("POST", "/api/routing", body)).routing;
      error = "";
      status.textContent = `run ${run.id} started`;
    } catch (e) {
      error = String(/** @type {Error} */ (e).message || e);
      status.textContent = error;
      return;
    }
    render();
    if (timer) window.clearTimeout(timer);
    timer = window.setTimeout(poll, POLL_MS);
  });

  $("#b-routing-stop").addEventListener("click", async () => {
    if (!run) return;
    try {
      run = (await api("POST", "/api/routing", { action: "stop", id: run.id })).routing;
      status.textContent = `run ${run.id} stopping`;
    } catch (e) {
      error = String(/** @type {Error} */ (e).message || e);
      status.textContent = error;
    }
    render();
  });

  $("#b-routing-switch").addEventListener("click", async () => {
    if (!run || run.mode !== "live") return;
    const policy = /** @type {HTMLSelectElement} */ ($("#routing-switch")).value;
    try {
      run = (await api("POST", `/api/routing/${encodeURIComponent(run.id)}/policy`, { policy })).routing;
      status.textContent = `run ${run.id} routes with ${policy} from request ${run.done} on`;
    } catch (e) {
      error = String(/** @type {Error} */ (e).message || e);
      status.textContent = error;
    }
    render();
  });

  return {
    /** What the view shows, for the browser tests. */
    summary: () =>
      run
        ? {
            id: run.id,
            state: run.state,
            mode: run.mode,
            policy: run.policy,
            done: run.done,
            total: run.total,
            fleet: fleetHref(run),
            table: resultTable(run),
            bounds: boundsLine(run),
            decisions: decisionLines(run),
            sides: sideColumns(run),
            error,
          }
        : { error },
  };
}

// Routing view: start a routing lab run (POST /api/routing), poll its progress, show its rows; a
// live run links to its fleet in the Fleet view and can switch its policy while it runs; a live
// comparison shows its two sides in two columns, each linking to its own fleet.

import { api } from "./api.js";
import { escapeHtml } from "./dom.js";
import {
  boundsLine,
  candidateTable,
  decisionLines,
  decisionPolicies,
  decisionsQuery,
  decisionTable,
  describeRun,
  fleetHref,
  resultTable,
  routingBody,
  runOptions,
  runToShow,
  sideColumns,
} from "./routing-model.js";

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
    live.hidden = !((run.mode === "live" && !run.compare) || run.mode === "router");
    $("#routing-switch-box").hidden = run.mode !== "live";
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
    syncExplorer();
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
    else loadRuns(); // its line in the runs list says how it ended
  }

  // -- the runs the server keeps (GET /api/routing): pick one to show ---------------------------
  const runsSel = /** @type {HTMLSelectElement} */ ($("#routing-runs"));

  /** Refill the runs select; with `open`, show the newest running run (or the newest) when none is shown. */
  async function loadRuns(open = false) {
    let runs;
    try {
      runs = (await api("GET", "/api/routing")).runs;
    } catch (e) {
      return;
    }
    const opts = runOptions(runs);
    runsSel.innerHTML = opts.length
      ? opts.map((o) => `<option value="${escapeHtml(o.value)}">${escapeHtml(o.label)}</option>`).join("")
      : `<option value="">none yet</option>`;
    if (open && !run) {
      const pick = runToShow(runs);
      if (pick) {
        run = pick;
        render();
        if (run.state === "running" && !timer) timer = window.setTimeout(poll, POLL_MS);
      }
    }
    if (run) runsSel.value = run.id;
  }

  runsSel.addEventListener("change", async () => {
    if (!runsSel.value) return;
    if (timer) window.clearTimeout(timer);
    timer = 0;
    run = { ...(run || {}), id: runsSel.value };
    await poll();
  });
  loadRuns(true);

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
      router: form.router.value,
    });
    try {
      run = (await api("POST", "/api/routing", body)).routing;
      error = "";
      status.textContent = `run ${run.id} started`;
      loadRuns();
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

  // -- every decision: GET /api/routing/{id}/decisions, a page at a time -----------------------
  const dform = /** @type {HTMLFormElement} */ ($("#f-decisions"));
  /** @type {import("./routing-model.js").FullDecision[]} */
  let page = [];
  let offset = 0;
  /** @type {{prev: number|null, next: number|null, where: string}} */
  let paging = { prev: null, next: null, where: "" };

  function syncExplorer() {
    const box = $("#routing-explorer");
    box.hidden = !run;
    if (!run) return;
    const sel = /** @type {HTMLSelectElement} */ ($("#decisions-policy"));
    const names = decisionPolicies(run);
    const have = Array.from(sel.options).map((o) => o.value);
    if (names.join("\n") !== have.join("\n")) {
      const keep = sel.value;
      sel.innerHTML = names.map((n) => `<option>${escapeHtml(n)}</option>`).join("");
      if (names.includes(keep)) sel.value = keep;
    }
  }

  async function loadDecisions(at) {
    if (!run) return;
    let query;
    try {
      query = decisionsQuery({ policy: dform.policy.value, rule: dform.rule.value, replica: dform.replica.value,
        request: dform.request.value, offset: at });
    } catch (e) {
      $("#decisions-where").textContent = String(/** @type {Error} */ (e).message);
      return;
    }
    try {
      const got = await api("GET", `/api/routing/${encodeURIComponent(run.id)}/decisions?${query}`);
      page = got.decisions;
      offset = got.offset;
      const t = decisionTable(got);
      paging = t;
      $("#decisions-table").innerHTML = t.rows.length
        ? tableHtml(t).replace(/<tr>(?=<td)/g, () => "<tr tabindex=\"0\">")
        : "";
      $("#decisions-where").textContent = t.where;
    } catch (e) {
      page = [];
      $("#decisions-table").innerHTML = "";
      $("#decisions-where").textContent = String(/** @type {Error} */ (e).message || e);
    }
    /** @type {HTMLButtonElement} */ ($("#b-decisions-prev")).disabled = paging.prev === null;
    /** @type {HTMLButtonElement} */ ($("#b-decisions-next")).disabled = paging.next === null;
    $("#decision-detail").hidden = true;
  }

  /** @param {number} i the row on this page */
  function showDecision(i) {
    const d = page[i];
    if (!d) return;
    const t = candidateTable(d);
    $("#decision-title").textContent = t.title;
    $("#decision-candidates").innerHTML = tableHtml(t);
    const link = /** @type {HTMLAnchorElement} */ ($("#decision-fleet"));
    const side = run && run.mode === "live" ? (run.sides || []).find((s) => (s.label || s.policy) === dform.policy.value) : null;
    const fleet = run && run.mode === "router" ? run.fleet : side && side.fleet;
    link.hidden = !fleet;
    if (fleet) link.href = `/?fleet=${encodeURIComponent(fleet)}#fleet`;
    $("#decision-detail").hidden = false;
  }

  dform.addEventListener("submit", (ev) => {
    ev.preventDefault();
    loadDecisions(0);
  });
  $("#b-decisions-prev").addEventListener("click", () => paging.prev !== null && loadDecisions(paging.prev));
  $("#b-decisions-next").addEventListener("click", () => paging.next !== null && loadDecisions(paging.next));
  $("#decisions-table").addEventListener("click", (ev) => {
    const tr = /** @type {HTMLElement} */ (ev.target).closest("tbody tr");
    if (tr) showDecision(Array.from(tr.parentElement.children).indexOf(tr));
  });
  $("#decisions-table").addEventListener("keydown", (ev) => {
    const tr = /** @type {HTMLElement} */ (ev.target).closest("tbody tr");
    if (tr && (ev.key === "Enter" || ev.key === " ")) {
      ev.preventDefault();
      showDecision(Array.from(tr.parentElement.children).indexOf(tr));
    }
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
            explorer: { offset, where: paging.where, rows: page.length },
            error,
          }
        : { error },
  };
}

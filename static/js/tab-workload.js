// Controls, Workload tab: start a scenario, a trace replay or a Mooncake replay, stop it, show its progress.

import { describeWorkload } from "./model.js";

/** @param {import("./controls.js").ControlContext} ctx */
export function createWorkloadTab(ctx) {
  const { $, act, client } = ctx;
  const wf = $("#f-workload");
  const syncWorkloadForm = () => {
    const kind = wf.kind.value;
    wf.querySelectorAll("[data-for]").forEach((el) => (el.hidden = !el.dataset.for.split(" ").includes(kind)));
    wf.speedOut.value = `${wf.speed.value}×`;
  };
  wf.addEventListener("input", syncWorkloadForm);
  syncWorkloadForm();
  wf.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const kind = wf.kind.value;
    const body =
      kind === "scenario"
        ? { kind, name: wf.name.value, speed: Number(wf.speed.value), seed: Number(wf.seed.value) }
        : { kind, speed: Number(wf.speed.value), limit: Number(wf.limit.value) };
    act("workload", async () => {
      await client().startWorkload(body);
      const what = { trace: "trace replay", mooncake: "Mooncake replay" }[kind];
      return `started ${what ? `${what} of ${body.limit} requests` : body.name} at ${body.speed}×`;
    });
  });
  $("#b-stop").addEventListener("click", () =>
    act("stop", async () => {
      await client().stopWorkload();
      return "workload stopped";
    }),
  );

  /** @param {import("./model.js").WorkloadProgress|null} w */
  function showProgress(w) {
    const box = $("#progress");
    const d = describeWorkload(w);
    if (!d) {
      box.hidden = true;
      return;
    }
    box.hidden = false;
    box.querySelector("i").style.width = `${(100 * d.frac).toFixed(1)}%`;
    const text = box.querySelector("span");
    text.textContent = d.text;
    text.title = d.error;
    box.dataset.state = d.state;
  }

  return { showProgress };
}

// ctxlab lab: lays out what /api/plan answers. No figure is computed here: every number
// shown comes from ctxlab.plan on the server; this script only compares the previous answer
// with the new one to say which figures moved and which stack layer they belong to.
"use strict";

const form = document.getElementById("lab-form");
const statusEl = document.getElementById("status");
const formErrorEl = document.getElementById("form-error");
const changeEl = document.getElementById("change");
const PANELS = {
  logical: document.getElementById("fig-logical"),
  physical: document.getElementById("fig-physical"),
  prefix_avoided: document.getElementById("fig-prefix"),
  page_waste: document.getElementById("fig-waste"),
};
let meta = { fields: [], presets: [] };
let previous = null; // last good answer: {inputs, figures}
let sequence = 0;
let timer = null;

function fieldInfo(name) {
  return meta.fields.find((f) => f.name === name) || { label: name, layer: "?" };
}

function formValues() {
  const values = {};
  for (const el of form.elements) {
    if (el.name) values[el.name] = el.value;
  }
  return values;
}

function syncModeClasses() {
  const raw = form.elements.arch.value === "raw";
  form.classList.toggle("raw", raw);
  for (const kind of ["mamba", "linear", "kda"]) {
    form.classList.toggle(`rec-${kind}-on`, raw && form.elements.recurrent_kind.value === kind);
  }
  form.elements.weights_gib.placeholder = raw
    ? "0 (raw: no params)"
    : "preset params x 2 B";
  const preset = meta.presets.find((p) => p.name === form.elements.preset.value);
  document.getElementById("preset-info").textContent = preset
    ? `${preset.description}. Source: ${preset.source}.`
    : "";
}

function showErrors(errors, message) {
  for (const el of form.querySelectorAll(".bad")) el.classList.remove("bad");
  for (const el of form.querySelectorAll(".err")) el.textContent = "";
  formErrorEl.textContent = "";
  let placed = false;
  for (const [name, text] of Object.entries(errors || {})) {
    const slot = document.getElementById(`err-${name}`);
    const input = form.elements[name];
    if (slot && input) {
      slot.textContent = text;
      input.classList.add("bad");
      placed = true;
    } else {
      formErrorEl.textContent = text;
      placed = true;
    }
  }
  if (message && !placed) formErrorEl.textContent = message;
}

function renderFigures(figures) {
  for (const [key, panel] of Object.entries(PANELS)) {
    const fig = figures[key];
    const value = panel.querySelector(".value");
    value.textContent = fig.text;
    value.dataset.bytes = String(fig.bytes);
    panel.querySelector(".exact").textContent = `${fig.exact}`;
    panel.querySelector(".denominator").textContent = fig.denominator;
    panel.querySelector("h2").textContent = fig.title;
    panel.querySelector(".layer").textContent = `layer: ${fig.layer}`;
  }
}

function describeChange(before, after) {
  const changed = Object.keys(after.inputs).filter(
    (k) => JSON.stringify(after.inputs[k]) !== JSON.stringify(before.inputs[k]),
  );
  if (changed.length === 0) return null;
  const moved = [];
  const still = [];
  for (const key of Object.keys(PANELS)) {
    const a = before.figures[key];
    const b = after.figures[key];
    (a.bytes === b.bytes ? still : moved).push(b);
  }
  const inputs = changed
    .map((k) => `${fieldInfo(k).label} (${fieldInfo(k).layer})`)
    .join(", ");
  const list = (figs) =>
    figs.length ? figs.map((f) => `${f.title} [${f.layer}]`).join("; ") : "none";
  const movedLayers = [...new Set(moved.map((f) => f.layer))];
  let verdict = "";
  if (moved.length === 0) {
    verdict = "None of the four figures moved.";
  } else if (!moved.some((f) => f.key === "logical")) {
    verdict =
      `What moved is ${movedLayers.join(" and ")}: the logical cost of a token ` +
      "(representation) is unchanged, so this is not a smaller token.";
  } else {
    verdict =
      "The logical cost of a token moved: a representation change, and the figures built " +
      "on it moved with it.";
  }
  return { inputs, moved: list(moved), still: list(still), verdict, movedKeys: moved.map((f) => f.key) };
}

function renderChange(note) {
  for (const panel of Object.values(PANELS)) panel.classList.remove("moved");
  changeEl.textContent = "";
  if (!note) return;
  const lines = [
    ["changed-inputs", `You changed: ${note.inputs}.`],
    ["moved", `Moved: ${note.moved}.`],
    ["unchanged", `Unchanged: ${note.still}.`],
    ["verdict", note.verdict],
  ];
  for (const [cls, text] of lines) {
    const p = document.createElement("p");
    p.className = cls;
    p.textContent = text;
    changeEl.appendChild(p);
  }
  for (const key of note.movedKeys) PANELS[key].classList.add("moved");
}

// -- chart: inline SVG, bytes of the whole concurrency against context length ------------
const SVG_NS = "http://www.w3.org/2000/svg";
function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}
function tickBytes(n) {
  const units = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [u, s] of units) if (n >= s) return `${+(n / s).toFixed(1)} ${u}`;
  return `${n} B`;
}
function tickTokens(n) {
  if (n >= 2 ** 20 && n % 2 ** 20 === 0) return `${n / 2 ** 20}M`;
  if (n >= 1024 && n % 1024 === 0) return `${n / 1024}K`;
  return String(n);
}

function renderChart(chart) {
  const holder = document.getElementById("chart");
  holder.textContent = "";
  const W = 760, H = 280, L = 84, R = 120, T = 14, B = 34;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "bytes against context length" });
  const pts = chart.points;
  if (!pts.length) return;
  const xs = pts.map((p) => Math.log2(p.context));
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  // Both axes are logarithmic: linear growth is a straight line, a window is a plateau,
  // and a budget many times larger than the state still fits on the chart.
  const budget = chart.budget_bytes;
  const values = pts.flatMap((p) => [p.logical_bytes, p.physical_bytes]).concat([budget]);
  const positive = values.filter((v) => v > 0);
  const lo2 = Math.floor(Math.log2(Math.min(...positive)));
  const hi2 = Math.max(lo2 + 1, Math.ceil(Math.log2(Math.max(...positive))));
  const X = (c) => L + ((Math.log2(c) - x0) / Math.max(x1 - x0, 1e-9)) * (W - L - R);
  const Y = (b) => T + (1 - (Math.log2(Math.max(b, 2 ** lo2)) - lo2) / (hi2 - lo2)) * (H - T - B);
  const step = Math.max(1, Math.ceil((hi2 - lo2) / 6));
  for (let k = lo2; k <= hi2; k += step) {
    const b = 2 ** k;
    svg.appendChild(svgEl("line", { class: "grid", x1: L, x2: W - R, y1: Y(b), y2: Y(b) }));
    svg.appendChild(svgEl("text", { x: L - 6, y: Y(b) + 4, "text-anchor": "end" }, tickBytes(b)));
  }
  for (const p of pts) {
    if (Number.isInteger(Math.log2(p.context)) && Math.log2(p.context) % 2 === 0) {
      svg.appendChild(svgEl("text", { x: X(p.context), y: H - B + 16, "text-anchor": "middle" }, tickTokens(p.context)));
    }
  }
  svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  svg.appendChild(svgEl("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  svg.appendChild(svgEl("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "context length (tokens, log scale)"));
  svg.appendChild(svgEl("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(T + H - B) / 2})` }, "bytes, all requests (log scale)"));
  const path = (key) => pts.map((p, i) => `${i ? "L" : "M"}${X(p.context).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" ");
  svg.appendChild(svgEl("path", { class: "logical", d: path("logical_bytes") }));
  svg.appendChild(svgEl("path", { class: "physical", d: path("physical_bytes") }));
  // Right-hand labels, pushed apart so that lines ending close together stay readable.
  const last = pts[pts.length - 1];
  const labels = [
    { y: Y(last.logical_bytes), text: "logical" },
    { y: Y(last.physical_bytes), text: "after paging" },
  ];
  if (budget > 0) {
    svg.appendChild(svgEl("line", { class: "budget", x1: L, x2: W - R, y1: Y(budget), y2: Y(budget) }));
    labels.push({ y: Y(budget), text: `KV budget ${tickBytes(budget)}` });
  }
  labels.sort((a, b) => a.y - b.y);
  for (let i = 1; i < labels.length; i++) {
    labels[i].y = Math.max(labels[i].y, labels[i - 1].y + 13);
  }
  for (const label of labels) {
    svg.appendChild(svgEl("text", { x: W - R + 6, y: label.y + 4 }, label.text));
  }
  svg.appendChild(svgEl("line", { class: "here", x1: X(chart.context), x2: X(chart.context), y1: T, y2: H - B }));
  holder.appendChild(svg);
}

// -- the round trip ---------------------------------------------------------------------
async function update() {
  const mine = ++sequence;
  statusEl.textContent = "computing…";
  let answer, status;
  try {
    const response = await fetch("/api/plan", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(formValues()),
    });
    status = response.status;
    answer = await response.json();
  } catch (err) {
    if (mine !== sequence) return;
    statusEl.textContent = `the lab server did not answer (${err}); is ctxlab lab still running?`;
    statusEl.classList.add("stale");
    return;
  }
  if (mine !== sequence) return; // a newer request is on its way
  if (status !== 200) {
    showErrors(answer.errors, answer.error);
    statusEl.textContent = "Not updated: fix the marked field. The figures below are from the last valid input.";
    statusEl.classList.add("stale");
    document.body.dataset.state = "error";
    return;
  }
  showErrors({}, "");
  statusEl.classList.remove("stale");
  statusEl.textContent = `${answer.arch.name}: ${answer.arch.summary}`;
  renderFigures(answer.figures);
  document.getElementById("capacity").textContent =
    `${answer.capacity.sentence} ${answer.capacity.concurrency_sentence}`;
  renderChart(answer.chart);
  const notes = document.getElementById("notes");
  notes.textContent = "";
  for (const text of answer.notes) {
    const li = document.createElement("li");
    li.textContent = text;
    notes.appendChild(li);
  }
  const current = { inputs: answer.inputs, figures: answer.figures };
  renderChange(previous ? describeChange(previous, current) : null);
  previous = current;
  document.body.dataset.state = "ready";
  document.body.dataset.sequence = String(mine);
}

function schedule() {
  syncModeClasses();
  clearTimeout(timer);
  timer = setTimeout(update, 150);
}

async function init() {
  try {
    meta = await (await fetch("/api/meta")).json();
  } catch (err) {
    statusEl.textContent = `could not load the lab's presets (${err})`;
    return;
  }
  const select = form.elements.preset;
  for (const p of meta.presets) {
    const opt = document.createElement("option");
    opt.value = p.name;
    opt.textContent = p.name;
    select.appendChild(opt);
  }
  select.value = meta.default_preset;
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);
  form.addEventListener("submit", (e) => e.preventDefault());
  syncModeClasses();
  await update();
}

init();

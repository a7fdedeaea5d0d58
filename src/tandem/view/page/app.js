// tandem view: the page. State lives in the URL's hash (#tab=samples&step=3&...), so a view can be linked
// and reloaded. Data comes from api/... (served) or from window.TANDEM_DATA (the static file).
"use strict";
(function () {
  const STATIC = window.TANDEM_DATA || null;
  const DEFAULTS = {
    tab: "curves", metrics: "", run: "0", kind: "", step: "", sort: "sample", desc: "",
    q: "", smin: "", smax: "", lmin: "", lmax: "", source: "", truncated: "", errors: "", sample: "", prompt: "",
  };
  // one chart per group: the first of its names that the run writes
  const DEFAULT_METRICS = [
    ["score/mean", "reward/score_mean", "rewards/mean"],
    ["val/acc", "val/score_mean"],
    ["response_length/mean"],
    ["actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl"],
    ["actor/entropy"],
    ["rollout_mismatch/k3", "rollout_mismatch/kl", "rollout_mismatch/abs_diff_mean"], // k3: never below 0
    ["val/agent/tool_use_ratio"],
    ["sft/loss"], // an SFT run's folder
    ["val/loss"],
  ];
  // a line under a chart's title for the metrics that read wrongly without it (docs/metrics.md says the same)
  const SIGNED_KL = "signed k1 estimate: dips below 0 by noise (k3 is ≥ 0)"; // docs/metrics.md has the formula
  const METRIC_NOTES = { "rollout_mismatch/kl": SIGNED_KL, "rollout_corr/kl": SIGNED_KL };
  const MARKERS_UP_TO = 60; // points per trace drawn with markers; a longer curve is a line alone
  const KIND_LABEL = { rollouts: "training", validation: "validation" };
  const $ = (id) => document.getElementById(id);
  let state = readState();
  let cache = new Map();

  async function api(route) {
    if (STATIC) {
      if (!(route in STATIC)) throw new Error(`not in this file: ${route}`);
      return STATIC[route];
    }
    if (!cache.has(route)) {
      cache.set(route, fetch(`api/${route}`, { cache: "no-store" }).then((r) => {
        if (!r.ok) throw new Error(`api/${route}: HTTP ${r.status}`);
        return r.json();
      }));
    }
    return cache.get(route);
  }

  function readState() {
    const params = new URLSearchParams(location.hash.slice(1));
    const s = { ...DEFAULTS };
    for (const key of Object.keys(DEFAULTS)) if (params.has(key)) s[key] = params.get(key);
    return s;
  }
  function hashOf(s) {
    const params = new URLSearchParams();
    for (const key of Object.keys(DEFAULTS)) if (s[key] !== DEFAULTS[key]) params.set(key, s[key]);
    return "#" + params.toString();
  }
  // a change that redraws the tab (goes in the history) or only the table (typing in a filter)
  function go(changes) {
    document.body.dataset.ready = ""; // set again once the new view is drawn
    location.hash = hashOf({ ...state, ...changes });
  }
  function quietly(changes) { Object.assign(state, changes); history.replaceState(null, "", hashOf(state)); }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }
  const fmt = (v, digits = 4) => (v === null || v === undefined || v === "" ? "" :
    typeof v === "number" ? (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(digits)))) :
    typeof v === "object" ? JSON.stringify(v) : String(v));
  function fnv(text) { // a short stable id of a prompt text, for the URL
    let h = 0x811c9dc5;
    for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
    return h.toString(16).padStart(8, "0");
  }
  // chat-template text with its special tokens (<|im_start|>, <tool_call>, ...) marked
  function templated(text) {
    const pre = el("pre", { class: "text" });
    const parts = String(text ?? "").split(/(<\|[^|<>\s]{1,40}\|>|<\/?[a-z_]{1,30}>)/);
    parts.forEach((p, i) => pre.append(i % 2 ? el("span", { class: "special" }, p) : p));
    return pre;
  }
  function showError(message) { $("error").hidden = !message; $("error").textContent = message || ""; }
  const toolErrors = (s) => (s.turns || []).filter((t) => t.role === "tool" && (t.error || t.timed_out)).length;
  const sampleId = (s, i) => (Number.isInteger(s.sample) ? s.sample : i);
  // the end of a prompt as plain text: special tokens and the assistant header dropped (the question is last)
  const promptSnippet = (text, n = 90) => String(text ?? "").replace(/<\|[^|]*\|>/g, " ").replace(/\s+/g, " ")
    .trim().replace(/\s*assistant$/, "").slice(-n);
  let groupMeans = new Map(); // uid -> the mean score of its samples in the step shown (a GRPO group)

  // ------------------------------------------------------------------ curves
  async function renderCurves(runs) {
    const tables = await Promise.all(runs.map((_, i) => api(`metrics/${i}`)));
    const names = new Set();
    for (const rows of tables) for (const row of rows) for (const [k, v] of Object.entries(row))
      if (typeof v === "number" && k !== "step") names.add(k);
    const all = [...names].sort();
    const chosen = state.metrics ? state.metrics.split(",").filter((m) => names.has(m)) :
      DEFAULT_METRICS.map((group) => group.find((m) => names.has(m))).filter(Boolean);
    const list = $("metric-list");
    list.replaceChildren(...all.map((m) => el("label", { "data-name": m },
      el("input", { type: "checkbox", value: m, checked: chosen.includes(m), onchange: (e) => {
        const next = e.target.checked ? [...chosen, m] : chosen.filter((x) => x !== m);
        go({ metrics: next.join(",") || "none" });
      } }), " ", m)));
    filterMetricList();
    $("metric-picker").querySelector("summary").textContent = `Metrics (${chosen.length} of ${all.length})`;
    const charts = $("charts");
    charts.replaceChildren();
    if (!chosen.length) charts.append(el("p", { class: "empty" }, all.length ? "No metric chosen: tick some under Metrics." : "No metrics.jsonl lines yet."));
    for (const metric of chosen) {
      const div = el("div", { class: "chart", "data-metric": metric });
      charts.append(div);
      const traces = runs.map((run, i) => {
        const rows = tables[i].filter((r) => typeof r[metric] === "number");
        const mode = rows.length > MARKERS_UP_TO ? "lines" : "lines+markers";
        return { x: rows.map((r) => r.step), y: rows.map((r) => r[metric]), name: run.name, type: "scatter", mode, marker: { size: 5 } };
      });
      const note = METRIC_NOTES[metric];
      Plotly.newPlot(div, traces, {
        // left-aligned, so the toolbar (top right) never covers it
        title: { text: note ? `${metric}<br><sub>${note}</sub>` : metric, font: { size: 14 }, x: 0.01, xanchor: "left" },
        margin: { l: 56, r: 16, t: note ? 56 : 40, b: 40 },
        xaxis: { title: { text: "step" } }, yaxis: { hoverformat: ".4~g" }, // 0.0005517, not 551.7μ
        showlegend: runs.length > 1, legend: { orientation: "h" },
      }, { displaylogo: false, responsive: true });
    }
  }
  function filterMetricList() {
    const q = $("metric-search").value.toLowerCase();
    for (const label of $("metric-list").children) label.hidden = !label.dataset.name.toLowerCase().includes(q);
  }

  // ------------------------------------------------------------------ samples
  function whereControls(container, runs, kinds) {
    const run = runs[+state.run] || runs[0];
    const kind = kinds.includes(state.kind) ? state.kind : kinds.find((k) => run.steps[k].length) || kinds[0];
    const steps = run.steps[kind] || [];
    const step = steps.includes(+state.step) && state.step !== "" ? +state.step : steps[steps.length - 1];
    const at = steps.indexOf(step);
    container.replaceChildren(...[
      runs.length > 1 ? el("label", {}, "run ", el("select", { id: "w-run", onchange: (e) => go({ run: e.target.value, step: "", sample: "" }) },
        runs.map((r, i) => el("option", { value: i, selected: r === run }, r.name)))) : null,
      kinds.length > 1 ? el("label", {}, "samples of ", el("select", { id: "w-kind", onchange: (e) => go({ kind: e.target.value, step: "", sample: "" }) },
        kinds.map((k) => el("option", { value: k, selected: k === kind }, `${KIND_LABEL[k]} (${run.steps[k].length} steps)`)))) : null,
      el("label", {}, "step ", el("select", { id: "w-step", onchange: (e) => go({ step: e.target.value, sample: "" }) },
        steps.map((s) => el("option", { value: s, selected: s === step }, s)))),
      el("button", { type: "button", disabled: at <= 0, onclick: () => go({ step: steps[at - 1], sample: "" }) }, "◀ earlier"),
      el("button", { type: "button", disabled: at < 0 || at >= steps.length - 1, onclick: () => go({ step: steps[at + 1], sample: "" }) }, "later ▶"),
    ].filter(Boolean));
    return { run, runIndex: runs.indexOf(run), kind, step };
  }

  const COLUMNS = [
    ["sample", "#", (s, i) => sampleId(s, i)],
    ["score", "score", (s) => s.score],
    ["terms", "reward terms", (s) => (s.reward_keys || []).map((k) => `${k}=${fmt(s[k], 3)}`).join(" ")],
    ["response_length", "length", (s) => s.response_length],
    ["group", "group", (s) => s.uid ?? ""],
    ["group_mean", "group mean", (s) => groupMeans.get(s.uid)],
    ["data_source", "data source", (s) => s.data_source],
    ["finish_reason", "finish", (s) => s.finish_reason],
    ["truncated", "truncated", (s) => (s.truncated ? "yes" : "")],
    ["tool_errors", "tool errors", (s) => (s.turns ? toolErrors(s) : "")],
    ["advantage", "advantage", (s) => s.advantage],
    ["rollout_mismatch", "mismatch", (s) => s.rollout_mismatch],
    ["prompt", "prompt", (s) => promptSnippet(s.input, 60)],
    ["output", "response", (s) => String(s.output ?? "").replace(/\s+/g, " ").slice(0, 160)],
  ];
  const NUMERIC = new Set(["sample", "score", "group_mean", "response_length", "tool_errors", "advantage", "rollout_mismatch"]);

  function passes(s) {
    const num = (v) => (v === "" ? null : Number(v));
    const [smin, smax, lmin, lmax] = [state.smin, state.smax, state.lmin, state.lmax].map(num);
    if (smin !== null && !(s.score >= smin)) return false;
    if (smax !== null && !(s.score <= smax)) return false;
    if (lmin !== null && !(s.response_length >= lmin)) return false;
    if (lmax !== null && !(s.response_length <= lmax)) return false;
    if (state.source && s.data_source !== state.source) return false;
    if (state.truncated && !!s.truncated !== (state.truncated === "yes")) return false;
    if (state.errors && (toolErrors(s) > 0) !== (state.errors === "yes")) return false;
    if (state.q) {
      const text = [s.input, s.output, ...(s.turns || []).map((t) => `${t.text ?? ""} ${JSON.stringify(t.tool_calls || [])} ${t.error ?? ""}`)].join("\n");
      if (!text.toLowerCase().includes(state.q.toLowerCase())) return false;
    }
    return true;
  }

  let shown = { samples: [], where: null };
  async function renderSamples(runs) {
    const kinds = Object.keys(KIND_LABEL);
    const where = whereControls($("sample-where"), runs, kinds);
    const samples = where.step === undefined ? [] : await api(`samples/${where.runIndex}/${where.kind}/${where.step}`);
    shown = { samples, where };
    const sources = [...new Set(samples.map((s) => s.data_source).filter((v) => v !== undefined))].sort();
    $("f-source").replaceChildren(el("option", { value: "" }, "any"), ...sources.map((v) => el("option", { value: v, selected: v === state.source }, v)));
    for (const key of ["q", "smin", "smax", "lmin", "lmax", "truncated", "errors"]) $(`f-${key}`).value = state[key];
    $("table-wrap").hidden = where.step === undefined;
    if (where.step === undefined) {
      $("sample-table").querySelector("tbody").replaceChildren();
      $("sample-count").textContent = "";
      const hint = where.run.sft ? `${where.run.name} is an SFT run (tandem sft): it trains on the dataset's responses and ` +
        "generates none, so it has no samples to show (trainer.rollout_data_dir has no effect on it). Its loss is on the Curves tab." :
        `No sample dumps in ${where.run.path}. A run writes them with ` +
        "trainer.rollout_data_dir=DIR (each training step) and trainer.validation_data_dir=DIR (each validation).";
      $("detail").replaceChildren(el("p", { class: "empty" }, hint));
      return;
    }
    renderTable();
  }

  function renderTable() {
    const { samples, where } = shown;
    const groups = new Map();
    for (const x of samples) if (x.uid !== undefined && x.uid !== null && typeof x.score === "number")
      groups.set(x.uid, [...(groups.get(x.uid) || []), x.score]);
    groupMeans = new Map([...groups].map(([uid, scores]) => [uid, scores.reduce((a, b) => a + b, 0) / scores.length]));
    const key = COLUMNS.find((c) => c[0] === state.sort) || COLUMNS[0];
    const rows = samples.map((s, i) => ({ s, i, id: sampleId(s, i) })).filter((r) => passes(r.s));
    const value = (r) => key[2](r.s, r.i);
    const sign = state.desc ? -1 : 1;
    rows.sort((a, b) => {
      const [x, y] = [value(a), value(b)];
      if (x === y) return a.i - b.i;
      if (x === null || x === undefined || x === "") return 1;
      if (y === null || y === undefined || y === "") return -1;
      return (NUMERIC.has(key[0]) ? x - y : String(x).localeCompare(String(y))) * sign;
    });
    // a column no sample of the step fills (tool errors of a single-turn run, advantage in validation) is left out
    const columns = COLUMNS.filter(([k, , get]) => k === "sample" || samples.some((s, i) => !["", null, undefined].includes(get(s, i))));
    $("sample-table").querySelector("thead").replaceChildren(el("tr", {}, columns.map(([k, label]) =>
      el("th", { "data-col": k, class: k === key[0] ? (state.desc ? "sorted desc" : "sorted") : "", onclick: () => {
        quietly({ sort: k, desc: k === key[0] && !state.desc ? "1" : "" });
        renderTable();
      } }, label))));
    $("sample-table").querySelector("tbody").replaceChildren(...rows.map((r) => el("tr", {
      "data-sample": r.id, class: String(r.id) === state.sample ? "open" : "", onclick: () => go({ sample: String(r.id) }),
    }, columns.map(([k, , get]) => {
      const v = get(r.s, r.i);
      const cls = k === "output" || k === "terms" || k === "prompt" ? "snippet" : NUMERIC.has(k) ? "num" : "";
      const mark = k === "score" && typeof v === "number" ? (v > 0 ? " score-hi" : " score-lo") : k === "truncated" && v ? " yes" : k === "tool_errors" && v > 0 ? " yes" : "";
      return el("td", { "data-col": k, "data-value": typeof v === "number" ? v : null, class: cls + mark, title: k === "output" ? String(r.s.output ?? "").slice(0, 2000) : k === "prompt" ? promptSnippet(r.s.input, 2000) : null }, fmt(v));
    }))));
    $("sample-count").textContent = `${rows.length} of ${samples.length} samples · step ${where.step} (${KIND_LABEL[where.kind]})`;
    const open = samples.find((s, i) => String(sampleId(s, i)) === state.sample);
    $("detail").replaceChildren(open ? sampleCard(open, where) : el("p", { class: "empty" }, "Click a row to open its sample."));
  }

  function fieldsOf(s, skip = new Set()) {
    const keys = ["score", ...(s.reward_keys || []), "reward_error", "gts", "data_source", "uid", "finish_reason", "truncated",
      "prompt_length", "response_length", "num_turns", "advantage", "rollout_mismatch"];
    return el("div", { class: "fields" }, keys.filter((k) => !skip.has(k) && s[k] !== undefined && s[k] !== null).map((k) =>
      el("div", { "data-field": k }, el("span", {}, (s.reward_keys || []).includes(k) ? `term ${k}: ` : `${k}: `), fmt(s[k], 5))));
  }

  function turnsView(turns) {
    return el("div", { class: "turns" }, turns.map((t, n) => {
      const failed = t.role === "tool" && (t.error || t.timed_out);
      return el("div", { class: `turn ${t.role}${failed ? " failed" : ""}`, "data-turn": n },
        el("div", { class: "turn-role" }, t.role === "tool" ? "tool observation" : t.role,
          t.timed_out ? el("span", { class: "badge" }, "timed out") : null,
          t.error && !t.timed_out ? el("span", { class: "badge" }, "error") : null),
        t.text ? templated(t.text) : null,
        (t.tool_calls || []).map((c) => el("div", { class: "tool-call" }, `${c.name}(${c.arguments ?? ""})`)),
        t.error ? el("div", { class: "tool-error" }, t.error) : null);
    }));
  }

  // Token shading, one scale for every sample of every run: |rollout − trainer log-prob| in nats, on a log
  // scale from SHADE_FROM (no shade) to SHADE_TO (darkest), so a 0.0009-nat difference stays pale everywhere.
  const SHADE_FROM = 1e-3, SHADE_TO = 1;
  function shade(d) {
    const a = Math.abs(d);
    if (!(a > SHADE_FROM)) return 0;
    return Math.min(1, Math.log10(a / SHADE_FROM) / Math.log10(SHADE_TO / SHADE_FROM)) * 0.85;
  }
  function shaded(d, text, attrs = {}) {
    return el("span", { ...attrs, "data-shade": shade(d).toFixed(3),
      style: `background: rgba(${d >= 0 ? "229,57,53" : "30,136,229"}, ${shade(d).toFixed(3)})` }, text);
  }
  function tokenView(tokens, diffs) {
    const strip = el("div", { class: "tokens" }, tokens.map((tok, i) => {
      const d = diffs[i] ?? 0;
      return shaded(d, tok, { title: `${JSON.stringify(tok)}  rollout − trainer log-prob: ${d} nats`, "data-mismatch": d });
    }));
    const largest = Math.max(0, ...diffs.map((d) => Math.abs(d)));
    const legend = el("p", { class: "legend" }, "Shading: rollout − trainer log-prob of each token, in nats (red: the " +
      "rollout gave it more, blue: less), the same scale for every sample: ",
      ...[0.001, 0.01, 0.1, 1].map((v) => shaded(v, ` ${v} `, { class: "swatch" })),
      ` · this sample's largest: ${fmt(largest, 3)}. Hover a token for its value.`);
    return [legend, strip];
  }

  function sampleCard(s, where) {
    const card = el("div", { class: "card", id: "sample-card" },
      el("h2", {}, `Step ${where.step} · ${KIND_LABEL[where.kind]} sample #${s.sample ?? ""} · score ${fmt(s.score)}`,
        where.kind === "validation" ? el("a", { class: "link", style: "margin-left:12px;font-weight:normal",
          onclick: () => go({ tab: "prompt", prompt: fnv(String(s.input ?? "")) }) }, "this prompt across steps") : null),
      fieldsOf(s), el("h3", {}, "Prompt"), templated(s.input));
    if (s.turns && s.turns.length) card.append(el("h3", {}, `Turns (${s.turns.length})`), turnsView(s.turns));
    card.append(el("h3", {}, s.turns ? "Response, as one text" : "Response"));
    if (Array.isArray(s.tokens) && Array.isArray(s.token_mismatch)) card.append(...tokenView(s.tokens, s.token_mismatch));
    else card.append(templated(s.output));
    return card;
  }

  // ------------------------------------------------------------------ one prompt across steps
  async function renderPrompt(runs) {
    const where = whereControls($("prompt-where"), runs, ["validation"]);
    $("prompt-where").querySelectorAll("#w-step, button").forEach((n) => n.parentElement.tagName === "LABEL" ? n.parentElement.remove() : n.remove());
    const steps = where.run.steps.validation;
    const view = $("prompt-view");
    if (!steps.length) {
      view.replaceChildren(el("p", { class: "empty" }, "No validation dumps in this run (trainer.validation_data_dir)."));
      return;
    }
    const files = await Promise.all(steps.map((step) => api(`samples/${where.runIndex}/validation/${step}`)));
    const prompts = new Map();
    files.forEach((samples, n) => samples.forEach((s) => {
      const id = fnv(String(s.input ?? ""));
      if (!prompts.has(id)) prompts.set(id, { input: s.input, byStep: new Map() });
      const byStep = prompts.get(id).byStep;
      if (!byStep.has(steps[n])) byStep.set(steps[n], []);
      byStep.get(steps[n]).push(s);
    }));
    const ids = [...prompts.keys()];
    const id = prompts.has(state.prompt) ? state.prompt : ids[0];
    const label = (p, n) => `${n + 1}. ${promptSnippet(p.input)}`;
    $("prompt-where").append(el("label", {}, "prompt ", el("select", { id: "w-prompt", onchange: (e) => go({ prompt: e.target.value }) },
      ids.map((k, n) => el("option", { value: k, selected: k === id }, label(prompts.get(k), n))))));
    const p = prompts.get(id);
    const shownSteps = steps.filter((s) => p.byStep.has(s));
    // fields equal in every step's sample (the answer, data source, prompt length) are shown once, above
    const all = shownSteps.flatMap((step) => p.byStep.get(step));
    const fixed = new Set(["gts", "data_source", "uid", "prompt_length"].filter((k) =>
      all.every((s) => JSON.stringify(s[k]) === JSON.stringify(all[0][k]))));
    const fixedFields = fieldsOf(all[0], new Set(Object.keys(all[0]).filter((k) => !fixed.has(k))));
    view.replaceChildren(
      el("div", { class: "card" }, el("h3", {}, "Prompt"), templated(p.input),
        fixed.size ? el("div", { class: "same" }, "the same at every step: ", fixedFields) : null),
      el("p", { class: "legend", id: "across-steps" }, `${shownSteps.length} validation steps with this prompt: ` +
        `${shownSteps.join(", ")} (the last, ${shownSteps[shownSteps.length - 1]}, is the model as trained)`),
      el("div", { class: "across" }, shownSteps.map((step) => el("div", { class: "card", "data-step": step },
        p.byStep.get(step).map((s) => [
          el("h2", {}, `step ${step} · score ${fmt(s.score)}`), fieldsOf(s, new Set([...fixed, "score"])),
          s.turns && s.turns.length ? turnsView(s.turns) : templated(s.output)]))))
    );
  }

  // ------------------------------------------------------------------ the page
  async function render() {
    state = readState();
    for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === state.tab);
    for (const id of ["curves", "samples", "prompt"]) $(id).hidden = id !== state.tab;
    try {
      const runs = await api("runs");
      $("run-names").textContent = runs.map((r) => r.name).join(" · ") + (STATIC ? " (saved page)" : "");
      if (state.tab === "curves") await renderCurves(runs);
      else if (state.tab === "samples") await renderSamples(runs);
      else await renderPrompt(runs);
      showError("");
      document.body.dataset.ready = state.tab;
    } catch (error) {
      showError(`Could not show this view: ${error.message}`);
      document.body.dataset.ready = "error";
    }
  }

  function filterInput(key) {
    return (e) => { quietly({ [key]: e.target.value, sample: "" }); renderTable(); };
  }
  for (const key of ["q", "smin", "smax", "lmin", "lmax", "source", "truncated", "errors"])
    $(`f-${key}`).addEventListener(key === "q" || key.endsWith("min") || key.endsWith("max") ? "input" : "change", filterInput(key));
  $("f-clear").addEventListener("click", () => go({ q: "", smin: "", smax: "", lmin: "", lmax: "", source: "", truncated: "", errors: "" }));
  $("metric-search").addEventListener("input", filterMetricList);
  $("metric-defaults").addEventListener("click", () => go({ metrics: "" }));
  $("reload").addEventListener("click", () => { cache = new Map(); render(); });
  if (STATIC) $("reload").hidden = true;
  for (const a of document.querySelectorAll("#tabs a")) a.addEventListener("click", (e) => { e.preventDefault(); go({ tab: a.dataset.tab }); });
  window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; render(); });
  render();
})();

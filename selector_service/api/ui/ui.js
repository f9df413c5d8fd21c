// The dashboard: /ui lists the datasets, /ui/{dataset} plots one dataset's history. Every figure comes
// from the REST API (through Auth.request); the page polls it every few seconds while the tab is visible.
"use strict";

(() => {
  const body = document.body;
  const DATASET = body.dataset.dataset || "";
  const params = new URLSearchParams(location.search);
  // Seconds between refreshes, 1 to 3600 (a timer above 2^31 - 1 ms would fire at once).
  const REFRESH_S = Math.min(3600, Math.max(1, Number(params.get("refresh")) || 5));
  const SAMPLE = 2000; // prompts whose posterior means the histogram shows (evenly spaced ids)
  const BELIEF_CHUNK = 500; // ids per /beliefs request
  const BELIEFS_EVERY = 3; // refreshes between two reads of the sample
  const PLOT_STEPS = 20000; // the newest steps plotted
  const PAGE = 10000; // rows per /history request
  const RECENT = 10; // rows of the table of recent steps
  const main = document.getElementById("main");
  const status = document.getElementById("status");
  const pause = document.getElementById("pause");
  const forget = document.getElementById("forget");
  const STATES = ["unsolved", "partially solved", "solved"];
  const COLORS = ["#d62728", "#ff7f0e", "#2ca02c"];
  const PLOT_CONFIG = { displaylogo: false, responsive: true };

  let paused = false;
  let timer = null;

  // ---- small helpers ---------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("data-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child == null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const fmt = {
    count: (v) => (v == null ? "–" : Number(v).toLocaleString("en-US")),
    share: (v) => (v == null ? "–" : `${(100 * v).toFixed(1)}%`),
    reward: (v) => (v == null ? "–" : v.toFixed(3)),
    dict: (d) =>
      d && Object.keys(d).length
        ? Object.entries(d)
            .map(([k, v]) => `${k}: ${v}`)
            .join(", ")
        : "–",
  };

  // A table cell that shows `text` and carries the exact value it came from (tests read it).
  function cell(field, value, text) {
    const raw = value == null ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
    return el("td", { "data-field": field, "data-value": raw }, text);
  }

  function setStatus(text, error) {
    status.textContent = text;
    status.classList.toggle("error", Boolean(error));
  }

  function showLocked() {
    main.replaceChildren();
    setStatus("");
  }

  async function api(path) {
    return Auth.request(path);
  }

  const datasetPath = (name) => `/datasets/${encodeURIComponent(name)}`;

  // ---- the list of datasets ----------------------------------------------------------------------
  async function loadIndex() {
    const list = await api("/datasets");
    const names = list.datasets.slice().sort();
    const infos = await Promise.all(
      names.slice(0, 200).map((name) => api(datasetPath(name)).catch(() => null)),
    );
    const rows = infos.filter(Boolean).map((info) => {
      const s = info.summary || {};
      return el(
        "tr",
        { "data-dataset": info.name },
        el("td", {}, el("a", { href: `${Auth.root}/ui/${encodeURIComponent(info.name)}` }, info.name)),
        cell("size", info.size, fmt.count(info.size)),
        cell("rollouts_per_prompt", info.rollouts_per_prompt, info.rollouts_per_prompt),
        cell("open_step", s.open_step, fmt.count(s.open_step)),
        cell("observations", s.observations, fmt.count(s.observations)),
        cell("prompts_observed", s.prompts_observed, `${fmt.count(s.prompts_observed)} (${fmt.share(s.prompts_observed / info.size)})`),
        cell("last_step_partial_share", s.last_step_partial_share, fmt.share(s.last_step_partial_share)),
        cell("last_step_dps_accuracy", s.last_step_dps_accuracy, fmt.share(s.last_step_dps_accuracy)),
      );
    });
    const head = ["dataset", "prompts", "K", "open step", "results", "prompts observed", "last step partially solved", "DPS accuracy"];
    const table = el(
      "table",
      { class: "table", id: "datasets" },
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows),
    );
    const empty = names.length
      ? null
      : el("p", { class: "empty" }, "No dataset yet: create one with POST /datasets (a trainer does).");
    const more = names.length > 200 ? el("p", { class: "hint" }, `The first 200 of ${names.length} datasets.`) : null;
    main.replaceChildren(el("h1", {}, "Datasets"), empty || table, more);
  }

  // ---- one dataset -------------------------------------------------------------------------------
  const view = { info: null, rows: [], next: null, beliefs: null, ticks: 0, built: false };

  function buildDataset() {
    const plot = (id, title) => el("section", { class: "panel" }, el("h2", {}, title), el("div", { class: "plot", id }));
    main.replaceChildren(
      el("h1", {}, DATASET),
      el("section", { class: "cards", id: "cards" }),
      el(
        "div",
        { class: "grid" },
        plot("plot-signal", "Learning signal per step"),
        plot("plot-dps", "DPS: predicted vs observed shares"),
        plot("plot-beliefs", "Posterior means"),
        plot("plot-coverage", "Prompts observed"),
        plot("plot-groups", "Per-group mean reward"),
        plot("plot-late", "Late results by lag"),
        plot("plot-rollouts", "Rollouts spent, profiling included"),
      ),
      el("section", { class: "panel wide" }, el("h2", {}, "Recent steps"), el("div", { id: "recent" })),
      el("section", { class: "panel wide" }, el("h2", {}, "Spec"), el("div", { id: "spec" })),
    );
    view.built = true;
  }

  async function loadHistory(openStep) {
    if (view.next == null) view.next = Math.max(0, openStep - PLOT_STEPS);
    for (;;) {
      const page = await api(`${datasetPath(DATASET)}/history?since=${view.next}&limit=${PAGE}`);
      view.rows.push(...page.rows);
      view.next = page.next;
      if (page.rows.length < PAGE) break;
    }
    if (view.rows.length > PLOT_STEPS) view.rows.splice(0, view.rows.length - PLOT_STEPS);
  }

  async function loadBeliefs(size) {
    const k = Math.min(size, SAMPLE);
    const ids = Array.from({ length: k }, (_, i) => Math.floor((i * size) / k));
    const parts = [];
    for (let i = 0; i < ids.length; i += BELIEF_CHUNK) {
      parts.push(api(`${datasetPath(DATASET)}/beliefs?ids=${ids.slice(i, i + BELIEF_CHUNK).join(",")}`));
    }
    const answers = await Promise.all(parts);
    return { k, beliefs: answers.flatMap((a) => a.beliefs) };
  }

  async function loadDataset() {
    let info;
    try {
      info = await api(datasetPath(DATASET));
    } catch (err) {
      if (err.status === 404) {
        main.replaceChildren(
          el("h1", {}, DATASET),
          el("p", { class: "empty" }, `There is no dataset ${DATASET} (yet): the page shows it once a trainer creates it.`),
        );
        view.built = false;
        view.rows = [];
        view.next = null;
        return;
      }
      throw err;
    }
    if (view.info && info.summary.open_step < view.info.summary.open_step) {
      view.rows = []; // deleted and created again
      view.next = null;
    }
    view.info = info;
    await loadHistory(info.summary.open_step);
    if (view.ticks % BELIEFS_EVERY === 0 || !view.beliefs) view.beliefs = await loadBeliefs(info.size);
    view.ticks += 1;
    if (!view.built) buildDataset();
    renderDataset();
  }

  function card(field, label, value, text) {
    return el("div", { class: "card", "data-field": field, "data-value": value == null ? "" : String(value) }, el("div", { class: "label" }, label), el("div", { class: "value" }, text));
  }

  function renderDataset() {
    const { info, rows } = view;
    const s = info.summary;
    document.getElementById("cards").replaceChildren(
      card("open_step", "open step", s.open_step, fmt.count(s.open_step)),
      card("steps_closed", "steps closed", s.steps_closed, fmt.count(s.steps_closed)),
      card("observations", "results", s.observations, fmt.count(s.observations)),
      card("rollouts", "rollouts", s.rollouts, fmt.count(s.rollouts)),
      card("profile_rollouts", "profiling rollouts", s.profile_rollouts, fmt.count(s.profile_rollouts)),
      card("total_rollouts", "total rollouts (profiling included)", s.total_rollouts, fmt.count(s.total_rollouts)),
      card("prompts_observed", "prompts observed", s.prompts_observed, `${fmt.count(s.prompts_observed)} of ${fmt.count(info.size)} (${fmt.share(s.prompts_observed / info.size)})`),
      card("last_step_partial_share", "last step: prompts partially solved", s.last_step_partial_share, fmt.share(s.last_step_partial_share)),
      card("last_step_dps_accuracy", "last step DPS accuracy", s.last_step_dps_accuracy, fmt.share(s.last_step_dps_accuracy)),
    );
    renderRecent(rows.slice(-RECENT).reverse());
    renderSpec(info);
    const steps = rows.map((r) => r.step);
    const axis = (title, extra) => ({ title: { text: title }, automargin: true, ...extra });
    const layout = (extra) => ({
      margin: { l: 50, r: 20, t: 10, b: 40 },
      legend: { orientation: "h", y: -0.25 },
      xaxis: axis("step"),
      hovermode: "x unified",
      ...extra,
    });
    const empty = rows.length === 0;
    const note = (text) => ({ annotations: [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] });

    Plotly.react(
      "plot-signal",
      [
        { x: steps, y: rows.map((r) => r.mixed), name: "mixed share (some rollouts solved)", mode: "lines+markers", line: { color: "#1f77b4" } },
        { x: steps, y: rows.map((r) => r.mean_reward), name: "mean reward", mode: "lines+markers", line: { color: "#9467bd" } },
      ],
      layout({ yaxis: axis("share / reward", { range: [0, 1] }), ...(empty ? note("no closed step yet") : {}) }),
      PLOT_CONFIG,
    );

    const observed = [(r) => r.none_solved, (r) => r.mixed, (r) => r.all_solved];
    const dps = [];
    STATES.forEach((state, j) => {
      dps.push({ x: steps, y: rows.map((r) => (r.dps_predicted ? r.dps_predicted[j] : null)), name: `${state}: predicted`, mode: "lines", line: { color: COLORS[j], dash: "dash" } });
      dps.push({ x: steps, y: rows.map(observed[j]), name: `${state}: observed`, mode: "lines+markers", line: { color: COLORS[j] } });
    });
    dps.push({ x: steps, y: rows.map((r) => r.dps_accuracy), name: "DPS accuracy", mode: "lines", line: { color: "#7f7f7f", dash: "dot" } });
    Plotly.react("plot-dps", dps, layout({ yaxis: axis("share", { range: [0, 1] }), ...(empty ? note("no closed step yet") : {}) }), PLOT_CONFIG);

    const sample = view.beliefs.beliefs;
    const seen = sample.filter((b) => b.observations > 0).map((b) => b.mean);
    const cold = sample.filter((b) => b.observations === 0).map((b) => b.mean);
    const bins = { start: 0, end: 1.0000001, size: 0.05 };
    Plotly.react(
      "plot-beliefs",
      [
        { type: "histogram", x: seen, xbins: bins, name: "observed prompts", marker: { color: "#1f77b4" } },
        { type: "histogram", x: cold, xbins: bins, name: "never observed (prior)", marker: { color: "#c7c7c7" } },
      ],
      layout({
        barmode: "stack",
        hovermode: "closest",
        xaxis: axis(`posterior mean of ${fmt.count(view.beliefs.k)} evenly spaced prompts`, { range: [0, 1] }),
        yaxis: axis("prompts"),
      }),
      PLOT_CONFIG,
    );

    Plotly.react(
      "plot-coverage",
      [
        { x: steps, y: rows.map((r) => r.prompts_observed / info.size), name: "share of the dataset ever observed", mode: "lines", fill: "tozeroy", line: { color: "#17becf" } },
        { x: steps, y: rows.map((r) => r.observed / info.size), name: "share observed at the step", mode: "lines", line: { color: "#bcbd22" } },
      ],
      layout({ yaxis: axis("share of prompts", { rangemode: "tozero" }), ...(empty ? note("no closed step yet") : {}) }),
      PLOT_CONFIG,
    );

    const totals = new Map();
    for (const r of rows) {
      for (const [g, f] of Object.entries(r.groups || {})) totals.set(g, (totals.get(g) || 0) + f.results);
    }
    const top = [...totals.entries()].sort((a, b) => b[1] - a[1] || Number(a[0]) - Number(b[0])).slice(0, 8).map(([g]) => g);
    Plotly.react(
      "plot-groups",
      top.map((g) => ({ x: steps, y: rows.map((r) => (r.groups && r.groups[g] ? r.groups[g].mean_reward : null)), name: `group ${g}`, mode: "lines+markers", connectgaps: false })),
      layout({ yaxis: axis("mean reward", { range: [0, 1] }), ...(top.length ? {} : note(info.summary.groups ? "no grouped result yet" : "no groups: upload them with PUT /datasets/{name}/metadata")) }),
      PLOT_CONFIG,
    );

    const labels = [];
    for (const r of rows) for (const lag of Object.keys(r.late || {})) if (!labels.includes(lag)) labels.push(lag);
    labels.sort((a, b) => parseInt(a, 10) - parseInt(b, 10));
    Plotly.react(
      "plot-late",
      labels.map((lag) => ({ type: "bar", x: steps, y: rows.map((r) => (r.late && r.late[lag]) || 0), name: `${lag} step${lag === "1" ? "" : "s"} late` })),
      layout({ barmode: "stack", yaxis: axis("results"), ...(labels.length ? {} : note(info.max_lag ? "no late result yet" : "max_lag is 0: late results are refused")) }),
      PLOT_CONFIG,
    );

    Plotly.react(
      "plot-rollouts",
      [
        { x: steps, y: rows.map((r) => r.total_rollouts), name: "every rollout by the step's close", mode: "lines", fill: "tozeroy", line: { color: "#2ca02c" } },
        { x: steps, y: rows.map((r) => r.profile_rollouts), name: "of which profiling", mode: "lines", fill: "tozeroy", line: { color: "#ff7f0e" } },
      ],
      layout({ yaxis: axis("rollouts", { rangemode: "tozero" }), ...(empty ? note("no closed step yet") : {}) }),
      PLOT_CONFIG,
    );
  }

  function renderRecent(rows) {
    const head = ["step", "selected", "observed", "rollouts", "total rollouts", "mean reward", "all solved", "mixed", "none solved", "DPS accuracy", "late", "strategies"];
    const table = el(
      "table",
      { class: "table", id: "recent-steps" },
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
      el(
        "tbody",
        {},
        ...rows.map((r) =>
          el(
            "tr",
            { "data-step": r.step },
            cell("step", r.step, r.step),
            cell("selected", r.selected, fmt.count(r.selected)),
            cell("observed", r.observed, fmt.count(r.observed)),
            cell("rollouts", r.rollouts, fmt.count(r.rollouts)),
            cell("total_rollouts", r.total_rollouts, fmt.count(r.total_rollouts)),
            cell("mean_reward", r.mean_reward, fmt.reward(r.mean_reward)),
            cell("all_solved", r.all_solved, fmt.share(r.all_solved)),
            cell("mixed", r.mixed, fmt.share(r.mixed)),
            cell("none_solved", r.none_solved, fmt.share(r.none_solved)),
            cell("dps_accuracy", r.dps_accuracy, fmt.share(r.dps_accuracy)),
            cell("late", r.late, fmt.dict(r.late)),
            cell("strategies", r.strategies, fmt.dict(r.strategies)),
          ),
        ),
      ),
    );
    document.getElementById("recent").replaceChildren(rows.length ? table : el("p", { class: "empty" }, "No closed step yet."));
  }

  function renderSpec(info) {
    const skip = new Set(["summary", "created"]);
    const rows = Object.entries(info)
      .filter(([k]) => !skip.has(k))
      .map(([k, v]) => el("tr", {}, el("th", {}, k), cell(k, v, typeof v === "object" ? JSON.stringify(v) : String(v))));
    document.getElementById("spec").replaceChildren(el("table", { class: "table spec" }, el("tbody", {}, ...rows)));
  }

  // ---- the refresh loop --------------------------------------------------------------------------
  function crumbs() {
    const nav = document.getElementById("crumbs");
    if (DATASET) nav.replaceChildren(el("a", { href: `${Auth.root}/ui` }, "datasets"), " / ", el("span", {}, DATASET));
  }

  async function refresh() {
    timer = null;
    if (!document.hidden && !paused) {
      try {
        await Auth.withToken(DATASET ? loadDataset : loadIndex, showLocked);
        setStatus(`updated ${new Date().toLocaleTimeString()}, every ${REFRESH_S} s`);
        body.dataset.loaded = String((Number(body.dataset.loaded) || 0) + 1);
      } catch (err) {
        setStatus(`could not refresh: ${err.message}`, true);
      }
      forget.hidden = !Auth.token();
      pause.hidden = false;
    }
    timer = setTimeout(refresh, REFRESH_S * 1000);
  }

  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "resume" : "pause";
    setStatus(paused ? "paused" : status.textContent);
    if (!paused && timer == null) refresh();
  });
  forget.addEventListener("click", () => {
    Auth.forget();
    location.reload();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer != null) {
      clearTimeout(timer);
      refresh();
    }
  });
  crumbs();
  refresh();
})();

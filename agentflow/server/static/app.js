/* agentflow web page: ask a question, watch the pipeline run, see SQL and rows.
 *
 * Plain JavaScript, no build step, nothing from the internet. Talks to the same HTTP API
 * as any client: POST /v1/queries (wait=false), then the query's Server-Sent-Events stream
 * (read with fetch so an API key can travel in a header), which ends with the answer. */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);

  /* Build DOM: el("td", {class: "num", title: t}, text, child...). Text always goes in as
   * text nodes and attributes through setAttribute, so nothing a model, a database or a
   * user wrote can become markup. ``style`` takes an object of CSS properties. */
  function el(tag, attrs) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => {
      if (v === null || v === undefined || v === false) return;
      if (k === "class") node.className = v;
      else if (k === "style") Object.assign(node.style, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    });
    const kids = Array.prototype.slice.call(arguments, 2).flat(Infinity);
    kids.forEach((c) => {
      if (c === null || c === undefined || c === false || c === "") return;
      node.append(c instanceof Node ? c : String(c));
    });
    return node;
  }
  const PALETTE = ["#4f46e5", "#0891b2", "#d97706", "#db2777", "#059669", "#7c3aed",
    "#2563eb", "#65a30d"];
  const state = {
    key: localStorage.getItem("agentflow.apiKey") || "",
    databases: [], instances: [], colors: {},
    live: null,          // the query being shown: {id, t0, slo, stages: Map, final}
    stream: null,        // AbortController of the open event stream
    followUp: null,      // {conversation_id, question} when the next question follows up
  };

  // ------------------------------------------------------------------ HTTP
  class ApiError extends Error {
    constructor(status, code, message, retryAfter) {
      super(message); this.status = status; this.code = code; this.retryAfter = retryAfter;
    }
  }

  async function api(path, opts) {
    opts = opts || {};
    const headers = Object.assign({}, opts.headers || {});
    if (state.key) headers["Authorization"] = "Bearer " + state.key;
    if (opts.body) headers["Content-Type"] = "application/json";
    const res = await fetch(path, Object.assign({}, opts, { headers: headers }));
    if (res.status === 401) {
      $("key-button").hidden = false;
      askForKey();
    }
    return res;
  }

  async function readJson(res) {
    let body = null;
    try { body = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok && res.status !== 202) {
      const err = body && body.error ? body.error
        : { code: "http_" + res.status, message: res.statusText || "request failed" };
      throw new ApiError(res.status, err.code, err.message, res.headers.get("Retry-After"));
    }
    return body;
  }

  async function getJson(path) { return readJson(await api(path)); }
  // teach.js (save an answer as an example) uses the same key-aware HTTP helpers.
  window.agentflowApi = { api: api, readJson: readJson };

  /* Read a Server-Sent-Events stream with fetch; calls onEvent(type, data) per event and
   * resolves with the data of the "done" event. */
  async function streamEvents(queryId, onEvent, signal) {
    const res = await api("/v1/queries/" + encodeURIComponent(queryId) + "/events",
      { signal: signal, headers: { Accept: "text/event-stream" } });
    if (!res.ok) await readJson(res);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) return null;
      buffer += decoder.decode(chunk.value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let type = "message";
        const data = [];
        block.split("\n").forEach((line) => {
          if (line.startsWith("event:")) type = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        });
        if (!data.length) continue;
        const event = JSON.parse(data.join("\n"));
        onEvent(type, event);
        if (type === "done") return event;
      }
    }
  }

  // ------------------------------------------------------------------ API key
  function askForKey() {
    const dialog = $("key-dialog");
    if (dialog.open) return;
    $("key-input").value = state.key;
    dialog.showModal();
  }
  $("key-dialog").addEventListener("close", () => {
    if ($("key-dialog").returnValue === "ok") {
      state.key = $("key-input").value.trim();
      localStorage.setItem("agentflow.apiKey", state.key);
      boot();
    }
  });
  $("key-button").addEventListener("click", askForKey);

  // ------------------------------------------------------------------ formatting
  function fmtS(s) {
    if (s === null || s === undefined) return "–";
    if (s < 0.0005) return "0 ms";
    if (s < 0.01) return (s * 1000).toFixed(1) + " ms";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 10) return s.toFixed(2) + " s";
    if (s < 100) return s.toFixed(1) + " s";
    return s.toFixed(0) + " s";
  }
  function colorOf(instance) {
    if (!instance) return "#94a3b8";
    if (!(instance in state.colors)) {
      state.colors[instance] = PALETTE[Object.keys(state.colors).length % PALETTE.length];
    }
    return state.colors[instance];
  }

  // ------------------------------------------------------------------ cluster, catalog
  async function loadCatalog() {
    const [dbs, pipes] = await Promise.all([getJson("/v1/databases"), getJson("/v1/pipelines")]);
    state.databases = dbs.databases;
    const select = $("db");
    const previous = select.value || localStorage.getItem("agentflow.db");
    select.replaceChildren(...state.databases.map((d) =>
      el("option", { value: d.id }, d.id + " · " + d.tables.length + " tables")));
    // The demo database first (not whichever id sorts first once --data adds 100 more),
    // unless this browser picked another one before.
    const fallback = state.databases.some((d) => d.id === "bookshop") ? "bookshop" : null;
    if (previous && state.databases.some((d) => d.id === previous)) select.value = previous;
    else if (fallback) select.value = fallback;
    const pipeline = $("pipeline");
    pipeline.replaceChildren(...pipes.pipelines.map((p) => el("option",
      { value: p, selected: p === pipes.default }, p + (p === pipes.default ? " (default)" : ""))));
    if (pipes.default_slo_s && !$("slo").value) $("slo").value = pipes.default_slo_s;
    showDatabase();
  }

  function showDatabase() {
    const db = state.databases.find((d) => d.id === $("db").value);
    if (!db) return;
    localStorage.setItem("agentflow.db", db.id);
    $("tables").replaceChildren(...db.tables.map((t) => el("span", null, t)));
    // The placeholder and the examples follow the database: its own sample questions
    // (a benchmark's train split, never the evaluated one), else one about its first table.
    const sample = db.examples.length ? db.examples[0]
      : (db.tables.length ? "How many rows does " + db.tables[0] + " have?" : "");
    $("question").placeholder = sample ? "e.g. " + sample : "Ask about " + db.id;
    const box = $("examples");
    box.hidden = !db.examples.length;  // no "Try one of these" divider over nothing
    if (!db.examples.length) { box.replaceChildren(); return; }
    box.replaceChildren(el("div", { class: "label" }, "Try one of these"),
      ...db.examples.slice(0, 4).map((q) => el("button", {
        type: "button", class: "example",
        onclick: () => { $("question").value = q; $("question").focus(); },
      }, q)));
  }
  $("db").addEventListener("change", showDatabase);

  async function refreshInstances() {
    try {
      const data = await getJson("/v1/instances");
      state.instances = data.instances;
      data.instances.forEach((i) => colorOf(i.name));
      $("cluster").replaceChildren(...data.instances.map((i) => el("span", {
        class: "inst" + (i.up ? "" : " down"),
        title: (i.gpu || "CPU") + (i.model ? " · " + i.model : "") + " · " + i.max_inflight +
          " call(s) at once",
      }, el("span", { class: "dot", style: { background: i.up ? colorOf(i.name) : "#ef4444" } }),
      i.name, i.gpu ? [" ", el("span", { class: "load" }, i.gpu)] : null, " ",
      el("span", { class: "load" }, i.up ? i.running + " run · " + i.waiting + " wait" : "down"))));
      renderLegend();
    } catch (e) { /* shown elsewhere */ }
  }

  function renderLegend() {
    const swatch = (style, label, cls) => el("span", null, el("i", { class: cls, style: style }),
      label);
    $("legend").replaceChildren(
      ...state.instances.map((i) => swatch({ background: colorOf(i.name) }, i.name)),
      swatch({ position: "static", backgroundColor: "#64748b" }, "queued", "tl-bar queue"),
      swatch({ background: "#e5e7eb" }, "prompt / parse"),
      swatch({ background: "#9ca3af" }, "tool step"));
  }

  // ------------------------------------------------------------------ recent queries
  async function refreshRecent() {
    let data;
    try { data = await getJson("/v1/queries?limit=12"); } catch (e) { return; }
    const list = $("recent");
    if (!data.queries.length) {
      list.replaceChildren(el("li", { class: "muted" }, "none yet"));
      return;
    }
    list.replaceChildren(...data.queries.map((q) => {
      let bar = null;
      if (q.slo_s && q.latency_s !== null) {
        const pct = Math.min(100, 100 * q.latency_s / q.slo_s);
        bar = el("span", { class: "rbar", title: "latency / SLO" }, el("i", {
          class: q.met_slo ? "" : "miss", style: { width: Math.max(2, pct).toFixed(1) + "%" } }));
      }
      const timing = q.latency_s !== null
        ? fmtS(q.latency_s) + (q.slo_s ? " / SLO " + fmtS(q.slo_s) : "")
        : (q.slo_s ? "SLO " + fmtS(q.slo_s) : "");
      return el("li", { "data-id": q.query_id, onclick: () => openQuery(q.query_id) },
        el("div", { class: "rq" }, el("span", { class: "sdot " + q.status, title: q.status }),
          el("span", { class: "q" }, q.question)),
        el("div", { class: "rmeta" }, q.db + " · " + q.status +
          (q.slo_class ? " · " + q.slo_class : ""), bar, el("span", null, timing)));
    }));
  }

  // ------------------------------------------------------------------ answer
  function renderStatus(status, latency, slo) {
    const badge = $("status-badge");
    badge.hidden = false;
    badge.className = "badge " + status;
    badge.textContent = status;
    const parts = [];
    if (latency !== null && latency !== undefined) {
      parts.push("latency ", el("b", { class: slo && status === "done" ?
        (latency <= slo ? "ok" : "bad") : "" },
        fmtS(latency)));
      // met/missed only for an answer: a cancelled or failed query met no SLO
      if (slo) {
        parts.push(" · SLO " + fmtS(slo) + (status !== "done" ? ""
          : (latency <= slo ? " ✓ met" : " ✗ missed")));
      }
    } else if (slo) {
      parts.push("SLO " + fmtS(slo));
    }
    $("latency").replaceChildren(...parts);
  }

  function renderAnswer(q) {
    $("answer-empty").hidden = true;
    $("question-echo").textContent = q.question + "  ";
    renderStatus(q.status, q.latency_s, q.slo_s);
    const sql = $("sql");
    if (q.sql) {
      sql.hidden = false;
      $("sql-code").replaceChildren(window.SqlHighlight.highlight(q.sql));
    } else {
      sql.hidden = true;
    }
    const err = $("answer-error");
    if (q.error) {
      err.hidden = false;
      err.className = "error-box" + (q.status === "cancelled" || q.status === "unsure"
        ? " soft" : "");
      err.textContent = statusLine(q.status, q.error);
    } else {
      err.hidden = true;
    }
    // Only an answer has a confidence: a cancelled or failed query has nothing to judge, and
    // its badge already says what happened.
    renderConfidence(q.status === "done" || q.status === "unsure" ? q.confidence : null);
    renderResult(q);
    const retries = $("retries");
    if (q.retries && q.retries.length) {
      retries.hidden = false;
      retries.replaceChildren(...q.retries.map((r) => el("li", null, el("b", null, r.node_id),
        ": instance " + r.failed_on + " failed (" + r.error + ") — ",
        r.rerun_on ? ["re-run on ", el("b", null, r.rerun_on)] : "not recovered")));
    } else {
      retries.hidden = true;
    }
    $("follow-up-button").hidden = !(q.status === "done" && q.conversation_id);
    document.dispatchEvent(new CustomEvent("agentflow:answer", { detail: q }));
  }

  // The error box's one line: the status, then why, without saying the status twice
  // ("unsure: not sure: ...", "cancelled: cancelled by request").
  function statusLine(status, error) {
    const said = { unsure: /^not sure\b/i, cancelled: /^cancel/i };
    return said[status] && said[status].test(error) ? error : status + ": " + error;
  }

  // How sure the pipeline is; a low level is a visible warning, with the reasons behind it.
  function renderConfidence(c) {
    const box = $("answer-confidence");
    if (!c) { box.hidden = true; return; }
    box.hidden = false;
    box.className = "confidence " + c.level;
    const head = el("div", { class: "confidence-head" }, c.level === "low"
      ? "Low confidence (" + c.score.toFixed(2) + "): this answer is likely wrong — check " +
        "the SQL before you use it."
      : "Confidence " + c.level + " (" + c.score.toFixed(2) + ")");
    box.replaceChildren(head, el("ul", null, (c.reasons || []).map((r) => el("li", null, r))));
  }

  function renderResult(q) {
    const result = $("result");
    const chartBox = $("chart");
    chartBox.hidden = true;
    chartBox.replaceChildren();
    // An "unsure" answer still shows its best guess (the error box says it is one).
    if ((q.status !== "done" && q.status !== "unsure") || !q.columns.length) {
      result.hidden = true; return;
    }
    result.hidden = false;
    const shown = q.rows.slice(0, 200);
    $("result-meta").textContent = (q.rows.length === 0 ? "0 rows: the query ran and " +
      "matched nothing" : q.rows.length + (q.rows.length === 1 ? " row" : " rows")) +
      (q.truncated ? " (truncated by the server's row cap)" : "") +
      (q.rows.length > shown.length ? " · showing the first " + shown.length : "") +
      " · " + q.db;
    const numeric = q.columns.map((_, i) => shown.length > 0 && shown.every(
      (row) => row[i] === null || typeof row[i] === "number"));
    const head = el("thead", null, el("tr", null, q.columns.map((c, i) =>
      el("th", { class: numeric[i] ? "num" : null }, c))));
    const body = el("tbody", null, shown.map((row) => el("tr", null, row.map((v) =>
      v === null ? el("td", { class: "null" }, "NULL")
        : el("td", { class: typeof v === "number" ? "num" : null }, String(v))))));
    const table = $("result-table");
    table.replaceChildren(head, body);
    $("no-rows").hidden = q.rows.length > 0;
    $("csv-button").hidden = !(q.links && q.links.csv);
    if (q.links && q.links.chart) loadChart(q);
  }

  /* The chart is drawn by the server (Vega-Lite rendered to SVG) and shown as an image:
   * an <img> never runs scripts from the SVG, and no charting library loads here. */
  async function loadChart(q) {
    try {
      const res = await api(q.links.chart + "?format=svg");
      if (!res.ok) return;
      const blob = await res.blob();
      if (!state.live || state.live.id !== q.query_id) return;
      const url = URL.createObjectURL(blob);
      $("chart").replaceChildren(el("img", { src: url, alt: "chart of the result" }));
      $("chart").hidden = false;
    } catch (e) { /* the table is there anyway */ }
  }

  async function downloadCsv() {
    const q = state.live && state.live.final;
    if (!q || !q.links || !q.links.csv) return;
    try {
      const res = await api(q.links.csv);
      if (!res.ok) { await readJson(res); return; }
      const url = URL.createObjectURL(await res.blob());
      const a = el("a", { href: url, download: q.query_id + ".csv" });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { showFormError(e.message); }
  }
  $("csv-button").addEventListener("click", downloadCsv);

  // ------------------------------------------------------------------ timeline
  function stageFromEvent(prev, ev) {
    const s = Object.assign({ llm_calls: [] }, prev || {});
    s.node_id = ev.node_id; s.stage = ev.stage; s.kind = ev.kind;
    s.start = ev.start; s.end = ev.end; s.error = ev.error; s.summary = ev.summary;
    s.status = { stage_started: "running", stage_finished: "ok", stage_failed: "error" }[ev.type];
    s.instances = ev.instance ? [ev.instance] : [];
    s.queue_s = ev.queue_s || 0; s.run_s = ev.run_s || 0;
    return s;
  }

  function niceStep(span) {
    const steps = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
      300, 600, 1800, 3600];
    for (const s of steps) if (span / s <= 7) return s;
    return 3600;
  }

  function renderTimeline() {
    const live = state.live;
    const box = $("timeline");
    if (!live) return;
    const stages = Array.from(live.stages.values())
      .filter((s) => s.start !== null && s.start !== undefined)
      .sort((a, b) => a.start - b.start || a.node_id.localeCompare(b.node_id));
    const now = live.final ? null : (performance.now() - live.t0) / 1000;
    let end = 0;
    stages.forEach((s) => { end = Math.max(end, s.end !== null && s.end !== undefined ? s.end : (now || s.start)); });
    if (now !== null) end = Math.max(end, now);
    if (live.latency) end = Math.max(end, live.latency);
    let span = Math.max(end * 1.04, 0.05);
    const showSlo = live.slo && live.slo <= span * 2.5;  // else the bars would be slivers
    if (showSlo) span = Math.max(span, live.slo * 1.04);
    const step = niceStep(span);
    const pct = (t) => (100 * Math.max(0, t) / span).toFixed(3) + "%";
    const ticks = [];
    for (let t = 0; t <= span + 1e-9; t += step) ticks.push(t);
    const grid = () => ticks.map((t) => el("div", { class: "tl-grid", style: { left: pct(t) } }));
    const rows = [el("div", { class: "tl-axis" }, el("div", { class: "muted" }, "stage"),
      el("div", { class: "tl-scale" },
        ticks.filter((t) => !showSlo || Math.abs(t - live.slo) > span * 0.05).map((t) =>
          el("span", { class: "tl-tick", style: { left: pct(t) } }, parseFloat(t.toFixed(3)) + "s")),
        showSlo ? el("div", { class: "tl-slo", style: { left: pct(live.slo) } },
          el("span", null, "SLO " + fmtS(live.slo))) : null),
      el("div", { class: "muted" }, showSlo || !live.slo ? "" : "SLO " + fmtS(live.slo) +
        " (off scale)"))];
    stages.forEach((s) => {
      const bars = [];
      const stageEnd = s.end !== null && s.end !== undefined ? s.end : now;
      const failed = s.status === "error" || s.status === "cancelled";
      const bar = (cls, a, b, color, title) => {
        if (b === null || b === undefined || a === null) return;
        const w = Math.max(0, b - a);
        const style = { left: pct(a), width: (100 * w / span).toFixed(3) + "%" };
        if (color) style.backgroundColor = color;
        bars.push(el("div", { class: "tl-bar " + (failed ? "error " : "") + cls, style: style,
          title: title }));
      };
      let info = [];
      if (s.status === "running") {
        bar("running", s.start, stageEnd, s.kind === "llm" ? "#93a3f8" : "#cbd5e1",
          s.node_id + " running");
        info = ["running…"];
      } else if (s.kind === "llm" && s.llm_calls && s.llm_calls.length) {
        let cursor = s.start;
        s.llm_calls.forEach((c) => {
          bar("prep", cursor, c.submitted, null, "prompt building");
          bar("queue", c.submitted, c.started, colorOf(c.instance),
            "queued " + fmtS(c.queue_s) + " for " + c.instance);
          bar("run", c.started, c.finished, colorOf(c.instance),
            "ran " + fmtS(c.run_s) + " on " + c.instance + " (" + c.prompt_tokens + " → " +
            c.completion_tokens + " tokens)");
          cursor = c.finished;
        });
        bar("prep", cursor, s.end, null, "parsing the answer");
        const inst = Array.from(new Set(s.llm_calls.map((c) => c.instance)));
        const q = s.llm_calls.reduce((a, c) => a + c.queue_s, 0);
        const r = s.llm_calls.reduce((a, c) => a + c.run_s, 0);
        info = [el("b", null, inst.join(", ")), " · queue " + fmtS(q) + " · run " + fmtS(r)];
      } else if (s.kind === "llm" && s.end !== null && s.end !== undefined) {
        const runStart = s.end - s.run_s;
        const queueStart = runStart - s.queue_s;
        const inst = (s.instances || [])[0];
        bar("prep", s.start, queueStart, null, "prompt building");
        bar("queue", queueStart, runStart, colorOf(inst), "queued " + fmtS(s.queue_s));
        bar("run", runStart, s.end, colorOf(inst), "ran " + fmtS(s.run_s));
        info = inst ? [el("b", null, inst), " · queue " + fmtS(s.queue_s) + " · run " +
          fmtS(s.run_s)] : [];
      } else {
        bar("tool", s.start, stageEnd, null, s.summary || s.node_id);
        info = [s.summary || fmtS(stageEnd - s.start)];
      }
      if (failed) info = [s.status + (s.error ? ": " + s.error : "")];
      const infoText = info.map((x) => (x instanceof Node ? x.textContent : x)).join("");
      rows.push(el("div", { class: "tl-row" },
        el("div", { class: "tl-name", title: s.node_id }, s.node_id,
          el("span", { class: "kind" }, s.kind)),
        el("div", { class: "tl-track" }, grid(), showSlo ? el("div", { class: "tl-slo",
          style: { top: "0", left: pct(live.slo) } }) : null, bars),
        el("div", { class: "tl-info" + (failed ? " err" : ""), title: infoText }, info)));
    });
    if (!stages.length) {
      rows.push(el("div", { class: "muted", style: { padding: "8px 0" } },
        "waiting for the first stage…"));
    }
    const usage = live.final ? usageLine(live.final) : null;
    if (usage) rows.push(usage);
    box.replaceChildren(...rows);
  }

  function usageLine(q) {
    const calls = [];
    q.stages.forEach((s) => (s.llm_calls || []).forEach((c) => calls.push(c)));
    if (!calls.length) return null;
    const instances = new Set(calls.map((c) => c.instance));
    const queued = calls.filter((c) => c.queue_s >= 0.001);
    const waited = queued.reduce((a, c) => a + c.queue_s, 0);
    const tokensIn = calls.reduce((a, c) => a + c.prompt_tokens, 0);
    const tokensOut = calls.reduce((a, c) => a + c.completion_tokens, 0);
    return el("div", { class: "tl-usage" }, calls.length + " LLM call" + (calls.length === 1 ? "" : "s") +
      " on " + instances.size + " instance" + (instances.size === 1 ? "" : "s") + " · " +
      (queued.length ? queued.length + " queued for " + fmtS(waited) + " in total" : "none queued") +
      " · " + tokensIn.toLocaleString() + " prompt → " + tokensOut.toLocaleString() +
      " output tokens · pipeline " + q.pipeline);
  }

  function tick() {
    if (!state.live || state.live.final) return;
    renderTimeline();
    if (state.live.id) {
      const elapsed = (performance.now() - state.live.t0) / 1000;
      renderStatus("running", null, state.live.slo);
      $("latency").replaceChildren("elapsed ", el("b", null, fmtS(elapsed)),
        state.live.slo ? " · SLO " + fmtS(state.live.slo) : "");
    }
    requestAnimationFrame(tick);
  }

  function showFinal(q) {
    const live = state.live;
    if (!live || live.id !== q.query_id) return;
    live.final = q;
    live.latency = q.latency_s;
    live.stages = new Map(q.stages.map((s) => [s.node_id, s]));
    renderAnswer(q);
    renderTimeline();
    setBusy(false);
    if (state.followUp && state.followUp.conversation_id === q.conversation_id) {
      state.followUp.question = q.question;  // the next follow-up builds on this turn
      showFollowUp();
    }
    refreshRecent();
    refreshInstances();
  }

  function follow(view, t0) {
    if (state.stream) state.stream.abort();
    state.live = { id: view.query_id, t0: t0, slo: view.slo_s, stages: new Map(), final: null };
    view.stages.forEach((s) => state.live.stages.set(s.node_id, s));
    $("answer-empty").hidden = true;
    $("question-echo").textContent = view.question;
    renderStatus(view.status, null, view.slo_s);  // never leave the last answer's badge up
    $("sql").hidden = true; $("result").hidden = true; $("answer-error").hidden = true;
    $("retries").hidden = true; $("follow-up-button").hidden = true; $("chart").hidden = true;
    document.dispatchEvent(new CustomEvent("agentflow:answer", { detail: null }));
    if (view.db && $("db").value !== view.db && !state.followUp &&
        state.databases.some((d) => d.id === view.db)) {
      $("db").value = view.db;  // an opened recent query shows its own database
      showDatabase();
    }
    $("answer-confidence").hidden = true;
    if (["done", "unsure", "failed", "cancelled", "rejected"].indexOf(view.status) >= 0) {
      showFinal(view);
      return;
    }
    setBusy(true);
    requestAnimationFrame(tick);
    const controller = new AbortController();
    state.stream = controller;
    streamEvents(view.query_id, (type, ev) => {
      if (!state.live || state.live.id !== view.query_id) return;
      if (type.startsWith("stage_")) {
        state.live.stages.set(ev.node_id, stageFromEvent(state.live.stages.get(ev.node_id), ev));
        const now = performance.now();  // queue lengths move with the stages: refresh, throttled
        if (!state.lastInstances || now - state.lastInstances > 300) {
          state.lastInstances = now;
          refreshInstances();
        }
      } else if (type === "done" && ev.answer) {
        showFinal(ev.answer);
      }
    }, controller.signal).then(async (done) => {
      if (state.live && state.live.id === view.query_id && !state.live.final) {
        // stream ended without the answer attached: fetch it
        showFinal(await getJson("/v1/queries/" + encodeURIComponent(view.query_id)));
      }
    }).catch((e) => {
      if (e.name !== "AbortError") showFormError(e.message);
      setBusy(false);
    });
  }

  async function openQuery(id) {
    try {
      const view = await getJson("/v1/queries/" + encodeURIComponent(id));
      // A query still running is followed live; its elapsed time is estimated from stages.
      const started = view.stages.reduce((a, s) => Math.max(a, s.end || s.start || 0), 0);
      follow(view, performance.now() - started * 1000);
    } catch (e) { showFormError(e.message); }
  }

  // ------------------------------------------------------------------ asking
  function setBusy(busy) {
    $("ask-button").disabled = busy;
    $("ask-button").textContent = busy ? "Running…" : "Ask";
    $("cancel-button").hidden = !busy;
    $("cancel-button").disabled = false;
  }

  $("cancel-button").addEventListener("click", async () => {
    const live = state.live;
    if (!live || !live.id || live.final) return;
    $("cancel-button").disabled = true;
    try {
      const view = await readJson(await api("/v1/queries/" + encodeURIComponent(live.id),
        { method: "DELETE" }));
      showFinal(view);
    } catch (e) {
      // 409: it finished meanwhile; the stream delivers the answer.
      if (e.status !== 409) showFormError(e.message);
    }
  });

  function showFollowUp() {
    const f = state.followUp;
    $("follow-up").hidden = !f;
    $("follow-up-text").textContent = f ? f.question : "";
    $("db").disabled = !!f;
  }
  $("follow-up-button").addEventListener("click", () => {
    const q = state.live && state.live.final;
    if (!q || !q.conversation_id) return;
    state.followUp = { conversation_id: q.conversation_id, question: q.question, db: q.db };
    $("db").value = q.db;
    showFollowUp();
    $("question").value = "";
    $("question").placeholder = "e.g. now only the first five";
    $("question").focus();
  });
  $("follow-up-clear").addEventListener("click", () => {
    state.followUp = null;
    showFollowUp();
    showDatabase();
  });
  function showFormError(message) {
    const box = $("form-error");
    box.hidden = !message;
    box.textContent = message || "";
  }

  $("ask-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    showFormError("");
    const question = $("question").value.trim();
    if (!question) { showFormError("Type a question first."); return; }
    const body = { question: question, db: $("db").value, wait: false };
    if (state.followUp) body.conversation_id = state.followUp.conversation_id;
    // The server checks the SLO (and everything else) and says what is wrong.
    if ($("slo").value !== "") body.slo_seconds = Number($("slo").value);
    if ($("pipeline").value) body.pipeline = $("pipeline").value;
    setBusy(true);
    const t0 = performance.now();
    try {
      const view = await readJson(await api("/v1/queries",
        { method: "POST", body: JSON.stringify(body) }));
      follow(view, t0);
      refreshRecent();
    } catch (err) {
      setBusy(false);
      let message = err.message;
      if (err.status === 429 || err.status === 503) {
        message = "The cluster is busy: " + err.message +
          (err.retryAfter ? ". Try again in " + err.retryAfter + " s." : ".");
      }
      showFormError(message);
    }
  });

  $("question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("ask-form").requestSubmit();
  });

  // ------------------------------------------------------------------ start
  async function boot() {
    try {
      await loadCatalog();
      showFormError("");
    } catch (e) {
      showFormError(e.status === 401 ? "This server needs an API key." : e.message);
      return;
    }
    refreshInstances();
    refreshRecent();
  }
  renderLegend();
  boot();
  setInterval(() => { if (!document.hidden) refreshInstances(); }, 2000);
  setInterval(() => { if (!document.hidden && !(state.live && !state.live.final)) refreshRecent(); }, 5000);
})();

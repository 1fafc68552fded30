"use strict";
(async function () {
  const $ = (id) => document.getElementById(id);
  // Served by `toolenv view --serve`, the page holds no episode: the list's rows come from
  // rows.json and each episode from episodes/N.json when it is opened.
  const served = $("report-served") !== null;
  // Self-contained, the data comes in chunks, each one <script> (one string in the browser, and a
  // browser's strings have a size limit): the episodes in order, each image in the chunk that first has it.
  const data = { episodes: [], images: {} };
  for (const script of document.querySelectorAll("script.report-data")) {
    const chunk = JSON.parse(script.textContent);
    for (const ep of chunk.episodes) data.episodes.push(ep);
    Object.assign(data.images, chunk.images);
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }
  const fmt = (x) => (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(3)) : String(x));
  const toolErrors = (ep) => ep.turns.reduce((n, t) => n + t.results.filter((r) => r.is_error).length, 0);
  const toolCalls = (ep) => ep.turns.reduce((n, t) => n + t.parsed.tool_calls.length, 0);
  const status = (ep) => (ep.error ? "error" : ep.success ? "success" : ep.truncated ? "truncated" : "fail");
  // One row per episode: what the list shows and filters on (as served.py's `_row` builds it).
  const rowOf = (ep) => ({
    task_id: ep.task.id,
    sample: ep.sample,
    env_id: ep.env_id,
    reward: ep.reward,
    turns: ep.turns.length,
    calls: toolCalls(ep),
    tool_errors: toolErrors(ep),
    error: Boolean(ep.error),
    success: ep.success,
    truncated: ep.truncated,
    text: [ep.task.id, ep.task.question, ep.answer || "", ep.error || ""].join(" "),
  });
  let rows;
  if (served) {
    const resp = await fetch("rows.json");
    if (!resp.ok) throw new Error(`rows.json: ${resp.status} ${resp.statusText}`);
    rows = await resp.json();
  } else {
    rows = data.episodes.map(rowOf);
  }
  for (const r of rows) r.hay = r.text.toLowerCase();

  // ------------------------------------------------------------------ list and filters
  const envs = [...new Set(rows.map((r) => r.env_id))].sort();
  for (const env of envs) $("f-env").append(el("option", { value: env }, env || "(no id)"));

  function matches(r) {
    const min = parseFloat($("f-min").value);
    const max = parseFloat($("f-max").value);
    // A non-finite reward is the string "NaN" or "Infinity" (JSON has no number for it): compared as
    // a number, and `!(x >= min)` so that NaN is within no bound.
    const reward = Number(r.reward);
    if (!Number.isNaN(min) && !(reward >= min)) return false;
    if (!Number.isNaN(max) && !(reward <= max)) return false;
    const env = $("f-env").value;
    if (env && r.env_id !== env) return false;
    const st = $("f-status").value;
    if (st === "success" && !r.success) return false;
    if (st === "fail" && r.success) return false;
    if (st === "error" && !r.error) return false;
    if (st === "tool-error" && r.tool_errors === 0) return false;
    if (st === "clean" && (r.error || r.tool_errors > 0)) return false;
    const text = $("f-text").value.trim().toLowerCase();
    if (text && !r.hay.includes(text)) return false;
    return true;
  }

  let selected = -1;
  // A run of many thousand episodes: the table lists the first MAX_ROWS that match.
  const MAX_ROWS = 1000;
  function renderList() {
    const body = document.querySelector("#episode-list tbody");
    body.replaceChildren();
    let shown = 0;
    rows.forEach((r, i) => {
      if (!matches(r)) return;
      shown += 1;
      if (shown > MAX_ROWS) return;
      const st = status(r);
      const row = el(
        "tr",
        { "data-index": String(i), class: i === selected ? "selected" : "" },
        el("td", {}, i + 1),
        el("td", {}, r.task_id + (r.sample ? ` #${r.sample}` : "")),
        el("td", {}, r.env_id),
        el("td", {}, fmt(r.reward)),
        el("td", {}, r.turns),
        el("td", {}, r.calls),
        el("td", {}, r.tool_errors),
        el("td", { class: `status-${st}` }, st)
      );
      body.append(row);
    });
    $("count").textContent =
      shown > MAX_ROWS
        ? `(${shown} of ${rows.length} match; the first ${MAX_ROWS} listed, filter to narrow)`
        : `(${shown} of ${rows.length} shown)`;
  }
  // Text inputs re-filter as you type; a "change" on blur would rebuild the rows under a click.
  for (const id of ["f-min", "f-max", "f-text"]) $(id).addEventListener("input", renderList);
  for (const id of ["f-env", "f-status"]) $(id).addEventListener("change", renderList);
  document.querySelector("#episode-list tbody").addEventListener("click", (ev) => {
    const row = ev.target.closest("tr[data-index]");
    if (row) openEpisode(Number(row.getAttribute("data-index")));
  });

  // ------------------------------------------------------------------ one episode
  function pre(text) {
    return el("pre", {}, text);
  }
  function table(headers, rows, cls) {
    const t = el("table", { class: cls });
    if (headers) t.append(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
    const tb = el("tbody");
    for (const r of rows) tb.append(el("tr", {}, ...r.map((c) => el("td", {}, typeof c === "string" ? c : JSON.stringify(c)))));
    t.append(tb);
    return t;
  }
  function renderMeta(meta) {
    const out = el("div", { class: "meta-box" });
    const rest = Object.assign({}, meta);
    // Tabular results (SQL): {columns: [...], rows: [[...]]} or rows as objects.
    if (Array.isArray(rest.rows) && rest.rows.length) {
      const rows = rest.rows.slice(0, 200);
      if (Array.isArray(rest.columns)) {
        out.append(table(rest.columns.map(String), rows.map((r) => (Array.isArray(r) ? r : [r])), "rows"));
        delete rest.columns;
      } else if (typeof rows[0] === "object" && rows[0] !== null && !Array.isArray(rows[0])) {
        const cols = Object.keys(rows[0]);
        out.append(table(cols, rows.map((r) => cols.map((c) => r[c])), "rows"));
      } else {
        out.append(table(null, rows.map((r) => (Array.isArray(r) ? r : [r])), "rows"));
      }
      if (rest.rows.length > 200) out.append(el("p", { class: "muted" }, `${rest.rows.length - 200} more rows`));
      delete rest.rows;
    }
    // Code output: stdout / stderr blocks.
    for (const key of ["stdout", "stderr", "output", "traceback"]) {
      if (typeof rest[key] === "string" && rest[key]) {
        out.append(el("div", { class: "muted" }, key), pre(rest[key]));
        delete rest[key];
      }
    }
    const keys = Object.keys(rest);
    if (keys.length) {
      out.append(table(null, keys.map((k) => [k, typeof rest[k] === "string" ? rest[k] : JSON.stringify(rest[k])]), "meta"));
    }
    return out;
  }
  // Each distinct image is in data.images once (standard base64), named by its hash.
  function images(list) {
    return (list || []).map((im) =>
      el("img", { class: "tool-image", src: `data:${im.mime};base64,${data.images[im.file]}`, alt: `image ${im.width}×${im.height}`, width: String(im.width), height: String(im.height) })
    );
  }
  function message(role, cls, ...children) {
    return el("div", { class: `msg ${role} ${cls || ""}` }, el("div", { class: "role" }, role), ...children);
  }

  async function openEpisode(i) {
    selected = i;
    const d = $("detail");
    let ep = data.episodes[i];
    if (served) {
      renderList();
      d.replaceChildren(el("p", { class: "muted" }, `Loading episode ${i + 1}…`));
      try {
        const resp = await fetch(`episodes/${i}.json`);
        // The server says why in the body (a status line holds Latin-1 only; a path may not).
        if (!resp.ok) throw new Error(`${resp.status} ${(await resp.text()) || resp.statusText}`);
        const got = await resp.json();
        Object.assign(data.images, got.images);
        ep = got.episode;
      } catch (err) {
        if (selected === i) d.replaceChildren(el("p", { class: "muted" }, `Could not load episode ${i + 1}: ${err.message}`));
        return;
      }
      if (selected !== i) return; // another episode was opened meanwhile
    }
    d.replaceChildren();
    d.append(el("h3", {}, `Episode ${i + 1}: task ${ep.task.id}`));
    const gold = ep.task.answer === null || ep.task.answer === undefined ? "–" : [].concat(ep.task.answer).join(" | ");
    d.append(
      table(null, [
        ["env", ep.env_id],
        ["agent", ep.agent + (ep.model ? ` (${ep.model})` : "")],
        ["reward", fmt(ep.reward)],
        ["status", status(ep)],
        ["answer", ep.answer === null ? "–" : ep.answer],
        ["gold", gold],
        ["duration", `${fmt(ep.duration_s)} s`],
      ], "meta")
    );
    if (ep.error) d.append(message("error", "", pre(ep.error)));
    for (const m of ep.prompt_messages) {
      if (m.role === "system") {
        d.append(message("system", "", el("details", {}, el("summary", {}, "system prompt"), pre(m.content))));
      } else {
        d.append(message(m.role, "", pre(m.content), ...images(m.images)));
      }
    }
    for (const t of ep.turns) {
      const parts = [pre(t.action)];
      for (const c of t.parsed.tool_calls) {
        parts.push(el("div", { class: "call" }, "→ ", el("span", { class: "name" }, c.name), ` (${c.id})`, pre(JSON.stringify(c.arguments, null, 2))));
      }
      if (t.parsed.answer !== null && t.parsed.answer !== undefined) parts.push(el("div", { class: "call" }, "answer: ", el("b", {}, t.parsed.answer)));
      const tokens = t.completion_tokens !== null && t.completion_tokens !== undefined ? ` · ${t.completion_tokens} tokens` : "";
      parts.push(el("div", { class: "reward-line" }, `turn ${t.index + 1} · agent ${fmt(t.agent_latency_s)} s · env ${fmt(t.env_latency_s)} s${tokens}`));
      d.append(message("assistant", "", ...parts));
      t.results.forEach((r, k) => {
        const stat = t.calls[k];
        const head = el("div", { class: "reward-line" }, `${r.name || "tool"}${r.call_id ? " (" + r.call_id + ")" : ""}${r.is_error ? " · error" : ""}${stat ? " · " + fmt(stat.latency_s) + " s" : ""}`);
        d.append(message("tool", r.is_error ? "is-error" : "", head, pre(r.text), ...images(r.images), Object.keys(r.metadata || {}).length ? renderMeta(r.metadata) : null));
      });
      const comps = Object.entries(t.reward_components).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
      d.append(el("div", { class: "reward-line" }, `reward ${fmt(t.reward)}${comps ? " (" + comps + ")" : ""}`));
    }
    const comps = Object.entries(ep.reward_components);
    if (comps.length) {
      d.append(el("h4", {}, "Reward breakdown"), table(["component", "value"], [...comps.map(([k, v]) => [k, fmt(v)]), ["total", fmt(ep.reward)]], "meta"));
    }
    renderList();
  }

  renderList();
})();

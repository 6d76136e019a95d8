// The Querator console: a client of the public HTTP API (POST /v1/...), nothing more. Every action goes
// through the same endpoints a program would call, and an API error is shown as the API wrote it.
// No framework and no build step: the page must work offline from the package and stay small.
"use strict";

const PAGE_QUEUES = 25;   // queues per page: the refresh cost is one stats call per visible queue
const PAGE_ITEMS = 50;    // items per page of a partition listing
const HISTORY = 60;       // stats samples kept per queue for the charts and the rates
const MOVE_CHUNK = 100;   // items per import/delete call when moving dead letters by hand

const state = {
  config: { read_only: false, target: "", refresh_ms: 5000 },
  features: { redrive: false, counters: false, reprioritize: false },
  timer: null,
  refresh: null,          // the current view's refresh function
  history: new Map(),     // queue name -> [{t, ready, leased, scheduled, produced, completed}]
  generation: 0,          // bumped on navigation, so a late reply never paints over a newer view
};

// ---------------------------------------------------------------------------------------------------
// DOM and formatting helpers. Text always goes in as text nodes: queue names, references and
// payloads are user data.

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(container, ...children) {
  // replaceChildren would print a skipped (null) part as the text "null".
  container.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined && child !== false));
}

function svgNode(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 172800) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d`;
}

function fmtDuration(seconds) {
  // A duration as people read it ("18.7s", "1m", "24h"), not the API's "18.666667s" / "1m0s"; still
  // Go syntax. Tenths of a second under a minute, whole seconds above (the cell's title has the API's).
  if (!seconds) return "0s";
  if (seconds < 0.99995) return `${Math.round(seconds * 10000) / 10}ms`;
  if (seconds < 59.95) return `${Math.round(seconds * 10) / 10}s`;
  const whole = Math.round(seconds);
  const parts = [[Math.floor(whole / 3600), "h"], [Math.floor((whole % 3600) / 60), "m"], [whole % 60, "s"]];
  return parts.filter(([n]) => n).map(([n, unit]) => `${n}${unit}`).join("");
}

function goDuration(text) {
  // Go duration strings as the API returns them ("1m0s", "3.2s", "24h0m0s") to seconds.
  if (!text) return 0;
  let total = 0;
  const units = { h: 3600, m: 60, s: 1, ms: 0.001, us: 1e-6, "µs": 1e-6, ns: 1e-9 };
  for (const [, number, unit] of String(text).matchAll(/([0-9.]+)(h|ms|m|s|us|µs|ns)/g)) {
    total += parseFloat(number) * units[unit];
  }
  return total;
}

function ageOf(timestamp) {
  return timestamp ? (Date.now() - Date.parse(timestamp)) / 1000 : null;
}

function decodePayload(base64) {
  const binary = atob(base64 || "");
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function encodeText(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary);
}

function payloadViews(bytes) {
  // Text when the bytes are valid UTF-8, pretty JSON when the text parses, hex always.
  const views = {};
  try {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    views.text = text;
    try { views.json = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* not JSON */ }
  } catch (_) { /* binary */ }
  const lines = [];
  for (let offset = 0; offset < bytes.length; offset += 16) {
    const row = Array.from(bytes.slice(offset, offset + 16));
    const hex = row.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = row.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${offset.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  views.hex = lines.join("\n");
  return views;
}

// ---------------------------------------------------------------------------------------------------
// The API.

class ApiError extends Error {
  constructor(status, body) {
    const text = body && body.message ? body.message : `HTTP ${status}`;
    super(text);
    this.status = status;
    this.body = body;
  }
  describe() {
    const codeText = this.body && this.body.code_text ? ` ${this.body.code_text}` : "";
    return `${this.status}${codeText}: ${this.message}`;
  }
}

async function api(path, body) {
  const response = await fetch(`/v1/${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  const text = await response.text();
  let data = {};
  try { data = text ? JSON.parse(text) : {}; } catch (_) { data = { message: text }; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error instanceof ApiError ? error.describe() : String(error && error.message ? error.message : error);
  box.hidden = false;
}

function showNotice(text) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.hidden = false;
}

function clearMessages() {
  document.getElementById("error").hidden = true;
  document.getElementById("notice").hidden = true;
}

async function guarded(action) {
  // Runs a user action: its error goes to the alert box; returns undefined when it failed.
  clearMessages();
  try {
    return await action();
  } catch (error) {
    showError(error);
    return undefined;
  }
}

function confirmDialog(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

async function listAllQueues() {
  // Every queue, paged; used to find which queues dead-letter into which.
  const all = [];
  let pivot = "";
  for (let page = 0; page < 1000; page += 1) {
    const reply = await api("queues.list", { pivot, limit: 1000 });
    const items = reply.items || [];
    const fresh = pivot ? items.filter((q) => q.queue_name !== pivot) : items;
    all.push(...fresh);
    if (items.length < 1000) break;
    pivot = items[items.length - 1].queue_name;
  }
  return all;
}

function partitionsOf(stats) {
  return (stats.logicalQueues && stats.logicalQueues[0] && stats.logicalQueues[0].partitions) || [];
}

function hasCounters(partitions) {
  // The cumulative produced / completed counts of queue.stats: an older server has neither (null
  // then, shown as "—"). A reply may leave a zero out, so the server's OpenAPI document counts too.
  return state.features.counters || partitions.some((p) => "produced" in p || "completed" in p);
}

function totals(stats) {
  const sum = { ready: 0, leased: 0, scheduled: 0, ageWeighted: 0, produced: 0, completed: 0 };
  const partitions = partitionsOf(stats);
  for (const p of partitions) {
    const total = p.total || 0;
    const leased = p.total_leased || 0;
    sum.ready += total - leased;
    sum.leased += leased;
    sum.scheduled += p.scheduled || 0;
    sum.ageWeighted += goDuration(p.average_age) * total;
    sum.produced += p.produced || 0;
    sum.completed += p.completed || 0;
  }
  if (!hasCounters(partitions)) { sum.produced = null; sum.completed = null; }
  const stored = sum.ready + sum.leased;
  sum.averageAge = stored ? sum.ageWeighted / stored : null;
  return sum;
}

async function oldestAge(queueName, stats) {
  // The first item of each non-empty partition is its oldest: one short read per partition.
  let oldest = null;
  for (const p of partitionsOf(stats)) {
    if (!p.total) continue;
    const reply = await api("storage/items.list", { queue_name: queueName, partition: p.partition, limit: 1 });
    const first = (reply.items || [])[0];
    if (first) {
      const age = ageOf(first.created_at);
      if (oldest === null || age > oldest) oldest = age;
    }
  }
  return oldest;
}

function remember(queueName, sums) {
  let samples = state.history.get(queueName) || [];
  const previous = samples[samples.length - 1];
  // The counters only grow: one that went down means the queue was deleted and created again under
  // its name, and the old samples belong to another queue.
  const restarted = (key) => previous && previous[key] !== null && sums[key] !== null && sums[key] < previous[key];
  if (restarted("produced") || restarted("completed")) samples = [];
  samples.push({ t: Date.now(), ready: sums.ready, leased: sums.leased, scheduled: sums.scheduled,
    produced: sums.produced, completed: sums.completed });
  while (samples.length > HISTORY) samples.shift();
  state.history.set(queueName, samples);
  return samples;
}

function counterRate(samples, key) {
  // Items per second of a cumulative counter ("produced" or "completed") over the samples kept: its
  // growth from the oldest sample that has it to the newest, over the time between. null until two
  // samples have it (and from a server without the counters).
  const last = samples[samples.length - 1];
  if (!last || last[key] === null || last[key] === undefined) return null;
  const first = samples.find((s) => s[key] !== null && s[key] !== undefined);
  const seconds = (last.t - first.t) / 1000;
  if (first === last || seconds <= 0) return null;
  const count = last[key] - first[key];
  return { perSecond: count / seconds, count, seconds };
}

function showRate(cell, rate, verb) {
  if (rate === null) {
    cell.textContent = "—";
    cell.title = "needs two samples of the counters (a server without them: always)";
    return;
  }
  const r = rate.perSecond;
  cell.textContent = r === 0 ? "0" : r < 0.1 ? "<0.1" : r < 100 ? r.toFixed(1) : String(Math.round(r));
  cell.title = `${rate.count} ${verb} in the last ${Math.round(rate.seconds)} s`;
}

function sparkline(history, width, height) {
  const samples = history.length === 1 ? [history[0], history[0]] : history;
  const svg = svgNode("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const depth = samples.map((s) => s.ready + s.leased + s.scheduled);
  const max = Math.max(1, ...depth);
  const points = depth.map((d, i) => `${(i / Math.max(1, samples.length - 1)) * width},${height - 1 - (d / max) * (height - 2)}`);
  svg.append(svgNode("polyline", { points: points.join(" ") }));
  const title = svgNode("title", {});
  title.textContent = `depth over the last ${history.length} samples, now ${depth[depth.length - 1] || 0}, max ${max}`;
  svg.append(title);
  return svg;
}

function depthChart(history) {
  // One sample draws as a flat line rather than nothing.
  const samples = history.length === 1 ? [history[0], { ...history[0] }] : history;
  const width = 640;
  const height = 120;
  const svg = svgNode("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "Depth over time" });
  const series = [["ready", "#0b5cad"], ["leased", "#a4161a"], ["scheduled", "#6f42c1"]];
  const max = Math.max(1, ...samples.flatMap((s) => [s.ready, s.leased, s.scheduled]));
  for (const [key, colour] of series) {
    const points = samples.map((s, i) => `${(i / Math.max(1, samples.length - 1)) * width},${height - 4 - (s[key] / max) * (height - 8)}`);
    svg.append(svgNode("polyline", { points: points.join(" "), stroke: colour }));
  }
  const title = svgNode("title", {});
  const last = samples[samples.length - 1] || { ready: 0, leased: 0, scheduled: 0 };
  title.textContent = `ready ${last.ready} (blue), leased ${last.leased} (red), scheduled ${last.scheduled} (purple); max ${max}`;
  svg.append(title);
  return svg;
}

// ---------------------------------------------------------------------------------------------------
// Views.

function parseHash() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const parts = (path || "/").split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query || "");
  return { parts, params };
}

async function route() {
  state.generation += 1;
  state.refresh = null;
  clearMessages();
  const { parts, params } = parseHash();
  const view = document.getElementById("view");
  try {
    if (parts[0] === "queue" && parts.length >= 5 && parts[2] === "item") {
      await itemView(view, parts[1], Number(parts[3]), parts[4]);
    } else if (parts[0] === "queue" && parts[1]) {
      await queueView(view, parts[1], params);
    } else {
      await queuesView(view, params);
    }
  } catch (error) {
    showError(error);
  }
}

async function queuesView(view, params) {
  const generation = state.generation;
  const pivot = params.get("pivot") || "";
  // A queue is a dead-letter queue when another queue names it as its dead_queue: no setting says so,
  // so the console reads every queue's settings (queues.list, paged) once per visit of the list.
  const [reply, all] = await Promise.all([api("queues.list", { pivot, limit: PAGE_QUEUES + 1 }), listAllQueues()]);
  if (generation !== state.generation) return;
  const sourcesOf = deadLetterSources(all);
  const queues = (reply.items || []).slice(0, PAGE_QUEUES);
  const next = (reply.items || [])[PAGE_QUEUES];
  const rows = new Map();
  const body = h("tbody", {});
  for (const queue of queues) {
    const cells = {
      ready: h("td", { class: "num" }, "…"), leased: h("td", { class: "num" }, "…"),
      scheduled: h("td", { class: "num" }, "…"), oldest: h("td", { class: "num" }, "…"),
      dead: h("td", { class: "num" }, queue.dead_queue ? "…" : "—"),
      produced: h("td", { class: "num" }, "…"), completed: h("td", { class: "num" }, "…"),
      chart: h("td", {}),
    };
    rows.set(queue.queue_name, cells);
    body.append(h("tr", { "data-queue": queue.queue_name },
      h("td", { class: "mono" }, h("a", { href: `#/queue/${encodeURIComponent(queue.queue_name)}` }, queue.queue_name),
        fairMarker(queue), deadLetterMarker(sourcesOf.get(queue.queue_name))),
      h("td", { class: "num" }, queue.requested_partitions || 1),
      cells.ready, cells.leased, cells.scheduled, cells.oldest, cells.dead, cells.produced, cells.completed,
      cells.chart));
  }
  const filter = h("input", { id: "pivot", value: pivot, placeholder: "name", "aria-label": "Start at queue name" });
  show(view, 
    h("h1", {}, "Queues"),
    h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); location.hash = `#/?pivot=${encodeURIComponent(filter.value)}`; } },
      h("label", {}, "Start at name", filter), h("button", { type: "submit", class: "secondary" }, "Go")),
    h("table", { "aria-label": "Queues" },
      h("thead", {}, h("tr", {},
        h("th", { scope: "col" }, "Name"), h("th", { scope: "col", class: "num" }, "Partitions"),
        h("th", { scope: "col", class: "num" }, "Ready"), h("th", { scope: "col", class: "num" }, "Leased"),
        h("th", { scope: "col", class: "num" }, "Scheduled"), h("th", { scope: "col", class: "num" }, "Oldest item"),
        h("th", { scope: "col", class: "num" }, "Dead letters"),
        h("th", { scope: "col", class: "num", title: "items produced or imported per second, sampled" }, "Produced/s"),
        h("th", { scope: "col", class: "num", title: "items completed (queue.complete) per second, sampled" }, "Completed/s"),
        h("th", { scope: "col" }, "Depth"))),
      body),
    queues.length ? null : h("p", { class: "muted" }, pivot ? "No queue from this name on." : "No queues yet."),
    h("div", { class: "actions" },
      pivot ? h("a", { href: "#/" }, "First page") : null,
      next ? h("a", { href: `#/?pivot=${encodeURIComponent(next.queue_name)}`, id: "next-page" }, "Next page") : null),
    state.config.read_only ? null : createQueueForm(),
  );
  state.refresh = async () => {
    for (const queue of queues) {
      if (generation !== state.generation) return;
      const cells = rows.get(queue.queue_name);
      try {
        const stats = await api("queue.stats", { queue_name: queue.queue_name });
        const sums = totals(stats);
        const samples = remember(queue.queue_name, sums);
        cells.ready.textContent = sums.ready;
        cells.leased.textContent = sums.leased;
        cells.scheduled.textContent = sums.scheduled;
        cells.oldest.textContent = fmtAge(await oldestAge(queue.queue_name, stats));
        showRate(cells.produced, counterRate(samples, "produced"), "produced");
        showRate(cells.completed, counterRate(samples, "completed"), "completed");
        cells.chart.replaceChildren(sparkline(samples, 120, 24));
        if (queue.dead_queue) {
          const dead = totals(await api("queue.stats", { queue_name: queue.dead_queue }));
          cells.dead.textContent = dead.ready + dead.leased + dead.scheduled;
        }
      } catch (error) {
        cells.ready.textContent = "error";
        cells.ready.title = error instanceof ApiError ? error.describe() : String(error);
      }
    }
  };
  await state.refresh();
}

function deadLetterSources(all) {
  // Dead-letter queue name -> the queues that dead-letter into it.
  const sources = new Map();
  for (const queue of all) {
    if (!queue.dead_queue) continue;
    if (!sources.has(queue.dead_queue)) sources.set(queue.dead_queue, []);
    sources.get(queue.dead_queue).push(queue.queue_name);
  }
  return sources;
}

function deadLetterMarker(sources) {
  // A dead-letter queue says so next to its name, in text, and whose dead letters it holds.
  if (!sources || !sources.length) return null;
  return h("span", { class: "tag dead", "data-dead-letter-of": sources.join(","),
    title: `dead-letter queue of: ${sources.join(", ")}` }, "Dead-letter queue");
}

function fairMarker(queue) {
  // A fair queue says so next to its name, in text; a FIFO queue (the default) shows nothing.
  if (queue.delivery !== "fair") return null;
  const cap = queue.max_leased_per_group || 0;
  return h("span", { class: "tag", "data-delivery": "fair",
    title: `fair delivery: leases go round-robin across item groups; ${cap ? `at most ${cap} leased per group` : "no cap per group"}` },
  "Fair");
}

const DELIVERIES = [["fifo", "FIFO"], ["fair", "Fair (round-robin across groups)"]];
const CAP_LABEL = "Max leased per group (fair; 0: unlimited)";
const RATE_LABEL = "Rate limit (leases/s; 0: none)";
const GROUP_RATE_LABEL = "Rate limit per group (fair; leases/s; 0: none)";

function deliverySelect(value, attrs) {
  return h("select", { name: "delivery", ...attrs },
    DELIVERIES.map(([key, text]) => h("option", { value: key, selected: key === value }, text)));
}

function createQueueForm() {
  const field = (name, label, value, attrs) => h("label", {}, label, h("input", { name, value: value || "", ...attrs }));
  const form = h("form", { class: "panel", "aria-label": "New queue" },
    h("h2", {}, "New queue"),
    h("div", { class: "row" },
      field("queue_name", "Name", "", { required: true }),
      field("lease_timeout", "Lease timeout", "1m"),
      field("expire_timeout", "Expire timeout", "24h"),
      field("max_attempts", "Max attempts (0: unlimited)", "0", { type: "number", min: 0 }),
      field("dead_queue", "Dead-letter queue", ""),
      field("requested_partitions", "Partitions", "1", { type: "number", min: 1 }),
      h("label", {}, "Delivery", deliverySelect("fifo")),
      field("max_leased_per_group", CAP_LABEL, "0", { type: "number", min: 0 }),
      field("rate_limit", RATE_LABEL, "0", { type: "number", min: 0, step: "any" }),
      field("rate_limit_per_group", GROUP_RATE_LABEL, "0", { type: "number", min: 0, step: "any" }),
      h("button", { type: "submit" }, "Create")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const info = {
      queue_name: data.get("queue_name"), lease_timeout: data.get("lease_timeout"),
      expire_timeout: data.get("expire_timeout"), max_attempts: Number(data.get("max_attempts") || 0),
      requested_partitions: Number(data.get("requested_partitions") || 1),
    };
    if (data.get("dead_queue")) info.dead_queue = data.get("dead_queue");
    // The defaults (FIFO, no cap) are left out: the request is then what it was before fair delivery.
    if (data.get("delivery") && data.get("delivery") !== "fifo") info.delivery = data.get("delivery");
    if (Number(data.get("max_leased_per_group") || 0) !== 0) info.max_leased_per_group = Number(data.get("max_leased_per_group"));
    // No limit is left out too: a server without rate limits takes the request.
    for (const key of ["rate_limit", "rate_limit_per_group"]) {
      if (Number(data.get(key) || 0) !== 0) info[key] = Number(data.get(key));
    }
    const done = await guarded(() => api("queues.create", info));
    if (done !== undefined) location.hash = `#/queue/${encodeURIComponent(info.queue_name)}`;
  });
  return form;
}

async function queueView(view, name, params) {
  const generation = state.generation;
  const [info, all] = await Promise.all([api("queues.info", { queue_name: name }), listAllQueues()]);
  if (generation !== state.generation) return;
  const sources = all.filter((q) => q.dead_queue === name).map((q) => q.queue_name);
  const tab = params.get("tab") === "scheduled" ? "scheduled" : "items";
  const partition = Number(params.get("partition") || 0);
  const statsBody = h("tbody", {});
  const chartBox = h("div", {});
  const summary = h("p", { class: "muted", id: "summary" });
  show(view, 
    h("p", {}, h("a", { href: "#/" }, "← Queues")),
    h("h1", {}, name),
    sources.length ? h("p", { class: "panel", id: "dead-letter-of" }, "Dead-letter queue of: ", sources.join(", ")) : null,
    summary,
    chartBox,
    h("h2", {}, "Partitions"),
    h("table", { "aria-label": "Partitions" },
      h("thead", {}, h("tr", {},
        h("th", { scope: "col", class: "num" }, "Partition"), h("th", { scope: "col", class: "num" }, "Ready"),
        h("th", { scope: "col", class: "num" }, "Leased"), h("th", { scope: "col", class: "num" }, "Scheduled"),
        h("th", { scope: "col", class: "num" }, "Average age"), h("th", { scope: "col", class: "num" }, "Average leased age"),
        h("th", { scope: "col", class: "num", title: "items produced or imported since the partition was created" }, "Produced"),
        h("th", { scope: "col", class: "num", title: "items completed since the partition was created" }, "Completed"))),
      statsBody),
    settingsForm(info),
    state.config.read_only ? null : produceForm(info),
    state.config.read_only ? null : clearPanel(info),
    sources.length && !state.config.read_only ? redrivePanel(info, sources, all) : null,
    await itemsPanel(info, tab, partition, params.get("pivot") || "", sources, all),
  );
  state.refresh = async () => {
    const stats = await api("queue.stats", { queue_name: name });
    if (generation !== state.generation) return;
    const sums = totals(stats);
    const samples = remember(name, sums);
    summary.textContent = `${sums.ready} ready, ${sums.leased} leased, ${sums.scheduled} scheduled`;
    chartBox.replaceChildren(depthChart(samples), h("p", { class: "legend" },
      h("span", { class: "key ready" }, "ready"), h("span", { class: "key leased" }, "leased"),
      h("span", { class: "key scheduled" }, "scheduled"), ` · last ${samples.length} samples`));
    const counted = hasCounters(partitionsOf(stats));
    statsBody.replaceChildren(...partitionsOf(stats).map((p) => h("tr", { "data-partition": p.partition },
      h("td", { class: "num" }, p.partition), h("td", { class: "num" }, (p.total || 0) - (p.total_leased || 0)),
      h("td", { class: "num" }, p.total_leased || 0), h("td", { class: "num" }, p.scheduled || 0),
      h("td", { class: "num", title: p.average_age || "0s" }, fmtDuration(goDuration(p.average_age))),
      h("td", { class: "num", title: p.average_leased_age || "0s" }, fmtDuration(goDuration(p.average_leased_age))),
      h("td", { class: "num" }, counted ? p.produced || 0 : "—"), h("td", { class: "num" }, counted ? p.completed || 0 : "—"))));
  };
  await state.refresh();
}

function settingsForm(info) {
  const readOnly = state.config.read_only;
  const editable = [
    ["lease_timeout", "Lease timeout", "text"], ["expire_timeout", "Expire timeout", "text"],
    ["max_attempts", "Max attempts", "number"], ["dead_queue", "Dead-letter queue", "text"],
    ["requested_partitions", "Partitions", "number"], ["reference", "Reference", "text"],
  ];
  // queues.info always has delivery and max_leased_per_group; a server older than fair delivery has
  // neither, and then the form does not offer them.
  if ("delivery" in info) {
    editable.push(["delivery", "Delivery", "select"], ["max_leased_per_group", CAP_LABEL, "number", { min: 0 }]);
  }
  // The same for rate limits: offered only by a server that has them.
  if ("rate_limit" in info) {
    editable.push(["rate_limit", RATE_LABEL, "number", { min: 0, step: "any" }],
      ["rate_limit_per_group", GROUP_RATE_LABEL, "number", { min: 0, step: "any" }]);
  }
  const inputs = {};
  const form = h("form", { class: "panel", "aria-label": "Settings" }, h("h2", {}, "Settings"),
    h("div", { class: "row" }, editable.map(([key, label, type, attrs]) => {
      // A select cannot be read-only: a read-only console disables it instead.
      inputs[key] = type === "select"
        ? deliverySelect(info[key], { disabled: readOnly })
        : h("input", { name: key, type, value: info[key] ?? "", readonly: readOnly, ...attrs });
      return h("label", {}, label, inputs[key]);
    }), readOnly ? null : h("button", { type: "submit" }, "Save")),
    h("p", { class: "muted" }, `Created ${info.created_at || "?"}, updated ${info.updated_at || "?"}`));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    // queues.update changes only the fields sent: send what the user changed.
    const update = { queue_name: info.queue_name };
    for (const [key, , type] of editable) {
      const value = inputs[key].value;
      if (String(info[key] ?? "") === value) continue;
      update[key] = type === "number" ? Number(value) : value;
    }
    if (Object.keys(update).length === 1) { showNotice("Nothing changed."); return; }
    const done = await guarded(() => api("queues.update", update));
    if (done !== undefined) { showNotice("Settings saved."); Object.assign(info, update); }
  });
  return form;
}

function produceForm(info) {
  const payload = h("textarea", { name: "payload", "aria-label": "Payload (text)" }, "{\"hello\": \"world\"}");
  const reference = h("input", { name: "reference" });
  const group = h("input", { name: "group" });
  const priority = h("input", { name: "priority", type: "number", min: 0, max: 9, step: 1, value: 5 });
  const enqueueAt = h("input", { name: "enqueue_at", placeholder: "2026-01-01T00:00:00Z" });
  const enqueueIn = h("input", { name: "enqueue_in", placeholder: "5m" });
  const form = h("form", { class: "panel", "aria-label": "Produce a test item" }, h("h2", {}, "Produce a test item"),
    h("label", {}, "Payload (text)", payload),
    h("div", { class: "row" }, h("label", {}, "Reference", reference), h("label", {}, "Group (optional)", group),
      h("label", {}, "Priority (0-9, lower leases first)", priority),
      h("label", {}, "Enqueue at (RFC 3339, optional)", enqueueAt),
      h("label", {}, "or enqueue in (duration, optional)", enqueueIn), h("button", { type: "submit" }, "Produce")));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const item = { utf8: payload.value, reference: reference.value };
    if (enqueueAt.value) item.enqueue_at = enqueueAt.value;
    if (enqueueIn.value) item.enqueue_in = enqueueIn.value;
    if (group.value) item.group = group.value;
    // Sent as typed (a JSON integer when it is one), so the API judges it and names the field; left
    // out at the default, so the body is the one a server without priorities takes.
    if (priority.value !== "5") item.priority = /^-?[0-9]+$/.test(priority.value) ? Number(priority.value) : priority.value;
    const done = await guarded(() => api("queue.produce", { queue_name: info.queue_name, items: [item] }));
    if (done !== undefined) { showNotice("Item produced."); if (state.refresh) await state.refresh(); }
  });
  return form;
}

function clearPanel(info) {
  const scope = { queue: h("input", { type: "checkbox", checked: true, name: "queue" }),
    scheduled: h("input", { type: "checkbox", name: "scheduled" }),
    destructive: h("input", { type: "checkbox", name: "destructive" }) };
  const button = h("button", { type: "button", class: "danger", id: "clear" }, "Clear…");
  button.addEventListener("click", async () => {
    const stats = await guarded(() => api("queue.stats", { queue_name: info.queue_name }));
    if (!stats) return;
    const sums = totals(stats);
    let count = 0;
    if (scope.queue.checked) count += scope.destructive.checked ? sums.ready + sums.leased : sums.ready;
    if (scope.scheduled.checked) count += sums.scheduled;
    const what = [scope.queue.checked ? (scope.destructive.checked ? "ready and leased" : "ready") : null,
      scope.scheduled.checked ? "scheduled" : null].filter(Boolean).join(" and ");
    if (!(await confirmDialog(`Remove ${count} ${what} items from queue "${info.queue_name}"? This cannot be undone.`))) return;
    const body = { queue_name: info.queue_name, queue: scope.queue.checked, scheduled: scope.scheduled.checked,
      destructive: scope.destructive.checked };
    // A large clear answers 454 after ~20 s with what it removed: call again until it is done.
    for (let round = 0; round < 100; round += 1) {
      try {
        await api("queue.clear", body);
        showNotice(`Cleared queue "${info.queue_name}".`);
        break;
      } catch (error) {
        if (!(error instanceof ApiError) || error.status !== 454) { showError(error); break; }
        showNotice(`Clearing… ${error.message}`);
      }
    }
    if (state.refresh) await state.refresh();
  });
  return h("div", { class: "panel", role: "group", "aria-label": "Clear" }, h("h2", {}, "Clear"),
    h("div", { class: "row" }, h("label", { class: "inline" }, scope.queue, "Ready items"),
      h("label", { class: "inline" }, scope.scheduled, "Scheduled items"),
      h("label", { class: "inline" }, scope.destructive, "Leased items too"), button));
}

function redrivePanel(info, sources, all) {
  const target = h("select", { name: "to", "aria-label": "Redrive to" }, sources.map((s) => h("option", { value: s }, s)));
  const progress = h("progress", { max: 1, value: 0, hidden: true, "aria-label": "Redrive progress" });
  const status = h("span", { class: "muted", id: "redrive-status" });
  const button = h("button", { type: "button", id: "redrive-all" }, "Redrive all");
  button.addEventListener("click", async () => {
    const to = target.value;
    const stats = await guarded(() => api("queue.stats", { queue_name: info.queue_name }));
    if (!stats) return;
    const sums = totals(stats);
    const count = sums.ready + sums.scheduled;
    if (!(await confirmDialog(`Move ${count} dead letters from "${info.queue_name}" back to "${to}"?`))) return;
    progress.hidden = false;
    progress.max = Math.max(1, count);
    let moved = 0;
    const report = (n) => { moved += n; progress.value = moved; status.textContent = `${moved} of ${count} moved`; };
    await guarded(async () => {
      if (state.features.redrive) {
        for (let round = 0; round < 100000; round += 1) {
          const reply = await api("queue.redrive", { queue_name: info.queue_name, to, limit: 1000 });
          report(reply.moved || 0);
          if (!reply.remaining || !reply.moved) break;
        }
      } else {
        await moveAll(info, all.find((q) => q.queue_name === to), report);
      }
      showNotice(`Redrive finished: ${moved} moved to "${to}".`);
    });
    if (state.refresh) await state.refresh();
  });
  return h("div", { class: "panel", role: "group", "aria-label": "Redrive" }, h("h2", {}, "Redrive dead letters"),
    h("div", { class: "row" }, h("label", {}, "To", target), button, progress, status));
}

function targetPartition(id, partitions) {
  // The same dead letter always goes to the same partition, so a repeated move is skipped there by
  // its source_id instead of stored twice.
  let hash = 0;
  for (const char of id) hash = (hash * 31 + char.charCodeAt(0)) >>> 0;
  return hash % Math.max(1, partitions);
}

async function moveItems(from, partition, items, target) {
  // Copy into the target (source_id = the dead letter's id, so a repeat is skipped), then delete.
  const groups = new Map();
  const now = Date.now();
  const expire = new Date(now + goDuration(target.expire_timeout) * 1000).toISOString();
  for (const item of items) {
    const p = targetPartition(item.id, target.requested_partitions || 1);
    if (!groups.has(p)) groups.set(p, []);
    groups.get(p).push({ source_id: item.id, attempts: 0, created_at: new Date(now).toISOString(), expire_deadline: expire,
      reference: item.reference, encoding: item.encoding, kind: item.kind, payload: item.payload,
      priority: item.priority ?? 5, group: item.group || undefined,
      // Why it failed stays with it, as queue.redrive keeps it.
      last_reason: item.last_reason || undefined, failures: item.failures || undefined });
  }
  for (const [p, batch] of groups) {
    await api("storage/items.import", { queue_name: target.queue_name, partition: p, items: batch });
  }
  await api("storage/items.delete", { queue_name: from.queue_name, partition, ids: items.map((i) => i.id) });
}

async function moveAll(from, target, report) {
  for (let p = 0; p < (from.requested_partitions || 1); p += 1) {
    for (const path of ["storage/items.list", "storage/scheduled.list"]) {
      for (let round = 0; round < 100000; round += 1) {
        const page = (await api(path, { queue_name: from.queue_name, partition: p, limit: MOVE_CHUNK })).items || [];
        const movable = page.filter((i) => !i.is_leased);
        if (!movable.length) break;
        await moveItems(from, p, movable, target);
        report(movable.length);
      }
    }
  }
}

async function itemsPanel(info, tab, partition, pivot, sources, all) {
  const generation = state.generation;
  const path = tab === "scheduled" ? "storage/scheduled.list" : "storage/items.list";
  const reply = await api(path, { queue_name: info.queue_name, partition, pivot, limit: PAGE_ITEMS + 1 });
  const page = reply.items || [];
  const items = page.slice(0, PAGE_ITEMS);
  const next = page[PAGE_ITEMS];
  const stateFilter = h("select", { "aria-label": "Filter by state" },
    h("option", { value: "" }, "any state"), h("option", { value: "ready" }, "ready"), h("option", { value: "leased" }, "leased"));
  const referenceFilter = h("input", { "aria-label": "Filter by reference", placeholder: "reference contains" });
  const groupFilter = h("input", { "aria-label": "Filter by group", placeholder: "group contains" });
  const body = h("tbody", {});
  const checks = new Map();
  const base = `#/queue/${encodeURIComponent(info.queue_name)}`;
  const link = (changes) => {
    const params = new URLSearchParams({ tab, partition: String(partition), ...changes });
    if (!params.get("pivot")) params.delete("pivot");
    return `${base}?${params}`;
  };
  // A dead-letter queue's items say where they came from; a page where an item failed says why
  // (a page of items that never failed keeps its columns).
  const showSource = sources.length > 0 || items.some((item) => item.source_queue);
  const showFailures = items.some((item) => item.failures || item.last_reason);
  const render = () => {
    const wanted = stateFilter.value;
    const has = (value, filter) => !filter.value || (value || "").toLowerCase().includes(filter.value.toLowerCase());
    body.replaceChildren(...items.filter((item) => {
      if (wanted === "ready" && item.is_leased) return false;
      if (wanted === "leased" && !item.is_leased) return false;
      return has(item.reference, referenceFilter) && has(item.group, groupFilter);
    }).map((item) => {
      if (!checks.has(item.id)) checks.set(item.id, h("input", { type: "checkbox", "aria-label": `Select item ${item.id}` }));
      return h("tr", { "data-id": item.id },
        state.config.read_only ? null : h("td", {}, checks.get(item.id)),
        h("td", { class: "mono" }, h("a", { href: `${base}/item/${partition}/${encodeURIComponent(item.id)}` }, item.id)),
        h("td", {}, item.is_leased ? "leased" : tab === "scheduled" ? "scheduled" : "ready"),
        h("td", { class: "num" }, item.attempts || 0),
        h("td", { class: "num" }, item.priority ?? 5),
        h("td", {}, item.reference || ""),
        h("td", {}, item.group || ""),
        h("td", { class: "num" }, fmtAge(ageOf(item.created_at))),
        h("td", {}, tab === "scheduled" ? item.enqueue_at || "" : item.lease_deadline || ""),
        showSource ? h("td", { class: "source-queue" }, item.source_queue || "") : null,
        showFailures ? h("td", { class: "num failures" }, item.failures || 0) : null,
        showFailures ? h("td", { class: "reason", title: item.last_reason || "" }, item.last_reason || "") : null);
    }));
  };
  stateFilter.addEventListener("change", render);
  referenceFilter.addEventListener("input", render);
  groupFilter.addEventListener("input", render);
  render();
  const selected = () => items.filter((item) => checks.get(item.id) && checks.get(item.id).checked);
  const actions = [];
  if (!state.config.read_only) {
    actions.push(h("button", { type: "button", class: "danger", id: "delete-selected", onclick: async () => {
      const chosen = selected();
      if (!chosen.length) { showError("Select items first."); return; }
      if (!(await confirmDialog(`Delete ${chosen.length} items from queue "${info.queue_name}", partition ${partition}?`))) return;
      const done = await guarded(() => api("storage/items.delete", { queue_name: info.queue_name, partition, ids: chosen.map((i) => i.id) }));
      if (done !== undefined && generation === state.generation) { await route(); showNotice(`Deleted ${chosen.length} items.`); }
    } }, "Delete selected"));
    if (tab === "scheduled") {
      actions.push(h("button", { type: "button", id: "retry-selected", onclick: async () => {
        // "Retry now": the same item, visible at once, at the tail; moved like a dead letter.
        const chosen = selected();
        if (!chosen.length) { showError("Select items first."); return; }
        const done = await guarded(async () => {
          const batch = chosen.map((i) => ({ ...i, enqueue_at: undefined, source_id: i.id }));
          await api("storage/items.import", { queue_name: info.queue_name, partition, items: batch.map(stripListingFields) });
          await api("storage/items.delete", { queue_name: info.queue_name, partition, ids: chosen.map((i) => i.id) });
          return true;
        });
        if (done && generation === state.generation) { await route(); showNotice(`${chosen.length} items are ready now.`); }
      } }, "Retry selected now"));
    }
    if (state.features.reprioritize) {
      // queue.reprioritize: a waiting or scheduled item gets a new id (its place in the new priority),
      // a leased one keeps its id and lease and comes back with the new priority.
      const newPriority = h("input", { type: "number", min: 0, max: 9, step: 1, value: 5, id: "new-priority",
        "aria-label": "New priority (0-9)" });
      actions.push(h("label", { class: "inline" }, "Priority", newPriority),
        h("button", { type: "button", class: "secondary", id: "reprioritize-selected", onclick: async () => {
          const chosen = selected();
          if (!chosen.length) { showError("Select items first."); return; }
          const value = /^[0-9]+$/.test(newPriority.value) ? Number(newPriority.value) : newPriority.value;
          const done = await guarded(() => api("queue.reprioritize",
            { queue_name: info.queue_name, partition, ids: chosen.map((i) => i.id), priority: value }));
          if (done !== undefined && generation === state.generation) {
            await route();
            showNotice(`${chosen.length} items now have priority ${value}.`);
          }
        } }, "Reprioritize selected"));
    }
    if (sources.length) {
      actions.push(h("button", { type: "button", id: "redrive-selected", onclick: async () => {
        const chosen = selected().filter((i) => !i.is_leased);
        if (!chosen.length) { showError("Select items first."); return; }
        const to = sources[0];
        if (!(await confirmDialog(`Move ${chosen.length} dead letters back to "${to}"?`))) return;
        const done = await guarded(async () => { await moveItems(info, partition, chosen, all.find((q) => q.queue_name === to)); return true; });
        if (done && generation === state.generation) { await route(); showNotice(`${chosen.length} dead letters moved to "${to}".`); }
      } }, `Redrive selected to ${sources[0]}`));
    }
  }
  const partitions = Array.from({ length: info.requested_partitions || 1 }, (_, i) => i);
  return h("section", { "aria-label": "Items" },
    h("div", { class: "tabs", role: "tablist" },
      h("button", { type: "button", role: "tab", "aria-selected": String(tab === "items"), onclick: () => { location.hash = link({ tab: "items", pivot: "" }); } }, "Items"),
      h("button", { type: "button", role: "tab", "aria-selected": String(tab === "scheduled"), onclick: () => { location.hash = link({ tab: "scheduled", pivot: "" }); } }, "Scheduled")),
    h("div", { class: "row" },
      h("label", {}, "Partition", h("select", { "aria-label": "Partition", onchange: (e) => { location.hash = link({ partition: e.target.value, pivot: "" }); } },
        partitions.map((p) => h("option", { value: p, selected: p === partition }, p)))),
      h("label", {}, "State", stateFilter), h("label", {}, "Reference", referenceFilter),
      h("label", {}, "Group", groupFilter)),
    h("div", { class: "actions" }, actions),
    h("table", { "aria-label": tab === "scheduled" ? "Scheduled items" : "Items" },
      h("thead", {}, h("tr", {},
        state.config.read_only ? null : h("th", { scope: "col" }, h("span", { class: "muted" }, "Select")),
        h("th", { scope: "col" }, "Id"), h("th", { scope: "col" }, "State"), h("th", { scope: "col", class: "num" }, "Attempts"),
        h("th", { scope: "col", class: "num" }, "Priority"), h("th", { scope: "col" }, "Reference"), h("th", { scope: "col" }, "Group"),
        h("th", { scope: "col", class: "num" }, "Age"),
        h("th", { scope: "col" }, tab === "scheduled" ? "Enqueue at" : "Lease deadline"),
        showSource ? h("th", { scope: "col" }, "Source queue") : null,
        showFailures ? h("th", { scope: "col", class: "num" }, "Failures") : null,
        showFailures ? h("th", { scope: "col" }, "Last reason") : null)),
      body),
    items.length ? null : h("p", { class: "muted" }, "No items here."),
    h("div", { class: "actions" },
      pivot ? h("a", { href: link({ pivot: "" }) }, "First page") : null,
      next ? h("a", { href: link({ pivot: next.id }), id: "next-items" }, "Next page") : null));
}

function stripListingFields(item) {
  const copy = { ...item };
  delete copy.id;
  delete copy.is_leased;
  if (copy.enqueue_at === undefined) delete copy.enqueue_at;
  return copy;
}

async function itemView(view, name, partition, id) {
  let item = null;
  for (const path of ["storage/items.list", "storage/scheduled.list"]) {
    const reply = await api(path, { queue_name: name, partition, pivot: id, limit: 1 });
    const first = (reply.items || [])[0];
    if (first && first.id === id) { item = { ...first, scheduled: path.includes("scheduled") }; break; }
  }
  const back = h("p", {}, h("a", { href: `#/queue/${encodeURIComponent(name)}?partition=${partition}` }, `← ${name}`));
  if (!item) {
    show(view, back, h("h1", {}, "Item not found"),
      h("p", {}, `No item ${id} in partition ${partition} of "${name}": it was completed, retried (a new id), or deleted.`));
    return;
  }
  const bytes = decodePayload(item.payload);
  const views = payloadViews(bytes);
  const formats = ["json", "text", "hex"].filter((f) => views[f] !== undefined);
  const pre = h("pre", { class: "payload", id: "payload", tabindex: 0 });
  const showFormat = (format) => {
    pre.textContent = views[format];
    for (const button of tabs.querySelectorAll("button")) button.setAttribute("aria-selected", String(button.value === format));
  };
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "Payload format" },
    formats.map((f) => h("button", { type: "button", role: "tab", value: f, onclick: () => showFormat(f) }, f === "json" ? "JSON" : f === "text" ? "Text" : "Hex")));
  const field = (label, value) => [h("dt", {}, label), h("dd", { class: "mono" }, value === undefined || value === "" ? "—" : String(value))];
  show(view, back, h("h1", {}, `Item ${id}`),
    h("dl", { class: "fields" },
      field("Queue", name), field("Partition", partition),
      field("State", item.is_leased ? "leased" : item.scheduled ? "scheduled" : "ready"),
      field("Attempts", item.attempts || 0), field("Priority", item.priority ?? 5),
      field("Reference", item.reference), field("Group", item.group), field("Kind", item.kind),
      field("Encoding", item.encoding), field("Source queue", item.source_queue), field("Source id", item.source_id),
      field("Created at", item.created_at),
      field("Enqueue at", item.enqueue_at), field("Lease deadline", item.lease_deadline),
      field("Expire deadline", item.expire_deadline), field("Payload size", `${bytes.length} bytes`),
      field("Failures", item.failures || 0)),
    h("h2", {}, "Last failure"),
    h("p", { class: "reason-full", id: "last-reason" }, item.last_reason || "It never failed."),
    h("h2", {}, "Payload"), tabs, pre);
  showFormat(formats[0]);
}

// ---------------------------------------------------------------------------------------------------
// Start-up and the refresh loop.

function schedule() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
  const every = Number(document.getElementById("refresh").value);
  if (every > 0) {
    state.timer = setInterval(async () => {
      if (!state.refresh || document.hidden) return;
      try { await state.refresh(); } catch (error) { showError(error); }
    }, every);
  }
}

async function start() {
  try {
    const response = await fetch("/console/config.json");
    if (response.ok) Object.assign(state.config, await response.json());
  } catch (_) { /* defaults */ }
  try {
    const openapi = await (await fetch("/openapi.json")).json();
    state.features.redrive = Boolean(openapi.paths && openapi.paths["/v1/queue.redrive"]);
    state.features.reprioritize = Boolean(openapi.paths && openapi.paths["/v1/queue.reprioritize"]);
    const schemas = Object.values((openapi.components && openapi.components.schemas) || {});
    state.features.counters = schemas.some((s) => s && s.properties && "produced" in s.properties && "completed" in s.properties);
  } catch (_) { /* no document: assume the older API */ }
  document.getElementById("target").textContent = state.config.target || location.host;
  document.getElementById("mode").hidden = !state.config.read_only;
  const refresh = document.getElementById("refresh");
  if (state.config.refresh_ms) refresh.value = String(state.config.refresh_ms);
  refresh.addEventListener("change", schedule);
  window.addEventListener("hashchange", route);
  schedule();
  await route();
  document.body.dataset.ready = "true";
}

start();

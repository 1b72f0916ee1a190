// siftmq dashboard: one page, no external assets. Data from /api/* (JSON) and /api/events
// (server-sent events); every value is inserted as text (never as HTML).
"use strict";

const state = { csrf: "", tab: "overview", points: [], interval: 1, hist: [], histSpan: 0, clientQ: "", clientOff: 0, subQ: "", subOff: 0, prefix: null, topicOff: 0, detail: null };
const PAGE = 100;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(k === null || k === undefined ? "" : String(k)));
  return e;
}

function fmt(n) {
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + " M";
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + " k";
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

function bytes(n) { return (n / 1048576).toFixed(1) + " MB"; }

function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  return (d ? d + "d " : "") + (h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}

async function api(path, opts) {
  const r = await fetch(path, Object.assign({ credentials: "same-origin" }, opts || {}));
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// a state-changing call of the admin API (/api/v1/, docs/admin.md): JSON, the CSRF token
async function admin(method, path, body) {
  const opts = { method, headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf } };
  if (body !== undefined) opts.body = JSON.stringify(body);
  return api("/api/v1" + path, opts);
}

async function adminAction(question, done, method, path, body, reload) {
  if (!window.confirm(question)) return;
  try { await admin(method, path, body); $("notice").textContent = done; }
  catch (err) { $("notice").textContent = `failed: ${err.message}`; }
  reload();
}

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = "status " + (cls || ""); }

// ------------------------------------------------------------------ charts (canvas)
// x is time: the server-side history (one point every few seconds, the last 15 minutes) then
// the live points (one a second since the page opened), both with their wall-clock time t
function chartPoints() {
  const live = state.points, first = live.length ? live[0].t : Infinity;
  return state.hist.filter(p => p.t < first).concat(live);
}

function setHistory(h) {
  state.interval = h.interval;
  state.points = h.points;
  if (h.history) { state.hist = h.history.points; state.histSpan = h.history.interval * h.history.capacity; }
  drawCharts();
}

function drawChart(canvas, pts, keys, colors, scale) {
  const series = keys.map(k => pts.map(p => p[k]));
  const dpr = window.devicePixelRatio || 1, w = canvas.clientWidth || 560, h = canvas.clientHeight || 180;
  if (canvas.width !== w * dpr) { canvas.width = w * dpr; canvas.height = h * dpr; }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const left = 48, bottom = h - 18, top = 8, right = w - 6;
  let max = 1;
  for (const s of series) for (const v of s) max = Math.max(max, v * scale);
  const mag = Math.pow(10, Math.floor(Math.log10(max)));
  max = Math.ceil(max / mag) * mag;
  g.strokeStyle = "#dde1e6"; g.fillStyle = "#66707c"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = bottom - (bottom - top) * i / 4;
    g.beginPath(); g.moveTo(left, y); g.lineTo(right, y); g.stroke();
    g.fillText(fmt(max * i / 4), 4, y + 4);
  }
  const end = pts.length ? pts[pts.length - 1].t : Date.now() / 1000;
  const span = Math.max(state.histSpan, 300 * state.interval, pts.length ? end - pts[0].t : 0);
  series.forEach((s, k) => {
    g.strokeStyle = colors[k]; g.lineWidth = 2; g.beginPath();
    s.forEach((v, i) => {
      const x = right - (right - left) * (end - pts[i].t) / span, y = bottom - (bottom - top) * (v * scale) / max;
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
  g.fillStyle = "#66707c";
  g.fillText(span >= 120 ? "−" + Math.round(span / 60) + " min" : "−" + Math.round(span) + " s", left, h - 4);
  g.fillText("now", right - 22, h - 4);
  canvas.dataset.points = String(pts.length);
}

function drawCharts() {
  if (state.tab !== "overview") return;
  const p = chartPoints();
  drawChart($("chart_rates"), p, ["rate_in", "rate_out"], ["#2f6fdf", "#d9692b"], 1);
  drawChart($("chart_conns"), p, ["connections"], ["#2c8a4b"], 1);
  drawChart($("chart_mem"), p, ["memory_rss"], ["#7b4fd0"], 1 / 1048576);
}

// ------------------------------------------------------------------ overview
function kvRows(table, obj) {
  table.replaceChildren(...Object.entries(obj).map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))));
}

function showOverview(ov) {
  $("rate_in").textContent = fmt(ov.rate_in);
  $("rate_out").textContent = fmt(ov.rate_out);
  for (const k of ["clients_connected", "sessions", "publishers_paused", "slow_consumers", "subscriptions", "retained"]) $(k).textContent = fmt(ov[k]);
  $("memory_rss").textContent = bytes(ov.memory_rss);
  $("uptime").textContent = duration(ov.uptime);
  kvRows($("dropped"), ov.dropped);
  kvRows($("sys"), ov.sys);
}

function connectEvents() {
  const es = new EventSource("/api/events");
  es.addEventListener("history", e => setHistory(JSON.parse(e.data)));
  es.addEventListener("overview", e => {
    const ov = JSON.parse(e.data);
    setStatus("live", "live");
    showOverview(ov);
    const last = state.points[state.points.length - 1];
    if (!last || last.t !== ov.t) {
      state.points.push({ t: ov.t, rate_in: ov.rate_in, rate_out: ov.rate_out, connections: ov.clients_connected, memory_rss: ov.memory_rss });
      if (state.points.length > 300) state.points.shift();
    }
    drawCharts();
  });
  es.onerror = () => {
    setStatus("reconnecting…", "down");
    // a refused stream (503: the listener's event streams are all taken) is not retried by
    // the browser itself: open a new one after the Retry-After of the listener (10 s)
    if (es.readyState === EventSource.CLOSED) setTimeout(connectEvents, 10000);
  };
}

// ------------------------------------------------------------------ clients
function pager(div, page, onPage) {
  const last = page.offset + page[Object.keys(page).find(k => Array.isArray(page[k]))].length;
  const prev = el("button", { onclick: () => onPage(Math.max(0, page.offset - page.limit)) }, "‹ prev");
  const next = el("button", { onclick: () => onPage(page.offset + page.limit) }, "next ›");
  prev.disabled = page.offset === 0; next.disabled = last >= page.total;
  div.replaceChildren(prev, `${page.total ? page.offset + 1 : 0}–${last} of ${page.total}`, next);
}

async function loadClients() {
  const page = await api(`/api/clients?q=${encodeURIComponent(state.clientQ)}&offset=${state.clientOff}&limit=${PAGE}`);
  pager($("client_pager"), page, off => { state.clientOff = off; loadClients(); });
  $("client_rows").replaceChildren(...page.clients.map(c => el("tr", { "data-client": c.client_id },
    el("td", {}, el("a", { href: "#clients", onclick: () => showClient(c.client_id) }, c.client_id)),
    el("td", { class: c.connected ? "on" : "off" }, c.connected ? "connected" : "offline"),
    el("td", {}, c.protocol), el("td", { class: "mono" }, c.address || ""), el("td", {}, c.username || ""),
    el("td", {}, c.subscriptions), el("td", {}, c.inflight), el("td", {}, c.queued),
    el("td", {}, c.connected ? el("button", { class: "kick", onclick: () => kick(c.client_id) }, "kick") : ""))));
  if (state.detail) showClient(state.detail);
}

// after a ban the client is gone: its detail closes instead of asking for it again (a 404)
function closeDetail() {
  state.detail = null;
  $("client_detail").hidden = true;
  return loadClients();
}

async function showClient(id) {
  state.detail = id;
  const box = $("client_detail");
  box.hidden = false;
  try {
    const c = await api("/api/clients/" + encodeURIComponent(id));
    const facts = { protocol: c.protocol, address: c.address, user: c.username, state: c.connected ? "connected" : "offline", "keep-alive": c.keep_alive, "clean start": c.clean_start, "session expiry": c.expiry_interval, "expires in": c.expires_in, "will topic": c.will_topic, "in flight": c.inflight, queued: c.queued, "slow consumer": c.slow, "paused publisher": c.paused };
    const kv = el("table", { class: "kv" });
    kvRows(kv, Object.fromEntries(Object.entries(facts).map(([k, v]) => [k, v === null ? "–" : String(v)])));
    const subs = el("table", { class: "list" }, el("tr", {}, el("th", {}, "filter"), el("th", {}, "QoS"), el("th", {}, "selector"), el("th", {}, "entry")),
      ...c.subscription_list.map(s => el("tr", {}, el("td", { class: "mono" }, s.filter), el("td", {}, s.qos ?? ""), el("td", { class: "mono" }, s.selector || ""), el("td", {}, s.negative ? "negative (partial unsubscribe)" : "subscription"))));
    const fl = el("table", { class: "list" }, el("tr", {}, el("th", {}, "packet id"), el("th", {}, "topic"), el("th", {}, "QoS"), el("th", {}, "state")),
      ...c.inflight_list.map(o => el("tr", {}, el("td", {}, o.packet_id), el("td", { class: "mono" }, o.topic), el("td", {}, o.qos), el("td", {}, o.state))));
    const ql = el("table", { class: "list" }, el("tr", {}, el("th", {}, "topic"), el("th", {}, "QoS")),
      ...c.queued_list.map(o => el("tr", {}, el("td", { class: "mono" }, o.topic), el("td", {}, o.qos))));
    const comps = Object.entries(c.composites).map(([n, e]) => el("div", { class: "mono" }, `$composite/${n}: ${e}`));
    box.replaceChildren(el("h3", {}, "Client ", el("code", {}, c.client_id), " ",
      c.connected ? el("button", { class: "kick", onclick: () => kick(c.client_id) }, "kick") : "", " ",
      el("button", { class: "kick", onclick: () => adminAction(`Ban client id ${c.client_id}?`, `banned ${c.client_id}`,
        "POST", "/bans", { kind: "client_id", value: c.client_id, reason: "dashboard" }, closeDetail) }, "ban")),
      kv, el("h4", {}, "Subscriptions"), subs, ...(comps.length ? [el("h4", {}, "Composite subscriptions"), ...comps] : []),
      el("h4", {}, `In flight (${c.inflight})`), fl, el("h4", {}, `Queued (${c.queued})`), ql);
  } catch (err) {
    box.replaceChildren(el("p", { class: "error" }, String(err.message)));
  }
}

async function kick(id) {
  if (!window.confirm(`Disconnect client ${id}?`)) return;
  try {
    await api("/api/kick", { method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf }, body: JSON.stringify({ client_id: id }) });
    $("notice").textContent = `kicked ${id}`;
    if (state.detail === id) { state.detail = null; $("client_detail").hidden = true; }
  } catch (err) {
    $("notice").textContent = `kick failed: ${err.message}`;
  }
  loadClients();
}

// ------------------------------------------------------------------ subscriptions
async function loadSubscriptions() {
  const page = await api(`/api/subscriptions?q=${encodeURIComponent(state.subQ)}&offset=${state.subOff}&limit=${PAGE}`);
  pager($("sub_pager"), page, off => { state.subOff = off; loadSubscriptions(); });
  $("sub_rows").replaceChildren(...page.subscriptions.map(s => el("tr", {},
    el("td", {}, s.client_id), el("td", { class: "mono" }, (s.negative ? "¬ " : "") + s.filter), el("td", {}, s.qos ?? ""), el("td", { class: "mono" }, s.selector || ""))));
  $("composite_rows").replaceChildren(...page.composites.map(c => el("tr", {},
    el("td", {}, c.client_id), el("td", {}, c.name), el("td", { class: "mono" }, c.expression || ""),
    el("td", {}, c.delegated ? "(other node)" : c.window), el("td", {}, c.delegated ? "" : `${c.buffered} / ${c.max_buffer}`),
    el("td", {}, c.events ?? ""), el("td", {}, c.dropped ?? ""), el("td", {}, c.expired ?? ""),
    el("td", { class: "mono" }, c.buffers ? Object.entries(c.buffers).map(([a, n]) => `${a}: ${n}`).join("; ") : ""))));
}

// ------------------------------------------------------------------ topics
function retainedCell(r, topic) {
  if (!r) return "";
  const del = el("button", { class: "kick", onclick: () => adminAction(`Delete the retained message of ${topic}?`,
    `deleted ${topic}`, "DELETE", `/retained?topic=${encodeURIComponent(topic)}`, undefined, loadTopics) }, "delete");
  if (r.hidden) return el("span", { class: "hidden-payload" }, `${r.size} bytes (hidden: ${r.hidden}) `, del);
  const p = r.payload;
  const shown = p.text !== undefined ? p.text : "hex " + p.hex;
  return el("div", {}, el("span", { class: "off" }, `QoS ${r.qos}, ${r.size} bytes${p.truncated ? " (cut)" : ""} `), del, el("pre", {}, shown));
}

async function loadTopics() {
  const q = state.prefix === null ? "" : `prefix=${encodeURIComponent(state.prefix)}&`;
  const page = await api(`/api/topics?${q}offset=${state.topicOff}&limit=200`);
  const crumbs = [el("a", { href: "#topics", onclick: () => browse(null) }, "(top)")];
  if (state.prefix !== null) {
    const parts = state.prefix.split("/");
    parts.forEach((p, i) => { const pre = parts.slice(0, i + 1).join("/"); crumbs.push("/", el("a", { href: "#topics", onclick: () => browse(pre) }, p || "(empty)")); });
  }
  $("topic_path").replaceChildren(...crumbs);
  $("topic_here").replaceChildren(page.retained ? el("div", {}, el("b", {}, state.prefix), retainedCell(page.retained, state.prefix)) : "");
  $("topic_here").hidden = !page.retained;
  pager($("topic_pager"), page, off => { state.topicOff = off; loadTopics(); });
  $("topic_rows").replaceChildren(...page.levels.map(l => el("tr", {},
    el("td", { class: "mono" }, l.children ? el("a", { href: "#topics", onclick: () => browse(l.topic) }, (l.level || "(empty)") + "/") : (l.level || "(empty)")),
    el("td", {}, retainedCell(l.retained, l.topic)))));
}

function browse(prefix) { state.prefix = prefix; state.topicOff = 0; loadTopics(); }

// ------------------------------------------------------------------ bridges
function since(t) { return t ? new Date(t * 1000).toLocaleString() : ""; }

function counts(o) { return Object.entries(o).filter(([, n]) => n).map(([k, n]) => `${k} ${fmt(n)}`).join(", ") || "0"; }

async function loadBridges() {
  const { bridges } = await api("/api/bridges");
  $("bridges_none").hidden = bridges.length > 0;
  $("bridge_rows").replaceChildren(...bridges.map(b => el("tr", { "data-bridge": b.name },
    el("td", { class: "mono" }, b.name),
    el("td", { class: b.connected ? "on" : "off", title: b.connected ? `since ${since(b.connected_since)}` : "" }, b.connected ? "connected" : "down"),
    el("td", { class: "mono", title: b.remotes.join("\n") }, b.remote || b.remotes[0]),
    el("td", {}, b.protocol),
    el("td", {}, fmt(b.queued.messages) + (b.queued.bytes === null ? "" : ` (${fmt(b.queued.bytes)} B)`)),
    el("td", {}, fmt(b.sent)),
    el("td", {}, fmt(b.received)),
    el("td", { title: "filtered: a rule's content filter; queue_bound: the bridge's queue bound; too_large: bigger than the remote's maximum packet size; no_rule: no rule matches; refused: refused by the destination" }, counts(b.dropped)),
    el("td", {}, fmt(b.reconnects)),
    el("td", {}, counts(b.failures)),
    el("td", { class: b.last_error ? "error" : "", title: b.last_error ? since(b.last_error.at) : "" }, b.last_error ? b.last_error.text : ""),
    el("td", {}, el("button", { class: "reconnect", onclick: () => adminAction(`Reconnect bridge ${b.name}?`, `reconnecting ${b.name}`, "POST", `/bridges/${encodeURIComponent(b.name)}/reconnect`, undefined, () => loadBridges().catch(() => {})) }, "reconnect")))));
}

// ------------------------------------------------------------------ cluster
async function loadCluster() {
  const c = await api("/api/cluster");
  const body = $("cluster_body");
  if (!c.clustered) { body.replaceChildren(el("p", {}, "This broker is not clustered (siftmq serve --cluster-listen … to join one).")); return; }
  const parts = [];
  for (const [name, section] of Object.entries(c)) {
    if (name === "clustered") continue;
    parts.push(el("h2", {}, name));
    for (const [k, v] of Object.entries(section)) {
      if (Array.isArray(v) && v.length && typeof v[0] === "object") {
        const cols = Object.keys(v[0]);
        parts.push(el("h3", {}, k), el("table", { class: "list" }, el("tr", {}, ...cols.map(x => el("th", {}, x))),
          ...v.map(row => el("tr", {}, ...cols.map(x => el("td", { class: "mono" }, String(row[x])))))));
      } else if (Array.isArray(v)) {
        parts.push(el("h3", {}, `${k} (${v.length})`), el("pre", {}, v.join("\n")));
      } else {
        parts.push(el("div", {}, el("b", {}, k + ": "), el("span", { class: "mono" }, String(v))));
      }
    }
  }
  body.replaceChildren(...parts);
}

// ------------------------------------------------------------------ tabs
const loaders = { overview: async () => drawCharts(), clients: loadClients, subscriptions: loadSubscriptions, topics: loadTopics, bridges: loadBridges, cluster: loadCluster };

function show(tab) {
  if (!loaders[tab]) tab = "overview";
  state.tab = tab;
  for (const s of document.querySelectorAll("section.tab")) s.hidden = s.id !== tab;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
  loaders[tab]().catch(err => setStatus(String(err.message), "down"));
}

async function main() {
  try {
    const s = await api("/api/session");
    state.csrf = s.csrf;
    $("who").textContent = s.user ? `user ${s.user}` : "loopback (no login)";
    if (s.node) document.title = `siftmq ${s.node.slice(0, 8)}`;
  } catch (err) {
    setStatus(String(err.message), "down");
    return;
  }
  $("client_search").addEventListener("submit", e => { e.preventDefault(); state.clientQ = $("client_q").value; state.clientOff = 0; loadClients(); });
  $("sub_search").addEventListener("submit", e => { e.preventDefault(); state.subQ = $("sub_q").value; state.subOff = 0; loadSubscriptions(); });
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  setInterval(() => { if (state.tab === "clients") loadClients().catch(() => {}); }, 5000);
  setInterval(() => { if (state.tab === "bridges") loadBridges().catch(() => {}); }, 2000);
  // the live points cover the last 5 minutes: the server-side history fills what is older
  setInterval(() => { if (state.tab === "overview") api("/api/history").then(setHistory).catch(() => {}); }, 60000);
  show(location.hash.slice(1) || "overview");
  connectEvents();
  document.body.dataset.ready = "1";
}

main();

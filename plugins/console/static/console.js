// The modelcall console: reads /-/events (server-sent events of the bus) and draws the call.
// Plain script, no build step, talks to this server only. Server times are the engine's monotonic
// clock (seconds); browser times are performance.now() (ms). They are never mixed in one figure.
"use strict";

const $ = (id) => document.getElementById(id);
const reqs = new Map();           // request id -> what the feed said about it
const totals = { admitted: 0, refused: 0, finished: 0, tools: 0 };
const series = [];                // [{t, use, hit}] one point per tick, server time
const hitWindow = [];             // [cached, prompt] of the viewer's last requests
let kvUse = null, serverNow = null, serverAt = 0, model = null, feedAbort = null;
const admittedTimes = [];

function key() { return sessionStorage.getItem("modelcall-key") || ""; }
function authHeaders() { const k = key(); return k ? { Authorization: "Bearer " + k } : {}; }
function nowServer() { return serverNow === null ? null : serverNow + (performance.now() - serverAt) / 1000; }
function ms(s) { return s === null || s === undefined || !isFinite(s) ? "—" : (s * 1000).toFixed(1) + " ms"; }
function status(text, state) { const el = $("status"); el.textContent = text; el.dataset.state = state; }

function req(rid) {
  let r = reqs.get(rid);
  if (!r) {
    r = { rid, task: null, received: null, admitted: null, scheduled: null, firstToken: null, firstText: null,
          lastToken: null, finished: null, sent: null, reason: null, usage: null, prompt: 0, stage: null,
          tokTimes: [], tools: new Map(), outputTokens: 0 };
    reqs.set(rid, r);
    if (reqs.size > 400) reqs.delete(reqs.keys().next().value);
  }
  return r;
}

// ---- the feed --------------------------------------------------------------------------------

function apply(ev) {
  const t = ev.type;
  if (t === "StepDone") { kvUse = ev.kv_usage; serverNow = ev.ts; serverAt = performance.now(); return; }
  const r = req(ev.request_id);
  if (ev.task_id) r.task = ev.task_id;
  switch (t) {
    case "RequestAdmitted":
      r.admitted = ev.ts; r.received = r.received ?? ev.ts; r.prompt = ev.prompt_tokens; r.stage = "queue";
      totals.admitted++; admittedTimes.push(performance.now());
      for (const id of ev.tool_results || []) for (const q of reqs.values()) { const c = q.tools.get(id); if (c && c.done === null) c.done = ev.ts; }
      break;
    case "RequestQueued": break;
    case "RequestScheduled":
      r.scheduled = r.scheduled ?? ev.ts; r.stage = "prefill";
      hitWindow.push([ev.cached_tokens, r.prompt || 0]); if (hitWindow.length > 20) hitWindow.shift();
      break;
    case "PrefillDone": r.firstToken = r.firstToken ?? ev.ts; r.stage = "decode"; break;
    case "TokensEmitted":
      if (ev.token_ids.length) { r.tokTimes.push(ev.ts); r.lastToken = ev.ts; r.outputTokens += ev.token_ids.length; }
      if (ev.text && r.firstText === null) r.firstText = ev.ts;
      break;
    case "Preempted": r.stage = "queue"; break;
    case "ToolRequested":
      r.tools.set(ev.call_id, { name: ev.name, requested: ev.ts, start: null, done: null, ok: null }); totals.tools++;
      break;
    case "ToolExecuted": case "ToolFailed": {
      const c = r.tools.get(ev.call_id) || { name: ev.name, requested: ev.ts - ev.duration_s };
      c.start = ev.ts - ev.duration_s; c.done = ev.ts; c.ok = t === "ToolExecuted"; r.tools.set(ev.call_id, c);
      break;
    }
    case "Finished": {
      const tm = ev.timings;
      Object.assign(r, { received: tm.received, admitted: tm.admitted, scheduled: tm.scheduled, firstToken: tm.first_token,
                         lastToken: tm.last_token, finished: tm.finished, reason: ev.reason, usage: ev.usage, stage: "output" });
      totals.finished++;
      setTimeout(() => { if (r.stage === "output") r.stage = null; }, 3000);  // embedded requests send no ResponseSent
      break;
    }
    case "ResponseSent": r.sent = ev.ts; if (r.stage === "output") r.stage = null; break;
    case "RequestFailed": r.finished = ev.ts; r.reason = "error"; r.stage = null; break;
    case "RequestRejected": totals.refused++; reqs.delete(ev.request_id); return;
  }
  serverNow = Math.max(serverNow ?? ev.ts, ev.ts); serverAt = performance.now();
  if (playground.rid === ev.request_id) showMoments();
}

function onSnapshot(s) {
  model = s.model; $("model").textContent = s.model; serverNow = s.server_now; serverAt = performance.now();
  if (s.kv && s.kv.usage !== undefined) kvUse = s.kv.usage;
  for (const l of s.live) { const r = req(l.request_id); r.stage = l.stage; r.task = l.task_id; r.admitted = l.admitted; r.received = l.admitted; r.prompt = l.prompt_tokens || 0; }
}

async function connect() {
  if (feedAbort) feedAbort.abort();
  const ctl = feedAbort = new AbortController();
  status("connecting", "connecting");
  try {
    const resp = await fetch("/-/events", { headers: authHeaders(), signal: ctl.signal, cache: "no-store" });
    if (resp.status === 401) { status("needs an API key", "error"); return; }
    if (!resp.ok) { status("feed: HTTP " + resp.status, "error"); return; }
    status("live", "live");
    for await (const frame of sseFrames(resp.body)) {
      if (frame.event === "snapshot") onSnapshot(JSON.parse(frame.data));
      else if (frame.event === "dropped") status("live (dropped " + frame.data + " events)", "live");
      else if (frame.data) apply(JSON.parse(frame.data));
    }
    status("feed ended", "error");
  } catch (e) {
    if (ctl.signal.aborted) return;
    status("feed lost", "error");
  }
  if (!ctl.signal.aborted) setTimeout(connect, 2000);
}

async function* sseFrames(body) {
  const reader = body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const raw = buf.slice(0, i); buf = buf.slice(i + 2);
      const f = { event: null, data: "" };
      for (const line of raw.split("\n")) {
        if (line.startsWith("event: ")) f.event = line.slice(7);
        else if (line.startsWith("data: ")) f.data += line.slice(6);
      }
      if (f.event || f.data) yield f;
    }
  }
}

// ---- drawing ---------------------------------------------------------------------------------

function drawFlow() {
  const n = { queue: 0, prefill: 0, decode: 0, output: 0, tools: 0 };
  for (const r of reqs.values()) {
    if (r.stage && r.stage in n) n[r.stage]++;
    for (const c of r.tools.values()) if (c.done === null) n.tools++;
  }
  const t = performance.now();
  while (admittedTimes.length && t - admittedTimes[0] > 5000) admittedTimes.shift();
  $("n-entry").textContent = (admittedTimes.length / 5).toFixed(1) + "/s";
  for (const k of Object.keys(n)) {
    $("n-" + k).textContent = n[k];
    document.querySelector(`.stage[data-stage="${k}"]`).classList.toggle("active", n[k] > 0);
  }
  $("n-kv").textContent = kvUse === null ? "KV cache —" : `KV cache ${(kvUse * 100).toFixed(1)}% used`;
  for (const k of Object.keys(totals)) $("t-" + k).textContent = totals[k];
}

function hitRate() {
  let c = 0, p = 0;
  for (const [a, b] of hitWindow) { c += a; p += b; }
  return p ? c / p : null;
}

function drawKV() {
  const t = nowServer();
  if (t === null) return;
  series.push({ t, use: kvUse, hit: hitRate() });
  while (series.length > 240) series.shift();
  // the window grows with the page's age up to two minutes, so a fresh page's chart is not a dot
  const t0 = Math.max(t - 120, series[0].t), span = Math.max(t - t0, 10);
  const pts = (k) => series.filter((p) => p[k] !== null && p.t >= t0)
    .map((p) => `${((p.t - t0) / span * 960).toFixed(1)},${(150 - p[k] * 140).toFixed(1)}`).join(" ");
  $("kv-use").setAttribute("points", pts("use"));
  $("kv-hit").setAttribute("points", pts("hit"));
  $("kv-use-now").textContent = kvUse === null ? "—" : (kvUse * 100).toFixed(1) + "%";
  const h = hitRate();
  $("kv-hit-now").textContent = h === null ? "—" : (h * 100).toFixed(1) + "%";
}

function segments(r, now) {
  const end = (x) => x ?? now;
  const out = [];
  if (r.admitted !== null) out.push(["queue", r.admitted, end(r.scheduled)]);
  if (r.scheduled !== null) out.push(["prefill", r.scheduled, end(r.firstToken)]);
  if (r.firstToken !== null) out.push(["decode", r.firstToken, r.finished !== null ? (r.lastToken ?? r.finished) : end(r.lastToken)]);
  if (r.finished !== null && r.reason !== "error") out.push(["streaming", r.lastToken ?? r.finished, r.sent ?? r.finished]);
  for (const c of r.tools.values()) out.push(["tools", c.start ?? c.requested, end(c.done), c.name]);
  return out.filter((s) => s[1] !== null && s[2] !== null);
}

function itl(r) {
  const g = [];
  for (let i = 1; i < r.tokTimes.length; i++) g.push(r.tokTimes[i] - r.tokTimes[i - 1]);
  return g.length ? g.reduce((a, b) => a + b, 0) / g.length : null;
}

function drawWaterfall() {
  const now = nowServer();
  const shown = [...reqs.values()].filter((r) => r.admitted !== null).slice(-30);
  const box = $("waterfall");
  if (!shown.length) return;
  let lo = Infinity, hi = -Infinity;
  for (const r of shown) for (const s of segments(r, now)) { lo = Math.min(lo, r.received ?? s[1], s[1]); hi = Math.max(hi, s[2]); }
  const span = Math.max(hi - lo, 1e-3);
  const x = (v) => ((v - lo) / span * 100).toFixed(3) + "%";
  const groups = new Map();
  for (const r of shown) { const g = r.task ? "task " + r.task : "request " + r.rid; if (!groups.has(g)) groups.set(g, []); groups.get(g).push(r); }
  const frag = document.createDocumentFragment();
  const head = document.createElement("p"); head.className = "dim"; head.textContent = `window ${ms(span)} · ${shown.length} request(s)`;
  frag.append(head);
  for (const [name, rows] of groups) {
    const g = document.createElement("div"); g.className = "task";
    if (name.startsWith("task ")) {
      const first = Math.min(...rows.map((r) => r.received ?? r.admitted));
      const last = Math.max(...rows.map((r) => r.sent ?? r.finished ?? now));
      const h = document.createElement("div"); h.className = "task-head";
      h.textContent = `${name}: ${rows.length} model request(s), ${ms(last - first)} wall`;
      g.append(h);
    }
    for (const r of rows) g.append(row(r, now, x));
    frag.append(g);
  }
  box.replaceChildren(frag);
}

function row(r, now, x) {
  const el = document.createElement("div"); el.className = "row"; el.dataset.rid = r.rid;
  const id = document.createElement("span"); id.className = "rid"; id.textContent = r.rid; id.title = r.rid;
  const track = document.createElement("div"); track.className = "track";
  for (const [stage, a, b, name] of segments(r, now)) {
    const s = document.createElement("div"); s.className = "seg"; s.dataset.stage = stage;
    s.dataset.start = a; s.dataset.end = b;
    s.style.left = x(a); s.style.width = `calc(${x(b)} - ${x(a)})`;
    s.title = `${name ? "tool " + name : stage}: ${ms(b - a)}`;
    track.append(s);
  }
  for (const [sym, at, what] of [["▲", r.firstToken, "engine first token"], ["◆", r.firstText, "first content text sent"]]) {
    if (at === null) continue;
    const m = document.createElement("span"); m.className = "mark"; m.textContent = sym; m.style.left = x(at);
    m.title = `${what}: ${ms(at - (r.received ?? r.admitted))} after received`; track.append(m);
  }
  const figs = document.createElement("span"); figs.className = "figs";
  const base = r.received ?? r.admitted;
  const since = (at) => (at === null ? "—" : ((at - base) * 1000).toFixed(1));
  figs.textContent = `ttft ${since(r.firstToken)} · text ${since(r.firstText)} · itl ${ms(itl(r))}`
    + ` · ${r.usage ? r.usage.completion_tokens : r.outputTokens} tok${r.reason ? " · " + r.reason : ""}`;
  figs.title = "ttft: engine first token, text: first content text sent (ms after the server received the request); "
    + "itl: mean engine inter-token latency";
  el.append(id, track, figs);
  return el;
}

// ---- playground ------------------------------------------------------------------------------

const playground = { rid: null, t0: 0, firstEvent: null, firstContent: null, events: [] };

function logEvent(label, detail) {
  const li = document.createElement("li");
  const b = document.createElement("b"); b.textContent = label;
  li.append(`+${(performance.now() - playground.t0).toFixed(1)} ms `, b, detail ? " " + detail : "");
  $("play-events").append(li); li.scrollIntoView({ block: "nearest" });
}

function showMoments() {
  const p = playground, r = p.rid ? reqs.get(p.rid) : null;
  if (r && r.firstToken !== null && r.received !== null) $("m-engine").textContent = ms(r.firstToken - r.received);
  if (r) $("m-itl").textContent = ms(itl(r));
  $("m-event").textContent = p.firstEvent === null ? "—" : (p.firstEvent - p.t0).toFixed(1) + " ms";
  $("m-content").textContent = p.firstContent === null ? "—" : (p.firstContent - p.t0).toFixed(1) + " ms";
  const e = p.events;
  $("m-gap").textContent = e.length > 1 ? ((e[e.length - 1] - e[0]) / (e.length - 1)).toFixed(1) + " ms" : "—";
}

async function play(ev) {
  ev.preventDefault();
  const send = $("send"); send.disabled = true;
  Object.assign(playground, { rid: null, t0: performance.now(), firstEvent: null, firstContent: null, events: [] });
  $("answer").textContent = ""; $("reasoning").textContent = ""; $("play-events").replaceChildren();
  for (const id of ["m-engine", "m-event", "m-content", "m-itl", "m-gap"]) $(id).textContent = "—";
  const body = { model: model || undefined, stream: true, stream_options: { include_usage: true },
                 max_tokens: Number($("max-tokens").value) || 32, messages: [{ role: "user", content: $("prompt").value }] };
  try {
    const resp = await fetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", "x-modelcall-task-id": "playground", ...authHeaders() } });
    const xid = resp.headers.get("X-Request-Id") || "";
    playground.rid = xid.replace(/^chatcmpl-/, "") || null;
    logEvent("HTTP " + resp.status, xid);
    if (!resp.ok) { logEvent("error", (await resp.text()).slice(0, 200)); return; }
    for await (const f of sseFrames(resp.body)) {
      const t = performance.now();
      if (playground.firstEvent === null) playground.firstEvent = t;
      playground.events.push(t);
      if (f.data === "[DONE]") { logEvent("[DONE]"); continue; }
      const chunk = JSON.parse(f.data);
      if (chunk.usage) logEvent("usage", `${chunk.usage.prompt_tokens} in, ${chunk.usage.completion_tokens} out`);
      for (const c of chunk.choices || []) {
        const d = c.delta || {};
        if (d.role) logEvent("role", d.role);
        if (d.reasoning_content) { $("reasoning").textContent += d.reasoning_content; logEvent("reasoning", JSON.stringify(d.reasoning_content)); }
        if (d.tool_calls) logEvent("tool_call", JSON.stringify(d.tool_calls).slice(0, 120));
        if (d.content) {
          if (playground.firstContent === null) playground.firstContent = t;
          $("answer").textContent += d.content; logEvent("content", JSON.stringify(d.content));
        }
        if (c.finish_reason) logEvent("finish", c.finish_reason);
      }
      showMoments();
    }
  } catch (e) {
    logEvent("error", String(e));
  } finally {
    send.disabled = false; showMoments();
  }
}

// ---- start -----------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("key").value = key();
  $("keyform").addEventListener("submit", (e) => { e.preventDefault(); sessionStorage.setItem("modelcall-key", $("key").value.trim()); connect(); });
  $("play").addEventListener("submit", play);
  connect();
  setInterval(() => { drawFlow(); drawWaterfall(); }, 250);
  setInterval(drawKV, 500);
});

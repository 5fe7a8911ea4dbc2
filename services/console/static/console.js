// The hookbus console: plain JS, no build step. Every value from the server is put in the
// page as text (textContent), never as HTML. The admin key lives in this tab's
// sessionStorage and travels as a bearer header on each call, the live stream included
// (a streamed fetch: EventSource cannot send headers).
"use strict";

const API = "/console/api";
const KEY_SLOT = "hookbus-console-key";
const state = { snapshot: null, live: false, notice: null, letter: null, showContent: false, waterfall: null };

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "className") node.className = value;
    else if (name === "style") Object.assign(node.style, value); // CSSOM: allowed by the page's CSP
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function headers(extra) {
  const key = sessionStorage.getItem(KEY_SLOT);
  return Object.assign(key ? { Authorization: `Bearer ${key}` } : {}, extra || {});
}

function show(main, ...children) {
  main.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

class Refused extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options) {
  const response = await fetch(API + path, Object.assign({ headers: headers(), cache: "no-store" }, options || {}));
  if (response.status === 204) return null;
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (body.error && body.error.message) || response.statusText;
    if (response.status === 401 || response.status === 403) askForKey(message);
    throw new Refused(response.status, message);
  }
  return body;
}

// ------------------------------------------------------------------ sign in

function askForKey(why) {
  document.getElementById("login").hidden = false;
  document.getElementById("view").hidden = true;
  document.getElementById("login-why").textContent = why;
  setLive(false, "signed out");
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_SLOT, document.getElementById("key").value.trim());
  document.getElementById("key").value = "";
  start();
});

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_SLOT);
  location.reload();
});

// ------------------------------------------------------------------ live stream

function setLive(on, text) {
  const badge = document.getElementById("live");
  badge.className = `live ${on ? "on" : "off"}`;
  badge.textContent = text;
}

let stream = null;

async function follow() {
  if (stream) stream.abort();
  stream = new AbortController();
  try {
    const response = await fetch(`${API}/live`, { headers: headers(), signal: stream.signal, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      const body = await response.json().catch(() => ({}));
      askForKey((body.error && body.error.message) || "Sign in");
      return;
    }
    if (!response.ok || !response.body) throw new Error(response.statusText);
    document.getElementById("login").hidden = true;
    document.getElementById("view").hidden = false;
    document.getElementById("sign-out").hidden = !sessionStorage.getItem(KEY_SLOT);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return follow(); // the server ends each stream after a while: open the next at once
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (data) onSnapshot(JSON.parse(data));
      }
    }
  } catch (error) {
    if (error.name === "AbortError") return;
    console.error("hookbus console: live stream:", error);
  }
  setLive(false, "reconnecting…");
  setTimeout(follow, 2000);
}

function onSnapshot(snapshot) {
  state.snapshot = snapshot;
  setLive(true, `live · ${new Date(snapshot.bus.at * 1000).toLocaleTimeString()}`);
  render();
}

// ------------------------------------------------------------------ formatting

function ago(seconds) {
  if (seconds < 1) return "now";
  if (seconds < 60) return `${seconds.toFixed(0)} s ago`;
  return `${(seconds / 60).toFixed(1)} min ago`;
}
function span(seconds) {
  if (seconds < 60) return `${seconds.toFixed(0)} s`;
  if (seconds < 3600) return `${(seconds / 60).toFixed(0)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}
function ms(value) { return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(1)} ms`; }
function clock(ts) { return new Date(ts * 1000).toLocaleTimeString(); }
function statusText(request) { return request.status === null ? request.outcome : `${request.status} ${request.outcome}`; }

// ------------------------------------------------------------------ views

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  return { view: parts[0] || "bus", id: parts.slice(1).join("/") || null };
}

function render() {
  const { view, id } = route();
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === view);
  const main = document.getElementById("view");
  if (view === "requests" && id) return renderWaterfall(main, id);
  if (!state.snapshot) return;
  if (view === "requests") return renderRequests(main);
  if (view === "dead-letters") return renderDeadLetters(main);
  return renderBus(main);
}

function card(label, value, bad) {
  return h("div", { className: `card${bad ? " bad" : ""}` }, h("div", { className: "label" }, label), h("div", { className: "value" }, value));
}

function renderBus(main) {
  const bus = state.snapshot.bus;
  const errors = Object.entries(bus.errors_by_status);
  const withVersion = bus.groups.some((g) => g.replicas.some((r) => r.version));
  show(main, 
    h("h1", {}, "Bus"),
    h("div", { className: "cards" },
      card("requests / s (last minute)", bus.requests_per_second.toFixed(2)),
      card("finished (last minute)", bus.finished_last_minute),
      card("errors by status", errors.length ? errors.map(([s, n]) => `${s}: ${n}`).join("  ") : "none", errors.length > 0),
      card("request queue lag / pending", `${bus.requests_lag} / ${bus.requests_pending}`, bus.requests_lag > 0),
      card("dead letters", bus.dead_letters, bus.dead_letters > 0),
      card("orchestrators", bus.orchestrators.length, bus.orchestrators.length === 0),
    ),
    bus.agents.length ? [
      h("h2", {}, "Agents"),
      h("table", { "data-testid": "agents" },
        h("tr", {}, ["agent", "orchestrators", "queue lag / pending", "requests / s", "errors (last minute)"].map((t) => h("th", {}, t))),
        bus.agents.map((a) => h("tr", { "data-agent": a.name, className: a.orchestrators.length ? "" : "failed" },
          h("td", { className: "mono" }, a.name),
          h("td", {}, a.orchestrators.length ? String(a.orchestrators.length) : "none live"),
          h("td", {}, `${a.lag} / ${a.pending}`), h("td", {}, a.requests_per_second.toFixed(2)),
          h("td", {}, a.errors_last_minute))),
      ),
    ] : null,
    h("h2", {}, "Worker groups"),
    bus.groups.length ? bus.groups.map((g) => groupCard(g, withVersion)) : h("p", { className: "muted" }, "No worker group is registered."),
    h("h2", {}, "Orchestrators"),
    h("table", { "data-testid": "orchestrators" },
      h("tr", {}, h("th", {}, "instance"), h("th", {}, "last heartbeat")),
      bus.orchestrators.map((o) => h("tr", {}, h("td", { className: "mono" }, o.name), h("td", {}, ago(o.heartbeat_age)))),
    ),
  );
}

function groupCard(group, withVersion) {
  const badges = [];
  if (!group.live) badges.push(h("span", { className: "badge bad" }, "no live replica"));
  else badges.push(h("span", { className: "badge" }, `${group.replicas.length} live`));
  if (group.behind) badges.push(h("span", { className: "badge warn" }, "falling behind"));
  // observations its backlog bound dropped, oldest first (its observers stopped or too slow)
  if (group.observe_dropped) {
    badges.push(h("span", { className: "badge bad", "data-testid": "observe-dropped" },
      `${group.observe_dropped} observations dropped`));
  }
  return h("section", { className: `group${group.live ? "" : " dead"}${group.behind ? " behind" : ""}`, "data-group": group.name },
    h("div", { className: "title" },
      h("span", { className: "name" }, group.name), badges,
      h("span", {}, `lag ${group.lag}`), h("span", {}, `pending ${group.pending}`),
      group.observe_lag ? h("span", {}, `observer lag ${group.observe_lag}`) : null,
    ),
    h("div", { className: "muted mono" }, [...group.hooks, ...group.tools.map((t) => `tool:${t}`)].join("  ")),
    group.replicas.length ? h("table", {},
      h("tr", {}, h("th", {}, "replica"), withVersion && h("th", {}, "version"), h("th", {}, "up for"), h("th", {}, "in flight"), h("th", {}, "last heartbeat")),
      group.replicas.map((r) => h("tr", { "data-replica": r.name },
        h("td", { className: "mono" }, r.name), withVersion && h("td", {}, r.version || "-"),
        // a worker that does not say when it started: how long this console has seen it (at least its age)
        r.up_for === null
          ? h("td", { className: "up-for", title: "seen for (the worker does not say when it started)" }, `≥ ${span(r.seen_for)}`)
          : h("td", { className: "up-for" }, span(r.up_for)),
        h("td", {}, r.in_flight), h("td", {}, ago(r.heartbeat_age)))),
    ) : null,
  );
}

const filters = { outcome: "", group: "", caller: "", agent: "" };

function renderRequests(main) {
  const matching = state.snapshot.requests.filter((r) =>
    (!filters.outcome || (filters.outcome === "error" ? !["ok", "running"].includes(r.outcome) : r.outcome === filters.outcome || String(r.status) === filters.outcome)) &&
    (!filters.group || r.groups.includes(filters.group)) &&
    (!filters.caller || r.caller === filters.caller) &&
    (!filters.agent || r.agent === filters.agent));
  const focused = document.activeElement && document.activeElement.dataset.filter;
  const input = (name, placeholder) => h("input", {
    "data-filter": name, placeholder, value: filters[name],
    oninput: (e) => { filters[name] = e.target.value.trim(); render(); },
  });
  const outcome = h("select", { "data-filter": "outcome", onchange: (e) => { filters.outcome = e.target.value; render(); } },
    ["", "running", "ok", "error", "failed"].map((v) => h("option", { value: v, selected: v === filters.outcome }, v || "any status")));
  show(main, 
    h("h1", {}, "Requests"),
    h("div", { className: "filters" }, outcome, input("agent", "agent"), input("group", "group"), input("caller", "caller"),
      h("span", { className: "muted" }, `${matching.length} of the ${state.snapshot.requests.length} newest`)),
    h("table", { "data-testid": "requests" },
      h("tr", {}, ["completion id", "model", "agent", "caller", "status", "duration", "groups", "started"].map((t) => h("th", {}, t))),
      matching.map((r) => h("tr", {
        className: `clickable ${r.outcome === "ok" ? "ok" : r.outcome === "running" ? "running" : "failed"}`,
        "data-completion-id": r.completion_id,
        onclick: () => { location.hash = `#/requests/${encodeURIComponent(r.completion_id)}`; },
      },
        h("td", { className: "mono" }, r.completion_id), h("td", {}, r.model || "-"), h("td", {}, r.agent || "-"),
        h("td", {}, r.caller || "-"),
        h("td", { className: "status" }, statusText(r)), h("td", {}, ms(r.duration_ms)),
        h("td", {}, r.groups.join(", ")), h("td", {}, clock(r.started)))),
    ),
  );
  if (focused) {
    const again = main.querySelector(`[data-filter="${focused}"]`);
    if (again) { again.focus(); if (again.setSelectionRange) again.setSelectionRange(again.value.length, again.value.length); }
  }
}

async function renderWaterfall(main, completionId) {
  const known = state.waterfall && state.waterfall.request.completion_id === completionId;
  if (!known || state.waterfall.request.outcome === "running" || !state.waterfallShown) {
    try {
      state.waterfall = await api(`/requests/${encodeURIComponent(completionId)}`);
    } catch (error) {
      if (error.status === 404) show(main, h("h1", {}, "Request"), h("p", { className: "error-box" }, error.message));
      return;
    }
  }
  if (route().id !== completionId) return;
  state.waterfallShown = state.waterfall.request.outcome !== "running";
  const { request, steps } = state.waterfall;
  const t0 = Math.min(request.started, ...steps.map((s) => s.start));
  const t1 = Math.max(request.started + request.duration_ms / 1000, ...steps.map((s) => s.start + s.duration_ms / 1000));
  const total = Math.max(t1 - t0, 0.001);
  const kind = (s) => (s.lifecycle === "llm_call" ? "llm" : s.lifecycle === "tool_call" ? "tool" : s.kind);
  show(main, 
    h("h1", {}, "Request ", h("span", { className: "mono" }, request.completion_id)),
    h("div", { className: "summary" },
      h("div", {}, h("span", {}, "status"), h("b", { className: request.outcome === "ok" || request.outcome === "running" ? "" : "outcome-bad", "data-testid": "request-status" }, statusText(request))),
      h("div", {}, h("span", {}, "model"), request.model || "-"),
      h("div", {}, h("span", {}, "caller"), request.caller || "-"),
      h("div", {}, h("span", {}, "duration"), ms(request.duration_ms)),
      h("div", {}, h("span", {}, "started"), clock(request.started)),
    ),
    request.error ? h("p", { className: "error-box", "data-testid": "request-error" }, request.error) : null,
    h("div", { className: "waterfall", "data-testid": "waterfall" },
      h("div", { className: "axis" }, h("span", {}, "step"),
        h("div", { className: "ticks" }, [0, 0.25, 0.5, 0.75, 1].map((f) => h("span", {}, ms(f * total * 1000)))), h("span", {})),
      steps.map((s) => h("div", {
        className: `step kind-${kind(s)}${s.outcome === "ok" ? "" : " bad"}`,
        "data-lifecycle": s.lifecycle, "data-kind": kind(s), "data-outcome": s.outcome,
      },
        h("div", { className: "what", title: s.hooks.join(", ") },
          h("span", { className: "lc" }, s.lifecycle), " ",
          h("span", { className: "where" }, `${kind(s)} · ${s.group || "in-process"}${s.replica ? ` · ${s.replica}` : ""} · ${s.hooks.join(", ") || "-"}`)),
        h("div", { className: "track" }, h("div", {
          className: "bar",
          style: {
            left: `${(((s.start - t0) / total) * 100).toFixed(2)}%`,
            width: `${((s.duration_ms / 1000 / total) * 100).toFixed(2)}%`,
          },
        })),
        h("div", { className: "dur" }, `${ms(s.duration_ms)}${s.outcome === "ok" ? "" : ` · ${s.outcome}`}`),
        s.error ? h("div", { className: "step-error" }, s.error) : null,
      )),
    ),
    h("p", { className: "muted" }, "Bars start where a step began (its end less its duration). A hop to a worker group appears beside its stage."),
  );
}

function renderDeadLetters(main) {
  const letters = state.snapshot.dead_letters;
  show(main, 
    h("h1", {}, "Dead letters"),
    state.notice ? h("div", { className: "notice", "data-testid": "notice" }, state.notice) : null,
    letters.length ? h("table", { "data-testid": "dead-letters" },
      h("tr", {}, ["when", "from", "reason", "set aside by", "completion id"].map((t) => h("th", {}, t))),
      letters.map((l) => h("tr", { className: "clickable", "data-letter-id": l.id, onclick: () => inspect(l.id, false) },
        h("td", {}, clock(l.ts)), h("td", { className: "mono" }, l.source), h("td", {}, l.reason),
        h("td", { className: "mono" }, l.consumer), h("td", { className: "mono" }, l.routing.completion_id || "-"))),
    ) : h("p", { className: "muted" }, "No dead letters."),
    state.letter ? letterPanel(state.letter) : null,
  );
}

function letterPanel(detail) {
  const l = detail.letter;
  return h("section", { "data-testid": "dead-letter", "data-letter-id": l.id },
    h("h2", {}, `Dead letter ${l.id}`),
    h("p", {}, `${l.reason} (from ${l.source} entry ${l.entry_id}, set aside by ${l.consumer})`),
    h("div", {},
      h("button", { className: "action", type: "button", "data-action": "requeue", disabled: !detail.original, onclick: () => act(l.id, "requeue") }, "Requeue"),
      h("button", { className: "action danger", type: "button", "data-action": "delete", onclick: () => act(l.id, "delete") }, "Delete"),
      h("button", { className: "action", type: "button", "data-action": "content", onclick: () => inspect(l.id, !detail.content_shown) },
        detail.content_shown ? "Hide message content" : "Show message content"),
    ),
    detail.original
      ? h("pre", { className: "payload", "data-testid": "payload" }, JSON.stringify(detail.original, null, 2))
      : h("p", { className: "muted" }, "The original is no longer kept (expired or too large): only its description remains."),
  );
}

async function inspect(id, content) {
  state.letter = await api(`/dead-letters/${encodeURIComponent(id)}${content ? "?content=1" : ""}`);
  state.notice = null;
  render();
}

async function act(id, action) {
  try {
    if (action === "requeue") {
      const done = await api(`/dead-letters/${encodeURIComponent(id)}/requeue`, {
        method: "POST", headers: headers({ "Content-Type": "application/json" }), body: "{}",
      });
      state.notice = `Requeued onto ${done.stream} as entry ${done.entry_id}.`;
    } else {
      await api(`/dead-letters/${encodeURIComponent(id)}`, { method: "DELETE", headers: headers() });
      state.notice = `Deleted dead letter ${id}.`;
    }
    state.letter = null;
    state.snapshot.dead_letters = state.snapshot.dead_letters.filter((l) => l.id !== id);
  } catch (error) {
    state.notice = `${action} failed: ${error.message}`;
  }
  render();
}

// ------------------------------------------------------------------ start

window.addEventListener("hashchange", () => { state.letter = null; state.notice = null; state.waterfallShown = false; render(); });

function start() {
  render();
  follow();
}

start();

// egret's node page. Builds every node with createElement and
// textContent: nothing the server sends is parsed as HTML.
"use strict";

const POLL_MS = 1000;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

// name is a cell holding a name (namespace, pod, workload, upstream): it
// may break after a "/" or "." (as after a "-"), so that a long FQDN fits
// its column; its text stays as it is (copied, it has no extra character).
function name(text) {
  const td = el("td", undefined, "name");
  for (const part of String(text).split(/(?<=[./])/)) {
    if (td.firstChild) td.appendChild(el("wbr"));
    td.appendChild(document.createTextNode(part));
  }
  return td;
}

function rate(v) {
  if (!v) return "0";
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}

function fill(tbody, rows, columns, empty) {
  const frag = document.createDocumentFragment();
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", empty, "empty");
    td.colSpan = columns;
    tr.appendChild(td);
    frag.appendChild(tr);
  }
  for (const cells of rows) {
    const tr = el("tr");
    for (const c of cells) tr.appendChild(c);
    frag.appendChild(tr);
  }
  tbody.replaceChildren(frag);
}

function num(v, hot) {
  return el("td", v, hot ? "n hot" : "n");
}

function rateCells(r) {
  return [num(rate(r.requests)), num(rate(r.retries)), num(rate(r.ambiguous), r.ambiguous > 0),
    num(rate(r.not_sent), r.not_sent > 0), num(rate(r.failed), r.failed > 0)];
}

function countCells(c) {
  return [num(c.requests), num(c.retries), num(c.ambiguous, c.ambiguous > 0), num(c.not_sent, c.not_sent > 0),
    num(c.failed, c.failed > 0)];
}

function render(s) {
  document.getElementById("window").textContent = s.window_seconds ? s.window_seconds.toFixed(1) : "–";
  fill(document.querySelector("#pods tbody"), s.pods.map(p => [
    name(p.namespace), name(p.pod), name(p.workload || "–"), el("td", p.state || "gone"),
    ...rateCells(p.rates), ...countCells(p.counts),
  ]), 14, "no pods");
  fill(document.querySelector("#upstreams tbody"), s.upstreams.map(u => [
    name(u.upstream), ...rateCells(u.rates), ...countCells(u.counts), num(u.counts.budget_denied, u.counts.budget_denied > 0),
    num(u.budget_tokens === null ? "–" : u.budget_tokens.toFixed(1), u.budget_tokens !== null && u.budget_tokens < 1),
  ]), 13, "no upstreams yet");
  fill(document.querySelector("#flows tbody"), s.flows.map(f => [
    name(f.namespace ? f.namespace + "/" + f.pod : f.pod), name(f.upstream), ...rateCells(f.rates), ...countCells(f.counts),
  ]), 12, "none");
  // What egret does not proxy: refused, timed out and unreachable would
  // have been not_sent (a retry was safe); a reset, before or after acked
  // bytes, sent_no_response (ambiguous: an unacknowledged reset proves
  // nothing).
  const direct = s.direct || [];
  let safe = 0, ambiguous = 0;
  for (const d of direct) {
    safe += d.safe_to_retry;
    ambiguous += d.ambiguous;
  }
  document.getElementById("direct-safe").textContent = direct.length === 0 ? "No direct or passed-through connections seen." :
    safe + " failure" + (safe === 1 ? "" : "s") + " a retry could have fixed safely (the connect never completed: not sent); " +
    ambiguous + " reset after the connect (ambiguous unless idempotent).";
  // A passthrough row (egret carried the bytes, unretried) names its
  // protocol and destination.
  fill(document.querySelector("#direct tbody"), direct.map(d => [
    name(d.namespace ? d.namespace + "/" + d.pod : d.pod), el("td", d.protocol ? d.path + "/" + d.protocol : d.path),
    name(d.destination || "–"), num(d.connects), num(d.established),
    num(d.refused, d.refused > 0), num(d.timed_out, d.timed_out > 0), num(d.unreachable, d.unreachable > 0),
    num(d.reset_before_ack, d.reset_before_ack > 0), num(d.reset_after_ack, d.reset_after_ack > 0),
    num(d.retransmits), num(d.safe_to_retry, d.safe_to_retry > 0),
  ]), 12, "none");
  fill(document.querySelector("#recent tbody"), s.recent.map(r => {
    const link = el("a", r.id);
    link.href = "/explain/" + encodeURIComponent(r.id);
    const id = el("td");
    id.appendChild(link);
    return [el("td", new Date(r.time).toLocaleTimeString()), id, name(r.pod || "–"), name(r.upstream),
      el("td", r.method), el("td", r.outcome, "outcome-" + r.outcome), el("td", r.reason)];
  }), 7, "none held");
}

function setStatus(text, down) {
  const st = document.getElementById("status");
  st.textContent = text;
  st.classList.toggle("down", !!down);
}

async function poll() {
  try {
    const resp = await fetch("/api/summary", { cache: "no-store" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const s = await resp.json();
    render(s);
    setStatus("live · updated " + new Date(s.time).toLocaleTimeString());
  } catch (e) {
    setStatus("not updating: " + e.message, true);
  }
  setTimeout(poll, POLL_MS);
}

function verdict(v) {
  switch (v.outcome) {
    case "ambiguous":
      return "egret could not prove the upstream did not run this request, so it did not retry it and told the client so (Egret-Outcome: ambiguous).";
    case "not-sent":
      return "Nothing of this request reached the upstream (proven), and no retry was allowed to answer it.";
    case "failed":
      return "The request failed and egret could not answer it with a response.";
    default:
      return "The upstream's response was relayed as it was.";
  }
}

function witness(w) {
  if (!w) return "–";
  const f = x => (x === null || x === undefined ? "?" : x);
  // The kernel's bytes acked counts the SYN and the FIN as a byte each.
  return w.source + ": sent " + f(w.bytes_sent) + " B, acked " + w.bytes_acked + " (+1 each for SYN and FIN), retransmits " + w.retransmits +
    (w.reset_received ? ", reset" : "");
}

async function explain() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  try {
    const resp = await fetch("/api/explain/" + encodeURIComponent(id), { cache: "no-store" });
    const v = await resp.json();
    if (!resp.ok) throw new Error(v.error || "HTTP " + resp.status);
    document.getElementById("headline").textContent = "Request " + v.request_id + ": " + v.outcome + " after " +
      v.attempts.length + " attempt" + (v.attempts.length === 1 ? "" : "s");
    document.getElementById("verdict").textContent = verdict(v);
    const dl = document.getElementById("request");
    const items = [["Pod", v.pod || "–"], ["Method", v.method], ["URL", v.url], ["Upstream", v.upstream],
      ["Idempotent", v.idempotent ? "yes" : "no"], ["Body", v.body], ["Started", new Date(v.start).toLocaleString()],
      ["Outcome", v.outcome]];
    const frag = document.createDocumentFragment();
    for (const [k, val] of items) {
      frag.appendChild(el("dt", k));
      frag.appendChild(el("dd", val));
    }
    dl.replaceChildren(frag);
    fill(document.querySelector("#attempts tbody"), v.attempts.map(a => [
      num(a.n), num(a.duration_ms.toFixed(1)), el("td", a.stage), el("td", a.failure), num(a.status || "–"),
      el("td", a.evidence + (a.upgraded ? " (upgraded by the witness)" : "")), el("td", a.decision), el("td", a.reason),
      num(a.budget === null ? "–" : a.budget.toFixed(1)), num(a.wait_ms ? a.wait_ms.toFixed(1) : "–"),
      el("td", witness(a.witness_after)), el("td", a.error || "", "err"),
    ]), 12, "no attempts");
    setStatus("");
  } catch (e) {
    setStatus("cannot explain " + id + ": " + e.message, true);
  }
}

if (document.body.dataset.page === "explain") {
  explain();
} else {
  poll();
}

// NodeWright's page: draws the overview the status service streams (server-sent events) and
// the live feed of the event stream. Plain DOM, no framework and no build step; text is
// always set with textContent, never parsed as HTML. Read-only: it sends nothing back.
"use strict";

const STATES = ["Failed", "Blocked", "InProgress", "Waiting", "Complete"];
const STATE_NAMES = {
  Failed: "Failed", Blocked: "Blocked", InProgress: "In progress", Waiting: "Waiting",
  Complete: "Complete",
};
const FEED_MAX = 200;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function table(headers, rows) {
  const head = el("tr", {}, ...headers.map((h) => el("th", { text: h })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows));
}

function counts(nw) {
  return el(
    "ul",
    { class: "counts" },
    ...STATES.map((s) =>
      el(
        "li",
        { "data-count": s },
        el("b", { text: String(nw.counts[s] ?? 0) }),
        document.createTextNode(STATE_NAMES[s]),
      ),
    ),
  );
}

// What the compartment does now: stopped, waiting (why: an approval, a soak, a window ...;
// the message, with what to do, on hover), or rolling.
function compartmentState(c) {
  if (c.stopped) return `stopped (${c.stopReason || "Stopped"})`;
  if (c.waitingReason) return `waiting (${c.waitingReason})`;
  return "rolling";
}

function compartments(nw) {
  const rows = nw.compartments.map((c) =>
    el(
      "tr",
      { "data-compartment": c.name },
      el("td", { text: c.name }),
      el("td", { text: String(c.budgetNodes) }),
      el("td", { text: String(c.currentBatch) }),
      el("td", { text: c.batchSize ? `${c.batchSize} in flight` : "-" }),
      el("td", { text: `${c.completeNodes}/${c.matchedNodes}` }),
      el("td", { text: String(c.inProgressNodes) }),
      el("td", { text: String(c.failedNodes) }),
      el("td", { text: compartmentState(c), title: c.waitingMessage || "" }),
    ),
  );
  return table(
    ["Compartment", "Budget", "Batch", "In batch", "Complete", "In progress", "Failed", "State"],
    rows,
  );
}

function batches(nw) {
  const out = [];
  for (const c of nw.compartments) {
    if (!c.batchNodes.length) continue;
    out.push(el("h3", { text: `${c.name}: batch ${c.currentBatch}` }));
    out.push(
      el(
        "div",
        { class: "chips", "data-batch": `${c.name}/${c.currentBatch}` },
        ...c.batchNodes.map((n) => el("span", { class: "chip", text: n })),
      ),
    );
  }
  return out;
}

function nodeGroups(nw) {
  const out = [];
  for (const state of STATES) {
    const rows = nw.nodes[state] || [];
    const omitted = nw.omittedNodes[state] || 0;
    if (!rows.length) continue;
    const title = `${STATE_NAMES[state]} (${nw.counts[state] ?? rows.length})`;
    out.push(el("h3", { "data-state": state, text: title }));
    if (state === "Complete") {
      out.push(
        el("div", { class: "chips" }, ...rows.map((r) => el("span", { class: "chip", "data-node": r.name, text: r.name }))),
      );
    } else {
      out.push(
        table(
          ["Node", "Phase", "Reason", "Message", "Batch"],
          rows.map((r) =>
            el(
              "tr",
              { "data-node": r.name, "data-state": state },
              el("td", { text: r.name }),
              el("td", { text: r.phase }),
              el("td", { class: "reason", text: r.reason || "-" }),
              el("td", { class: "message", text: r.message || "" }),
              el("td", { text: r.batch ? `${r.compartment} ${r.batch}` : "-" }),
            ),
          ),
        ),
      );
    }
    if (omitted) out.push(el("p", { class: "muted", text: `and ${omitted} more` }));
  }
  return out;
}

function card(nw) {
  const target = nw.counts.Target || 0;
  const percent = target ? Math.floor((100 * nw.counts.Complete) / target) : 0;
  const fill = el("span", { "data-field": "progress" });
  fill.style.width = `${percent}%`; // CSSOM, which the page's CSP allows (a style attribute it would not)
  const flags = [nw.paused ? "paused" : "", nw.disabled ? "disabled" : ""].filter(Boolean).join(", ");
  return el(
    "article",
    { class: "nodewright", id: `nw-${nw.name}`, "data-nodewright": nw.name, "data-state": nw.state },
    el(
      "h2",
      {},
      document.createTextNode(nw.name),
      el("span", { class: "state", "data-state": nw.state, text: nw.state }),
      el("span", { class: "muted", "data-field": "complete", text: `${nw.completeNodes} complete` }),
      flags ? el("span", { class: "muted", text: flags }) : null,
    ),
    el("p", { class: "muted", text: `${nw.packages || "no packages"}${nw.readyMessage ? " · " + nw.readyMessage : ""}` }),
    el("div", { class: "bar" }, fill),
    counts(nw),
    compartments(nw),
    ...batches(nw),
    ...nodeGroups(nw),
  );
}

function render(doc) {
  const root = document.getElementById("nodewrights");
  const cards = doc.nodewrights.map(card);
  if (!cards.length) cards.push(el("p", { class: "empty", text: "No NodeWright yet." }));
  if (doc.invalid.length) {
    cards.push(el("p", { class: "error", text: `Not decodable: ${doc.invalid.join(", ")}` }));
  }
  root.replaceChildren(...cards);
  document.title = `NodeWright (${doc.nodewrights.length})`;
}

function feedLine(line) {
  const feed = document.getElementById("feed");
  const item = el(
    "li",
    { "data-kind": line.kind, "data-type": line.type, "data-node": line.node },
    el("time", { datetime: line.time, text: line.time.slice(11, 19) }),
    document.createTextNode(line.text),
  );
  feed.prepend(item);
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
}

function connect() {
  const status = document.getElementById("connection");
  const source = new EventSource("/ui/api/stream");
  source.addEventListener("open", () => {
    status.dataset.state = "live";
    status.textContent = "live";
  });
  source.addEventListener("overview", (e) => render(JSON.parse(e.data)));
  source.addEventListener("event", (e) => feedLine(JSON.parse(e.data)));
  source.addEventListener("unauthorized", () => window.location.reload());
  source.addEventListener("error", () => {
    // EventSource reconnects by itself; say so meanwhile.
    status.dataset.state = "lost";
    status.textContent = "reconnecting";
  });
}

connect();

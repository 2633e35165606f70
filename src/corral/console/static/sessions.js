// Agent sessions with their agent type, and one session's audit log, polled every 2 s while it is on screen.

import * as api from "./api.js";
import { expiry, h, notice, replace, shortId, statusBadge, table, when } from "./dom.js";

const LIST_REFRESH_MS = 5000;
const AUDIT_REFRESH_MS = 2000;

/** Agent type names by id ({} when they cannot be listed: ids are shown instead). */
async function agentTypeNames() {
  try {
    const answer = await api.get(api.AGENT_TYPES);
    return Object.fromEntries((answer.agent_types ?? []).map((t) => [t.id, t.name]));
  } catch {
    return {};
  }
}

function agentTypeCell(names, id) {
  return h("span", {}, names[id] ?? "", " ", h("code", { class: "id muted", title: id }, id));
}

function openForm(ctx) {
  const input = h("input", { id: "session-id", name: "session", placeholder: "session id", spellcheck: "false" });
  const form = h(
    "form",
    { class: "inline-form", id: "open-session" },
    h("label", { for: "session-id" }, "Open a session by id"),
    input,
    h("button", { class: "btn", type: "submit" }, "Open"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) ctx.navigate(`#/sessions/${api.seg(input.value.trim())}`);
  });
  return form;
}

/** The sessions page: every session (GET /api/v1/agent/sessions), or a clear note where the server has no list. */
export function renderSessions(main, ctx) {
  const holder = h("div", { id: "sessions-table" }, h("p", { class: "muted" }, "Loading…"));
  replace(main, h("div", { class: "page-head" }, h("h1", {}, "Sessions"), openForm(ctx)), holder);
  let timer = null;
  let left = false;
  ctx.onLeave(() => {
    left = true;
    clearTimeout(timer);
  });

  async function refresh() {
    try {
      const [answer, names] = await Promise.all([api.get(api.SESSIONS), agentTypeNames()]);
      if (left) return;
      const rows = (answer.sessions ?? []).map((s) =>
        h(
          "tr",
          { dataset: { sessionId: s.id } },
          h("td", {}, h("a", { href: `#/sessions/${api.seg(s.id)}` }, shortId(s.id))),
          h("td", {}, agentTypeCell(names, s.agent_type_id)),
          h(
            "td",
            {},
            statusBadge(s.status),
            s.degraded && h("div", { class: "warning small", title: s.degraded_reason ?? "" }, "degraded"),
            expiry(s.expires_at, "ends"),
            (s.warnings ?? []).length > 0 && h("div", { class: "warning small" }, `⚠ ${s.warnings[0]}`),
          ),
          h("td", {}, s.isolation ?? "—"),
          h(
            "td",
            {},
            s.workspace_id ? h("a", { href: `#/workspaces/${api.seg(s.workspace_id)}/terminal` }, shortId(s.workspace_id)) : "—",
          ),
          h("td", {}, (s.tools ?? []).join(", ")),
          h("td", {}, when(s.created_at)),
        ),
      );
      replace(
        holder,
        table(["Session", "Agent type", "Status", "Isolation", "Workspace", "Tools", "Started"], rows, {
          empty: "No sessions. Agents start them with POST /api/v1/agent/sessions.",
        }),
      );
    } catch (error) {
      if (left) return;
      if (error.status === 404 || error.status === 405) {
        replace(
          holder,
          notice(
            "Listing sessions is not available on this server (GET /api/v1/agent/sessions is not served). " +
              "Open a session by its id above.",
            "info",
          ),
        );
        return; // nothing to poll for
      }
      replace(holder, notice(`Could not list sessions: ${error.message}`, "error"));
    }
    if (!left) timer = setTimeout(refresh, LIST_REFRESH_MS);
  }
  refresh();
}

/** One session and its live audit log. */
export function renderSession(main, sessionId, ctx) {
  const summary = h("div", { class: "summary" }, h("span", { class: "muted" }, "Loading…"));
  const updated = h("span", { class: "muted small", id: "audit-updated" });
  const log = h("div", { id: "audit-log" });
  replace(
    main,
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, h("a", { href: "#/sessions", class: "back" }, "Sessions"), " / ", shortId(sessionId)),
    ),
    summary,
    h(
      "div",
      { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Audit log"), h("span", { class: "live-dot" }), updated),
      log,
    ),
  );
  let timer = null;
  let left = false;
  let shown = -1;
  ctx.onLeave(() => {
    left = true;
    clearTimeout(timer);
  });

  async function loadSummary() {
    try {
      const [s, names] = await Promise.all([api.get(`${api.SESSIONS}/${api.seg(sessionId)}`), agentTypeNames()]);
      if (left) return;
      replace(
        summary,
        statusBadge(s.status),
        h("span", {}, h("b", {}, "Agent type "), agentTypeCell(names, s.agent_type_id)),
        h("span", {}, h("b", {}, "Isolation "), s.isolation ?? "—"),
        h(
          "span",
          {},
          h("b", {}, "Workspace "),
          s.workspace_id ? h("a", { href: `#/workspaces/${api.seg(s.workspace_id)}/terminal` }, shortId(s.workspace_id)) : "—",
        ),
        h("span", {}, h("b", {}, "Tools "), (s.tools ?? []).join(", ") || "—"),
        h("span", {}, h("b", {}, "Started "), when(s.created_at)),
        s.ended_at && h("span", {}, h("b", {}, "Ended "), when(s.ended_at)),
      );
      if (s.degraded) summary.append(h("div", { class: "warning small wide" }, `Degraded: ${s.degraded_reason ?? ""}`));
      for (const warning of s.warnings ?? []) summary.append(h("div", { class: "warning small wide" }, `⚠ ${warning}`));
    } catch (error) {
      if (!left) replace(summary, notice(`Could not load session ${sessionId}: ${error.message}`, "error"));
    }
  }

  async function poll() {
    try {
      const entries = (await api.get(`${api.SESSIONS}/${api.seg(sessionId)}/audit`)).entries ?? [];
      if (left) return;
      if (entries.length !== shown) {
        shown = entries.length;
        const rows = [...entries].reverse().map((e) =>
          h(
            "tr",
            { dataset: { tool: e.tool } },
            h("td", { class: "nowrap" }, when(e.at)),
            h("td", {}, h("code", {}, e.tool)),
            h("td", { class: "args" }, e.arguments_summary),
            h("td", {}, statusBadge(e.status)),
            h("td", { class: "num" }, `${Number(e.duration_ms ?? 0).toFixed(0)} ms`),
          ),
        );
        replace(
          log,
          table(["Time", "Tool", "Arguments", "Status", "Duration"], rows, {
            empty: "No tool calls yet. New ones appear here within 2 seconds.",
            className: "audit",
          }),
        );
      }
      updated.textContent = `${entries.length} entr${entries.length === 1 ? "y" : "ies"} · updated ${new Date().toLocaleTimeString()} · every 2 s`;
    } catch (error) {
      if (!left) replace(log, notice(`Could not read the audit log: ${error.message}`, "error"));
    }
    if (!left) timer = setTimeout(poll, AUDIT_REFRESH_MS);
  }

  loadSummary();
  poll();
}

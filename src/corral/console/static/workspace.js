// One workspace: a summary line, and tabs for its terminal and its files.

import * as api from "./api.js";
import { age, h, notice, replace, shortId, statusBadge } from "./dom.js";
import { renderFiles } from "./files.js";
import { renderTerminal } from "./terminal.js";

/**
 * @param {HTMLElement} main
 * @param {string} workspaceId
 * @param {string} tab "terminal" or "files"
 * @param {URLSearchParams} query
 * @param {{navigate: (hash: string) => void, onLeave: (stop: () => void) => void}} ctx
 */
export async function renderWorkspace(main, workspaceId, tab, query, ctx) {
  const base = `#/workspaces/${api.seg(workspaceId)}`;
  const tabs = h(
    "nav",
    { class: "tabs" },
    [
      ["terminal", "Terminal"],
      ["files", "Files"],
    ].map(([id, title]) => h("a", { href: `${base}/${id}`, class: tab === id ? "active" : "", id: `tab-${id}` }, title)),
  );
  const summary = h("div", { class: "summary" }, h("span", { class: "muted" }, "Loading…"));
  const body = h("div", { class: "card tab-body" });
  replace(
    main,
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, h("a", { href: "#/workspaces", class: "back" }, "Workspaces"), " / ", shortId(workspaceId)),
    ),
    summary,
    tabs,
    body,
  );

  let workspace;
  try {
    workspace = await api.get(`${api.WORKSPACES}/${api.seg(workspaceId)}`);
  } catch (error) {
    replace(summary, notice(`Could not load workspace ${workspaceId}: ${error.message}`, "error"));
    replace(body);
    return;
  }
  const limits = workspace.resource_limits ?? {};
  replace(
    summary,
    statusBadge(workspace.status),
    h("span", {}, h("b", {}, "Provider "), workspace.provider ?? "—"),
    h("span", {}, h("b", {}, "Isolation "), workspace.isolation ?? "—"),
    h("span", {}, h("b", {}, "Network "), workspace.network ?? "—"),
    h("span", {}, h("b", {}, "Image "), workspace.base_image ?? "—"),
    h("span", {}, h("b", {}, "Limits "), `${limits.cpu ?? "?"} CPU · ${limits.memory ?? "?"} · ${limits.disk ?? "?"} disk`),
    h("span", {}, h("b", {}, "Age "), age(workspace.created_at)),
  );
  for (const warning of workspace.warnings ?? []) summary.append(h("div", { class: "warning small wide" }, `⚠ ${warning}`));

  if (workspace.status !== "ready") {
    replace(
      body,
      notice(
        `This workspace is ${workspace.status}: its terminal and files are available while it is ready. ` +
          (workspace.status === "paused" || workspace.status === "stopped" ? "Resume it from the Workspaces page." : ""),
        "info",
      ),
    );
    return;
  }
  if (tab === "files") {
    renderFiles(body, workspaceId, query.get("path") ?? "/workspace", ctx);
  } else {
    renderTerminal(body, workspaceId, ctx);
  }
}

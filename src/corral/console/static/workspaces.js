// Workspaces: the table (state, provider, isolation, age, limits, resource use), create, and lifecycle buttons.

import * as api from "./api.js";
import { age, bytes, expiry, h, notice, replace, shortId, statusBadge, table } from "./dom.js";

const REFRESH_MS = 5000;

/** The buttons a workspace in this state offers, in order. */
function actionsFor(status) {
  switch (status) {
    case "ready":
      return ["terminal", "files", "pause", "stop", "destroy"];
    case "paused":
    case "stopped":
      return ["resume", "destroy"];
    default:
      return ["destroy"];
  }
}

const ACTION_LABELS = {
  terminal: "Terminal",
  files: "Files",
  pause: "Pause",
  stop: "Stop",
  resume: "Resume",
  destroy: "Destroy",
};

function limitsText(limits) {
  if (!limits) return "—";
  return ["cpu", "memory", "disk"]
    .filter((key) => limits[key] !== undefined && limits[key] !== null)
    .map((key) => (key === "cpu" ? `${limits[key]} CPU` : `${limits[key]} ${key === "memory" ? "mem" : "disk"}`))
    .join(" · ");
}

function usageCell(metric) {
  if (!metric) return h("span", { class: "muted" }, "—");
  const memPct = metric.memTotal ? Math.round((100 * metric.memUsed) / metric.memTotal) : 0;
  return h(
    "div",
    { class: "usage" },
    h("span", {}, `CPU ${Number(metric.cpuUsedPct ?? 0).toFixed(0)}%`),
    h("span", {}, `mem ${bytes(metric.memUsed)} / ${bytes(metric.memTotal)}`),
    h("span", { class: "bar", title: `memory ${memPct}%` }, h("span", { class: "bar-fill", dataset: { pct: memPct } })),
    h("span", {}, `disk ${bytes(metric.diskUsed)}`),
  );
}

/** The newest CPU/memory/disk sample of each running workspace, from the metrics API (E2B's shape); {} if none. */
async function loadMetrics(ids) {
  if (ids.length === 0) return {};
  try {
    const answer = await api.get(`/e2b/sandboxes/metrics?sandbox_ids=${ids.slice(0, 100).map(api.seg).join(",")}`);
    return answer.sandboxes ?? {};
  } catch {
    return {}; // resource use is a nicety: the table works without it
  }
}

function metadataText(metadata) {
  if (!metadata || typeof metadata !== "object") return "";
  const entries = Object.entries(metadata).filter(([key]) => !key.startsWith("corral."));
  if (entries.length === 0) return "";
  if (typeof metadata.name === "string") return metadata.name;
  const text = entries.map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

async function act(action, workspace, status) {
  const path = `${api.WORKSPACES}/${api.seg(workspace.id)}`;
  if (action === "destroy") {
    if (!window.confirm(`Destroy workspace ${workspace.id}? Its files are deleted.`)) return false;
    await api.del(path);
  } else {
    await api.post(`${path}/${action}`);
  }
  status(`${ACTION_LABELS[action]}: ${workspace.id} done.`, "ok");
  return true;
}

function createForm(providers, onCreated, status) {
  const provider = h(
    "select",
    { id: "create-provider", name: "provider" },
    h("option", { value: "auto" }, "auto (Corral chooses)"),
    providers.map((p) => h("option", { value: p.name }, `${p.name}${p.status === "healthy" ? "" : " (unhealthy)"}`)),
  );
  const image = h("input", { id: "create-image", name: "base_image", placeholder: "server default" });
  const network = h(
    "select",
    { id: "create-network", name: "network" },
    h("option", { value: "isolated" }, "isolated (no network)"),
    h("option", { value: "default" }, "default (outbound allowed)"),
  );
  const cpu = h("input", { id: "create-cpu", name: "cpu", placeholder: "default", size: 6 });
  const memory = h("input", { id: "create-memory", name: "memory", placeholder: "e.g. 1G", size: 6 });
  const name = h("input", { id: "create-name", name: "name", placeholder: "optional label" });
  const submit = h("button", { class: "btn btn-primary", type: "submit", id: "create-submit" }, "Create workspace");
  const field = (label, input) => h("label", { class: "field" }, h("span", {}, label), input);
  const form = h(
    "form",
    { class: "card create-form", id: "create-form" },
    h("h2", {}, "New workspace"),
    h(
      "div",
      { class: "fields" },
      field("Provider", provider),
      field("Base image", image),
      field("Network", network),
      field("CPU", cpu),
      field("Memory", memory),
      field("Name", name),
    ),
    h("div", { class: "form-actions" }, submit),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { provider: provider.value, network: network.value };
    if (image.value.trim()) body.base_image = image.value.trim();
    const limits = {};
    if (cpu.value.trim()) limits.cpu = cpu.value.trim();
    if (memory.value.trim()) limits.memory = memory.value.trim();
    if (Object.keys(limits).length) body.resource_limits = limits;
    if (name.value.trim()) body.metadata = { name: name.value.trim() };
    submit.disabled = true;
    submit.textContent = "Creating…";
    status("Creating a workspace; this takes a few seconds.", "info");
    try {
      const created = await api.post(api.WORKSPACES, body);
      status(`Created ${created.id} on ${created.provider} (${created.isolation ?? "?"}).`, "ok");
      onCreated(created);
    } catch (error) {
      status(`Create failed: ${error.message}`, "error");
    } finally {
      submit.disabled = false;
      submit.textContent = "Create workspace";
    }
  });
  return form;
}

/** The workspaces page. */
export function renderWorkspaces(main, ctx) {
  const statusLine = h("div", { class: "status-line", id: "workspaces-status" });
  const status = (text, kind) => replace(statusLine, notice(text, kind));
  const tableHolder = h("div", { id: "workspaces-table" }, h("p", { class: "muted" }, "Loading…"));
  const formHolder = h("div", { hidden: true });
  const updated = h("span", { class: "muted small" });
  let timer = null;
  let left = false;
  let busy = false;
  let again = false;

  const toggle = h(
    "button",
    {
      class: "btn btn-primary",
      type: "button",
      id: "new-workspace",
      onclick: async () => {
        formHolder.hidden = !formHolder.hidden;
        if (!formHolder.hidden && !formHolder.firstChild) {
          let providers = [];
          try {
            providers = (await api.get(`${api.WORKSPACES}/providers`)).providers ?? [];
          } catch (error) {
            status(`Could not list providers: ${error.message}`, "error");
          }
          replace(formHolder, createForm(providers, () => refresh(), status));
        }
      },
    },
    "New workspace",
  );

  replace(
    main,
    h(
      "div",
      { class: "page-head" },
      h("h1", {}, "Workspaces"),
      h("div", { class: "page-actions" }, updated, h("button", { class: "btn", type: "button", onclick: () => refresh() }, "Refresh"), toggle),
    ),
    formHolder,
    statusLine,
    tableHolder,
  );

  function row(ws, metric) {
    const label = metadataText(ws.metadata);
    const buttons = actionsFor(ws.status).map((action) => {
      if (action === "terminal" || action === "files") {
        return h(
          "a",
          { class: "btn btn-small", href: `#/workspaces/${api.seg(ws.id)}/${action}`, dataset: { action } },
          ACTION_LABELS[action],
        );
      }
      return h(
        "button",
        {
          class: `btn btn-small${action === "destroy" ? " btn-danger" : ""}`,
          type: "button",
          dataset: { action },
          onclick: async (event) => {
            event.target.disabled = true;
            try {
              await act(action, ws, status);
            } catch (error) {
              status(`${ACTION_LABELS[action]} failed: ${error.message}`, "error");
            }
            refresh();
          },
        },
        ACTION_LABELS[action],
      );
    });
    const warnings = ws.warnings ?? [];
    return h(
      "tr",
      { dataset: { workspaceId: ws.id, status: ws.status } },
      h(
        "td",
        {},
        h("a", { href: `#/workspaces/${api.seg(ws.id)}/terminal`, class: "ws-link" }, shortId(ws.id)),
        label && h("div", { class: "muted small label" }, label),
        ws.from_warm_pool && h("div", { class: "muted small" }, "from warm pool"),
      ),
      h(
        "td",
        {},
        statusBadge(ws.status),
        warnings.length > 0 && h("div", { class: "warning small", title: warnings.join("\n") }, `⚠ ${warnings[0]}`),
        ws.error && h("div", { class: "error small", title: ws.error }, ws.error),
        expiry(ws.expires_at),
      ),
      h("td", {}, ws.provider ?? "—"),
      h("td", {}, ws.isolation ?? "—"),
      h("td", {}, ws.network ?? "—"),
      h("td", { title: ws.created_at }, age(ws.created_at)),
      h("td", { class: "small" }, limitsText(ws.resource_limits)),
      h("td", { class: "small" }, usageCell(metric)),
      h("td", { class: "actions" }, buttons),
    );
  }

  async function refresh() {
    if (left) return;
    if (busy) {
      again = true; // after a button's action: show its effect as soon as the running refresh ends
      return;
    }
    busy = true;
    again = false;
    clearTimeout(timer);
    try {
      const workspaces = (await api.get(api.WORKSPACES)).workspaces ?? [];
      const ready = workspaces.filter((ws) => ws.status === "ready").map((ws) => ws.id);
      const metrics = await loadMetrics(ready);
      if (left) return;
      replace(
        tableHolder,
        table(
          ["Workspace", "State", "Provider", "Isolation", "Network", "Age", "Limits", "Resource use", ""],
          workspaces.map((ws) => row(ws, metrics[ws.id])),
          { empty: "No workspaces yet: create one with “New workspace”.", className: "workspaces" },
        ),
      );
      for (const fill of tableHolder.querySelectorAll(".bar-fill")) {
        fill.style.width = `${Math.min(100, Number(fill.dataset.pct) || 0)}%`; // CSSOM: allowed by the CSP
      }
      updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (!left) replace(tableHolder, notice(`Could not list workspaces: ${error.message}`, "error"));
    } finally {
      busy = false;
      if (!left) timer = setTimeout(refresh, again ? 0 : REFRESH_MS);
    }
  }

  ctx.onLeave(() => {
    left = true;
    clearTimeout(timer);
  });
  refresh();
}

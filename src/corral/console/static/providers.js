// Providers with their health and the reasons for it, and warm pools with their hits and misses.

import * as api from "./api.js";
import { bytes, h, notice, replace, statusBadge, table, when } from "./dom.js";

const REFRESH_MS = 10000;

function resourcesText(resources) {
  if (!resources || typeof resources !== "object") return "—";
  const parts = [];
  if (typeof resources.cpu_count === "number") parts.push(`${resources.cpu_count} CPU`);
  if (typeof resources.memory_bytes === "number") parts.push(`${bytes(resources.memory_bytes)} mem`);
  if (typeof resources.disk_free_bytes === "number") parts.push(`${bytes(resources.disk_free_bytes)} disk free`);
  if (typeof resources.workspaces === "number") parts.push(`${resources.workspaces} workspaces`);
  return parts.length ? parts.join(" · ") : "—";
}

function capabilityValue(value) {
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(0);
  if (Array.isArray(value)) return value.join("+");
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function capabilitiesText(caps) {
  if (!caps || typeof caps !== "object") return "—";
  return Object.entries(caps)
    .filter(([k, v]) => k !== "resources" && v !== false && v !== null && v !== "none")
    .map(([k, v]) => (v === true ? k : `${k}: ${capabilityValue(v)}`))
    .join(", ");
}

function reasonsText(reasons) {
  const entries = Object.entries(reasons ?? {});
  return entries.length ? entries.map(([reason, n]) => `${reason} ×${n}`).join(", ") : "—";
}

/** The providers and pools page. */
export function renderProviders(main, ctx) {
  const providers = h("div", { id: "providers-table" }, h("p", { class: "muted" }, "Loading…"));
  const pools = h("div", { id: "pools-table" }, h("p", { class: "muted" }, "Loading…"));
  const updated = h("span", { class: "muted small" });
  replace(
    main,
    h("div", { class: "page-head" }, h("h1", {}, "Providers & pools"), updated),
    h("div", { class: "card" }, h("h2", {}, "Providers"), providers),
    h("div", { class: "card" }, h("h2", {}, "Warm pools"), pools),
  );
  let timer = null;
  let left = false;
  ctx.onLeave(() => {
    left = true;
    clearTimeout(timer);
  });

  async function refresh() {
    const [p, w] = await Promise.allSettled([api.get(`${api.WORKSPACES}/providers`), api.get(`${api.WORKSPACES}/pool`)]);
    if (left) return;
    if (p.status === "fulfilled") {
      const rows = (p.value.providers ?? []).map((x) =>
        h(
          "tr",
          { dataset: { provider: x.name } },
          h("td", {}, h("b", {}, x.name)),
          h("td", {}, statusBadge(x.status)),
          h("td", { class: "reason" }, x.error ?? (x.status === "healthy" ? "—" : "no reason given")),
          h("td", { class: "num" }, String(x.active_workspaces ?? 0)),
          h("td", { class: "small" }, resourcesText(x.available_resources)),
          h("td", { class: "small" }, capabilitiesText(x.capabilities)),
          h("td", { class: "small nowrap" }, when(x.last_check)),
        ),
      );
      replace(
        providers,
        table(["Provider", "Health", "Reason", "Active", "Available", "Capabilities", "Checked"], rows, {
          empty: "No providers are configured (CORRAL_PROVIDERS).",
        }),
      );
    } else {
      replace(providers, notice(`Could not list providers: ${p.reason.message}`, "error"));
    }
    if (w.status === "fulfilled") {
      const rows = (w.value.pools ?? []).map((x) =>
        h(
          "tr",
          { dataset: { pool: x.key } },
          h("td", {}, h("code", { class: "id", title: x.key }, x.key)),
          h("td", {}, x.provider),
          h("td", { class: "small" }, x.image),
          h("td", {}, x.network),
          h("td", { class: "num" }, `${x.size} / ${x.target}${x.creating ? ` (+${x.creating} starting)` : ""}`),
          h("td", { class: "num" }, String(x.hits)),
          h("td", { class: "num" }, String(x.misses)),
          h("td", { class: "small" }, reasonsText(x.miss_reasons)),
          h("td", { class: "reason" }, x.last_error ?? "—"),
        ),
      );
      const unpooled = reasonsText(w.value.unpooled_misses);
      replace(
        pools,
        table(["Pool", "Provider", "Image", "Network", "Ready / target", "Hits", "Misses", "Miss reasons", "Last error"], rows, {
          empty: "No warm pools (CORRAL_WARM_POOL_SIZE is 0 and no others are configured).",
        }),
        h("p", { class: "muted small" }, `Creates no pool could serve: ${unpooled}`),
      );
    } else {
      replace(pools, notice(`Could not read the warm pools: ${w.reason.message}`, "error"));
    }
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
}

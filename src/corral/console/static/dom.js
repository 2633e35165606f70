// Building the page. Strings from the API (workspace metadata, file names, error messages) are attacker-written,
// so they only ever become text nodes or attribute values: nothing in the console parses a string as HTML.

/**
 * An element with attributes, listeners (`onclick: fn`) and children (nodes, or strings made text nodes).
 * @param {string} tag
 * @param {Record<string, any>} [attrs]
 * @param {...any} children
 * @returns {HTMLElement}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "value") el.value = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, arrays of them; null and false are skipped). */
export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A coloured status pill; `kind` picks the colour (see .badge-* in console.css). */
export function badge(text, kind) {
  return h("span", { class: `badge badge-${kind ?? "neutral"}` }, text);
}

const STATUS_KINDS = {
  ready: "ok",
  active: "ok",
  healthy: "ok",
  ok: "ok",
  success: "ok",
  creating: "info",
  provisioning: "info",
  paused: "warn",
  stopped: "neutral",
  ended: "neutral",
  destroyed: "neutral",
  error: "bad",
  failed: "bad",
  unhealthy: "bad",
  denied: "bad",
};

/** A badge coloured by what the status word means. */
export function statusBadge(status) {
  return badge(status ?? "unknown", STATUS_KINDS[status] ?? "neutral");
}

/** A Date from the API's timestamps (ISO 8601; one without a zone is UTC, as the server writes it). */
export function parseTime(value) {
  if (value === null || value === undefined) return null;
  const text = String(value);
  const zoned = /([zZ]|[+-]\d\d:?\d\d)$/.test(text) ? text : `${text}Z`;
  const date = new Date(zoned);
  return Number.isNaN(date.getTime()) ? null : date;
}

/** "42 s", "5 min", "3 h", "2 d" since the given time. */
export function age(value, now = Date.now()) {
  const date = parseTime(value);
  if (date === null) return "—";
  const seconds = Math.max(0, Math.round((now - date.getTime()) / 1000));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d`;
}

/** Seconds before an idle timeout strikes from which the console warns (the CLI's CORRAL_IDLE_WARNING_S default). */
export const IDLE_WARNING_S = 300;

/**
 * When the idle timeout strikes (the API's `expires_at`), as a line for a table cell: a warning within
 * IDLE_WARNING_S ("stops in 4 min unless used"), a quiet note before that, nothing when no timeout applies.
 */
export function expiry(expiresAt, verb = "stops", now = Date.now()) {
  const date = parseTime(expiresAt);
  if (date === null) return null;
  const seconds = Math.max(0, Math.round((date.getTime() - now) / 1000));
  const left = seconds < 60 ? `${seconds} s` : `${Math.ceil(seconds / 60)} min`;
  if (seconds <= IDLE_WARNING_S) {
    return h("div", { class: "warning small idle-warning", title: `idle timeout at ${date.toLocaleString()}` }, `⏱ ${verb} in ${left} unless used`);
  }
  return h("div", { class: "muted small idle-note", title: `idle timeout at ${date.toLocaleString()}` }, `idle timeout in ${left}`);
}

/** Local date and time of an API timestamp. */
export function when(value) {
  const date = parseTime(value);
  return date === null ? "—" : date.toLocaleString();
}

/** Bytes as "512 B", "3.4 KiB", "1.2 GiB". */
export function bytes(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/** A table with a header row; `rows` are arrays of cells (nodes or strings), or a ready <tr>. */
export function table(headers, rows, { empty = "Nothing here yet.", className = "" } = {}) {
  const head = h("thead", {}, h("tr", {}, headers.map((title) => h("th", { scope: "col" }, title))));
  const body = h("tbody");
  if (rows.length === 0) {
    body.append(h("tr", { class: "empty" }, h("td", { colspan: headers.length }, empty)));
  }
  for (const row of rows) {
    body.append(row instanceof HTMLTableRowElement ? row : h("tr", {}, row.map((cell) => h("td", {}, cell))));
  }
  return h("div", { class: "table-wrap" }, h("table", { class: `table ${className}` }, head, body));
}

/** A muted, monospace, shortened id with the whole one as tooltip. */
export function shortId(id) {
  return h("code", { class: "id", title: id }, id);
}

/** A message line: kind is "error", "ok" or "info". */
export function notice(text, kind = "info") {
  return h("p", { class: `notice notice-${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

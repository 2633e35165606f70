// The console's shell: sign-in, the header and navigation, and a hash router over the views.
//
// Routes: #/workspaces, #/workspaces/<id>/terminal, #/workspaces/<id>/files?path=..., #/sessions,
// #/sessions/<id>, #/providers. A view registers what must stop when the user leaves it (timers, the terminal's
// WebSocket) with ctx.onLeave.

import * as api from "./api.js";
import { h, replace } from "./dom.js";
import { renderProviders } from "./providers.js";
import { renderSession, renderSessions } from "./sessions.js";
import { renderWorkspace } from "./workspace.js";
import { renderWorkspaces } from "./workspaces.js";

const app = document.getElementById("app");
const banner = document.getElementById("banner");
let leaving = [];
let version = "";
let signOutReason = "";

const NAV = [
  ["workspaces", "Workspaces"],
  ["sessions", "Sessions"],
  ["providers", "Providers & pools"],
];

function leaveView() {
  for (const stop of leaving.splice(0)) {
    try {
      stop();
    } catch (error) {
      console.error(error);
    }
  }
}

/** The route in the hash: path parts (decoded) and query parameters. */
function currentRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?", 2);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts: parts.length ? parts : ["workspaces"], query: new URLSearchParams(query) };
}

function signOut(reason = "") {
  api.token.clear();
  signOutReason = reason;
  if (location.hash !== "#/login") location.hash = "#/login";
  else route();
}

function header(section) {
  return h(
    "header",
    { class: "topbar" },
    h("a", { class: "brand", href: "#/workspaces" }, h("span", { class: "brand-mark" }), "Corral"),
    h(
      "nav",
      { class: "nav" },
      NAV.map(([id, title]) =>
        h("a", { href: `#/${id}`, class: section === id ? "active" : "", "aria-current": section === id && "page" }, title),
      ),
    ),
    h(
      "div",
      { class: "topbar-right" },
      version && h("span", { class: "muted" }, `server ${version}`),
      h("button", { class: "btn btn-ghost", type: "button", id: "sign-out", onclick: () => signOut() }, "Sign out"),
    ),
  );
}

function renderLogin() {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "CORRAL_API_TOKEN",
    required: true,
  });
  const message = h("p", { id: "login-error", class: "notice notice-error", role: "alert", hidden: !signOutReason });
  message.textContent = signOutReason;
  const button = h("button", { class: "btn btn-primary", type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "login-card", id: "login-form" },
    h("div", { class: "login-brand" }, h("span", { class: "brand-mark big" }), h("h1", {}, "Corral")),
    h("p", { class: "muted" }, "Sign in with this server's API token."),
    h("label", { for: "token" }, "API token"),
    input,
    message,
    button,
    h(
      "p",
      { class: "hint" },
      "The token is CORRAL_API_TOKEN, or the contents of $CORRAL_DATA_DIR/api-token. ",
      "It is kept in this browser tab only (sessionStorage) and sent to this server alone.",
    ),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) return;
    button.disabled = true;
    message.hidden = true;
    try {
      await api.get(api.WORKSPACES, { token: value });
      api.token.set(value);
      signOutReason = "";
      location.hash = "#/workspaces";
    } catch (error) {
      message.textContent =
        error.status === 401
          ? "That token was refused by the server: check CORRAL_API_TOKEN and try again."
          : `Could not sign in: ${error.message}`;
      message.hidden = false;
      input.select();
    } finally {
      button.disabled = false;
    }
  });
  replace(app, h("main", { class: "login" }, form));
  input.focus();
}

function route() {
  leaveView();
  const { parts, query } = currentRoute();
  if (!api.token.get() || parts[0] === "login") {
    if (api.token.get()) {
      location.hash = "#/workspaces";
      return;
    }
    renderLogin();
    return;
  }
  const section = NAV.some(([id]) => id === parts[0]) ? parts[0] : "workspaces";
  const main = h("main", { class: "content" });
  replace(app, header(section), main);
  const ctx = {
    onLeave: (stop) => leaving.push(stop),
    navigate: (hash) => {
      location.hash = hash;
    },
  };
  if (section === "workspaces" && parts.length >= 2) {
    renderWorkspace(main, parts[1], parts[2] ?? "terminal", query, ctx);
  } else if (section === "workspaces") {
    renderWorkspaces(main, ctx);
  } else if (section === "sessions" && parts.length >= 2) {
    renderSession(main, parts[1], ctx);
  } else if (section === "sessions") {
    renderSessions(main, ctx);
  } else {
    renderProviders(main, ctx);
  }
}

async function checkAssets() {
  try {
    const answer = await fetch("/console/assets", { cache: "no-store" });
    const data = await answer.json();
    if (Array.isArray(data.missing) && data.missing.length > 0) {
      replace(
        banner,
        h("strong", {}, "The terminal's browser files are not installed on this server. "),
        `Missing: ${data.missing.join(", ")}. To fix: ${data.hint}. The rest of the console works without them.`,
      );
      banner.hidden = false;
    }
  } catch (error) {
    console.error("asset check failed", error);
  }
}

async function loadVersion() {
  try {
    const answer = await fetch("/healthz", { cache: "no-store" });
    version = (await answer.json()).version ?? "";
  } catch {
    version = "";
  }
}

api.onUnauthorized(() => signOut("The server no longer accepts this token; sign in again."));
window.addEventListener("hashchange", route);
checkAssets();
loadVersion().finally(route);

// A terminal in a running workspace: xterm.js (served by Corral from web/node_modules) over the PTY WebSocket
// GET /api/v1/agent/workspaces/{id}/pty. A browser cannot set an Authorization header on a WebSocket, so the token
// travels in the subprotocol list: ["corral.pty", "corral.token.<base64url(token), no padding>"]. Keystrokes go as
// binary frames, a resize as the text frame {"type": "resize", "rows", "cols"}; output comes back as binary
// frames, and the end as {"type": "exit", "exit_code"} (or {"type": "error", ...}) before the server closes.

import * as api from "./api.js";
import { h, replace } from "./dom.js";

const VENDOR = "/console/vendor";

const CLOSE_REASONS = {
  1000: "The shell ended.",
  1006: "The terminal connection failed: the server refused the WebSocket or went away.",
  1011: "The terminal failed on the server.",
  4400: "The server refused the terminal request as malformed.",
  4401: "The server refused the token for the terminal; sign in again.",
  4404: "This workspace does not exist (any more).",
  4409: "The workspace is not running: resume it, then reconnect.",
};

/** base64url of the token's UTF-8 bytes, without '=' padding (a subprotocol name cannot hold '+', '/' or '='). */
export function base64url(text) {
  let binary = "";
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function loadXtermCss() {
  if (document.getElementById("xterm-css")) return;
  document.head.append(h("link", { id: "xterm-css", rel: "stylesheet", href: `${VENDOR}/xterm.css` }));
}

const THEME = {
  background: "#0f172a",
  foreground: "#e2e8f0",
  cursor: "#38bdf8",
  selectionBackground: "#334155",
  black: "#1e293b",
  red: "#f87171",
  green: "#4ade80",
  yellow: "#facc15",
  blue: "#60a5fa",
  magenta: "#c084fc",
  cyan: "#22d3ee",
  white: "#e2e8f0",
  brightBlack: "#64748b",
  brightRed: "#fca5a5",
  brightGreen: "#86efac",
  brightYellow: "#fde047",
  brightBlue: "#93c5fd",
  brightMagenta: "#d8b4fe",
  brightCyan: "#67e8f9",
  brightWhite: "#f8fafc",
};

/**
 * Open a terminal on the workspace inside `holder`.
 * @param {HTMLElement} holder
 * @param {string} workspaceId
 * @param {{onLeave: (stop: () => void) => void}} ctx
 */
export async function renderTerminal(holder, workspaceId, ctx) {
  const state = h("span", { class: "term-state", id: "terminal-state" }, "Loading the terminal…");
  const reconnect = h("button", { class: "btn btn-small", type: "button", id: "terminal-reconnect", disabled: true }, "Reconnect");
  const screen = h("div", { class: "terminal", id: "terminal" });
  replace(holder, h("div", { class: "term-bar" }, state, reconnect), screen);
  let left = false;
  let socket = null;
  let observer = null;
  let term = null;
  ctx.onLeave(() => {
    left = true;
    socket?.close(1000);
    observer?.disconnect();
    term?.dispose();
  });

  let modules;
  try {
    modules = await Promise.all([import(`${VENDOR}/xterm.mjs`), import(`${VENDOR}/addon-fit.mjs`)]);
  } catch (error) {
    console.error(error);
    replace(
      holder,
      h(
        "div",
        { class: "notice notice-error", role: "alert", id: "terminal-missing" },
        "The terminal's browser files (xterm.js) could not be loaded from this server. Run `make bootstrap` on the ",
        "server (it installs them into web/node_modules), or set CORRAL_WEB_ASSETS_DIR, then reload this page.",
      ),
    );
    return;
  }
  if (left) return;

  const [{ Terminal }, { FitAddon }] = modules;
  loadXtermCss();
  term = new Terminal({
    cursorBlink: true,
    fontFamily: '"DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace',
    fontSize: 14,
    scrollback: 5000,
    theme: THEME,
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();
  let pending = 0;
  observer = new ResizeObserver(() => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => {
      if (!left) fit.fit();
    });
  });
  observer.observe(screen);

  const encoder = new TextEncoder();
  const send = (data) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(data);
  };
  term.onData((data) => send(encoder.encode(data)));
  term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  // The size is also on the element (data-size="ROWSxCOLS"), for anyone checking what the shell was told.
  const showSize = () => {
    screen.dataset.size = `${term.rows}x${term.cols}`;
  };
  showSize();
  term.onResize(({ rows, cols }) => {
    showSize();
    send(JSON.stringify({ type: "resize", rows, cols }));
  });

  const setState = (text, kind) => {
    state.textContent = text;
    state.dataset.kind = kind;
  };

  function connect() {
    reconnect.disabled = true;
    setState("Connecting…", "info");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const query = new URLSearchParams({ rows: String(term.rows), cols: String(term.cols) });
    const url = `${scheme}//${location.host}${api.WORKSPACES}/${api.seg(workspaceId)}/pty?${query}`;
    let ended = null;
    let failure = null;
    socket = new WebSocket(url, ["corral.pty", `corral.token.${base64url(api.token.get() ?? "")}`]);
    socket.binaryType = "arraybuffer";
    socket.addEventListener("open", () => {
      setState(`Connected: a shell in ${workspaceId}`, "ok");
      term.focus();
    });
    socket.addEventListener("message", (event) => {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data));
        return;
      }
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return;
      }
      if (message.type === "exit") ended = message.exit_code;
      if (message.type === "error") failure = String(message.message ?? message.code ?? "error");
    });
    socket.addEventListener("close", (event) => {
      if (left) return;
      reconnect.disabled = false;
      if (ended !== null) {
        term.write(`\r\n\x1b[2m[the shell exited with code ${ended}]\x1b[0m\r\n`);
        setState(`Ended (exit code ${ended}). Reconnect starts a new shell.`, "neutral");
      } else {
        const reason = failure ?? event.reason ?? "";
        const known = CLOSE_REASONS[event.code] ?? `The terminal closed (code ${event.code}).`;
        setState(reason ? `${known} ${reason}` : known, "bad");
      }
    });
  }

  reconnect.addEventListener("click", () => {
    term.reset();
    connect();
  });
  connect();
}

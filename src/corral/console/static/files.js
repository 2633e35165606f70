// A workspace's files: browse directories (files/list), upload (PUT .../files?path=, the File streamed as the
// body), download (fetch with the token, then a blob: a plain link could not carry the Authorization header) and
// delete. File names are written by whatever runs in the workspace: they are shown as text only.

import * as api from "./api.js";
import { bytes, h, notice, replace, table } from "./dom.js";

const ROOT = "/workspace";

/** Join a directory and a name the way the server reads paths (absolute, '/'-separated). */
function join(dir, name) {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

const isDirectory = (entry) => entry.type === "dir";

function parent(path) {
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function filesUrl(workspaceId, suffix, params) {
  return `${api.WORKSPACES}/${api.seg(workspaceId)}/files${suffix}?${new URLSearchParams(params)}`;
}

/** Save a file from the workspace on this computer. */
async function download(workspaceId, entry, status) {
  status(`Downloading ${entry.name}…`, "info");
  const response = await api.request("GET", filesUrl(workspaceId, "", { path: entry.path }), { raw: true });
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: entry.name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the download has its own copy by then
  status(`Downloaded ${entry.name} (${bytes(blob.size)}).`, "ok");
}

/**
 * The file browser of one workspace, showing `path` (default /workspace).
 * @param {HTMLElement} holder
 * @param {string} workspaceId
 * @param {string} path
 * @param {{navigate: (hash: string) => void, onLeave: (stop: () => void) => void}} ctx
 */
export function renderFiles(holder, workspaceId, path, ctx) {
  const dir = path || ROOT;
  const go = (target) => ctx.navigate(`#/workspaces/${api.seg(workspaceId)}/files?${new URLSearchParams({ path: target })}`);
  const statusLine = h("div", { class: "status-line", id: "files-status" });
  const status = (text, kind) => replace(statusLine, notice(text, kind));
  const listing = h("div", { id: "files-table" }, h("p", { class: "muted" }, "Loading…"));

  const crumbs = h("nav", { class: "crumbs", "aria-label": "path" });
  const parts = dir.split("/").filter(Boolean);
  crumbs.append(h("a", { href: "#", onclick: (e) => (e.preventDefault(), go("/")) }, "/"));
  parts.forEach((part, i) => {
    const target = `/${parts.slice(0, i + 1).join("/")}`;
    if (i > 0) crumbs.append(h("span", { class: "sep" }, "/"));
    crumbs.append(h("a", { href: "#", onclick: (e) => (e.preventDefault(), go(target)) }, part));
  });

  const picker = h("input", { type: "file", multiple: true, id: "upload-input", class: "visually-hidden" });
  picker.addEventListener("change", async () => {
    const chosen = [...picker.files];
    picker.value = "";
    for (const file of chosen) {
      status(`Uploading ${file.name} (${bytes(file.size)})…`, "info");
      try {
        const answer = await api.request("PUT", filesUrl(workspaceId, "", { path: join(dir, file.name) }), {
          body: file,
        });
        status(`Uploaded ${answer.path} (${bytes(answer.bytes_written)}).`, "ok");
      } catch (error) {
        status(`Upload of ${file.name} failed: ${error.message}`, "error");
        break;
      }
    }
    load();
  });

  replace(
    holder,
    h(
      "div",
      { class: "files-bar" },
      crumbs,
      h(
        "div",
        { class: "page-actions" },
        h("button", { class: "btn btn-small", type: "button", disabled: dir === "/", onclick: () => go(parent(dir)) }, "Up"),
        h("button", { class: "btn btn-small", type: "button", onclick: () => load() }, "Refresh"),
        h("label", { class: "btn btn-small btn-primary", for: "upload-input", id: "upload-button" }, "Upload files"),
        picker,
      ),
    ),
    statusLine,
    listing,
  );

  function entryRow(entry) {
    const isDir = isDirectory(entry);
    const name = isDir
      ? h("a", { href: "#", class: "file-dir", onclick: (e) => (e.preventDefault(), go(entry.path)) }, `${entry.name}/`)
      : h("span", { class: "file-name" }, entry.name);
    const actions = [];
    if (!isDir) {
      actions.push(
        h(
          "button",
          {
            class: "btn btn-small",
            type: "button",
            dataset: { action: "download" },
            onclick: () => download(workspaceId, entry, status).catch((error) => status(`Download failed: ${error.message}`, "error")),
          },
          "Download",
        ),
      );
    }
    actions.push(
      h(
        "button",
        {
          class: "btn btn-small btn-danger",
          type: "button",
          dataset: { action: "delete" },
          onclick: async () => {
            if (!window.confirm(`Delete ${entry.path}${isDir ? " and everything in it" : ""}?`)) return;
            try {
              await api.del(filesUrl(workspaceId, "", { path: entry.path, recursive: String(isDir) }));
              status(`Deleted ${entry.path}.`, "ok");
            } catch (error) {
              status(`Delete failed: ${error.message}`, "error");
            }
            load();
          },
        },
        "Delete",
      ),
    );
    return h(
      "tr",
      { dataset: { name: entry.name, type: entry.type } },
      h("td", {}, name, entry.symlink_target && h("span", { class: "muted small" }, ` → ${entry.symlink_target}`)),
      h("td", { class: "num" }, isDir ? "—" : bytes(entry.size)),
      h("td", {}, h("code", {}, entry.mode ?? "")),
      h("td", {}, entry.mtime ? new Date(entry.mtime * 1000).toLocaleString() : "—"),
      h("td", { class: "actions" }, actions),
    );
  }

  async function load() {
    try {
      const answer = await api.get(filesUrl(workspaceId, "/list", { path: dir }));
      const entries = [...(answer.entries ?? [])].sort(
        (a, b) => isDirectory(b) - isDirectory(a) || a.name.localeCompare(b.name),
      );
      replace(
        listing,
        table(["Name", "Size", "Mode", "Modified", ""], entries.map(entryRow), {
          empty: "This directory is empty. Upload files with “Upload files”.",
          className: "files",
        }),
      );
    } catch (error) {
      replace(listing, notice(`Could not list ${dir}: ${error.message}`, "error"));
    }
  }

  load();
}

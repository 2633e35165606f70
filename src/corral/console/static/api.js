// Corral's JSON API, with the token from this tab's sessionStorage in an Authorization header.

const TOKEN_KEY = "corral.token";

/** The API token of this browser tab (sessionStorage: gone when the tab closes, never sent anywhere but here). */
export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/** An answer other than 2xx, or no answer at all (status 0), with Corral's error code and message. */
export class ApiError extends Error {
  constructor(status, code, message, details = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

let unauthorized = () => {};

/** What to do when the stored token is refused (401): the console signs out. */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/**
 * Call the API.
 * @param {string} method
 * @param {string} path starting with /api/ (or /e2b/)
 * @param {{json?: any, body?: BodyInit, token?: string, raw?: boolean}} [options] `token` checks a token not yet
 *   stored (the login form); `raw` returns the Response (downloads).
 */
export async function request(method, path, options = {}) {
  const given = options.token;
  const headers = { Authorization: `Bearer ${given ?? token.get() ?? ""}` };
  let body = options.body;
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.json);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body, cache: "no-store" });
  } catch (error) {
    throw new ApiError(0, "network_error", `Cannot reach the Corral server (${error.message}).`);
  }
  if (!response.ok) {
    let code = `http_${response.status}`;
    let message = `${method} ${path} answered HTTP ${response.status}`;
    let details = {};
    try {
      const data = await response.json();
      if (data && typeof data.error === "object" && data.error !== null) {
        code = String(data.error.code ?? code);
        message = String(data.error.message ?? message);
        details = data.error.details ?? {};
      } else if (data && typeof data.message === "string") {
        message = data.message; // the E2B-compatible routes answer {code, message}
      }
    } catch {
      // not JSON: keep the generic message
    }
    const error = new ApiError(response.status, code, message, details);
    if (response.status === 401 && given === undefined) unauthorized(error);
    throw error;
  }
  if (options.raw) return response;
  if (response.status === 204) return null;
  return response.json();
}

export const get = (path, options) => request("GET", path, options);
export const post = (path, json = {}) => request("POST", path, { json });
export const del = (path) => request("DELETE", path);

/** A path segment (ids, names) made safe for a URL. */
export const seg = (value) => encodeURIComponent(String(value));

export const WORKSPACES = "/api/v1/agent/workspaces";
export const SESSIONS = "/api/v1/agent/sessions";
export const AGENT_TYPES = "/api/v1/agent-types";

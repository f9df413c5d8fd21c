// The bearer token of the service's pages (/ui, /docs, /redoc): asked for once when the API answers 401,
// kept in this tab's sessionStorage, sent as "Authorization: Bearer" on every API request. A 403 (wrong
// token) forgets it and asks again. Nothing is shown before the API accepted the request.
"use strict";

const Auth = (() => {
  const KEY = "rlvr-selector.token";
  const root = document.body.dataset.root || "";

  class AuthError extends Error {
    constructor(status, detail) {
      super(detail || `HTTP ${status}`);
      this.status = status;
    }
  }

  const token = () => sessionStorage.getItem(KEY) || "";

  function headers() {
    const t = token();
    return t ? { Authorization: `Bearer ${t}` } : {};
  }

  async function detail(response) {
    try {
      return (await response.json()).detail || response.statusText;
    } catch (_err) {
      return response.statusText;
    }
  }

  // GET `path` (below the service's root) as JSON; AuthError on 401/403, Error on any other failure.
  async function request(path) {
    const response = await fetch(root + path, {
      headers: { Accept: "application/json", ...headers() },
      cache: "no-store",
    });
    if (response.status === 401 || response.status === 403) {
      throw new AuthError(response.status, await detail(response));
    }
    if (!response.ok) {
      const err = new Error(`${response.status}: ${await detail(response)}`);
      err.status = response.status;
      throw err;
    }
    return response.json();
  }

  // Shows the token form; resolves once a token was entered.
  function ask(status) {
    const gate = document.getElementById("gate");
    const message = gate.querySelector("[data-role=message]");
    const form = gate.querySelector("form");
    const input = form.querySelector("input");
    message.textContent =
      status === 403
        ? "That token was refused (403 wrong bearer token). Enter the service's SELECTOR_API_TOKEN:"
        : "This service asks for its API token (SELECTOR_API_TOKEN):";
    gate.dataset.status = String(status);
    gate.hidden = false;
    input.value = "";
    input.focus();
    return new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        const value = input.value.trim();
        if (!value) return;
        sessionStorage.setItem(KEY, value);
        gate.hidden = true;
        resolve(value);
      };
    });
  }

  // Runs `fn` until it gets past the token check, asking for the token in between. `onLocked` runs
  // whenever the API refuses, so that the caller can hide what it showed.
  async function withToken(fn, onLocked) {
    for (;;) {
      try {
        return await fn();
      } catch (err) {
        if (!(err instanceof AuthError)) throw err;
        if (err.status === 403) sessionStorage.removeItem(KEY);
        if (onLocked) onLocked();
        await ask(err.status);
      }
    }
  }

  const forget = () => sessionStorage.removeItem(KEY);

  return { AuthError, forget, headers, request, root, token, withToken };
})();

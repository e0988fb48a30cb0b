// What every portal page shares: the REST API under the page's own session, formatting, and a live
// region that screen readers announce. Pages use it as window.Polychip.
(function () {
  "use strict";
  const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

  class ApiError extends Error {
    constructor(status, body) {
      const error = (body && body.error) || {};
      super(error.message || `HTTP ${status}`);
      this.status = status;
      this.field = error.field || null;
      this.errors = error.errors || (error.message ? [{field: error.field || null, message: error.message}] : []);
      this.code = error.code || null;
    }
  }

  // A JSON API call signed by the session: unsafe methods carry the CSRF token and a fresh
  // Idempotency-Key, so a double click or a retried request does the thing once.
  async function api(path, {method = "GET", body, contentType = "application/json", signal} = {}) {
    const headers = {Accept: "application/json"};
    if (method !== "GET") {
      headers["X-CSRFToken"] = csrf();
      headers["Idempotency-Key"] = crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.random()}`;
    }
    let payload = body;
    const form = typeof FormData !== "undefined" && body instanceof FormData;  // the browser sets its boundary
    if (body !== undefined && !form && contentType === "application/json" && typeof body !== "string") payload = JSON.stringify(body);
    if (body !== undefined && !form && contentType) headers["Content-Type"] = contentType;
    const response = await fetch(path, {method, headers, body: payload, credentials: "same-origin", signal});
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  function escapeHtml(s) {
    return String(s ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  const text = (value) => (value === null || value === undefined ? "–" : String(value));
  const fmtNumber = (v, digits = 3) => (typeof v === "number" ? v.toFixed(digits) : "–");
  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return `${i ? n.toFixed(n < 10 ? 1 : 0) : Math.round(n)} ${units[i]}`;
  }
  const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "–");

  // One polite live region per page: what changed, said once (state changes, action results).
  function announce(message) {
    const region = document.getElementById("announce");
    if (!region) return;
    region.textContent = "";
    setTimeout(() => { region.textContent = message; }, 30);
  }

  // A job's devices now: the open allocations, else (an ended job) each rank's newest one, so a job that
  // was restarted shows the devices of its last attempt, not the sum over attempts.
  function currentDevices(devices) {
    const open = devices.filter((d) => !d.ended_at);
    if (open.length) return open;
    const byRank = new Map();
    for (const d of devices) {
      const seen = byRank.get(d.rank);
      if (!seen || (d.started_at || "") > (seen.started_at || "")) byRank.set(d.rank, d);
    }
    return [...byRank.values()].sort((a, b) => a.rank - b.rank);
  }

  function deviceChips(devices) {
    const counts = new Map();
    for (const d of currentDevices(devices)) counts.set(d.flavor, (counts.get(d.flavor) || 0) + 1);
    if (!counts.size) return "–";
    return [...counts].map(([flavor, n]) => `<span class="chip">${n}× ${escapeHtml(flavor)}</span>`).join("");
  }

  // The tenant's job events over the WebSocket, reconnecting with back-off; `onEvent(job, event)`.
  // With `metricsOf` (a job id), that job's new metric points too: `onMetrics(points)`.
  function jobSocket({onEvent, onSnapshot, onMetrics, metricsOf, status}) {
    let delay = 500;
    function connect() {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const query = metricsOf ? `?metrics=${encodeURIComponent(metricsOf)}` : "";
      const socket = new WebSocket(`${scheme}://${location.host}/ws/jobs/${query}`);
      socket.onopen = () => { if (status) { status.textContent = "live"; status.className = "live on"; } delay = 500; };
      socket.onmessage = (message) => {
        const data = JSON.parse(message.data);
        if (data.type === "job_event") onEvent(data.job, data.event);
        else if (data.type === "snapshot" && onSnapshot) onSnapshot(data.jobs);
        else if (data.type === "job_metrics" && onMetrics) onMetrics(data.points);
      };
      socket.onclose = () => {
        if (status) { status.textContent = "reconnecting…"; status.className = "live off"; }
        setTimeout(connect, delay); delay = Math.min(delay * 2, 10000);
      };
    }
    connect();
  }

  // A uPlot chart (the page loads uPlot) that follows its box's width: a phone held upright, a window
  // made narrower. `options` are uPlot's, less the size.
  function chart(el, options, data, height = 220) {
    const plot = new uPlot({...options, width: Math.max(200, el.clientWidth || 320), height}, data, el);
    new ResizeObserver(() => {
      const fits = Math.max(200, el.clientWidth);
      if (Math.abs(fits - plot.width) > 2) plot.setSize({width: fits, height});
    }).observe(el);
    return plot;
  }

  // Epoch seconds of ISO 8601 times, for a time axis.
  const epochSeconds = (times) => times.map((t) => Date.parse(t) / 1000);

  const TERMINAL = ["succeeded", "failed", "cancelled"];
  window.Polychip = {api, ApiError, escapeHtml, text, fmtNumber, fmtBytes, fmtTime, announce, currentDevices, deviceChips, jobSocket, chart, epochSeconds, TERMINAL};
})();

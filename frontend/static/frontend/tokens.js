// Tokens (issue with scopes and expiry, the secret shown once; revoke) and the tenant's budgets.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  if (!$("token-form")) return;

  const errorsIn = (list, error) => {
    const errors = error.errors && error.errors.length ? error.errors : [{field: error.field, message: error.message}];
    list.innerHTML = errors.map((e) => `<li>${e.field ? `<code>${P.escapeHtml(e.field)}</code>: ` : ""}${P.escapeHtml(e.message)}</li>`).join("");
  };

  function row(t) {
    const state = t.revoked_at ? "revoked" : t.expires_at && new Date(t.expires_at) <= new Date() ? "expired" : "active";
    const revoke = state === "active" ? `<button type="button" class="danger" data-revoke="${t.id}" aria-label="Revoke token ${P.escapeHtml(t.name)}">Revoke</button>` : "";
    return `<tr data-token="${t.id}"><td>${P.escapeHtml(t.name)}</td><td><code>${P.escapeHtml(t.prefix)}</code></td><td>${t.scopes.map(P.escapeHtml).join(", ")}</td>`
      + `<td>${P.escapeHtml(t.user || "")}</td><td>${t.expires_at ? P.fmtTime(t.expires_at) : "never"}</td><td>${P.fmtTime(t.last_used_at)}</td>`
      + `<td data-testid="token-state">${state}</td><td>${revoke}</td></tr>`;
  }

  async function loadTokens(url = "/api/v1/tokens?limit=100", append = false) {
    const body = await P.api(url);
    const tbody = $("tokens").tBodies[0];
    const html = body.tokens.map(row).join("");
    tbody.innerHTML = append ? tbody.innerHTML + html : html || `<tr><td colspan="8" class="muted">No tokens yet.</td></tr>`;
    $("tokens-more").innerHTML = body.next ? `<button type="button" id="more-tokens" data-next="${P.escapeHtml(body.next)}">More tokens</button>` : "";
  }

  $("tokens-more").addEventListener("click", (e) => { if (e.target.dataset.next) loadTokens(e.target.dataset.next, true); });

  $("token-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("token-errors").innerHTML = "";
    const scopes = [...document.querySelectorAll('#token-form input[name="scopes"]:checked')].map((i) => i.value);
    const body = {name: $("t-name").value, scopes};
    if ($("t-days").value) body.expires_in_days = Number($("t-days").value);
    try {
      const token = await P.api("/api/v1/tokens", {method: "POST", body});
      $("token-secret").innerHTML = `<p><strong>Copy this secret now:</strong> it is not shown again.</p><p class="secret" data-testid="secret">${P.escapeHtml(token.secret)}</p>`;
      P.announce(`token ${token.name} issued`);
      $("token-form").reset();
      await loadTokens();
    } catch (error) {
      errorsIn($("token-errors"), error);
    }
  });

  $("tokens").addEventListener("click", async (event) => {
    const id = event.target.dataset.revoke;
    if (!id || !window.confirm("Revoke this token? Whatever uses it stops working at once.")) return;
    try {
      await P.api(`/api/v1/tokens/${id}/revoke`, {method: "POST"});
      P.announce("token revoked");
      await loadTokens();
    } catch (error) {
      errorsIn($("token-errors"), error);
    }
  });

  // --- budgets ----------------------------------------------------------------------------------

  async function loadBudget() {
    const b = await P.api("/api/v1/billing/budget");
    $("b-soft").value = b.soft_budget ?? "";
    $("b-hard").value = b.hard_budget ?? "";
    $("budget-status").textContent = `${b.currency} ${b.spend} spent this month.`;
  }

  $("budget-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("budget-errors").innerHTML = "";
    const amount = (v) => (v.trim() === "" ? null : v.trim());
    try {
      await P.api("/api/v1/billing/budget", {method: "PUT", body: {soft_budget: amount($("b-soft").value), hard_budget: amount($("b-hard").value)}});
      P.announce("budgets saved");
      await loadBudget();
      $("budget-status").textContent = `Saved. ${$("budget-status").textContent}`;
    } catch (error) {
      errorsIn($("budget-errors"), error);
    }
  });

  loadTokens().catch((error) => errorsIn($("token-errors"), error));
  loadBudget().catch((error) => errorsIn($("budget-errors"), error));
})();

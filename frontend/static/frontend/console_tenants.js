// The operator console's tenants, quotas and cohorts editors: what the operator API already validates,
// with its errors shown by field (the inputs named by an error are marked invalid) and nothing changed
// by a form that is refused.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  let tenants = [];
  let cohorts = [];
  let editing = null;  // the slug of the tenant in the editor

  // Errors as a list of "field: message", and each input whose data-field the API named marked invalid.
  function showErrors(list, form, error) {
    const errors = error.errors && error.errors.length ? error.errors : [{field: error.field, message: error.message}];
    list.innerHTML = errors.map((e) => `<li>${e.field ? `<code>${P.escapeHtml(e.field)}</code>: ` : ""}${P.escapeHtml(e.message)}</li>`).join("");
    const named = new Set(errors.map((e) => e.field));
    for (const input of form ? form.querySelectorAll("[data-field]") : []) {
      if (named.has(input.dataset.field)) input.setAttribute("aria-invalid", "true");
    }
  }
  function clearErrors(list, form) {
    list.innerHTML = "";
    for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
  }

  const limit = (v) => (v === null || v === undefined ? "" : String(v));
  const amountOrNull = (v) => (v.trim() === "" ? null : v.trim());

  function cohortOptions(select, chosen) {
    select.innerHTML = `<option value="">none</option>` + cohorts.map((c) => `<option value="${c.id}"${c.id === chosen ? " selected" : ""}>${P.escapeHtml(c.name)}</option>`).join("");
  }

  function drawTenants() {
    $("tenants").tBodies[0].innerHTML = tenants.map((t) => {
      const quotas = t.quotas.map((q) => `${P.escapeHtml(q.resource)} ${P.escapeHtml(q.nominal)}`).join(", ") || "none";
      return `<tr data-tenant="${P.escapeHtml(t.slug)}"><td>${P.escapeHtml(t.slug)}</td><td>${P.escapeHtml(t.name)}</td><td>${P.escapeHtml(t.cohort || "–")}</td>`
        + `<td class="num">${P.escapeHtml(t.fair_share_weight)}</td><td class="num">${t.max_queued_jobs ?? "default"}</td><td>${quotas}</td>`
        + `<td><button type="button" data-edit="${P.escapeHtml(t.slug)}" aria-label="Edit tenant ${P.escapeHtml(t.slug)}">Edit</button></td></tr>`;
    }).join("") || `<tr><td colspan="7" class="muted">No tenants yet.</td></tr>`;
  }

  function drawCohorts() {
    $("cohort-list").tBodies[0].innerHTML = cohorts.map((c) => `<tr data-cohort="${P.escapeHtml(c.name)}"><td>${P.escapeHtml(c.name)}</td><td>${P.escapeHtml(c.description)}</td>`
      + `<td>${c.tenants.map(P.escapeHtml).join(", ") || "–"}</td>`
      + `<td><button type="button" class="danger" data-delete-cohort="${c.id}" aria-label="Delete cohort ${P.escapeHtml(c.name)}">Delete</button></td></tr>`).join("")
      || `<tr><td colspan="4" class="muted">No cohorts yet.</td></tr>`;
    cohortOptions($("n-cohort"), null);
  }

  function quotaRow(q = {resource: "", nominal: "", borrowing_limit: null, lending_limit: null}) {
    const i = $("quota-rows").tBodies[0].rows.length;
    const cell = (key, value, label) => `<td><input data-key="${key}" data-field="quotas[${i}].${key}" value="${P.escapeHtml(limit(value))}" aria-label="${label} of quota ${i + 1}"${key === "resource" ? "" : ` inputmode="decimal"`}></td>`;
    const tr = document.createElement("tr");
    tr.innerHTML = cell("resource", q.resource, "Resource") + cell("nominal", q.nominal, "Nominal") + cell("borrowing_limit", q.borrowing_limit, "Borrowing limit")
      + cell("lending_limit", q.lending_limit, "Lending limit") + `<td><button type="button" class="danger" data-remove aria-label="Remove quota ${i + 1}">Remove</button></td>`;
    $("quota-rows").tBodies[0].append(tr);
  }

  // Row fields renumbered after a removal, so an error such as quotas[1].nominal names the row shown second.
  function renumber() {
    [...$("quota-rows").tBodies[0].rows].forEach((tr, i) => {
      for (const input of tr.querySelectorAll("input")) input.dataset.field = `quotas[${i}].${input.dataset.key}`;
    });
  }

  function edit(slug) {
    const t = tenants.find((x) => x.slug === slug);
    if (!t) return;
    editing = slug;
    $("editor").hidden = false;
    $("editor-title").textContent = `Tenant ${t.slug}`;
    $("e-name").value = t.name;
    cohortOptions($("e-cohort"), t.cohort_id);
    $("e-weight").value = t.fair_share_weight;
    $("e-max-queued").value = t.max_queued_jobs ?? "";
    $("quota-rows").tBodies[0].innerHTML = "";
    for (const q of t.quotas) quotaRow(q);
    clearErrors($("tenant-errors"), $("tenant-form"));
    clearErrors($("quota-errors"), $("quota-form"));
    $("e-name").focus();
  }

  const current = () => tenants.find((t) => t.slug === editing);

  async function load() {
    try {
      [tenants, cohorts] = await Promise.all([
        P.api("/api/v1/operator/tenants").then((b) => b.tenants),
        P.api("/api/v1/operator/cohorts").then((b) => b.cohorts),
      ]);
      drawTenants();
      drawCohorts();
      $("console-error").textContent = "";
      $("live").textContent = `updated ${new Date().toLocaleTimeString()}`;
      $("live").className = "live on";
    } catch (error) {
      $("console-error").textContent = error.message;
    }
  }

  $("tenants").addEventListener("click", (event) => { if (event.target.dataset.edit) edit(event.target.dataset.edit); });

  $("tenant-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const t = current();
    clearErrors($("tenant-errors"), $("tenant-form"));
    const body = {
      name: $("e-name").value,
      cohort: $("e-cohort").value === "" ? null : Number($("e-cohort").value),
      fair_share_weight: $("e-weight").value.trim(),
      max_queued_jobs: $("e-max-queued").value === "" ? null : Number($("e-max-queued").value),
    };
    try {
      await P.api(`/api/v1/operator/tenants/${t.id}`, {method: "PATCH", body});
      P.announce(`tenant ${t.slug} saved`);
      await load();
    } catch (error) {
      showErrors($("tenant-errors"), $("tenant-form"), error);
    }
  });

  $("add-quota").addEventListener("click", () => { quotaRow(); $("quota-rows").tBodies[0].lastElementChild.querySelector("input").focus(); });
  $("quota-rows").addEventListener("click", (event) => {
    if (event.target.dataset.remove === undefined) return;
    event.target.closest("tr").remove();
    renumber();
  });

  $("quota-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const t = current();
    clearErrors($("quota-errors"), $("quota-form"));
    const quotas = [...$("quota-rows").tBodies[0].rows].map((tr) => {
      const value = (key) => tr.querySelector(`[data-key="${key}"]`).value;
      return {resource: value("resource").trim(), nominal: amountOrNull(value("nominal")), borrowing_limit: amountOrNull(value("borrowing_limit")), lending_limit: amountOrNull(value("lending_limit"))};
    });
    try {
      await P.api(`/api/v1/operator/tenants/${t.id}/quotas`, {method: "PUT", body: {quotas}});
      P.announce(`quotas of ${t.slug} saved`);
      await load();
      edit(t.slug);
    } catch (error) {
      showErrors($("quota-errors"), $("quota-form"), error);
    }
  });

  $("new-tenant").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors($("new-tenant-errors"), $("new-tenant"));
    const body = {slug: $("n-slug").value.trim(), name: $("n-name").value.trim()};
    if ($("n-cohort").value !== "") body.cohort = Number($("n-cohort").value);
    try {
      const created = await P.api("/api/v1/operator/tenants", {method: "POST", body});
      P.announce(`tenant ${created.slug} created`);
      $("new-tenant").reset();
      await load();
      edit(created.slug);
    } catch (error) {
      showErrors($("new-tenant-errors"), $("new-tenant"), error);
    }
  });

  $("new-cohort").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors($("cohort-errors"), $("new-cohort"));
    try {
      const created = await P.api("/api/v1/operator/cohorts", {method: "POST", body: {name: $("c-name").value.trim(), description: $("c-description").value}});
      P.announce(`cohort ${created.name} created`);
      $("new-cohort").reset();
      await load();
    } catch (error) {
      showErrors($("cohort-errors"), $("new-cohort"), error);
    }
  });

  $("cohort-list").addEventListener("click", async (event) => {
    const id = event.target.dataset.deleteCohort;
    if (!id || !window.confirm("Delete this cohort? Its tenants stop lending to each other.")) return;
    clearErrors($("cohort-errors"), $("new-cohort"));
    try {
      await P.api(`/api/v1/operator/cohorts/${id}`, {method: "DELETE"});
      P.announce("cohort deleted");
      await load();
    } catch (error) {
      showErrors($("cohort-errors"), null, error);
    }
  });

  load();
})();

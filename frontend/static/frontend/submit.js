// The submit page: a form that writes the spec, an editor that is the spec (YAML or JSON), checked by
// the server's own parser as it changes (POST /api/v1/jobs/preview: every problem at once, and what
// admission would do now), a bundle upload, and the submit itself.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  const editor = $("editor");
  if (!editor) return;
  let bundle = "";

  const quote = (s) => JSON.stringify(String(s));  // a double-quoted YAML scalar

  function fromForm() {
    const form = $("spec-form");
    const flavors = [...form.querySelectorAll('input[name="flavors"]:checked')].map((i) => i.value);
    const kind = $("f-kind").value;
    const lines = [
      `name: ${quote($("f-name").value)}`,
      `devices: ${Number($("f-devices").value) || 0}`,
      `flavors: [${flavors.map(quote).join(", ")}]`,
      `priority: ${Number($("f-priority").value) || 0}`,
    ];
    if ($("f-wait").checked) lines.push("wait_for_capacity: true");
    lines.push("workload:", `  kind: ${kind}`);
    if (kind === "builtin") lines.push(`  model: ${$("f-model").value}`);
    else {
      lines.push(`  bundle: ${quote(bundle)}`, `  entrypoint: ${quote($("f-entrypoint").value)}`);
    }
    lines.push(`  steps: ${Number($("f-steps").value) || 0}`);
    editor.value = `${lines.join("\n")}\n`;
    check();
  }

  function showKind() {
    const own = $("f-kind").value !== "builtin";
    $("model-field").hidden = own;
    $("bundle-field").hidden = $("entrypoint-field").hidden = !own;
  }

  // --- checking as it changes ----------------------------------------------------------------------

  let timer = null;
  let inFlight = null;
  let valid = false;
  function check() {
    clearTimeout(timer);
    timer = setTimeout(runCheck, 350);
  }

  function markFields(errors) {
    const byName = {name: "f-name", devices: "f-devices", priority: "f-priority", "workload.steps": "f-steps",
      "workload.entrypoint": "f-entrypoint", "workload.bundle": "f-bundle", "workload.model": "f-model"};
    for (const id of Object.values(byName)) $(id).removeAttribute("aria-invalid");
    for (const e of errors) if (byName[e.field]) $(byName[e.field]).setAttribute("aria-invalid", "true");
  }

  async function runCheck() {
    if (inFlight) inFlight.abort();
    const controller = new AbortController();
    inFlight = controller;
    $("check-status").textContent = "checking…";
    try {
      const answer = await P.api("/api/v1/jobs/preview", {method: "POST", body: editor.value, contentType: "application/yaml", signal: controller.signal});
      showErrors([]);
      showPreview(answer);
      valid = true;
    } catch (error) {
      if (error.name === "AbortError") return;
      valid = false;
      showErrors(error.errors && error.errors.length ? error.errors : [{field: error.field, message: error.message}]);
      $("preview").innerHTML = "";
    } finally {
      if (inFlight === controller) { inFlight = null; $("check-status").textContent = valid ? "valid" : ""; }
      $("submit").disabled = !valid;
    }
  }

  function showErrors(errors) {
    $("errors").innerHTML = errors.map((e) => `<li data-field="${P.escapeHtml(e.field || "")}">${e.field ? `<code>${P.escapeHtml(e.field)}</code>: ` : ""}${P.escapeHtml(e.message)}</li>`).join("");
    markFields(errors);
    editor.setAttribute("aria-invalid", errors.length ? "true" : "false");
  }

  function showPreview(answer) {
    const a = answer.admission;
    let text;
    if (a.never) text = `<p class="error"><strong>Can never start:</strong> ${P.escapeHtml(a.never)}</p>`;
    else if (a.starts_now) {
      const devices = Object.entries(a.devices).map(([f, n]) => `${n}× ${P.escapeHtml(f)}`).join(", ");
      const cost = answer.cost_per_hour !== null ? `, ${P.escapeHtml(answer.currency)} ${P.escapeHtml(answer.cost_per_hour)} an hour at your prices` : answer.pricing_error ? ` (not priced: ${P.escapeHtml(answer.pricing_error)})` : "";
      text = `<p class="ok"><strong>Would start now</strong> on ${devices}, charging ${a.nau} NAU of your quota${a.borrowing ? " (borrowed from the cohort)" : ""}${cost}.</p>`;
    } else text = `<p><strong>Would wait:</strong> ${P.escapeHtml(a.reason)}</p>`;
    $("preview").innerHTML = text;
  }

  // --- bundle upload and submit -------------------------------------------------------------------

  $("f-bundle").addEventListener("change", async () => {
    const file = $("f-bundle").files[0];
    if (!file) return;
    $("bundle-status").textContent = `uploading ${file.name}…`;
    try {
      // As a form field: a signed-in session's CSRF check reads the form, so a raw body is for tokens (curl).
      const form = new FormData();
      form.append("bundle", file);
      form.append("name", file.name);
      const answer = await P.api("/api/v1/bundles", {method: "POST", body: form});
      bundle = answer.bundle;
      $("bundle-status").textContent = `uploaded ${file.name}: ${answer.files} files, ${P.fmtBytes(answer.size_bytes)} (${bundle})`;
      fromForm();
    } catch (error) {
      $("bundle-status").textContent = `upload refused: ${error.message}`;
    }
  });

  $("submit").addEventListener("click", async () => {
    $("submit-error").textContent = "";
    $("submit").disabled = true;
    try {
      const job = await P.api("/api/v1/jobs", {method: "POST", body: editor.value, contentType: "application/yaml"});
      P.announce(`job ${job.id} submitted`);
      location.href = `/jobs/${job.id}`;
    } catch (error) {
      showErrors(error.errors && error.errors.length ? error.errors : [{field: error.field, message: error.message}]);
      $("submit-error").textContent = "Not submitted.";
      $("submit").disabled = false;
    }
  });

  $("spec-form").addEventListener("input", (event) => { if (event.target.id !== "f-bundle") fromForm(); });
  $("f-kind").addEventListener("change", () => { showKind(); fromForm(); });
  editor.addEventListener("input", check);
  showKind();
  fromForm();
})();

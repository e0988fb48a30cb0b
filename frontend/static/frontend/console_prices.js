// The operator console's price books: each book's schedule of prices, a price scheduled from a later
// day, a new book (empty or a copy), and which book bills each tenant; all through the operator API,
// its errors shown by field.
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  let books = [];
  let tenants = [];

  function showErrors(list, form, error) {
    const errors = error.errors && error.errors.length ? error.errors : [{field: error.field, message: error.message}];
    list.innerHTML = errors.map((e) => `<li>${e.field ? `<code>${P.escapeHtml(e.field)}</code>: ` : ""}${P.escapeHtml(e.message)}</li>`).join("");
    const named = new Set(errors.map((e) => e.field));
    for (const input of form ? form.querySelectorAll("[data-field]") : []) if (named.has(input.dataset.field)) input.setAttribute("aria-invalid", "true");
  }
  function clearErrors(list, form) {
    list.innerHTML = "";
    for (const input of form ? form.querySelectorAll("[aria-invalid]") : []) input.removeAttribute("aria-invalid");
  }

  const today = () => new Date().toISOString().slice(0, 10);

  function drawBooks() {
    $("books").innerHTML = books.map((b) => {
      // A resource's current price is its latest one from today or before; later ones are scheduled.
      const rows = b.prices.map((p) => {
        const when = p.effective_from > today() ? "scheduled" : "";
        return `<tr data-resource="${P.escapeHtml(p.resource)}" data-from="${p.effective_from}"${when ? ` class="${when}"` : ""}><td>${P.escapeHtml(p.resource)}</td>`
          + `<td class="num">${P.escapeHtml(b.currency)} ${P.escapeHtml(p.per_hour)}</td><td>${p.effective_from}${when ? " (scheduled)" : ""}</td></tr>`;
      }).join("") || `<tr><td colspan="3" class="muted">No price yet.</td></tr>`;
      let who = b.is_default ? "every tenant without a book of its own" : b.tenants.join(", ") || "no tenant";
      if (b.next_tenants.length) who += `; from ${b.next_from} also ${b.next_tenants.join(", ")}`;
      return `<article class="book" data-book="${P.escapeHtml(b.name)}"><h3>${P.escapeHtml(b.name)} ${b.is_default ? `<span class="chip">default</span>` : ""}</h3>`
        + `<p class="small muted">${b.description ? `${P.escapeHtml(b.description)} · ` : ""}Bills: ${P.escapeHtml(who)}.</p>`
        + `<div class="scroll"><table><thead><tr><th>Resource</th><th>Per hour</th><th>From (UTC)</th></tr></thead><tbody>${rows}</tbody></table></div></article>`;
    }).join("");
    const options = books.map((b) => `<option value="${b.id}">${P.escapeHtml(b.name)}</option>`).join("");
    const chosen = $("p-book").value;
    $("p-book").innerHTML = options;
    if (chosen) $("p-book").value = chosen;
    $("b-copy").innerHTML = `<option value="">nothing (an empty book)</option>${options}`;
  }

  function drawTenants() {
    const billedBy = new Map();
    // What each tenant is (or, after a change made this period, will be) billed by.
    for (const b of books) for (const slug of [...b.tenants, ...b.next_tenants]) billedBy.set(slug, b.id);
    $("tenant-books").tBodies[0].innerHTML = tenants.map((t) => {
      const current = billedBy.get(t.slug);
      const options = `<option value="">the default</option>` + books.filter((b) => !b.is_default).map((b) => `<option value="${b.id}"${b.id === current ? " selected" : ""}>${P.escapeHtml(b.name)}</option>`).join("");
      return `<tr data-tenant="${P.escapeHtml(t.slug)}"><td>${P.escapeHtml(t.slug)}</td><td><select aria-label="Price book of ${P.escapeHtml(t.slug)}" data-tenant-id="${t.id}">${options}</select></td>`
        + `<td><button type="button" data-assign="${t.id}" aria-label="Save the price book of ${P.escapeHtml(t.slug)}">Save</button></td></tr>`;
    }).join("") || `<tr><td colspan="3" class="muted">No tenants.</td></tr>`;
  }

  async function load() {
    try {
      [books, tenants] = await Promise.all([
        P.api("/api/v1/operator/price-books").then((b) => b.price_books),
        P.api("/api/v1/operator/tenants").then((b) => b.tenants),
      ]);
      drawBooks();
      drawTenants();
      $("console-error").textContent = "";
      $("live").textContent = `updated ${new Date().toLocaleTimeString()}`;
      $("live").className = "live on";
    } catch (error) {
      $("console-error").textContent = error.message;
    }
  }

  $("price-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors($("price-errors"), $("price-form"));
    const body = {resource: $("p-resource").value.trim(), per_hour: $("p-per-hour").value.trim(), effective_from: $("p-from").value};
    try {
      const book = await P.api(`/api/v1/operator/price-books/${$("p-book").value}/prices`, {method: "POST", body});
      P.announce(`${body.resource} priced at ${book.currency} ${body.per_hour} an hour from ${body.effective_from} in ${book.name}`);
      await load();
    } catch (error) {
      showErrors($("price-errors"), $("price-form"), error);
    }
  });

  $("book-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors($("book-errors"), $("book-form"));
    const body = {name: $("b-name").value.trim(), currency: $("b-currency").value.trim()};
    if ($("b-copy").value) body.copy_from = Number($("b-copy").value);
    try {
      const book = await P.api("/api/v1/operator/price-books", {method: "POST", body});
      P.announce(`price book ${book.name} created`);
      $("book-form").reset();
      await load();
    } catch (error) {
      showErrors($("book-errors"), $("book-form"), error);
    }
  });

  $("tenant-books").addEventListener("click", async (event) => {
    const id = event.target.dataset.assign;
    if (!id) return;
    clearErrors($("assign-errors"), null);
    const chosen = document.querySelector(`select[data-tenant-id="${id}"]`).value;
    try {
      const book = await P.api(`/api/v1/operator/tenants/${id}/price-book`, {method: "PUT", body: {price_book: chosen ? Number(chosen) : null}});
      P.announce(`billed by ${book.name} from ${book.next_from} on`);
      await load();
    } catch (error) {
      showErrors($("assign-errors"), null, error);
    }
  });

  // The earliest day a price may take effect: tomorrow (UTC).
  const tomorrow = new Date(Date.now() + 86400000).toISOString().slice(0, 10);
  $("p-from").min = tomorrow;
  $("p-from").value = tomorrow;
  load();
})();

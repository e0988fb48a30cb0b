// Use over time, from the REST API, redrawn every minute: the tenant's quota use against its nominal
// share (the jobs page's quota card), and each flavor's devices held and training (the console).
(function () {
  "use strict";
  const P = window.Polychip;
  const $ = (id) => document.getElementById(id);
  const REFRESH_MS = 60000;
  const AXIS_X = {scales: {x: {time: true}}};

  // --- a tenant's quota ---------------------------------------------------------------------------

  let quotaChart = null;
  async function drawQuota() {
    const el = $("chart-quota");
    const body = await P.api("/api/v1/quotas/history?hours=24");
    const resource = body.resources.find((r) => r.resource === $("quota-resource").value) || body.resources[0];
    if (!resource) return;
    const x = P.epochSeconds(body.buckets);
    const data = [x, resource.in_use, x.map(() => resource.nominal), resource.borrowed];
    if (quotaChart && quotaChart.resource === resource.resource) quotaChart.plot.setData(data);
    else {
      if (quotaChart) quotaChart.plot.destroy();
      const plot = P.chart(el, {
        ...AXIS_X,
        axes: [{}, {label: resource.unit}],
        series: [
          {},
          {label: "in use", stroke: "#3056d3", fill: "rgba(48, 86, 211, 0.15)", width: 2, points: {show: false}},
          {label: "nominal", stroke: "#555", dash: [6, 4], width: 1, points: {show: false}},
          {label: "borrowed", stroke: "#b45309", fill: "rgba(180, 83, 9, 0.2)", width: 1, points: {show: false}},
        ],
      }, data, 200);
      quotaChart = {plot, resource: resource.resource};
    }
    el.dataset.points = String(x.length);
    el.dataset.peak = String(Math.max(0, ...resource.in_use));
  }

  if ($("chart-quota")) {
    const refresh = () => drawQuota().catch((error) => { $("chart-quota").textContent = `Use over time unavailable: ${error.message}`; });
    $("quota-resource").addEventListener("change", refresh);
    refresh();
    setInterval(refresh, REFRESH_MS);
  }

  // --- the console's utilization ------------------------------------------------------------------

  const flavorCharts = new Map();
  async function drawUtilization() {
    const body = await P.api("/api/v1/operator/utilization?hours=24");
    const x = P.epochSeconds(body.buckets);
    const box = $("utilization");
    for (const f of body.flavors) {
      const data = [x, f.allocated, f.training, x.map(() => f.devices)];
      let entry = flavorCharts.get(f.flavor);
      if (!entry) {
        const figure = document.createElement("figure");
        figure.dataset.flavor = f.flavor;
        figure.innerHTML = `<figcaption class="label">${P.escapeHtml(f.flavor)}</figcaption><div class="chart" role="img" aria-label="${P.escapeHtml(f.flavor)} devices held and training over the last 24 hours"></div>`;
        box.append(figure);
        const plot = P.chart(figure.querySelector(".chart"), {
          ...AXIS_X,
          axes: [{}, {label: "devices"}],
          series: [
            {},
            {label: "held", stroke: "#3056d3", fill: "rgba(48, 86, 211, 0.15)", width: 2, points: {show: false}},
            {label: "training", stroke: "#0f9d58", width: 2, points: {show: false}},
            {label: "devices", stroke: "#555", dash: [6, 4], width: 1, points: {show: false}},
          ],
        }, data, 180);
        entry = {plot, figure};
        flavorCharts.set(f.flavor, entry);
      } else entry.plot.setData(data);
      const held = f.allocated.reduce((a, b) => a + b, 0);
      const trained = f.training.reduce((a, b) => a + b, 0);
      entry.figure.dataset.held = String(held);
      entry.figure.dataset.training = String(trained);
    }
  }

  if ($("utilization")) {
    const refresh = () => drawUtilization().catch((error) => { $("utilization-error").textContent = error.message; });
    refresh();
    setInterval(refresh, REFRESH_MS);
  }
})();

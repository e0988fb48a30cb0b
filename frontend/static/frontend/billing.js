// The billing page's spend per day this month: bars drawn with uPlot from the figures the page holds
// (the same figures are in the table under the chart, for those who would rather read them).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("spend-data").textContent);
  const el = document.getElementById("chart-spend");
  if (!data.length || !el) return;
  // The x axis is the day of the month (UTC), one bar each, with half a day of room at either end.
  const days = data.map((d) => Number(d.day.slice(8, 10)));
  const spend = data.map((d) => Number(d.spend));
  const options = {
    scales: {x: {time: false, range: () => [days[0] - 0.5, days[days.length - 1] + 0.5]}},
    axes: [{label: "day of the month (UTC)", incrs: [1, 2, 5, 7, 10], values: (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(v) : ""))}, {label: "spend"}],
    series: [
      {label: "day", value: (u, v) => (v === null ? "–" : data[days.indexOf(v)]?.day ?? "–")},
      {label: "spend", stroke: "#3056d3", fill: "rgba(48, 86, 211, 0.35)", width: 1, paths: uPlot.paths.bars({size: [0.7, 40]}), points: {show: false}},
    ],
  };
  window.Polychip.chart(el, options, [days, spend]);
  el.dataset.points = String(days.length);
})();

// The index page's search and filters, client-side: every model row carries its fields as data-*
// attributes (written by zoo/site/render.py), so this works offline and from file:// too.
"use strict";

(function () {
  const rows = Array.from(document.querySelectorAll("#models tbody tr"));
  const field = (id) => document.getElementById(id);
  const query = field("q");
  const task = field("task");
  const license = field("license");
  const tag = field("tag");
  const metric = field("metric");
  const threshold = field("threshold");
  const comparison = field("cmp");
  const count = field("count");
  const empty = field("empty");
  if (!query || !count) {
    return;
  }

  function better() {
    const option = metric.options[metric.selectedIndex];
    return option && option.dataset.better === "lower" ? "lower" : "higher";
  }

  function passes(row) {
    const words = query.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.every((w) => row.dataset.text.includes(w))) {
      return false;
    }
    if (task.value && row.dataset.task !== task.value) {
      return false;
    }
    if (license.value && row.dataset.license !== license.value) {
      return false;
    }
    if (tag.value && !row.dataset.tags.split(" ").includes(tag.value)) {
      return false;
    }
    if (metric.value) {
      if (row.dataset.metric !== metric.value) {
        return false;
      }
      const limit = parseFloat(threshold.value);
      if (!Number.isNaN(limit)) {
        const value = parseFloat(row.dataset.value);
        return better() === "lower" ? value <= limit : value >= limit;
      }
    }
    return true;
  }

  function update() {
    let shown = 0;
    for (const row of rows) {
      const keep = passes(row);
      row.hidden = !keep;
      shown += keep ? 1 : 0;
    }
    comparison.textContent = better() === "lower" ? "≤" : "≥";
    threshold.disabled = !metric.value;
    count.textContent = shown + " of " + rows.length + " models";
    empty.hidden = shown > 0;
  }

  for (const control of [query, task, license, tag, metric, threshold]) {
    control.addEventListener("input", update);
    control.addEventListener("change", update);
  }
  document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());
  update();
})();

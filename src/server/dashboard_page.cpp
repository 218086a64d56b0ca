// The dashboard's page (dashboard.h): Chart.js from /dashboard/chart.js, samples from
// /dashboard/data once a second, the last 15 minutes kept in the page.
#include "server/dashboard.h"

namespace lmserve::server {

std::string_view Dashboard::page() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lmserve dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px;margin:0 0 8px}
#now{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0 16px}
.stat{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:120px}
.stat b{display:block;font-size:18px}
#charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px;height:260px}
#status{color:#666;font-size:12px}
</style></head><body>
<h1>lmserve — live, last 15 minutes</h1>
<div id="status">connecting…</div>
<div id="now"></div>
<div id="charts"></div>
<script src="/dashboard/chart.js"></script>
<script>
"use strict";
const KEEP_MS = 15 * 60 * 1000;
const charts = {};
let samples = [], last = 0;
const palette = ["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b","#e377c2","#17becf"];
function chart(id, title, unit, series) {
  const card = document.createElement("div"); card.className = "card";
  const canvas = document.createElement("canvas"); canvas.id = "chart-" + id; card.appendChild(canvas);
  document.getElementById("charts").appendChild(card);
  charts[id] = {series, chart: new Chart(canvas, {type: "line", data: {labels: [], datasets: []},
    options: {animation: false, maintainAspectRatio: false, spanGaps: true, elements: {point: {radius: 0}},
      plugins: {title: {display: true, text: title}}, scales: {y: {beginAtZero: true, title: {display: true, text: unit}}}}})};
}
// Each chart's series: [label, (sample) => value], recomputed as lanes and cards appear.
function lanes(s) { return Object.keys(s.lanes || {}).sort(); }
chart("memory", "GPU memory used / total (admission limit)", "GiB", s => !(s.gpus || []).length ?
  [["process resident memory (CPU backend)", x => gib(x.resident_bytes)]] : s.gpus.flatMap(g => [
  ["GPU " + g.gpu + " used", x => gib(gpu(x, g.gpu, "used"))], ["GPU " + g.gpu + " total", x => gib(gpu(x, g.gpu, "total"))],
  ["GPU " + g.gpu + " limit", x => { const t = gpu(x, g.gpu, "total"); return t == null ? null : gib(t * x.device_memory_limit); }]]));
chart("kv", "KV cache usage and watermark", "share", s => [["KV used", x => x.kv_usage], ["watermark", x => x.kv_watermark]]);
chart("tokens", "Tokens per second", "tokens/s", s => [["output", x => x.output_tokens_per_s], ["prompt", x => x.prompt_tokens_per_s]]);
chart("lanes", "Requests running and waiting, per lane", "requests", s => lanes(s).flatMap(l => [
  [l + " running", x => lane(x, l, "running")], [l + " waiting", x => lane(x, l, "waiting")]]));
chart("ttft", "Time to first token p50 / p99 (last minute)", "seconds", s => lanes(s).flatMap(l => [
  [l + " p50", x => lane(x, l, "ttft_p50")], [l + " p99", x => lane(x, l, "ttft_p99")]]));
chart("tpot", "Time per output token p50 / p99 (last minute)", "seconds", s => lanes(s).flatMap(l => [
  [l + " p50", x => lane(x, l, "tpot_p50")], [l + " p99", x => lane(x, l, "tpot_p99")]]));
chart("admission", "Admission refusals and [LIMIT] episodes", "per second", s => [
  ["refusals", x => x.refusals_per_s], ["[LIMIT] episodes", x => x.limit_episodes_per_s]]);
function gib(v) { return v == null ? null : v / 1073741824; }
function gpu(x, id, k) { const g = (x.gpus || []).find(g => g.gpu === id); return g && g[k] != null ? g[k] : null; }
function lane(x, l, k) { const v = x.lanes && x.lanes[l]; return v && v[k] != null ? v[k] : null; }
function stat(id, label, value, shown) {
  let el = document.getElementById(id);
  if (!el) {
    el = document.createElement("div"); el.className = "stat"; el.id = id;
    el.innerHTML = "<span></span><b></b>"; document.getElementById("now").appendChild(el);
  }
  el.dataset.value = value == null ? "" : String(value);
  el.firstChild.textContent = label; el.lastChild.textContent = shown;
}
function render() {
  if (!samples.length) return;
  const s = samples[samples.length - 1];
  const labels = samples.map(x => new Date(x.t).toLocaleTimeString());
  for (const [id, c] of Object.entries(charts)) {
    const series = c.series(s);
    c.chart.data.labels = labels;
    c.chart.data.datasets = series.map(([label, f], i) => ({label, data: samples.map(f), borderColor: palette[i % palette.length],
      backgroundColor: palette[i % palette.length], borderWidth: 1.5}));
    c.chart.update("none");
  }
  stat("now-time", "sample", s.t, new Date(s.t).toLocaleTimeString());
  stat("now-kv-usage", "KV used", s.kv_usage, s.kv_usage == null ? "–" : (100 * s.kv_usage).toFixed(1) + "%");
  stat("now-output-total", "output tokens", s.output_tokens_total, String(s.output_tokens_total));
  stat("now-prompt-total", "prompt tokens", s.prompt_tokens_total, String(s.prompt_tokens_total));
  stat("now-output-rate", "output tokens/s", s.output_tokens_per_s, s.output_tokens_per_s == null ? "–" : s.output_tokens_per_s.toFixed(1));
  for (const l of lanes(s)) {
    stat("now-running-" + l, l + " running", lane(s, l, "running"), String(lane(s, l, "running")));
    stat("now-waiting-" + l, l + " waiting", lane(s, l, "waiting"), String(lane(s, l, "waiting")));
  }
  for (const g of s.gpus || []) stat("now-gpu-" + g.gpu, "GPU " + g.gpu + " memory", g.used, (100 * g.used / g.total).toFixed(1) + "%");
}
async function poll() {
  try {
    const r = await fetch("/dashboard/data?since=" + last, {cache: "no-store", credentials: "same-origin"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const d = await r.json();
    for (const s of d.samples) if (s.t > last) { samples.push(s); last = s.t; }
    samples = samples.filter(s => s.t >= last - KEEP_MS);
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString() + ", " + samples.length + " samples";
    render();
  } catch (e) {
    document.getElementById("status").textContent = "no data: " + e.message;
  }
  setTimeout(poll, 1000);
}
poll();
</script></body></html>
)HTML";
}

}  // namespace lmserve::server

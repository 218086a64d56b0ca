// The dashboard's pages (dashboard.h): Chart.js from /dashboard/chart.js, samples from
// /dashboard/data once a second, the last 15 minutes kept in the page. Both pages share the
// frame (style, charts, figures, polling) and differ in their charts and figures.
#include "server/dashboard.h"

#include <string>

namespace lmserve::server {

namespace {

constexpr std::string_view kFrame = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<style>
body{font-family:system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}
h1{font-size:20px;margin:0 0 8px}
#now{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0 16px}
.stat{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:140px}
.stat b{display:block;font-size:16px}
#charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px;height:260px}
#status{color:#666;font-size:12px}
</style></head><body>
<h1>@HEADING@</h1>
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
// A line chart whose series ([label, (sample) => value] pairs) are recomputed from the latest
// sample at each render, as lanes, cards and replicas appear.
function chart(id, title, unit, series) {
  const card = document.createElement("div"); card.className = "card";
  const canvas = document.createElement("canvas"); canvas.id = "chart-" + id; card.appendChild(canvas);
  document.getElementById("charts").appendChild(card);
  charts[id] = {series, chart: new Chart(canvas, {type: "line", data: {labels: [], datasets: []},
    options: {animation: false, maintainAspectRatio: false, spanGaps: true, elements: {point: {radius: 0}},
      plugins: {title: {display: true, text: title}}, scales: {y: {beginAtZero: true, title: {display: true, text: unit}}}}})};
}
function drawCharts(s) {
  const labels = samples.map(x => new Date(x.t).toLocaleTimeString());
  for (const c of Object.values(charts)) {
    c.chart.data.labels = labels;
    c.chart.data.datasets = c.series(s).map(([label, f], i) => ({label, data: samples.map(f), borderColor: palette[i % palette.length],
      backgroundColor: palette[i % palette.length], borderWidth: 1.5}));
    c.chart.update("none");
  }
}
// A figure above the charts; data-value holds the sample's raw number.
function stat(id, label, value, shown) {
  let el = document.getElementById(id);
  if (!el) {
    el = document.createElement("div"); el.className = "stat"; el.id = id;
    el.innerHTML = "<span></span><b></b>"; document.getElementById("now").appendChild(el);
  }
  el.dataset.value = value == null ? "" : String(value);
  el.firstChild.textContent = label; el.lastChild.textContent = shown;
}
function gib(v) { return v == null ? null : v / 1073741824; }
)HTML";
constexpr std::string_view kEnd = R"HTML(async function poll() {
  try {
    const r = await fetch("/dashboard/data?since=" + last, {cache: "no-store", credentials: "same-origin"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const d = await r.json();
    for (const s of d.samples) if (s.t > last) { samples.push(s); last = s.t; }
    samples = samples.filter(s => s.t >= last - KEEP_MS);
    document.getElementById("status").textContent = "updated " + new Date().toLocaleTimeString() + ", " + samples.length + " samples";
    if (samples.length) render(samples[samples.length - 1]);
  } catch (e) {
    document.getElementById("status").textContent = "no data: " + e.message;
  }
  setTimeout(poll, 1000);
}
poll();
</script></body></html>
)HTML";

constexpr std::string_view kServe = R"JS(// Each chart's series: [label, (sample) => value], recomputed as lanes and cards appear.
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
function gpu(x, id, k) { const g = (x.gpus || []).find(g => g.gpu === id); return g && g[k] != null ? g[k] : null; }
function lane(x, l, k) { const v = x.lanes && x.lanes[l]; return v && v[k] != null ? v[k] : null; }
function render(s) {
  drawCharts(s);
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
)JS";

constexpr std::string_view kGateway = R"JS(function name(r) { return r.url.replace("http://", "") + " (" + r.model + " " + r.version + ")"; }
function rep(x, url) { return (x.replicas || []).find(r => r.url === url); }
function fig(x, url, f) { const r = rep(x, url); return r && r.figures ? f(r.figures) : null; }
function sumLanes(fg, k) { let t = 0, any = false; for (const l of Object.values(fg.lanes || {})) if (l[k] != null) { t += l[k]; any = true; } return any ? t : null; }
function maxLanes(fg, k) { let m = null; for (const l of Object.values(fg.lanes || {})) if (l[k] != null) m = m == null ? l[k] : Math.max(m, l[k]); return m; }
// One series per replica of the latest sample.
function perReplica(s, f) { return (s.replicas || []).map(r => [name(r), x => f(x, r.url)]); }
chart("memory", "Memory per replica: GPU used (resident memory on CPU replicas)", "GiB", s => perReplica(s, (x, u) =>
  fig(x, u, f => (f.gpus && f.gpus.length) ? gib(f.gpus.reduce((a, g) => a + (g.used || 0), 0)) : gib(f.resident_bytes))));
chart("kv", "KV cache usage per replica", "share", s => perReplica(s, (x, u) => fig(x, u, f => f.kv_usage)));
chart("tokens", "Output tokens per second per replica", "tokens/s", s => perReplica(s, (x, u) => fig(x, u, f => f.output_tokens_per_s)));
chart("running", "Requests running per replica", "requests", s => perReplica(s, (x, u) => fig(x, u, f => sumLanes(f, "running"))));
chart("waiting", "Requests waiting per replica", "requests", s => perReplica(s, (x, u) => fig(x, u, f => sumLanes(f, "waiting"))));
chart("ttft", "Time to first token p99 per replica (slowest lane, last minute)", "seconds", s => perReplica(s, (x, u) => fig(x, u, f => maxLanes(f, "ttft_p99"))));
chart("outstanding", "In flight from this gateway, per replica", "requests", s => perReplica(s, (x, u) => { const r = rep(x, u); return r ? r.outstanding : null; }));
function render(s) {
  drawCharts(s);
  stat("now-time", "sample", s.t, new Date(s.t).toLocaleTimeString());
  for (const r of s.replicas || []) {
    const key = r.url.replace(/[^0-9a-z]/gi, "_");
    stat("now-healthy-" + key, name(r), r.healthy ? 1 : 0, r.healthy ? "healthy" : "UNHEALTHY");
    const out = r.figures ? r.figures.output_tokens_total : null;
    stat("now-output-" + key, "output tokens, " + r.url.replace("http://", ""), out, out == null ? "–" : String(out));
  }
}
)JS";

std::string build(std::string_view title, std::string_view heading, std::string_view script) {
  std::string page(kFrame);
  page.replace(page.find("@TITLE@"), 7, title);
  page.replace(page.find("@HEADING@"), 9, heading);
  return page.append(script).append(kEnd);
}

}  // namespace

std::string_view Dashboard::page() {
  static const std::string p = build("lmserve dashboard", "lmserve — live, last 15 minutes", kServe);
  return p;
}

std::string_view Dashboard::gateway_page() {
  static const std::string p = build("lmserve gateway dashboard", "lmserve gateway — replicas, last 15 minutes", kGateway);
  return p;
}

}  // namespace lmserve::server

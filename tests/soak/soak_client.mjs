// Soak client (scripts/soak.sh): `concurrency` workers send streamed chat completions to
// lmserve serve for `duration` seconds, each asking for a random number of tokens; a share of
// the requests is cut off by the client at a random moment (the server must free what they
// held). Every answer is classified; a stream that was not cut must end with `data: [DONE]`; a
// refused request (429 / 503) is retried after its Retry-After.
// With RETRY_REFUSED (scripts/fault-drill.sh), a request whose connection is refused (the server
// is restarting) is sent again after 200 ms and counted in `refused`.
// Prints one JSON summary line. Node 20, no packages.
// Usage: node soak_client.mjs URL DURATION_S CONCURRENCY ABORT_FRACTION [RETRY_REFUSED]
const [url, durationS, concurrency, abortFraction, retryRefused] = process.argv.slice(2);
const until = Date.now() + Number(durationS) * 1000;
const words = ['kernel', 'bank', 'audit', 'memory', 'river', 'model', 'token', 'compliance', 'report', 'cache'];
const counts = { ok: 0, errorEvents: 0, cut: 0, status429: 0, status503: 0, otherStatus: 0, unfinished: 0, networkErrors: 0, refused: 0 };
const other = {};

function prompt() {
  const n = 3 + Math.floor(Math.random() * 30);
  return Array.from({ length: n }, () => words[Math.floor(Math.random() * words.length)]).join(' ');
}

async function one() {
  const cut = Math.random() < Number(abortFraction);
  const ctl = new AbortController();
  let timer = null;
  if (cut) timer = setTimeout(() => ctl.abort(), Math.random() * 2000);
  try {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'demo', messages: [{ role: 'user', content: prompt() }], stream: true, max_tokens: 8 + Math.floor(Math.random() * 120) }),
      signal: ctl.signal,
    });
    if (res.status === 429 || res.status === 503) {
      await res.text();
      counts[res.status === 429 ? 'status429' : 'status503']++;
      // As a well-behaved client: wait out Retry-After (at most 2 s), else half a second or so.
      const after = Number(res.headers.get('retry-after'));
      await new Promise((r) => setTimeout(r, after > 0 ? Math.min(after, 2) * 1000 : 300 + Math.random() * 400));
      return;
    }
    if (res.status !== 200) {
      other[res.status] = (other[res.status] || 0) + 1;
      counts.otherStatus++;
      await res.text();
      return;
    }
    const text = await res.text();
    if (!text.trimEnd().endsWith('data: [DONE]')) counts.unfinished++;
    else if (text.includes('data: {"error"')) counts.errorEvents++;
    else counts.ok++;
  } catch (e) {
    if (e.name === 'AbortError') {
      counts.cut++;
    } else if (retryRefused && e.cause && e.cause.code === 'ECONNREFUSED') {
      counts.refused++;
      await new Promise((r) => setTimeout(r, 200));
    } else {
      counts.networkErrors++;
    }
  } finally {
    if (timer) clearTimeout(timer);
  }
}

async function worker() {
  while (Date.now() < until) await one();
}

await Promise.all(Array.from({ length: Number(concurrency) }, worker));
console.log(JSON.stringify({ ...counts, otherStatuses: other }));

// sluice's operator page. Polls the JSON API every 2 s and draws with text nodes only: host
// names, paths and annotation values come from Ingress authors and must never become markup.
'use strict';

const EVERY_MS = 2000;
const SVG = 'http://www.w3.org/2000/svg';
let shown = { generation: -1, lastApply: -1, certsAt: 0 };
let refreshes = 0;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, String(v));
    else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function num(v) {
  if (v === null || v === undefined) return '–';
  return String(Math.round(v * 1000) / 1000);
}

// A figure cell: the API's value in data-v, the same value as text.
function fig(k, v, cls) {
  return el('td', { class: 'num ' + (cls || ''), 'data-k': k, 'data-v': v === null ? '' : v }, num(v));
}

function replaceRows(table, rows) {
  const body = document.querySelector(table + ' tbody');
  body.replaceChildren(...rows);
}

async function get(path) {
  const r = await fetch(path, { cache: 'no-store', credentials: 'omit' });
  if (!r.ok) throw new Error(path + ': ' + r.status);
  return r.json();
}

function spark(values, cls) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', cls);
  svg.setAttribute('viewBox', '0 0 100 20');
  svg.setAttribute('preserveAspectRatio', 'none');
  if (values.length > 1) {
    const max = Math.max(...values, 1e-9);
    const pts = values.map((v, i) =>
      (i * 100 / (values.length - 1)).toFixed(1) + ',' + (19 - (v / max) * 18).toFixed(1));
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', pts.join(' '));
    line.setAttribute('vector-effect', 'non-scaling-stroke');
    svg.append(line);
  }
  return svg;
}

function drawStatus(s) {
  const state = document.getElementById('state');
  state.textContent = s.draining ? 'draining' : s.ready ? 'ready' : 'not ready';
  state.className = 'pill ' + (s.ready && !s.draining ? 'ok' : 'bad');
  const items = [
    ['version', s.version], ['generation', s.generation], ['snapshot', s.snapshot_hash],
    ['last apply', s.last_apply_unix_ms ? new Date(s.last_apply_unix_ms).toLocaleTimeString() : '–'],
    ['hosts', s.virtual_hosts], ['routes', s.routes], ['pools', s.upstreams],
    ['endpoints', s.endpoints], ['TLS hosts', s.tls_hosts],
  ];
  document.getElementById('summary').replaceChildren(...items.map(([k, v]) =>
    el('div', {}, el('dt', {}, k), el('dd', { 'data-k': k.replace(' ', '_'), 'data-v': v }, v))));
  document.body.dataset.generation = s.generation;
  const problems = document.getElementById('problems');
  problems.replaceChildren(...(s.problems.length
    ? s.problems.map(p => el('li', {}, p))
    : [el('li', { class: 'none' }, 'none')]));
}

function drawTraffic(t) {
  document.body.dataset.sampledAt = t.sampled_at_unix_ms;
  document.getElementById('traffic-note').textContent =
    `last minute, sampled every ${t.interval_s} s` +
    (t.sampled_at_unix_ms ? ' (at ' + new Date(t.sampled_at_unix_ms).toLocaleTimeString() + ')' : '');
  const f = t.total_last_minute;
  const card = (k, label, v) => el('div', { class: 'card' },
    el('div', { class: 'v', 'data-k': k, 'data-v': v === null ? '' : v }, num(v)), el('div', { class: 'k' }, label));
  document.getElementById('totals').replaceChildren(
    card('rps', 'requests/s', f.rps), card('requests', 'requests', f.requests),
    card('errors', '5xx answers', f.errors), card('error_ratio', '5xx ratio', f.error_ratio),
    card('p50_ms', 'p50 ms', f.p50_ms), card('p99_ms', 'p99 ms', f.p99_ms));
  const plot = document.getElementById('total-plot');
  plot.replaceChildren(t.total_series.length > 1
    ? spark(t.total_series.map(p => p.rps), 'total')
    : el('div', { class: 'waiting muted' }, 'requests/s over time: drawn from the second sample on'));
  replaceRows('#traffic', t.routes.map(r => el('tr', { 'data-route': r.route, 'data-service': r.service },
    el('td', { class: 'mono' }, r.route), el('td', { class: 'mono' }, r.service || '(none)'),
    fig('rps', r.last_minute.rps), fig('errors', r.last_minute.errors),
    fig('p50_ms', r.last_minute.p50_ms), fig('p99_ms', r.last_minute.p99_ms),
    el('td', {}, r.series ? spark(r.series.map(p => p.rps), 'spark') : ''))));
}

const STATE_WORDS = { up: 'ready', draining: 'terminating (serving)', ejected: 'ejected' };

function drawPools(pools) {
  const total = pools.reduce((n, p) => n + p.endpoints.length, 0);
  document.body.dataset.endpoints = total;
  document.getElementById('pools').replaceChildren(...pools.map(p => {
    const inFlight = p.endpoints.reduce((n, e) => n + e.in_flight, 0);
    return el('div', { class: 'pool', 'data-pool': p.name },
      el('h3', {}, el('code', {}, p.name), ' ',
        el('span', { class: 'muted' }, `${p.protocol}, ${p.balance}, ${p.endpoints.length} endpoint(s), ${inFlight} in flight`)),
      el('table', {},
        el('thead', {}, el('tr', {}, ...['address', 'state', 'in flight', 'requests', 'failures', 'latency ms (EWMA)']
          .map(h => el('th', {}, h)))),
        el('tbody', {}, ...p.endpoints.map(e => el('tr', { 'data-address': e.address },
          el('td', { class: 'mono' }, e.address),
          el('td', { class: 'state-' + e.state, 'data-k': 'state', 'data-v': e.state }, STATE_WORDS[e.state] || e.state),
          fig('in_flight', e.in_flight), fig('requests', e.requests),
          fig('failures', e.failures), fig('ewma_ms', e.ewma_ms))))));
  }));
}

function drawRoutes(doc) {
  replaceRows('#routes', doc.routes.map(r => {
    const to = r.backends.map(b => (b.pool || '(unusable)') +
      (b.weight !== null ? ` ×${b.weight}` : '') + (b.invalid ? ` — ${b.invalid}` : '')).join(', ');
    const notes = [];
    if (r.unavailable) notes.push('answers 503: ' + r.unavailable);
    if (r.canary) notes.push(`canary ${r.canary.source} → ${r.canary.pool} (${r.canary.rule})`);
    if (r.listener) notes.push('listener ' + r.listener);
    if (r.conditions.length) notes.push(r.conditions.join(', '));
    return el('tr', { 'data-source': r.source },
      el('td', {}, r.kind), el('td', { class: 'mono' }, r.source), el('td', { class: 'mono' }, r.host),
      el('td', { class: 'mono' }, `${r.path} (${r.path_match})`), el('td', { class: 'mono' }, to || '–'),
      el('td', {}, notes.join('; ')));
  }));
  const rows = [];
  for (const [ing, notes] of Object.entries(doc.annotations)) {
    for (const n of notes) {
      rows.push(el('tr', { 'data-ingress': ing, 'data-annotation': n.name },
        el('td', { class: 'mono' }, ing), el('td', { class: 'mono' }, n.name),
        el('td', { class: 'mono' }, n.value),
        el('td', { class: 'verdict-' + n.verdict.replace(' ', '-') }, n.verdict), el('td', {}, n.why)));
    }
  }
  replaceRows('#annotations', rows);
}

function drawCertificates(certs) {
  replaceRows('#certificates', certs.map(c => el('tr', { 'data-host': c.host },
    el('td', { class: 'mono' }, c.host), el('td', { class: 'mono' }, c.secret || '–'),
    el('td', {}, c.key), el('td', { class: 'mono' }, c.serial),
    el('td', {}, new Date(c.not_after_unix * 1000).toISOString().slice(0, 10)),
    fig('days_left', c.days_left, c.days_left < 0 ? 'expired' : c.days_left < 14 ? 'soon' : ''))));
}

function drawChanges(changes) {
  replaceRows('#changes', changes.slice(0, 50).map(c => el('tr', { 'data-generation': c.generation, 'data-kind': c.kind },
    el('td', {}, new Date(c.at_unix_ms).toLocaleTimeString()), fig('generation', c.generation),
    el('td', {}, c.kind), el('td', { class: 'mono', 'data-k': 'what' }, c.what),
    fig('apply_ms', Math.round(c.apply_ms * 1000) / 1000),
    fig('reached_traffic_ms', c.reached_traffic_ms === null ? null : Math.round(c.reached_traffic_ms * 1000) / 1000))));
}

async function refresh() {
  try {
    const [status, pools, traffic, changes] = await Promise.all([
      get('/api/v1/status'), get('/api/v1/upstreams'), get('/api/v1/traffic'), get('/api/v1/changes')]);
    drawStatus(status);
    drawPools(pools);
    drawTraffic(traffic);
    drawChanges(changes);
    // Routes and certificates change only with a new snapshot (and certificates age daily).
    if (status.generation !== shown.generation || status.last_apply_unix_ms !== shown.lastApply ||
        Date.now() - shown.certsAt > 60000) {
      const [routes, certs] = await Promise.all([get('/api/v1/routes'), get('/api/v1/certificates')]);
      drawRoutes(routes);
      drawCertificates(certs);
      shown = { generation: status.generation, lastApply: status.last_apply_unix_ms, certsAt: Date.now() };
    }
    refreshes += 1;
    document.body.dataset.refreshes = refreshes;
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    const state = document.getElementById('state');
    state.textContent = 'disconnected';
    state.className = 'pill bad';
    document.getElementById('updated').textContent = String(e.message || e);
  }
}

// One refresh at a time: the next starts 2 s after the last ended, so a slow answer never
// piles requests onto the admin listener.
async function loop() {
  await refresh();
  setTimeout(loop, EVERY_MS);
}

document.addEventListener('DOMContentLoaded', loop);

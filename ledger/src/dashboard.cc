#include "meshlearn/ledger/dashboard.h"

#include <algorithm>
#include <memory>

#include "meshlearn/base/env.h"
#include "meshlearn/ledger/rpc.h"
#include "meshlearn/net/blob_service.h"
#include "meshlearn/net/blob_store.h"
#include "meshlearn/net/http_transport.h"
#include "meshlearn/protocol/state_blob.h"

namespace meshlearn::ledger {
namespace {

using nlohmann::json;

// The page. Values from the ledger go into the document as text (textContent, SVG text nodes),
// never as HTML: a task's memo and a node's endpoint are whatever their senders wrote.
// Numbers the tests read carry data-k="NAME" (apps/meshlearn/dashboard_test.cc).
constexpr std::string_view kPage = R"MLPAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>meshlearn dashboard</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f4f6f9; }
  header { background: #1d2430; color: #fff; padding: 10px 20px; display: flex; gap: 24px;
           align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  #live.on::before { content: "\25CF "; color: #3ecf6e; }
  #live.off::before { content: "\25CF "; color: #e0a030; }
  main { padding: 12px 20px; display: grid; gap: 14px; }
  section { background: #fff; border-radius: 6px; padding: 10px 16px; box-shadow: 0 1px 2px #0002;
            overflow-x: auto; }
  h2 { font-size: 16px; margin: 4px 0 8px; }
  h3 { font-size: 14px; margin: 12px 0 6px; }
  .cards { display: flex; gap: 10px; flex-wrap: wrap; }
  .card { background: #f4f6f9; border-radius: 4px; padding: 6px 12px; min-width: 110px; }
  .card .v { font-size: 18px; font-weight: 600; }
  .card .k { color: #5b6575; font-size: 12px; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; }
  th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e4e8ee; white-space: nowrap; }
  th { color: #5b6575; font-weight: 500; white-space: normal; vertical-align: bottom; }
  td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
  tr.sel { background: #e8f0ff; }
  .bad { color: #c0392b; font-weight: 600; }
  .good { color: #1e8449; }
  .muted { color: #7a8494; }
  code { background: #f0f2f5; padding: 1px 4px; border-radius: 3px; }
  a { color: #1f5fbf; }
  .bar { height: 10px; background: #e4e8ee; border-radius: 5px; overflow: hidden; display: flex; }
  .bar > div { height: 100%; }
  .row { display: flex; gap: 20px; flex-wrap: wrap; align-items: flex-start; }
  .timeline { border-left: 3px solid #c0392b; padding-left: 10px; margin: 6px 0; }
  #error { color: #c0392b; }
  footer { color: #7a8494; font-size: 12px; padding: 0 20px 16px; }
</style>
</head>
<body>
<header>
  <h1>meshlearn</h1>
  <span id="chain" class="muted"></span>
  <span>height <b data-k="height" id="height">-</b></span>
  <span id="live" class="off">connecting</span>
  <span class="muted">updates <span data-k="updates" id="updates">0</span>
    (first at height <span data-k="first-height" id="first-height">-</span>)</span>
  <span id="error"></span>
</header>
<main>
  <section id="network"><h2>Network</h2>
    <div class="cards" id="net-cards"></div>
    <h3>Supply: where the tokens sit</h3><div id="supply"></div>
    <h3>Registered nodes</h3><div id="nodes"></div>
  </section>
  <section id="tasks"><h2>Tasks</h2><div id="task-list"></div><div id="task"></div></section>
  <section id="per-node"><h2>Per node</h2><div id="node-earnings"></div><div id="node-detail"></div></section>
</main>
<footer>Every number on this page is an answer of this ledger's JSON-RPC (POST /): chain_status,
  list_nodes, list_tasks, get_task, get_account, account_history, get_block and wait_block, the
  calls <code>meshlearn task status --json</code> and <code>meshlearn wallet</code> make. The page
  sums and counts those records; it keeps no books of its own. Charts are inline SVG.</footer>
<script>
'use strict';

// ---- The ledger's JSON-RPC. Amounts are 64-bit: integers beyond 2^53 are parsed exactly, as
// BigInt (JSON.parse's source text), and every sum is a BigInt.
let rpcId = 0;
function parseJson(text) {
  return JSON.parse(text, (k, v, ctx) =>
      typeof v === 'number' && !Number.isSafeInteger(v) && ctx && /^[0-9]+$/.test(ctx.source)
          ? BigInt(ctx.source) : v);
}
async function rpc(calls) {  // [[method, params], ...] -> results, in order (one batch per 100)
  const out = [];
  for (let i = 0; i < calls.length; i += 100) {
    const part = calls.slice(i, i + 100);
    const body = part.map(([method, params]) => ({jsonrpc: '2.0', id: ++rpcId, method, params: params || {}}));
    const res = await fetch('/', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                  body: JSON.stringify(body)});
    const answer = parseJson(await res.text());
    if (!Array.isArray(answer)) {
      throw new Error(answer && answer.error ? answer.error.message : 'the ledger answered HTTP ' + res.status);
    }
    answer.forEach((a, j) => {
      if (a.error) throw new Error(part[j][0] + ': ' + a.error.message);
      out.push(a.result);
    });
  }
  return out;
}
const big = x => (typeof x === 'bigint' ? x : BigInt(x || 0));
const sum = xs => xs.reduce((a, x) => a + big(x), 0n);
const short = hex => (hex || '').slice(0, 10);
const sleep = ms => new Promise(r => setTimeout(r, ms));
const isDone = u => u.status === 'committed' || u.status === 'verified';

// ---- Building the document (text only).
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'onclick') e.onclick = v; else e.setAttribute(k, v);
  }
  for (const k of kids.flat(Infinity)) if (k !== undefined && k !== null) e.append(k instanceof Node ? k : String(k));
  return e;
}
const num = (key, v, cls) => h('span', {'data-k': key, class: cls}, String(v));
function table(head, rows) {
  return h('table', {}, h('tr', {}, head.map(c => h('th', {class: c.endsWith('#') ? 'n' : null}, c.replace(/#$/, '')))),
           rows.map(r => h('tr', {class: r.sel ? 'sel' : null},
                           r.cells.map((c, i) => h('td', {class: head[i].endsWith('#') ? 'n' : null}, c)))));
}
function card(label, value) { return h('div', {class: 'card'}, h('div', {class: 'v'}, value), h('div', {class: 'k'}, label)); }
function link(text, hash) { return h('a', {href: '#' + hash}, text); }
function put(id, ...kids) { const e = document.getElementById(id); e.replaceChildren(...kids.flat(Infinity)); }
function nodeLink(id, key) {
  if (!id || !/[^0]/.test(id)) return '-';
  const a = link(short(id), 'node=' + id);
  a.title = id;
  if (key) a.setAttribute('data-k', key);
  return a;
}

// ---- Inline SVG charts.
const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
// Loss and accuracy per round: test loss (line) and every unit's training loss (dots) on the left
// axis; test accuracy (line) on the right axis, 0..1.
function lossPlot(task) {
  const W = 640, H = 270, L = 50, R = 60, T = 26, B = 34;
  const results = task.round_results || [];
  const rounds = Math.max(1, Number((task.params || {}).rounds || results.length || 1));
  const units = (task.units || []).filter(u => isDone(u) && Number(u.loss_micros) > 0);
  const losses = results.map(r => Number(r.test_loss_micros) / 1e6).concat(units.map(u => Number(u.loss_micros) / 1e6));
  const hasAcc = results.some(r => Number(r.test_accuracy_ppm) > 0);
  const ymax = Math.max(1e-9, ...losses) * 1.1;
  const x = r => L + (rounds === 1 ? (W - L - R) / 2 : (W - L - R) * r / (rounds - 1));
  const y = v => T + (H - T - B) * (1 - v / ymax);
  const ya = a => T + (H - T - B) * (1 - a);
  const svg = s('svg', {width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: 'loss-plot',
                        'data-points': results.length, role: 'img'});
  svg.append(s('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: '#fafbfc', stroke: '#d0d6de'}));
  for (let i = 0; i <= 4; ++i) {
    const v = ymax * i / 4;
    svg.append(s('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#5b6575'}, v.toFixed(2)));
    if (hasAcc) svg.append(s('text', {x: W - R + 6, y: ya(i / 4) + 4, 'font-size': 11, fill: '#1e8449'}, (i / 4).toFixed(2)));
  }
  for (let r = 0; r < rounds; ++r) {
    if (rounds <= 20 || r % Math.ceil(rounds / 20) === 0) {
      svg.append(s('text', {x: x(r), y: H - B + 16, 'text-anchor': 'middle', 'font-size': 11, fill: '#5b6575'}, r));
    }
  }
  svg.append(s('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle', 'font-size': 11, fill: '#5b6575'}, 'round'));
  svg.append(s('text', {x: L, y: T - 8, 'text-anchor': 'middle', 'font-size': 11, fill: '#1f5fbf'}, 'loss'));
  if (hasAcc) svg.append(s('text', {x: W - R, y: T - 8, 'text-anchor': 'middle', 'font-size': 11, fill: '#1e8449'}, 'accuracy'));
  for (const u of units) {
    svg.append(s('circle', {cx: x(Number(u.round)), cy: y(Number(u.loss_micros) / 1e6), r: 2.5, fill: '#9bb8e6'}));
  }
  const line = (pts, color, cls) => {
    if (pts.length > 1) svg.append(s('polyline', {points: pts.map(p => p.join(',')).join(' '), fill: 'none', stroke: color, 'stroke-width': 2, class: cls}));
    for (const p of pts) svg.append(s('circle', {cx: p[0], cy: p[1], r: 3.5, fill: color, class: cls}));
  };
  line(results.map(r => [x(Number(r.round)), y(Number(r.test_loss_micros) / 1e6)]), '#1f5fbf', 'test-loss');
  if (hasAcc) line(results.map(r => [x(Number(r.round)), ya(Number(r.test_accuracy_ppm) / 1e6)]), '#1e8449', 'accuracy');
  const legend = [['#1f5fbf', 'test loss'], ['#9bb8e6', 'units\' training loss']].concat(hasAcc ? [['#1e8449', 'test accuracy']] : []);
  legend.forEach(([c, t], i) => {
    svg.append(s('rect', {x: L + 90 + i * 150, y: T - 17, width: 10, height: 10, fill: c}));
    svg.append(s('text', {x: L + 104 + i * 150, y: T - 8, 'font-size': 11}, t));
  });
  return svg;
}
// A horizontal bar of parts of a whole.
function bar(parts, whole) {
  const w = Number(whole) || 1;
  return h('div', {class: 'bar', title: parts.map(p => p[2] + ' ' + p[0]).join(', ')},
           parts.map(([v, color]) => h('div', {style: `width:${(100 * Number(v) / w).toFixed(2)}%;background:${color}`})));
}

// ---- Blocks the page has read, by height (the ledger never changes a committed block).
const kScanBlocks = 5000;
const blockCache = new Map();
async function readBlocks(heights) {
  const missing = [...new Set(heights)].filter(b => !blockCache.has(b));
  const got = await rpc(missing.map(b => ['get_block', {height: b}]));
  for (const block of got) {
    // Keep what the page shows; a RefereeStep's witness can be megabytes.
    block.txs.forEach((tx, i) => {
      if (tx.payload) delete tx.payload.witness;
      tx.receipt = block.receipts[i];
    });
    delete block.receipts;
    blockCache.set(Number(block.header.height), block);
  }
}

// ---- What the page last read.
const view = {height: 0, firstHeight: null, updates: 0, status: null, nodes: [], tasks: [], full: {},
              accounts: {}, blocks: [], history: null, historyFor: null};
function selected(kind) {
  const m = location.hash.match(new RegExp(kind + '=([0-9a-f]{64})'));
  return m ? m[1] : null;
}

async function load() {
  const [status, nodesPage, tasksPage] = await rpc([['chain_status'], ['list_nodes', {limit: 100}], ['list_tasks', {limit: 100}]]);
  const height = Number(status.height);
  // The newest 20 tasks get their units (the per-task and per-node views need them).
  const tasks = tasksPage.items.slice().sort((a, b) => Number(b.created_height) - Number(a.created_height));
  const detail = tasks.slice(0, 20);
  const want = selected('task');
  if (want && !detail.some(t => t.id === want) && tasks.some(t => t.id === want)) detail.push(tasks.find(t => t.id === want));
  const owners = [...new Set(nodesPage.items.map(n => n.owner))];
  const answers = await rpc(detail.map(t => ['get_task', {id: t.id, units: true}])
                               .concat(owners.map(o => ['get_account', {address: o}])));
  const full = {};
  detail.forEach((t, i) => { full[t.id] = answers[i]; });
  const accounts = {};
  owners.forEach((o, i) => { accounts[o] = answers[detail.length + i]; });
  // Blocks: the last 20 (tx/s), and for the selected task every block since it was submitted (at
  // most kScanBlocks): its transactions are the history of its checks and disputes.
  const sel = want || (tasks[0] && tasks[0].id);
  const heights = [];
  for (let b = Math.max(1, height - 19); b <= height; ++b) heights.push(b);
  if (sel && full[sel]) {
    const from = Math.max(1, Number(full[sel].created_height));
    for (let b = from; b <= Math.min(height, from + kScanBlocks - 1); ++b) heights.push(b);
  }
  await readBlocks(heights);
  const blocks = [];
  for (let b = Math.max(1, height - 19); b <= height; ++b) if (blockCache.has(b)) blocks.push(blockCache.get(b));
  const node = selected('node');
  // The selected node's transactions, newest first (the newest 1000): read again only when its
  // newest one changed.
  let history = view.history;
  if (node) {
    const [top] = await rpc([['account_history', {address: node, limit: 100}]]);
    const same = view.historyFor === node && history && history.length && top.items.length &&
                 top.items[0].id === history[0].id;
    if (!same) {
      history = top.items;
      for (let cursor = top.next_cursor; cursor !== null && history.length < 1000;) {
        const [page] = await rpc([['account_history', {address: node, cursor, limit: 100}]]);
        history = history.concat(page.items);
        cursor = page.next_cursor;
      }
    }
  }
  Object.assign(view, {height, status, nodes: nodesPage.items, tasks, full, accounts, blocks, history, historyFor: node});
  if (view.firstHeight === null) view.firstHeight = height;
  ++view.updates;
  render();
}

// ---- Rendering.
function render() {
  const st = view.status;
  put('chain', `chain ${st.chain_id} (${st.role}) at ${location.host}`);
  put('height', String(view.height));
  put('updates', String(view.updates));
  put('first-height', String(view.firstHeight));
  renderNetwork();
  renderTasks();
  renderPerNode();
}

function renderNetwork() {
  const st = view.status, t = st.totals;
  const bs = view.blocks;
  let txRate = '-';
  if (bs.length > 1) {
    const span = (Number(bs[bs.length - 1].header.time_ms) - Number(bs[0].header.time_ms)) / 1000;
    const txs = bs.slice(1).reduce((a, b) => a + b.txs.length, 0);
    if (span > 0) txRate = (txs / span).toFixed(1);
  }
  const last = new Date(Number(st.last_block_time_ms));
  put('net-cards', card('height', num('net-height', view.height)),
      card('block interval', `${st.block_interval_ms} ms`),
      card('last block at', last.toLocaleTimeString()),
      card(`tx/s (last ${bs.length} blocks)`, num('tx-rate', txRate)),
      st.mempool !== undefined ? card('mempool', String(st.mempool)) : null,
      card('nodes', `${view.nodes.length} (${view.nodes.filter(n => n.status === 'jailed').length} jailed)`),
      card('tasks', String(view.tasks.length)));
  const where = [['balances', '#1f5fbf'], ['staked', '#8e44ad'], ['unbonding', '#b58ad1'], ['escrow', '#e0a030'],
                 ['treasury', '#1e8449'], ['jackpot', '#c0392b']];
  put('supply', bar(where.map(([k, c]) => [t[k], c, k]), t.minted),
      table(where.map(w => w[0] + '#').concat(['minted#']),
            [{cells: where.map(([k, c]) => h('span', {}, h('span', {style: `color:${c}`}, '\u25A0 '), num('supply-' + k, t[k])))
                     .concat([num('supply-minted', t.minted)])}]));
  put('nodes', table(['node', 'status', 'roles', 'stake#', 'price#', 'GFLOP/s#', 'memory GiB#', 'units done#',
                      'verified clean#', 'clean streak#', 'failures#', 'slashes#', 'endpoint'],
      view.nodes.map(n => {
        const r = n.reputation, c = n.capabilities || {};
        return {sel: n.id === selected('node'), cells: [
          nodeLink(n.id), num(`node-${n.id}-status`, n.status, n.status === 'jailed' ? 'bad' : 'good'),
          n.role_names, num(`node-${n.id}-stake`, n.stake), String(n.price),
          (Number(c.throughput || 0) / 1e9).toFixed(1), (Number(c.memory_bytes || 0) / 2 ** 30).toFixed(1),
          String(r.units_completed), String(r.units_verified_clean), String(r.clean_streak), String(r.failures),
          num(`node-${n.id}-slashes`, r.slashes, Number(r.slashes) > 0 ? 'bad' : null), n.endpoint]};
      })));
}

function renderTasks() {
  const sel = selected('task') || (view.tasks[0] && view.tasks[0].id);
  put('task-list', table(['task', 'status', 'round', 'rounds done#', 'spent#', 'budget#', 'memo'],
      view.tasks.map(t => ({sel: t.id === sel, cells: [
        link(short(t.id), 'task=' + t.id), t.status, t.phase ? `${t.round} (${t.phase.replace(/_/g, ' ')})` : '-',
        `${t.round_results.length}/${t.params.rounds}`, String(t.spent), String(t.budget), t.memo]}))));
  const t = view.full[sel];
  put('task', t ? taskView(t) : h('p', {class: 'muted'}, view.tasks.length ? 'loading...' : 'no task yet'));
}

// Money of a task, all from its get_task record: its own fields, each unit's `paid`, each
// round's `aggregator_paid`.
function taskMoney(t) {
  const v = t.verification;
  return {budget: big(t.budget), spent: big(t.spent), escrow: big(t.escrow), refunded: big(t.refunded),
          treasury_cut: big(t.treasury_cut), solvers: sum(t.units.map(u => u.paid)),
          verifiers: big(v.verifiers_paid), aggregators: sum(t.round_results.map(r => r.aggregator_paid)),
          slashed: big(v.slashed), jackpot_paid: big(v.jackpot_paid), redo_escrow: big(v.redo_escrow)};
}

function taskView(t) {
  const m = taskMoney(t), p = t.params, v = t.verification;
  const results = t.round_results;
  const hasAcc = results.some(r => Number(r.test_accuracy_ppm) > 0);
  const units = t.units || [];
  const origin = location.origin;
  const finalState = t.status === 'finished' && /[^0]/.test(t.final_state || '') ? t.final_state : null;
  return h('div', {},
    h('h3', {}, 'Task ', h('code', {'data-k': 'task-id'}, t.id)),
    h('div', {class: 'cards'},
      card('state', num('task-status', t.status)),
      card('phase', t.phase ? `round ${t.round}: ${t.phase.replace(/_/g, ' ')}` : '-'),
      card('rounds done', h('span', {}, num('task-rounds-done', results.length), ` / ${p.rounds}`)),
      card('units', `${units.filter(isDone).length} committed of ${units.length}`),
      results.length ? card(hasAcc ? 'test accuracy (last round)' : 'test loss (last round)',
                            hasAcc ? (Number(results[results.length - 1].test_accuracy_ppm) / 1e6).toFixed(4)
                                   : (Number(results[results.length - 1].test_loss_micros) / 1e6).toFixed(4)) : null),
    h('div', {class: 'bar', style: 'margin:8px 0'}, h('div', {style: `width:${(100 * results.length / Math.max(1, p.rounds)).toFixed(1)}%;background:#1f5fbf`})),
    h('div', {class: 'row'},
      h('div', {}, h('h3', {}, 'Loss and accuracy per round'), lossPlot(t)),
      h('div', {}, h('h3', {}, 'Rounds'),
        table(['round#', 'test loss#', 'accuracy#', 'aggregator', 'aggregator paid#', 'block#'],
              results.map(r => ({cells: [String(r.round),
                num(`round-${r.round}-test-loss`, (Number(r.test_loss_micros) / 1e6).toFixed(4)),
                hasAcc ? num(`round-${r.round}-accuracy`, (Number(r.test_accuracy_ppm) / 1e6).toFixed(4)) : '-',
                nodeLink(r.aggregator), String(r.aggregator_paid), String(r.committed_height)]}))))),
    h('h3', {}, 'Tokens spent vs budget'),
    bar([[m.solvers, '#1f5fbf', 'solvers'], [m.verifiers, '#8e44ad', 'verifiers'], [m.aggregators, '#e0a030', 'aggregators'],
         [m.refunded, '#c8ced6', 'refunded']], m.budget),
    table(['budget#', 'spent#', 'to solvers (units\' paid)#', 'to verifiers#', 'to aggregators#', 'treasury cut#',
           'refunded#', 'in escrow#', 'slashed#', 'jackpot paid#', 'slashed stake added for re-runs#'],
          [{cells: [num('task-budget', m.budget), num('task-spent', m.spent), num('task-paid-solvers', m.solvers),
                    num('task-paid-verifiers', m.verifiers), num('task-paid-aggregators', m.aggregators),
                    num('task-treasury-cut', m.treasury_cut), num('task-refunded', m.refunded), num('task-escrow', m.escrow),
                    num('task-slashed', m.slashed, m.slashed > 0n ? 'bad' : null), num('task-jackpot-paid', m.jackpot_paid),
                    num('task-redo-escrow', m.redo_escrow)]}]),
    h('p', {class: 'muted'}, `checks settled: ${v.clean} clean, ${v.unchecked} unchecked, ${v.fraud} fraud, `,
      `${v.forced_error} forced error, ${v.abandoned} abandoned; ${v.disputes} dispute(s) played to the end`),
    (v.proven_frauds || []).length
      ? h('p', {class: 'bad', 'data-k': 'task-proven-frauds'},
          `fraud proven after the fact (ProveFraud, or a late game won by its challenger: LateChallenge): ${v.proven_frauds.map(f => `unit ${f.index} (round ${f.round}, segment ${f.segment}, ` +
            `slashed ${f.slashed}, ${f.clawed_back} clawed back)`).join('; ')}; rounds marked: ${(v.fraud_rounds || []).join(', ')}`)
      : null,
    (v.late_games || []).length
      ? h('p', {'data-k': 'task-late-games'},
          `late games open (LateChallenge, the rounds final): unit(s) ${v.late_games.join(', ')}; the solver and the challenger play them as a dispute`)
      : null,
    h('h3', {}, 'Disputes and fraud'), disputeTimeline(t),
    h('h3', {}, 'Model and audit record'),
    // Both answered by this server (GET /tasks/ID/...): the model is fetched from the nodes that
    // hold it and served only if its blob id is the ledger's final_state.
    h('p', {}, finalState
      ? h('span', {}, h('a', {href: `/tasks/${t.id}/model`, download: '', 'data-k': 'model-link'}, 'download the trained model'),
          ' (the final global state ', h('code', {}, finalState), ': weights and outer momentum, checked against the ledger\'s blob id)')
      : h('span', {class: 'muted', 'data-k': 'model-link'}, t.status === 'open' ? 'no final model yet: the task is open' : `no final model: the task is ${t.status}`),
      ' \u00b7 ', h('a', {href: `/tasks/${t.id}/audit.json`, download: '', 'data-k': 'audit-link'},
        'download the audit record'), ' (the ledger\'s record of the task with its units, JSON)'),
    h('p', {}, 'As a model file: ', h('code', {}, `meshlearn task fetch ${t.id} --rpc ${origin} --out task-${short(t.id)}`),
      h('br'), 'Re-execute and check it: ', h('code', {}, `meshlearn task audit ${t.id} --rpc ${origin}`)),
    h('h3', {}, `Units (${units.length})`),
    table(['unit#', 'round#', 'shard#', 'solver', 'status', 'verdict', 'verifiers', 'train loss#', 'price#', 'paid#'],
          units.map(u => {
            const c = u.check;
            const verdict = c ? (c.result === 'pending' ? c.stage.replace(/_/g, ' ') : c.result) : '-';
            return {sel: u.assignee === selected('node'), cells: [String(u.index), String(u.round), String(u.shard),
              nodeLink(u.assignee), h('span', {class: u.status === 'failed' ? 'bad' : null}, u.status),
              h('span', {class: c && (c.result === 'fraud') ? 'bad' : null, title: c ? c.reason : ''}, verdict),
              c ? c.verifiers.map(short).join(' ') : '-',
              Number(u.loss_micros) ? (Number(u.loss_micros) / 1e6).toFixed(4) : '-', String(u.price),
              num(`unit-${u.index}-paid`, u.paid)]};
          })));
}

// The checks that went wrong, from the task's transactions (a re-run round gives its units to
// other solvers, so the unit records keep only the last attempt): for every committed unit that
// a mismatch verdict, a challenge, a proof or a dispute move named: who committed it (CommitUnit,
// or CommitStage for a pipeline stage),
// who challenged it (RevealVerdict with a mismatch, ChallengeUnit, ProveResult, ProveMerits: the
// merits of a challenge its solver fell silent in), how far the game
// went (DisputePost and DisputeChildren by each side; LateChallenge: a game opened on a unit of a
// final round by any account, with a bond), how it was decided (RuleDispute: the
// referee's ruling; RefereeStep: the ledger executed the disputed step from a witness;
// RefereeTile: it recomputed one tile of one operator, or ruled a whole step from operator roots;
// RefereeStageStep: it replayed one stage's step, or ruled from two commits that a step does not
// start where the stage's previous one ended; ServeStageEvidence: a stage over the witness
// bound posted a piece of its step's evidence) and what became of the solver; a game still
// being played adds its stage from the unit's check.
const kGameTxs = ['RevealVerdict', 'ChallengeUnit', 'DisputePost', 'DisputeChildren', 'RuleDispute',
                  'RefereeStep', 'RefereeTile', 'RefereeStageStep', 'ServeStageEvidence', 'ProveResult',
                  'ProveMerits', 'LateChallenge'];
function disputeTimeline(t) {
  const perRound = Math.max(1, Number(t.params.units_per_round));
  const attempts = [], latest = {};
  const heights = [...blockCache.keys()].filter(b => b >= Number(t.created_height)).sort((x, y) => x - y);
  for (const b of heights) {
    for (const tx of blockCache.get(b).txs) {
      const p = tx.payload || {};
      if (p.task_id !== t.id || !tx.receipt || !tx.receipt.ok) continue;
      if (tx.type === 'CommitUnit' || tx.type === 'CommitStage') {
        const index = tx.type === 'CommitUnit' ? Number(p.index)
            : Number(p.round) * perRound + Number(p.replica) * Number(t.params.stages) + Number(p.stage);
        latest[index] = {index, solver: p.node_id, height: b, events: []};
        attempts.push(latest[index]);
      } else if (kGameTxs.includes(tx.type) && latest[p.index]) {
        if (tx.type === 'RevealVerdict' && Number(p.verdict) !== 2) continue;  // 1: clean
        // A late challenger is an account: its LateChallenge names no node (its moves name its key).
        latest[p.index].events.push({type: tx.type, height: b, sender: tx.sender, node: p.node_id || tx.sender,
                                     bond: p.bond});
      }
    }
  }
  const hits = attempts.filter(a => a.events.length > 0);
  const scanned = heights.length ? `blocks ${heights[0]}..${heights[heights.length - 1]}` : 'no blocks';
  if (!hits.length) return h('p', {class: 'muted', 'data-k': 'disputes', 'data-count': 0}, `none (${scanned} read)`);
  const nodeOf = id => view.nodes.find(n => n.id === id);
  return h('div', {'data-k': 'disputes', 'data-count': hits.length}, hits.map((a, i) => {
    const of = type => a.events.filter(e => e.type === type);
    const posts = of('DisputePost').concat(of('DisputeChildren')).sort((x, y) => x.height - y.height);
    const mine = posts.filter(e => e.node === a.solver);
    const challengers = [...new Set(of('RevealVerdict').concat(of('ChallengeUnit'), of('ProveResult'), of('ProveMerits'),
                                                                of('LateChallenge'),
                                                                posts.filter(e => e.node !== a.solver)).map(e => e.node))];
    const first = a.events[0];
    const lines = [h('b', {}, `unit ${a.index} (round ${Math.floor(a.index / perRound)})`), ': committed by ',
                   nodeLink(a.solver, `dispute-${i}-solver`), ` at block ${a.height}`, h('br'),
                   'challenged by ', challengers.map((c, j) => [j ? ', ' : '', nodeLink(c, j ? null : `dispute-${i}-challenger`)]),
                   ` (${first.type} at block ${first.height})`];
    for (const r of of('LateChallenge')) {
      lines.push(h('br'), `a late game, its round final (LateChallenge at block ${r.height}, bond ${r.bond}: `,
                 'the solver re-runs the unit to answer; the loser of the game pays)');
    }
    if (of('ProveResult').length) lines.push(h('br'), `proved wrong on the ledger (ProveResult at block ${of('ProveResult')[0].height})`);
    if (posts.length) {
      lines.push(h('br'), `the game went ${posts.length} move(s): ${mine.length} by the solver, `,
                 `${posts.length - mine.length} by the challenger (blocks ${posts[0].height}..${posts[posts.length - 1].height})`);
    }
    for (const r of of('RuleDispute')) lines.push(h('br'), 'ruled by the referee ', nodeLink(r.sender), ` (RuleDispute at block ${r.height})`);
    for (const r of of('RefereeStep')) {
      lines.push(h('br'), `decided by the ledger, which executed the disputed step itself (RefereeStep at block ${r.height}, sent by `,
                 nodeLink(r.node || r.sender), ')');
    }
    for (const r of of('RefereeTile')) {
      lines.push(h('br'), `decided by the ledger, which recomputed the disputed tile (or ruled the whole step from its operator roots) itself (RefereeTile at block ${r.height}, sent by `,
                 nodeLink(r.node || r.sender), ')');
    }
    for (const r of of('RefereeStageStep')) {
      lines.push(h('br'), `decided by the ledger, which replayed the disputed stage step (or ruled from its commits that it does not start where the stage's previous step ended) itself (RefereeStageStep at block ${r.height}, sent by `,
                 nodeLink(r.node || r.sender), ')');
    }
    const pieces = of('ServeStageEvidence');
    if (pieces.length) {
      lines.push(h('br'), `the stage posted ${pieces.length} piece(s) of its step's evidence (ServeStageEvidence, blocks `,
                 `${pieces[0].height}..${pieces[pieces.length - 1].height}) against a claim that it served nothing: every piece in rules the claim out`);
    }
    if (posts.length && !['RuleDispute', 'RefereeStep', 'RefereeTile', 'RefereeStageStep', 'ServeStageEvidence'].some(x => of(x).length)) {
      lines.push(h('br'), 'no ruling transaction: the game ended at a deadline (a side missed its turn)');
    }
    const unit = t.units.find(u => Number(u.index) === a.index);
    const d = unit && unit.assignee === a.solver && unit.check && unit.check.dispute;
    if (d) {
      lines.push(h('br'), `game: ${d.stage}, ${d.turns} turn(s) over steps ${d.first_step}..${d.last_step}`);
      if (d.outcome) lines.push(`; ${d.outcome.reason || ''} (solver ${d.outcome.defender_honest ? 'honest' : 'at fault'}, `,
                                `challenger ${d.outcome.challenger_honest ? 'honest' : 'at fault'})`);
    }
    const solver = nodeOf(a.solver);
    if (solver) {
      lines.push(h('br'), 'the solver now: ', h('span', {class: solver.status === 'jailed' ? 'bad' : null}, solver.status),
                 `, ${solver.reputation.slashes} slash(es), stake ${solver.stake}`);
    }
    return h('div', {class: 'timeline'}, lines);
  }), h('p', {class: 'muted'}, 'Stake slashed in this task: ', h('b', {class: 'bad'}, String(t.verification.slashed)),
        ` (each node's stake slashed, over all its tasks, is under Per node). From the task's transactions in ${scanned}.`));
}

// Earnings by kind are the ledger's own per-node record (get_node / list_nodes "earnings",
// written where each payment is made); the transactions behind them are the node's own, from
// account_history.
const kEarnings = [['units', 'units'], ['aggregation', 'aggregation'], ['verification', 'verification'],
                   ['jackpot', 'jackpot']];
// Which transactions of a node earn which kind: a unit it solved (CommitUnit), a round it
// aggregated (CommitAggregate), a check it was drawn for (its sealed and opened verdicts), and
// what can win a jackpot (a mismatch verdict, a challenge, a proof that a result is wrong).
function kindOf(x) {
  const pl = x.payload || {};
  if (x.type === 'CommitUnit' || x.type === 'CommitStage') return 'units';
  if (x.type === 'CommitAggregate') return 'aggregation';
  if (x.type === 'RevealVerdict' && Number(pl.verdict) === 2) return 'jackpot';
  if (x.type === 'CommitVerdict' || x.type === 'RevealVerdict') return 'verification';
  if (x.type === 'ChallengeUnit' || x.type === 'ProveResult' || x.type === 'ProveMerits') return 'jackpot';
  return null;
}

function renderPerNode() {
  const tasks = Object.values(view.full);
  const rows = view.nodes.map(n => {
    const e = n.earnings || {};
    const mine = tasks.flatMap(t => t.units.filter(u => u.assignee === n.id));
    const acct = view.accounts[n.owner] || {};
    return {sel: n.id === selected('node'), cells: [nodeLink(n.id),
      num(`node-${n.id}-units`, mine.filter(isDone).length),
      num(`node-${n.id}-paid-units`, big(e.units)), num(`node-${n.id}-paid-aggregation`, big(e.aggregation)),
      h('span', {}, num(`node-${n.id}-paid-verification`, big(e.verification)), h('span', {class: 'muted'}, ` (${e.checks_paid || 0})`)),
      h('span', {}, num(`node-${n.id}-paid-jackpot`, big(e.jackpot)), h('span', {class: 'muted'}, ` (${e.jackpot_wins || 0})`)),
      num(`node-${n.id}-earned`, sum(kEarnings.map(([k]) => e[k]))),
      h('span', {class: Number(n.reputation.slashes) > 0 ? 'bad' : null}, String(n.reputation.slashes)),
      num(`node-${n.id}-slashed`, big(e.slashed), big(e.slashed) > 0n ? 'bad' : null),
      num(`node-${n.id}-clawed-back`, big(e.clawed_back)),
      String(n.stake), num(`node-${n.id}-balance`, acct.balance === undefined ? '-' : acct.balance), n.status]};
  });
  put('node-earnings',
      h('p', {class: 'muted'}, 'Earnings by kind are the ledger\'s record of each node (list_nodes, get_node: ',
        h('code', {}, 'earnings'), '), over its whole life on the chain: tokens paid from a task\'s escrow before the ',
        'treasury\'s cut (units, aggregation, verification: in brackets, how many checks) and from the jackpot ',
        '(in brackets, how many wins). Units done: over the ', String(tasks.length), ' newest task(s).'),
      table(['node', 'units done#', 'paid for units#', 'paid for aggregation#', 'paid for verification#', 'jackpot#',
             'earned#', 'slashes#', 'stake slashed#', 'clawed back#', 'stake#', 'owner balance#', 'status'], rows));
  const id = selected('node');
  const n = view.nodes.find(x => x.id === id);
  if (!n) { put('node-detail', h('p', {class: 'muted'}, 'Select a node to see the transactions behind its numbers.')); return; }
  const e = n.earnings || {};
  const paid = {};  // "task/index" -> paid, for the units this node solved
  for (const t of tasks) for (const u of t.units) if (u.assignee === id) paid[t.id + '/' + u.index] = u.paid;
  const aggPaid = {};
  for (const t of tasks) for (const r of t.round_results) if (r.aggregator === id) aggPaid[t.id + '/' + r.round] = r.aggregator_paid;
  const hist = (view.historyFor === id && view.history) || [];
  const counts = {};
  hist.forEach(x => { counts[x.type] = (counts[x.type] || 0) + 1; });
  const backing = hist.filter(x => x.type !== 'Heartbeat' && x.type !== 'RevealSecret' && x.type !== 'ReportLinks');
  const byKind = {};
  for (const x of backing) if (x.receipt.ok && kindOf(x)) (byKind[kindOf(x)] = byKind[kindOf(x)] || []).push(x);
  const kindRows = kEarnings.map(([k, label]) => {
    const txs = byKind[k] || [];
    const payments = k === 'verification' ? `${e.checks_paid || 0} check(s) paid` : k === 'jackpot' ? `${e.jackpot_wins || 0} win(s)` : '';
    return {cells: [label, num(`detail-${k}`, big(e[k])), payments, num(`detail-${k}-txs`, txs.length),
                    h('span', {}, txs.slice(0, 12).map((x, i) => [i ? ' ' : '', h('span', {title: x.id}, `${x.type}@${x.receipt.height}`)]),
                      txs.length > 12 ? ` ... (${txs.length - 12} more, below)` : '')]};
  });
  put('node-detail', h('h3', {}, 'Node ', h('code', {}, id)),
      table(['earned for#', 'tokens (ledger)#', 'payments', 'transactions#', 'the transactions behind it (type@block)'], kindRows),
      h('p', {class: 'muted'}, 'Units and aggregation are paid when their round settles (each CommitUnit and CommitAggregate below ',
        'shows what the unit\'s or round\'s record says it was paid; a round that ran again after a cheater was found keeps ',
        'only its last attempt there, the node\'s total keeps every payment). Verification and jackpots are paid at the end of ',
        'the block that settles a check: the ledger records them per node as totals (the number of checks, of wins), ',
        'and the transactions are the node\'s verdicts, challenges and proofs. Stake lost: ',
        h('b', {class: big(e.slashed) > 0n ? 'bad' : null}, String(e.slashed || 0)), ' slashed, ', String(e.clawed_back || 0), ' clawed back.'),
      h('p', {}, `${hist.length} transaction(s) name it${hist.length >= 1000 ? ' (the newest 1000)' : ''}: `, Object.entries(counts).map(([k, c]) => `${k} ${c}`).join(', ')),
      table(['block#', 'type', 'earns', 'task', 'unit / round#', 'paid for it#', 'outcome', 'tx'],
            backing.map(x => {
              const pl = x.payload || {};
              const key = pl.task_id + '/' + (x.type === 'CommitAggregate' ? pl.round : pl.index);
              const amount = x.type === 'CommitUnit' ? paid[key] : x.type === 'CommitAggregate' ? aggPaid[key] : undefined;
              return {cells: [String(x.receipt.height), x.type, kindOf(x) || '', pl.task_id ? link(short(pl.task_id), 'task=' + pl.task_id) : '-',
                              pl.index !== undefined ? String(pl.index) : pl.round !== undefined ? String(pl.round) : '-',
                              amount !== undefined ? String(amount) : '',
                              x.receipt.ok ? 'ok' : h('span', {class: 'bad'}, x.receipt.reason), short(x.id)]};
            })));
}

// ---- Live: long-poll wait_block; reload the records when a block arrives.
// #updates=N stops after N updates (a still page, e.g. for a headless browser's screenshot).
async function live() {
  const stopAfter = Number((location.hash.match(/updates=([0-9]+)/) || [])[1] || Infinity);
  for (;;) {
    if (view.updates >= stopAfter) {
      document.getElementById('live').className = 'off';
      put('live', `stopped after ${view.updates} updates (#updates=${stopAfter})`);
      return;
    }
    try {
      const [w] = await rpc([['wait_block', {after: view.height, timeout_ms: 5000}]]);
      document.getElementById('live').className = 'on';
      put('live', 'live');
      put('error');
      if (Number(w.height) > view.height) await load();
    } catch (e) {
      document.getElementById('live').className = 'off';
      put('live', 'reconnecting');
      put('error', String(e.message || e));
      await sleep(2000);
    }
    await sleep(100);  // between polls (and lets a headless browser's virtual clock advance)
  }
}
window.addEventListener('hashchange', () => { load().catch(e => put('error', String(e.message || e))); });
load().catch(e => put('error', String(e.message || e))).then(live);
</script>
</body>
</html>
)MLPAGE";

// ---- Downloads (dashboard.h).

DashboardFile Refuse(int http_status, std::string message) {
  return {http_status, "text/plain; charset=utf-8", "", std::move(message) + "\n"};
}

// What a request named, fit to be echoed in an error line: printable ASCII, at most 80 bytes.
std::string Echo(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += c >= 0x20 && c < 0x7f ? c : '?';
  if (text.size() > 80) out += "...";
  return out;
}

// An RPC error as the HTTP status of the download that needed the call.
int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kResourceExhausted: return 503;
    default: return 500;
  }
}

std::string StringAt(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}
uint64_t NumberAt(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return 0;
  return j[key].is_number_unsigned() || j[key].get<int64_t>() >= 0 ? j[key].get<uint64_t>() : 0;
}

// The blob servers of the registered nodes that have not left ("host:port"), the one that
// produced the blob (`first`, a node id) first: any node may hold it, and what one serves is
// checked against the blob id.
Result<std::vector<std::string>> BlobProviders(const DashboardSources& src,
                                               const std::string& first) {
  std::vector<std::string> preferred, others;
  json params = {{"limit", 100}};
  for (int page = 0; page < 100; ++page) {
    ML_ASSIGN_OR_RETURN(json answer, src.rpc("list_nodes", params));
    if (answer.contains("items") && answer["items"].is_array()) {
      for (const json& n : answer["items"]) {
        std::string endpoint = StringAt(n, "endpoint");
        if (StringAt(n, "status") == "unbonding" || endpoint.empty()) continue;
        if (endpoint.rfind("http://", 0) == 0) endpoint = endpoint.substr(7);
        (StringAt(n, "id") == first ? preferred : others).push_back(endpoint);
      }
    }
    if (!answer.contains("next_cursor") || answer["next_cursor"].is_null()) break;
    params["cursor"] = answer["next_cursor"];
  }
  preferred.insert(preferred.end(), others.begin(), others.end());
  return preferred;
}

DashboardFile ServeModel(const std::string& id, const json& task, const DashboardSources& src) {
  const std::string status = StringAt(task, "status");
  const std::string final_hex = StringAt(task, "final_state");
  const size_t rounds_done =
      task.contains("round_results") && task["round_results"].is_array() ? task["round_results"].size() : 0;
  const uint64_t rounds = task.contains("params") ? NumberAt(task["params"], "rounds") : 0;
  const bool has_final = final_hex.find_first_not_of('0') != std::string::npos;
  if (status != "finished" || !has_final) {
    const std::string done = " (" + std::to_string(rounds_done) + " of " +
                             std::to_string(rounds) + " rounds done)";
    if (status == "open") {
      return Refuse(409, "task " + id + " is open" + done +
                             ": its model is final when the task finishes. The latest finished "
                             "round's state now: meshlearn task fetch " + id + " --out DIR");
    }
    return Refuse(409, "task " + id + " is " + status + done +
                           ": it has no final model. A finished round's state: meshlearn task "
                           "fetch " + id + " --out DIR");
  }
  Result<Hash256> state = Hash256::FromHex(final_hex, "final_state");
  if (!state.ok()) return Refuse(500, "get_task: " + state.status().message());
  const BlobId blob{*state};
  // A global state blob is "MLGS1" | u64 n | n weights | n momentum: twice the model's float32
  // bytes and a header. Room to spare; it bounds what a node can make this server hold.
  const uint64_t model_bytes = task.contains("params") ? NumberAt(task["params"], "model_bytes") : 0;
  const uint64_t max_bytes =
      model_bytes > (kMaxBlobSize - 4096) / 4 ? kMaxBlobSize : 4096 + 4 * model_bytes;
  std::string aggregator;
  if (rounds_done > 0) aggregator = StringAt(task["round_results"].back(), "aggregator");
  Result<std::vector<std::string>> providers = BlobProviders(src, aggregator);
  if (!providers.ok()) return Refuse(HttpStatusOf(providers.status()), providers.status().message());
  if (providers->empty()) {
    return Refuse(503, "the final state " + final_hex + " of task " + id +
                           " is not available: no registered node to fetch it from; try again "
                           "when the nodes that hold it are up");
  }
  Result<FetchedBlob> got = src.fetch(blob, *providers, max_bytes);
  if (!got.ok()) {
    return Refuse(503, "the final state " + final_hex + " of task " + id +
                           " is not available from the nodes now (asked " +
                           std::to_string(providers->size()) + "): " + got.status().message() +
                           "; try again when the nodes that hold it are up");
  }
  // The content address the ledger recorded, whatever the fetch did.
  Status size_ok = ValidateBlobSize(got->data.size(), got->chunk_size);
  if (!size_ok.ok() || BuildManifest(got->data, got->chunk_size).id() != blob) {
    return Refuse(502, "the nodes served bytes that are not the final state " + final_hex +
                           " of task " + id + " (their blob id differs); not served");
  }
  return {200, "application/octet-stream",
          "task-" + id.substr(0, 12) + "-final-state-" + final_hex.substr(0, 12) + ".mlgs",
          std::string(got->data.begin(), got->data.end())};
}

}  // namespace

std::string_view DashboardHtml() { return kPage; }

DashboardFile ServeTaskFile(std::string_view path, const DashboardSources& src) {
  constexpr std::string_view kPrefix = "/tasks/";
  const std::string kFiles = "the dashboard serves /tasks/<task id>/model and "
                             "/tasks/<task id>/audit.json";
  if (path.substr(0, kPrefix.size()) != kPrefix) {
    return Refuse(404, "no such path '" + Echo(path) + "'; " + kFiles);
  }
  const std::string_view rest = path.substr(kPrefix.size());
  const size_t slash = rest.find('/');
  const std::string_view id_text = rest.substr(0, slash);
  const std::string_view file = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  if (file != "model" && file != "audit.json") {
    return Refuse(404, "no file '" + Echo(file) + "' for a task; " + kFiles);
  }
  Result<Hash256> id = Hash256::FromHex(id_text, "task id");
  if (!id.ok()) {
    return Refuse(400, "'" + Echo(id_text) + "' in " + Echo(path) +
                           " is not a task id (64 hex digits); the dashboard's task view links "
                           "the whole id");
  }
  const std::string hex = id->ToHex();
  // Height first: the record is at least as recent.
  Result<json> chain = src.rpc("chain_status", json::object());
  if (!chain.ok()) return Refuse(HttpStatusOf(chain.status()), chain.status().message());
  Result<json> task = src.rpc("get_task", {{"id", hex}, {"units", file == "audit.json"}});
  if (!task.ok()) {
    if (task.status().code() == StatusCode::kNotFound) {
      return Refuse(404, "no task " + hex + " on this ledger (chain " +
                             StringAt(*chain, "chain_id") + ")");
    }
    return Refuse(HttpStatusOf(task.status()), task.status().message());
  }
  if (file == "model") return ServeModel(hex, *task, src);
  const json record = {
      {"format", "meshlearn.task_record.v1"},
      {"about", "the ledger's record of a task: every hash from the initial state to the final "
                "one, each unit's commitment, result, check and pay, each round's aggregate and "
                "result; `meshlearn task audit ID --full` re-executes the units and checks them"},
      {"chain_id", StringAt(*chain, "chain_id")},
      {"height", NumberAt(*chain, "height")},
      {"task", *task}};
  return {200, "application/json", "task-" + hex.substr(0, 12) + "-record.json",
          record.dump(2) + "\n"};
}

DashboardSources DashboardSourcesOf(RpcService* service) {
  DashboardSources s;
  s.rpc = [service](const std::string& method, const json& params) -> Result<json> {
    json answer = service->HandleRpc(
        {{"jsonrpc", "2.0"}, {"id", 1}, {"method", method}, {"params", params}});
    if (answer.contains("error")) {
      const json& e = answer["error"];
      std::string code = e.contains("data") ? StringAt(e["data"], "status") : "";
      return Status(ErrorCodeFromName(code), method + ": " + StringAt(e, "message"));
    }
    return answer.contains("result") ? answer["result"] : json(nullptr);
  };
  s.fetch = [](const BlobId& id, const std::vector<std::string>& endpoints,
               uint64_t max_bytes) -> Result<FetchedBlob> {
    MemEnv env;  // this request's blobs, in memory only: `chain serve` keeps none
    ML_ASSIGN_OR_RETURN(std::unique_ptr<net::BlobStore> store, net::BlobStore::Open(&env, "/blobs"));
    net::HttpTransport transport;
    net::Fetcher fetcher(&transport, store.get(), {.max_blob_bytes = max_bytes});
    ML_RETURN_IF_ERROR(fetcher.Fetch(id, endpoints).status());
    ML_ASSIGN_OR_RETURN(net::Manifest m, store->GetManifest(id));
    ML_ASSIGN_OR_RETURN(Bytes data, store->Get(id));
    return FetchedBlob{std::move(data), m.chunk_size};
  };
  return s;
}

}  // namespace meshlearn::ledger

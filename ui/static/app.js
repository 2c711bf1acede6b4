// OpenClaw Control UI. Plain JavaScript, no build step: every page is a server-rendered shell,
// filled from /api/v1 and its WebSocket streams (same origin, session cookie).
'use strict';

const $ = (sel, root) => (root || document).querySelector(sel);

// usd writes US dollars: cents for large sums, tenths of a cent below $10.
const usd = (v) => '$' + (v || 0).toFixed(v >= 10 ? 2 : 4);

// el builds an element; children are nodes or strings (always text, never HTML).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) if (k !== undefined && k !== null) e.append(k);
  return e;
}

class APIError extends Error {
  constructor(status, body) {
    const err = (body && body.error) || {};
    super(err.message || ('HTTP ' + status));
    this.status = status;
    this.code = err.code || '';
    this.field = err.field || '';
  }
}

async function api(method, path, body, opts) {
  opts = opts || {};
  const headers = Object.assign({}, opts.headers || {});
  let payload;
  if (body !== undefined) {
    if (typeof body === 'string') payload = body;
    else { payload = JSON.stringify(body); headers['Content-Type'] = 'application/json'; }
  }
  const res = await fetch('/api/v1' + path, { method, headers, body: payload, credentials: 'same-origin' });
  if (res.status === 401) { location.href = '/login'; throw new APIError(401, null); }
  const text = await res.text();
  const ctype = res.headers.get('Content-Type') || '';
  const data = text && ctype.startsWith('application/json') ? JSON.parse(text) : text;
  if (!res.ok) throw new APIError(res.status, data);
  return data;
}

// apiList follows every page of a list route (?limit, ?cursor; the gateway names the next page in
// X-Next-Cursor) and returns all the items; it stops at 1000 pages.
async function apiList(path) {
  const all = [];
  let cursor = '';
  for (let i = 0; i < 1000; i++) {
    const sep = path.includes('?') ? '&' : '?';
    const res = await fetch('/api/v1' + path + sep + 'limit=1000' + (cursor ? '&cursor=' + encodeURIComponent(cursor) : ''), { credentials: 'same-origin' });
    if (res.status === 401) { location.href = '/login'; throw new APIError(401, null); }
    const text = await res.text();
    const data = text ? JSON.parse(text) : [];
    if (!res.ok) throw new APIError(res.status, data);
    all.push(...data);
    cursor = res.headers.get('X-Next-Cursor') || '';
    if (!cursor) break;
  }
  return all;
}

// stream follows a WebSocket feed, reconnecting after the last cursor it saw. onItem gets each
// message in order; a message at or before the cursor (a replay) is dropped here, except the first
// of a connection: the gateway replays only what follows the cursor, so an earlier one means its
// feed started again (a restarted gateway) and the cursor follows it. opts.onGap gets the count of
// messages lost (too old to replay), opts.onReopen each reconnection: what changed meanwhile
// may be neither replayed nor counted (a restarted gateway), so a view that follows the feed
// instead of polling reloads then.
function stream(path, cursor, onItem, opts) {
  opts = opts || {};
  let closed = false, sock = null, opened = false;
  const s = { cursor: cursor || 0, close() { closed = true; if (sock) sock.close(); } };
  const open = () => {
    if (closed) return;
    const sep = path.includes('?') ? '&' : '?';
    sock = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/api/v1' + path + sep + 'cursor=' + s.cursor);
    let first = true;
    sock.onopen = () => { if (opened && opts.onReopen) opts.onReopen(); opened = true; };
    sock.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type === 'gap') { first = false; if (opts.onGap) opts.onGap(m.missed); return; }
      if (m.cursor <= s.cursor && !(first && opts.onReopen)) return;
      first = false;
      s.cursor = m.cursor;
      onItem(m);
    };
    sock.onclose = () => { if (!closed) setTimeout(open, 500); };
  };
  open();
  return s;
}

// Placement states in words: what a worker badge says.
const badgeWords = {
  requested: 'provisioning', provisioning: 'provisioning', syncing: 'syncing', starting: 'starting',
  active: 'running', draining: 'draining', reconciling: 'reconciling', reclaimed: 'reclaimed', failed: 'failed',
};
const moving = new Set(['requested', 'provisioning', 'syncing', 'starting', 'draining', 'reconciling']);

function badge(state) {
  const word = badgeWords[state];
  if (!word) return null;
  return el('span', { class: 'badge badge-' + word, 'data-state': state, text: word, title: 'worker: ' + word });
}

function ago(ms) {
  if (!ms && ms !== 0) return '';
  const s = Math.round(ms / 1000);
  if (s < 60) return s + 's';
  if (s < 3600) return Math.round(s / 60) + 'm';
  if (s < 86400) return Math.round(s / 3600) + 'h';
  return Math.round(s / 86400) + 'd';
}

function showError(node, err) {
  node.textContent = '';
  if (!err) return;
  node.append(err.field ? el('strong', { class: 'field', text: err.field + ': ' }) : '', err.message);
}

// ---- Sessions sidebar: every page ------------------------------------------------------------

const sidebar = {
  placements: new Map(),
  timer: null,
  async load() {
    const [list, pls] = await Promise.all([apiList('/sessions'), apiList('/placements')]);
    this.placements = new Map(pls.map((p) => [p.sessionId, p]));
    list.sort((a, b) => (a.createdAt < b.createdAt ? 1 : a.createdAt > b.createdAt ? -1 : 0));
    const ul = $('#session-list');
    const current = document.body.dataset.id;
    const frag = document.createDocumentFragment();
    // Children spawned by an agent (sessions_spawn) are listed under their parent, newest first,
    // indented one step per level; a child whose parent is not listed stands on its own.
    const byId = new Map(list.map((s) => [s.id, s]));
    const children = new Map();
    for (const s of list) {
      if (s.parentSessionId && byId.has(s.parentSessionId)) {
        if (!children.has(s.parentSessionId)) children.set(s.parentSessionId, []);
        children.get(s.parentSessionId).push(s);
      }
    }
    const add = (s, depth) => {
      const p = this.placements.get(s.id);
      const parent = depth > 0 ? byId.get(s.parentSessionId) : null;
      const a = el('a', { href: '/sessions/' + encodeURIComponent(s.id), 'aria-current': s.id === current && document.body.dataset.page === 'chat' ? 'page' : null },
        el('span', { class: 'session-title', text: s.title || s.id }),
        el('span', { class: 'session-model muted', text: s.model }),
        p ? badge(p.state) : null,
        parent ? el('span', { class: 'session-parent muted', text: 'child of ' + (parent.title || parent.id) }) : null);
      frag.append(el('li', { 'data-session': s.id, 'data-parent': parent ? parent.id : null,
        class: depth > 0 ? 'child depth-' + Math.min(depth, 5) : null }, a));
      for (const c of children.get(s.id) || []) add(c, depth + 1);
    };
    for (const s of list) {
      if (!(s.parentSessionId && byId.has(s.parentSessionId))) add(s, 0);
    }
    ul.replaceChildren(frag);
    $('#session-list-status').textContent = list.length ? '' : 'No sessions yet.';
    document.dispatchEvent(new CustomEvent('sessions-loaded'));
  },
  soon(ms) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.load().catch(() => this.soon(2000)), ms);
  },
  start() {
    this.load().catch((e) => { $('#session-list-status').textContent = e.message; });
    // The gateway-wide feed says when a session is created or changes and when its placement
    // moves; the list reloads (at most every 100 ms), and after what the feed could not replay.
    const reload = () => this.soon(100);
    stream('/events', 0, (c) => {
      if (c && c.kind === 'budget.warning') budgetWarning(c.id);
      reload();
    }, { onGap: reload, onReopen: reload });
  },
};

// budgetWarning shows, on every page, that a budget passed its warning share (the feed says so
// once a window), with its figures and a link to the Usage page: at the foot of the sidebar, where
// it moves nothing the user is about to click.
async function budgetWarning(id) {
  const p = $('#budget-warning');
  if (!p) return;
  let text = 'Budget ' + id + ' has passed its warning share.';
  try {
    const b = (await api('GET', '/budgets')).find((x) => x.id === id);
    if (b && !b.warning && !b.exceeded) return; // an earlier window's warning, replayed by the feed
    if (b) text = `Budget ${b.id} has spent ${usd(b.spentUsd)} of ${usd(b.limitUsd)}` + (b.exceeded ? ': new turns, model calls and leases it counts are refused.' : '.');
  } catch { /* the id is enough */ }
  p.replaceChildren(text + ' ', el('a', { href: '/usage', text: 'See usage' }));
  p.hidden = false;
}

// ---- Chat view -------------------------------------------------------------------------------

const WINDOW = 200; // transcript entries rendered at once; "Show earlier entries" adds as many

function textOf(content) {
  return (content || []).filter((c) => c.type === 'text').map((c) => c.text).join('');
}

function short(v, n) {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  if (s === undefined) return '';
  return s.length > n ? s.slice(0, n) + '…' : s;
}

function toolRow(id, name, args) {
  return el('li', { class: 'tool', 'data-tool-call': id },
    el('span', { class: 'tool-name', text: name }),
    el('code', { class: 'tool-args', text: short(args || {}, 400) }),
    el('span', { class: 'tool-status', text: 'running' }),
    el('pre', { class: 'tool-result' }));
}

function setToolResult(row, result, isError) {
  $('.tool-status', row).textContent = isError ? 'error' : 'done';
  row.classList.toggle('tool-error', !!isError);
  $('.tool-result', row).textContent = short(result, 2000);
}

function resultText(r) {
  if (r === undefined || r === null) return '';
  if (typeof r === 'string') return r;
  if (Array.isArray(r.content)) return textOf(r.content);
  return r;
}

function roleOf(e) {
  try { return (typeof e.content === 'string' ? JSON.parse(e.content) : e.content).role; } catch { return ''; }
}

function chatPage(id) {
  const st = { entries: [], shown: WINDOW, running: null, feed: null, session: null, placement: null };
  const tr = $('#transcript'), live = $('#live');

  function renderEntry(e, rows) {
    if (e.type !== 'message') return null;
    let m;
    try { m = typeof e.content === 'string' ? JSON.parse(e.content) : e.content; } catch { return null; }
    if (m.role === 'user') return el('li', { class: 'msg user', 'data-entry': e.id }, el('span', { class: 'who', text: 'You' }), el('p', { text: textOf(m.content) }));
    if (m.role === 'assistant') {
      const li = el('li', { class: 'msg assistant', 'data-entry': e.id }, el('span', { class: 'who', text: 'Assistant' }));
      for (const c of m.content || []) {
        if (c.type === 'text' && c.text) li.append(el('p', { class: 'text', text: c.text }));
        else if (c.type === 'thinking') li.append(el('details', { class: 'thinking' }, el('summary', { text: 'Thinking' }), el('p', { text: c.thinking })));
        else if (c.type === 'toolCall') {
          const row = toolRow(c.id, c.name, c.arguments);
          rows.set(c.id, row);
          li.append(el('ol', { class: 'tools' }, row));
        }
      }
      if (m.errorMessage) li.append(el('p', { class: 'error', text: m.errorMessage }));
      return li;
    }
    if (m.role === 'toolResult') {
      const row = rows.get(m.toolCallId);
      if (row) { setToolResult(row, textOf(m.content), m.isError); return null; }
      const orphan = toolRow(m.toolCallId, m.toolName, null);
      setToolResult(orphan, textOf(m.content), m.isError);
      return el('li', { class: 'msg tool-only' }, el('ol', { class: 'tools' }, orphan));
    }
    return null;
  }

  function renderTranscript() {
    // While a turn streams, its committed entries (but the user's message) are shown by the live
    // view instead; the transcript takes them over when the turn ends.
    const runEpoch = st.running ? st.running.runEpoch : -1;
    const visible = st.entries.filter((e) => e.runEpoch !== runEpoch || roleOf(e) === 'user');
    const from = Math.max(0, visible.length - st.shown);
    const earlierCount = from + (st.offset || 0);
    const rows = new Map();
    const frag = document.createDocumentFragment();
    for (const e of visible.slice(from)) {
      const li = renderEntry(e, rows);
      if (li) frag.append(li);
    }
    // The message just sent shows at once, until its committed entry arrives.
    if (st.pending && st.running && !visible.some((e) => e.runEpoch === runEpoch && roleOf(e) === 'user')) {
      frag.append(el('li', { class: 'msg user pending' }, el('span', { class: 'who', text: 'You' }), el('p', { text: st.pending })));
    }
    tr.replaceChildren(frag);
    const earlier = $('#earlier');
    earlier.hidden = earlierCount === 0;
    earlier.textContent = 'Show earlier entries (' + earlierCount + ' more)';
    tr.dataset.rendered = String(visible.length - from);
    tr.dataset.total = String(st.total);
  }

  // Live view of the running turn, rebuilt from its events (replayed from the turn's cursor).
  let cur = null; // the assistant item the deltas go to
  const liveRows = new Map();
  function liveItem() {
    if (!cur) { cur = el('li', { class: 'msg assistant streaming' }, el('span', { class: 'who', text: 'Assistant' })); live.append(cur); }
    return cur;
  }
  function applyLive(rec) {
    if (st.running && rec.runId && rec.runId !== st.running.runId) return;
    const ev = rec.event;
    switch (ev.type) {
      case 'text_delta': {
        const item = liveItem();
        let p = item.lastElementChild;
        if (!p || !p.classList.contains('text')) { p = el('p', { class: 'text' }); item.append(p); }
        p.textContent += ev.delta;
        break;
      }
      case 'thinking_delta': {
        const item = liveItem();
        let d = item.lastElementChild;
        if (!d || !d.classList.contains('thinking')) { d = el('details', { class: 'thinking' }, el('summary', { text: 'Thinking' }), el('p')); item.append(d); }
        d.lastElementChild.textContent += ev.delta;
        break;
      }
      case 'tool_start': {
        const row = toolRow(ev.toolCallId, ev.toolName, ev.args);
        liveRows.set(ev.toolCallId, row);
        liveItem().append(el('ol', { class: 'tools' }, row));
        cur = null;
        break;
      }
      case 'tool_update': {
        const row = liveRows.get(ev.toolCallId);
        if (row) $('.tool-result', row).textContent = short(resultText(ev.partialResult), 2000);
        break;
      }
      case 'tool_result': {
        const row = liveRows.get(ev.toolCallId);
        if (row) setToolResult(row, resultText(ev.result), ev.isError);
        break;
      }
      case 'lifecycle_error':
        live.append(el('li', { class: 'msg error', text: 'Turn failed: ' + ev.error }));
        if (st.running && rec.runId === st.running.runId) endTurn();
        break;
      case 'lifecycle_end':
        if (st.running && rec.runId === st.running.runId) endTurn();
        break;
      // a live move: the same turn stops at a model call and goes on on the session's next owner
      case 'lifecycle_yield':
        live.append(el('li', { class: 'note', text: 'The turn stopped at a model call to move live…' }));
        cur = null;
        break;
      case 'lifecycle_resume':
        live.append(el('li', { class: 'note', text: 'The turn goes on after the move.' }));
        cur = null;
        break;
    }
  }

  function setRunning(t) {
    st.running = t;
    $('#send').disabled = !!t || !!st.claim;
    $('#stop').disabled = !t;
    // a move while a turn runs: wait for it (drain), stop it (cancel) or move it with the session (live)
    $('#move-busy').hidden = $('#move-busy-label').hidden = !t;
    $('#turn-status').textContent = t ? 'Turn running…' : '';
    document.body.dataset.turn = t ? 'running' : 'idle';
  }

  function follow(t) {
    if (st.feed && st.running && st.running.runId === t.runId) return;
    if (st.feed) st.feed.close();
    live.replaceChildren(); cur = null; liveRows.clear();
    $('#gap').hidden = true;
    setRunning(t);
    renderTranscript();
    st.feed = stream('/sessions/' + encodeURIComponent(id) + '/stream', t.cursor, applyLive, {
      onGap: (n) => { const g = $('#gap'); g.hidden = false; g.textContent = n + ' live events were no longer kept; the transcript shows the turn when it ends.'; },
    });
  }

  async function endTurn() {
    st.pending = null;
    if (st.feed) { st.feed.close(); st.feed = null; }
    await load();
    loadSpend();
  }

  // the session's spend so far (its tree's, with its own budget)
  async function loadSpend() {
    let sp;
    try { sp = await api('GET', '/sessions/' + encodeURIComponent(id) + '/spend'); } catch { return; }
    $('#spend').textContent = 'Spent ' + usd(sp.treeUsd) + (sp.treeUsd !== sp.ownUsd ? ' (its own ' + usd(sp.ownUsd) + ')' : '') +
      (sp.budgetUsd ? ' of its budget ' + usd(sp.budgetUsd) : '');
  }
  loadSpend();

  async function loadPlacement() {
    let v;
    try { v = await api('GET', '/sessions/' + encodeURIComponent(id) + '/placement'); } catch { return; }
    st.placement = v.placement;
    const p = v.placement, remote = !['local', 'reclaimed', 'failed'].includes(p.state);
    $('#runs-on').textContent = remote ? 'Runs on worker · ' + (p.profileId || '?') + ' · ' + (p.environmentId || 'leasing') : 'Runs on gateway';
    $('#runs-on').replaceChildren($('#runs-on').textContent, ' ', p.state !== 'local' ? badge(p.state) || '' : '');
    $('#runs-on').dataset.env = remote ? p.environmentId || '' : '';
    $('#move').hidden = remote; $('#move-profile').hidden = remote; $('label[for=move-profile]').hidden = remote;
    showMoveClass(remote);
    $('#pullback').hidden = p.state !== 'active';
    // a session home from a worker with a managed git branch can publish it (session publish)
    $('#publish-controls').hidden = !(p.state === 'local' && p.syncMode === 'git' && p.anchorDir);
    // the recovery of a failed or reclaimed session: run it on the gateway (session move --local)
    $('#move-local').hidden = p.state !== 'failed' && p.state !== 'reclaimed';
    // the steps of the latest move: the events since the placement last rested at local
    const evs = v.events || [];
    let start = 0;
    // (a note made at home, such as a publish, starts no move)
    for (let i = evs.length - 1; i >= 0; i--) { if ((evs[i].from === 'local' && evs[i].to !== 'local') || (evs[i].from === 'active' && evs[i].to === 'draining')) { start = i; break; } }
    // a note within a move (a barrier step, a checkpoint) is shown under the state it was made in
    $('#steps').replaceChildren(...evs.slice(start).map((e) => e.from === e.to
      ? el('li', { class: 'note' }, e.reason || '')
      : el('li', { 'data-to': e.to }, el('strong', { text: e.to }), ' ', e.reason || '')));
    const back = $('#came-back');
    back.replaceChildren();
    // the last change of state (notes made since, such as a publish, do not hide what came back)
    const last = [...evs].reverse().find((e) => e.from !== e.to) || evs[evs.length - 1];
    if (p.state === 'local' && last && last.to === 'local' && (last.reason || '').startsWith('pulled back: ')) {
      back.append(el('h2', { text: 'What came back' }), el('p', { class: 'came-back', text: last.reason.slice('pulled back: '.length) }));
      if (st.changesFor !== last.at) {
        st.changesFor = last.at;
        api('GET', '/sessions/' + encodeURIComponent(id) + '/changes').then((ch) => { st.changes = ch; showChanges(); }).catch(() => {});
      } else showChanges();
    }
    if (p.state === 'reclaimed') {
      const cpr = [...evs].reverse().find((e) => /^checkpoint \d+:/.test(e.reason || ''));
      back.append(el('p', { class: 'warn', text: 'The worker was lost (' + ((last && last.reason) || 'no reason recorded') + '). ' +
        (cpr ? 'Changes made on the worker after ' + cpr.reason.split(':')[0] + ' (' + new Date(cpr.at).toLocaleString() + ') are lost; the session continues from that checkpoint.'
          : 'No checkpoint was taken: every change made on the worker is lost.') }));
    }
    if (p.state === 'failed') back.append(el('p', { class: 'error', text: 'Failed: ' + (p.error || 'no reason recorded') }));
    $('#tunnel').textContent = '';
    $('#pressure').hidden = true;
    if (remote && p.environmentId) {
      try {
        const w = await api('GET', '/environments/' + encodeURIComponent(p.environmentId) + '/worker');
        $('#tunnel').textContent = 'tunnel ' + w.tunnelStatus;
        if (w.backpressure) {
          $('#pressure').hidden = false;
          $('#pressure').textContent = 'The worker is shedding load: ' + w.queued + ' requests queued, ' + w.capacityRejections + ' refused for capacity' +
            (w.shedding ? ' (' + sheddingText(w.shedding) + ')' : '') + '.';
        }
      } catch { /* the environment may be gone */ }
    }
    // The latest checkpoint: what a lost worker would cost.
    const cp = [...evs].reverse().find((e) => /^checkpoint( \d+:| failed)/.test(e.reason || ''));
    $('#checkpoint').textContent = cp ? 'Last ' + cp.reason + ' (' + new Date(cp.at).toLocaleTimeString() + ')' : '';
    // Another holder of the session's turn claim (a checkpoint after a worker turn) keeps Send
    // disabled until it lets go.
    st.claim = !st.running && p.turnRunId ? p.turnRunId : '';
    $('#send').disabled = !!st.running || !!st.claim;
    if (!st.running) $('#turn-status').textContent = st.claim ? 'Busy: ' + st.claim + ' in progress…' : '';
    // Placement moves and turn claims come on the gateway-wide feed (below); the worker's tunnel
    // and load are not on it: polled while the session runs on a worker.
    clearTimeout(st.placementTimer);
    if (remote) st.placementTimer = setTimeout(loadPlacement, 1000);
  }

  // Only the newest entries are fetched (the window plus the running turn's), never the whole
  // transcript: ?limit= of GET /sessions/:id/transcript.
  function transcriptPath() {
    return '/sessions/' + encodeURIComponent(id) + '/transcript?limit=' + (st.shown + 64);
  }
  function setPage(t) {
    st.entries = t.entries || [];
    st.offset = t.offset || 0;
    st.total = t.total === undefined ? st.entries.length : t.total;
  }

  // The commits and files on the managed branch, and the files that came back uncommitted.
  function showChanges() {
    const ch = st.changes, back = $('#came-back');
    if (!ch || !back.firstChild) return;
    if (ch.mode === 'git') {
      back.append(el('p', { text: ch.commits.length + ' commit(s) on ' + ch.branch + ' in ' + ch.anchorDir }),
        el('ul', { class: 'commits', 'aria-label': 'Commits' }, ...ch.commits.map((c) => el('li', { 'data-commit': c.id },
          el('code', { text: c.id.slice(0, 12) }), ' ', c.subject, el('span', { class: 'muted', text: ' · ' + c.author + ' · ' }),
          el('a', { href: '/sessions/' + encodeURIComponent(id) + '/commits/' + c.id, class: 'diff-link', text: 'View diff' })))));
      if (ch.files.length) back.append(el('ul', { class: 'files', 'aria-label': 'Files in the commits' }, ...ch.files.map((f) => el('li', {}, el('code', { text: f.status }), ' ', f.path))));
    }
    if (ch.uncommitted.length) back.append(el('p', { text: 'Uncommitted in the anchor:' }), el('ul', { class: 'files', 'aria-label': 'Uncommitted files' }, ...ch.uncommitted.map((f) => el('li', {}, el('code', { text: f.status }), ' ', f.path))));
    if (ch.truncated) back.append(el('p', { class: 'muted', text: 'The list is cut at its bound.' }));
  }

  async function load() {
    const [t, turns] = await Promise.all([
      api('GET', transcriptPath()),
      apiList('/sessions/' + encodeURIComponent(id) + '/turns'),
    ]);
    st.session = t.session;
    setPage(t);
    $('#chat-title').textContent = t.session.title || t.session.id;
    document.title = (t.session.title || t.session.id) + ' · OpenClaw';
    const running = (turns || []).find((x) => x.status === 'running' || x.status === 'queued' || x.status === 'moving');
    if (running) follow(running);
    else { if (st.feed) { st.feed.close(); st.feed = null; } live.replaceChildren(); cur = null; setRunning(null); }
    renderTranscript();
    loadPlacement();
  }

  // While a turn runs, new commits (the user's message) join the transcript; the turn's own
  // assistant entries stay hidden until it ends, so nothing shows twice.
  let refreshTimer = null;
  function refreshEntries() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(async () => {
      try {
        setPage(await api('GET', transcriptPath()));
        renderTranscript();
      } catch { /* the next change retries */ }
    }, 100);
  }

  $('#earlier').addEventListener('click', () => { st.shown += WINDOW; refreshEntries(); });
  $('#composer').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const text = $('#message').value;
    if (!text.trim() || st.running) return;
    showError($('#chat-error'), null);
    $('#send').disabled = true;
    try {
      const t = await api('POST', '/sessions/' + encodeURIComponent(id) + '/messages', { text });
      $('#message').value = '';
      st.pending = text;
      if (t.status === 'running' || t.status === 'queued' || t.status === 'moving') follow(t);
      await load();
    } catch (e) { showError($('#chat-error'), e); $('#send').disabled = !!st.running; }
  });
  $('#message').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); $('#composer').requestSubmit(); }
  });
  $('#stop').addEventListener('click', async () => {
    try { await api('POST', '/sessions/' + encodeURIComponent(id) + '/cancel'); } catch (e) { showError($('#chat-error'), e); }
  });
  $('#move').addEventListener('click', async () => {
    showError($('#chat-error'), null);
    try {
      const cls = $('#move-class').hidden ? undefined : $('#move-class').value || undefined;
      await api('POST', '/sessions/' + encodeURIComponent(id) + '/dispatch', { profileId: $('#move-profile').value, machineClass: cls, busy: busyPolicy() });
    } catch (e) { showError($('#chat-error'), e); }
    loadPlacement(); sidebar.soon(100);
  });
  function busyPolicy() { return $('#move-busy').hidden ? undefined : $('#move-busy').value; }
  $('#move-local').addEventListener('click', async () => {
    showError($('#chat-error'), null);
    try { await api('POST', '/sessions/' + encodeURIComponent(id) + '/move', { to: 'local' }); } catch (e) { showError($('#chat-error'), e); }
    loadPlacement(); sidebar.soon(100);
  });
  // Publish: push openclaw/<session> to the chosen remote with the gateway's forge credential,
  // optionally opening its pull request; the result or the refusal is shown under the controls.
  $('#publish').addEventListener('click', async () => {
    const out = $('#publish-result');
    out.hidden = false; out.className = 'muted'; out.replaceChildren('Publishing…');
    $('#publish').disabled = true;
    try {
      const r = await api('POST', '/sessions/' + encodeURIComponent(id) + '/publish',
        { remote: $('#publish-remote').value.trim() || undefined, pr: $('#publish-pr').checked || undefined });
      out.className = 'published';
      out.replaceChildren('Pushed ', el('code', { text: r.ref }), ' at ', el('code', { text: (r.commit || '').slice(0, 12) }),
        ' to ' + r.remoteUrl + ' (' + r.status + ')');
      const pr = r.pullRequest;
      if (pr) {
        // the forge's answer: only an http(s) address becomes a link
        const link = /^https?:\/\//.test(pr.url || '') ? el('a', { href: pr.url, class: 'pr-link', rel: 'noopener noreferrer', target: '_blank', text: '#' + pr.number })
          : el('span', { class: 'pr-link', text: '#' + pr.number + ' ' + (pr.url || '') });
        out.append('; pull request ', link, pr.created ? ' opened' : ' reused');
      }
    } catch (e) {
      out.className = 'error';
      out.replaceChildren('Publish failed: ' + e.message);
    }
    $('#publish').disabled = false;
    loadPlacement();
  });
  $('#pullback').addEventListener('click', async () => {
    showError($('#chat-error'), null);
    try { await api('POST', '/sessions/' + encodeURIComponent(id) + '/pullback', { busy: busyPolicy() }); } catch (e) { showError($('#chat-error'), e); }
    loadPlacement(); sidebar.soon(100);
  });
  // A lease-CLI profile takes a machine class.
  let profiles = [];
  function showMoveClass(remote) {
    const p = profiles.find((x) => x.id === $('#move-profile').value);
    const show = !remote && !!p && p.provider === 'command';
    $('#move-class').hidden = !show; $('label[for=move-class]').hidden = !show;
  }
  $('#move-profile').addEventListener('change', () => showMoveClass(false));
  apiList('/profiles').then((ps) => {
    profiles = ps;
    $('#move-profile').replaceChildren(...ps.map((p) => el('option', { value: p.id, text: p.id })));
    if (!ps.length) { $('#move').disabled = true; }
    showMoveClass(!$('#move').hidden ? false : true);
  }).catch(() => {});
  // A turn started elsewhere (the CLI, another tab) and each move of the placement show up
  // through the gateway-wide feed.
  const reload = () => load().catch(() => {});
  stream('/events', 0, (c) => {
    if (c.id !== id) return;
    if (c.kind === 'placement.updated') loadPlacement();
    else if (st.running) refreshEntries();
    else reload();
  }, { onGap: reload, onReopen: reload });
  load().catch((e) => showError($('#chat-error'), e));
}

// ---- New session ---------------------------------------------------------------------------

function newPage() {
  let target = { kind: 'gateway' }, created = null, profiles = [];
  const bar = $('#target-bar');
  function choose(btn) {
    for (const b of bar.querySelectorAll('button.target')) b.setAttribute('aria-pressed', String(b === btn));
    target = btn.dataset.kind === 'gateway' ? { kind: 'gateway' } : { kind: 'profile', profileId: btn.dataset.profile };
    const p = profiles.find((x) => x.id === btn.dataset.profile);
    $('#class-field').hidden = !(p && p.provider === 'command');
  }
  bar.addEventListener('click', (ev) => { const b = ev.target.closest('button.target'); if (b) choose(b); });
  api('GET', '/models').then((m) => {
    $('#model').replaceChildren(...m.models.map((x) => el('option', { value: x.ref, text: x.name ? x.name + ' (' + x.ref + ')' : x.ref, selected: x.ref === m.default })));
  }).catch((e) => showError($('#create-error'), e));
  apiList('/profiles').then((ps) => {
    profiles = ps;
    // the bar shows once there is somewhere else to run: without a worker profile, sessions run on the gateway
    bar.hidden = ps.length === 0;
    for (const p of ps) {
      const dev = p.provider === 'local' ? ' (dev only)' : '';
      bar.append(el('button', { type: 'button', class: 'target', 'data-kind': 'profile', 'data-profile': p.id, 'aria-pressed': 'false', text: p.id + dev, title: (p.warnings || []).join('\n') }));
    }
  }).catch(() => {});

  // watch shows the steps of the session's dispatch as the gateway-wide feed announces them
  // (followed from before the first read, so that no step is missed), until it rests.
  let watching = null;
  async function watch(id) {
    if (!watching) {
      const again = () => watch(id).catch((e) => showError($('#create-error'), e));
      watching = stream('/events', 0, (c) => { if (c.id === id && c.kind === 'placement.updated') again(); }, { onGap: again, onReopen: again });
    }
    const v = await api('GET', '/sessions/' + encodeURIComponent(id) + '/placement');
    $('#create-steps').replaceChildren(...(v.events || []).map((e) => el('li', { 'data-to': e.to }, el('strong', { text: e.to }), ' ', e.reason || '')));
    const p = v.placement;
    if (moving.has(p.state)) return;
    if (watching) { watching.close(); watching = null; }
    if (p.state === 'failed') {
      const err = $('#create-error');
      err.replaceChildren(el('p', { text: 'The dispatch failed: ' + (p.error || 'no reason recorded') }),
        el('p', { text: 'Recovery: Retry leases a new worker for this session, or open the session and use it on the gateway after moving it home (openclaw session move ' + id + ' --local).' }));
      $('#retry').hidden = false;
    }
    openLink(id);
  }
  function openLink(id) {
    const a = $('#open-session');
    a.href = '/sessions/' + encodeURIComponent(id);
    a.hidden = false;
  }
  async function dispatch(id) {
    $('#retry').hidden = true;
    showError($('#create-error'), null);
    try {
      await api('POST', '/sessions/' + encodeURIComponent(id) + '/dispatch', { profileId: target.profileId, machineClass: target.machineClass });
    } catch (e) { showError($('#create-error'), e); $('#retry').hidden = false; return; }
    await watch(id);
  }
  $('#retry').addEventListener('click', () => {
    if (created) dispatch(created).catch((e) => showError($('#create-error'), e));
    else $('#new-session').requestSubmit();
  });
  $('#new-session').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError($('#create-error'), null);
    $('#retry').hidden = true;
    $('#create-steps').replaceChildren();
    const body = { title: $('#title').value || undefined, workspace: $('#workspace').value || undefined, model: $('#model').value || undefined, git: $('#git').checked || undefined };
    if (target.kind === 'profile') {
      target.machineClass = $('#machine-class').value || undefined;
      body.target = { kind: 'profile', profileId: target.profileId, machineClass: target.machineClass };
    }
    $('#create').disabled = true;
    try {
      const s = await api('POST', '/sessions', body);
      created = s.id;
      sidebar.soon(50);
      if (target.kind === 'profile') await watch(s.id);
      else location.href = '/sessions/' + encodeURIComponent(s.id);
    } catch (e) {
      // a session that was created but could not be dispatched names itself in the message
      const m = /session (ses_[A-Za-z0-9]+) created/.exec(e.message || '');
      if (m) { created = m[1]; openLink(created); }
      showError($('#create-error'), e);
      $('#retry').hidden = false;
    } finally { $('#create').disabled = false; }
  });
}

// ---- Environments ----------------------------------------------------------------------------

function inferenceText(i) {
  if (!i) return '';
  return i.calls + ' calls · ' + i.totalTokens + ' tokens · $' + (i.cost || 0).toFixed(4) + ' · ' + (i.bytesIn + i.bytesOut) + ' bytes';
}

function environmentsPage() {
  async function load() {
    const all = $('#show-all').checked;
    const list = await apiList('/environments' + (all ? '?all=true' : ''));
    const rows = await Promise.all(list.map(async (e) => {
      let inf = null;
      try { inf = (await api('GET', '/environments/' + encodeURIComponent(e.id) + '/worker')).inference; } catch { /* gone */ }
      return el('tr', { 'data-env': e.id },
        el('th', { scope: 'row' }, el('a', { href: '/environments/' + encodeURIComponent(e.id), text: e.id })),
        el('td', { class: 'state', text: e.state }), el('td', { text: e.profileId }), el('td', { text: e.providerId }),
        el('td', { text: e.leaseId }), el('td', { text: e.tunnelStatus }), el('td', { text: ago(e.ageMs) }), el('td', { text: ago(e.idleMs) }),
        el('td', {}, ...(e.attachedSessionIds || []).map((s) => el('a', { href: '/sessions/' + encodeURIComponent(s), text: s + ' ' }))),
        el('td', { text: inferenceText(inf) }));
    }));
    $('#env-table tbody').replaceChildren(...rows);
    if (!list.length) $('#env-table tbody').append(el('tr', {}, el('td', { colspan: '10', text: 'No environments.' })));
  }
  $('#show-all').addEventListener('change', () => load().catch((e) => showError($('#env-error'), e)));
  load().catch((e) => showError($('#env-error'), e));
  setInterval(() => load().catch(() => {}), 3000);
}

// sheddingText says which capacity limit sheds an environment's load, and since when.
function sheddingText(sh) {
  return 'yes, ' + sh.reason + ' since ' + new Date(sh.since).toLocaleTimeString();
}

function environmentPage(id) {
  const path = '/environments/' + encodeURIComponent(id);
  let timer = null;
  async function load() {
    const [e, evs, w] = await Promise.all([api('GET', path), apiList(path + '/events'), api('GET', path + '/worker').catch(() => null)]);
    const dl = $('#env-detail');
    const pressure = !w ? '' : (w.backpressure ? 'shedding load: ' : 'none: ') + w.queued + ' queued, ' + w.capacityRejections + ' refused for capacity';
    const shedding = w && w.shedding ? sheddingText(w.shedding) : 'no';
    const rows = [['State', e.state], ['Profile', e.profileId], ['Provider', e.providerId], ['Lease', e.leaseId], ['Tunnel', e.tunnelStatus],
      ['Age', ago(e.ageMs)], ['Idle', ago(e.idleMs)], ['Sessions', (e.attachedSessionIds || []).join(', ') || 'none'],
      ['Inference', inferenceText(e.inference)], ['Backpressure', pressure], ['Shedding', shedding], ['Error', e.error || '']];
    if (e.leasedProfileId && e.leasedProfileId !== e.profileId) rows.splice(2, 0, ['Leased from', e.leasedProfileId + ' (fallback)']);
    if (e.setupKey) rows.push(['Setup', 'done (cache key ' + e.setupKey + ')']);
    dl.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { 'data-field': k.toLowerCase(), text: v })]));
    let prev = null;
    $('#timeline').replaceChildren(...evs.map((ev) => {
      const took = prev ? ' (' + ((new Date(ev.at) - new Date(prev)) / 1000).toFixed(1) + ' s)' : '';
      prev = ev.at;
      const step = ev.from === ev.to ? ev.to : ev.from + ' → ' + ev.to;
      const st = ev.step;
      if (st) {
        // a timeline step: its kind and name, result, start and duration, detail and output tail
        const failed = st.result === 'failed';
        const out = st.output ? [el('details', failed ? { open: '' } : {}, el('summary', { text: 'output' }), el('pre', { class: 'output', text: st.output }))] : [];
        return el('li', { class: failed ? 'error' : '', 'data-step': st.kind + ':' + st.name },
          el('strong', { text: st.kind + ' ' + st.name }), ' ', el('span', { 'data-result': st.result, text: st.result }),
          el('span', { class: 'muted', text: ' · ' + new Date(st.startedAt).toLocaleTimeString() + (st.result === 'skipped (cache)' ? '' : ' · ' + (st.durationMs / 1000).toFixed(1) + ' s') }),
          st.detail ? ' ' + st.detail : '', ...out);
      }
      return el('li', { class: /fail|error|refused/i.test(ev.reason || '') ? 'error' : '' }, el('strong', { text: step }), ' ', ev.reason || '', el('span', { class: 'muted', text: took }));
    }));
    const gone = e.state === 'destroyed';
    $('#destroy').hidden = gone;
    $('#force-destroy').hidden = gone || e.state !== 'destroying';
    if (!gone) { clearTimeout(timer); timer = setTimeout(() => load().catch(() => {}), e.state === 'destroying' ? 500 : 2000); }
  }
  $('#destroy').addEventListener('click', () => { $('#confirm-destroy').hidden = false; $('#confirm-destroy').focus(); });
  const destroy = async (force) => {
    $('#confirm-destroy').hidden = true;
    showError($('#env-error'), null);
    try { await api('DELETE', path + (force ? '?force=true' : '')); } catch (e) { showError($('#env-error'), e); }
    load().catch(() => {});
  };
  $('#confirm-destroy').addEventListener('click', () => destroy(false));
  $('#force-destroy').addEventListener('click', () => destroy(true));
  load().catch((e) => showError($('#env-error'), e));
}

// ---- Profiles --------------------------------------------------------------------------------

const profileTemplate = 'id: my-profile\nprovider: static\nsettings:\n  hosts:\n    - host: 198.18.0.10\n      user: worker\n      keyPath: /path/to/private/key\n      hostKey: ssh-ed25519 AAAA… (the host key to pin)\nlifetime: {idleTimeout: 30m, ttl: 24h}\nmaxEnvironments: 1\n';

function profilesPage() {
  async function load() {
    const ps = await apiList('/profiles');
    $('#profile-list').replaceChildren(...ps.map((p) => el('li', { 'data-profile': p.id },
      el('button', { type: 'button', class: 'link', onclick: () => edit(p.id), text: p.id }),
      ' ', el('span', { class: 'muted', text: p.provider + ' · max ' + p.maxEnvironments }),
      ...(p.warnings || []).map((w) => el('p', { class: 'warn', text: 'Warning: ' + w })))));
  }
  async function edit(pid) {
    const y = await api('GET', '/profiles/' + encodeURIComponent(pid), undefined, { headers: { Accept: 'application/yaml' } });
    $('#profile-yaml').value = y;
    $('#profile-yaml').focus();
  }
  $('#profile-yaml').value = profileTemplate;
  $('#profile-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const text = $('#profile-yaml').value;
    const idm = /^id:\s*["']?([^"'\s#]+)/m.exec(text);
    showError($('#profile-error'), null);
    $('#profile-warning').textContent = '';
    $('#profile-status').textContent = '';
    $('#profile-yaml').removeAttribute('aria-invalid');
    if (!idm) { showError($('#profile-error'), { field: 'id', message: 'is required' }); return; }
    try {
      const p = await api('PUT', '/profiles/' + encodeURIComponent(idm[1]), text, { headers: { 'Content-Type': 'application/yaml' } });
      $('#profile-status').textContent = 'Saved profile ' + p.id + '.';
      if (p.warnings && p.warnings.length) $('#profile-warning').textContent = 'Warning: ' + p.warnings.join('; ');
      load();
    } catch (e) {
      $('#profile-yaml').setAttribute('aria-invalid', 'true');
      showError($('#profile-error'), e);
    }
  });
  load().catch((e) => showError($('#profile-error'), e));
}

// ---- One commit's diff ----------------------------------------------------------------------

// usageChart draws spend per day as stacked bars (machines below, model calls above) in inline
// SVG: one bar per day of the window, a title on each part for its exact figure.
function usageChart(days, from, n) {
  const NS = 'http://www.w3.org/2000/svg';
  const svg = (tag, attrs, ...kids) => {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    for (const k of kids) e.append(k);
    return e;
  };
  const byDay = new Map(days.map((d) => [d.key, d]));
  const keys = [];
  for (let i = 0; i < n; i++) {
    const d = new Date(from.getTime() + i * 86400000);
    keys.push(d.toISOString().slice(0, 10));
  }
  // the gateway's days are in its spend.timeZone, which may already be a day ahead of UTC
  for (const d of days) if (d.key > keys[keys.length - 1]) { keys.shift(); keys.push(d.key); }
  const top = Math.max(0.0001, ...keys.map((k) => (byDay.get(k) || {}).usd || 0));
  const W = 720, H = 220, pad = 40, bw = (W - pad) / n;
  const g = svg('svg', { viewBox: `0 0 ${W} ${H + 24}`, role: 'img', 'aria-label': 'Spend per day: machines and model calls' });
  g.append(svg('text', { x: 0, y: 12, class: 'axis' }, usd(top)), svg('text', { x: 0, y: H, class: 'axis' }, '$0'),
    svg('line', { x1: pad, y1: H, x2: W, y2: H, class: 'baseline' }));
  keys.forEach((k, i) => {
    const d = byDay.get(k) || { machineUsd: 0, modelUsd: 0 };
    const x = pad + i * bw + 1, hm = (d.machineUsd / top) * (H - 16), hl = (d.modelUsd / top) * (H - 16);
    g.append(svg('rect', { x, y: H - hm, width: bw - 2, height: hm, class: 'machine', 'data-day': k, 'data-kind': 'machine' },
      svg('title', {}, `${k} machines ${usd(d.machineUsd)}`)));
    g.append(svg('rect', { x, y: H - hm - hl, width: bw - 2, height: hl, class: 'model', 'data-day': k, 'data-kind': 'model' },
      svg('title', {}, `${k} model calls ${usd(d.modelUsd)} (${d.calls || 0} calls)`)));
    if (i % 7 === n % 7 || i === n - 1) g.append(svg('text', { x, y: H + 16, class: 'axis' }, k.slice(5)));
  });
  return g;
}

function usagePage() {
  async function load() {
    const n = 30, from = new Date(Date.now() - (n - 1) * 86400000);
    const since = from.toISOString().slice(0, 10);
    const [days, sessions, budgets] = await Promise.all([
      api('GET', '/usage?by=day&since=' + since), api('GET', '/usage?by=session&since=' + since), api('GET', '/budgets')]);
    $('#usage-chart').replaceChildren(usageChart(days, new Date(since + 'T00:00:00Z'), n));
    const total = days.reduce((a, d) => a + d.usd, 0), machines = days.reduce((a, d) => a + d.machineUsd, 0);
    $('#usage-total').textContent = `${usd(total)} in ${n} days: ${usd(total - machines)} on model calls, ${usd(machines)} on machines.`;
    $('#budgets').replaceChildren(...budgets.map((b) => {
      const share = Math.min(1, b.spentUsd / b.limitUsd);
      const state = b.exceeded ? 'exceeded' : b.warning ? 'warning' : 'ok';
      const scope = b.scope + (b.profile ? ' ' + b.profile : '') + (b.agent ? ' ' + b.agent : '');
      const fill = el('span', { class: 'fill' });
      fill.style.width = (share * 100).toFixed(1) + '%'; // through the CSSOM: the page's CSP allows no inline style
      return el('li', { class: 'budget ' + state, 'data-budget': b.id },
        el('span', { class: 'budget-name', text: `${b.id} (${scope}, ${b.window})` }),
        el('span', { class: 'bar', role: 'meter', 'aria-valuemin': '0', 'aria-valuemax': String(b.limitUsd), 'aria-valuenow': String(b.spentUsd), 'aria-label': b.id }, fill),
        el('span', { class: 'budget-figures', text: `${usd(b.spentUsd)} of ${usd(b.limitUsd)}` + (b.resetAt ? ', resets ' + new Date(b.resetAt).toLocaleString() : '') + (state !== 'ok' ? ' — ' + state : '') }));
    }));
    if (!budgets.length) $('#budgets').append(el('li', { class: 'muted', text: 'No budgets are configured (budgets: in the gateway config).' }));
    $('#usage-sessions tbody').replaceChildren(...sessions.slice(0, 20).map((r) => el('tr', { 'data-session': r.key },
      el('th', { scope: 'row' }, r.key ? el('a', { href: '/sessions/' + encodeURIComponent(r.key), text: r.key }) : '—'),
      el('td', { text: usd(r.usd) }), el('td', { text: usd(r.modelUsd) }), el('td', { text: usd(r.machineUsd) }),
      el('td', { text: String(r.calls) }), el('td', { text: String(r.inputTokens) }), el('td', { text: String(r.outputTokens) }))));
    if (!sessions.length) $('#usage-sessions tbody').append(el('tr', {}, el('td', { colspan: '7', text: 'Nothing spent yet.' })));
  }
  load().catch((e) => showError($('#usage-error'), e));
  setInterval(() => load().catch(() => {}), 10000);
}

async function diffPage(id, commit) {
  try {
    const res = await fetch('/api/v1/sessions/' + encodeURIComponent(id) + '/changes/' + encodeURIComponent(commit), { credentials: 'same-origin' });
    const text = await res.text();
    if (!res.ok) { let e = null; try { e = new APIError(res.status, JSON.parse(text)); } catch { e = new APIError(res.status, null); } throw e; }
    $('#diff').textContent = text;
    $('#diff-cut').hidden = !res.headers.get('X-Truncated');
  } catch (e) { showError($('#diff-error'), e); }
}

// ---- Start -------------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  const page = document.body.dataset.page, id = document.body.dataset.id;
  if (page === 'login') return;
  sidebar.start();
  if (page === 'chat') chatPage(id);
  else if (page === 'new') newPage();
  else if (page === 'environments') environmentsPage();
  else if (page === 'environment') environmentPage(id);
  else if (page === 'profiles') profilesPage();
  else if (page === 'usage') usagePage();
  else if (page === 'diff') diffPage(id, document.body.dataset.commit);
});

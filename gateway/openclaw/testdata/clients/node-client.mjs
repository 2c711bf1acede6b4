// The openclaw-node scenario of the OpenClaw-clients suite (gateway/openclaw, cmd/openclaw
// TestOpenClawClients): connect, list, history, chat() to completion, abort, an unknown method.
// Prints one JSON object of what it saw; the Go test asserts on it. Environment: OPENCLAW_NODE
// (the package's dist/index.mjs), GW_URL, GW_TOKEN, WORKER_KEY, SSHD_KEY (a session on a netns sshd box), GATEWAY_KEY, SLOW_KEY, DISPATCH_DIR
// (a workspace a new session is made in and dispatched from).
const { OpenClawClient } = await import(process.env.OPENCLAW_NODE);
const out = {};
const c = new OpenClawClient({ url: process.env.GW_URL, token: process.env.GW_TOKEN, autoReconnect: false });
await c.connect();
out.connected = c.isConnected;
const list = await c.sessions.list({ limit: 50 });
out.list = list.sessions.map((s) => ({ key: s.key, placement: s.placement?.state, environmentId: s.placement?.environmentId,
  profileId: s.placement?.profileId }));
out.sshdHistory = (await c.sessions.history(process.env.SSHD_KEY, { limit: 200 })).messages.length;
const hist = await c.sessions.history(process.env.WORKER_KEY, { limit: 200 });
out.workerHistory = hist.messages.map((m) => ({
  role: m.role,
  types: Array.isArray(m.content) ? m.content.map((b) => b.type) : ['string'],
}));
const chunks = [];
let text = '';
for await (const ch of c.chat('What does the README say?', { sessionKey: process.env.GATEWAY_KEY })) {
  chunks.push(ch.type);
  if (ch.type === 'text') text += ch.text;
}
out.chat = { chunks, text };
// abort: a turn whose tool sleeps; abort once the tool has started
const abortChunks = [];
const started = Date.now();
for await (const ch of c.chat('Wait for a long time.', { sessionKey: process.env.SLOW_KEY })) {
  abortChunks.push(ch.type);
  if (ch.type === 'tool_use') {
    out.abortResult = await c.chatAbort(process.env.SLOW_KEY);
  }
  if (ch.type === 'error' || ch.type === 'agent_end') break;
}
out.abort = { chunks: abortChunks, ms: Date.now() - started };
// cloud workers: without operator.admin, environments.create is refused; with it, the profile
// catalog, then an environment leased and torn down
try {
  await c.request('environments.create', { profileId: 'local', idempotencyKey: 'node-0' });
  out.envNoAdmin = 'no error';
} catch (e) {
  out.envNoAdmin = String(e.message ?? e);
}
// a device of its own: the first client's device holds a device token for fewer scopes
const admin = new OpenClawClient({ url: process.env.GW_URL, token: process.env.GW_TOKEN, autoReconnect: false,
  scopes: ['operator.read', 'operator.write', 'operator.admin'], deviceIdentityPath: `${process.env.HOME}/admin-device.json` });
await admin.connect();
const req = async (method, params) => {
  try {
    return (await admin.request(method, params)).payload;
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
};
out.profiles = await req('environments.list', { projection: 'profiles' });
const created = await req('environments.create', { profileId: 'local', idempotencyKey: 'node-1' });
const again = await req('environments.create', { profileId: 'local', idempotencyKey: 'node-1' });
out.envCreate = { created, sameId: created.id !== undefined && created.id === again.id };
out.envBadProfile = await req('environments.create', { profileId: 'nope', idempotencyKey: 'node-2' });
out.envDestroy = created.id ? await req('environments.destroy', { environmentId: created.id }) : null;
// placement: a session made in a workspace, dispatched to a worker of profile local (answered
// once active), its attached environment, then reclaimed (answered once home)
const made = await req('sessions.create', { label: 'dispatched from openclaw-node', cwd: process.env.DISPATCH_DIR });
if (made.key) {
  out.dispatch = await req('sessions.dispatch', { key: made.key, profileId: 'local' });
  out.attachment = await req('environments.session.status', { sessionKey: made.key });
  out.reclaim = await req('sessions.reclaim', { key: made.key });
  const envId = out.dispatch.placement?.environmentId;
  if (envId) out.reclaimedEnv = await req('environments.destroy', { environmentId: envId });
  out.dispatchedKey = made.key;
} else {
  out.dispatch = made;
}
// sessions.delete: a session on the gateway goes; one whose work is on a worker is refused
out.deleteGateway = await req('sessions.delete', { key: process.env.GATEWAY_KEY });
out.deleteWorker = await req('sessions.delete', { key: process.env.WORKER_KEY });
out.afterDelete = (await req('sessions.list', {})).sessions.map((s) => s.key);
await admin.disconnect();
try {
  await c.request('no.such.method', {});
  out.unknown = 'no error';
} catch (e) {
  out.unknown = String(e.message ?? e);
}
await c.disconnect();
console.log(JSON.stringify(out));
process.exit(0);

// The drivers' own behaviour against a loopback server that records what it was sent: the exact
// paths and body keys, the error envelope, configuration checks, descriptors and signals.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { ComputeDriver, CredentialGatewayDriver, ConfigurationError, GatewayError, validateConfiguration } from '../index.js';

/** @type {{method: string, url: string, auth: string | undefined, body: any}[]} */
let seen = [];
/** @type {(req: import('node:http').IncomingMessage, body: any) => [number, unknown] | undefined} */
let answer = () => undefined;
/** @type {import('node:http').Server} */
let server;
let baseUrl = '';
let tmp = '';

before(async () => {
  server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      const body = raw === '' ? undefined : JSON.parse(raw);
      seen.push({ method: req.method ?? '', url: req.url ?? '', auth: req.headers.authorization, body });
      const [status, out] = answer(req, body) ?? [200, {}];
      if (status === 302) {
        res.writeHead(302, { location: 'http://127.0.0.1:1/elsewhere' }).end();
        return;
      }
      res.writeHead(status, { 'content-type': 'application/json' }).end(typeof out === 'string' ? out : JSON.stringify(out));
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const addr = /** @type {import('node:net').AddressInfo} */ (server.address());
  baseUrl = `http://127.0.0.1:${addr.port}`;
  tmp = await mkdtemp(join(tmpdir(), 'occ-driver-unit-'));
});

after(async () => {
  await new Promise((resolve) => server.close(() => resolve(undefined)));
  await rm(tmp, { recursive: true, force: true });
});

function reset() {
  seen = [];
  answer = () => undefined;
}

test('configuration: every bad field is named before any call', () => {
  const cases = [
    [null, 'configuration'],
    [{ token: 't' }, 'baseUrl'],
    [{ baseUrl: 'ftp://h', token: 't' }, 'baseUrl'],
    [{ baseUrl: 'http://u:p@h', token: 't' }, 'baseUrl'],
    [{ baseUrl: 'http://h/?q=1', token: 't' }, 'baseUrl'],
    [{ baseUrl: 'http://h' }, 'token'],
    [{ baseUrl: 'http://h', token: 't', tokenFile: '/x' }, 'token'],
    [{ baseUrl: 'http://h', token: 'has space' }, 'token'],
    [{ baseUrl: 'http://h', token: 't', timeoutMs: 0 }, 'timeoutMs'],
    [{ baseUrl: 'http://h', token: 't', timeoutMs: 1.5 }, 'timeoutMs'],
    [{ baseUrl: 'http://h', token: 't', extra: 1 }, 'extra'],
  ];
  for (const [cfg, field] of cases) {
    assert.throws(() => ComputeDriver.validateConfiguration(cfg), (err) => err instanceof ConfigurationError && err.field === field, JSON.stringify(cfg));
    assert.throws(() => new CredentialGatewayDriver(cfg), ConfigurationError);
  }
  assert.deepEqual(validateConfiguration({ baseUrl: 'http://h:1/x/', token: 't' }), { baseUrl: 'http://h:1/x', token: 't', timeoutMs: 30000 });
  assert.equal(ComputeDriver.configurationSchema.type, 'object');
  assert.deepEqual(CredentialGatewayDriver.configurationSchema.required, ['baseUrl']);
});

test('compute methods post their TypeScript parameter names and the bearer token', async () => {
  reset();
  const d = new ComputeDriver({ baseUrl, token: 'tok' });
  const ns = { id: 'ns1', name: 'n', status: 'ready', createdAt: '2026-01-01T00:00:00Z' };
  answer = (req) => (req.url?.endsWith('/ensureNamespace') ? [200, { namespaceId: 'ns1', namespaceReady: true }] : undefined);
  assert.deepEqual(await d.ensureNamespace(ns), { namespaceId: 'ns1', namespaceReady: true });
  assert.equal(await d.stopRevision({ id: 'r1' }), undefined);
  await d.prepareRevision({ id: 'r1' }, { harnessAuth: { method: 'runtime' }, secretEnvironment: [] });
  await d.prepareRevision({ id: 'r2' });
  const signal = new AbortController().signal;
  await d.describeAgentRuntime({ namespace: ns }, signal, { source: 'worker' });
  await d.validateHarnessAuth({ mode: 'embedded' }, { method: 'api_key' }, {});
  await d.describePrepareRevisionFailure(Object.assign(new Error('boom'), { code: 'X' }));
  await d.bindAgent({ namespace: ns, agent: { id: 'a1' } });
  assert.deepEqual(
    seen.map((s) => [s.method, s.url, s.auth, s.body]),
    [
      ['POST', '/occ/v1/compute/ensureNamespace', 'Bearer tok', { namespace: ns }],
      ['POST', '/occ/v1/compute/stopRevision', 'Bearer tok', { revision: { id: 'r1' } }],
      ['POST', '/occ/v1/compute/prepareRevision', 'Bearer tok', { revision: { id: 'r1' }, context: { harnessAuth: { method: 'runtime' }, secretEnvironment: [] } }],
      ['POST', '/occ/v1/compute/prepareRevision', 'Bearer tok', { revision: { id: 'r2' } }],
      ['POST', '/occ/v1/compute/describeAgentRuntime', 'Bearer tok', { binding: { namespace: ns }, options: { source: 'worker' } }],
      ['POST', '/occ/v1/compute/validateHarnessAuth', 'Bearer tok', { harness: { mode: 'embedded' }, auth: { method: 'api_key' }, configuration: {} }],
      ['POST', '/occ/v1/compute/describePrepareRevisionFailure', 'Bearer tok', { error: { name: 'Error', message: 'boom', code: 'X' } }],
      ['POST', '/occ/v1/compute/bindAgent', 'Bearer tok', { namespace: ns, agent: { id: 'a1' } }],
    ],
  );
});

test('results: null endpoint is undefined, preflight without warnings is void', async () => {
  reset();
  const d = new ComputeDriver({ baseUrl, token: 'tok' });
  answer = (req) => {
    if (req.url?.endsWith('/getGatewayEndpoint')) return [200, null];
    if (req.url?.endsWith('/requiresStoppedPredecessors')) return [200, false];
    return [200, {}];
  };
  assert.equal(await d.getGatewayEndpoint({ id: 'r' }), undefined);
  assert.equal(await d.requiresStoppedPredecessors({ id: 'r' }), false);
  assert.equal(await d.preflight(), undefined);
  answer = () => [200, { warnings: [{ code: 'W', message: 'm' }] }];
  assert.deepEqual(await d.preflight(), { warnings: [{ code: 'W', message: 'm' }] });
  assert.deepEqual(seen.at(-1)?.body, {});
});

test('credential contexts are flattened without their signal', async () => {
  reset();
  const d = new CredentialGatewayDriver({ baseUrl, token: 'tok' });
  const signal = new AbortController().signal;
  const ns = { id: 'ns1' };
  const source = { id: 'src1', type: 'anthropic' };
  answer = (req) => (req.url?.endsWith('/registerSource') ? [200, { state: 'ready' }] : [200, [{ sourceId: 'src1', ref: 'r' }]]);
  assert.deepEqual(await d.registerSource({ signal, namespace: ns, source }, { type: 'anthropic', config: {}, secrets: { apiKey: 'k' } }), { state: 'ready' });
  await d.attachForRevision({ signal, namespace: ns, revision: { id: 'r1' }, sources: [source] });
  await d.listSourceTypes({ signal });
  assert.equal(await d.removeSource({ signal, namespace: ns, source }), undefined);
  assert.deepEqual(
    seen.map((s) => [s.url, s.body]),
    [
      ['/occ/v1/credential-gateway/registerSource', { namespace: ns, source, input: { type: 'anthropic', config: {}, secrets: { apiKey: 'k' } } }],
      ['/occ/v1/credential-gateway/attachForRevision', { namespace: ns, revision: { id: 'r1' }, sources: [source] }],
      ['/occ/v1/credential-gateway/listSourceTypes', {}],
      ['/occ/v1/credential-gateway/removeSource', { namespace: ns, source }],
    ],
  );
});

test('the error envelope becomes a GatewayError with code and retryable', async () => {
  reset();
  const d = new ComputeDriver({ baseUrl, token: 'tok' });
  answer = () => [409, { error: { code: 'PROVISIONING_REJECTED', message: 'profile x is not allowed', retryable: false } }];
  await assert.rejects(d.prepareRevision({ id: 'r' }), (err) => {
    assert.ok(err instanceof GatewayError);
    assert.deepEqual([err.code, err.retryable, err.status, err.method, err.message], ['PROVISIONING_REJECTED', false, 409, 'prepareRevision', 'profile x is not allowed']);
    return true;
  });
  answer = () => [503, { error: { code: 'DEPENDENCY_UNAVAILABLE', message: 'later', retryable: true } }];
  await assert.rejects(d.stopRevision({ id: 'r' }), { code: 'DEPENDENCY_UNAVAILABLE', retryable: true, status: 503 });
  answer = () => [502, '<html>bad gateway</html>'];
  await assert.rejects(d.stopRevision({ id: 'r' }), { code: 'HTTP_502', retryable: true });
  answer = () => [200, 'not json'];
  await assert.rejects(d.stopRevision({ id: 'r' }), { code: 'INVALID_RESPONSE' });
  // a redirect is never followed (it would carry the token elsewhere)
  answer = () => [302, ''];
  await assert.rejects(d.stopRevision({ id: 'r' }), { code: 'DEPENDENCY_UNAVAILABLE', retryable: true });
  assert.equal(seen.filter((s) => s.url === '/elsewhere').length, 0);
});

test('an unreachable gateway is a retryable DEPENDENCY_UNAVAILABLE; a caller abort is the abort', async () => {
  const closed = createServer();
  await new Promise((resolve) => closed.listen(0, '127.0.0.1', () => resolve(undefined)));
  const port = /** @type {import('node:net').AddressInfo} */ (closed.address()).port;
  await new Promise((resolve) => closed.close(() => resolve(undefined)));
  const d = new ComputeDriver({ baseUrl: `http://127.0.0.1:${port}`, token: 'tok' });
  await assert.rejects(d.ensureNamespace({ id: 'n' }), { name: 'GatewayError', code: 'DEPENDENCY_UNAVAILABLE', retryable: true, status: 0 });

  const c = new AbortController();
  c.abort(new Error('caller gave up'));
  const cg = new CredentialGatewayDriver({ baseUrl, token: 'tok' });
  await assert.rejects(cg.sourceStatus({ signal: c.signal, namespace: {}, source: {} }), { message: 'caller gave up' });
});

test('tokenFile is read at every call (a rotated token needs no restart)', async () => {
  reset();
  const f = join(tmp, 'occ.token');
  await writeFile(f, 'first\n', { mode: 0o600 });
  const d = new ComputeDriver({ baseUrl, tokenFile: f });
  await d.stopRevision({ id: 'r' });
  await writeFile(f, 'second\n');
  await d.stopRevision({ id: 'r' });
  assert.deepEqual(seen.map((s) => s.auth), ['Bearer first', 'Bearer second']);
});

test('connect keeps only the methods the descriptor lists', async () => {
  reset();
  answer = (req) => {
    if (req.url === '/occ/v1/compute') {
      return [200, { id: 'gw1', capability: 'compute', implementation: 'openclaw-cloudworkers', methods: ['ensureNamespace', 'prepareRevision'], activationOrder: 'afterCommit', runtimeLogging: 'platform' }];
    }
    if (req.url === '/occ/v1/credential-gateway') return [200, { id: 'gw1', capability: 'compute', implementation: 'x', methods: [] }];
    return undefined;
  };
  const d = await ComputeDriver.connect({ baseUrl, token: 'tok' });
  assert.equal(d.id, 'gw1');
  assert.equal(d.activationOrder, 'afterCommit');
  assert.equal(typeof d.ensureNamespace, 'function');
  assert.equal(typeof d.prepareRevision, 'function');
  assert.equal(d.activateRevision, undefined);
  assert.equal(d.getRuntimeImages, undefined);
  // a descriptor of the wrong capability is refused
  await assert.rejects(CredentialGatewayDriver.connect({ baseUrl, token: 'tok' }), { code: 'INVALID_RESPONSE' });
});

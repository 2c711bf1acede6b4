// Both drivers against a real `openclaw gateway` (built from this repository, or OPENCLAW_BIN) on a
// temporary data dir, with the built-in local box: a short walk of the compute lifecycle and of a
// credential source's.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';

import { ComputeDriver, CredentialGatewayDriver, GatewayError } from '../index.js';
import { startGateway } from '../harness/gateway.js';

/** @type {Awaited<ReturnType<typeof startGateway>>} */
let gw;
/** @type {ComputeDriver} */
let compute;
/** @type {CredentialGatewayDriver} */
let credentials;

const namespace = { id: 'ns_js', name: 'team-js', status: 'ready', createdAt: '2026-12-01T00:00:00Z' };
const agent = { id: 'agent_js', namespaceId: 'ns_js' };
const revision = {
  id: 'rev_js',
  namespaceId: 'ns_js',
  agentId: 'agent_js',
  revision: 1,
  backendId: null,
  configurationId: 'cfg_js',
  configurationKind: 'agent',
  configurationGeneration: 1,
  configuration: {},
  harness: { id: 'openclaw', version: '1', mode: 'embedded' },
  compute: { id: 'openclaw-cloudworkers', implementation: 'openclaw-gateway' },
  harnessAuth: { method: 'runtime' },
  servicePrincipalId: 'sp_js',
  createdAt: '2026-12-01T00:00:00Z',
};
const source = { id: 'src_js', namespaceId: 'ns_js', type: 'anthropic' };
const apiKey = 'sk-ant-js-driver-test-0123456789';

before(async () => {
  gw = await startGateway();
  compute = await ComputeDriver.connect({ baseUrl: gw.baseUrl, token: gw.occToken });
  credentials = await CredentialGatewayDriver.connect({ baseUrl: gw.baseUrl, tokenFile: gw.occTokenFile });
});

after(async () => {
  await gw?.stop();
});

test('the descriptors name the drivers and their methods', () => {
  assert.equal(compute.capability, 'compute');
  assert.equal(compute.activationOrder, 'afterCommit');
  for (const m of ['ensureNamespace', 'deleteNamespace', 'bindAgent', 'prepareRevision', 'stopRevision', 'retireRevision']) {
    assert.equal(typeof compute[m], 'function', m);
  }
  assert.equal(credentials.capability, 'credential_gateway');
  for (const m of ['listSourceTypes', 'registerSource', 'sourceStatus', 'removeSource', 'attachForRevision', 'attachmentStatus', 'withdraw']) {
    assert.equal(typeof credentials[m], 'function', m);
  }
});

test('ensureNamespace twice, then bindAgent', async () => {
  for (let i = 0; i < 2; i++) {
    assert.deepEqual(await compute.ensureNamespace(namespace), { namespaceId: 'ns_js', namespaceReady: true });
  }
  assert.equal(await compute.bindAgent({ namespace, agent }), undefined);
});

test('prepareRevision until ready on the local box', async () => {
  let r;
  for (const deadline = Date.now() + 90_000; ; await delay(100)) { // polling, as OCC does
    r = await compute.prepareRevision(revision, { harnessAuth: { method: 'runtime' }, secretEnvironment: [] });
    if (r.ready || r.runtimeFailure) break;
    assert.ok(Date.now() < deadline, `prepareRevision never became ready: ${JSON.stringify(r)}`);
  }
  assert.equal(r.ready, true, JSON.stringify(r));
  assert.deepEqual([r.namespaceId, r.agentId, r.revisionId], ['ns_js', 'agent_js', 'rev_js']);
});

test('an invalid body is a thrown GatewayError naming the field, not retryable', async () => {
  await assert.rejects(compute.prepareRevision({ ...revision, id: '' }), (err) => {
    assert.ok(err instanceof GatewayError);
    assert.equal(err.code, 'INVALID_INPUT');
    assert.equal(err.retryable, false);
    assert.equal(err.status, 400);
    assert.match(err.message, /revision\.id/);
    return true;
  });
  await assert.rejects(credentials.registerSource({ namespace, source }, { type: 'anthropic', config: {}, secrets: {} }), {
    code: 'INVALID_INPUT',
    retryable: false,
    message: /input\.secrets\.apiKey/,
  });
});

test('a credential source: register, status, attach, remove twice', async () => {
  const types = await credentials.listSourceTypes({});
  const anthropic = types.find((t) => t.type === 'anthropic');
  assert.deepEqual(anthropic?.secrets, [{ name: 'apiKey', required: true, description: anthropic?.secrets[0].description }]);
  assert.deepEqual(anthropic?.harnessAuth, { modelProvider: 'anthropic', loginMode: 'api_key' });

  const ctx = { signal: AbortSignal.timeout(30_000), namespace, source };
  assert.deepEqual(await credentials.registerSource(ctx, { type: 'anthropic', config: {}, secrets: { apiKey } }), { state: 'ready' });
  assert.deepEqual(await credentials.sourceStatus(ctx), { state: 'ready' });
  const revCtx = { namespace, revision, sources: [source] };
  const attachments = await credentials.attachForRevision(revCtx);
  assert.equal(attachments.length, 1);
  assert.equal(attachments[0].sourceId, 'src_js');
  assert.doesNotMatch(JSON.stringify(attachments), new RegExp(apiKey));
  assert.deepEqual(await credentials.attachmentStatus(revCtx), [{ sourceId: 'src_js', state: 'ready' }]);

  assert.equal(await credentials.removeSource(ctx), undefined);
  assert.equal(await credentials.removeSource(ctx), undefined);
  assert.deepEqual(await credentials.sourceStatus(ctx), { state: 'absent' });
  assert.doesNotMatch(gw.log(), new RegExp(apiKey));
});

test('retireRevision, then the empty namespace is deleted', async () => {
  assert.equal(await compute.retireRevision(revision), undefined);
  assert.equal(await compute.retireRevision(revision), undefined);
  const res = await compute.deleteNamespace(namespace);
  assert.equal(res.namespaceDeleted, true, JSON.stringify(res));
});

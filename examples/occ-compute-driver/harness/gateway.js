// @ts-check
// Starts a real `openclaw gateway` for the tests: the binary from OPENCLAW_BIN or built from this
// repository, a temporary data dir, a loopback port; stop() destroys what it leased, stops it and
// removes every temporary directory.
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { setTimeout as delay } from 'node:timers/promises';

const run = promisify(execFile);
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** A config for fast tests: quick worker heartbeats; OCC namespaces run on the built-in local box. */
const defaultConfig = `tunnel: {keepaliveInterval: 200ms, keepaliveTimeout: 1s, backoffMax: 500ms}
worker: {heartbeatTimeout: 1500ms, relaunchGrace: 1s, admitTimeout: 30s}
occ: {defaultProfile: local}
`;

async function freePort() {
  const srv = createServer();
  await new Promise((ok) => srv.listen(0, '127.0.0.1', () => ok(undefined)));
  const port = /** @type {import('node:net').AddressInfo} */ (srv.address()).port;
  await new Promise((ok) => srv.close(() => ok(undefined)));
  return port;
}

/**
 * @param {string} dir
 * @returns {AsyncGenerator<string>}
 */
async function* files(dir) {
  let entries;
  try {
    entries = await readdir(dir, { withFileTypes: true });
  } catch {
    return;
  }
  for (const e of entries) {
    const p = join(dir, e.name);
    if (e.isDirectory()) yield* files(p);
    else yield p;
  }
}

/**
 * @param {{config?: string}} [options]
 */
export async function startGateway(options = {}) {
  const tmp = await mkdtemp(join(tmpdir(), 'occ-driver-'));
  /** @type {import('node:child_process').ChildProcess | undefined} */
  let child;
  const killOnExit = () => child?.kill('SIGKILL');
  process.once('exit', killOnExit);
  let log = '';
  try {
    let bin = process.env.OPENCLAW_BIN ?? '';
    if (bin === '') {
      bin = join(tmp, 'openclaw');
      await run('go', ['build', '-o', bin, './cmd/openclaw'], { cwd: repoRoot, timeout: 600_000 });
    }
    const dataDir = join(tmp, 'data');
    const cfgPath = join(tmp, 'config.yaml');
    await writeFile(cfgPath, options.config ?? defaultConfig, { mode: 0o600 });
    const addr = `127.0.0.1:${await freePort()}`;
    child = spawn(bin, ['gateway', '--data-dir', dataDir, '--listen', addr, '--config', cfgPath, '--log-level', 'debug', '--dev-local-box'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise((ok) => child?.once('exit', (code, signal) => ok({ code, signal })));
    child.stdout?.on('data', (b) => (log += b));
    child.stderr?.on('data', (b) => (log += b));
    const baseUrl = `http://${addr}`;
    for (const deadline = Date.now() + 30_000; ; await delay(20)) { // polling for readiness
      if (child.exitCode !== null) throw new Error(`the gateway exited (${child.exitCode}):\n${log}`);
      const ok = await fetch(`${baseUrl}/readyz`).then((r) => r.ok, () => false);
      if (ok) break;
      if (Date.now() > deadline) throw new Error(`the gateway did not become ready:\n${log}`);
    }
    const occToken = (await readFile(join(dataDir, 'occ.token'), 'utf8')).trim();
    const operatorToken = (await readFile(join(dataDir, 'gateway.token'), 'utf8')).trim();
    const gw = child;
    return {
      baseUrl,
      dataDir,
      occToken,
      occTokenFile: join(dataDir, 'occ.token'),
      log: () => log,
      async stop() {
        try {
          await destroyAll(baseUrl, operatorToken);
        } finally {
          gw.kill('SIGTERM');
          const timer = setTimeout(() => gw.kill('SIGKILL'), 20_000);
          await exited;
          clearTimeout(timer);
          await killWorkers(dataDir);
          process.removeListener('exit', killOnExit);
          await rm(tmp, { recursive: true, force: true });
        }
      },
    };
  } catch (err) {
    child?.kill('SIGKILL');
    process.removeListener('exit', killOnExit);
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
}

/**
 * Destroys every live environment (forced, waiting for proof of teardown) through the operator API.
 * @param {string} baseUrl
 * @param {string} token
 */
async function destroyAll(baseUrl, token) {
  const headers = { authorization: `Bearer ${token}` };
  const res = await fetch(`${baseUrl}/api/v1/environments`, { headers });
  if (!res.ok) return;
  const list = /** @type {{id: string, state: string}[]} */ (await res.json());
  for (const e of list) {
    if (e.state === 'destroyed') continue;
    await fetch(`${baseUrl}/api/v1/environments/${encodeURIComponent(e.id)}?force=true&wait=30s`, { method: 'DELETE', headers });
  }
}

/**
 * Kills any local-box worker still running from this data dir (a worker outlives a gateway).
 * @param {string} dataDir
 */
async function killWorkers(dataDir) {
  for await (const f of files(dataDir)) {
    if (!f.endsWith('/worker.pid')) continue;
    const pid = Number.parseInt((await readFile(f, 'utf8').catch(() => '')).trim(), 10);
    if (Number.isInteger(pid) && pid > 1) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}

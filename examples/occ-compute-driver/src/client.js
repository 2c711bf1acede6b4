// @ts-check
// The HTTP transport both drivers share: configuration, one bounded JSON call, the error envelope.
import { readFile } from 'node:fs/promises';

/** The largest answer read from the gateway (readAgentRuntimeLogs is at most 512 KiB of lines). */
export const MAX_RESPONSE_BYTES = 4 << 20;

/** The default deadline of one call. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/** The longest deadline a configuration may set. */
export const MAX_TIMEOUT_MS = 600_000;

/**
 * The JSON Schema of a driver's configuration: where the gateway is and the OCC bearer token
 * (`<data-dir>/occ.token`), inline or as a file read at every call so that
 * `openclaw occ token --rotate` needs no restart.
 */
export const configurationSchema = Object.freeze({
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  type: 'object',
  additionalProperties: false,
  required: ['baseUrl'],
  oneOf: [{ required: ['token'] }, { required: ['tokenFile'] }],
  properties: {
    baseUrl: {
      type: 'string',
      description: 'http(s) address of the gateway, e.g. http://127.0.0.1:7420; /occ/v1/… is appended',
    },
    token: { type: 'string', minLength: 1, description: 'the OCC bearer token (the content of <data-dir>/occ.token)' },
    tokenFile: { type: 'string', minLength: 1, description: 'path of a file holding the OCC bearer token' },
    timeoutMs: {
      type: 'integer',
      minimum: 1,
      maximum: MAX_TIMEOUT_MS,
      default: DEFAULT_TIMEOUT_MS,
      description: 'deadline of one call',
    },
  },
});

/** A configuration that names its bad field. */
export class ConfigurationError extends TypeError {
  /**
   * @param {string} field
   * @param {string} message
   */
  constructor(field, message) {
    super(`${field}: ${message}`);
    this.name = 'ConfigurationError';
    this.field = field;
  }
}

const tokenPattern = /^[\x21-\x7e]+$/;

/**
 * Checks a configuration against configurationSchema and returns it normalized (baseUrl without
 * a trailing slash, timeoutMs filled). Throws a ConfigurationError naming the first bad field.
 * @param {unknown} config
 * @returns {import('../index.js').DriverConfiguration}
 */
export function validateConfiguration(config) {
  if (config === null || typeof config !== 'object' || Array.isArray(config)) {
    throw new ConfigurationError('configuration', 'must be an object');
  }
  const c = /** @type {Record<string, unknown>} */ (config);
  for (const k of Object.keys(c)) {
    if (!(k in configurationSchema.properties)) throw new ConfigurationError(k, 'is not a configuration field');
  }
  if (typeof c.baseUrl !== 'string' || c.baseUrl === '') throw new ConfigurationError('baseUrl', 'is required (a string)');
  let u;
  try {
    u = new URL(c.baseUrl);
  } catch {
    throw new ConfigurationError('baseUrl', 'is not a URL');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new ConfigurationError('baseUrl', 'must be http or https');
  if (u.username || u.password) throw new ConfigurationError('baseUrl', 'must not carry credentials (use token)');
  if (u.search || u.hash) throw new ConfigurationError('baseUrl', 'must not have a query or fragment');
  if ((c.token === undefined) === (c.tokenFile === undefined)) {
    throw new ConfigurationError('token', 'exactly one of token and tokenFile is required');
  }
  if (c.token !== undefined && (typeof c.token !== 'string' || !tokenPattern.test(c.token))) {
    throw new ConfigurationError('token', 'must be a non-empty string of printable characters');
  }
  if (c.tokenFile !== undefined && (typeof c.tokenFile !== 'string' || c.tokenFile === '')) {
    throw new ConfigurationError('tokenFile', 'must be a non-empty path');
  }
  const timeoutMs = c.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (typeof timeoutMs !== 'number' || !Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMEOUT_MS) {
    throw new ConfigurationError('timeoutMs', `must be an integer from 1 to ${MAX_TIMEOUT_MS}`);
  }
  /** @type {import('../index.js').DriverConfiguration} */
  const out = { baseUrl: u.href.replace(/\/+$/, ''), timeoutMs };
  if (c.token !== undefined) out.token = /** @type {string} */ (c.token);
  if (c.tokenFile !== undefined) out.tokenFile = /** @type {string} */ (c.tokenFile);
  return out;
}

/**
 * A failed gateway call: the gateway's `{"error": {"code", "message", "retryable"}}`, or a
 * transport failure (code DEPENDENCY_UNAVAILABLE, retryable).
 */
export class GatewayError extends Error {
  /**
   * @param {string} message
   * @param {{code: string, retryable: boolean, status?: number, method?: string}} fields
   */
  constructor(message, { code, retryable, status = 0, method = '' }) {
    super(message);
    this.name = 'GatewayError';
    /** The gateway's stable error code (INVALID_INPUT, PROVISIONING_REJECTED, …). */
    this.code = code;
    /** Whether repeating the same call may succeed. */
    this.retryable = retryable;
    /** The HTTP status (0 when no answer arrived). */
    this.status = status;
    /** The driver method that failed. */
    this.method = method;
  }
}

/** JSON.stringify replacer: an Error becomes its name, message and code (never its stack). */
function replacer(_key, /** @type {unknown} */ value) {
  if (value instanceof Error) {
    /** @type {Record<string, unknown>} */
    const e = { name: value.name, message: value.message };
    const code = /** @type {{code?: unknown}} */ (value).code;
    if (typeof code === 'string') e.code = code;
    return e;
  }
  return value;
}

/**
 * @param {AbortSignal | undefined} caller
 * @param {number} ms
 */
function deadline(caller, ms) {
  const timeout = AbortSignal.timeout(ms);
  return caller ? AbortSignal.any([caller, timeout]) : timeout;
}

/**
 * @param {Response} res
 * @returns {Promise<string>}
 */
async function readBounded(res) {
  if (!res.body) return '';
  const reader = res.body.getReader();
  const chunks = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.byteLength;
    if (n > MAX_RESPONSE_BYTES) {
      await reader.cancel();
      throw new GatewayError(`the answer is larger than ${MAX_RESPONSE_BYTES} bytes`, { code: 'INVALID_RESPONSE', retryable: false, status: res.status });
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** One gateway: the configured address and token, and the one way a call is made. */
export class Client {
  /** @param {unknown} config */
  constructor(config) {
    this.config = validateConfiguration(config);
  }

  async token() {
    if (this.config.token !== undefined) return this.config.token;
    let t;
    try {
      t = (await readFile(/** @type {string} */ (this.config.tokenFile), 'utf8')).trim();
    } catch (err) {
      const code = /** @type {{code?: string}} */ (err).code ?? 'error';
      throw new GatewayError(`read tokenFile: ${code}`, { code: 'DEPENDENCY_UNAVAILABLE', retryable: true });
    }
    if (!tokenPattern.test(t)) throw new GatewayError('tokenFile holds no token', { code: 'DEPENDENCY_UNAVAILABLE', retryable: true });
    return t;
  }

  /**
   * Calls the gateway and returns the decoded answer, or throws a GatewayError (or the caller's
   * abort reason when its signal ended the call).
   * @param {'GET' | 'POST'} httpMethod
   * @param {string} path below /occ/v1/
   * @param {object | undefined} body
   * @param {AbortSignal | undefined} signal
   * @param {string} method the driver method, for errors
   * @returns {Promise<unknown>}
   */
  async call(httpMethod, path, body, signal, method) {
    signal?.throwIfAborted();
    const headers = { authorization: `Bearer ${await this.token()}`, accept: 'application/json' };
    /** @type {RequestInit} */
    const init = { method: httpMethod, headers, redirect: 'error', signal: deadline(signal, this.config.timeoutMs) };
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body, replacer);
    }
    let res, text;
    try {
      res = await fetch(`${this.config.baseUrl}/occ/v1/${path}`, init);
      text = await readBounded(res);
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (err instanceof GatewayError) throw Object.assign(err, { method });
      const name = /** @type {{name?: string}} */ (err).name;
      const why = name === 'TimeoutError' ? `no answer within ${this.config.timeoutMs} ms` : transportCause(err);
      throw new GatewayError(`${method}: gateway unreachable: ${why}`, { code: 'DEPENDENCY_UNAVAILABLE', retryable: true, method });
    }
    let decoded;
    try {
      decoded = text === '' ? undefined : JSON.parse(text);
    } catch {
      decoded = undefined;
    }
    if (!res.ok) throw errorFrom(res.status, decoded, method);
    if (decoded === undefined) {
      throw new GatewayError(`${method}: the gateway answered ${res.status} without a JSON body`, { code: 'INVALID_RESPONSE', retryable: true, status: res.status, method });
    }
    return decoded;
  }
}

/** @param {unknown} err */
function transportCause(err) {
  const cause = /** @type {{cause?: {code?: unknown}}} */ (err).cause;
  if (cause && typeof cause.code === 'string') return cause.code;
  return /** @type {{message?: string}} */ (err).message ?? 'error';
}

/**
 * @param {number} status
 * @param {unknown} body
 * @param {string} method
 */
function errorFrom(status, body, method) {
  const e = /** @type {{error?: {code?: unknown, message?: unknown, retryable?: unknown}}} */ (body)?.error;
  if (e && typeof e.code === 'string' && typeof e.message === 'string') {
    return new GatewayError(e.message, { code: e.code, retryable: e.retryable === true, status, method });
  }
  return new GatewayError(`${method}: the gateway answered HTTP ${status}`, {
    code: `HTTP_${status}`,
    retryable: status === 429 || status >= 500,
    status,
    method,
  });
}

/**
 * Builds a method's body from its arguments: each argument under its TypeScript parameter name; an
 * AbortSignal argument is the call's signal, not a body key; undefined arguments are left out.
 * @param {readonly string[]} params parameter names ('' marks a signal position, '...' an object
 *   parameter whose keys are spread into the body)
 * @param {unknown[]} args
 */
export function positionalBody(params, args) {
  /** @type {Record<string, unknown>} */
  const body = {};
  /** @type {AbortSignal | undefined} */
  let signal;
  params.forEach((name, i) => {
    const v = args[i];
    if (v instanceof AbortSignal) signal = v;
    else if (name === '...' && v !== null && typeof v === 'object') Object.assign(body, v);
    else if (name !== '' && name !== '...' && v !== undefined) body[name] = v;
  });
  return { body, signal };
}

/**
 * Flattens a context object (`{signal, namespace, source, …}`) into a body without its signal.
 * @param {unknown} ctx
 * @param {string} method
 */
export function flatBody(ctx, method) {
  if (ctx === null || typeof ctx !== 'object' || Array.isArray(ctx)) {
    throw new GatewayError(`${method}: context must be an object`, { code: 'INVALID_INPUT', retryable: false, method });
  }
  const { signal, ...rest } = /** @type {Record<string, unknown>} */ (ctx);
  return { body: rest, signal: signal instanceof AbortSignal ? signal : undefined };
}

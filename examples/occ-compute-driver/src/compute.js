// @ts-check
// The ComputeDriver: every method is one POST /occ/v1/compute/{method} whose body keys are the
// method's TypeScript parameter names.
import { Client, GatewayError, configurationSchema, positionalBody, validateConfiguration } from './client.js';

/**
 * How each method's answer becomes its result: 'value' as is, 'void' nothing, 'optional' null →
 * undefined, 'preflight' nothing unless there are warnings.
 * @typedef {'value' | 'void' | 'optional' | 'preflight'} ResultKind
 */

/**
 * The methods of the OCC ComputeDriver contract this package can call, with their parameter names
 * in TypeScript order ('' is an AbortSignal position, never sent; '...' a destructured object
 * parameter, `bindAgent({ namespace, agent })`, whose keys are the body's).
 * @type {Readonly<Record<string, {params: readonly string[], result: ResultKind}>>}
 */
export const computeMethods = Object.freeze({
  ensureNamespace: { params: ['namespace'], result: 'value' },
  deleteNamespace: { params: ['namespace'], result: 'value' },
  bindAgent: { params: ['...'], result: 'void' },
  prepareRevision: { params: ['revision', 'context'], result: 'value' },
  activateRevision: { params: ['revision', 'context'], result: 'void' },
  deactivateRevision: { params: ['revision'], result: 'void' },
  stopRevision: { params: ['revision'], result: 'void' },
  retireRevision: { params: ['revision'], result: 'void' },
  requiresStoppedPredecessors: { params: ['revision'], result: 'value' },
  preflight: { params: [], result: 'preflight' },
  validateHarnessAuth: { params: ['harness', 'auth', 'configuration', 'secretBindings', 'credentialSourceType'], result: 'void' },
  validateConfiguration: { params: ['configuration'], result: 'void' },
  getGatewayEndpoint: { params: ['revision'], result: 'optional' },
  diagnoseAgentDeployment: { params: ['binding'], result: 'value' },
  describeAgentRuntime: { params: ['binding', '', 'options'], result: 'value' },
  readAgentRuntimeLogs: { params: ['binding', 'request'], result: 'value' },
  describePrepareRevisionFailure: { params: ['error'], result: 'optional' },
  getRuntimeImages: { params: ['revision'], result: 'value' },
});

/**
 * @param {ResultKind} kind
 * @param {unknown} v
 */
export function shapeResult(kind, v) {
  switch (kind) {
    case 'void':
      return undefined;
    case 'optional':
      return v === null ? undefined : v;
    case 'preflight': {
      const w = /** @type {{warnings?: unknown[]}} */ (v)?.warnings;
      return Array.isArray(w) && w.length > 0 ? { warnings: w } : undefined;
    }
    default:
      return v;
  }
}

/**
 * Checks a descriptor the gateway answered for `capability`.
 * @param {unknown} d
 * @param {string} capability
 * @returns {{id: string, capability: string, implementation: string, methods: string[]} & Record<string, unknown>}
 */
export function checkDescriptor(d, capability) {
  const o = /** @type {Record<string, unknown>} */ (d);
  const bad = (/** @type {string} */ why) =>
    new GatewayError(`the gateway's ${capability} descriptor: ${why}`, { code: 'INVALID_RESPONSE', retryable: false, method: 'describe' });
  if (o === null || typeof o !== 'object' || Array.isArray(o)) throw bad('is not an object');
  if (o.capability !== capability) throw bad(`capability is ${JSON.stringify(o.capability)}`);
  if (typeof o.id !== 'string' || o.id === '') throw bad('id is missing');
  if (typeof o.implementation !== 'string') throw bad('implementation is missing');
  if (!Array.isArray(o.methods) || !o.methods.every((m) => typeof m === 'string')) throw bad('methods is not a list of names');
  return /** @type {any} */ (o);
}

/**
 * Hides the methods of `table` the descriptor does not list (OCC detects optional methods by
 * their presence) and copies the descriptor's identity and declarations.
 * @param {object} driver
 * @param {Readonly<Record<string, unknown>>} table
 * @param {{methods: string[]} & Record<string, unknown>} descriptor
 * @param {readonly string[]} declarations
 */
export function applyDescriptor(driver, table, descriptor, declarations) {
  const d = /** @type {Record<string, unknown>} */ (driver);
  d.id = descriptor.id;
  d.implementation = descriptor.implementation;
  for (const k of declarations) {
    if (descriptor[k] !== undefined && descriptor[k] !== null) d[k] = descriptor[k];
  }
  const listed = new Set(descriptor.methods);
  for (const name of Object.keys(table)) {
    if (!listed.has(name)) Object.defineProperty(driver, name, { value: undefined, enumerable: false });
  }
}

const declarations = ['activationOrder', 'maintenanceIntervalMs', 'runtimeLogging', 'requiresAgentRuntimeCredentials', 'supportsWorkspaceSetup'];

/**
 * An OCC ComputeDriver backed by an OpenClaw cloud-worker gateway. Construct it with a
 * configuration (see configurationSchema); `ComputeDriver.connect` also reads the gateway's
 * descriptor so that only the methods the gateway implements are present.
 */
export class ComputeDriver {
  static configurationSchema = configurationSchema;

  /**
   * Checks a driver configuration; throws a ConfigurationError naming the bad field.
   * (The instance method of the same name is the contract's admission check, run by the gateway.)
   * @param {unknown} config
   */
  static validateConfiguration(config) {
    return validateConfiguration(config);
  }

  /**
   * Builds a driver from the gateway's descriptor (GET /occ/v1/compute).
   * @param {unknown} config
   * @param {{signal?: AbortSignal}} [options]
   */
  static async connect(config, options = {}) {
    const client = new Client(config);
    const d = checkDescriptor(await client.call('GET', 'compute', undefined, options.signal, 'describe'), 'compute');
    return new ComputeDriver(config, d);
  }

  /**
   * @param {unknown} config
   * @param {{methods: string[]} & Record<string, unknown>} [descriptor]
   */
  constructor(config, descriptor) {
    this.client = new Client(config);
    /** @type {string} */
    this.id = 'openclaw-cloudworkers';
    /** @type {'compute'} */
    this.capability = 'compute';
    /** @type {string} */
    this.implementation = 'openclaw-cloudworkers';
    if (descriptor) applyDescriptor(this, computeMethods, descriptor, declarations);
  }

  /** The gateway's descriptor (GET /occ/v1/compute). */
  async describe(/** @type {{signal?: AbortSignal}} */ options = {}) {
    return checkDescriptor(await this.client.call('GET', 'compute', undefined, options.signal, 'describe'), 'compute');
  }

  /**
   * Calls one method by name with its positional arguments.
   * @param {string} method
   * @param {unknown[]} args
   */
  async invoke(method, args) {
    const m = computeMethods[method];
    if (!m) throw new GatewayError(`${method} is not a ComputeDriver method`, { code: 'UNKNOWN_METHOD', retryable: false, method });
    const { body, signal } = positionalBody(m.params, args);
    return shapeResult(m.result, await this.client.call('POST', `compute/${method}`, body, signal, method));
  }
}

for (const name of Object.keys(computeMethods)) {
  Object.defineProperty(ComputeDriver.prototype, name, {
    value: /** @this {ComputeDriver} */ function (/** @type {unknown[]} */ ...args) {
      return this.invoke(name, args);
    },
    writable: true,
    configurable: true,
  });
}

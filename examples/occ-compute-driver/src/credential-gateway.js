// @ts-check
// The CredentialGatewayDriver: every method is one POST /occ/v1/credential-gateway/{method} whose
// body is the method's context flattened (without its signal), plus `input` where the method has one.
import { Client, GatewayError, configurationSchema, flatBody, validateConfiguration } from './client.js';
import { applyDescriptor, checkDescriptor } from './compute.js';

/**
 * The methods of the contract: whether each takes an input after its context, and whether its
 * answer is returned ('value') or dropped ('void').
 * @type {Readonly<Record<string, {input: boolean, result: 'value' | 'void'}>>}
 */
export const credentialGatewayMethods = Object.freeze({
  listSourceTypes: { input: false, result: 'value' },
  registerSource: { input: true, result: 'value' },
  updateSource: { input: true, result: 'value' },
  rotateSource: { input: false, result: 'value' },
  sourceStatus: { input: false, result: 'value' },
  removeSource: { input: false, result: 'void' },
  attachForRevision: { input: false, result: 'value' },
  attachmentStatus: { input: false, result: 'value' },
  withdraw: { input: false, result: 'value' },
});

/**
 * An OCC CredentialGatewayDriver backed by an OpenClaw cloud-worker gateway: the gateway keeps the
 * values (encrypted) and its inference proxy applies them to the revision's model calls, so the
 * agent's box never holds them.
 */
export class CredentialGatewayDriver {
  static configurationSchema = configurationSchema;

  /**
   * Checks a driver configuration; throws a ConfigurationError naming the bad field.
   * @param {unknown} config
   */
  static validateConfiguration(config) {
    return validateConfiguration(config);
  }

  /**
   * Builds a driver from the gateway's descriptor (GET /occ/v1/credential-gateway).
   * @param {unknown} config
   * @param {{signal?: AbortSignal}} [options]
   */
  static async connect(config, options = {}) {
    const client = new Client(config);
    const d = checkDescriptor(await client.call('GET', 'credential-gateway', undefined, options.signal, 'describe'), 'credential_gateway');
    return new CredentialGatewayDriver(config, d);
  }

  /**
   * @param {unknown} config
   * @param {{methods: string[]} & Record<string, unknown>} [descriptor]
   */
  constructor(config, descriptor) {
    this.client = new Client(config);
    /** @type {string} */
    this.id = 'openclaw-cloudworkers';
    /** @type {'credential_gateway'} */
    this.capability = 'credential_gateway';
    /** @type {string} */
    this.implementation = 'openclaw-cloudworkers';
    if (descriptor) applyDescriptor(this, credentialGatewayMethods, descriptor, []);
  }

  /** The gateway's descriptor (GET /occ/v1/credential-gateway). */
  async describe(/** @type {{signal?: AbortSignal}} */ options = {}) {
    return checkDescriptor(await this.client.call('GET', 'credential-gateway', undefined, options.signal, 'describe'), 'credential_gateway');
  }

  /**
   * Calls one method by name: its context flattened into the body, its input under `input`.
   * @param {string} method
   * @param {unknown} ctx
   * @param {unknown} [input]
   */
  async invoke(method, ctx, input) {
    const m = credentialGatewayMethods[method];
    if (!m) throw new GatewayError(`${method} is not a CredentialGatewayDriver method`, { code: 'UNKNOWN_METHOD', retryable: false, method });
    const { body, signal } = flatBody(ctx ?? {}, method);
    if (m.input && input !== undefined) body.input = input;
    const out = await this.client.call('POST', `credential-gateway/${method}`, body, signal, method);
    return m.result === 'void' ? undefined : out;
  }
}

for (const name of Object.keys(credentialGatewayMethods)) {
  Object.defineProperty(CredentialGatewayDriver.prototype, name, {
    value: /** @this {CredentialGatewayDriver} */ function (/** @type {unknown} */ ctx, /** @type {unknown} */ input) {
      return this.invoke(name, ctx, input);
    },
    writable: true,
    configurable: true,
  });
}

// @ts-check
// OCC drivers backed by an OpenClaw cloud-worker gateway's /occ/v1 HTTP API. Types: index.d.ts.
export { ComputeDriver, computeMethods } from './src/compute.js';
export { CredentialGatewayDriver, credentialGatewayMethods } from './src/credential-gateway.js';
export { ConfigurationError, GatewayError, configurationSchema, validateConfiguration } from './src/client.js';

import { ComputeDriver } from './src/compute.js';
import { CredentialGatewayDriver } from './src/credential-gateway.js';

/**
 * The ComputeDriver of the gateway, with exactly the methods its descriptor lists.
 * @param {unknown} config
 * @param {{signal?: AbortSignal}} [options]
 */
export function createComputeDriver(config, options) {
  return ComputeDriver.connect(config, options);
}

/**
 * The CredentialGatewayDriver of the gateway, with exactly the methods its descriptor lists.
 * @param {unknown} config
 * @param {{signal?: AbortSignal}} [options]
 */
export function createCredentialGatewayDriver(config, options) {
  return CredentialGatewayDriver.connect(config, options);
}

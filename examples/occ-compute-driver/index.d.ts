// Types of @openclaw/occ-compute-driver. Field names are those of OCC's contracts package
// (packages/contracts/src/index.ts); the gateway's /occ/v1 bodies use the same names.

// ---- configuration ---------------------------------------------------------------------------

export interface DriverConfiguration {
  /** http(s) address of the gateway; /occ/v1/… is appended. */
  baseUrl: string;
  /** The OCC bearer token (<data-dir>/occ.token). Exactly one of token and tokenFile. */
  token?: string;
  /** A file holding the token, read at every call (rotation needs no restart). */
  tokenFile?: string;
  /** Deadline of one call, 1…600000 ms (default 30000). */
  timeoutMs?: number;
}

export declare const configurationSchema: Readonly<Record<string, unknown>>;
/** Returns the configuration normalized, or throws a ConfigurationError naming the field. */
export declare function validateConfiguration(config: unknown): DriverConfiguration;

export declare class ConfigurationError extends TypeError {
  readonly field: string;
}

/** A failed call: the gateway's {"error": {code, message, retryable}} or a transport failure. */
export declare class GatewayError extends Error {
  readonly code: string;
  readonly retryable: boolean;
  /** HTTP status; 0 when no answer arrived. */
  readonly status: number;
  readonly method: string;
}

// ---- shared ----------------------------------------------------------------------------------

export interface Namespace {
  id: string;
  name: string;
  existingNamespace?: string;
  status: 'provisioning' | 'ready' | 'failed' | 'deleting';
  createdAt: string;
}

export interface NamespaceEnsureResult {
  namespaceId: string;
  namespaceReady: boolean;
  failure?: 'retryable' | 'permanent';
  /** At most 256 characters of letters, digits, spaces and . _ : / @ - */
  reason?: string;
}

export interface NamespaceDeleteResult {
  namespaceId: string;
  namespaceDeleted: boolean;
  failure?: 'retryable' | 'permanent';
}

export interface CredentialSourceRef {
  sourceId: string;
  credentialGatewayId: string;
  sourceType: string;
}

export interface AgentRevision {
  id: string;
  namespaceId: string;
  agentId: string;
  revision: number;
  backendId: string | null;
  configurationId: string;
  configurationKind: 'agent';
  configurationGeneration: number;
  configuration: Record<string, unknown>;
  harness: { id: string; version: string; mode: 'embedded' | 'dedicated' };
  compute: { id: string; implementation: string };
  sandboxDriverId?: string;
  secretDriverId?: string;
  secretBindings?: unknown[];
  plugins?: unknown[];
  repositoryCredentials?: unknown[];
  harnessAuth: Record<string, unknown>;
  credentialSources?: CredentialSourceRef[];
  servicePrincipalId: string;
  createdAt: string;
}

export interface Agent {
  id: string;
  namespaceId?: string;
  [k: string]: unknown;
}

export interface ComputeAgentBinding {
  namespace: Namespace;
  agent: Agent;
}

export interface ComputeAgentRevisionBinding extends ComputeAgentBinding {
  revision: AgentRevision;
}

export interface ComputeRevisionContext {
  workspaceSetup?: unknown;
  harnessAuth: Record<string, unknown>;
  credentialSources?: CredentialSourceRef[];
  secretEnvironment: { name: string; secretId: string; namespaceId: string; agentId: string; backendRef: string }[];
  repositoryCredentials?: unknown[];
}

export interface ComputeReadiness {
  namespaceId: string;
  agentId: string;
  revisionId: string;
  ready: boolean;
  warnings?: { code: 'PLUGIN_INSTALL_FAILED' | 'PLUGIN_AUTH_REQUIRED'; pluginId: string }[];
  runtimeFailure?: {
    component: string;
    check: string;
    checkedAt: string;
    code: string;
    cause?: { kind: 'PROCESS_EXIT' | 'PROBE_STATUS' | 'INVALID_OUTPUT' | 'WRAPPER_ERROR'; detail?: string };
  };
  pendingReason?: 'WORKLOAD_UNSCHEDULABLE' | 'WORKSPACE_NODE_PENDING';
}

export interface DeploymentCheck {
  component: string;
  check: string;
  state: string;
  checkedAt: string | null;
  code?: string;
}

export interface RuntimeImage {
  workload: string;
  container: string;
  image: string | null;
  imageId: string | null;
  commit: string | null;
  openclawCommit: string | null;
}

// ---- ComputeDriver ---------------------------------------------------------------------------

export declare const computeMethods: Readonly<Record<string, { params: readonly string[]; result: string }>>;

export declare class ComputeDriver {
  static readonly configurationSchema: Readonly<Record<string, unknown>>;
  static validateConfiguration(config: unknown): DriverConfiguration;
  /** A driver with exactly the methods the gateway's descriptor lists. */
  static connect(config: DriverConfiguration, options?: { signal?: AbortSignal }): Promise<ComputeDriver>;
  constructor(config: DriverConfiguration, descriptor?: { methods: string[] } & Record<string, unknown>);

  readonly id: string;
  readonly capability: 'compute';
  readonly implementation: string;
  activationOrder?: 'beforeCommit' | 'afterCommit';
  maintenanceIntervalMs?: number;
  runtimeLogging?: 'platform' | 'driver';

  describe(options?: { signal?: AbortSignal }): Promise<Record<string, unknown>>;
  invoke(method: string, args: unknown[]): Promise<unknown>;

  ensureNamespace(namespace: Namespace): Promise<NamespaceEnsureResult>;
  deleteNamespace(namespace: Namespace): Promise<NamespaceDeleteResult>;
  bindAgent(binding: ComputeAgentBinding): Promise<void>;
  prepareRevision(revision: AgentRevision, context?: ComputeRevisionContext): Promise<ComputeReadiness>;
  activateRevision(revision: AgentRevision, context?: ComputeRevisionContext): Promise<void>;
  deactivateRevision(revision: AgentRevision): Promise<void>;
  stopRevision(revision: AgentRevision): Promise<void>;
  retireRevision(revision: AgentRevision): Promise<void>;
  requiresStoppedPredecessors(revision: AgentRevision): Promise<boolean>;
  preflight(): Promise<void | { warnings: { code: string; message: string }[] }>;
  validateHarnessAuth(
    harness: AgentRevision['harness'],
    auth: Record<string, unknown>,
    configuration: Record<string, unknown>,
    secretBindings?: unknown[],
    credentialSourceType?: CredentialSourceType,
  ): Promise<void>;
  validateConfiguration(configuration: Record<string, unknown>): Promise<void>;
  getGatewayEndpoint(revision: AgentRevision): Promise<string | undefined>;
  diagnoseAgentDeployment(binding: ComputeAgentRevisionBinding): Promise<{ checks: DeploymentCheck[] }>;
  describeAgentRuntime(binding: ComputeAgentRevisionBinding, signal?: AbortSignal, options?: Record<string, unknown>): Promise<unknown>;
  readAgentRuntimeLogs(binding: ComputeAgentRevisionBinding, request: Record<string, unknown>): Promise<unknown>;
  describePrepareRevisionFailure(error: unknown): Promise<Record<string, unknown> | undefined>;
  getRuntimeImages(revision: AgentRevision): Promise<RuntimeImage[]>;
}

// ---- CredentialGatewayDriver -----------------------------------------------------------------

export interface FieldSpec {
  name: string;
  required: boolean;
  description?: string;
}

export interface CredentialSourceType {
  type: string;
  config: FieldSpec[];
  secrets: FieldSpec[];
  rotation: 'none' | 'external' | 'refresh' | 'gateway';
  harnessAuth?: { modelProvider: string; loginMode: 'api_key' };
}

/** OCC's credential source record as the driver receives it. */
export interface CredentialSource {
  id: string;
  namespaceId?: string;
  type: string;
  [k: string]: unknown;
}

export type CredentialSourceState = 'ready' | 'pending' | 'failed' | 'absent';
export type AttachmentState = 'ready' | 'pending' | 'withheld' | 'failed' | 'revoked' | 'absent';

export interface CredentialSourceStatus {
  state: CredentialSourceState;
  reason?: string;
}

export interface CredentialSourceInput {
  type: string;
  config: Record<string, string>;
  secrets: Record<string, string>;
}

export interface CredentialSourceContext {
  signal?: AbortSignal;
  namespace: Namespace;
  source: CredentialSource;
}

export interface CredentialRevisionContext {
  signal?: AbortSignal;
  namespace: Namespace;
  revision: AgentRevision;
  sources: CredentialSource[];
  sandbox?: { namespaceName: string; resourceName: string; agentId: string; revisionId: string };
}

export interface CredentialWithdrawalContext extends CredentialRevisionContext {
  sandbox: { namespaceName: string; resourceName: string; agentId: string; revisionId: string };
  sourceId: string;
  recheck?: boolean;
}

export declare const credentialGatewayMethods: Readonly<Record<string, { input: boolean; result: string }>>;

export declare class CredentialGatewayDriver {
  static readonly configurationSchema: Readonly<Record<string, unknown>>;
  static validateConfiguration(config: unknown): DriverConfiguration;
  static connect(config: DriverConfiguration, options?: { signal?: AbortSignal }): Promise<CredentialGatewayDriver>;
  constructor(config: DriverConfiguration, descriptor?: { methods: string[] } & Record<string, unknown>);

  readonly id: string;
  readonly capability: 'credential_gateway';
  readonly implementation: string;

  describe(options?: { signal?: AbortSignal }): Promise<Record<string, unknown>>;
  invoke(method: string, ctx: unknown, input?: unknown): Promise<unknown>;

  listSourceTypes(ctx?: { signal?: AbortSignal }): Promise<CredentialSourceType[]>;
  registerSource(ctx: CredentialSourceContext, input: CredentialSourceInput): Promise<CredentialSourceStatus>;
  updateSource(ctx: CredentialSourceContext, input: CredentialSourceInput): Promise<CredentialSourceStatus>;
  rotateSource(ctx: CredentialSourceContext): Promise<CredentialSourceStatus>;
  sourceStatus(ctx: CredentialSourceContext): Promise<CredentialSourceStatus>;
  removeSource(ctx: CredentialSourceContext): Promise<void>;
  attachForRevision(ctx: CredentialRevisionContext): Promise<{ sourceId: string; ref: string }[]>;
  attachmentStatus(ctx: CredentialRevisionContext): Promise<{ sourceId: string; state: AttachmentState }[]>;
  withdraw(ctx: CredentialWithdrawalContext): Promise<{ state: 'pending' | 'revoked' }>;
}

export declare function createComputeDriver(config: DriverConfiguration, options?: { signal?: AbortSignal }): Promise<ComputeDriver>;
export declare function createCredentialGatewayDriver(
  config: DriverConfiguration,
  options?: { signal?: AbortSignal },
): Promise<CredentialGatewayDriver>;

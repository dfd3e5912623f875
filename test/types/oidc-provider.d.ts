// oidc-provider (panva) ships no types: the little of it test/helpers/oidc-provider.ts uses.
declare module 'oidc-provider' {
  import type { IncomingMessage, ServerResponse } from 'node:http'

  export interface Interaction {
    uid: string
    prompt: { name: string; details: Record<string, unknown> }
    params: Record<string, unknown>
    session?: { accountId: string }
    grantId?: string
  }

  export interface Grant {
    addOIDCScope(scope: string): void
    addOIDCClaims(claims: string[]): void
    addResourceScope(indicator: string, scope: string): void
    save(): Promise<string>
  }

  /** The Koa context oidc-provider hands its hooks. */
  export interface ProviderContext {
    get(header: string): string
  }

  export default class Provider {
    constructor(issuer: string, configuration: Record<string, unknown>)
    readonly issuer: string
    callback(): (req: IncomingMessage, res: ServerResponse) => void
    interactionDetails(req: IncomingMessage, res: ServerResponse): Promise<Interaction>
    interactionFinished(
      req: IncomingMessage,
      res: ServerResponse,
      result: Record<string, unknown>,
      options?: { mergeWithLastSubmission?: boolean },
    ): Promise<void>
    Grant: { new (init: { accountId: string; clientId: string }): Grant; find(id: string): Promise<Grant | undefined> }
  }

  export const errors: {
    InvalidTarget: new (description?: string) => Error
  }
}

// What a TypeScript client writes against the types openapi-typescript makes from openapi.json;
// tests/test_clients.py generates ./api.ts beside a copy of this file and runs `tsc --noEmit` on it.
import type { components, operations } from "./api";

type Json<Response> = Response extends { content: { "application/json": infer Body } } ? Body : never;
type Responses<Operation extends keyof operations> = operations[Operation]["responses"];

type Unauthorized = Json<Responses<"protected_test">[401]>;
type Forbidden = Json<Responses<"user_me">[403]>;
type RateLimited = Json<Responses<"usage_stats">[429]>;
type Stats = Json<Responses<"usage_stats">[200]>;

export function explain(body: Unauthorized | Forbidden | RateLimited): string {
    switch (body.error.code) {
        case "missing_api_key":
            return "Send the key in X-API-Key.";
        case "invalid_api_key":
            return "The key is mistyped, unknown or revoked.";
        case "insufficient_scope":
            return `The key lacks a scope: ${body.error.message}`;
        case "ip_not_allowed":
            return "The key may not be used from this address.";
        case "rate_limit_exceeded":
            return "Wait for Retry-After seconds.";
        case "account_rate_limit_exceeded":
            return "The account's keys together used up its allowance; wait for Retry-After seconds.";
        case "credits_exhausted":
            return "The key has no credits left until its next refill, if it has one.";
        default: {
            const unexpected: never = body.error;
            return unexpected;
        }
    }
}

export function remaining(stats: Stats): number {
    return stats.requests_remaining;
}

export function creditsLeft(stats: Stats): string {
    if (stats.credits === undefined) {
        return "no credits: only the windows limit this key";
    }
    const refill = stats.credits.refill;
    const next = refill === null ? "no refill" : `${refill.amount} on ${refill.next_at} (every ${refill.interval})`;
    return `${stats.credits.remaining} credits left, ${next}`;
}

export async function protectedTest(base: string, key: string): Promise<string> {
    const response = await fetch(`${base}/api/v1/protected/test`, { headers: { "X-API-Key": key } });
    if (response.status === 401) {
        return explain((await response.json()) as Unauthorized);
    }
    const body = (await response.json()) as components["schemas"]["AuthenticationTest"];
    return `${body.api_key_name} (${body.api_key_type}, tier ${body.rate_limit_tier})`;
}

// The types are narrow enough to refuse what the service never sends.
export const wrongCode: Unauthorized = {
    // @ts-expect-error a 401 never carries rate_limit_exceeded
    error: { code: "rate_limit_exceeded", message: "Too many requests." },
};
// @ts-expect-error every error names its code and its message
export const noMessage: Forbidden = { error: { code: "insufficient_scope" } };

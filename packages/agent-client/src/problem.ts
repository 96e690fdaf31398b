import { parseJson } from "./values.js";

const PROBLEM_TYPE_PREFIX = "https://paymentauth.org/problems/";

/** An error answer read as problem details. */
export interface Problem {
  code?: string;
  type?: string;
  detail?: string;
}

/** What a 402 asks the payer to do next. */
export type NextStep = "raise" | "top-up" | "new-challenge" | "stop";

/**
 * What to do after a 402 on a paid retry. The gateway names its case in problem+json `code`
 * (docs/contract.md, "Errors"); a plain mppx server only in the problem `type`.
 */
export function nextStep(problem: Problem): NextStep {
  switch (problem.code) {
    case "mpp_voucher_bucket_refresh_required":
      return "raise";
    case "mpp_session_deposit_below_request_cost":
      return "top-up";
    case "mpp_invalid_challenge":
      return "new-challenge";
    case undefined:
      break;
    default:
      return "stop";
  }
  switch (problemSuffix(problem)) {
    // mppx: accepted − spent cannot cover the request, i.e. the voucher bucket is exhausted.
    case "session/insufficient-balance":
    case "payment-insufficient":
      return "raise";
    case "session/amount-exceeds-deposit":
      return "top-up";
    case "invalid-challenge":
    case "payment-expired":
      return "new-challenge";
    default:
      return "stop";
  }
}

/** Reads an error body as problem details (`code`, `type`, `detail`); never throws. */
export async function readProblem(response: Response): Promise<Problem> {
  if (response.bodyUsed) return {};
  let text: string;
  try {
    text = await response.text();
  } catch {
    return {};
  }
  const body = parseJson(text) as Record<string, unknown> | undefined;
  if (!body || typeof body !== "object") return {};
  const nested = body["error"] as Record<string, unknown> | undefined;
  const problem: Problem = {};
  const code = body["code"] ?? nested?.["code"];
  if (typeof code === "string") problem.code = code;
  if (typeof body["type"] === "string") problem.type = body["type"];
  const detail = body["detail"] ?? nested?.["message"];
  if (typeof detail === "string") problem.detail = detail.slice(0, 300);
  return problem;
}

export function problemSuffix(problem: Problem): string | undefined {
  return problem.type?.startsWith(PROBLEM_TYPE_PREFIX)
    ? problem.type.slice(PROBLEM_TYPE_PREFIX.length)
    : problem.type;
}

export function problemDetails(status: number, problem: Problem) {
  const details: { status: number; serverCode?: string; problemType?: string } = { status };
  if (problem.code) details.serverCode = problem.code;
  if (problem.type) details.problemType = problem.type;
  return details;
}

export function describe(problem: Problem): string {
  const name = problem.code ?? problemSuffix(problem);
  if (!name) return "";
  return problem.detail ? ` ${name}: ${problem.detail}` : ` ${name}`;
}

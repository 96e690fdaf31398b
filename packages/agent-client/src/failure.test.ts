import { HttpRequestError, TransactionExecutionError } from "viem";
import { describe, expect, it } from "vitest";
import { describeFailure } from "./failure.js";

const refused = () =>
  new TypeError("fetch failed", {
    cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:8080"), { code: "ECONNREFUSED" }),
  });

describe("tollgate-pay's failure line", () => {
  it("names the gateway it could not reach and why, not undici's bare 'fetch failed'", () => {
    expect(describeFailure(refused(), "http://127.0.0.1:8080")).toBe(
      "cannot reach the gateway at http://127.0.0.1:8080 (ECONNREFUSED)",
    );
  });

  it("names the chain RPC by its origin only, however deep viem wraps the error", () => {
    const http = new HttpRequestError({
      url: "https://rpc.example.com/v2/SECRET-API-KEY",
      cause: refused(),
      details: "fetch failed",
    });
    const text = describeFailure(http, "http://127.0.0.1:8080");
    expect(text).toBe("cannot reach the chain RPC at https://rpc.example.com (ECONNREFUSED)");
    const wrapped = new TransactionExecutionError(http, {} as never);
    expect(describeFailure(wrapped, "http://127.0.0.1:8080")).toBe(text);
    const answered = new HttpRequestError({ url: "https://rpc.example.com/v2/SECRET-API-KEY", status: 503 });
    expect(describeFailure(answered, "http://127.0.0.1:8080")).toBe(
      "the chain RPC at https://rpc.example.com answered HTTP 503",
    );
    expect(`${text}${describeFailure(answered, "")}`).not.toContain("SECRET");
  });

  it("never shows the RPC URL's path when the RPC's failure has no system error code", () => {
    // An RPC URL that answers 200 with a page, not JSON: viem wraps the parse error.
    const notJson = new HttpRequestError({
      url: "https://rpc.example.com/v2/SECRET-API-KEY",
      body: { method: "eth_chainId" },
      cause: new SyntaxError("Unexpected token '<', \"<html>\" is not valid JSON"),
    });
    const text = describeFailure(notJson, "http://127.0.0.1:8080");
    expect(text).not.toContain("SECRET");
    expect(text).not.toContain("\n");
    expect(text).toBe(
      "cannot reach the chain RPC at https://rpc.example.com (Unexpected token '<', \"<html>\" is not valid JSON)",
    );
  });

  it("keeps the first line of any other error", () => {
    expect(describeFailure(new Error("one\ntwo"), "http://127.0.0.1:8080")).toBe("one");
  });
});

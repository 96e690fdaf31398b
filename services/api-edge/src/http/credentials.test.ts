import { describe, expect, it } from "vitest";
import type { EdgeError } from "../domain/errors.js";
import { bearerKey } from "./credentials.js";

function codeOf(headers: Record<string, string>): string | undefined {
  try {
    bearerKey(headers);
    return undefined;
  } catch (err) {
    return (err as EdgeError).code;
  }
}

describe("bearerKey (spec, Authentication: account routes take Bearer only)", () => {
  it("returns the key of a Bearer header, whatever the scheme's case", () => {
    expect(bearerKey({ authorization: "Bearer tg_abc" })).toBe("tg_abc");
    expect(bearerKey({ authorization: "bearer  tg_abc " })).toBe("tg_abc");
  });

  it.each([
    [{}, "missing_api_key"],
    [{ authorization: "" }, "missing_api_key"],
    [{ authorization: "Bearer " }, "missing_api_key"],
    [{ authorization: "Bearer" }, "missing_api_key"],
    [{ authorization: "Payment eyJ9" }, "wrong_auth_scheme"],
    [{ authorization: "PAYMENT eyJ9" }, "wrong_auth_scheme"],
    [{ authorization: "Basic dXNlcjpwYXNz" }, "wrong_auth_scheme"],
    [{ "x-api-key": "tg_abc" }, "wrong_auth_field"],
    [{ "api-key": "tg_abc" }, "wrong_auth_field"],
    [{ authorization: "Bearer tg_abc", "x-api-key": "tg_abc" }, "wrong_auth_field"],
    [{ authorization: "Bearer tg_abc", "api-key": "tg_other" }, "wrong_auth_field"],
  ])("refuses %o with %s", (headers, code) => {
    expect(codeOf(headers as Record<string, string>)).toBe(code);
  });
});
